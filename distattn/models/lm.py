"""Causal attention language models on the toolkit's vocabulary.

* :class:`ProjectionMatchedLM` — one attention-only layer: token embedding W_E, W_Q, W_K, W_V
  (and W_O per head), unembedding W_U; no MLP, no LayerNorm, no residual by default. Its logits
  at position t are ``Σ_{j<=t} A[t, j] · (W_E[x_j] W_V W_O W_U)``: an attention-weighted sum of
  per-token vocabulary profiles, the learned mirror of the projection predictor's
  ``E = M(QS)`` restricted to the prefix (``A`` ↔ ``Norm(M)``, the OV rows ↔ ``QS``).
* :class:`TransformerLM` — a small GPT-style pre-norm stack (2–4 layers).

Both take ``ids`` (B, T) and return logits (B, T, vocab_size); with ``targets`` also the mean
cross-entropy (targets equal to ``IGNORE_INDEX`` = -1 are ignored); with ``capture=True`` also the hook cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from distattn.models.attention import MultiHeadSelfAttention
from distattn.models.hooks import HookPoint, run_with_cache
from distattn.models.positional import ADDITIVE, POSITIONAL, AbsolutePositions
from distattn.models.precision import at_least_float32
from distattn.models.transformer import (Transformer, TransformerConfig, _choice, _flag, _positive_int, check_ids,
                                         check_range)

IGNORE_INDEX = -1

__all__ = ["LMConfig", "TransformerLM", "AttentionOnlyConfig", "ProjectionMatchedLM", "lm_loss", "IGNORE_INDEX"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (float32 softmax, also for bf16/fp16 logits; float64 for float64
    logits) over the targets that are not ``IGNORE_INDEX``
    (-1); every other target must be an id in ``[0, vocab_size)``. ``targets`` has the shape of
    ``logits`` less the vocabulary axis; with no target to score the loss is 0 (not NaN)."""
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets have shape {tuple(targets.shape)}; logits {tuple(logits.shape)} need targets of "
                         f"shape {tuple(logits.shape[:-1])}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"targets must be integer token ids (int64; {IGNORE_INDEX} to ignore); got {targets.dtype}. "
                        "An attention mask? A language model's second argument is the targets")
    check_range(targets, IGNORE_INDEX, logits.shape[-1], "target",
                f"[0, vocab_size={logits.shape[-1]}) and is not the ignore index {IGNORE_INDEX} "
                "(not -100: that is another library's)")
    targets = targets.long()
    flat = targets.reshape(-1)
    total = F.cross_entropy(at_least_float32(logits.reshape(-1, logits.shape[-1])), flat, ignore_index=IGNORE_INDEX,
                            reduction="sum")
    return total / (flat != IGNORE_INDEX).sum().clamp(min=1)      # the mean, without 0/0 on all-ignored targets


@dataclass
class LMConfig(TransformerConfig):
    """GPT-style defaults: the 4-layer d=512 causal LM of the issue (seq 256)."""

    d_model: int = 512
    n_layers: int = 4
    n_heads: int = 8
    max_len: int = 256
    dropout: float = 0.0
    norm: str = "pre"
    activation: str = "gelu"
    causal: bool = True
    bias: bool = False
    padding_idx: int | None = None
    init: str = "gpt2"
    tie_weights: bool = True

    def validate(self) -> "LMConfig":
        super().validate()
        self.tie_weights = _flag(self.tie_weights, "tie_weights")
        if not self.causal:
            raise ValueError("a language model must be causal; got causal=False")
        return self

    def trunk_config(self) -> TransformerConfig:
        return TransformerConfig(**{f: getattr(self, f) for f in TransformerConfig.__dataclass_fields__})


class TransformerLM(nn.Module):
    """Pre-norm causal transformer with a (tied) unembedding."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config.validate()
        self.trunk = Transformer(config.trunk_config())
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.trunk.tok_emb.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, capture: bool = False):
        if capture:
            return run_with_cache(self, ids, targets)
        logits = self.lm_head(self.trunk(ids))
        return logits if targets is None else (logits, lm_loss(logits, targets))

    def n_params(self, non_embedding: bool = True) -> int:
        """Parameter count; ``non_embedding`` drops the embedding lookup tables (token and learned
        positions) but keeps the unembedding matrix, which does matmul work (tied or not)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if not self.config.tie_weights:
                n -= self.trunk.tok_emb.weight.numel()
            if self.trunk.pos is not None and isinstance(self.trunk.pos.table, nn.Parameter):
                n -= self.trunk.pos.table.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: ``6·N + 12·n_layers·d_model·seq_len`` (N = :meth:`n_params`;
        the second term is the attention score and value matmuls, forward and backward, PaLM's formula)."""
        T = seq_len or self.config.max_len
        c = self.config
        return 6.0 * self.n_params() + 12.0 * c.n_layers * c.d_model * T


@dataclass
class AttentionOnlyConfig:
    """One causal attention layer between an embedding and an unembedding.

    residual: also add the direct path ``(W_E[x] (+P)) W_U`` (off by default, to mirror ``E = M(QS)``).
    """

    vocab_size: int = 30_000
    d_model: int = 256
    n_heads: int = 1
    max_len: int = 256
    positional: str = "none"
    bias: bool = False
    residual: bool = False

    def validate(self) -> "AttentionOnlyConfig":
        for name in ("vocab_size", "d_model", "n_heads", "max_len"):
            setattr(self, name, _positive_int(getattr(self, name), name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        _choice(self.positional, "positional", POSITIONAL)
        self.bias = _flag(self.bias, "bias")
        self.residual = _flag(self.residual, "residual")
        return self

    def to_dict(self) -> dict:
        return {"kind": type(self).__name__, **dataclasses.asdict(self)}


class ProjectionMatchedLM(nn.Module):
    """``logits = CausalAttn(W_E[x] (+P)) W_U`` (+ ``(W_E[x] (+P)) W_U`` if residual). Hook points:
    ``attn.hook_scores`` and ``attn.hook_pattern``, (B, n_heads, T, T); ``attn.hook_q`` / ``hook_k`` / ``hook_v``,
    (B, n_heads, T, d_k); ``hook_embed``, (B, T, d_model)."""

    def __init__(self, config: AttentionOnlyConfig):
        super().__init__()
        self.config = c = config.validate()
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = AbsolutePositions(c.positional, c.max_len, c.d_model) if c.positional in ADDITIVE else None
        self.attn = MultiHeadSelfAttention(c.d_model, c.n_heads, bias=c.bias, causal=True, positional=c.positional,
                                           max_len=c.max_len)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.hook_embed = HookPoint()
        # every map roughly norm-preserving, so the logits start at unit scale: with no LayerNorm
        # and three matrices in series, GPT-2's N(0, 0.02) would start with vanishing gradients
        nn.init.normal_(self.tok_emb.weight, std=1.0)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=m.in_features ** -0.5)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, capture: bool = False):
        if capture:
            return run_with_cache(self, ids, targets)
        check_ids(ids, self.config.max_len, self.config.vocab_size)
        x = self.tok_emb(ids)
        if self.pos is not None:
            x = self.pos(x)
        x = self.hook_embed(x)
        h = self.attn(x) + x if self.config.residual else self.attn(x)
        logits = self.lm_head(h)
        return logits if targets is None else (logits, lm_loss(logits, targets))
