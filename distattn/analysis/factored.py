"""Low-rank matrices kept as their factors: ``left @ right`` is never formed unless asked.

A vocabulary-space circuit such as the QK circuit ``W_E W_Q (W_E W_K)ᵀ`` is a (vocab × vocab)
matrix of rank at most ``d_head``. :class:`FactoredMatrix` stores ``left`` (..., n, r) and
``right`` (..., r, m) (TransformerLens' ``FactoredMatrix`` habit) and answers the questions the
analyses ask in O((n + m) r²) time and O((n + m) r) memory:

* singular values / SVD: thin QR of both factors, ``left = Q_a R_a`` and ``rightᵀ = Q_b R_b``,
  so ``left @ right = Q_a (R_a R_bᵀ) Q_bᵀ`` and only the small core ``R_a R_bᵀ`` (at most
  r × r) is decomposed;
* selected entries: ``entry(i, j) = left[i] · right[:, j]``, ``submatrix(rows, cols) =
  left[rows] @ right[:, cols]``;
* composition ``F @ G`` through the smaller inner dimension.

Leading axes (e.g. heads) are allowed: ``left`` (H, n, r) and ``right`` (H, r, m) describe H
matrices; ``F[h]`` selects one.

:func:`as_factored` accepts a :class:`FactoredMatrix`, any object with ``left``/``right`` or
``A``/``B`` attributes (numpy arrays or torch tensors, e.g. ``distattn.models.qk_circuit``'s
result), or a ``(left, right)`` tuple.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

from distattn.memory import check_memory

__all__ = ["FactoredMatrix", "as_factored", "to_numpy"]


def finite_real(value, name: str, *, minimum: float | None = None, allow_none: bool = False):
    """``value`` as a float, refused unless it is a finite real number (not a bool; ``>= minimum``
    when given): NaN compares false with everything, so it once passed checks and silently emptied
    results. ``None`` passes through when ``allow_none``."""
    if allow_none and value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value)
            or (minimum is not None and value < minimum)):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{name} must be {'None or ' if allow_none else ''}a finite real number{bound}; got {value!r}")
    return float(value)


def to_numpy(x, dtype=np.float64) -> np.ndarray:
    """A numpy copy/view of an array-like or (CPU or GPU, grad or not) torch tensor."""
    if sp.issparse(x):   # np.asarray would fail with "setting an array element with a sequence"
        raise TypeError(f"expected a dense array or torch tensor; got a scipy.sparse matrix of shape {x.shape} "
                        f"(pass x.toarray() if it is small enough to be dense)")
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    return np.asarray(x, dtype=dtype)


class FactoredMatrix:
    """The product ``left @ right``, kept factored.

    Parameters
    ----------
    left : array-like, shape (..., n, r)
    right : array-like, shape (..., r, m)
        Leading axes must match. Torch tensors are converted to numpy float64.

    Attributes
    ----------
    left, right : ndarray of float64
    shape : tuple, ``(..., n, m)``
    inner_dim : int, r (an upper bound on the rank)
    """

    __array_ufunc__ = None  # so that ``ndarray @ FactoredMatrix`` defers to __rmatmul__

    def __init__(self, left, right):
        left, right = to_numpy(left), to_numpy(right)
        if left.ndim < 2 or right.ndim < 2 or left.shape[-1] != right.shape[-2] \
                or left.shape[:-2] != right.shape[:-2]:
            raise ValueError(f"FactoredMatrix needs left (..., n, r) and right (..., r, m) with the same r and "
                             f"the same leading axes; got left {left.shape}, right {right.shape}")
        if not (np.all(np.isfinite(left)) and np.all(np.isfinite(right))):
            raise ValueError("FactoredMatrix factors contain NaN or inf")
        self.left, self.right = left, right

    # ------------------------------------------------------------------ shape and views
    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.left.shape[:-1], self.right.shape[-1])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def inner_dim(self) -> int:
        return self.left.shape[-1]

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={self.shape}, inner_dim={self.inner_dim})"

    def __len__(self) -> int:
        if self.ndim == 2:
            raise TypeError("len() of a 2-D FactoredMatrix is ambiguous; use .shape")
        return self.shape[0]

    def __getitem__(self, index) -> "FactoredMatrix":
        """Index the leading axes: ``qk[h]`` is head h's (n, m) factored matrix."""
        if self.ndim == 2:
            raise IndexError("this FactoredMatrix has no leading axis to index; use rows(), entry() or "
                             "submatrix() to read entries")
        # an index reaching the matrix axes would take left's rows and right's *inner* rows alike: a wrong product
        lead = self.ndim - 2
        parts = index if isinstance(index, tuple) else (index,)
        used = sum(np.ndim(p) if isinstance(p, np.ndarray) and p.dtype == bool else 1 for p in parts)
        if used > lead or any(p is Ellipsis or p is None for p in parts):
            raise IndexError(f"a FactoredMatrix of shape {self.shape} indexes its {lead} head axes only; got "
                             f"{index!r}: read entries with rows(), entry() or submatrix()")
        return FactoredMatrix(self.left[index], self.right[index])

    @property
    def T(self) -> "FactoredMatrix":
        """``(left @ right)ᵀ = rightᵀ @ leftᵀ``."""
        return FactoredMatrix(np.swapaxes(self.right, -1, -2), np.swapaxes(self.left, -1, -2))

    # ------------------------------------------------------------------ products
    def __matmul__(self, other):
        """``F @ G`` stays factored, through the smaller of the two inner dimensions (leading
        axes broadcast: a stack of heads composes with one matrix);
        ``F @ X`` for a dense X (m, p) gives ``FactoredMatrix(left, right @ X)``, and ``F @ v`` for a
        vector v (m,) the dense vector (..., n) (per head for a stack)."""
        if isinstance(other, FactoredMatrix) or _looks_factored(other):
            other = as_factored(other)
            try:
                lead = np.broadcast_shapes(self.shape[:-2], other.shape[:-2])
            except ValueError:
                lead = None
            if self.shape[-1] != other.shape[-2] or lead is None:
                raise ValueError(f"cannot compose {self.shape} with {other.shape}")
            middle = self.right @ other.left                      # (..., r1, r2)
            if other.inner_dim <= self.inner_dim:
                left, right = self.left @ middle, other.right
            else:
                left, right = self.left, middle @ other.right
            # a stack of heads with one matrix: the factor that skipped the product gets the head axes too
            left, right = (x if x.shape[:-2] == lead else np.ascontiguousarray(np.broadcast_to(x, lead + x.shape[-2:]))
                           for x in (left, right))
            return FactoredMatrix(left, right)
        other = to_numpy(other)
        if other.ndim == 1:
            # F @ v for a vector v (m,) is the dense vector (..., n), as in numpy and distattn.models'
            # FactoredMatrix; it failed with "FactoredMatrix needs left (..., n, r) ..." (right @ v is no matrix)
            if other.shape[0] != self.shape[-1]:
                raise ValueError(f"cannot multiply {self.shape} by a vector of length {other.shape[0]}")
            return (self.left @ (self.right @ other)[..., None])[..., 0]
        return FactoredMatrix(self.left, self.right @ other)

    def __rmatmul__(self, other):
        """``X @ F`` for a dense X (p, n): ``FactoredMatrix(X @ left, right)``; ``v @ F`` for a vector
        v (n,): the dense vector (..., m)."""
        other = to_numpy(other)
        if other.ndim == 1:
            if other.shape[0] != self.shape[-2]:
                raise ValueError(f"cannot multiply a vector of length {other.shape[0]} by {self.shape}")
            return ((other @ self.left)[..., None, :] @ self.right)[..., 0, :]
        return FactoredMatrix(other @ self.left, self.right)

    # ------------------------------------------------------------------ reading entries
    def entry(self, i: int, j: int):
        """``(left @ right)[..., i, j]`` as a float (or an array over the leading axes)."""
        return np.einsum("...r,...r->...", self.left[..., i, :], self.right[..., :, j])[()]

    def rows(self, index) -> np.ndarray:
        """Dense rows ``(left @ right)[..., index, :]``; memory is checked first."""
        idx = np.atleast_1d(np.asarray(index))
        count = idx.sum() if idx.dtype == bool else idx.size
        lead = int(np.prod(self.shape[:-2])) if self.ndim > 2 else 1
        check_memory(8 * lead * int(count) * self.shape[-1], f"{int(count)} dense rows of a {self.shape} matrix")
        picked = self.left[..., index, :]                  # (*heads, *index axes, r)
        axes = picked.shape[self.ndim - 2:-1]
        # the index axes flattened to one row axis, so that each head's rows meet that head's right (one
        # row, an (H, r) matrix, was multiplied by every head's right: an (H, H, m) mixture of heads)
        rows = picked.reshape(*self.shape[:-2], -1, self.inner_dim) @ self.right
        return rows.reshape(*self.shape[:-2], *axes, self.shape[-1])

    def submatrix(self, rows, cols) -> np.ndarray:
        """Dense block ``(left @ right)[..., rows, :][..., :, cols]`` (e.g. the top-N words'
        N × N block of a QK circuit: ``(E_N W_Q)(E_N W_K)ᵀ``)."""
        rows, cols = np.asarray(rows), np.asarray(cols)
        n_r = rows.sum() if rows.dtype == bool else rows.size
        n_c = cols.sum() if cols.dtype == bool else cols.size
        lead = int(np.prod(self.shape[:-2])) if self.ndim > 2 else 1
        check_memory(8 * lead * int(n_r) * int(n_c), f"a dense {int(n_r)} x {int(n_c)} block of a {self.shape} matrix")
        heads, r = self.shape[:-2], self.inner_dim
        picked_l = self.left[..., rows, :]                 # (*heads, *row axes, r)
        picked_r = self.right[..., :, cols]                # (*heads, r, *col axes)
        row_axes, col_axes = picked_l.shape[len(heads):-1], picked_r.shape[len(heads) + 1:]
        # one row axis and one column axis per head: a scalar or 2-D index left a stack of heads
        # multiplying every head's rows with every head's columns (or raising a broadcast error)
        block = picked_l.reshape(*heads, -1, r) @ picked_r.reshape(*heads, r, -1)
        return block.reshape(tuple(heads) + row_axes + col_axes)[()]

    def to_dense(self) -> np.ndarray:
        """The full product (memory is checked first)."""
        check_memory(8 * int(np.prod(self.shape)), f"a dense {self.shape} matrix")
        return self.left @ self.right

    # ------------------------------------------------------------------ spectra
    def svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Thin SVD without forming the product.

        Returns ``u`` (..., n, k), ``s`` (..., k) descending, ``vt`` (..., k, m) with
        ``u @ diag(s) @ vt == left @ right`` and ``k = min(n, m, r)``.
        """
        qa, ra = np.linalg.qr(self.left)                           # left = qa ra
        qb, rb = np.linalg.qr(np.swapaxes(self.right, -1, -2))     # rightᵀ = qb rb
        u, s, vt = np.linalg.svd(ra @ np.swapaxes(rb, -1, -2))     # the small core
        k = min(s.shape[-1], *self.shape[-2:])
        return (qa @ u)[..., :k], s[..., :k], (vt @ np.swapaxes(qb, -1, -2))[..., :k, :]

    @property
    def singular_values(self) -> np.ndarray:
        """(..., k) descending; only the core's singular values are computed."""
        _, ra = np.linalg.qr(self.left)
        _, rb = np.linalg.qr(np.swapaxes(self.right, -1, -2))
        s = np.linalg.svd(ra @ np.swapaxes(rb, -1, -2), compute_uv=False)
        return s[..., :min(s.shape[-1], *self.shape[-2:])]

    @property
    def frobenius_sq(self):
        """``‖left @ right‖_F² = tr((leftᵀ left)(right rightᵀ))``, exact, in O((n + m) r²)."""
        gl = np.swapaxes(self.left, -1, -2) @ self.left
        gr = self.right @ np.swapaxes(self.right, -1, -2)
        return np.einsum("...ij,...ji->...", gl, gr)[()]

    def eigenvalues(self) -> np.ndarray:
        """The r eigenvalues of a square ``left @ right`` that can be non-zero: those of
        ``right @ left`` (r × r), complex."""
        if self.shape[-1] != self.shape[-2]:
            raise ValueError(f"eigenvalues need a square matrix; this one has shape {self.shape}")
        return np.linalg.eigvals(self.right @ self.left)


def _looks_factored(obj) -> bool:
    return (hasattr(obj, "left") and hasattr(obj, "right")) or (hasattr(obj, "A") and hasattr(obj, "B"))


def as_factored(obj) -> FactoredMatrix:
    """Normalise a factored matrix given as :class:`FactoredMatrix`, an object with
    ``left``/``right`` or ``A``/``B`` attributes (numpy or torch), or a ``(left, right)``
    tuple/list."""
    if isinstance(obj, FactoredMatrix):
        return obj
    if hasattr(obj, "left") and hasattr(obj, "right"):
        return FactoredMatrix(obj.left, obj.right)
    if hasattr(obj, "A") and hasattr(obj, "B"):
        return FactoredMatrix(obj.A, obj.B)
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return FactoredMatrix(obj[0], obj[1])
    raise TypeError(f"expected a FactoredMatrix, an object with left/right or A/B factors, or a (left, right) "
                    f"tuple; got {type(obj).__name__}")


def _check_k(k, upper: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= upper:
        raise ValueError(f"{name} must be an integer in [1, {upper}], got {k!r}")
    return int(k)
