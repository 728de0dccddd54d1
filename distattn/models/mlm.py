"""A bidirectional masked language model (BERT/RoBERTa-style self-pretraining).

:class:`MaskedLM` is the trunk of :class:`TransformerLM` with ``causal=False`` and a (tied)
unembedding that is applied only at the masked positions. Its input carries a ``[MASK]`` id,
``config.mask_id`` (by convention the last id: build the config with ``vocab_size = len(vocab) + 1``
and the default ``mask_id = vocab_size - 1``). :class:`distattn.train.MaskedLMData` makes the
masked batches; a classifier fine-tuned from the trunk (``classifier_from_lm``) keeps the same
``vocab_size`` and simply never sees the ``[MASK]`` id.

``forward(ids)`` returns logits (B, T, vocab_size). ``forward(ids, positions, targets)`` takes
``positions`` (B, K), the masked positions of each row, and ``targets`` (B, K) (ids; ``IGNORE_INDEX`` = -1
for padding), and returns ``(logits (B, K, vocab_size), loss)``: fixed K keeps the shapes static for
``torch.compile`` and skips the unembedding at the 85 % of positions that are not scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distattn.models.hooks import run_with_cache
from distattn.models.lm import LMConfig, TransformerLM, lm_loss
from distattn.models.transformer import TransformerConfig, _flag, _positive_int, check_range

__all__ = ["MaskedLMConfig", "MaskedLM"]


@dataclass
class MaskedLMConfig(LMConfig):
    """LMConfig with bidirectional attention and a ``[MASK]`` id (default ``vocab_size - 1``)."""

    causal: bool = False
    dropout: float = 0.1
    mask_id: int | None = None

    def validate(self) -> "MaskedLMConfig":
        TransformerConfig.validate(self)
        self.tie_weights = _flag(self.tie_weights, "tie_weights")
        if self.causal:
            raise ValueError("a masked LM attends both ways; got causal=True (use LMConfig for a causal LM)")
        if self.mask_id is not None:
            self.mask_id = _positive_int(self.mask_id, "mask_id")
            if self.mask_id >= self.vocab_size:
                raise ValueError(f"mask_id={self.mask_id} must be < vocab_size={self.vocab_size} "
                                 f"(reserve one id for [MASK]: vocab_size = len(vocab) + 1)")
        return self

    @property
    def mask_token(self) -> int:
        return self.vocab_size - 1 if self.mask_id is None else self.mask_id


class MaskedLM(TransformerLM):
    """Bidirectional pre-norm transformer trained to recover masked tokens (see the module doc)."""

    def __init__(self, config: MaskedLMConfig):
        if not isinstance(config, MaskedLMConfig):
            raise TypeError(f"MaskedLM takes a MaskedLMConfig; got {type(config).__name__}")
        super().__init__(config)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                capture: bool = False):
        if capture:           # the positions and targets too: they were dropped, giving full logits and no loss
            return run_with_cache(self, ids, positions, targets)
        if (positions is None) != (targets is None):
            raise ValueError("give both positions and targets (the masked positions and their ids), or neither")
        h = self.trunk(ids)
        if positions is None:
            return self.lm_head(h)
        if positions.shape != targets.shape or positions.dim() != 2 or positions.shape[0] != ids.shape[0]:
            raise ValueError(f"positions {tuple(positions.shape)} and targets {tuple(targets.shape)} must both be "
                             f"(batch, K) with batch = {ids.shape[0]}")
        if positions.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"positions must be int64 or int32; got {positions.dtype}")
        check_range(positions, 0, ids.shape[1], "position", f"[0, seq_len={ids.shape[1]})")
        # int32 indices: gather takes them only from torch 2.8 on, and pyproject allows 2.4
        picked = h.gather(1, positions.long().unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        logits = self.lm_head(picked)
        return logits, lm_loss(logits, targets)

    def flops_per_token(self, seq_len: int | None = None, mask_fraction: float = 1.0) -> float:
        """Training FLOPs per input token, with the unembedding run on ``mask_fraction`` of them."""
        full = super().flops_per_token(seq_len)
        unembed = 6.0 * self.lm_head.weight.numel()
        return full - unembed * (1.0 - mask_fraction)
