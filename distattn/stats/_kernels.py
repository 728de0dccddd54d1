"""Compiled inner loops for co-occurrence counting (numba, ``nogil`` so Python threads run
them in parallel).

Layout: ``padded`` is the corpus as one int32 array where every document is preceded and
followed by ``window`` sentinels (-1), and out-of-vocabulary tokens kept in place (``oov="gap"``)
are -1 too; so no window crosses a document and no bounds checks are needed. ``positions``
lists the indices of ``padded`` grouped by token id (a counting sort), ``row_ptr`` delimits the
groups. Each row is then accumulated in a dense scratch row of ``vocab_size`` floats and
emitted in sorted column order, which gives canonical CSR without any sort.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir as _ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from distattn.threads import start_numba_threads

# llvm.prefetch's name mangles the pointer type: "p0" with opaque pointers (LLVM >= 15).
_PREFETCH = "llvm.prefetch.p0" if _llvm.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint the CPU to load ``arr[idx]`` into cache (``llvm.prefetch``, read, high locality).
    Unlike a real load it never stalls, so many can be in flight at once."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        arrty = signature.args[0]
        ary = context.make_array(arrty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, arrty, ary, [args[1]], wraparound=False)
        i8p = _ir.IntType(8).as_pointer()
        i32 = _ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, _ir.FunctionType(_ir.VoidType(), [i8p, i32, i32, i32]),
                                            _PREFETCH)
        builder.call(fn, [builder.bitcast(ptr, i8p), _ir.Constant(i32, 0), _ir.Constant(i32, 3), _ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


_PREFETCH_AHEAD = 6  # occurrences; 4-8 measured best on the 2-core AMD EPYC dev machine


@njit(nogil=True, cache=True)
def bucket_positions(padded, vocab_size):
    """Counting sort of the positions of ``padded`` by token id (ids < 0 skipped).

    Returns ``row_ptr`` (vocab_size + 1, int64) and ``positions`` (int64)."""
    counts = np.zeros(vocab_size + 1, dtype=np.int64)
    for p in range(padded.shape[0]):
        t = padded[p]
        if t >= 0:
            counts[t + 1] += 1
    for i in range(vocab_size):
        counts[i + 1] += counts[i]
    row_ptr = counts.copy()
    fill = counts[:-1].copy()
    positions = np.empty(row_ptr[vocab_size], dtype=np.int64)
    for p in range(padded.shape[0]):
        t = padded[p]
        if t >= 0:
            positions[fill[t]] = p
            fill[t] += 1
    return row_ptr, positions


_DEBRUIJN = np.array([0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62, 55, 59, 36, 53, 51, 43, 22,
                      45, 39, 33, 30, 24, 18, 12, 5, 63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44, 32, 23, 11,
                      46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6], dtype=np.int64)
_DEBRUIJN_MUL = 0x03F79D71B4CB0A89


@njit(nogil=True, cache=True, inline="always")
def _lowest_bit_index(low):
    """Index of the single set bit of ``low`` (a power of two as int64), via a de Bruijn table."""
    return _DEBRUIJN[((low * _DEBRUIJN_MUL) >> 58) & 63]


@njit(nogil=True, cache=True)
def count_rows(padded, row_ptr, positions, row_lo, row_hi, vocab_size, d_lo, d_hi, look_right, look_left,
               weights, capacity):
    """CSR rows ``row_lo:row_hi`` of the window counts.

    Row ``a``, column ``b`` accumulates ``weights[d]`` for every occurrence of ``a`` at ``p``
    with ``b`` at ``p + d`` (if ``look_right``) and at ``p - d`` (if ``look_left``), for
    ``d_lo <= d <= d_hi``. Returns (indptr relative to this block, indices int32, data in
    ``weights``' dtype: float64, or int64 for the exact integer harmonic weights).

    Two ways to find a row's columns in sorted order, chosen per row by how many it can have:
    a frequent row marks touched columns in a bitmap with branch-free ORs and walks the set
    bits (cost ~ vocab_size / 64 per row); a rare row keeps a short list of new columns and
    sorts it. Weights are positive, so ``acc[b] == 0`` means "not yet touched in this row".
    """
    n_rows = row_hi - row_lo
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    indices = np.empty(max(capacity, 16), dtype=np.int32)
    data = np.empty(max(capacity, 16), dtype=weights.dtype)
    acc = np.zeros(vocab_size, dtype=weights.dtype)
    n_words = (vocab_size + 63) >> 6
    bits = np.zeros(n_words, dtype=np.int64)
    touched = np.empty(vocab_size, dtype=np.int64)
    one = np.int64(1)
    # the signed offsets looked at, and their weights, as one flat loop (no flags in the hot loop)
    n_offs = (d_hi - d_lo + 1) * ((1 if look_right else 0) + (1 if look_left else 0))
    offs = np.empty(n_offs, dtype=np.int64)
    wts = np.empty(n_offs, dtype=weights.dtype)
    j = 0
    for d in range(d_lo, d_hi + 1):
        if look_right:
            offs[j] = d
            wts[j] = weights[d]
            j += 1
        if look_left:
            offs[j] = -d
            wts[j] = weights[d]
            j += 1
    pairs = n_offs
    n_positions = positions.shape[0]
    max_off = d_hi  # the window around a position spans [p - d_hi, p + d_hi]
    nnz = 0
    for a in range(row_lo, row_hi):
        k0 = row_ptr[a]
        k1 = row_ptr[a + 1]
        room = min((k1 - k0) * pairs, vocab_size)
        if nnz + room > indices.shape[0]:
            new_cap = max(2 * indices.shape[0], nnz + room)
            new_indices = np.empty(new_cap, dtype=np.int32)
            new_data = np.empty(new_cap, dtype=weights.dtype)
            new_indices[:nnz] = indices[:nnz]
            new_data[:nnz] = data[:nnz]
            indices = new_indices
            data = new_data
        if room > n_words:
            for k in range(k0, k1):
                if k + _PREFETCH_AHEAD < n_positions:
                    q = positions[k + _PREFETCH_AHEAD]
                    prefetch(padded, q - max_off)
                    prefetch(padded, q + max_off)
                p = positions[k]
                for j in range(n_offs):
                    b = padded[p + offs[j]]
                    if b >= 0:
                        acc[b] += wts[j]
                        bits[b >> 6] |= one << (b & 63)
            for wi in range(n_words):
                word = bits[wi]
                if word != 0:
                    bits[wi] = 0
                    while word != 0:
                        low = word & -word
                        word ^= low
                        b = (wi << 6) + _lowest_bit_index(low)
                        indices[nnz] = b
                        data[nnz] = acc[b]
                        acc[b] = 0
                        nnz += 1
        else:
            nt = 0
            for k in range(k0, k1):
                if k + _PREFETCH_AHEAD < n_positions:
                    q = positions[k + _PREFETCH_AHEAD]
                    prefetch(padded, q - max_off)
                    prefetch(padded, q + max_off)
                p = positions[k]
                for j in range(n_offs):
                    b = padded[p + offs[j]]
                    if b >= 0:
                        if acc[b] == 0.0:
                            touched[nt] = b
                            nt += 1
                        acc[b] += wts[j]
            cols = np.sort(touched[:nt])
            for i in range(nt):
                b = cols[i]
                indices[nnz] = b
                data[nnz] = acc[b]
                acc[b] = 0
                nnz += 1
        indptr[a - row_lo + 1] = nnz
    return indptr, indices, data, nnz


@njit(nogil=True, cache=True)
def pad_documents(ids, offsets, window, oov_id, drop_oov):
    """The padded layout described in the module docstring, in one pass over the corpus.

    Out-of-vocabulary tokens (ids < 0, and ``oov_id`` if it is >= 0) are removed
    (``drop_oov``) or kept in place as -1."""
    n_docs = offsets.shape[0] - 1
    kept = ids.shape[0]
    if drop_oov:
        kept = 0
        for p in range(ids.shape[0]):
            t = ids[p]
            if t >= 0 and t != oov_id:
                kept += 1
    out = np.full(kept + window * (n_docs + 1), -1, dtype=np.int32)
    q = window
    for i in range(n_docs):
        for p in range(offsets[i], offsets[i + 1]):
            t = ids[p]
            if t < 0 or t == oov_id:
                if drop_oov:
                    continue
                t = -1
            out[q] = t
            q += 1
        q += window
    return out


def csr_dense_matmul(indptr, indices, data, dense):
    """``A @ dense`` for CSR ``A`` (rows in parallel threads), in ``dense``'s dtype."""
    start_numba_threads()
    return _csr_dense_matmul(indptr, indices, data, dense)


@njit(parallel=True, fastmath=True, cache=True)
def _csr_dense_matmul(indptr, indices, data, dense):
    """:func:`csr_dense_matmul`'s kernel.

    Rows are dealt round-robin to 64 interleaved chunks: numba's OpenMP layer gives each
    thread a contiguous range of the ``prange``, and the rows of a frequency-sorted
    vocabulary get sparser down the matrix, so contiguous ranges would be unbalanced."""
    n_rows = indptr.shape[0] - 1
    k = dense.shape[1]
    out = np.zeros((n_rows, k), dtype=dense.dtype)
    n_chunks = 64
    for c in prange(n_chunks):
        for i in range(c, n_rows, n_chunks):
            for j in range(indptr[i], indptr[i + 1]):
                col = indices[j]
                w = data[j]
                for t in range(k):
                    out[i, t] += w * dense[col, t]
    return out
