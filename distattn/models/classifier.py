"""The IMDB self-attention classifier of 000_48942d33924f2728.txt (section III), and its kin.

Seed architecture (``seed_classifier_config()``)::

    X = E[ids] + P                        token + learned positional embeddings, d = 256, max_len = 256
    X = Block(Block(X))                   post-norm: LayerNorm(X + Drop(MHA(X))), LayerNorm(X + Drop(FFN(X)));
                                          4 heads, ReLU FFN of width 4d, dropout 0.1 on the attention
                                          output, inside the FFN and on its output; none on the
                                          embeddings or the attention pattern (the seed's code:
                                          nn.MultiheadAttention's default dropout 0.0)
    z = Σ_i m_i X_i / max(Σ_i m_i, 1e-6)  masked mean pooling
    logit = W2 ReLU(W1 Dropout(z)) ...    Dropout(0.2) → d → d/2 → ReLU → Dropout(0.2) → 1
    p = sigmoid(logit)

The same class takes any :class:`TransformerConfig` trunk, e.g. a causal pre-norm stack
pretrained as a language model (:meth:`TransformerClassifier.load_trunk`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distattn.models.hooks import run_with_cache
from distattn.models.precision import at_least_float32
from distattn.models.transformer import Transformer, TransformerConfig, _positive_int, _probability

POOLINGS = ("mean",)

__all__ = ["ClassifierConfig", "TransformerClassifier", "seed_classifier_config"]


@dataclass
class ClassifierConfig(TransformerConfig):
    """Trunk fields (see :class:`TransformerConfig`) plus the classification head."""

    head_hidden: int | None = None     # default d_model // 2
    head_dropout: float = 0.2
    pooling: str = "mean"

    def validate(self) -> "ClassifierConfig":
        super().validate()
        self.head_dropout = _probability(self.head_dropout, "head_dropout")
        if self.head_hidden is not None:
            self.head_hidden = _positive_int(self.head_hidden, "head_hidden")        # 0 was silently read as "the default"
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}; got {self.pooling!r}")
        return self

    def trunk_config(self) -> TransformerConfig:
        fields = {f: getattr(self, f) for f in TransformerConfig.__dataclass_fields__}
        return TransformerConfig(**fields)


def seed_classifier_config(vocab_size: int = 30_000, **overrides) -> ClassifierConfig:
    """The seed's classifier: d 256, max_len 256, 2 post-norm blocks of 4 heads, ReLU FFN 4d,
    dropout 0.1 (on the attention and FFN outputs and inside the FFN; not on the embeddings nor
    the attention pattern, as in the seed's code), mean pooling, head Dropout 0.2 → d/2 → 1,
    PyTorch default initialisation.

    ``overrides`` replace any field; the FFN width and the head's hidden width follow ``d_model``
    (4d and d/2) unless ``d_ff`` or ``head_hidden`` is given too."""
    d = overrides.get("d_model", 256)
    d = _positive_int(d, "d_model")
    base = dict(vocab_size=vocab_size, d_model=d, n_layers=2, n_heads=4, d_ff=4 * d, max_len=256, dropout=0.1,
                attn_dropout=0.0, embed_dropout=0.0,
                positional="learned", norm="post", activation="relu", causal=False, bias=True, mlp=True,
                padding_idx=0, init="torch", head_hidden=max(1, d // 2), head_dropout=0.2, pooling="mean")
    base.update(overrides)
    return ClassifierConfig(**base)


class TransformerClassifier(nn.Module):
    """Binary sequence classifier: trunk, masked mean pooling, MLP head → one logit.

    ``forward(ids, attention_mask)`` returns logits of shape (B,); ``predict_proba`` the sigmoid.
    ``attention_mask`` marks right padding (as :class:`~distattn.train.ClassificationData` makes it):
    a causal trunk does not mask keys, so a left-padded batch would attend to its padding.
    With ``capture=True`` it returns ``(logits, cache)``, the cache holding every hook point
    (``trunk.blocks.{l}.attn.hook_scores`` / ``hook_pattern``: (B, H, T, T); ``trunk.blocks.{l}.attn.hook_q`` /
    ``hook_k`` / ``hook_v``: (B, H, T, d_k), queries and keys after the rotary embedding).
    """

    def __init__(self, config: ClassifierConfig):
        super().__init__()
        self.config = config.validate()
        self.trunk = Transformer(config.trunk_config())
        hidden = config.head_hidden or config.d_model // 2
        self.head = nn.Sequential(nn.Dropout(config.head_dropout), nn.Linear(config.d_model, hidden), nn.ReLU(),
                                  nn.Dropout(config.head_dropout), nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, capture: bool = False):
        if capture:
            return run_with_cache(self, ids, attention_mask)
        x = self.trunk(ids, attention_mask)
        if attention_mask is None:
            pooled = x.mean(dim=1)
        else:
            m = attention_mask.to(x.dtype).unsqueeze(-1)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-6)
        return self.head(pooled).squeeze(-1)

    @torch.no_grad()
    def predict_proba(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Positive-class probabilities, computed in evaluation mode (no dropout; a model in training
        mode once gave a different answer at each call); the model's mode is restored after. In float32
        (also for a bf16/fp16 model; float64 for a float64 model)."""
        was_training = self.training
        self.eval()
        try:
            return torch.sigmoid(at_least_float32(self(ids, attention_mask)))
        finally:
            self.train(was_training)

    def load_trunk(self, source: nn.Module | dict, strict: bool = True) -> None:
        """Copy trunk weights from a pretrained model (one with a ``trunk``) or a trunk state_dict.

        Given a model, the trunk configs must agree on every field that shapes the trunk or what it
        computes (``n_heads`` and ``positional`` too, which change no weight shape); a mismatch raises
        ``ValueError`` naming the fields. A plain state_dict carries no config: only its keys and
        shapes are checked (``load_state_dict``), so a trunk with another ``n_heads`` loads silently.
        """
        if isinstance(source, nn.Module):
            if not isinstance(getattr(source, "trunk", None), Transformer):
                raise TypeError(f"load_trunk takes a model with a transformer trunk (TransformerLM, MaskedLM, "
                                f"TransformerClassifier) or a trunk state_dict; {type(source).__name__} has none")
            src_cfg = getattr(source, "config", None)
            if src_cfg is not None:
                mine = self.config.trunk_config()
                keys = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "positional", "norm", "activation",
                        "bias", "mlp", "causal")
                # d_ff=None means 4·d_model: compare the widths the trunks were built with
                value = lambda cfg, k: cfg.ff_width if k == "d_ff" else getattr(cfg, k)
                # the FFN's width and activation shape nothing when neither trunk has an FFN (mlp=False)
                ffn_only = ("d_ff", "activation") if not (src_cfg.mlp or mine.mlp) else ()
                diff = {k: (value(src_cfg, k), value(mine, k)) for k in keys
                        if k not in ffn_only and value(src_cfg, k) != value(mine, k)}
                if diff:
                    raise ValueError(f"pretrained trunk does not match this classifier: {diff} "
                                     f"(pretrained, classifier)")
            source = source.trunk.state_dict()
        state = dict(source)
        # a longer classifier context may start from a shorter pretrained learned table
        key = "pos.table"
        if key in state and self.trunk.pos is not None and state[key].shape != self.trunk.pos.table.shape:
            mine = self.trunk.pos.table.detach().clone()
            n = min(mine.shape[0], state[key].shape[0])
            mine[:n] = state[key][:n]
            state[key] = mine
        # relative positions (one vector per distance -K..K, K = max_len - 1) from a trunk of another max_len:
        # distances beyond the pretrained K take its edge vectors, as the pretrained trunk itself clipped them
        for i, block in enumerate(self.trunk.blocks):
            key, rel = f"blocks.{i}.attn.relative.vectors", block.attn.relative
            if key in state and rel is not None and state[key].shape[0] != rel.vectors.shape[0] \
                    and state[key].shape[1:] == rel.vectors.shape[1:]:
                k_old = (state[key].shape[0] - 1) // 2
                dist = torch.arange(-rel.max_distance, rel.max_distance + 1).clamp(-k_old, k_old)
                state[key] = state[key][dist + k_old]
        self.trunk.load_state_dict(state, strict=strict)
