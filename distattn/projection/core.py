"""The symmetric projection of sections 2-3: Q, M = Q S Qᵀ, Norm(M), QS, E = M(QS), e_global.

Notation (``shared/design.md``): a sequence of ``length`` tokens over a vocabulary of
``vocab_size`` words; ``S`` (``cooc``) is the (vocab_size, vocab_size) co-occurrence or PPMI
operator.

=================  ==========================  ============================================
paper              function                    shape
=================  ==========================  ============================================
Q                  :func:`selector`            (length, vocab_size), sparse one-hot
M = Q S Qᵀ         :func:`context_matrix`      (length, length), ``M[r, s] = S[id_r, id_s]``
Norm(M)            :func:`row_normalize`       (length, length), rows sum to 1
softmax(M/τ)       :func:`softmax_rows`        (length, length)
QS                 :func:`association_profiles` (length, vocab_size), sparse rows of S
E = A (QS)         :func:`vocabulary_evidence` (length, vocab_size), dense
e_global           :func:`global_evidence`     (vocab_size,), mean of E's rows
softmax(e/τ)       :func:`next_token_distribution` (vocab_size,)
=================  ==========================  ============================================

``A`` is the attention used to mix the profiles: the raw ``M`` (``normalization="none"``,
the paper's sections 3.1-3.2), ``Norm(M)`` (``"row"``) or ``softmax(M / τ_att)``
(``"softmax"``).

Out-of-vocabulary tokens (negative ids, or ``unk_id``) keep their position but are invisible
to the projection: their row of Q is zero, so their row and column of M and their rows of A,
QS and E are zero, and e_global averages over the in-vocabulary positions only. A sequence
with no in-vocabulary token is an error.

Nothing here forms a dense vocab×vocab product: M is gathered from S (``S[ids][:, ids]``),
QS is a row gather, and e_global is one sparse vector-matrix product.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp

from distattn.memory import check_memory
from distattn.projection import _checks

__all__ = [
    "NORMALIZATIONS", "ZERO_ROW_POLICIES", "selector", "context_matrix", "row_normalize", "softmax_rows",
    "scaled_softmax", "attention_weights", "association_profiles", "vocabulary_evidence", "global_evidence",
    "log_softmax", "next_token_distribution",
]

NORMALIZATIONS = ("none", "row", "softmax")
"""How M becomes the attention A that mixes association profiles."""

ZERO_ROW_POLICIES = ("uniform", "zero", "self")
"""What :func:`row_normalize` puts in a row of M that sums to zero."""


# --------------------------------------------------------------------------- selector, M

def selector(token_ids, vocab_size: int, *, unk_id: int | None = None) -> sp.csr_array:
    """The one-hot selector Q of a sequence.

    ``Q[r, v] = 1`` if the token at position ``r`` is ``v``; an OOV position has a zero row.

    Parameters
    ----------
    token_ids : array-like of int, shape (length,)
        Ids in ``[0, vocab_size)``; negative ids (and ``unk_id``) mark OOV tokens.
    vocab_size : int

    Returns
    -------
    scipy.sparse.csr_array of float64, shape (length, vocab_size)
    """
    vocab_size = _checks.positive_int(vocab_size, "vocab_size")
    ids = _checks.token_ids(token_ids, vocab_size, unk_id=unk_id)
    known = np.flatnonzero(ids >= 0)
    return sp.csr_array((np.ones(known.size), (known, ids[known])), shape=(ids.size, vocab_size))


def _gather(S: sp.csr_array, ids: np.ndarray, col_ids: np.ndarray | None = None) -> np.ndarray:
    """``S[ids][:, col_ids]`` densified (``col_ids`` defaults to ``ids``), with zero rows and
    columns at OOV positions (``ids < 0``)."""
    col_ids = ids if col_ids is None else col_ids
    rows, cols = np.flatnonzero(ids >= 0), np.flatnonzero(col_ids >= 0)
    out = np.zeros((ids.size, col_ids.size))
    if rows.size and cols.size:
        out[np.ix_(rows, cols)] = S[ids[rows]][:, col_ids[cols]].toarray()
    return out


def context_matrix(token_ids, cooc, *, unk_id: int | None = None) -> np.ndarray:
    """M = Q S Qᵀ, the contextual weights among the tokens of a sequence.

    ``M[r, s] = S[id_r, id_s]`` (a gather; no product is formed).

    Parameters
    ----------
    token_ids : array-like of int, shape (length,)
    cooc : sparse matrix or array-like, shape (vocab_size, vocab_size)
        The co-occurrence operator S.

    Returns
    -------
    ndarray of float64, shape (length, length)
        Symmetric when S is.
    """
    S = _checks.cooc_matrix(cooc)
    return _gather(S, _checks.token_ids(token_ids, S.shape[0], unk_id=unk_id))


# --------------------------------------------------------------------------- attention

def row_normalize(weights, *, zero_rows: str = "uniform") -> np.ndarray:
    """Norm(M): each row divided by its sum, ``Norm(M)[r, s] = M[r, s] / Σ_t M[r, t]``.

    Parameters
    ----------
    weights : array-like or sparse, shape (..., rows, cols)
        Non-negative scores (raw counts or PPMI). Rows are normalised along the last axis.
    zero_rows : {"uniform", "zero", "self"}, default "uniform"
        A row that sums to zero (a token with no co-occurrence inside the sequence, e.g. any
        length-1 sequence) becomes

        * ``"uniform"``: ``1 / cols`` everywhere, what ``softmax`` of an all-zero row gives,
          so every row is a probability distribution (the default);
        * ``"self"``: a one on the diagonal (the token keeps its own profile; needs square
          rows × cols);
        * ``"zero"``: left at zero (the row then sums to 0, not 1).

        No policy ever produces NaN.

    Returns
    -------
    ndarray of float64, same shape as ``weights``

    Raises
    ------
    ValueError
        For negative entries (signed scores have no row-sum normalisation; use
        :func:`softmax_rows`), non-finite entries, or an unknown ``zero_rows``.
    """
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    _checks.real(weights, "weights")
    if sp.issparse(weights):      # the result is dense: e.g. a whole vocab x vocab S would be
        check_memory(16.0 * np.prod(weights.shape), f"row_normalize of a sparse {weights.shape} matrix (dense result)")
    W = weights.toarray() if sp.issparse(weights) else np.array(weights, dtype=np.float64)
    W = W.astype(np.float64, copy=False)
    if W.ndim < 2:
        raise ValueError(f"weights must be at least 2-D (rows, cols); got shape {W.shape}")
    _checks.finite(W, "weights")
    _checks.non_negative(W, "row_normalize", "Use softmax_rows for signed scores")
    if zero_rows == "self" and W.shape[-1] != W.shape[-2]:
        raise ValueError(f"zero_rows='self' needs square matrices; got shape {W.shape}")
    with np.errstate(over="ignore"):
        sums = W.sum(axis=-1, keepdims=True)
    big = np.isinf(sums)        # finite entries whose sum overflows: W / inf once gave a row of zeros
    if big.any():
        W = np.where(big, W / np.where(big, W.max(axis=-1, keepdims=True), 1.0), W)
        sums = W.sum(axis=-1, keepdims=True)
    zero = sums[..., 0] == 0
    out = W / np.where(sums == 0, 1.0, sums)
    if zero.any():
        if zero_rows == "uniform":
            out[zero] = 1.0 / W.shape[-1]
        elif zero_rows == "self":
            eye = np.broadcast_to(np.eye(W.shape[-1], dtype=bool), W.shape)
            out[eye & zero[..., None]] = 1.0
    return out


def softmax_rows(scores, *, temperature: float = 1.0) -> np.ndarray:
    """Row-wise ``softmax(scores / temperature)`` along the last axis, computed stably.

    Parameters
    ----------
    scores : array-like or sparse, shape (..., cols)
    temperature : float > 0

    Returns
    -------
    ndarray of float64, same shape; each row sums to 1.
    """
    temperature = _checks.positive_float(temperature, "temperature")
    _checks.real(scores, "scores")
    if sp.issparse(scores):
        check_memory(16.0 * np.prod(scores.shape), f"softmax_rows of a sparse {scores.shape} matrix (dense result)")
    x = scores.toarray().astype(np.float64, copy=False) if sp.issparse(scores) else np.asarray(scores, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"scores must have shape (..., cols) with at least one column; got shape {x.shape}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("scores contain NaN or +inf (-inf is allowed: it marks a masked entry)")
    top = x.max(axis=-1, keepdims=True)
    if np.isneginf(top).any():
        raise ValueError("a row of scores is all -inf: it has no softmax (mask fewer entries)")
    with np.errstate(over="ignore"):    # (x - max) / τ may go to -inf: exp gives the 0 it stands for
        x = x - top
        x /= temperature    # after the shift: x / τ overflowed to inf (NaN rows) for a tiny τ or huge scores
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def scaled_softmax(scores, d_k: int) -> np.ndarray:
    """The Transformer's ``softmax(scores / √d_k)`` (section 6)."""
    d_k = _checks.positive_int(d_k, "d_k")
    return softmax_rows(scores, temperature=float(np.sqrt(d_k)))


