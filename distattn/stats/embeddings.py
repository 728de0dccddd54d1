"""Word vectors from a truncated SVD of a (PPMI) word-context matrix.

For an (n_words, n_contexts) matrix ``X ≈ U Σ Vᵀ`` truncated to ``dim`` singular triplets
(Levy, Goldberg & Dagan 2015, *hyperwords*)::

    word vectors     W = U Σ^eig        (n_words, dim)
    context vectors  K = V Σ^eig        (n_contexts, dim)
    vectors          W, or W + K ("w+c", needs a square matrix), then rows L2-normalised

``eig = 1`` gives the classical ``U Σ`` (``W Kᵀ``-style reconstruction ``X ≈ U Σ Vᵀ``),
``eig = 0`` the bare orthonormal ``U``, and ``eig = 0.5`` the symmetric split that Levy et
al. found best for similarity tasks.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import svds
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted

from distattn.corpus.vocabulary import _not_a_string
from distattn.memory import check_memory

__all__ = ["SVDEmbeddings", "truncated_svd"]

_ALGORITHMS = ("arpack", "randomized")


def _flip_signs(u: np.ndarray, vt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Make the largest-|.| entry of each left singular vector positive (first one on ties);
    flip the matching right vector so that ``u Σ vt`` is unchanged. In place."""
    if u.shape[1]:
        biggest = np.argmax(np.abs(u), axis=0)
        signs = np.sign(u[biggest, np.arange(u.shape[1])])
        signs[signs == 0] = 1.0
        u *= signs
        vt *= signs[:, None]
    return u, vt


def truncated_svd(X, dim: int, algorithm: str = "arpack", random_state=0, dtype=np.float64, *, name: str = "dim"):
    """The ``dim`` largest singular triplets of ``X`` (sparse or dense, shape (m, n)).

    Returns ``(u, s, vt)`` with shapes (m, dim), (dim,), (dim, n): singular values sorted in
    descending order and a deterministic sign convention (the largest-|.| entry of each
    column of ``u`` is positive). ``dim`` must satisfy ``1 <= dim < min(m, n)``; ``name`` is what
    the error calls it (a caller's own argument, e.g. ``"rank"``).
    """
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"algorithm must be one of {_ALGORITHMS}, got {algorithm!r}.")
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {np.dtype(dtype)}.")
    if not sp.issparse(X):
        X = np.asarray(X)          # a list of rows raised AttributeError ('list' has no 'shape')
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D matrix (n_words, n_contexts); got an array of shape {X.shape}.")
    values = (X if X.format in ("csr", "csc", "coo") else sp.csr_array(X)).data if sp.issparse(X) else np.asarray(X)
    if not np.all(np.isfinite(values)):              # ARPACK/LAPACK would fail with an opaque error
        raise ValueError("X contains NaN or inf; the SVD needs finite values.")
    m, n = X.shape
    if (
        isinstance(dim, bool)
        or not isinstance(dim, numbers.Integral)
        or not 1 <= dim < min(m, n)
    ):
        raise ValueError(
            f"{name} must be an integer with 1 <= {name} < min(X.shape) = {min(m, n)} "
            f"(X has shape {X.shape}), got {dim!r}."
        )
    if not np.any(values):
        # X = 0: every singular value is 0 and every U Σ, V Σ is 0. ARPACK raised "Starting vector
        # is zero" here (e.g. on ppmi(counts, neg=5) of a small corpus, which can clip to all zeros).
        return np.zeros((m, dim)), np.zeros(dim), np.zeros((dim, n))
    if algorithm == "arpack":
        # A seeded start vector makes ARPACK reproducible without depending on svds'
        # random_state/rng keyword, which differs across SciPy versions.
        v0 = check_random_state(random_state).uniform(-1.0, 1.0, size=min(m, n))
        u, s, vt = svds(X, k=dim, v0=v0)
    else:
        # dtype=float32 halves the memory traffic of the sparse products (the vectors come
        # back in float64 either way).
        u, s, vt = _randomized_svd(X, dim, n_iter=7, random_state=random_state, dtype=dtype)
        u, s, vt = u.astype(np.float64), s.astype(np.float64), vt.astype(np.float64)
    order = np.argsort(s)[::-1]
    u = np.ascontiguousarray(u[:, order])
    vt = np.ascontiguousarray(vt[order])
    # U = X V S^-1: an all-zero row of X has an exactly zero row of U (and likewise for the
    # columns and V). Iterative solvers leave ~1e-17 noise there, which row normalisation
    # would blow up into a random unit vector.
    u[_empty_lines(X, axis=1)] = 0.0
    vt[:, _empty_lines(X, axis=0)] = 0.0
    u, vt = _flip_signs(u, vt)
    return u, s[order].copy(), vt


