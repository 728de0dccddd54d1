"""The precision the library reads a model's values in: float32, also for bf16/fp16 values (so
that softmaxes, losses and captures are not rounded to 8 or 11 bits of mantissa), and float64 for
a float64 model (which float32 would round)."""

from __future__ import annotations

import torch

__all__ = ["at_least_float32"]


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in ``promote_types(x.dtype, float32)``: bf16/fp16/float32 -> float32, float64 stays."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
