"""Directional attention ``M_dir = Q W_Q W_Kᵀ Qᵀ`` (section 5).

A symmetric S gives a symmetric M. Replacing S by a factored, non-symmetric operator
``W_Q W_Kᵀ`` (W_Q, W_K of shape (vocab_size, d_k)) lets the score from token r to token s,
``(M_dir)[r, s] = (W_Q[id_r]) · (W_K[id_s])``, differ from the reverse one.

The factors either come from the caller (e.g. a trained model's query/key maps composed with
its embedding) or from a rank-d_k truncated SVD of a *directional* PPMI matrix X, whose entry
``X[i, j]`` weighs "j follows i" (:func:`directional_factors`)::

    X ≈ U Σ Vᵀ,   W_Q = U Σ^{1/2},   W_K = V Σ^{1/2},   W_Q W_Kᵀ = U Σ Vᵀ.

:func:`factored_svd` gives the singular values of ``W_Q W_Kᵀ`` without forming the
(vocab_size, vocab_size) product.
"""

from __future__ import annotations

import numpy as np

from distattn.projection import _checks
from distattn.stats.embeddings import truncated_svd

__all__ = ["directional_factors", "directional_context_matrix", "factored_svd", "check_factors", "precomputed_svd"]


def precomputed_svd(svd, rank: int, shape: tuple[int, int], name: str = "svd"):
    """The leading ``rank`` triplets of a caller's truncated SVD ``(u, s, vt)`` of a matrix of
    ``shape`` (singular values in descending order), checked; float64 copies."""
    try:
        u, s, vt = (np.asarray(a, dtype=np.float64) for a in svd)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (u, s, vt) triple of arrays") from None
    if u.ndim != 2 or s.ndim != 1 or vt.ndim != 2 or u.shape[1] != len(s) or vt.shape[0] != len(s):
        raise ValueError(f"{name} must be (u (m, r), s (r,), vt (r, n)); got shapes {u.shape}, {s.shape}, {vt.shape}")
    if (u.shape[0], vt.shape[1]) != tuple(shape):
        raise ValueError(f"{name} factors a {u.shape[0]} x {vt.shape[1]} matrix, not the {shape[0]} x {shape[1]} one")
    if rank > len(s):
        raise ValueError(f"{name} holds {len(s)} singular triplets; rank {rank} needs more")
    if np.any(np.diff(s[:rank]) > 0) or (len(s) and s[-1] < 0):
        raise ValueError(f"{name}: singular values must be non-negative and in descending order")
    return u[:, :rank], s[:rank], vt[:rank]


def directional_factors(directional, rank: int, *, algorithm: str = "arpack",
                        random_state=0, svd=None) -> tuple[np.ndarray, np.ndarray]:
    """``(W_Q, W_K)`` from a rank-``rank`` truncated SVD of a directional matrix.

    Parameters
    ----------
    directional : sparse or array-like, shape (vocab_size, vocab_size)
        E.g. the PPMI of counts ``C[i, j] = #(j occurs within the window *after* i)``.
    rank : int, 1 <= rank < vocab_size
        d_k.
    algorithm : {"arpack", "randomized"}
        ``scipy.sparse.linalg.svds``, or the randomized SVD of :func:`distattn.stats.truncated_svd`
        (Halko et al., as scikit-learn's ``randomized_svd``).
    svd : (u, s, vt), optional
        A truncated SVD of ``directional`` already at hand, with at least ``rank`` triplets
        (values descending): its leading ``rank`` are used and nothing is factorised.

    Returns
    -------
    W_Q, W_K : ndarrays of float64, shape (vocab_size, rank)
        ``W_Q W_Kᵀ`` is the best rank-``rank`` approximation of ``directional``.
    """
    X = _checks.cooc_matrix(directional, name="directional")
    rank = _checks.positive_int(rank, "rank")
    if svd is not None:
        u, s, vt = precomputed_svd(svd, rank, X.shape)
    else:
        u, s, vt = truncated_svd(X, rank, algorithm=algorithm, random_state=random_state, name="rank")
    root = np.sqrt(s)
    return u * root, vt.T * root


def check_factors(query_factor, key_factor, vocab_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``(W_Q, W_K)``: 2-D, finite, same shape (vocab_size, d_k)."""
    W_Q = _checks.float_array(query_factor, "query_factor")
    W_K = _checks.float_array(key_factor, "key_factor")
    if W_Q.ndim != 2 or W_K.ndim != 2 or W_Q.shape != W_K.shape:
        raise ValueError(f"query_factor and key_factor must both have shape (vocab_size, d_k); "
                         f"got {W_Q.shape} and {W_K.shape}")
    if vocab_size is not None and W_Q.shape[0] != vocab_size:
        raise ValueError(f"the factors have {W_Q.shape[0]} rows but vocab_size={vocab_size}")
    _checks.finite(W_Q, "query_factor")
    _checks.finite(W_K, "key_factor")
    return W_Q, W_K


def directional_context_matrix(token_ids, query_factor, key_factor, *, unk_id: int | None = None) -> np.ndarray:
    """M_dir = Q W_Q W_Kᵀ Qᵀ = W_Q[ids] W_K[ids]ᵀ.

    Parameters
    ----------
    token_ids : array-like of int, shape (length,)
        OOV positions (negative ids or ``unk_id``) get zero rows and columns.
    query_factor, key_factor : array-like or sparse, shape (vocab_size, d_k)

    Returns
    -------
    ndarray of float64, shape (length, length); not symmetric in general.
    """
    W_Q, W_K = check_factors(query_factor, key_factor)
    ids = _checks.token_ids(token_ids, W_Q.shape[0], unk_id=unk_id)
    known = (ids >= 0)[:, None]
    q = np.where(known, W_Q[np.maximum(ids, 0)], 0.0)
    k = np.where(known, W_K[np.maximum(ids, 0)], 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        M = q @ k.T
    if not np.all(np.isfinite(M)):     # finite factors, but their products overflow: once returned as inf
        raise ValueError("M_dir = W_Q[ids] W_K[ids]ᵀ overflows float64 (scores beyond ~1.8e308); scale "
                         "query_factor and key_factor down")
    return M


def factored_svd(left, right) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SVD of ``left @ right.T`` without forming it (TransformerLens' FactoredMatrix habit).

    With thin QR factorisations ``left = Q_a R_a`` and ``right = Q_b R_b``,
    ``left rightᵀ = Q_a (R_a R_bᵀ) Q_bᵀ``, so only the small (d, d) core is decomposed.

    Parameters
    ----------
    left, right : array-like or sparse, shape (m, d) and (n, d)

    Returns
    -------
    u (m, k), s (k,), vt (k, n) with ``u @ diag(s) @ vt == left @ right.T``, k = min(m, n, d);
    s descending.
    """
    A = _checks.float_array(left, "left")
    B = _checks.float_array(right, "right")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise ValueError(f"left and right must be 2-D with the same number of columns; got {A.shape}, {B.shape}")
    _checks.finite(A, "left")                            # else LAPACK's LinAlgError
    _checks.finite(B, "right")
    qa, ra = np.linalg.qr(A)
    qb, rb = np.linalg.qr(B)
    u, s, vt = np.linalg.svd(ra @ rb.T, full_matrices=False)
    return qa @ u, s, vt @ qb.T
