"""Vocabulary-space circuits of a trained model, as factored matrices.

For head h of layer l (TransformerLens' conventions, ``x @ W`` with row vectors):

* QK circuit ``W_E W_Q^h (W_E W_K^h)ᵀ`` (vocab × vocab): the pre-softmax score (before the
  ``1/sqrt(d_k)`` scale) that a query token gives a key token, the learned counterpart of the
  projection's ``S`` or ``W_Q W_Kᵀ``;
* OV circuit ``W_E W_V^h W_O^h W_U`` (vocab × vocab): what attending to a token writes into the
  logits, the counterpart of a row of ``QS``. Models without an unembedding (the classifier)
  give ``W_E W_V^h W_O^h`` (vocab × d_model).

Both are returned as :class:`FactoredMatrix` objects ``A @ B`` with a leading head axis, in float32
(also for bf16/fp16 weights; float64 for a float64 model); the vocab × vocab product is never
formed unless asked (:meth:`FactoredMatrix.to_dense`, which checks memory first). LayerNorm,
biases and positions are left out: these are the direct token-to-token paths of the weights.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from distattn.memory import check_memory
from distattn.models.attention import MultiHeadSelfAttention
from distattn.models.precision import at_least_float32

__all__ = ["FactoredMatrix", "attention_layers", "qk_circuit", "ov_circuit", "embedding_weight",
           "unembedding_weight"]


class FactoredMatrix:
    """The product ``A @ B`` kept as its factors. ``A``: (..., m, r), ``B``: (..., r, n).

    SVD and eigenvalues cost O((m + n) r²), never O(m n).
    """

    def __init__(self, A: torch.Tensor, B: torch.Tensor):
        if A.dim() < 2 or B.dim() < 2 or A.shape[-1] != B.shape[-2] or A.shape[:-2] != B.shape[:-2]:
            raise ValueError(f"FactoredMatrix needs A (..., m, r) and B (..., r, n) with matching r and leading "
                             f"axes; got A {tuple(A.shape)}, B {tuple(B.shape)}")
        self.A, self.B = A.detach(), B.detach()

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.A.shape[:-1], self.B.shape[-1])

    @property
    def inner_dim(self) -> int:
        return self.A.shape[-1]

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={self.shape}, inner_dim={self.inner_dim})"

    def __getitem__(self, index) -> "FactoredMatrix":
        """Index the leading (head) axes: ``qk[h]`` is head h's (m, n) factored matrix."""
        if self.A.dim() == 2:
            raise IndexError("this FactoredMatrix has no leading axis to index; use rows()")
        # an index reaching the matrix axes would take A's rows and B's *inner* rows alike: a wrong product
        lead = self.A.dim() - 2
        parts = index if isinstance(index, tuple) else (index,)
        used = sum(p.dim() if isinstance(p, torch.Tensor) and p.dtype == torch.bool else 1 for p in parts)
        if used > lead or any(p is Ellipsis or p is None for p in parts):
            raise IndexError(f"a FactoredMatrix of shape {self.shape} indexes its {lead} head axes only; got "
                             f"{index!r}: take matrix rows with rows(), e.g. qk[h].rows(ids)")
        return FactoredMatrix(self.A[index], self.B[index])

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def __matmul__(self, other):
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
        if isinstance(other, torch.Tensor) and other.dim() == 1:
            # a vector as a column: B @ v is (H, r), which A (H, m, r) took for one (H, r) matrix
            return (self.A @ (self.B @ other).unsqueeze(-1)).squeeze(-1)
        return self.A @ (self.B @ other)

    def rows(self, index) -> torch.Tensor:
        """Dense rows ``(A @ B)[..., index, :]``."""
        lead = self.A.shape[:-2]
        picked = self.A[..., index, :]                  # (*lead, *index axes, r)
        axes = picked.shape[len(lead):-1]
        # the index axes flattened to one row axis, so that each head's rows meet that head's B (one
        # row, an (H, r) matrix, was multiplied by every head's B: an (H, H, n) mixture of heads)
        rows = picked.reshape(*lead, -1, self.inner_dim) @ self.B
        return rows.reshape(*lead, *axes, self.B.shape[-1])

    def to_dense(self) -> torch.Tensor:
        n = 1
        for s in self.shape:
            n *= s
        check_memory(n * self.A.element_size(), f"a dense {self.shape} circuit")
        return self.A @ self.B

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Thin SVD ``U diag(S) Vh`` of ``A @ B`` (float64): U (..., m, k), S (..., k), Vh (..., k, n), k = min(r, m, n).

        Via QR of both factors: ``A = Qa Ra``, ``Bᵀ = Qb Rb``, ``A B = Qa (Ra Rbᵀ) Qbᵀ``.
        """
        A, B = self.A.double(), self.B.double()
        qa, ra = torch.linalg.qr(A)
        qb, rb = torch.linalg.qr(B.transpose(-2, -1))
        u, s, vh = torch.linalg.svd(ra @ rb.transpose(-2, -1))
        k = min(s.shape[-1], *self.shape[-2:])
        return (qa @ u)[..., :k], s[..., :k], (vh @ qb.transpose(-2, -1))[..., :k, :]

    @property
    def singular_values(self) -> torch.Tensor:
        return self.svd()[1]

    def eigenvalues(self) -> torch.Tensor:
        """The r eigenvalues of the square ``A @ B`` that can be non-zero, as those of ``B @ A`` (complex128)."""
        if self.shape[-1] != self.shape[-2]:
            raise ValueError(f"eigenvalues need a square matrix; this one has shape {self.shape}")
        return torch.linalg.eigvals(self.B.double() @ self.A.double())

    def numpy(self):
        """``(A, B)`` as numpy arrays (e.g. for ``distattn.projection.factored_svd(A, B.T)``)."""
        return self.A.cpu().numpy(), self.B.cpu().numpy()


def attention_layers(model: nn.Module) -> list[MultiHeadSelfAttention]:
    """The model's attention modules in layer order."""
    return [m for m in model.modules() if isinstance(m, MultiHeadSelfAttention)]


