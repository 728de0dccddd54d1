"""Kernel views of a sequence (seed 002, section 10: attention as a kernel operator; Tsai et
al. 2019, "Transformer Dissection: A Unified Understanding of Transformer's Attention via the
Lens of Kernel"), compared with centred kernel alignment (CKA; Kornblith et al. 2019).

Kernel matrices on one sequence of R tokens (all (R, R)):

=============================  ==========================================================
``projection_kernel(M)``       the projection's ``M = Q S Qᵀ`` (or ``Norm(M)``), as given
``exponential_kernel(q, k)``   ``exp(q_i · k_j / sqrt(d))``: softmax attention before row
                               normalisation (Tsai et al.'s exponential kernel)
``linear_kernel(X, Y)``        ``x_i · y_j``
``polynomial_kernel(X, Y)``    ``(γ x_i · y_j + c)^p``
``rbf_kernel(X, Y)``           ``exp(-γ ‖x_i - y_j‖²)``
=============================  ==========================================================

``X`` are the queries' vectors and ``Y`` (default ``X``) the keys'. An asymmetric kernel
(``q ≠ k``, a row-stochastic attention) is not a Gram matrix; CKA and the PSD check need a
symmetric one, obtained explicitly by :func:`symmetrize`:

* ``"mean"`` (default): ``(A + Aᵀ)/2``. It is the orthogonal projection onto symmetric
  matrices, leaves symmetric kernels unchanged, keeps the scale and meaning of the entries
  (the average of i->j and j->i), and is exactly what the cross term of HSIC sees:
  ``tr(A H L H) = tr(((A + Aᵀ)/2) H L H)`` for symmetric L. It need not be PSD.
* ``"gram"``: ``A Aᵀ`` — always PSD, "i and j are similar if they attend to the same keys",
  but it squares the scale and changes a symmetric kernel K into K².

CKA of two Gram matrices (the "kernels as features" form):
``CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with ``HSIC(K, L) = tr(K H L H) / (R-1)²``,
``H = I - 11ᵀ/R``. In [0, 1] for PSD K, L; invariant to scaling either kernel; 1 when L = cK.
Linear CKA of feature matrices X (R, p), Y (R, q) is ``CKA(XXᵀ, YYᵀ) = ‖Y_cᵀ X_c‖_F² /
(‖X_cᵀ X_c‖_F ‖Y_cᵀ Y_c‖_F)`` (columns centred), computed without forming the Gram matrices.
"""

from __future__ import annotations

import numbers

import numpy as np

from distattn.analysis.factored import finite_real, to_numpy

__all__ = ["SYMMETRIZATIONS", "projection_kernel", "exponential_kernel", "linear_kernel", "polynomial_kernel",
           "rbf_kernel", "symmetrize", "center_gram", "hsic", "cka", "linear_cka", "rbf_cka", "cka_matrix",
           "psd_check"]

SYMMETRIZATIONS = ("mean", "gram", "none")


def _vectors(X, name: str) -> np.ndarray:
    X = to_numpy(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"{name} must be a 2-D (tokens, dim) array, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or inf")
    return X


def _pair(X, Y):
    X = _vectors(X, "X")
    Y = X if Y is None else _vectors(Y, "Y")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(f"X and Y must have the same dimension; got {X.shape} and {Y.shape}")
    return X, Y


def _square(K, name: str = "K") -> np.ndarray:
    K = to_numpy(K)
    if K.ndim != 2 or K.shape[0] != K.shape[1] or K.shape[0] < 2:
        raise ValueError(f"{name} must be a square (R, R) matrix with R >= 2, got shape {K.shape}")
    if not np.all(np.isfinite(K)):
        raise ValueError(f"{name} contains NaN or inf")
    return K


def projection_kernel(M, normalize: bool = False) -> np.ndarray:
    """The projection's contextual weights ``M = Q S Qᵀ`` (R, R) as a kernel; with ``normalize``
    its row-normalised ``Norm(M)`` (zero rows stay zero). ``M`` is symmetric for a symmetric S."""
    M = _square(M, "M")
    if not normalize:
        return M.copy()
    sums = M.sum(axis=1, keepdims=True)
    return np.divide(M, sums, out=np.zeros_like(M), where=sums != 0)


