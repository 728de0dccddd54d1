"""Causal (prefix-only) projection: at position t, e_global of the prefix ``ids[:t+1]``.

For a prefix of R in-vocabulary tokens (OOV tokens are skipped), with attention weights
``A⁽ᵗ⁾`` computed on that prefix alone::

    e_t = (1/R) Σ_{r≤t} Σ_{s≤t} A⁽ᵗ⁾[r, s] S[id_s]  =  (1/R) Σ_{s≤t} C[t, s] S[id_s],
    C[t, s] = Σ_{r≤t} A⁽ᵗ⁾[r, s]                                   (s ≤ t)

:func:`causal_weights` builds C for the three normalisations (vectorised, O(R³) at most).

The paper's raw form (``A = M``) also has an incremental form that the fast kernel
:func:`causal_scores` uses. With ``h_t`` the prefix's token histogram and ``g_t = h_t S``
(``g_t[v] = Σ_{r≤t} S[id_r, v]``)::

    F_t = Σ_{r,s≤t} M[r, s] S[id_s] = Σ_v h_t[v] g_t[v] S[v],   e_t = F_t / R
    F_t - F_{t-1} = Σ_v (h_{t-1}[v] S[i, v]) S[v] + g_t[i] S[i]      (i = id_t)

so each step adds the rows of S for the prefix types that co-occur with the new token: a
running sum, never a dense vocab×vocab product. The kernel then scores the position in
place (log-sum-exp over the vocabulary, rank of the target) without materialising the
logits of a whole document.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp

from distattn.projection import _checks
from distattn.projection._scoring import FASTMATH, score_row
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES

__all__ = ["causal_weights", "causal_logits", "causal_scores"]


def causal_weights(M: np.ndarray, normalization: str = "none", *, zero_rows: str = "uniform",
                   attention_temperature: float = 1.0) -> np.ndarray:
    """C (R, R), lower-triangular: ``C[t, s] = Σ_{r≤t} A⁽ᵗ⁾[r, s]`` for the prefix ``:t+1``.

    ``A⁽ᵗ⁾`` normalises M restricted to the prefix: ``"none"`` keeps M, ``"row"`` divides
    by the prefix row sums ``Σ_{s≤t} M[r, s]`` (zero rows follow ``zero_rows``, with
    "uniform" meaning uniform over the prefix), ``"softmax"`` uses the prefix
    log-sum-exp ``logcumsumexp(M/τ)`` (stable for raw counts).

    Parameters
    ----------
    M : ndarray, shape (R, R)
        The context matrix of the in-vocabulary tokens of a document.
    """
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    M = np.asarray(M, dtype=np.float64)
    R = M.shape[0]
    lower = np.tril(np.ones((R, R), dtype=bool))
    if normalization == "none":
        return np.where(lower, np.cumsum(M, axis=0), 0.0)
    if normalization == "row":
        if M.size and M.min() < 0:
            raise ValueError(f"normalization='row' needs non-negative weights; the minimum is {M.min()!r}")
        prefix_sums = np.cumsum(M, axis=1).T          # [t, r] = Σ_{s≤t} M[r, s]
        zero = (prefix_sums == 0) & lower             # rows r ≤ t with nothing to normalise
        W = np.where(lower & ~zero, 1.0 / np.where(prefix_sums == 0, 1.0, prefix_sums), 0.0)
        C = W @ M
        if zero_rows == "uniform":
            C += (zero.sum(axis=1) / np.arange(1, R + 1))[:, None]
        elif zero_rows == "self":
            C += zero
        return np.where(lower, C, 0.0)
    tau = _checks.positive_float(attention_temperature, "attention_temperature")
    X = M / tau
    log_z = np.logaddexp.accumulate(X, axis=1).T      # [t, r] = log Σ_{s≤t} exp(X[r, s])
    C = np.zeros((R, R))
    block = max(1, (1 << 22) // max(R * R, 1))
    for start in range(0, R, block):                  # loop over blocks of prefixes, not tokens
        t = np.arange(start, min(R, start + block))
        A = np.exp(np.minimum(X[None, :, :] - log_z[t][:, :, None], 0.0))   # (t, r, s)
        A *= (np.arange(R)[None, :, None] <= t[:, None, None]) & (np.arange(R)[None, None, :] <= t[:, None, None])
        C[t] = A.sum(axis=1)
    return C


def causal_logits(known_ids: np.ndarray, S: sp.csr_array, C: np.ndarray) -> np.ndarray:
    """``e_t = (1/(t+1)) Σ_s C[t, s] S[id_s]`` for every prefix, shape (R, vocab_size)."""
    R = known_ids.size
    profiles = S[known_ids]
    return np.asarray(C @ profiles) / np.arange(1, R + 1)[:, None]


@nb.njit(fastmath=FASTMATH, parallel=True, cache=True)
def _causal_kernel(ids, offsets, indptr, indices, data, scale, prior, prior_weight, out_logp, out_rank):
    V = indptr.size - 1
    n_docs = offsets.size - 1
    for d in nb.prange(n_docs):
        start, stop = offsets[d], offsets[d + 1]
        if stop - start < 2:
            continue
        F = np.zeros(V)
        g = np.zeros(V)
        h = np.zeros(V, np.int32)
        work = np.empty(V, np.float32)
        bits = np.empty(V, np.int32)
        n_known = 0
        for t in range(start, stop):
            i = ids[t]
            if i >= 0:
                lo, hi = indptr[i], indptr[i + 1]
                for p in range(lo, hi):
                    g[indices[p]] += data[p]
                for p in range(lo, hi):
                    v = indices[p]
                    if h[v] > 0:
                        w = h[v] * data[p]
                        for q in range(indptr[v], indptr[v + 1]):
                            F[indices[q]] += w * data[q]
                w = g[i]
                for q in range(lo, hi):
                    F[indices[q]] += w * data[q]
                h[i] += 1
                n_known += 1
            if t + 1 < stop and ids[t + 1] >= 0:
                s = scale / n_known if n_known > 0 else scale
                lp, rk = score_row(F, s, ids[t + 1], prior, prior_weight, work, bits)
                out_logp[t] = lp
                out_rank[t] = rk


def causal_scores(docs, S: sp.csr_array, *, temperature: float = 1.0, prior: np.ndarray | None = None,
                  prior_weight: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Score every next-token prediction of the raw causal projection (``A = M``).

    Parameters
    ----------
    docs : RaggedIds
        Validated documents (OOV = -1).
    S : csr_array, shape (vocab_size, vocab_size), canonical
    temperature : float > 0
        ``p_t = softmax(e_t / temperature)``.
    prior, prior_weight
        Optional mixture ``(1 - w) p_t + w prior`` (prior: probabilities, shape (vocab_size,)).

    Returns
    -------
    logp : ndarray of float64, shape (n_tokens,)
        ``logp[t]`` = log-probability of token ``t+1`` given its document's prefix up to
        ``t``; NaN where there is no in-vocabulary next token in the same document.
    rank : ndarray of int64, shape (n_tokens,)
        Other tokens scoring at least as high as the target; -1 where logp is NaN.
    """
    n = docs.n_tokens
    out_logp = np.full(n, np.nan)
    out_rank = np.full(n, -1, dtype=np.int64)
    prior_arr = np.zeros(0, np.float32) if prior is None else np.ascontiguousarray(prior, dtype=np.float32)
    # The kernel streams ~1e5 stored entries of S per position on a realistic PPMI and is
    # bound by memory traffic: 2-byte column indices (when they fit) make it ~1.3x faster.
    indices = S.indices.astype(np.uint16) if S.shape[1] <= 1 << 16 else S.indices
    _causal_kernel(np.ascontiguousarray(docs.ids, dtype=np.int32), np.ascontiguousarray(docs.offsets),
                   S.indptr, indices, S.data, 1.0 / temperature, prior_arr, float(prior_weight),
                   out_logp, out_rank)
    return out_logp, out_rank
