"""Count-based baselines for next-token evaluation: unigram and interpolated Kneser–Ney.

Both follow the model protocol of :mod:`distattn.projection.nexttoken` (``fit`` on training
documents, then ``next_token_logits(token_ids)`` gives log-probabilities, one row per
position) and are built from ``scipy.sparse`` counts, vectorised over tokens.

Interpolated Kneser–Ney (Chen & Goodman 1999), with one absolute discount D_k per order,
estimated as ``D = n1 / (n1 + 2 n2)`` from the count-of-counts unless given::

    p1(w)      = max(N1+(•w) - D1, 0) / N1+(••) + D1 · |{w: N1+(•w) > 0}| / N1+(••) · 1/V
    p2(w | v)  = max(c(vw) - D2, 0) / c(v•) + D2 · N1+(v•) / c(v•) · p1(w)
    p3(w | uv) = max(c(uvw) - D3, 0) / c(uv•) + D3 · N1+(uv•) / c(uv•) · p2'(w | v)

where N1+(•w) counts distinct left neighbours of w in the bigrams, and in the trigram model
the middle order p2' uses continuation counts N1+(•vw) (distinct u before vw) in place of
c(vw). A context never seen in training backs off wholly to the lower order (its weight is 1).
Every row is a proper distribution over the vocabulary (the tests check it sums to 1).

Pairs and triples never cross a document boundary and never include an OOV token. At the
first predicted position of a document the trigram model has one context token and uses
p2'(w | v); an OOV context token backs off to the next lower order.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from distattn.memory import check_memory
from distattn.projection import _checks
from distattn.projection.nexttoken import unigram_prior

__all__ = ["UnigramLM", "KneserNeyLM"]


class UnigramLM:
    """Add-δ unigram model: every position predicts the same distribution.

    Parameters
    ----------
    smoothing : float >= 0, default 1.0
        δ in ``(count(w) + δ) / (N + δ V)``.
    """

    def __init__(self, smoothing: float = 1.0):
        self.smoothing = smoothing

    def fit(self, documents, vocab_size: int, *, unk_id: int | None = None) -> "UnigramLM":
        self.vocab_size_ = _checks.positive_int(vocab_size, "vocab_size")
        self.prob_ = unigram_prior(documents, self.vocab_size_, smoothing=self.smoothing, unk_id=unk_id)
        self.unk_id = unk_id          # evaluate_next_token's default: <unk> targets are skipped, as in training
        with np.errstate(divide="ignore"):
            self.log_prob_ = np.log(self.prob_)
        return self

    def next_token_logits(self, token_ids) -> np.ndarray:
        """Log-probabilities, shape (length, vocab_size) (a read-only broadcast view)."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1:      # as KneserNeyLM (shape[0] of a (1, length) batch is 1, of a scalar an IndexError)
            raise ValueError(f"token_ids must be a 1-D sequence of token ids; got shape {ids.shape}")
        return np.broadcast_to(self.log_prob_, (ids.size, self.vocab_size_))


def _discount(counts: np.ndarray, given) -> float:
    if given is not None:
        d = float(given)
        if not 0.0 < d < 1.0:
            raise ValueError(f"discount must lie in (0, 1); got {given!r}")
        return d
    n1 = np.count_nonzero(counts == 1)
    n2 = np.count_nonzero(counts == 2)
    if n1 == 0:
        return 0.75
    return float(min(max(n1 / (n1 + 2.0 * n2), 0.05), 0.95))


def _count_matrix(rows: np.ndarray, cols: np.ndarray, shape) -> sp.csr_array:
    m = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=shape)
    m.sum_duplicates()
    return m


class _Level:
    """One interpolated order: discounted counts per context row, plus back-off weights."""

    def __init__(self, counts: sp.csr_array, discount):
        self.counts = counts
        self.discount = _discount(counts.data, discount)
        totals = np.asarray(counts.sum(axis=1)).ravel()
        types = np.diff(counts.indptr)
        self.inv_total = np.where(totals > 0, 1.0 / np.where(totals > 0, totals, 1.0), 0.0)
        self.backoff = np.where(totals > 0, self.discount * types * self.inv_total, 1.0)

    def probabilities(self, rows: np.ndarray, lower: np.ndarray) -> np.ndarray:
        """p(w | context row) for each row index (-1: unseen context), given the lower-order
        distributions ``lower`` (len(rows), V)."""
        seen = rows >= 0
        r = np.where(seen, rows, 0)
        weight = np.ones(rows.size)                 # (indexing backoff at 0 fails when no context was seen in training)
        weight[seen] = self.backoff[rows[seen]]
        out = lower * weight[:, None]
        if seen.any():
            sub = self.counts[r[seen]]
            sub.data = np.maximum(sub.data - self.discount, 0.0) * np.repeat(self.inv_total[r[seen]],
                                                                                 np.diff(sub.indptr))
            out[seen] += sub.toarray()
        return out


