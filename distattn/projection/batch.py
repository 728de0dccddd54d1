"""The projection over many sequences at once, vectorised across documents (numpy/scipy).

Documents come in as a flat id array plus offsets (:class:`~distattn.corpus.ragged.RaggedIds`,
an ``(ids, offsets)`` pair, or a list of id arrays); results come out padded to the longest
document: ``M`` as a dense (n_docs, length, length) array, ``e_global`` as a dense
(n_docs, vocab_size) array. Padding and OOV positions are zero in M.

The entries ``S[id_r, id_s]`` of every document are looked up in one vectorised binary
search over the sorted CSR keys ``row * vocab_size + col``; no per-token Python loop, and
no vocab×vocab product.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from distattn.memory import check_memory
from distattn.projection import _checks
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES

__all__ = ["context_matrices", "global_evidences", "masked_attention"]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each pair, vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out_starts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(np.asarray(starts, np.int64) - out_starts,
                                                                      lengths)


def sorted_keys(S: sp.csr_array) -> np.ndarray:
    """``row * n_cols + col`` of every stored entry, ascending (S must be canonical CSR)."""
    rows = np.repeat(np.arange(S.shape[0], dtype=np.int64), np.diff(S.indptr))
    return rows * S.shape[1] + S.indices


def lookup(S: sp.csr_array, keys: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``S[rows[i], cols[i]]`` for every i (0 where nothing is stored)."""
    query = rows.astype(np.int64) * S.shape[1] + cols
    pos = np.searchsorted(keys, query)
    pos = np.minimum(pos, max(keys.size - 1, 0))
    found = keys[pos] == query if keys.size else np.zeros(query.shape, dtype=bool)
    return np.where(found, S.data[pos] if keys.size else 0.0, 0.0)


def _layout(docs, max_length):
    lengths = docs.lengths
    if max_length is not None:
        max_length = _checks.positive_int(max_length, "max_length")
        docs = docs.truncate(max_length)
        lengths = docs.lengths
    L = int(lengths.max()) if lengths.size else 0
    tok_doc = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    tok_pos = np.arange(docs.n_tokens, dtype=np.int64) - np.repeat(docs.offsets[:-1], lengths)
    return docs, lengths, L, tok_doc, tok_pos


def _padded_context(S, keys, docs, lengths, L, tok_doc, tok_pos) -> np.ndarray:
    n = len(lengths)
    check_memory(8.0 * n * L * L, f"the padded context matrices ({n} x {L} x {L})")
    per_token = lengths[tok_doc]
    a = np.repeat(np.arange(docs.n_tokens, dtype=np.int64), per_token)
    b = _ranges(docs.offsets[tok_doc], per_token)
    ia, ib = docs.ids[a], docs.ids[b]
    ok = (ia >= 0) & (ib >= 0)
    a, b = a[ok], b[ok]
    out = np.zeros((n, L, L))
    out[tok_doc[a], tok_pos[a], tok_pos[b]] = lookup(S, keys, docs.ids[a], docs.ids[b])
    return out


def context_matrices(documents, cooc, *, unk_id: int | None = None, max_length: int | None = None):
    """M = Q S Qᵀ of every document, zero-padded.

    Parameters
    ----------
    documents : RaggedIds, (ids, offsets) or list of int arrays
        Ids ``< 0`` or equal to ``unk_id`` are OOV (zero rows and columns).
    cooc : sparse matrix or array-like, shape (vocab_size, vocab_size)
    max_length : int, optional
        Truncate documents to their first ``max_length`` tokens.

    Returns
    -------
    M : ndarray of float64, shape (n_docs, length, length)
        ``M[d, r, s] = S[id_{d,r}, id_{d,s}]``; zero beyond each document's length.
    lengths : ndarray of int64, shape (n_docs,)
    """
    S = _checks.cooc_matrix(cooc)
    docs = _checks.documents(documents, S.shape[0], unk_id=unk_id)
    docs, lengths, L, tok_doc, tok_pos = _layout(docs, max_length)
    return _padded_context(S, sorted_keys(S), docs, lengths, L, tok_doc, tok_pos), lengths


