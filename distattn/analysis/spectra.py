"""Singular-value spectra and the numbers that summarise them.

:func:`spectrum` computes the (top) singular values of

* a sparse statistic (co-occurrence S, PPMI, directional PPMI), top ``k`` only, through
  :func:`distattn.stats.embeddings.truncated_svd`;
* a dense matrix (e.g. SVD or model embeddings, vocab × d), all of them;
* a factored circuit (``W_E W_Q (W_E W_K)ᵀ``, ``W_E W_V W_O W_U``), all the non-zero ones,
  from the small core of :meth:`FactoredMatrix.svd` (the vocab × vocab product is never formed).

It also records the exact squared Frobenius norm ``‖A‖_F² = Σ_i σ_i²`` over the *full*
spectrum (from the sparse data, the dense entries or the factors), so metrics that need the
total energy stay exact when only the top k singular values are known.

Metrics (σ_1 >= σ_2 >= ... >= 0):

=====================  ======================================================  ================
metric                 definition                                              truncated input
=====================  ======================================================  ================
effective rank         ``exp(-Σ p_i log p_i)``, ``p_i = σ_i / Σ_j σ_j``         over the values
                       (Roy & Vetterli 2007)                                   given only
stable rank            ``‖A‖_F² / ‖A‖_2² = Σ σ_i² / σ_1²``                     exact (uses ‖A‖_F²)
energy fraction (k)    ``Σ_{i<=k} σ_i² / ‖A‖_F²``                              exact (uses ‖A‖_F²)
power-law α            tail exponent of the eigenvalues ``λ_i = σ_i²`` of AᵀA  fitted to the
                       (WeightWatcher; :func:`power_law_fit`)                  values given
=====================  ======================================================  ================

On a truncated spectrum the effective rank ignores the missing tail, so it is a lower bound of
the full-spectrum value's *truncated analogue*, not of the full value (adding small σ's raises
it): compare effective ranks only across spectra truncated at the same k. The power-law fit
chooses its ``xmin`` among the values given, so truncation only matters if the best ``xmin``
of the full spectrum lies below the k-th eigenvalue (the heavy tail WeightWatcher reads is the
large-eigenvalue end, which the top-k spectrum keeps).

Subspace alignment (:func:`principal_angles`, :func:`subspace_alignment`): the principal
angles θ_i between two k-dimensional subspaces with orthonormal bases U_1, U_2 are the arccos
of the singular values of ``U_1ᵀ U_2``. ``mean_cos2 = ‖U_1ᵀU_2‖_F² / k`` is 1 for identical
subspaces and about ``k / n`` for a random pair in R^n (reported as ``chance``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from distattn.analysis.factored import (FactoredMatrix, _check_k, _looks_factored, as_factored, finite_real,
                                        to_numpy)
from distattn.memory import check_memory

__all__ = ["Spectrum", "spectrum", "max_rel_residual", "effective_rank", "stable_rank", "energy_fraction", "PowerLawFit",
           "power_law_fit", "spectrum_summary", "top_singular_vectors", "principal_angles",
           "SubspaceAlignment", "subspace_alignment"]

ALGORITHMS = ("randomized", "arpack", "dense")


@dataclass
class Spectrum:
    """Singular values of one matrix.

    Attributes
    ----------
    singular_values : ndarray (k,), descending, >= 0
    frobenius_sq : float
        ``‖A‖_F²`` over the full matrix (exact even when ``truncated``).
    shape : tuple (m, n)
    truncated : bool
        True when only the top k of ``min(m, n)`` singular values were computed and the rest may
        be non-zero.
    name : str
    """

    singular_values: np.ndarray
    frobenius_sq: float
    shape: tuple
    truncated: bool
    name: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def eigenvalues(self) -> np.ndarray:
        """``λ_i = σ_i²``: the eigenvalues of AᵀA (WeightWatcher's empirical spectral density)."""
        return self.singular_values ** 2

    def __len__(self) -> int:
        return len(self.singular_values)


def _values(spec) -> np.ndarray:
    s = spec.singular_values if isinstance(spec, Spectrum) else to_numpy(spec)
    s = np.asarray(s, dtype=np.float64)
    if s.ndim > 1 and sum(n > 1 for n in s.shape) > 1:
        # a matrix's entries are not its singular values: refuse rather than read them as such
        raise ValueError(f"expected singular values (a Spectrum or a 1-D array); got an array of shape {s.shape}. "
                         f"Pass spectrum(X) for a matrix X")
    s = s.ravel()
    if s.size == 0:
        raise ValueError("the spectrum is empty")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("singular values must be finite and non-negative")
    return np.sort(s)[::-1]


def spectrum(X, k: int | None = None, *, algorithm: str = "randomized", random_state=0,
             name: str = "", return_vectors: bool = False, tol: float | None = None):
    """The singular values of ``X``.

    Parameters
    ----------
    X : scipy.sparse matrix/array, ndarray or torch tensor (m, n), or a factored matrix
        (:class:`FactoredMatrix`, an object with ``left``/``right`` or ``A``/``B``, a
        ``(left, right)`` tuple) of shape (m, n).
    k : int, optional
        Number of top singular values. Required for sparse input unless ``algorithm="dense"``.
        Dense input defaults to all of them; factored input always gives all
        ``min(m, n, r)`` (the rest are exactly zero).
    algorithm : {"randomized", "arpack", "dense"}
        For top-k of a sparse or dense matrix: ``"randomized"`` (Halko et al., float32
        products, 7 power iterations, computed with ``k + max(10, k // 4)`` vectors and cut to
        ``k``), ``"arpack"`` (``scipy.sparse.linalg.svds``, exact to solver tolerance, slower)
        or ``"dense"`` (LAPACK on the densified matrix; memory checked). The randomized values
        are accurate where the spectrum decays past k, not where it stays flat there (a real
        PPMI matrix at k = 64: σ_64 1.6 % low; values within 1 % of each other past k: several
        %). Its result says how far it is: ``extra["max_rel_residual"]``
        (:func:`max_rel_residual` of the kept triplets: a singular value lies within that
        relative distance of each σ_i); see ``tol``.

    return_vectors : bool, default False
        Also return the singular vectors that came with the values (callers that need a
        subspace or factors as well as the spectrum then pay for one SVD, not two).
    tol : float, optional
        With ``"randomized"``: recompute with ARPACK when ``extra["max_rel_residual"]`` exceeds
        it (``extra["recomputed"]`` is then ``"arpack"``, and ``extra["max_rel_residual"]`` that of
        ARPACK's triplets). None (default): never; ARPACK can
        take minutes where the randomized SVD takes seconds.

    Returns
    -------
    Spectrum, or ``(Spectrum, u (m, k), vt (k, n))`` with ``return_vectors``
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    _check_tol(tol)
    if isinstance(X, FactoredMatrix) or _looks_factored(X) or isinstance(X, tuple):
        F = as_factored(X)
        if F.ndim != 2:
            raise ValueError(f"spectrum takes one matrix; this factored matrix has shape {F.shape} — index the "
                             f"leading (head) axis first, e.g. F[h]")
        s = F.singular_values
        n_all = len(s)
        if k is not None:
            s = s[:_check_k(k, len(s))]
        spec = Spectrum(s, float(F.frobenius_sq), F.shape[-2:], k is not None and k < n_all, name)
        if not return_vectors:
            return spec
        u, _, vt = F.svd()
        return spec, u[:, :len(s)], vt[:len(s)]
    if sp.issparse(X):
        A = sp.csr_array(X, dtype=np.float64)
        if not A.has_canonical_format:      # duplicates: Σ data² is not ‖A‖_F² until they are summed
            A = A.copy()                    # (csr_array may share the caller's arrays)
            A.sum_duplicates()
        fro = float(np.sum(A.data ** 2))
    else:
        A = to_numpy(X)
        if A.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {A.shape}")
        fro = float(np.sum(A ** 2))
    if not np.isfinite(fro):
        raise ValueError("X contains NaN or inf")
    m, n = A.shape
    full = min(m, n)
    if full == 0:
        raise ValueError(f"X has an empty dimension: shape {A.shape}")
    if k is None:
        if sp.issparse(A) and algorithm != "dense":
            raise ValueError("a sparse matrix needs k (the number of top singular values), or algorithm='dense'")
        k = full
    k = _check_k(k, full)
    u = vt = None
    info: dict = {}             # the randomized SVD's accuracy (Spectrum.extra)
    if algorithm == "dense" or k >= full - 1:
        check_memory(8 * (m * n + min(m, n) ** 2), f"a dense SVD of a {m} x {n} matrix")
        dense = A.toarray() if sp.issparse(A) else A
        if return_vectors:
            u, s, vt = np.linalg.svd(dense, full_matrices=False)
        else:
            s = np.linalg.svd(dense, compute_uv=False)
    else:
        from distattn.stats.embeddings import truncated_svd
        if algorithm == "randomized":
            extra = min(k + max(10, k // 4), full - 1)
            u, s, vt = truncated_svd(A, extra, algorithm="randomized", random_state=random_state, dtype=np.float32)
            top = np.argsort(-s, kind="stable")[:k]
            residual = max_rel_residual(A, u[:, top], s[top], vt[top])
            info["max_rel_residual"] = residual
            if tol is not None and residual > tol:
                u, s, vt = truncated_svd(A, k, algorithm="arpack", random_state=random_state)
                # the values kept are ARPACK's now: the randomized residual described values thrown away
                info.update(max_rel_residual=max_rel_residual(A, u, s, vt), recomputed="arpack")
        else:
            u, s, vt = truncated_svd(A, k, algorithm="arpack", random_state=random_state)
    order = np.argsort(-s, kind="stable")[:k]
    spec = Spectrum(np.maximum(s[order], 0.0), fro, (m, n), k < full, name)
    spec.extra.update(info)
    if not return_vectors:
        return spec
    return spec, np.asarray(u[:, order], dtype=np.float64), np.asarray(vt[order], dtype=np.float64)


def effective_rank(spec) -> float:
    """Roy & Vetterli (2007): ``exp(H(p))`` with ``p_i = σ_i / Σ_j σ_j`` (natural log).

    Between 1 (rank one) and the number of non-zero values (all equal). On a truncated
    :class:`Spectrum` it is computed over the values given only. A zero spectrum gives 0.
    """
    s = _values(spec)
    total = s.sum()
    if total == 0:
        return 0.0
    p = s[s > 0] / total
    return float(np.exp(-np.sum(p * np.log(p))))


def stable_rank(spec) -> float:
    """``‖A‖_F² / ‖A‖_2² = Σ σ_i² / σ_1²`` (exact for a :class:`Spectrum`, whose
    ``frobenius_sq`` covers the full matrix; for a bare array, the sum over the values given).
    In [1, rank]. A zero matrix gives 0."""
    s = _values(spec)
    total = spec.frobenius_sq if isinstance(spec, Spectrum) else float(np.sum(s ** 2))
    return 0.0 if s[0] == 0 else float(total / s[0] ** 2)


def energy_fraction(spec, k: int) -> float:
    """``Σ_{i<=k} σ_i² / ‖A‖_F²``: the share of the squared Frobenius norm in the top k
    directions (the relative accuracy of the best rank-k approximation is
    ``sqrt(1 - energy_fraction)``). Exact for a :class:`Spectrum`; for a bare array the
    denominator is the sum over the values given (an over-estimate if they are truncated)."""
    s = _values(spec)
    k = _check_k(k, len(s))
    total = spec.frobenius_sq if isinstance(spec, Spectrum) else float(np.sum(s ** 2))
    return 0.0 if total == 0 else float(min(np.sum(s[:k] ** 2) / total, 1.0))


@dataclass
class PowerLawFit:
    """A power-law fit ``p(λ) ∝ λ^(-alpha)`` for ``λ >= xmin``.

    ``ks_distance`` is the Kolmogorov–Smirnov distance between the empirical and fitted tail
    CDFs, ``sigma = (alpha - 1) / sqrt(n_tail)`` the MLE's standard error.
    """

    alpha: float
    xmin: float
    ks_distance: float
    sigma: float
    n_tail: int
    n_total: int


def power_law_fit(values, *, squared: bool = True, xmin: float | None = None, rtol: float = 1e-10) -> PowerLawFit:
    """WeightWatcher's power-law tail exponent α of an empirical spectral density.

    With ``squared=True`` (default) ``values`` are singular values σ (array or
    :class:`Spectrum`) and the fit is to the eigenvalues ``λ_i = σ_i²`` of AᵀA, as in
    WeightWatcher; ``squared=False`` fits the values as given.

    Method (Clauset, Shalizi & Newman 2009, as implemented in WeightWatcher's ``WWFit``,
    ``weightwatcher/WW_powerlaw.py`` in ``CalculatedContent/WeightWatcher``): sort the
    eigenvalues ascending, drop (numerically) zero ones (``λ <= rtol · λ_max``), and for every
    position ``c`` of the sorted ``λ_0 <= ... <= λ_{N-1}`` except the last, with
    ``xmin = λ_c`` and the tail ``λ_c, ..., λ_{N-1}``, compute the continuous MLE

        ``α = 1 + n / Σ_{i >= c} log(λ_i / xmin)``   (n = N - c, the tail's size)

    and the KS distance ``D = max_i |1 - (λ_i / xmin)^(1-α) - i/n|`` over the tail (i = 0..n-1,
    the empirical CDF at the i-th tail point as WWFit writes it). Candidates are positions, not
    values, as in WWFit's loop: with tied eigenvalues, the candidate at the second of two equal
    λ leaves the first out of its tail, so ``n_tail`` can be less than the number of
    ``λ >= xmin`` (``[0.7, 0.7, 0.7, 5]`` with ``squared=False``: xmin 0.7, n_tail 3). A tail
    that is all ties of its ``xmin`` (``Σ log(λ_i / xmin) = 0``: α is infinite) gets ``D = 1``;
    if every candidate does (all eigenvalues equal), the fit returned has ``alpha = inf``. The
    fit with the smallest D (the first, on equal D) is returned. Giving ``xmin`` fixes it (the
    first position of the λ closest to it is used, or the second largest λ when that is the
    largest: a tail of one point has no fit) and skips the search.

    The search is vectorised in blocks of candidates: O(N²) work for N eigenvalues.
    """
    xmin = finite_real(xmin, "xmin", allow_none=True)     # NaN: the fit started from the smallest λ
    rtol = finite_real(rtol, "rtol", minimum=0)           # NaN: no λ kept
    s = _values(values)
    lam = np.sort(s ** 2 if squared else s)
    lam = lam[lam > rtol * lam[-1]] if lam[-1] > 0 else lam[:0]
    N = lam.size
    if N < 2:
        raise ValueError(f"a power-law fit needs at least 2 non-zero eigenvalues, got {N}")
    logs = np.log(lam)
    suffix = np.cumsum(logs[::-1])[::-1]                           # Σ_{j>=i} log λ_j
    if xmin is not None:
        i0 = int(np.argmin(np.abs(lam - xmin)))
        candidates = np.array([min(i0, N - 2)])
    else:
        candidates = np.arange(N - 1)
    n = (N - candidates).astype(np.float64)
    # Σ_{i>=c} log(λ_i / xmin) is exactly 0 for a tail of ties (λ_c = λ_max); the difference of
    # sums leaves a rounding residue of either sign there: α ~ 1e15 with D = (n-1)/n, or α = ∞
    denom = np.where(lam[candidates] < lam[-1], suffix[candidates] - n * logs[candidates], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        alphas = np.where(denom > 0, 1.0 + n / denom, np.inf)
    D = np.ones(candidates.size)
    block = max(1, (1 << 22) // N)
    j = np.arange(N)
    for lo in range(0, candidates.size, block):
        c = candidates[lo:lo + block]
        a = alphas[lo:lo + block][:, None]
        nn = n[lo:lo + block][:, None]
        offset = j[None, :] - c[:, None]                           # position within the tail
        in_tail = offset >= 0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ratio = np.exp((logs[None, :] - logs[c][:, None]) * (1.0 - a))   # (λ/xmin)^(1-α)
            gap = np.abs(1.0 - ratio - offset / nn)
        gap = np.where(in_tail, gap, 0.0)
        ok = np.isfinite(a[:, 0]) & (a[:, 0] > 1)
        D[lo:lo + block] = np.where(ok, gap.max(axis=1), 1.0)
    best = int(np.argmin(D))
    i = int(candidates[best])
    alpha = float(alphas[best])
    n_tail = N - i
    return PowerLawFit(alpha=alpha, xmin=float(lam[i]), ks_distance=float(D[best]),
                       sigma=float((alpha - 1) / np.sqrt(n_tail)), n_tail=int(n_tail), n_total=int(N))


def spectrum_summary(spec: Spectrum, energy_ks=(1, 10, 100)) -> dict:
    """A JSON-ready dict: name, shape, k, truncated, σ_1, ‖A‖_F², effective rank, stable rank,
    energy fractions at each k of ``energy_ks`` (<= len), and the power-law fit (α, xmin, D,
    n_tail) or ``None`` when fewer than 2 non-zero eigenvalues; and ``max_rel_residual`` where a
    randomized :func:`spectrum` recorded it (how far its values may be from the exact ones)."""
    s = _values(spec)
    out = {"name": spec.name, "shape": list(spec.shape), "k": int(len(s)), "truncated": bool(spec.truncated),
           "sigma_max": float(s[0]), "frobenius_sq": float(spec.frobenius_sq),
           "effective_rank": effective_rank(spec), "stable_rank": stable_rank(spec),
           "energy_fraction": {int(k): energy_fraction(spec, k) for k in energy_ks if k <= len(s)}}
    try:
        fit = power_law_fit(spec)
        out["power_law"] = {"alpha": fit.alpha, "xmin": fit.xmin, "ks_distance": fit.ks_distance,
                            "sigma": fit.sigma, "n_tail": fit.n_tail}
    except ValueError:
        out["power_law"] = None
    extra = getattr(spec, "extra", None) or {}
    if "max_rel_residual" in extra:
        out["max_rel_residual"] = float(extra["max_rel_residual"])
    return out


# --------------------------------------------------------------------------- subspaces

def top_singular_vectors(X, k: int, side: str = "left", *, algorithm: str = "randomized",
                         random_state=0, tol: float | None = None) -> np.ndarray:
    """Orthonormal basis (n, k) of the top-k left (``side="left"``, column space) or right
    (``"right"``, row space) singular subspace of ``X`` (sparse, dense or factored).

    ``"randomized"`` (7 power iterations, k vectors) is far from the exact subspace where the
    spectrum stays flat past k (values within 1 % of each other: mean cos² 0.7 against ARPACK's);
    ``tol``: recompute with ARPACK when :func:`max_rel_residual` exceeds it (as :func:`spectrum`),
    or pass ``algorithm="arpack"``."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    _check_tol(tol)
    if isinstance(X, FactoredMatrix) or _looks_factored(X) or isinstance(X, tuple):
        F = as_factored(X)
        if F.ndim != 2:
            raise ValueError(f"expected one matrix, got a factored stack of shape {F.shape}; index a head first")
        u, s, vt = F.svd()
        k = _check_k(k, len(s))
        return u[:, :k] if side == "left" else vt[:k].T
    A = sp.csr_array(X, dtype=np.float64) if sp.issparse(X) else to_numpy(X)
    if A.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {A.shape}")
    if not np.all(np.isfinite(A.data if sp.issparse(A) else A)):
        raise ValueError("X contains NaN or inf")               # else LAPACK's "SVD did not converge"
    k = _check_k(k, min(A.shape))
    if algorithm == "dense" or k >= min(A.shape) - 1:
        check_memory(8 * 2 * A.shape[0] * A.shape[1], f"a dense SVD of a {A.shape} matrix")
        dense = A.toarray() if sp.issparse(A) else A
        u, _, vt = np.linalg.svd(dense, full_matrices=False)
    else:
        from distattn.stats.embeddings import truncated_svd
        if algorithm not in ("randomized", "arpack"):
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        u, s, vt = truncated_svd(A, k, algorithm=algorithm, random_state=random_state)
        if algorithm == "randomized" and tol is not None and max_rel_residual(A, u, s, vt) > tol:
            u, _, vt = truncated_svd(A, k, algorithm="arpack", random_state=random_state)
    return u[:, :k] if side == "left" else vt[:k].T


_RESIDUAL_FLOOR = 1e-3      # max_rel_residual judges values below this × σ_1 against it


def _check_tol(tol):
    if tol is not None and not (isinstance(tol, (int, float, np.floating, np.integer)) and not isinstance(tol, bool)
                                and np.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol={tol!r} is invalid; allowed: None (never recompute) or a finite number >= 0")


def max_rel_residual(A, u, s, vt) -> float:
    """The largest relative residual ``r_i / max(σ_i, 1e-3 σ_1)`` over the triplets (u_i, σ_i, v_i)
    of ``A``, with ``r_i = sqrt((‖A v_i − σ_i u_i‖² + ‖Aᵀ u_i − σ_i v_i‖²) / 2)`` (in float64): the
    eigen-residual of ``[u_i; v_i] / √2`` for ``[[0, A], [Aᵀ, 0]]``, whose eigenvalues are
    ``±σ_j(A)``, so a singular value of ``A`` lies within ``r_i`` of each σ_i. Values below
    ``1e-3 σ_1`` are judged against that floor: a rank-deficient matrix's zero values carry float32
    noise that is small beside σ_1 but large beside themselves. 0 for an all-zero ``s``."""
    s = np.asarray(s, dtype=np.float64)
    if s.size == 0 or not np.any(s):
        return 0.0
    U, V = np.asarray(u, dtype=np.float64), np.asarray(vt, dtype=np.float64).T
    r1 = np.linalg.norm(A @ V - U * s, axis=0)
    r2 = np.linalg.norm(A.T @ U - V * s, axis=0)
    r = np.sqrt((r1 ** 2 + r2 ** 2) / 2)
    rel = r / np.maximum(s, _RESIDUAL_FLOOR * np.max(np.abs(s)))
    return float(np.max(rel))


def principal_angles(U1, U2) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spaces of U1 (n, k1) and U2
    (n, k2): ``arccos`` of the singular values of ``Q_1ᵀ Q_2`` with Q orthonormal bases of the
    column spaces (``scipy.linalg.orth``: linearly dependent columns add nothing). ``min(k1, k2)``
    angles for columns of full rank (``min(rank U1, rank U2)`` otherwise); 0 = shared direction,
    π/2 = orthogonal. Agrees with ``scipy.linalg.subspace_angles`` (which lists them
    descending)."""
    U1, U2 = to_numpy(U1), to_numpy(U2)
    if U1.ndim != 2 or U2.ndim != 2 or U1.shape[0] != U2.shape[0]:
        raise ValueError(f"U1 and U2 must be 2-D with the same number of rows; got {U1.shape}, {U2.shape}")
    if not (np.all(np.isfinite(U1)) and np.all(np.isfinite(U2))):
        raise ValueError("U1 and U2 must be finite; they hold NaN or inf")       # else LAPACK's LinAlgError
    from scipy.linalg import orth     # QR would complete a dependent column with a direction outside the span
    q1, q2 = orth(U1), orth(U2)
    cos = np.clip(np.linalg.svd(q1.T @ q2, compute_uv=False), 0.0, 1.0)
    return np.arccos(cos)


@dataclass
class SubspaceAlignment:
    """Alignment of two top-k singular subspaces in R^n.

    ``cosines``: cos θ_i descending; ``angles_deg``: θ_i ascending; ``mean_cos2`` in [0, 1];
    ``chance``: k / n, the expected ``mean_cos2`` of two random k-dimensional subspaces.
    """

    cosines: np.ndarray
    angles_deg: np.ndarray
    mean_cos2: float
    chance: float
    k: int
    side: str

    def to_dict(self) -> dict:
        return {"k": self.k, "side": self.side, "mean_cos2": self.mean_cos2, "chance": self.chance,
                "cosines": self.cosines.tolist(), "angles_deg": self.angles_deg.tolist()}


def subspace_alignment(X, Y, k: int, side: str = "left", *, algorithm: str = "randomized",
                       random_state=0) -> SubspaceAlignment:
    """Principal angles between the top-k ``side`` singular subspaces of X and Y (same n).

    E.g. ``subspace_alignment(ppmi, qk[h], 32, "left")`` compares the query-side subspace of a
    head's QK circuit with the dominant row space directions of PPMI (the model's vocabulary
    must index PPMI's rows)."""
    U1 = top_singular_vectors(X, k, side, algorithm=algorithm, random_state=random_state)
    U2 = top_singular_vectors(Y, k, side, algorithm=algorithm, random_state=random_state)
    if U1.shape[0] != U2.shape[0]:
        raise ValueError(f"X and Y have different {side} dimensions: {U1.shape[0]} and {U2.shape[0]}")
    theta = principal_angles(U1, U2)
    cos = np.cos(theta)
    return SubspaceAlignment(cosines=cos, angles_deg=np.degrees(theta), mean_cos2=float(np.mean(cos ** 2)),
                             chance=float(k / U1.shape[0]), k=int(k), side=side)