def _randomized_svd(X, dim: int, n_iter: int = 7, n_oversamples: int = 10, random_state=0, dtype=np.float64):
    """Halko, Martinsson & Tropp's randomized SVD with normalised power iterations (the
    algorithm of ``sklearn.utils.extmath.randomized_svd``). The sparse products run on all CPU
    threads, and each power iterate is orthonormalised by Cholesky-QR (one small Gram matrix
    in float64), falling back to Householder QR if the Gram matrix is not positive definite."""
    from distattn.stats._kernels import csr_dense_matmul

    m, n = X.shape
    n_random = min(dim + n_oversamples, min(m, n))
    if sp.issparse(X):
        A = sp.csr_array(X, dtype=dtype)
        At = sp.csr_array(A.T)

        def mul(M, Y):
            return csr_dense_matmul(M.indptr, M.indices, M.data, np.ascontiguousarray(Y, dtype=dtype))
    else:
        A = np.asarray(X, dtype=dtype)
        At = A.T

        def mul(M, Y):
            return M @ Y.astype(dtype, copy=False)

    def orthonormalize(Y):
        gram = Y.T.astype(np.float64) @ Y.astype(np.float64)
        try:
            chol = np.linalg.cholesky(gram)
        except np.linalg.LinAlgError:
            return np.linalg.qr(Y)[0]
        return np.linalg.solve(chol, Y.T.astype(np.float64)).T.astype(dtype)

    rng = check_random_state(random_state)
    Q = mul(A, rng.standard_normal(size=(n, n_random)).astype(dtype))
    for _ in range(n_iter):
        Q = mul(At, orthonormalize(Q))
        Q = mul(A, orthonormalize(Q))
    Q = np.linalg.qr(Q.astype(np.float64))[0]
    B = mul(At, Q.astype(dtype)).T.astype(np.float64)
    Uh, s, vt = np.linalg.svd(B, full_matrices=False)
    u = Q @ Uh
    return u[:, :dim], s[:dim], vt[:dim]


def _empty_lines(X, axis: int) -> np.ndarray:
    """Boolean mask of the all-zero rows (axis=1) or columns (axis=0) of X."""
    if sp.issparse(X):
        X = sp.csr_array(X) if axis == 1 else sp.csc_array(X)
        X = X.copy()
        X.eliminate_zeros()
        return np.diff(X.indptr) == 0
    return ~np.asarray(X != 0).any(axis=axis)


def _row_normalize(a: np.ndarray) -> np.ndarray:
    """L2-normalise rows in place; all-zero rows stay zero."""
    norms = np.linalg.norm(a, axis=1)
    norms[norms == 0] = 1.0
    a /= norms[:, None]
    return a


