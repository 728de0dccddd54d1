"""PMI and (shifted, context-smoothed) PPMI weighting of a co-occurrence count matrix.

Notation (Levy, Goldberg & Dagan 2015, "Improving distributional similarity with lessons
learned from word embeddings", the *hyperwords* code): ``C`` is an (n_words, n_contexts)
matrix of non-negative counts, ``C_w* = sum_c C_wc`` a row sum, ``C_*c = sum_w C_wc`` a
column sum and ``Σ = sum_wc C_wc``. With context-distribution smoothing ``α`` (``cds``)::

    P(w, c)  = C_wc / Σ
    P(w)     = C_w* / Σ
    P_α(c)   = C_*c^α / sum_c' C_*c'^α
    PMI(w,c) = log P(w, c) / (P(w) P_α(c)) = log(C_wc / C_w*) - log P_α(c)
    SPPMI_k(w, c) = max(PMI(w, c) - log k, 0)          (k = ``neg``)

With ``α = 1`` this is plain PMI, ``log(C_wc Σ / (C_w* C_*c))``.

Every function works over the stored entries only (vectorised over nnz), so a sparse input
is never densified. Zero rows and zero columns are allowed and never produce NaN or inf in
PPMI.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def _validate_data(estimator, X, **kwargs):
        return estimator._validate_data(X, **kwargs)

__all__ = ["pmi", "ppmi", "PPMITransformer"]


# --------------------------------------------------------------------------- validation

def _check_cds(cds) -> float:
    if (
        isinstance(cds, bool)
        or not isinstance(cds, numbers.Real)
        or not np.isfinite(cds)
        or not 0.0 < cds <= 1.0
    ):
        raise ValueError(f"cds must be a real number in (0, 1], got {cds!r}.")
    return float(cds)


def _check_neg(neg) -> float:
    if isinstance(neg, bool) or not isinstance(neg, numbers.Real) or not np.isfinite(neg) or neg < 1:
        raise ValueError(f"neg must be a real number >= 1 (1 means no shift), got {neg!r}.")
    return float(neg)


def _check_non_negative(values: np.ndarray, whom: str) -> None:
    if values.size:
        lowest = values.min()
        if lowest < 0:
            # "Negative values in data passed to" is the phrase scikit-learn's checks match.
            raise ValueError(
                f"Negative values in data passed to {whom}: the minimum found is {float(lowest)!r}; "
                "co-occurrence counts must be >= 0."
            )


def _as_counts(counts, whom: str):
    """(csr_array float64 with duplicates summed, zeros eliminated, sorted indices) for sparse
    input, or a float64 ndarray for anything else. Always a copy."""
    if sp.issparse(counts):
        C = sp.csr_array(counts, dtype=np.float64, copy=True)
        C.sum_duplicates()  # also sorts the indices
        C.eliminate_zeros()
        if max(C.nnz, *C.shape) <= np.iinfo(np.int32).max:  # a coo_array's int64 coordinates kept int64
            C.indices = C.indices.astype(np.int32, copy=False)
            C.indptr = C.indptr.astype(np.int32, copy=False)
        values = C.data
    else:
        C = np.array(counts, dtype=np.float64)  # np.array, not asarray: drops np.matrix
        values = C
    if C.ndim != 2:
        raise ValueError(f"{whom} expects a 2-D count matrix, got an array of shape {C.shape}.")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{whom} expects finite counts; the input contains NaN or inf.")
    _check_non_negative(values, whom)
    return C


# --------------------------------------------------------------------------- the core

def _context_log_prob(col_sums: np.ndarray, cds: float) -> np.ndarray:
    """log P_α(c) for each column, shape (n_contexts,); -inf for a column that sums to 0."""
    smoothed = np.power(col_sums, cds)
    total = smoothed.sum()
    with np.errstate(divide="ignore"):
        if total > 0:
            return np.log(smoothed) - np.log(total)
        return np.full_like(smoothed, -np.inf)


def _pmi_entries(values, row_index, col_index, row_sums, log_context_prob) -> np.ndarray:
    """PMI for the listed entries, all of whose counts are > 0: shape (nnz,).

    ``log(C_wc) - log(C_w*) - log P_α(c)``. An entry whose context has P_α(c) = 0 (a column
    unseen when P_α was fitted) gets +inf here; callers decide what that means.
    """
    with np.errstate(divide="ignore"):
        return np.log(values) - np.log(row_sums)[row_index] - log_context_prob[col_index]


def _sparse_pmi(C: sp.csr_array, log_context_prob: np.ndarray) -> np.ndarray:
    row_sums = C.sum(axis=1)
    row_index = np.repeat(np.arange(C.shape[0]), np.diff(C.indptr))
    return _pmi_entries(C.data, row_index, C.indices, row_sums, log_context_prob)


def _shift_and_clip(values: np.ndarray, neg: float) -> np.ndarray:
    """max(PMI - log neg, 0); non-finite entries (unseen contexts) become 0."""
    out = values - np.log(neg)
    out[~np.isfinite(out) | (out < 0)] = 0.0
    return out


def _weight(C, log_context_prob: np.ndarray, neg: float | None):
    """PMI (``neg is None``) or shifted PPMI of a validated count matrix (see _as_counts)."""
    if sp.issparse(C):
        data = _sparse_pmi(C, log_context_prob)
        if neg is not None:
            data = _shift_and_clip(data, neg)
        out = sp.csr_array((data, C.indices, C.indptr), shape=C.shape)  # C is our private copy
        if neg is not None:
            out.eliminate_zeros()
        return out
    rows, cols = np.nonzero(C)
    data = _pmi_entries(C[rows, cols], rows, cols, C.sum(axis=1), log_context_prob)
    if neg is None:
        out = np.full(C.shape, -np.inf)
    else:
        out = np.zeros(C.shape)
        data = _shift_and_clip(data, neg)
    out[rows, cols] = data
    return out


# --------------------------------------------------------------------------- functions

def pmi(counts, cds: float = 1.0):
    """Pointwise mutual information of a co-occurrence count matrix.

    ``PMI(w, c) = log(C_wc / C_w*) - log P_α(c)`` with ``P_α(c) = C_*c^α / sum_c' C_*c'^α``
    and ``α = cds`` (see the module docstring).

    Parameters
    ----------
    counts : scipy.sparse matrix/array or array-like, shape (n_words, n_contexts)
        Non-negative co-occurrence counts (integer or real).
    cds : float in (0, 1], default 1.0
        Context-distribution smoothing exponent α; 1 is unsmoothed PMI.

    Returns
    -------
    scipy.sparse.csr_array of float64, shape (n_words, n_contexts), for sparse input
        PMI of the stored entries only: the sparsity pattern is exactly that of the nonzero
        counts (sorted indices). An entry whose count is zero has PMI = -inf and is *not
        stored*, so the implicit zeros of this matrix mean -inf, not 0. A stored entry whose
        PMI is exactly 0 (independence) is therefore kept as an explicit zero.
    numpy.ndarray of float64, same shape, for dense input
        With ``-inf`` wherever the count is zero (including whole zero rows/columns).

    Raises
    ------
    ValueError
        If ``cds`` is outside (0, 1], or the counts are negative, non-finite or not 2-D.
    """
    cds = _check_cds(cds)
    C = _as_counts(counts, "pmi")
    return _weight(C, _context_log_prob(np.asarray(C.sum(axis=0)), cds), neg=None)


def ppmi(counts, neg: float = 1, cds: float = 1.0):
    """Shifted positive PMI: ``max(PMI(w, c) - log neg, 0)``.

    Parameters
    ----------
    counts : scipy.sparse matrix/array or array-like, shape (n_words, n_contexts)
        Non-negative co-occurrence counts.
    neg : float >= 1, default 1
        Shift ``k`` (the number of negative samples in SGNS); 1 means no shift.
    cds : float in (0, 1], default 1.0
        Context-distribution smoothing exponent α (Levy et al. recommend 0.75).

    Returns
    -------
    scipy.sparse.csr_array of float64 for sparse input (explicit zeros eliminated, sorted
    indices; int32 indices where they fit), numpy.ndarray of float64 for dense input; shape
    (n_words, n_contexts). Never contains NaN or inf; zero rows/columns stay zero.
    """
    neg = _check_neg(neg)
    cds = _check_cds(cds)
    C = _as_counts(counts, "ppmi")
    return _weight(C, _context_log_prob(np.asarray(C.sum(axis=0)), cds), neg=neg)


# --------------------------------------------------------------------------- estimator

class PPMITransformer(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Shifted, context-smoothed PPMI as a scikit-learn transformer.

    ``fit`` learns the smoothed context distribution ``P_α(c)`` from the column sums of the
    training counts; ``transform`` weights each row with its *own* marginal ``C_w*`` and the
    fitted ``P_α``::

        out[w, c] = max(log(X_wc / X_w*) - log P_α(c) - log neg, 0)

    so ``PPMITransformer(neg, cds).fit_transform(C)`` equals ``ppmi(C, neg, cds)``, and a row
    transformed alone gives the same result as in a batch.

    Parameters
    ----------
    neg : float >= 1, default 1
        Shift ``k``: subtract ``log k`` before clipping at zero.
    cds : float in (0, 1], default 0.75
        Context-distribution smoothing exponent α.

    Attributes
    ----------
    context_counts_ : ndarray of shape (n_features_in_,)
        Column sums ``C_*c`` of the training counts.
    context_log_prob_ : ndarray of shape (n_features_in_,)
        ``log P_α(c)``; ``-inf`` for a context never seen in training. In ``transform`` such
        a context has no defined PMI and its entries are set to 0 (treated like an unknown
        context) rather than +inf.
    n_features_in_ : int
        Number of contexts (columns) seen in ``fit``.

    Notes
    -----
    Sparse input (any scipy.sparse format) gives a ``scipy.sparse.csr_array`` (float64,
    explicit zeros eliminated); dense input gives a float64 ndarray. Input must be finite and
    non-negative. It passes ``sklearn.utils.estimator_checks.check_estimator`` with no
    expected failures.
    """

    def __init__(self, neg: float = 1, cds: float = 0.75):
        self.neg = neg
        self.cds = cds

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.positive_only = True
        return tags

    def _validated(self, X, reset: bool):
        X = _validate_data(
            self, X, reset=reset, accept_sparse=("csr", "csc", "coo"), dtype=np.float64
        )
        return _as_counts(X, f"{type(self).__name__}.{'fit' if reset else 'transform'}")

    def fit(self, X, y=None):
        """Learn ``P_α(c)`` from the column sums of ``X`` (n_samples, n_contexts). ``y`` is
        ignored. Returns ``self``."""
        _check_neg(self.neg)
        cds = _check_cds(self.cds)
        C = self._validated(X, reset=True)
        self.context_counts_ = np.asarray(C.sum(axis=0), dtype=np.float64).ravel()
        self.context_log_prob_ = _context_log_prob(self.context_counts_, cds)
        return self

    def transform(self, X):
        """PPMI of the rows of ``X`` (n_samples, n_contexts) under the fitted ``P_α``.

        Returns a csr_array for sparse ``X``, an ndarray for dense ``X``; float64, same shape.
        """
        check_is_fitted(self)
        neg = _check_neg(self.neg)
        C = self._validated(X, reset=False)
        return _weight(C, self.context_log_prob_, neg=neg)
