"""Positional encodings, as named in 001_16cc2dc9b9ce4e82.txt, plus RoPE.

* ``"learned"``: a trainable table ``P`` (max_len × d) added to the token embeddings.
* ``"sinusoidal"``: the fixed table ``PE(p, 2i) = sin(p / 10000^{2i/d})``,
  ``PE(p, 2i+1) = cos(p / 10000^{2i/d})``, added to the token embeddings.
* ``"relative"``: Shaw et al.'s form, ``score(i, j) = q_i · (k_j + r_{i-j}) / sqrt(d_k)`` with a
  learned vector ``r`` per clipped distance (the seed prints ``k_i``; ``k_j`` is meant).
* ``"rope"``: rotary embeddings; ``q`` and ``k`` are rotated by position-dependent angles so
  that ``q_i · k_j`` depends on ``i - j`` only.
* ``"none"``: no positional signal (attention is then permutation-equivariant).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

POSITIONAL = ("learned", "sinusoidal", "relative", "rope", "none")
ADDITIVE = ("learned", "sinusoidal")          # added to the embeddings
IN_ATTENTION = ("relative", "rope")           # applied inside each attention layer

__all__ = ["POSITIONAL", "sinusoidal_table", "AbsolutePositions", "Rotary", "RelativePositions"]


def _check_length(T: int, max_len: int) -> None:
    """A table sized for ``max_len`` positions cannot place ``T`` > max_len (torch said only that two sizes differ)."""
    if T > max_len:
        raise ValueError(f"sequence length {T} is longer than max_len={max_len}; truncate the input or build "
                         f"the model with max_len >= {T}")


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """The (max_len, d_model) sinusoidal table of Vaswani et al. (odd d: the last cos column is dropped)."""
    for name, value in (("max_len", max_len), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
    return _sinusoidal64(max_len, d_model).float()


def _sinusoidal64(max_len: int, d_model: int, device=None) -> torch.Tensor:
    pos = torch.arange(max_len, dtype=torch.float64, device=device)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
    return table


class AbsolutePositions(nn.Module):
    """``x + P[:T]`` for a learned or sinusoidal table ``P`` (max_len, d_model)."""

    def __init__(self, kind: str, max_len: int, d_model: int):
        super().__init__()
        self.kind = kind
        if kind == "learned":
            self.table = nn.Parameter(torch.empty(max_len, d_model))
            nn.init.normal_(self.table, std=0.02)
        elif kind == "sinusoidal":
            self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)
        else:
            raise ValueError(f"AbsolutePositions kind must be one of {ADDITIVE}; got {kind!r}")

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.kind == "sinusoidal":   # rebuilt, not converted: .bfloat16().float() kept the bf16 rounding
            self.table = _sinusoidal64(*self.table.shape).to(self.table.device, self.table.dtype)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_length(x.shape[1], self.table.shape[0])
        if self.kind == "sinusoidal" and x.dtype == torch.float64:
            # the buffer holds float32-rounded values (.double() does not restore the lost digits, and
            # a float64 buffer could not go to MPS): a float64 model gets the exact table (about 1e-8 apart)
            return x + _sinusoidal64(x.shape[1], x.shape[2], x.device)
        return x + self.table[: x.shape[1]].to(x.dtype)


class Rotary(nn.Module):
    """Rotary position embedding on (B, H, T, head_dim) tensors (rotate-half convention)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"positional='rope' needs an even head dimension; got head_dim={head_dim}")
        self.head_dim, self.base = head_dim, base
        angles = self._angles(max_len)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        # rebuilt, not converted: after .bfloat16().float() the tables kept the bf16 rounding
        angles = self._angles(self.cos.shape[0])
        self.cos = angles.cos().to(self.cos.device, self.cos.dtype)
        self.sin = angles.sin().to(self.sin.device, self.sin.dtype)
        return self

    def _angles(self, T: int, device=None) -> torch.Tensor:
        """(T, head_dim) float64 rotation angles, each pair's angle twice (rotate-half)."""
        inv = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
                                  / self.head_dim)
        angles = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None, :]
        return torch.cat([angles, angles], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[-2]
        _check_length(T, self.cos.shape[0])
        if x.dtype == torch.float64:   # exact angles, not the float32-rounded buffers (see AbsolutePositions)
            angles = self._angles(T, x.device)
            cos, sin = angles.cos(), angles.sin()
        else:
            cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class RelativePositions(nn.Module):
    """Learned relative vectors ``r_{i-j}`` (distances clipped to ±max_distance), shared by heads.

    ``forward(q)`` returns the score term ``q_i · r_{clip(i-j)}`` as a (B, H, T, T) tensor, to be
    added to ``q_i · k_j`` before scaling.
    """

    def __init__(self, head_dim: int, max_distance: int):
        super().__init__()
        self.max_distance = int(max_distance)
        self.vectors = nn.Parameter(torch.empty(2 * self.max_distance + 1, head_dim))
        nn.init.normal_(self.vectors, std=0.02)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        B, H, T, _ = q.shape
        pos = torch.arange(T, device=q.device)
        index = (pos[:, None] - pos[None, :]).clamp(-self.max_distance, self.max_distance) + self.max_distance
        qr = torch.matmul(q, self.vectors.to(q.dtype).t())            # (B, H, T, 2K+1)
        return qr.gather(-1, index.expand(B, H, T, T))