class SVDEmbeddings(TransformerMixin, BaseEstimator):
    """Truncated-SVD word embeddings of a word-context (PPMI) matrix.

    Parameters
    ----------
    dim : int, default 300
        Number of singular triplets kept; ``1 <= dim < min(X.shape)``.
    eig : float >= 0, default 0.5
        Exponent of Σ in ``U Σ^eig`` and ``V Σ^eig`` (1 = classical, 0 = bare ``U``). Directions
        with a (numerically) zero singular value (``dim`` above the rank of ``X``) are 0 in
        every vector, whatever ``eig``: their singular vectors are arbitrary.
    wc : bool, default False
        If True, ``vectors_ = word_vectors_ + context_vectors_`` ("w+c"); requires a square
        matrix whose rows and columns index the same vocabulary.
    normalize : bool, default True
        L2-normalise the rows of ``vectors_`` (and of ``transform``'s output); zero rows stay
        zero.
    random_state : int, RandomState or None, default 0
        Seed for the ARPACK start vector or the randomized range finder.
    algorithm : {"arpack", "randomized"}, default "randomized"
        randomized SVD (Halko et al.; sklearn's algorithm) with 7 power iterations, the
        sparse products on all CPU threads, or
        ``scipy.sparse.linalg.svds`` (ARPACK, exact to solver tolerance, several times slower
        at dim 300).
    dtype : {numpy.float64, numpy.float32}, default float64
        Precision of the randomized iterations. float32 halves their memory traffic (on IMDB
        PPMI, 30k words, dim 300: 24 s against 47 s, similarity scores equal to ±0.01).

    Attributes
    ----------
    singular_values_ : ndarray of shape (dim,)
        Σ, in descending order.
    components_ : ndarray of shape (dim, n_contexts)
        Vᵀ, the right singular vectors (signs fixed so that the largest-|.| entry of each
        left singular vector is positive).
    word_vectors_ : ndarray of shape (n_words, dim)
        ``U Σ^eig``.
    context_vectors_ : ndarray of shape (n_contexts, dim)
        ``V Σ^eig``.
    vectors_ : ndarray of shape (n_words, dim)
        The word (or w+c) vectors, row-normalised if ``normalize`` (with ``normalize=False``
        and ``wc=False`` this is the same array as ``word_vectors_``).
    words_ : list or None
        The ``words`` passed to ``fit``.
    n_features_in_ : int
        ``n_contexts``.
    """

    def __init__(
        self,
        dim: int = 300,
        eig: float = 0.5,
        wc: bool = False,
        normalize: bool = True,
        random_state=0,
        algorithm: str = "randomized",
        dtype=np.float64,
    ):
        self.dim = dim
        self.eig = eig
        self.wc = wc
        self.normalize = normalize
        self.dtype = dtype
        self.random_state = random_state
        self.algorithm = algorithm

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _check_eig(self) -> float:
        eig = self.eig
        if isinstance(eig, bool) or not isinstance(eig, numbers.Real) or not np.isfinite(eig) or eig < 0:
            raise ValueError(f"eig must be a finite real number >= 0, got {eig!r}.")
        return float(eig)

    def fit(self, X, y=None, words=None):
        """Factorise ``X`` (n_words, n_contexts), sparse or dense, usually ``ppmi(counts)``.

        ``y`` is ignored (scikit-learn's second argument). ``words`` (optional, length n_words)
        labels the rows for :meth:`to_keyed_vectors`. Returns ``self``.
        """
        eig = self._check_eig()
        X = check_array(X, accept_sparse=("csr", "csc"), dtype=np.float64)
        n_words, n_contexts = X.shape
        if self.wc and n_words != n_contexts:
            raise ValueError(
                f"wc=True adds word and context vectors, so X must be square; got shape {X.shape}."
            )
        if words is None and _looks_like_words(y, n_words):
            # fit(X, words) was the order before y came second: the words would be ignored unseen (a
            # warning, not an error: a y of distinct string labels is legal, if unlikely)
            warnings.warn("SVDEmbeddings.fit(X, y, words=None): y is ignored, and it holds a distinct string "
                          "for every row of X, like row labels; pass them as words=... to label the rows",
                          UserWarning, stacklevel=2)
        if words is not None:
            _not_a_string(words, "words", "a sequence with one word per row of X")
            words = list(words)
            if len(words) != n_words:
                raise ValueError(f"words has {len(words)} entries but X has {n_words} rows.")
        dim = self.dim
        if isinstance(dim, numbers.Integral) and not isinstance(dim, bool) and dim > 0:
            # u, vt and their Σ^eig-scaled copies, the normalised copy, and the ARPACK/range
            # finder workspace (about max(2 dim + 1, 20) vectors of length max(m, n)).
            work = max(2 * dim + 1, 20, dim + 10) * max(n_words, n_contexts)
            check_memory(
                8 * (3 * dim * (n_words + n_contexts) + work),
                f"SVDEmbeddings(dim={dim}) on a {n_words} x {n_contexts} matrix",
            )
        u, s, vt = truncated_svd(X, dim, self.algorithm, self.random_state, self.dtype)

        # a direction with a (numerically) zero singular value is an arbitrary completion of the
        # basis: s**0 = 1 made it a full unit column of U at eig=0; 0 here, as in transform
        scale = np.zeros_like(s)
        nonzero = _nonzero_directions(s, n_contexts)
        scale[nonzero] = np.power(s[nonzero], eig)
        self.singular_values_ = s
        self.components_ = vt
        self.word_vectors_ = u * scale
        self.context_vectors_ = vt.T * scale
        if self.wc:
            vectors = self.word_vectors_ + self.context_vectors_
        else:
            vectors = self.word_vectors_.copy() if self.normalize else self.word_vectors_
        self.vectors_ = _row_normalize(vectors) if self.normalize else vectors
        self.words_ = words
        self.n_features_in_ = n_contexts
        return self

    def transform(self, X):
        """Fold new rows into the word space: ``X V Σ^(eig-1)`` (then row-normalised if
        ``normalize``).

        ``X`` has shape (n_samples, n_contexts) and must be weighted like the fitted matrix
        (e.g. PPMI rows from the same fitted :class:`PPMITransformer`). For a row of the
        fitted matrix this returns its ``U Σ^eig`` word vector, since ``X v_i = σ_i u_i``.
        Directions with a (numerically) zero singular value are mapped to 0. Context vectors
        are not available for new rows, so ``wc`` is ignored here.
        Returns an ndarray of shape (n_samples, dim).
        """
        check_is_fitted(self)
        eig = self._check_eig()
        X = check_array(X, accept_sparse=("csr", "csc"), dtype=np.float64)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )
        s = self.singular_values_
        check_memory(8 * X.shape[0] * len(s), f"SVDEmbeddings.transform of {X.shape[0]} rows")
        scale = np.zeros_like(s)
        nonzero = _nonzero_directions(s, X.shape[1])
        scale[nonzero] = np.power(s[nonzero], eig - 1.0)
        out = np.asarray(X @ self.components_.T) * scale
        return _row_normalize(out) if self.normalize else out

    def fit_transform(self, X, y=None, words=None):
        """``fit(X, words=words).transform(X)``: the (row-normalised) ``U Σ^eig``."""
        return self.fit(X, words=words).transform(X)

    def to_keyed_vectors(self, words=None, dtype=np.float32, drop_zero: bool = True):
        """Export ``vectors_`` as a :class:`gensim.models.KeyedVectors`.

        ``words`` (length n_words; default: the ``words`` given to ``fit``) names each row;
        rows whose word is ``None`` (e.g. padding or unknown-token slots) are dropped. Words
        must be unique. Vectors are stored as ``dtype`` (gensim's default float32).

        With ``drop_zero`` (the default) rows that are exactly zero are dropped too: words that
        never co-occurred, such as ``<pad>`` and ``<unk>`` when out-of-vocabulary tokens were
        dropped before counting. They have no direction, and gensim's ``most_similar`` would
        rank them with a NaN similarity; ``drop_zero=False`` keeps them.
        """
        from gensim.models import KeyedVectors

        check_is_fitted(self)
        if words is None:
            words = self.words_
        if words is None:
            raise ValueError("to_keyed_vectors needs words: pass them here or to fit(X, words=...).")
        _not_a_string(words, "words", "a sequence with one word per row")
        words = list(words)
        n_words = self.vectors_.shape[0]
        if len(words) != n_words:
            raise ValueError(f"words has {len(words)} entries but there are {n_words} vectors.")
        keep = np.fromiter((w is not None for w in words), dtype=bool, count=n_words)
        named = [w for w in words if w is not None]
        if len(set(named)) != len(named):
            seen, dups = set(), []
            for w in named:
                if w in seen:
                    dups.append(w)
                seen.add(w)
            raise ValueError(f"words must be unique; repeated: {dups[:10]!r}")
        if drop_zero:
            keep &= np.asarray(self.vectors_ != 0).any(axis=1)
        keys = [w for w, k in zip(words, keep) if k]
        dim = self.vectors_.shape[1]
        check_memory(np.dtype(dtype).itemsize * len(keys) * dim, "KeyedVectors export")
        kv = KeyedVectors(dim, count=0, dtype=dtype)
        kv.add_vectors(keys, self.vectors_[keep].astype(dtype, copy=False))
        return kv


def _nonzero_directions(s: np.ndarray, n_contexts: int) -> np.ndarray:
    """Mask of the singular values that are not numerically zero (rank tolerance)."""
    tol = (s[0] if len(s) else 0.0) * max(n_contexts, len(s)) * np.finfo(np.float64).eps
    return s > tol


def _looks_like_words(y, n_rows: int) -> bool:
    """Whether ``y`` is a sequence of ``n_rows`` distinct strings (row labels given where y goes)."""
    if y is None or isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        return False
    try:
        return (len(y) == n_rows > 1 and all(isinstance(w, str) for w in y)
                and len(set(y)) == n_rows)
    except TypeError:
        return False