def masked_attention(M: np.ndarray, known: np.ndarray, normalization: str = "none", *,
                     zero_rows: str = "uniform", attention_temperature: float = 1.0) -> np.ndarray:
    """A from padded M (n, L, L), normalising each row over the ``known`` columns only.

    ``known`` (n, L) marks in-vocabulary, non-padding positions; A is zero elsewhere. The
    policies are those of :func:`~distattn.projection.core.row_normalize`, with "uniform"
    meaning uniform over the known positions.
    """
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    M = _checks.float_array(M, "M")
    known = np.asarray(known)
    if M.ndim != 3 or M.shape[1] != M.shape[2]:
        raise ValueError(f"M must have shape (n_docs, length, length); got {M.shape}")
    if known.shape != M.shape[:2] or not (known.dtype == bool or np.isin(known, (0, 1)).all()):
        raise ValueError(f"known must be a boolean mask of shape (n_docs, length) = {M.shape[:2]}; got dtype "
                         f"{known.dtype}, shape {known.shape}")
    known = known.astype(bool, copy=False)
    _checks.finite(M, "M")
    pair = known[:, :, None] & known[:, None, :]
    if normalization == "none":
        return np.where(pair, M, 0.0)
    if normalization == "softmax":
        tau = _checks.positive_float(attention_temperature, "attention_temperature")
        x = np.where(pair, M, -np.inf)
        top = np.max(x, axis=-1, keepdims=True)
        with np.errstate(over="ignore"):    # the max first: M / τ overflowed to inf (NaN rows) for a tiny τ or huge M
            x = np.where(pair, np.exp(np.where(pair, (x - np.where(np.isfinite(top), top, 0.0)) / tau, 0.0)), 0.0)
        sums = x.sum(axis=-1, keepdims=True)
        return x / np.where(sums == 0, 1.0, sums)
    W = np.where(pair, M, 0.0)
    _checks.non_negative(W)
    sums = W.sum(axis=-1, keepdims=True)
    A = W / np.where(sums == 0, 1.0, sums)
    zero = (sums[..., 0] == 0) & known
    if zero_rows == "uniform":
        n_known = known.sum(axis=1)
        A += np.where(zero[:, :, None] & known[:, None, :], 1.0 / np.maximum(n_known, 1)[:, None, None], 0.0)
    elif zero_rows == "self":
        A += zero[:, :, None] * np.eye(M.shape[-1])[None]
    return A


def global_evidences(documents, cooc, *, normalization: str = "none", zero_rows: str = "uniform",
                     attention_temperature: float = 1.0, unk_id: int | None = None,
                     max_length: int | None = None, chunk_pairs: int = 1 << 22) -> np.ndarray:
    """e_global of every document: the mean over its in-vocabulary positions of E = A (QS).

    ``e_global[d] = Σ_s w[d, s] S[id_{d,s}]`` with ``w[d, s] = (1/R_d) Σ_r A[d, r, s]``: one
    sparse (n_docs × vocab_size) @ S product per chunk of documents. A document without an
    in-vocabulary token gets a zero row.

    Returns
    -------
    ndarray of float64, shape (n_docs, vocab_size)
    """
    S = _checks.cooc_matrix(cooc)
    V = S.shape[0]
    docs = _checks.documents(documents, V, unk_id=unk_id)
    if max_length is not None:
        docs = docs.truncate(_checks.positive_int(max_length, "max_length"))
    chunk_pairs = _checks.positive_int(chunk_pairs, "chunk_pairs")
    n = len(docs)
    check_memory(8.0 * n * V, f"the dense global evidence ({n} x {V})")
    keys = sorted_keys(S)
    out = np.zeros((n, V))
    for chunk in _chunks_by_padded_size(docs.lengths, chunk_pairs):
        sub, sub_len, L, tok_doc, tok_pos = _layout(docs.take(chunk), None)
        if L == 0:
            continue
        M = _padded_context(S, keys, sub, sub_len, L, tok_doc, tok_pos)
        known = np.zeros((chunk.size, L), dtype=bool)
        known[tok_doc, tok_pos] = sub.ids >= 0
        A = masked_attention(M, known, normalization, zero_rows=zero_rows,
                             attention_temperature=attention_temperature)
        w = A.sum(axis=1) / np.maximum(known.sum(axis=1), 1)[:, None]          # (docs, L)
        ok = known[tok_doc, tok_pos]
        W = sp.csr_array((w[tok_doc, tok_pos][ok], (tok_doc[ok], sub.ids[ok].astype(np.int64))),
                         shape=(chunk.size, V))
        out[chunk] = (W @ S).toarray()
    return out


def _chunks_by_padded_size(lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    """Document indices grouped so that each group's padded (count × longest²) size stays
    within ``budget`` (a single document may exceed it). Documents are grouped by length,
    so padding wastes little."""
    order = np.argsort(lengths, kind="stable")
    sq = lengths[order].astype(np.int64) ** 2
    chunks, start = [], 0
    while start < order.size:
        padded = np.arange(1, order.size - start + 1) * sq[start:]   # lengths ascend: last is longest
        stop = start + max(1, int(np.searchsorted(padded, budget, side="right")))
        chunks.append(order[start:stop])
        start = stop
    return chunks
