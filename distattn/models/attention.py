"""Multi-head self-attention with two paths.

* **Fast path** (nothing listening): ``F.scaled_dot_product_attention`` (flash / memory-efficient
  kernels on CUDA), never materialising the (T × T) pattern.
* **Explicit path** (a hook is registered on ``hook_scores`` or ``hook_pattern``): the textbook
  ``A = softmax(Q Kᵀ / sqrt(d_k) + mask)``, ``Z = A V``, passing the scores (before the
  softmax; masked entries are ``-inf``) and the pattern (after it) through named hook points of
  shape (batch, n_heads, T_query, T_key).

On both paths the per-head queries, keys and values pass through ``hook_q``, ``hook_k``, ``hook_v``
(batch, n_heads, T, d_k; queries and keys after the rotary embedding); hooking them keeps the fused
path. :meth:`MultiHeadSelfAttention.pair_scores` gives the scores of *every* (query, key) pair from
captured queries and keys, unmasked (a causal layer's ``hook_scores`` holds ``-inf`` above the diagonal).

Both paths compute the same function (tests pin them to each other).
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from distattn.models.hooks import HookPoint
from distattn.models.positional import POSITIONAL, RelativePositions, Rotary
from distattn.models.precision import at_least_float32

__all__ = ["MultiHeadSelfAttention"]


def _autocast_off(device_type: str):
    """A context in which autocast does not lower the precision of matmuls on ``device_type``."""
    if device_type in ("cuda", "cpu", "mps", "xpu"):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


class MultiHeadSelfAttention(nn.Module):
    """``MultiHead(X) = Concat(head_1..head_h) W_O``, ``head_i = softmax(X W_Qi (X W_Ki)ᵀ / sqrt(d_k)) X W_Vi``.

    Parameters
    ----------
    d_model, n_heads : int
        ``d_k = d_model / n_heads``.
    dropout : float
        Dropout on the attention weights while training.
    bias : bool
        Biases on the Q/K/V and output projections.
    causal : bool
        Position ``i`` attends to ``j <= i`` only.
    positional : str
        ``"rope"`` and ``"relative"`` act here; other kinds are handled by the embeddings.
    max_len : int
        Longest sequence (sizes the RoPE tables and the relative distances).
    rel_max_distance : int, optional
        ``"relative"``: distances are clipped to ±this, sharing one learned vector beyond it (default
        ``max_len - 1``: none clipped).

    Weights: ``qkv.weight`` is (3·d_model, d_model) holding W_Qᵀ, W_Kᵀ, W_Vᵀ stacked; ``out.weight``
    is W_Oᵀ. :meth:`head_weights` returns them per head in the ``x @ W`` convention.
    """

    def __init__(self, d_model: int, n_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 causal: bool = False, positional: str = "none", max_len: int = 256,
                 rel_max_distance: int | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {POSITIONAL}; got {positional!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout, self.causal = float(dropout), bool(causal)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        if rel_max_distance is not None and (isinstance(rel_max_distance, bool)
                                             or not isinstance(rel_max_distance, numbers.Integral)
                                             or rel_max_distance < 0):
            raise ValueError(f"rel_max_distance must be None or an integer >= 0; got {rel_max_distance!r}")
        self.rotary = Rotary(self.head_dim, max_len) if positional == "rope" else None
        # None (not 0, a valid clip: one vector for every distance) means "none clipped"
        self.relative = (RelativePositions(self.head_dim, max_len - 1 if rel_max_distance is None
                                           else int(rel_max_distance))
                         if positional == "relative" else None)
        self.hook_q = HookPoint()        # (B, H, T, d_k), queries after the rotary embedding (if any)
        self.hook_k = HookPoint()        # (B, H, T, d_k), keys after the rotary embedding (if any)
        self.hook_v = HookPoint()        # (B, H, T, d_k), values
        self.hook_scores = HookPoint()   # (B, H, T, T), scaled, before the softmax
        self.hook_pattern = HookPoint()  # (B, H, T, T), after the softmax

    def head_weights(self) -> dict[str, torch.Tensor]:
        """Per-head W_Q, W_K, W_V of shape (H, d_model, d_k) and W_O of shape (H, d_k, d_model)."""
        H, dk, d = self.n_heads, self.head_dim, self.d_model
        wq, wk, wv = self.qkv.weight.detach().split(d, dim=0)                 # each (d, d): rows = outputs
        per_head = lambda w: w.reshape(H, dk, d).transpose(1, 2)              # (H, d_model, d_k)
        w_o = self.out.weight.detach().t().reshape(H, dk, d)                  # (H, d_k, d_model)
        return {"W_Q": per_head(wq), "W_K": per_head(wk), "W_V": per_head(wv), "W_O": w_o}

    def pair_scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The scaled scores of every (query, key) pair, with no mask: (B, H, T, T)
        ``q_i · k_j / sqrt(d_k)`` (``+ q_i · r_{i-j} / sqrt(d_k)`` under ``positional="relative"``),
        from queries and keys of shape (B, H, T, d_k) as ``hook_q`` / ``hook_k`` capture them. Where
        nothing is masked this is what ``hook_scores`` holds; a causal layer's ``hook_scores`` is
        ``-inf`` above the diagonal instead. In float32 (float64 for a float64 model), also under
        bf16/fp16 autocast."""
        scale = 1.0 / math.sqrt(self.head_dim)
        with _autocast_off(q.device.type):
            scores = torch.matmul(at_least_float32(q), at_least_float32(k).transpose(-2, -1)) * scale
            if self.relative is not None:    # in float32 too: under autocast it was a bf16 matmul
                scores = scores + self.relative(at_least_float32(q)) * scale
        return scores

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d_model); key_mask: optional bool (B, T), True where a key may be attended
        (right-padded batches; a row with no True key attends to nothing: its attention output is
        zero, on the fused and on the capture path alike). A causal layer does not read it: with
        right padding no real query sees a (later) padded key, and the fused causal kernel stays in
        use; a left-padded or gapped mask is not honoured there. Returns (B, T, d_model)."""
        B, T, _ = x.shape
        if key_mask is not None:     # a float mask would be *added* to the scores by the fused kernel
            if key_mask.dtype != torch.bool:
                raise TypeError(f"key_mask must be a bool tensor (True: attend); got {key_mask.dtype}")
            if key_mask.shape != (B, T):
                raise ValueError(f"key_mask has shape {tuple(key_mask.shape)}; it must be (batch, seq_len) = {(B, T)}")
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.causal:
            key_mask = None   # right padding: a real query never sees a later (padded) key
        explicit = self.hook_scores.active or self.hook_pattern.active
        dropout_p = self.dropout if self.training else 0.0
        # a batch row with no key at all: the fused kernel gives zeros for it from torch 2.5 on, but NaN
        # on torch 2.4 (and NaN gradients); so it attends to every key there and its output is zeroed
        no_key = None if key_mask is None or explicit else ~key_mask.any(dim=-1)[:, None, None, None]

        if not explicit and self.relative is None:
            mask = None if key_mask is None else (key_mask[:, None, None, :] | no_key)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                               is_causal=self.causal and mask is None)
            if mask is not None:
                y = y.masked_fill(no_key, 0.0)
        else:
            allowed = None
            if key_mask is not None:
                allowed = key_mask[:, None, None, :]
            if self.causal:
                allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            if not explicit:     # relative positions, nobody listening: fused kernel with a float mask
                bias = self.relative(q) * scale
                if no_key is not None:
                    allowed = allowed | no_key
                if allowed is not None:
                    bias = bias.masked_fill(~allowed, float("-inf"))
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)
                if no_key is not None:
                    y = y.masked_fill(no_key, 0.0)
            else:
                # scores and pattern in float32 even under bf16/fp16 autocast, so that what the hooks
                # capture is not rounded to 8 bits of mantissa (a bf16 pattern's rows sum to 1 ± 1e-2);
                # a float64 model keeps float64 (float32 put its pattern about 5e-10 off)
                scores = self.pair_scores(q, k)
                with _autocast_off(x.device.type):
                    if allowed is not None:
                        scores = scores.masked_fill(~allowed, float("-inf"))
                    scores = self.hook_scores(scores)
                    pattern = torch.softmax(at_least_float32(scores), dim=-1)
                    if key_mask is not None:  # a query with no key to attend: zeros, as the fused kernel gives (not NaN)
                        pattern = pattern.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
                    pattern = self.hook_pattern(pattern)
                y = torch.matmul(F.dropout(pattern, dropout_p, self.training).to(v.dtype), v)
        return self.out(y.transpose(1, 2).reshape(B, T, self.d_model))