class KneserNeyLM:
    """Interpolated Kneser–Ney bigram (``order=2``) or trigram (``order=3``) model.

    Parameters
    ----------
    order : {2, 3}
    discount : float in (0, 1) or None
        One discount for every order; None estimates ``n1 / (n1 + 2 n2)`` per order, clipped to
        [0.05, 0.95] (0.75 when an order has no singletons).

    Attributes
    ----------
    vocab_size_ : int
    discounts_ : tuple of float, lowest order first
    unk_id : int or None
        The id ``fit`` treated as OOV (``evaluate_next_token`` skips such targets by default).
    """

    def __init__(self, order: int = 3, discount: float | None = None):
        self.order = order
        self.discount = discount

    def fit(self, documents, vocab_size: int, *, unk_id: int | None = None) -> "KneserNeyLM":
        if self.order not in (2, 3):
            raise ValueError(f"order must be 2 or 3; got {self.order!r}")
        V = self.vocab_size_ = _checks.positive_int(vocab_size, "vocab_size")
        docs = _checks.documents(documents, V, unk_id=unk_id)
        self.unk_id = unk_id          # evaluate_next_token's default: <unk> targets are skipped, as in training
        ids = docs.ids.astype(np.int64)
        doc = docs.doc_index()
        same1 = (doc[1:] == doc[:-1]) & (ids[1:] >= 0) & (ids[:-1] >= 0)
        bigrams = _count_matrix(ids[:-1][same1], ids[1:][same1], (V, V))
        if self.order == 2:
            middle = bigrams
        else:
            same2 = same1[1:] & same1[:-1]
            u, v, w = ids[:-2][same2], ids[1:-1][same2], ids[2:][same2]
            ctx = u * V + v
            self.contexts_, ctx_row = np.unique(ctx, return_inverse=True)
            trigrams = _count_matrix(ctx_row.ravel(), w, (self.contexts_.size, V))
            # continuation counts N1+(•vw): distinct u per (v, w)
            tv = self.contexts_[np.repeat(np.arange(self.contexts_.size), np.diff(trigrams.indptr))] % V
            middle = _count_matrix(tv, trigrams.indices.astype(np.int64), (V, V))
            self.top_ = _Level(trigrams, self.discount)
        self.middle_ = _Level(middle, self.discount)
        # p1 from the distinct left neighbours of each word (in the bigram types)
        left = np.bincount(bigrams.indices, minlength=V).astype(np.float64)
        d1 = _discount(left[left > 0], self.discount)
        total = left.sum()
        if total == 0:
            self.unigram_ = np.full(V, 1.0 / V)
        else:
            self.unigram_ = np.maximum(left - d1, 0.0) / total + d1 * np.count_nonzero(left) / total / V
        levels = [d1, self.middle_.discount] + ([self.top_.discount] if self.order == 3 else [])
        self.discounts_ = tuple(levels)
        return self

    def _context_rows(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        key = u * self.vocab_size_ + v
        pos = np.searchsorted(self.contexts_, key).clip(max=max(self.contexts_.size - 1, 0))
        found = (u >= 0) & (v >= 0) & (self.contexts_.size > 0)
        found &= self.contexts_[pos] == key if self.contexts_.size else False
        return np.where(found, pos, -1)

    def probabilities(self, token_ids) -> np.ndarray:
        """Row t: p(· | token_ids[:t+1]), shape (length, vocab_size); rows sum to 1."""
        ids = _checks.token_ids(token_ids, self.vocab_size_, require_known=False)
        R, V = ids.size, self.vocab_size_
        check_memory(8.0 * R * V * 2, f"the n-gram distributions ({R} x {V})")
        p = self.middle_.probabilities(ids, np.broadcast_to(self.unigram_, (R, V)))
        if self.order == 3:
            prev = np.concatenate([[-1], ids[:-1]])
            p = self.top_.probabilities(self._context_rows(prev, ids), p)
        return p

    def next_token_logits(self, token_ids) -> np.ndarray:
        """Log-probabilities, shape (length, vocab_size)."""
        with np.errstate(divide="ignore"):
            return np.log(self.probabilities(token_ids))
