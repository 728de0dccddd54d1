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

import heapq
import math

import numba as nb
from llvmlite import ir as _ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
import numpy as np
import scipy.sparse as sp

from distattn.corpus.ragged import RaggedIds
from distattn.projection import _checks
from distattn.projection._scoring import FASTMATH, _divide, _inverse, score_row
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES
from distattn.threads import start_numba_threads

__all__ = ["causal_weights", "causal_logits", "causal_scores", "causal_plan"]


def causal_weights(M: np.ndarray, normalization: str = "none", *, zero_rows: str = "uniform",
                   attention_temperature: float = 1.0) -> np.ndarray:
    """C (R, R), lower-triangular: ``C[t, s] = Σ_{r≤t} A⁽ᵗ⁾[r, s]`` for the prefix ``:t+1``.

    ``A⁽ᵗ⁾`` normalises M restricted to the prefix: ``"none"`` keeps M, ``"row"`` divides
    by the prefix row sums ``Σ_{s≤t} M[r, s]`` (zero rows follow ``zero_rows``, with
    "uniform" meaning uniform over the prefix), ``"softmax"`` uses the prefix
    log-sum-exp ``logcumsumexp(M/τ)`` (stable for raw counts).

    Parameters
    ----------
    M : array-like or sparse, shape (R, R)
        The context matrix of the in-vocabulary tokens of a document.
    """
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    M = _checks.float_array(M, "M")
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"M must be square (length, length); got shape {M.shape}")
    _checks.finite(M, "M")
    R = M.shape[0]
    lower = np.tril(np.ones((R, R), dtype=bool))
    if normalization == "none":
        return np.where(lower, np.cumsum(M, axis=0), 0.0)
    if normalization == "row":
        _checks.non_negative(M)
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
    # each prefix's row max is subtracted before dividing by τ: M / τ overflowed to inf (NaN weights)
    # for a tiny τ or huge M
    top = np.maximum.accumulate(M, axis=1).T          # [t, r] = max_{s≤t} M[r, s]
    C = np.zeros((R, R))
    block = max(1, (1 << 22) // max(R * R, 1))
    for start in range(0, R, block):                  # loop over blocks of prefixes, not tokens
        t = np.arange(start, min(R, start + block))
        with np.errstate(over="ignore"):
            A = np.exp(np.where(np.arange(R)[None, None, :] <= t[:, None, None],
                                (M[None, :, :] - top[t][:, :, None]) / tau, -np.inf))   # (t, r, s)
        A /= A.sum(axis=2, keepdims=True)
        A *= np.arange(R)[None, :, None] <= t[:, None, None]
        C[t] = A.sum(axis=1)
    return C


def causal_logits(known_ids: np.ndarray, S: sp.csr_array, C: np.ndarray) -> np.ndarray:
    """``e_t = (1/(t+1)) Σ_s C[t, s] S[id_s]`` for every prefix, shape (R, vocab_size)."""
    R = known_ids.size
    profiles = S[known_ids]
    return np.asarray(C @ profiles) / np.arange(1, R + 1)[:, None]


_LANES = 16        # consecutive positions advanced together: one 64-byte cache line of float32 per column
_COL_BLOCK = 2048  # columns per cache block: _COL_BLOCK * 64 bytes = 128 KB of lanes stays in L2
_SKIP = 35.0       # exp(-35) = 6e-16
_FLT_MAX = float(np.finfo(np.float32).max)   # the lanes' exp scale is float32
_EXP_CONSTS = [float(np.float32(c)) for c in (-87.0, 1.4426950408889634, 0.693145751953125, 1.428606765330187e-06,
                                               1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0)]


@nb.njit(cache=True)
def _column_block_starts(indptr, indices, n_cols, width):
    """``starts[v, c]``: the first stored entry of row v with column >= c * width (sorted rows)."""
    n_rows = indptr.size - 1
    n_blocks = (n_cols + width - 1) // width
    starts = np.empty((n_rows, n_blocks + 1), np.int64)
    for v in range(n_rows):
        q, end = indptr[v], indptr[v + 1]
        starts[v, 0] = q
        for c in range(1, n_blocks + 1):
            bound = c * width
            while q < end and indices[q] < bound:
                q += 1
            starts[v, c] = q
    return starts


def _types():
    f64, f32, i32, i64 = _ir.DoubleType(), _ir.FloatType(), _ir.IntType(32), _ir.IntType(64)
    return f64, f32, i32, i64, _ir.VectorType(f64, 4), _ir.VectorType(f32, 8), _ir.VectorType(i32, 8)


def _splat(builder, vec_type, value):
    out = _ir.Constant(vec_type, _ir.Undefined)
    for c in range(vec_type.count):
        out = builder.insert_element(out, value, _ir.Constant(_ir.IntType(32), c))
    return out


def _const(vec_type, value):
    return _ir.Constant(vec_type, [value] * vec_type.count)


def _intrinsic_fn(builder, name, ret, *args):
    return cgutils.get_or_insert_function(builder.module, _ir.FunctionType(ret, list(args)), name)


def _data_ptr(context, builder, arrty, arr, elem_type=None, offset=None):
    """Pointer to ``arr[offset]`` (or its start), cast to ``elem_type*`` when given."""
    ptr = context.make_array(arrty)(context, builder, arr).data
    if offset is not None:
        ptr = builder.gep(ptr, [offset])
    return builder.bitcast(ptr, elem_type.as_pointer()) if elem_type is not None else ptr


def _f64x16_to_f32x8(builder, quads):
    """Four <4 x double> as two <8 x float>."""
    f64, f32, i32, i64, v4d, v8f, v8i = _types()
    v4f = _ir.VectorType(f32, 4)
    halves = [builder.fptrunc(q, v4f) for q in quads]
    join = _ir.Constant(v8i, list(range(8)))
    return [builder.shuffle_vector(halves[0], halves[1], join), builder.shuffle_vector(halves[2], halves[3], join)]


def _f32x8_to_f64x4(builder, octs):
    """Two <8 x float> as four <4 x double>."""
    f64, f32, i32, i64, v4d, v8f, v8i = _types()
    out = []
    for o in octs:
        for h in range(2):
            part = builder.shuffle_vector(o, o, _ir.Constant(_ir.VectorType(i32, 4), list(range(4 * h, 4 * h + 4))))
            out.append(builder.fpext(part, v4d))
    return out


def _load_quads(context, builder, arrty, arr):
    """The 16 float64 of a small array as four <4 x double>, and its <4 x double>* pointer."""
    f64, f32, i32, i64, v4d, v8f, v8i = _types()
    ptr = _data_ptr(context, builder, arrty, arr, v4d)
    return [builder.load(builder.gep(ptr, [_ir.Constant(i32, h)]), align=8) for h in range(4)], ptr


@intrinsic
def _scatter(typingctx, D, indices, data, q0, q1, wts, wb):
    """``D[k*16 : k*16+16] += float32(wts[wb : wb+16]) * data[q]`` (k = ``indices[q]``) over the
    stored entries ``q0:q1`` of a row: two 8-wide FMAs per entry on one cache line, with the
    lane weights held in registers.

    LLVM does not fuse the scalar updates itself (numba's indexing hides that the addresses
    are consecutive), and a scalar version is several times slower."""
    sig = types.void(D, indices, data, q0, q1, wts, wb)

    def codegen(context, builder, signature, args):
        f64, f32, i32, i64, v4d, v8f, v8i = _types()
        dptr = _data_ptr(context, builder, signature.args[0], args[0], v8f)
        iptr = _data_ptr(context, builder, signature.args[1], args[1])
        sptr = _data_ptr(context, builder, signature.args[2], args[2])
        wptr = _data_ptr(context, builder, signature.args[5], args[5], v4d, args[6])
        w = _f64x16_to_f32x8(builder, [builder.load(builder.gep(wptr, [_ir.Constant(i32, h)]), align=8)
                                       for h in range(4)])
        fma = _intrinsic_fn(builder, "llvm.fma.v8f32", v8f, v8f, v8f, v8f)
        unsigned = not signature.args[1].dtype.signed
        q0 = args[3]
        with cgutils.for_range(builder, builder.sub(args[4], q0)) as loop:
            q = builder.add(q0, loop.index)
            col = builder.load(builder.gep(iptr, [q]))
            col = builder.zext(col, i64) if unsigned else builder.sext(col, i64)
            s = _splat(builder, v8f, builder.load(builder.gep(sptr, [q])))
            base = builder.mul(col, _ir.Constant(i64, 2))
            for h in range(2):
                ptr = builder.gep(dptr, [builder.add(base, _ir.Constant(i64, h))])
                builder.store(builder.call(fma, [w[h], s, builder.load(ptr, align=4)]), ptr, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _lane_max(typingctx, Fb, D, k0, k1, m):
    """``m[c] = max(m[c], max_k Fb[k] + D[k*16 + c])`` for k in ``k0:k1``, in float64."""
    sig = types.void(Fb, D, k0, k1, m)

    def codegen(context, builder, signature, args):
        f64, f32, i32, i64, v4d, v8f, v8i = _types()
        fmax = _intrinsic_fn(builder, "llvm.maxnum.v4f64", v4d, v4d, v4d)
        ms, mptr = _load_quads(context, builder, signature.args[4], args[4])
        acc = [cgutils.alloca_once_value(builder, mh) for mh in ms]
        fbptr = _data_ptr(context, builder, signature.args[0], args[0])
        dptr = _data_ptr(context, builder, signature.args[1], args[1], v8f)
        k0 = args[2]
        with cgutils.for_range(builder, builder.sub(args[3], k0)) as loop:
            k = builder.add(k0, loop.index)
            fb = _splat(builder, v4d, builder.load(builder.gep(fbptr, [k])))
            base = builder.mul(k, _ir.Constant(k.type, 2))
            octs = [builder.load(builder.gep(dptr, [builder.add(base, _ir.Constant(k.type, h))]), align=4)
                    for h in range(2)]
            for h, x in enumerate(_f32x8_to_f64x4(builder, octs)):
                builder.store(builder.call(fmax, [builder.load(acc[h]), builder.fadd(fb, x)]), acc[h])
        for h in range(4):
            builder.store(builder.load(acc[h]), builder.gep(mptr, [_ir.Constant(i32, h)]), align=8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _lane_scores(typingctx, Fb, D, n, m, sc, tu, total, cnt):
    """Per lane c, with ``u[k] = float32(Fb[k] - m[c]) + D[k*16 + c]``:
    ``total[c] = Σ_k exp(u[k] * sc[c])`` (the float32 exp of
    :func:`~distattn.projection._scoring._exp_into`, 8-wide, summed in float64) and
    ``cnt[c] = #{k : u[k] >= tu[c]}``, in one pass over ``k < n``. The same pass carries the
    block's evidence to the next: ``Fb[k] += D[k*16 + 15]`` and ``D[k*16 : k*16+16] = 0``,
    which saves the kernel a separate pass."""
    sig = types.void(Fb, D, n, m, sc, tu, total, cnt)

    def codegen(context, builder, signature, args):
        f64, f32, i32, i64, v4d, v8f, v8i = _types()
        v4i = _ir.VectorType(i64, 4)
        floor = _intrinsic_fn(builder, "llvm.floor.v8f32", v8f, v8f)
        fmax = _intrinsic_fn(builder, "llvm.maxnum.v8f32", v8f, v8f, v8f)
        fma = _intrinsic_fn(builder, "llvm.fma.v8f32", v8f, v8f, v8f, v8f)
        mv, _ = _load_quads(context, builder, signature.args[3], args[3])
        sv = _f64x16_to_f32x8(builder, _load_quads(context, builder, signature.args[4], args[4])[0])
        tuv = _f64x16_to_f32x8(builder, _load_quads(context, builder, signature.args[5], args[5])[0])
        _, tot_ptr = _load_quads(context, builder, signature.args[6], args[6])
        cnt_ptr = _data_ptr(context, builder, signature.args[7], args[7], v4i)
        tot = [cgutils.alloca_once_value(builder, _const(v4d, 0.0)) for _ in range(4)]
        cnt = [cgutils.alloca_once_value(builder, _ir.Constant(v8i, [0] * 8)) for _ in range(2)]
        consts = [_const(v8f, c) for c in _EXP_CONSTS]
        skip_c = _const(v8f, -_SKIP)
        zero8 = _const(v8f, 0.0)
        fbptr = _data_ptr(context, builder, signature.args[0], args[0])
        dptr = _data_ptr(context, builder, signature.args[1], args[1], v8f)
        with cgutils.for_range(builder, args[2]) as loop:
            k = loop.index
            fb_ptr = builder.gep(fbptr, [k])
            fb = builder.load(fb_ptr)
            base = builder.mul(k, _ir.Constant(k.type, 2))
            ptrs = [builder.gep(dptr, [builder.add(base, _ir.Constant(k.type, h))]) for h in range(2)]
            xs = [builder.load(ptr, align=4) for ptr in ptrs]
            shift = _f64x16_to_f32x8(builder, [builder.fsub(_splat(builder, v4d, fb), mh) for mh in mv])
            last = builder.extract_element(xs[1], _ir.Constant(i32, 7))
            builder.store(builder.fadd(fb, builder.fpext(last, f64)), fb_ptr)
            for ptr in ptrs:
                builder.store(zero8, ptr, align=4)
            for grp in range(2):                  # 8 lanes at a time
                u = builder.fadd(shift[grp], xs[grp])
                ge = builder.zext(builder.fcmp_ordered(">=", u, tuv[grp]), v8i)
                builder.store(builder.add(builder.load(cnt[grp]), ge), cnt[grp])
                t = builder.fmul(u, sv[grp])
                # a column where all 8 lanes are below exp(-_SKIP) adds < vocab * 6e-16 to totals >= 1:
                # skip its exp (most columns, once a document is long enough to separate the logits)
                live = builder.fcmp_unordered(">", t, skip_c)   # NaN stays live: it propagates
                live = builder.icmp_unsigned("!=", builder.bitcast(live, _ir.IntType(8)),
                                             _ir.Constant(_ir.IntType(8), 0))
                with builder.if_then(live, likely=False):
                    _exp8_accumulate(builder, t, tot[2 * grp:2 * grp + 2], fmax, floor, fma, consts)
        for h in range(4):
            builder.store(builder.load(tot[h]), builder.gep(tot_ptr, [_ir.Constant(i32, h)]), align=8)
        for grp in range(2):
            wide = [builder.sext(builder.shuffle_vector(builder.load(cnt[grp]), builder.load(cnt[grp]),
                                                        _ir.Constant(_ir.VectorType(i32, 4), list(range(4 * h, 4 * h + 4)))),
                                 v4i) for h in range(2)]
            for h in range(2):
                builder.store(wide[h], builder.gep(cnt_ptr, [_ir.Constant(i32, 2 * grp + h)]), align=8)
        return context.get_dummy_value()

    return sig, codegen


def _exp8_accumulate(builder, t, tot, fmax, floor, fma, consts):
    """``tot[h] += fpext(exp(t)[4h:4h+4])`` for a <8 x float> t <= 0: the Cody-Waite exp of
    :mod:`distattn.projection._scoring` (clamped at -87, degree-6 polynomial, 2^k by bits)."""
    f64, f32, i32, i64, v4d, v8f, v8i = _types()
    floor_c, log2e, ln2_hi, ln2_lo, *poly = consts
    t = builder.call(fmax, [t, floor_c])
    k = builder.call(floor, [builder.fadd(builder.fmul(t, log2e), _const(v8f, 0.5))])
    r = builder.fsub(builder.fsub(t, builder.fmul(k, ln2_hi)), builder.fmul(k, ln2_lo))
    p = poly[0]
    for c in poly[1:]:
        p = builder.call(fma, [r, p, c])
    p = builder.call(fma, [r, p, poly[-1]])          # 1 + r (1 + r (1/2 + ...))
    pow2 = builder.bitcast(builder.shl(builder.add(builder.fptosi(k, v8i), _ir.Constant(v8i, [127] * 8)),
                                       _ir.Constant(v8i, [23] * 8)), v8f)
    for h, part in enumerate(_f32x8_to_f64x4(builder, [builder.fmul(p, pow2)])):
        builder.store(builder.fadd(builder.load(tot[h]), part), tot[h])


@nb.njit(inline="always", cache=True)
def _add_lane_weight(v, w, b, L, slot, slot_v, wts, n_slots):
    """Add ``w`` to lanes ``b..L-1`` of row ``v``'s weight slot (allocating a zeroed slot on
    first use); returns the new slot count."""
    sl = slot[v]
    if sl < 0:
        sl = n_slots
        n_slots += 1
        slot[v] = sl
        slot_v[sl] = v
        for c in range(L):
            wts[sl * L + c] = 0.0
    for c in range(b, L):
        wts[sl * L + c] += w
    return n_slots


@nb.njit(fastmath=FASTMATH, parallel=True, cache=True)
def _causal_kernel(ids, offsets, queue_ptr, queue, indptr, indices, data, data32, col_starts, temperature, prior,
                   prior_weight, out_logp, out_rank):
    """Every document, each worker taking its own queue (see :func:`_balanced_queues`)."""
    for worker in nb.prange(queue_ptr.size - 1):
        for jd in range(queue_ptr[worker], queue_ptr[worker + 1]):
            _causal_document(ids, offsets[queue[jd]], offsets[queue[jd] + 1], indptr, indices, data, data32,
                             col_starts, temperature, prior, prior_weight, out_logp, out_rank)


@nb.njit(fastmath=FASTMATH, cache=True)
def _causal_document(ids, start, stop, indptr, indices, data, data32, col_starts, temperature, prior, prior_weight,
                     out_logp, out_rank):
    """One document, positions ``start:stop``. Blocks of ``_LANES`` consecutive positions share
    one pass over the rows of S they touch.

    The evidence after position ``b`` of a block is ``Fb[k] + D[k * L + b]``: ``Fb`` (float64)
    holds it at the block's start and ``D`` (float32) the block's own increments, so a lane
    accumulates over at most L positions in float32 and the running sum stays float64. Each
    prefix type whose row enters the block gets a slot with its *cumulative* weights over the
    lanes (``wts[slot * L + b]`` = its total coefficient added by positions ``<= b``), so a
    stored entry ``S[v, k]`` updates one cache line ``D[k*L : k*L+L]`` for all lanes at once:
    a row touched by most positions (frequent words) is streamed once per block instead of
    once per position. Columns are processed in L2-sized blocks, and the block's positions
    are scored together (max, rank count and log-sum-exp vectorise across lanes).

    A lane's logits are ``(Fb + D) / (n_known * temperature)``: log p divides by that (its
    reciprocal was inf for a subnormal τ, and NaN or positive log p came out), and the
    float32 exp takes the reciprocal clamped to the largest float32."""
    if stop - start < 2:
        return
    L = _LANES
    V = indptr.size - 1
    n_cols = V  # S is square (vocab x vocab)
    n_cb = col_starts.shape[1] - 1
    with_prior = prior_weight > 0.0
    Fb = np.zeros(n_cols)
    D = np.zeros(n_cols * L, np.float32)
    g = np.zeros(V)
    h = np.zeros(V, np.int32)
    slot = np.full(V, -1, np.int32)
    slot_v = np.empty(V, np.int32)
    wts = np.empty(V * L)
    tgt = np.empty(L, np.int64)
    lane_scale = np.empty(L)
    lane_tau = np.empty(L)
    m = np.empty(L)
    tu = np.empty(L)
    tv = np.empty(L)
    total = np.empty(L)
    cnt = np.empty(L, np.int64)
    row = np.empty(n_cols if with_prior else 0)
    work = np.empty(n_cols if with_prior else 0, np.float32)
    bits = np.empty(n_cols if with_prior else 0, np.int32)
    n_known = 0
    carried = True  # D holds no increments (the scoring pass moves them into Fb)
    for t0 in range(start, stop - 1, L):
        # 1. the coefficients each position adds (sequential: h and g evolve)
        n_slots = 0
        any_target = False
        for b in range(L):
            t = t0 + b
            tgt[b] = -1
            lane_tau[b] = temperature
            lane_scale[b] = _inverse(temperature, _FLT_MAX)
            if t >= stop:
                continue
            i = ids[t]
            if i >= 0:
                lo, hi = indptr[i], indptr[i + 1]
                for p in range(lo, hi):   # one pass: g += S[i], and the prefix types meeting i
                    v = indices[p]
                    g[v] += data[p]
                    if h[v] > 0:
                        n_slots = _add_lane_weight(v, h[v] * data[p], b, L, slot, slot_v, wts, n_slots)
                n_slots = _add_lane_weight(i, g[i], b, L, slot, slot_v, wts, n_slots)
                h[i] += 1
                n_known += 1
            if t + 1 < stop and ids[t + 1] >= 0:
                tgt[b] = ids[t + 1]
                lane_tau[b] = temperature * n_known if n_known > 0 else temperature
                lane_scale[b] = _inverse(lane_tau[b], _FLT_MAX)
                any_target = True
        for sl in range(n_slots):
            slot[slot_v[sl]] = -1
        # 2. the lanes' increments, one L2-sized column block at a time
        for b in range(L):
            m[b] = -np.inf
        for cb in range(n_cb):
            k0 = cb * _COL_BLOCK
            k1 = min(k0 + _COL_BLOCK, n_cols)
            if not carried:
                for k in range(k0, k1):      # move the previous block's increments into Fb
                    Fb[k] += D[k * L + L - 1]
                    for c in range(L):
                        D[k * L + c] = 0.0
            for sl in range(n_slots):
                v = slot_v[sl]
                _scatter(D, indices, data32, col_starts[v, cb], col_starts[v, cb + 1], wts, sl * L)
            if any_target and not with_prior:    # the lanes' maxima, while the block is in cache
                _lane_max(Fb, D, k0, k1, m)
        carried = False
        if not any_target:
            continue
        # 3. score the block's positions
        if with_prior:
            for b in range(L):
                if tgt[b] >= 0:
                    for k in range(n_cols):
                        row[k] = Fb[k] + D[k * L + b]
                    lp, rk = score_row(row, lane_tau[b], tgt[b], prior, prior_weight, work, bits)
                    out_logp[t0 + b] = lp
                    out_rank[t0 + b] = rk
            continue
        for b in range(L):
            k = max(tgt[b], 0)
            tu[b] = np.float32(Fb[k] - m[b]) + D[k * L + b]   # as the scoring pass computes it
            tv[b] = (Fb[k] - m[b]) + D[k * L + b]
        _lane_scores(Fb, D, n_cols, m, lane_scale, tu, total, cnt)   # also carries D into Fb
        carried = True
        for b in range(L):
            if tgt[b] >= 0:
                out_logp[t0 + b] = _divide(tv[b], lane_tau[b]) - math.log(total[b])
                out_rank[t0 + b] = max(cnt[b] - 1, 0)


def causal_plan(S: sp.csr_array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-S tables of :func:`causal_scores`: S's column indices (2-byte when they fit), its
    values in float32, and where each row's column blocks start. Build once per S and pass as
    ``plan=``."""
    # The kernel streams ~1e4 stored entries of S per position on a realistic PPMI and is
    # bound by memory traffic: 2-byte indices and 4-byte values halve what it reads.
    indices = S.indices.astype(np.uint16) if S.shape[1] <= 1 << 16 else S.indices
    data = S.data.astype(np.float32)
    return indices, data, _column_block_starts(S.indptr, indices, S.shape[1], _COL_BLOCK)


def causal_scores(docs, S: sp.csr_array, *, temperature: float = 1.0, prior: np.ndarray | None = None,
                  prior_weight: float = 0.0, plan: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Score every next-token prediction of the raw causal projection (``A = M``).

    Parameters
    ----------
    docs : RaggedIds, (ids, offsets) or a list of 1-D id arrays
        Documents; negative ids are out of vocabulary (ids >= vocab_size are refused).
    S : sparse matrix or array, shape (vocab_size, vocab_size)
    temperature : float > 0
        ``p_t = softmax(e_t / temperature)``.
    prior, prior_weight
        Optional mixture ``(1 - w) p_t + w prior`` (prior: probabilities, shape (vocab_size,)).
    plan : optional
        ``causal_plan(S)`` for this S, to reuse across calls (built here when omitted).

    Notes
    -----
    Precision: the running evidence is float64, but the kernel streams S's values as float32
    and accumulates each block of 16 positions' increments in float32, and the exponentials
    are float32 (summed in float64). ``log p`` is therefore exact to about 1e-7 of the
    logits' magnitude (|e_t| / temperature), not to float64 round-off; a rank can differ
    from an exact computation only where another token ties the target to that precision.
    The generic path (:func:`causal_logits`, then the shared scorer) keeps the logits in float64.

    Returns
    -------
    logp : ndarray of float64, shape (n_tokens,)
        ``logp[t]`` = log-probability of token ``t+1`` given its document's prefix up to
        ``t``; NaN where there is no in-vocabulary next token in the same document.
    rank : ndarray of int64, shape (n_tokens,)
        Other tokens scoring at least as high as the target; -1 where logp is NaN.
    """
    # validated here: the compiled kernel trusts every id, shape and length it is given
    S = _checks.cooc_matrix(S, name="S")
    V = S.shape[0]
    docs = _checks.documents(docs, V, name="docs")
    temperature = _checks.positive_float(temperature, "temperature")
    prior = _checks.prior(prior, prior_weight, V)
    prior_weight = 0.0 if prior is None else float(prior_weight)
    if plan is None:
        plan = causal_plan(S)
    elif len(plan) != 3 or plan[0].shape[0] != S.nnz or plan[1].shape[0] != S.nnz or plan[2].shape[0] != V:
        raise ValueError(f"plan was not built by causal_plan for this S (vocab_size={V}); omit it or pass "
                         f"causal_plan(S)")
    return _causal_scores(docs, S, temperature, prior, prior_weight, plan)


def _causal_scores(docs: RaggedIds, S: sp.csr_array, temperature: float, prior: np.ndarray | None,
                   prior_weight: float, plan) -> tuple[np.ndarray, np.ndarray]:
    """:func:`causal_scores` on inputs already validated (by it, or by ProjectionPredictor)."""
    n = docs.n_tokens
    out_logp = np.full(n, np.nan)
    out_rank = np.full(n, -1, dtype=np.int64)
    prior_arr = np.zeros(0, np.float32) if prior is None else np.ascontiguousarray(prior, dtype=np.float32)
    indices, data32, col_starts = plan
    offsets = np.ascontiguousarray(docs.offsets)
    start_numba_threads()
    # longest documents first, handed out one at a time: no core idles on a long last one
    queue_ptr, queue = _balanced_queues(np.diff(offsets), nb.get_num_threads())
    _causal_kernel(np.ascontiguousarray(docs.ids, dtype=np.int32), offsets, queue_ptr, queue, S.indptr, indices,
                   S.data, data32, col_starts, float(temperature), prior_arr, float(prior_weight), out_logp, out_rank)
    return out_logp, out_rank


def _balanced_queues(lengths: np.ndarray, n_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents dealt to ``n_workers`` queues, longest first, each to the least-loaded queue
    (work ~ length), as ``(queue_ptr, queue)``: worker w takes ``queue[queue_ptr[w]:queue_ptr[w+1]]``.

    numba's OpenMP layer splits a ``prange`` into equal static ranges, so a plain loop over
    documents sorted by length would leave one core with all the long ones."""
    n_workers = max(1, min(int(n_workers), lengths.size))
    loads = [(0, w) for w in range(n_workers)]
    owner = np.empty(lengths.size, np.int64)
    for d in np.argsort(-lengths, kind="stable"):
        load, w = heapq.heappop(loads)
        owner[d] = w
        heapq.heappush(loads, (load + int(lengths[d]), w))
    queue = np.argsort(owner, kind="stable")
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_workers))]), queue
