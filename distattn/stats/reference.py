"""Slow, obviously correct reference implementations, for tests and benchmarks only.

:func:`reference_cooccurrence` is a line-by-line transcription of the counting loop of
Stanford GloVe's ``cooccur.c``: for each in-vocabulary target word ``w2`` at position ``j``,
walk back over the previous ``window`` in-vocabulary words ``w1`` (``oov="drop"``) and add
``weight(j - k)`` to ``(w1, w2)``, and to ``(w2, w1)`` when symmetric.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp


def reference_cooccurrence(docs: Iterable[Sequence[int]], vocab_size: int, window: int,
                           weighting: str = "none", symmetric: bool = True, oov: str = "drop",
                           offset: int | None = None) -> sp.csr_array:
    """Pure-Python counts. ``offset``: count only pairs at exactly this distance."""
    counts: dict = defaultdict(float)
    for doc in docs:
        toks = [int(t) for t in doc]
        if oov == "drop":
            toks = [t for t in toks if t >= 0]
        for j, w2 in enumerate(toks):
            if w2 < 0:
                continue
            for k in range(max(0, j - window), j):
                w1 = toks[k]
                if w1 < 0 or (offset is not None and j - k != offset):
                    continue
                val = 1.0 / (j - k) if weighting == "harmonic" else 1.0
                counts[(w1, w2)] += val
                if symmetric:
                    counts[(w2, w1)] += val
    if not counts:
        return sp.csr_array((vocab_size, vocab_size), dtype=np.float64)
    keys = np.array(list(counts.keys()), dtype=np.int64)
    vals = np.array(list(counts.values()), dtype=np.float64)
    return sp.csr_array((vals, (keys[:, 0], keys[:, 1])), shape=(vocab_size, vocab_size))


def coo_cooccurrence(docs, vocab_size: int, window: int, weighting: str = "none",
                     symmetric: bool = True) -> sp.csr_array:
    """A simple vectorised reference: one (row, col, weight) triple per in-window pair, summed
    by scipy's COO -> CSR conversion. ``docs``: RaggedIds with OOV already dropped."""
    ids = docs.ids.astype(np.int64)
    doc = docs.doc_index()
    total = sp.csr_array((vocab_size, vocab_size), dtype=np.float64)
    for d in range(1, window + 1):
        same = (doc[d:] == doc[:-d]) & (ids[d:] >= 0) & (ids[:-d] >= 0)
        left, right = ids[:-d][same], ids[d:][same]
        w = np.full(len(left), 1.0 / d if weighting == "harmonic" else 1.0)
        rows, cols = (np.concatenate([left, right]), np.concatenate([right, left])) if symmetric else (left, right)
        vals = np.concatenate([w, w]) if symmetric else w
        total = total + sp.coo_array((vals, (rows, cols)), shape=(vocab_size, vocab_size)).tocsr()
    return total
