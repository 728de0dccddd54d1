"""The transformer trunk shared by every model: embeddings, positions, blocks.

``TransformerConfig`` is a plain dataclass; :class:`Transformer` maps token ids (B, T) to hidden
states (B, T, d_model). The classifier and the language models put a head on top.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from distattn.models.attention import MultiHeadSelfAttention
from distattn.models.hooks import HookPoint
from distattn.models.positional import ADDITIVE, POSITIONAL, AbsolutePositions

NORMS = ("post", "pre", "none")
ACTIVATIONS = ("relu", "gelu")
INITS = ("gpt2", "torch")

__all__ = ["TransformerConfig", "Block", "Transformer", "check_ids", "config_diff"]


def _choice(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")


def _positive_int(value, name) -> int:
    """``value`` as a Python int (a numpy integer such as ``ids.max() + 1`` was refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
    return int(value)


def _flag(value, name) -> bool:
    if not isinstance(value, (bool, np.bool_)):      # causal="false" is a non-empty string: it was True
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def _probability(value, name) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1); got {value!r}")
    return float(value)


@dataclass
class TransformerConfig:
    """Shape and options of a transformer trunk.

    norm: ``"post"`` is the seed's ``LayerNorm(x + f(x))``; ``"pre"`` is GPT-2's ``x + f(LayerNorm(x))``
    with a final LayerNorm; ``"none"`` has no normalisation. init: ``"torch"`` keeps PyTorch's defaults
    (N(0, 1) embeddings, ``nn.MultiheadAttention``'s Xavier Q/K/V), as the seed's code did; ``"gpt2"``
    draws N(0, 0.02) with scaled residual projections.
    """

    vocab_size: int = 30_000
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None          # default 4 * d_model
    max_len: int = 256
    dropout: float = 0.1
    attn_dropout: float | None = None  # on the attention pattern; default: dropout
    embed_dropout: float | None = None  # on E[ids] + P; default: dropout
    positional: str = "learned"
    norm: str = "post"
    activation: str = "relu"
    causal: bool = False
    bias: bool = True
    mlp: bool = True                  # False: attention-only blocks
    padding_idx: int | None = 0       # embedding row kept at zero (the seed's padding_idx=0)
    init: str = "torch"

    def validate(self) -> "TransformerConfig":
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            setattr(self, name, _positive_int(getattr(self, name), name))
        if self.d_ff is not None:
            self.d_ff = _positive_int(self.d_ff, "d_ff")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        self.dropout = _probability(self.dropout, "dropout")
        for name in ("attn_dropout", "embed_dropout"):
            if getattr(self, name) is not None:
                setattr(self, name, _probability(getattr(self, name), name))
        _choice(self.positional, "positional", POSITIONAL)
        _choice(self.norm, "norm", NORMS)
        _choice(self.activation, "activation", ACTIVATIONS)
        _choice(self.init, "init", INITS)
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"positional='rope' needs an even head dimension; got d_model/n_heads="
                             f"{self.d_model // self.n_heads}")
        for name in ("causal", "bias", "mlp"):
            setattr(self, name, _flag(getattr(self, name), name))
        if self.padding_idx is not None and (isinstance(self.padding_idx, bool)
                                             or not isinstance(self.padding_idx, numbers.Integral)
                                             or not 0 <= self.padding_idx < self.vocab_size):
            raise ValueError(f"padding_idx must be None or in [0, vocab_size={self.vocab_size}); "
                             f"got {self.padding_idx!r}")
        if self.padding_idx is not None:
            self.padding_idx = int(self.padding_idx)
        return self

    @property
    def ff_width(self) -> int:
        return self.d_ff or 4 * self.d_model

    def to_dict(self) -> dict:
        return {"kind": type(self).__name__, **dataclasses.asdict(self)}