def attention_weights(M: np.ndarray, normalization: str = "none", *, zero_rows: str = "uniform",
                      attention_temperature: float = 1.0, known: np.ndarray | None = None) -> np.ndarray:
    """A from M: ``"none"`` -> M, ``"row"`` -> Norm(M), ``"softmax"`` -> softmax(M / τ_att).

    Parameters
    ----------
    M : array-like or sparse, shape (length, length)
    known : bool ndarray, shape (length,), optional
        In-vocabulary positions. Rows and columns outside it are zero in A, and the row
        normalisations run over the known columns only.
    """
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)    # unused unless "row", but a typo is still one
    M = _checks.float_array(M, "M")
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"M must be square (length, length); got shape {M.shape}")
    _checks.finite(M, "M")
    known = _checks.known_mask(known, M.shape[0])
    if normalization == "softmax":      # named here: softmax_rows would call it "temperature"
        attention_temperature = _checks.positive_float(attention_temperature, "attention_temperature")
    if normalization == "none":
        # a copy: a float64 M comes back from float_array as the caller's own array, and editing A
        # must not edit it (it did; a float32 M was already copied)
        return M.copy() if known is None else M * (known[:, None] & known[None, :])
    if known is None:
        if normalization == "row":
            _checks.non_negative(M)     # row_normalize's own hint, softmax_rows, is no option of this caller
            return row_normalize(M, zero_rows=zero_rows)
        return softmax_rows(M, temperature=attention_temperature)
    idx = np.flatnonzero(known)
    out = np.zeros_like(M)
    if idx.size == 0:                  # no known position: nothing to normalise (the softmax of no column failed)
        return out
    out[np.ix_(idx, idx)] = attention_weights(M[np.ix_(idx, idx)], normalization, zero_rows=zero_rows,
                                              attention_temperature=attention_temperature)
    return out


