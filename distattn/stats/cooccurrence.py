"""Windowed co-occurrence counts as ``scipy.sparse.csr_array``.

Conventions (those of Stanford GloVe's ``cooccur``):

* ``directional[i, j]`` = (weighted) number of times word ``j`` occurs ``d`` positions after
  word ``i``, ``1 <= d <= window``; its transpose counts "``j`` before ``i``".
* ``symmetric`` = ``directional + directional.T``; a word near itself adds to the diagonal
  from both sides (GloVe's ``-symmetric 1``).
* ``weighting="harmonic"`` weights a pair at distance ``d`` by ``1/d``
  (GloVe's ``-distance-weighting 1``); ``"none"`` counts 1.
* ``oov="drop"`` removes out-of-vocabulary tokens before windowing, so distances count only
  in-vocabulary tokens (GloVe); ``oov="gap"`` keeps their places (hyperwords).
* Documents are boundaries: no window crosses one.

Exactness: harmonic weights are accumulated as the int64 integers ``L/d`` with
``L = lcm(1..window)`` and divided by ``L`` once at the end, so every sum is exact and the matrix
does not depend on the order of summation: chunked, threaded and Dask runs give identical bits.
(Float64 sums of ``L/d`` were exact only below 2**53, which an entry of about 3.9e7 passes
at window 19-22.) For ``window > 22``, or when the most frequent word's
count times ``2 * sum(L/d)`` could pass 2**63, the plain float weights ``1/d`` are used instead,
and chunked, threaded and Dask runs then agree to rounding, not bit for bit.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from distattn.corpus.ragged import RaggedIds
from distattn.corpus.tokenized import EmptyCorpusError, EncodedCorpus
from distattn.memory import check_memory
from distattn.stats import _kernels

WEIGHTINGS = ("none", "harmonic")
OOV_MODES = ("drop", "gap")
_MAX_EXACT_WINDOW = 22
_CHUNK_TOKENS = 1 << 27
_WORKER_TIMEOUT = 60.0


def as_ragged(docs, vocab_size: int | None = None) -> tuple[RaggedIds, int, int]:
    """Normalise ``docs`` (:class:`EncodedCorpus`, :class:`RaggedIds` or a sequence of int
    arrays) to :class:`RaggedIds`, the vocabulary size, and an extra id to treat as out of
    vocabulary (an :class:`EncodedCorpus`'s ``<unk>``; -1 for none). Negative ids are always
    out of vocabulary."""
    oov_id = -1
    if isinstance(docs, EncodedCorpus):
        if vocab_size is None:
            vocab_size = len(docs.vocab)
        if docs.vocab.unk_id is not None:
            oov_id = docs.vocab.unk_id
        ragged = docs.tokens
    elif isinstance(docs, RaggedIds):
        ragged = docs
    else:
        if isinstance(docs, np.ndarray) and docs.ndim == 1 and docs.dtype != object:
            raise TypeError("docs must be a collection of documents; wrap a single id array in a list")
        ragged = RaggedIds.from_sequences(list(docs))
    if len(ragged) == 0:
        raise EmptyCorpusError("the corpus is empty: no documents")
    ids = ragged.ids
    if vocab_size is None:
        if not len(ids) or ids.max() < 0:    # was reported as "vocab_size must be a positive integer, got 0"
            raise EmptyCorpusError(f"the corpus has {len(ragged)} documents but no in-vocabulary tokens "
                                   "(all documents are empty or out of vocabulary)")
        vocab_size = int(ids.max()) + 1
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    if len(ids) and ids.max() >= vocab_size:
        raise ValueError(f"token id {int(ids.max())} is out of range for vocab_size={vocab_size} "
                         f"(ids must lie in [0, {vocab_size}); negative ids mark out-of-vocabulary tokens)")
    return ragged, int(vocab_size), int(oov_id)


def _validate(window, weighting, oov, n_jobs):
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is not one of {WEIGHTINGS}")
    if oov not in OOV_MODES:
        raise ValueError(f"oov={oov!r} is not one of {OOV_MODES}")
    if n_jobs is not None and (not isinstance(n_jobs, (int, np.integer)) or n_jobs < 1):
        raise ValueError(f"n_jobs must be None or a positive integer, got {n_jobs!r}")


def harmonic_scale(window: int) -> int:
    """``lcm(1..window)`` for exact integer harmonic weights, or 0 past the exact range."""
    return math.lcm(*range(1, window + 1)) if window <= _MAX_EXACT_WINDOW else 0


def cooccurrence(docs, vocab_size: int | None = None, *, window: int = 5, weighting: str = "none",
                 symmetric: bool = True, per_offset: bool = False, oov: str = "drop",
                 n_jobs: int | None = None, chunk_tokens: int | None = None, backend: str = "numpy",
                 client=None, n_partitions: int | None = None, worker_timeout: float | None = None,
                 max_memory: int | None = None):
    """Co-occurrence counts within a window.

    Parameters
    ----------
    docs : EncodedCorpus, RaggedIds, or sequence of int arrays
        Token ids in ``[0, vocab_size)``; negative ids (and an :class:`EncodedCorpus`'s
        ``<unk>``) are out of vocabulary.
    vocab_size : int, optional
        n, the matrix is n × n. Defaults to the encoded corpus's vocabulary size, else max id + 1.
    window : int >= 1
    weighting : {"none", "harmonic"}
    symmetric : bool
        True: S = D + Dᵀ. False: the directional D (``D[i, j]``: ``j`` after ``i``).
    per_offset : bool
        True: return a list whose element ``d - 1`` is the matrix for distance exactly ``d``
        (weighted by ``1/d`` under harmonic weighting), for positional statistics. They sum to
        the window matrix.
    oov : {"drop", "gap"}
    n_jobs : int, optional
        Threads (default: the number of CPUs). Not with ``backend="dask"``, whose tasks each
        run on one worker thread.
    chunk_tokens : int, optional
        Documents are processed in groups of about this many tokens (default ``2**27``), bounding
        memory. Not with ``backend="dask"``, where ``n_partitions`` sets the groups.
    backend : {"numpy", "dask"}
        ``"dask"`` counts document groups on a ``dask.distributed`` cluster (``client``: a
        Client or a scheduler address; ``n_partitions`` groups, default two per worker thread)
        and gives the identical matrix (up to rounding for ``window > 22``).
    worker_timeout : float, optional
        With ``backend="dask"``: seconds to wait for the cluster's first worker (one still
        starting) before raising ``TimeoutError`` (default 60).
    max_memory : int, optional
        Bytes allowed (default: :func:`distattn.memory.available_memory`); the estimate is
        checked before anything large is allocated.

    Returns
    -------
    scipy.sparse.csr_array of float64, shape (n, n), or a list of ``window`` of them.
    """
    _validate(window, weighting, oov, n_jobs)
    for name, flag in (("symmetric", symmetric), ("per_offset", per_offset)):
        if not isinstance(flag, (bool, np.bool_)):       # symmetric="no" is a non-empty string: it was True
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    if backend not in ("numpy", "dask"):
        raise ValueError(f"backend={backend!r} is not one of ('numpy', 'dask')")
    if backend != "dask" and (client is not None or n_partitions is not None or worker_timeout is not None):
        given = "client=" if client is not None else "n_partitions=" if n_partitions is not None else \
            "worker_timeout="    # they were ignored
        raise ValueError(f"{given} is only used with backend='dask'; got backend={backend!r}; "
                         "pass backend='dask' to count on the cluster")
    if backend == "dask" and n_jobs is not None:       # it was ignored: each task ran with n_jobs=1
        raise ValueError(f"n_jobs= is not used with backend='dask'; got n_jobs={n_jobs!r}: each task counts on "
                         "one worker thread, and the cluster's worker threads set the parallelism")
    if backend == "dask" and chunk_tokens is not None:     # it was ignored: n_partitions set the groups
        raise ValueError(f"chunk_tokens= is not used with backend='dask'; got chunk_tokens={chunk_tokens!r}: "
                         "pass n_partitions= to set how many groups the documents are split into")
    if n_partitions is not None and (isinstance(n_partitions, bool) or not isinstance(n_partitions, (int, np.integer))
                                     or n_partitions < 1):   # 0 raised ZeroDivisionError, -3 was taken as 1 token
        raise ValueError(f"n_partitions must be None or a positive integer, got {n_partitions!r}")
    worker_timeout = _WORKER_TIMEOUT if worker_timeout is None else worker_timeout
    chunk_tokens = _CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    if isinstance(worker_timeout, bool) or not isinstance(worker_timeout, (int, float, np.integer, np.floating)) \
            or not 0 < worker_timeout < math.inf:      # 0 meant no deadline in dask: wait forever
        raise ValueError(f"worker_timeout must be a positive finite number of seconds, got {worker_timeout!r}")
    ragged, vocab_size, oov_id = as_ragged(docs, vocab_size)
    ids = ragged.ids
    in_vocab = ids[(ids >= 0) & (ids != oov_id)] if oov_id >= 0 else ids[ids >= 0]
    if len(in_vocab) == 0:
        raise EmptyCorpusError(f"the corpus has {len(ragged)} documents but no in-vocabulary tokens "
                               "(all documents are empty or out of vocabulary)")
    # dask: no thread counts here and each task counts on one worker thread (the client's CPU count
    # charged its threads' scratch, and refused counts that fit)
    estimate_memory(in_vocab, len(ragged), vocab_size, window, symmetric, per_offset, max_memory,
                    1 if backend == "dask" else n_jobs)
    exact = _integer_sums_exact(in_vocab, window, weighting, symmetric)
    del in_vocab
    groups = split_documents(ragged, chunk_tokens)
    spec = dict(vocab_size=vocab_size, window=window, weighting=weighting, symmetric=symmetric,
                per_offset=per_offset, oov=oov, oov_id=oov_id, n_jobs=n_jobs, exact=exact)
    if backend == "dask":
        from distattn.stats.distributed import map_reduce_counts
        return map_reduce_counts(ragged, groups, spec, client, n_partitions, worker_timeout)
    total = None
    for lo, hi in groups:
        part = count_block(_slice_docs(ragged, lo, hi), **spec)
        total = part if total is None else _add(total, part)
    return finalize(total, window, weighting, exact)


def _integer_sums_exact(in_vocab_ids: np.ndarray, window: int, weighting: str, symmetric: bool) -> bool:
    """Whether the int64 harmonic weights ``L/d`` keep every entry, and so every partial sum,
    below 2**63: an entry of row ``a`` is at most ``count(a) * sides * sum(L/d)``."""
    scale = harmonic_scale(window)
    if weighting != "harmonic" or not scale:
        return True
    most = int(np.bincount(in_vocab_ids).max())
    return most * (2 if symmetric else 1) * sum(scale // d for d in range(1, window + 1)) < 2 ** 63


def split_documents(ragged: RaggedIds, chunk_tokens: int) -> list[tuple[int, int]]:
    """Consecutive document ranges of about ``chunk_tokens`` tokens each."""
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, (int, np.integer)) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    offsets = ragged.offsets
    bounds = np.searchsorted(offsets, np.arange(chunk_tokens, offsets[-1], chunk_tokens), side="left")
    bounds = np.unique(np.concatenate(([0], bounds, [len(ragged)])))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _slice_docs(ragged: RaggedIds, lo: int, hi: int) -> RaggedIds:
    off = ragged.offsets[lo:hi + 1]
    return RaggedIds(ragged.ids[off[0]:off[-1]], off - off[0])


def count_block(ragged: RaggedIds, *, vocab_size: int, window: int, weighting: str, symmetric: bool,
                per_offset: bool, oov: str = "drop", oov_id: int = -1, n_jobs: int | None = None,
                exact: bool = True):
    """Unnormalised counts of one group of documents: harmonic weights are the int64 integers
    ``lcm/d`` (see module docstring; ``exact=False``: the floats ``1/d``); :func:`finalize`
    divides. Returns a csr_array or a list."""
    padded = _kernels.pad_documents(np.ascontiguousarray(ragged.ids, dtype=np.int32), ragged.offsets, window,
                                    oov_id, oov == "drop")
    row_ptr, positions = _kernels.bucket_positions(padded, vocab_size)
    scale = (harmonic_scale(window) if exact else 0) if weighting == "harmonic" else 1
    weights = np.ones(window + 1, dtype=np.float64)
    if weighting == "harmonic" and scale:      # int64: float64 sums of lcm/d rounded past 2**53
        weights = np.array([1] + [scale // d for d in range(1, window + 1)], dtype=np.int64)
    elif weighting == "harmonic":
        weights[1:] = 1.0 / np.arange(1, window + 1, dtype=np.float64)
    sides = 2 if symmetric else 1
    run = dict(padded=padded, row_ptr=row_ptr, positions=positions, vocab_size=vocab_size,
               look_right=True, look_left=symmetric, n_jobs=n_jobs)
    if per_offset:
        ones = np.ones(window + 1, dtype=np.float64)
        return [_count_rows_parallel(d_lo=d, d_hi=d, weights=ones, pairs_per_token=sides, **run)
                for d in range(1, window + 1)]
    return _count_rows_parallel(d_lo=1, d_hi=window, weights=weights, pairs_per_token=sides * window, **run)


def finalize(counts, window: int, weighting: str, exact: bool = True):
    """Apply the final division of :func:`count_block`'s integer-weighted sums (the same
    ``exact`` as there); the result is float64."""
    if weighting != "harmonic":
        return counts
    if isinstance(counts, list):
        for d, m in enumerate(counts, start=1):
            m.data /= d
        return counts
    scale = harmonic_scale(window) if exact else 0
    if scale:
        counts.data = counts.data / scale      # int64 sums: float64 quotients
    return counts


def _add(a, b):
    if isinstance(a, list):
        return [x + y for x, y in zip(a, b)]
    return a + b


def _count_rows_parallel(padded, row_ptr, positions, vocab_size, d_lo, d_hi, look_right, look_left, weights,
                         pairs_per_token, n_jobs):
    n_jobs = n_jobs or os.cpu_count() or 1
    occurrences = np.diff(row_ptr)
    work = np.cumsum(occurrences, dtype=np.float64)
    n_blocks = max(1, min(vocab_size, 8 * n_jobs))
    cuts = np.searchsorted(work, np.linspace(0, work[-1], n_blocks + 1)[1:-1], side="right")
    bounds = np.unique(np.concatenate(([0], cuts, [vocab_size])))
    upper = np.minimum(occurrences * pairs_per_token, vocab_size)  # distinct columns a row can reach

    def block(lo_hi):
        lo, hi = lo_hi
        cap = int(upper[lo:hi].sum() // 4) + 1024
        return _kernels.count_rows(padded, row_ptr, positions, lo, hi, vocab_size, d_lo, d_hi, look_right,
                                   look_left, weights, cap)

    spans = list(zip(bounds[:-1], bounds[1:]))
    if n_jobs == 1 or len(spans) == 1:
        parts = [block(s) for s in spans]
    else:
        with ThreadPoolExecutor(max_workers=n_jobs) as pool:
            parts = list(pool.map(block, spans))
    indptr = np.zeros(vocab_size + 1, dtype=np.int64)
    row_nnz = np.concatenate([np.diff(p[0]) for p in parts])
    np.cumsum(row_nnz, out=indptr[1:])
    indices = np.concatenate([p[1][:p[3]] for p in parts])
    data = np.concatenate([p[2][:p[3]] for p in parts])
    if indptr[-1] <= np.iinfo(np.int32).max:
        indptr = indptr.astype(np.int32)
    return sp.csr_array((data, indices, indptr), shape=(vocab_size, vocab_size))


def estimate_memory(in_vocab_ids: np.ndarray, n_docs: int, vocab_size: int, window: int, symmetric: bool,
                    per_offset: bool, max_memory: int | None = None, n_jobs: int | None = None) -> int:
    """Upper bound on the bytes counting needs, from the in-vocabulary token ids, on ``n_jobs``
    counting threads (default: the number of CPUs, as counting does); raises
    ``MemoryBudgetError`` past the limit, before anything large is allocated."""
    n = len(in_vocab_ids)
    n_mats = window if per_offset else 1
    pairs = (2 if symmetric else 1) * (1 if per_offset else window)
    # Every occurrence of a word adds at most `pairs` distinct columns to its row, and a row has
    # at most vocab_size columns: bound the stored entries without counting them. (bincount
    # over the ids present only: the estimate itself must not allocate O(vocab_size).)
    counts = np.bincount(in_vocab_ids) if n else np.zeros(1, np.int64)
    nnz_bound = float(np.minimum(counts.astype(np.float64) * pairs, vocab_size).sum())
    per_thread_scratch = 24.0 * vocab_size * (n_jobs or os.cpu_count() or 1)   # the threads counting uses
    nbytes = (n * 12.0 + 4.0 * window * (n_docs + 1)  # padded ids + positions
              + 8.0 * (vocab_size + 1) * (n_mats + 1)   # row pointers
              + per_thread_scratch
              + 2 * 12.0 * nnz_bound * n_mats)           # output, and one copy while assembling
    check_memory(nbytes, f"co-occurrence counting (vocab_size={vocab_size:,}, window={window}, "
                         f"{n:,} tokens)", max_memory, "max_memory")
    return int(nbytes)