def embedding_weight(model: nn.Module) -> torch.Tensor:
    """W_E, (vocab, d_model)."""
    emb = model.trunk.tok_emb if hasattr(model, "trunk") else model.tok_emb
    return emb.weight.detach()


def unembedding_weight(model: nn.Module) -> torch.Tensor | None:
    """W_U, (d_model, vocab), or None for models without one."""
    head = getattr(model, "lm_head", None)
    return None if head is None else head.weight.detach().t()


def _layer(model, layer):
    layers = attention_layers(model)
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not -len(layers) <= layer < len(layers):
        raise ValueError(f"layer must be an integer in [0, {len(layers)}) for this {len(layers)}-layer model; "
                         f"got {layer!r}")
    return layers[int(layer)]


@torch.no_grad()
def qk_circuit(model: nn.Module, layer: int = 0) -> FactoredMatrix:
    """(n_heads, vocab, vocab): ``(W_E W_Q^h) @ (W_E W_K^h)ᵀ``."""
    w = _layer(model, layer).head_weights()
    E = at_least_float32(embedding_weight(model))
    return FactoredMatrix(E @ w["W_Q"].to(E.dtype), (E @ w["W_K"].to(E.dtype)).transpose(-2, -1))


@torch.no_grad()
def ov_circuit(model: nn.Module, layer: int = 0) -> FactoredMatrix:
    """(n_heads, vocab, vocab): ``(W_E W_V^h) @ (W_O^h W_U)``; (n_heads, vocab, d_model) without W_U."""
    w = _layer(model, layer).head_weights()
    E = at_least_float32(embedding_weight(model))
    U = unembedding_weight(model)
    right = w["W_O"].to(E.dtype) if U is None else w["W_O"].to(E.dtype) @ U.to(E.dtype)
    return FactoredMatrix(E @ w["W_V"].to(E.dtype), right)