# --------------------------------------------------------------------------- QS, E, e_global

def _profiles(S: sp.csr_array, ids: np.ndarray) -> sp.csr_array:
    """Rows ``S[ids]`` as a (length, vocab_size) csr_array, empty rows at OOV positions."""
    known = ids >= 0
    rows = S[ids[known]]
    counts = np.zeros(ids.size, dtype=np.int64)
    counts[known] = np.diff(rows.indptr)
    indptr = np.zeros(ids.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_array((rows.data, rows.indices, indptr), shape=(ids.size, S.shape[1]))


def association_profiles(token_ids, cooc, *, unk_id: int | None = None) -> sp.csr_array:
    """QS: row ``r`` is the association profile ``S[id_r, :]`` of the token at position ``r``.

    Returns
    -------
    scipy.sparse.csr_array of float64, shape (length, vocab_size)
    """
    S = _checks.cooc_matrix(cooc)
    return _profiles(S, _checks.token_ids(token_ids, S.shape[0], unk_id=unk_id))


def _attention_for(S, ids, normalization, zero_rows, attention_temperature, weights):
    known = ids >= 0
    if weights is None:
        return attention_weights(_gather(S, ids), normalization, zero_rows=zero_rows,
                                 attention_temperature=attention_temperature, known=known)
    _checks.choice(normalization, "normalization", NORMALIZATIONS)   # unused with weights, but a typo is still one
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    _checks.real(weights, "weights")
    A = weights if sp.issparse(weights) else np.asarray(weights, dtype=np.float64)
    if A.shape != (ids.size, ids.size):
        raise ValueError(f"weights must have shape (length, length) = {(ids.size, ids.size)}; got {A.shape}")
    A = A.toarray().astype(np.float64, copy=False) if sp.issparse(A) else A
    _checks.finite(A, "weights")
    if not known.all():     # an OOV token's row of A is zero, as with the library's own A (given rows once leaked into E)
        A = A * known[:, None]
    return A


def vocabulary_evidence(token_ids, cooc, *, normalization: str = "none", zero_rows: str = "uniform",
                        attention_temperature: float = 1.0, weights=None,
                        unk_id: int | None = None) -> np.ndarray:
    """E = A (QS): ``E[r, j] = Σ_s A[r, s] S[id_s, j]``, each token's context-weighted evidence.

    Parameters
    ----------
    token_ids : array-like of int, shape (length,)
    cooc : sparse matrix or array-like, shape (vocab_size, vocab_size)
    normalization : {"none", "row", "softmax"}, default "none"
        A = M (the paper), Norm(M), or softmax(M / attention_temperature).
    zero_rows : {"uniform", "zero", "self"}, default "uniform"
        What Norm(M) does with a row of zeros (see :func:`row_normalize`).
    attention_temperature : float > 0, default 1.0
        τ_att of ``normalization="softmax"``.
    weights : array-like, shape (length, length), optional
        Use these as A instead (e.g. an asymmetric ``M_dir`` or a multi-head combination).
    unk_id : int, optional
        An id treated as out of vocabulary, besides negative ids.

    Returns
    -------
    ndarray of float64, shape (length, vocab_size)
    """
    S = _checks.cooc_matrix(cooc)
    ids = _checks.token_ids(token_ids, S.shape[0], unk_id=unk_id)
    check_memory(8.0 * ids.size * S.shape[1], f"the dense evidence E ({ids.size} x {S.shape[1]})")
    A = _attention_for(S, ids, normalization, zero_rows, attention_temperature, weights)
    return np.asarray(A @ _profiles(S, ids))


def _global_evidence(S, ids, A) -> np.ndarray:
    known = ids >= 0
    w = A[known].sum(axis=0) / known.sum()
    return np.asarray(_profiles(S, ids).T @ w)


def global_evidence(token_ids, cooc, *, normalization: str = "none", zero_rows: str = "uniform",
                    attention_temperature: float = 1.0, weights=None, unk_id: int | None = None) -> np.ndarray:
    """e_global = (1/R) Σ_r E[r], the mean of E's rows over the R in-vocabulary positions.

    Computed without E: ``e_global = ((1/R) Σ_r A[r, :]) (QS)``, one sparse vector-matrix
    product. Arguments as in :func:`vocabulary_evidence`.

    Returns
    -------
    ndarray of float64, shape (vocab_size,)
    """
    S = _checks.cooc_matrix(cooc)
    ids = _checks.token_ids(token_ids, S.shape[0], unk_id=unk_id)
    A = _attention_for(S, ids, normalization, zero_rows, attention_temperature, weights)
    return _global_evidence(S, ids, A)


def log_softmax(logits, *, temperature: float = 1.0, axis: int = -1) -> np.ndarray:
    """``log softmax(logits / temperature)`` via log-sum-exp: finite for any finite logits
    (raw-count evidence of 1e4 and more does not overflow)."""
    temperature = _checks.positive_float(temperature, "temperature")
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim < 1:          # a 0-d array once came back as shape (1,)
        raise ValueError(f"logits must have at least one axis, (..., vocab); got shape {x.shape}")
    if np.isnan(x).any() or np.isposinf(x).any():     # once NaN log-probabilities, inf - inf
        raise ValueError("logits contain NaN or +inf (-inf is allowed: it marks a masked entry)")
    # shifted by the max before dividing: logits / τ overflowed to inf (NaN) for a tiny τ or huge logits
    top = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    with np.errstate(over="ignore"):
        x = (x - np.where(np.isfinite(top), top, 0.0)) / temperature
    return x - logsumexp(x, axis=axis, keepdims=True)


def next_token_distribution(token_ids, cooc, *, temperature: float = 1.0, normalization: str = "none",
                            zero_rows: str = "uniform", attention_temperature: float = 1.0, weights=None,
                            unk_id: int | None = None, log: bool = False) -> np.ndarray:
    """p(w | context) = softmax(e_global / temperature) over the vocabulary (section 3.1).

    Parameters
    ----------
    token_ids, cooc, normalization, zero_rows, attention_temperature, weights, unk_id
        As in :func:`vocabulary_evidence`.
    temperature : float > 0, default 1.0
        τ of the output softmax (the paper uses 1).
    log : bool, default False
        Return log-probabilities instead.

    Returns
    -------
    ndarray of float64, shape (vocab_size,), summing to 1 (or log-probabilities).
    """
    e = global_evidence(token_ids, cooc, normalization=normalization, zero_rows=zero_rows,
                        attention_temperature=attention_temperature, weights=weights, unk_id=unk_id)
    if not np.isfinite(e).all():     # finite S whose products overflow: once NaN probabilities
        raise ValueError("the evidence e_global overflows float64 (S's entries are too large for "
                         f"normalization={normalization!r}); scale cooc down, or use normalization='row' or 'softmax'")
    logp = log_softmax(e, temperature=temperature)
    return logp if log else np.exp(logp)