def config_diff(a: dict, b: dict) -> dict:
    """``{key: (a[key], b[key])}`` for every key whose values differ (missing keys give None)."""
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def check_ids(ids: torch.Tensor, max_len: int, vocab_size: int | None = None) -> None:
    """Shape checks that need no device sync: a non-empty (B, T) batch with T <= max_len; on
    the CPU (where reading the values costs no sync) also ids in ``[0, vocab_size)``, which torch
    would otherwise report as a bare ``IndexError: index out of range in self``."""
    if ids.dim() != 2:
        raise ValueError(f"token ids must have shape (batch, seq_len); got shape {tuple(ids.shape)}")
    if ids.shape[0] == 0:
        raise ValueError("empty batch: token ids have batch size 0; pass at least one sequence")
    if ids.shape[1] == 0:
        raise ValueError("empty batch: token ids have sequence length 0; pass at least one token")
    if ids.shape[1] > max_len:
        raise ValueError(f"sequence length {ids.shape[1]} is longer than max_len={max_len}; truncate the "
                         f"input (e.g. EncodedCorpus.truncate({max_len})) or build the model with "
                         f"max_len >= {ids.shape[1]}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"token ids must be int64 or int32; got {ids.dtype}")
    if vocab_size is not None:
        check_range(ids, 0, vocab_size, "token id", f"[0, vocab_size={vocab_size}); encode out-of-vocabulary "
                    "words as <unk> (Vocabulary.encode(..., oov='unk'))")


def check_range(values: torch.Tensor, low: int, high: int, what: str, allowed: str) -> None:
    """On the CPU, where reading the values costs no device sync, refuse values outside
    ``[low, high)`` by name (torch reports a bad index as a bare ``IndexError``); on other devices
    and while compiling, nothing."""
    if values.device.type != "cpu" or not values.numel() or torch.compiler.is_compiling():
        return
    lo, hi = int(values.min()), int(values.max())
    if lo < low or hi >= high:
        raise ValueError(f"{what} {lo if lo < low else hi} is outside {allowed}")


class Block(nn.Module):
    """Self-attention then a position-wise FFN, each with a residual connection and LayerNorm."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.norm = c.norm
        attn_drop = c.dropout if c.attn_dropout is None else c.attn_dropout
        self.attn = MultiHeadSelfAttention(c.d_model, c.n_heads, dropout=attn_drop, bias=c.bias, causal=c.causal,
                                           positional=c.positional, max_len=c.max_len)
        make_norm = (lambda: nn.LayerNorm(c.d_model, bias=c.bias)) if c.norm != "none" else nn.Identity
        self.ln1 = make_norm()
        self.mlp = None
        if c.mlp:
            act = nn.ReLU() if c.activation == "relu" else nn.GELU(approximate="tanh")
            self.mlp = nn.Sequential(nn.Linear(c.d_model, c.ff_width, bias=c.bias), act,
                                     nn.Dropout(c.dropout), nn.Linear(c.ff_width, c.d_model, bias=c.bias))
            self.ln2 = make_norm()
        self.drop = nn.Dropout(c.dropout)
        self.hook_resid_mid = HookPoint()

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.norm == "post":
            x = self.hook_resid_mid(self.ln1(x + self.drop(self.attn(x, key_mask))))
            if self.mlp is not None:
                x = self.ln2(x + self.drop(self.mlp(x)))
        else:
            x = self.hook_resid_mid(x + self.drop(self.attn(self.ln1(x), key_mask)))
            if self.mlp is not None:
                x = x + self.drop(self.mlp(self.ln2(x)))
        return x


class Transformer(nn.Module):
    """Token ids (B, T) → hidden states (B, T, d_model).

    ``X = E[ids] + P[:T]`` (learned or sinusoidal P; RoPE and relative positions act inside
    attention), then ``n_layers`` blocks, then a final LayerNorm for pre-norm stacks.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config.validate()
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.padding_idx)
        self.pos = AbsolutePositions(c.positional, c.max_len, c.d_model) if c.positional in ADDITIVE else None
        self.drop = nn.Dropout(c.dropout if c.embed_dropout is None else c.embed_dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model, bias=c.bias) if c.norm == "pre" else nn.Identity()
        self.hook_embed = HookPoint()
        init_weights(self, c)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids: (B, T) int; attention_mask: optional (B, T), 1/True for real tokens, 0 for right padding
        (a causal trunk reads no mask: right padding needs none there, and left padding is not honoured)."""
        check_ids(ids, self.config.max_len, self.config.vocab_size)
        x = self.tok_emb(ids)
        if self.pos is not None:
            x = self.pos(x)
        x = self.drop(self.hook_embed(x))
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape != ids.shape:
                raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; it must match the "
                                 f"token ids' shape {tuple(ids.shape)}")
            key_mask = attention_mask.bool().clone()
            # an empty (all-padding) row still has one key: no NaN; a row with real tokens keeps its own
            # mask (forcing key 0 on every row let left-padded rows attend to a padding token)
            key_mask[:, 0] |= ~key_mask.any(dim=1)
        for block in self.blocks:
            x = block(x, key_mask)
        return self.ln_f(x)


def init_weights(model: nn.Module, config: TransformerConfig) -> None:
    """Initialise ``model`` in place following ``config.init`` (see :class:`TransformerConfig`)."""
    n_layers = max(config.n_layers, 1)
    for name, m in model.named_modules():
        if isinstance(m, MultiHeadSelfAttention):
            if config.init == "torch":     # nn.MultiheadAttention._reset_parameters
                nn.init.xavier_uniform_(m.qkv.weight)
                if m.qkv.bias is not None:
                    nn.init.zeros_(m.qkv.bias)
                if m.out.bias is not None:
                    nn.init.zeros_(m.out.bias)
        if config.init == "gpt2":
            if isinstance(m, nn.Linear):
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("attn.out", "mlp.3")) else 0.02
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, AbsolutePositions) and m.kind == "learned":
            nn.init.normal_(m.table, std=1.0)          # nn.Embedding's default, as in the seed
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            with torch.no_grad():
                m.weight[m.padding_idx].zero_()