def exponential_kernel(q, k=None, scale: float | None = None, stabilize: bool = True) -> np.ndarray:
    """``exp(q_i · k_j · scale)`` (R_q, R_k), ``scale = 1/sqrt(d)`` by default — the learned
    attention kernel; row-normalising it gives softmax attention.

    With ``stabilize`` the scores are shifted by their maximum first, i.e. the kernel is
    multiplied by the positive constant ``exp(-max score)``: it cannot overflow, and neither CKA,
    the row-normalised attention nor PSD-ness changes.
    """
    q, k = _pair(q, k)
    scale = 1.0 / np.sqrt(q.shape[1]) if scale is None else finite_real(scale, "scale")
    scores = (q @ k.T) * scale
    if stabilize:
        scores -= scores.max()
    with np.errstate(over="raise"):
        try:
            return np.exp(scores)
        except FloatingPointError:
            raise ValueError("exp(q·k/sqrt(d)) overflows; use stabilize=True") from None


def linear_kernel(X, Y=None) -> np.ndarray:
    """``X Yᵀ`` (R_x, R_y)."""
    X, Y = _pair(X, Y)
    return X @ Y.T


def polynomial_kernel(X, Y=None, degree: int = 2, gamma: float | None = None, coef0: float = 1.0) -> np.ndarray:
    """``(γ X Yᵀ + coef0)^degree``, γ = 1/dim by default (scikit-learn's convention)."""
    X, Y = _pair(X, Y)
    if isinstance(degree, bool) or not isinstance(degree, numbers.Integral) or degree < 1:
        raise ValueError(f"degree must be a positive integer, got {degree!r}")
    gamma = 1.0 / X.shape[1] if gamma is None else finite_real(gamma, "gamma")
    return (gamma * (X @ Y.T) + finite_real(coef0, "coef0")) ** degree


def _sq_distances(X, Y) -> np.ndarray:
    # Σ (x - y)², not ‖x‖² + ‖y‖² - 2 x·y: the expansion leaves rounding noise where x = y (the
    # diagonal, a repeated token), which the "median" bandwidth then counted as non-zero distances
    from scipy.spatial.distance import cdist
    return cdist(X, Y, "sqeuclidean")


def rbf_kernel(X, Y=None, gamma: float | str | None = None) -> np.ndarray:
    """``exp(-γ ‖x_i - y_j‖²)``. ``gamma``: a positive number, None (1/dim, scikit-learn's
    default) or ``"median"`` (``γ = 1 / (2 m²)`` with m² the median non-zero squared distance, the
    usual bandwidth heuristic; Kornblith et al. use a fraction of it)."""
    X, Y = _pair(X, Y)
    d2 = _sq_distances(X, Y)
    if gamma is None:
        gamma = 1.0 / X.shape[1]
    elif gamma == "median":
        pos = d2[d2 > 0]
        gamma = 1.0 if pos.size == 0 else 1.0 / (2.0 * np.median(pos))
    elif (isinstance(gamma, (str, bool)) or not isinstance(gamma, numbers.Real) or not np.isfinite(gamma)
          or not gamma > 0):
        raise ValueError(f"gamma must be a finite positive number, None or 'median'; got {gamma!r}")
    return np.exp(-float(gamma) * d2)


def symmetrize(A, how: str = "mean") -> np.ndarray:
    """``"mean"``: ``(A + Aᵀ)/2``; ``"gram"``: ``A Aᵀ``; ``"none"``: A unchanged (must already be
    symmetric). See the module docstring for the choice."""
    return _symmetrize(A, how, "A")


def _symmetrize(A, how: str, name: str) -> np.ndarray:
    """:func:`symmetrize`, its errors naming the caller's argument ``name``."""
    A = _square(A, name)
    if how == "mean":
        return (A + A.T) / 2.0
    if how == "gram":
        return A @ A.T
    if how == "none":
        if not np.allclose(A, A.T, rtol=1e-8, atol=1e-12 * max(1.0, np.abs(A).max())):
            raise ValueError("the matrix is not symmetric; choose symmetrize='mean' ((A+Aᵀ)/2) or 'gram' (A Aᵀ)")
        return A
    raise ValueError(f"how must be one of {SYMMETRIZATIONS}, got {how!r}")


def center_gram(K) -> np.ndarray:
    """``H K H`` with ``H = I - 11ᵀ/R`` (double centring), without forming H."""
    K = _square(K)
    return K - K.mean(axis=0, keepdims=True) - K.mean(axis=1, keepdims=True) + K.mean()


def hsic(K, L) -> float:
    """Biased HSIC estimator ``tr(K H L H) / (R - 1)²`` of two (R, R) matrices."""
    K, L = _square(K, "K"), _square(L, "L")
    if K.shape != L.shape:
        raise ValueError(f"K and L must have the same shape; got {K.shape} and {L.shape}")
    n = K.shape[0]
    return float(np.sum(center_gram(K) * L.T) / (n - 1) ** 2)


def _no_variation(centred: np.ndarray, raw: np.ndarray) -> bool:
    """Is a centred kernel (or feature matrix) zero up to the rounding of its centring? A constant
    kernel such as ``np.full((R, R), 0.1)`` centres to noise of about ``R·eps·‖K‖``, not to exact
    zeros, and CKA of that noise came out as any number (1 for two constant kernels), not NaN."""
    return bool(np.linalg.norm(centred) <= 4 * raw.shape[0] * np.finfo(np.float64).eps * np.linalg.norm(raw))


def cka(K, L, symmetrize_how: str = "mean") -> float:
    """``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` after symmetrising both (``symmetrize_how``,
    see :func:`symmetrize`). NaN if either centred kernel is zero (e.g. a constant kernel)."""
    K = _symmetrize(K, symmetrize_how, "K")
    L = _symmetrize(L, symmetrize_how, "L")
    if K.shape != L.shape:
        raise ValueError(f"K and L must have the same shape (one row per token of the same sequence); "
                         f"got {K.shape} and {L.shape}")
    Kc, Lc = center_gram(K), center_gram(L)
    kl = float(np.sum(Kc * Lc))
    kk = float(np.sum(Kc * Kc))
    ll = float(np.sum(Lc * Lc))
    if kk <= 0 or ll <= 0 or _no_variation(Kc, K) or _no_variation(Lc, L):
        return float("nan")
    return kl / np.sqrt(kk * ll)


def linear_cka(X, Y) -> float:
    """Linear CKA of feature matrices X (R, p) and Y (R, q) (rows = the same R tokens); NaN if
    either is the same in every row (its Gram matrix centres to zero)."""
    X, Y = _vectors(X, "X"), _vectors(Y, "Y")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X and Y must have the same number of rows; got {X.shape} and {Y.shape}")
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    num = np.linalg.norm(Yc.T @ Xc) ** 2
    den = np.linalg.norm(Xc.T @ Xc) * np.linalg.norm(Yc.T @ Yc)
    return float("nan") if den == 0 or _no_variation(Xc, X) or _no_variation(Yc, Y) else float(num / den)


def rbf_cka(X, Y, gamma="median") -> float:
    """Kernel CKA with an RBF kernel on each feature matrix (bandwidth per :func:`rbf_kernel`)."""
    for name, Z in (("X", X), ("Y", Y)):
        if np.ndim(Z) == 2 and np.shape(Z)[0] < 2:     # else "K must be a square (R, R) matrix with R >= 2"
            raise ValueError(f"{name} must have at least 2 rows (tokens) for CKA, got shape {np.shape(Z)}")
    return cka(rbf_kernel(X, gamma=gamma), rbf_kernel(Y, gamma=gamma), "none")


def cka_matrix(kernels: dict, symmetrize_how: str = "mean") -> tuple[list[str], np.ndarray]:
    """Pairwise CKA of named (R, R) kernels: ``(names, C)`` with ``C[a, b] = cka(K_a, K_b)``
    (symmetric, ones on the diagonal for non-constant kernels)."""
    names = list(kernels)
    if len(names) < 1:
        raise ValueError("kernels is empty")
    raw = [_symmetrize(kernels[n], symmetrize_how, f"kernels[{n!r}]") for n in names]
    sym = [center_gram(k) for k in raw]
    shapes = {k.shape for k in sym}
    if len(shapes) != 1:
        raise ValueError(f"all kernels must have the same shape; got {sorted(shapes)}")
    flat = np.stack([k.ravel() for k in sym])
    gram = flat @ flat.T
    norms = np.sqrt(np.diag(gram))
    with np.errstate(invalid="ignore", divide="ignore"):
        C = gram / np.outer(norms, norms)
    constant = np.array([n == 0 or _no_variation(c, k) for n, c, k in zip(norms, sym, raw)])
    C[constant[:, None] | constant[None, :]] = np.nan
    return names, C


def psd_check(K, tol: float = 1e-8) -> dict:
    """Is the symmetric part ``(K + Kᵀ)/2`` positive semi-definite?

    PSD when its smallest eigenvalue ``>= -tol · max|eigenvalue|``. Returns ``is_psd``,
    ``min_eigenvalue``, ``max_eigenvalue`` and ``n_negative`` (eigenvalues below the tolerance).
    """
    tol = finite_real(tol, "tol", minimum=0)     # NaN: nothing was PSD
    S = _symmetrize(K, "mean", "K")
    ev = np.linalg.eigvalsh(S)
    scale = float(np.abs(ev).max())
    thresh = -tol * scale
    return {"is_psd": bool(ev[0] >= thresh), "min_eigenvalue": float(ev[0]), "max_eigenvalue": float(ev[-1]),
            "n_negative": int(np.sum(ev < thresh))}
