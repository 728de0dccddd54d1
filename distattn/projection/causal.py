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

import math

import numba as nb
from llvmlite import ir as _ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
import numpy as np
import scipy.sparse as sp

from distattn.projection import _checks
from distattn.projection._scoring import FASTMATH, score_row
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES

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


_LANES = 8         # consecutive positions advanced together (one cache line of float64 per column);
                   # the vector helpers below work on groups of 8 lanes (_LANES a multiple of 8)
_NV = _LANES // 4  # <4 x double> vectors per column
_COL_BLOCK = 2048  # columns per cache block: _COL_BLOCK * _LANES * 8 bytes = 128 KB stays in L2


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


@intrinsic
def _scatter(typingctx, F, indices, data, q0, q1, wts, wb):
    """``F[k*L : k*L+L] += wts[wb : wb+L] * S[v, k]`` over the stored entries ``q0:q1`` of a row
    (L = _LANES), as vector FMAs with the weights held in registers.

    LLVM does not fuse the scalar updates itself (numba's indexing hides that the addresses
    are consecutive), and a scalar version is ~4x slower."""
    sig = types.void(F, indices, data, q0, q1, wts, wb)

    def codegen(context, builder, signature, args):
        f64, f32, i32, v4d, v8f, v4i = _vec_consts(builder)
        i64 = _ir.IntType(64)
        fary = context.make_array(signature.args[0])(context, builder, args[0])
        iary = context.make_array(signature.args[1])(context, builder, args[1])
        dary = context.make_array(signature.args[2])(context, builder, args[2])
        wary = context.make_array(signature.args[5])(context, builder, args[5])
        unsigned = not signature.args[1].dtype.signed
        fptr = builder.bitcast(fary.data, v4d.as_pointer())
        wptr = builder.bitcast(builder.gep(wary.data, [args[6]]), v4d.as_pointer())
        w = [builder.load(builder.gep(wptr, [_ir.Constant(i32, h)]), align=8) for h in range(_NV)]
        fma = cgutils.get_or_insert_function(builder.module, _ir.FunctionType(v4d, [v4d, v4d, v4d]), "llvm.fma.v4f64")
        q0 = args[3]
        with cgutils.for_range(builder, builder.sub(args[4], q0)) as loop:
            q = builder.add(q0, loop.index)
            col = builder.load(builder.gep(iary.data, [q]))
            col = builder.zext(col, i64) if unsigned else builder.sext(col, i64)
            s = _splat(builder, v4d, builder.load(builder.gep(dary.data, [q])))
            base = builder.mul(col, _ir.Constant(i64, _NV))
            for h in range(_NV):
                ptr = builder.gep(fptr, [builder.add(base, _ir.Constant(i64, h))])
                builder.store(builder.call(fma, [w[h], s, builder.load(ptr, align=8)]), ptr, align=8)
        return context.get_dummy_value()

    return sig, codegen


def _vec_consts(builder):
    f64, f32, i32 = _ir.DoubleType(), _ir.FloatType(), _ir.IntType(32)
    return f64, f32, i32, _ir.VectorType(f64, 4), _ir.VectorType(f32, 8), _ir.VectorType(_ir.IntType(64), 4)


def _splat(builder, vec_type, value):
    out = _ir.Constant(vec_type, _ir.Undefined)
    for c in range(vec_type.count):
        out = builder.insert_element(out, value, _ir.Constant(_ir.IntType(32), c))
    return out


def _load_lanes(context, builder, arrty, arr):
    """The _LANES float64 of a small array as _NV <4 x double>."""
    ary = context.make_array(arrty)(context, builder, arr)
    vptr = builder.bitcast(ary.data, _ir.VectorType(_ir.DoubleType(), 4).as_pointer())
    return [builder.load(builder.gep(vptr, [_ir.Constant(_ir.IntType(32), h)]), align=8) for h in range(_NV)], vptr


@intrinsic
def _lane_max(typingctx, F, k0, k1, m):
    """``m[c] = max(m[c], max_k F[k*L + c])`` for k in ``k0:k1`` (vectorised across the lanes)."""
    sig = types.void(F, k0, k1, m)

    def codegen(context, builder, signature, args):
        f64, f32, i32, v4d, v8f, v4i = _vec_consts(builder)
        fmax = cgutils.get_or_insert_function(builder.module, _ir.FunctionType(v4d, [v4d, v4d]), "llvm.maxnum.v4f64")
        ms, mptr = _load_lanes(context, builder, signature.args[3], args[3])
        acc = [cgutils.alloca_once_value(builder, mh) for mh in ms]
        fary = context.make_array(signature.args[0])(context, builder, args[0])
        fptr = builder.bitcast(fary.data, v4d.as_pointer())
        start = builder.mul(args[1], _ir.Constant(args[1].type, _NV))
        count = builder.sub(args[2], args[1])
        with cgutils.for_range(builder, count) as loop:
            base = builder.add(start, builder.mul(loop.index, _ir.Constant(loop.index.type, _NV)))
            for h in range(_NV):
                x = builder.load(builder.gep(fptr, [builder.add(base, _ir.Constant(base.type, h))]), align=8)
                builder.store(builder.call(fmax, [builder.load(acc[h]), x]), acc[h])
        for h in range(_NV):
            builder.store(builder.load(acc[h]), builder.gep(mptr, [_ir.Constant(i32, h)]), align=8)
        return context.get_dummy_value()

    return sig, codegen


_SKIP = 35.0  # exp(-35) = 6e-16
_EXP_CONSTS = [float(np.float32(c)) for c in (-87.0, 1.4426950408889634, 0.693145751953125, 1.428606765330187e-06,
                                               1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0)]


@intrinsic
def _lane_scores(typingctx, F, n, m, sc, tv, total, cnt):
    """Per lane c: ``total[c] = Σ_k exp((F[k*L+c] - m[c]) * sc[c])`` (the float32 exp of
    :func:`~distattn.projection._scoring.exp_neg`, 8-wide, summed in float64) and
    ``cnt[c] = #{k : F[k*L+c] >= tv[c]}``, in one pass over ``k < n``; the same pass then
    sets every lane of column k to its last lane (the next block's starting point), which
    saves the kernel a separate pass over F."""
    sig = types.void(F, n, m, sc, tv, total, cnt)

    def codegen(context, builder, signature, args):
        f64, f32, i32, v4d, v8f, v4i = _vec_consts(builder)
        v8i = _ir.VectorType(i32, 8)
        floor = cgutils.get_or_insert_function(builder.module, _ir.FunctionType(v8f, [v8f]), "llvm.floor.v8f32")
        fmax = cgutils.get_or_insert_function(builder.module, _ir.FunctionType(v8f, [v8f, v8f]), "llvm.maxnum.v8f32")
        fma = cgutils.get_or_insert_function(builder.module, _ir.FunctionType(v8f, [v8f, v8f, v8f]), "llvm.fma.v8f32")
        lo_hi = [_ir.Constant(i32, c) for c in range(8)]
        mv, _ = _load_lanes(context, builder, signature.args[2], args[2])
        sv, _ = _load_lanes(context, builder, signature.args[3], args[3])
        tvv, _ = _load_lanes(context, builder, signature.args[4], args[4])
        _, tot_ptr = _load_lanes(context, builder, signature.args[5], args[5])
        cary = context.make_array(signature.args[6])(context, builder, args[6])
        cnt_ptr = builder.bitcast(cary.data, v4i.as_pointer())
        zero_d = _ir.Constant(v4d, [0.0] * 4)
        zero_i = _ir.Constant(v4i, [0] * 4)
        tot = [cgutils.alloca_once_value(builder, zero_d) for _ in range(_NV)]
        cnt = [cgutils.alloca_once_value(builder, zero_i) for _ in range(_NV)]
        floor_c, log2e, ln2_hi, ln2_lo, *poly = [_ir.Constant(v8f, [c] * 8) for c in _EXP_CONSTS]
        half = _ir.Constant(v8f, [0.5] * 8)
        skip_c = _ir.Constant(v8f, [-_SKIP] * 8)
        fary = context.make_array(signature.args[0])(context, builder, args[0])
        fptr = builder.bitcast(fary.data, v4d.as_pointer())
        with cgutils.for_range(builder, args[1]) as loop:
            base = builder.mul(loop.index, _ir.Constant(loop.index.type, _NV))
            ptrs = [builder.gep(fptr, [builder.add(base, _ir.Constant(base.type, h))]) for h in range(_NV)]
            xs = [builder.load(ptr, align=8) for ptr in ptrs]
            last = builder.shuffle_vector(xs[-1], xs[-1], _ir.Constant(_ir.VectorType(i32, 4), [3] * 4))
            for ptr in ptrs:
                builder.store(last, ptr, align=8)
            for grp in range(_NV // 2):        # 8 lanes at a time
                ts = []
                for h in (2 * grp, 2 * grp + 1):
                    x = xs[h]
                    ge = builder.zext(builder.fcmp_ordered(">=", x, tvv[h]), v4i)
                    builder.store(builder.add(builder.load(cnt[h]), ge), cnt[h])
                    ts.append(builder.fptrunc(builder.fmul(builder.fsub(x, mv[h]), sv[h]), _ir.VectorType(f32, 4)))
                t = builder.shuffle_vector(ts[0], ts[1], _ir.Constant(v8i, lo_hi))
                # a column where all 8 lanes are below exp(-_SKIP) adds < vocab * 6e-16 to totals >= 1:
                # skip its exp (most columns, once a document is long enough to separate the logits)
                live = builder.fcmp_unordered(">", t, skip_c)   # NaN stays live: it propagates
                live = builder.icmp_unsigned("!=", builder.bitcast(live, _ir.IntType(8)),
                                             _ir.Constant(_ir.IntType(8), 0))
                with builder.if_then(live, likely=False):
                    _exp8_accumulate(builder, t, tot[2 * grp:2 * grp + 2], fmax, floor, fma, floor_c, log2e, ln2_hi,
                                     ln2_lo, half, poly, v8i, v4d, i32, lo_hi)
        for h in range(_NV):
            builder.store(builder.load(tot[h]), builder.gep(tot_ptr, [_ir.Constant(i32, h)]), align=8)
            builder.store(builder.load(cnt[h]), builder.gep(cnt_ptr, [_ir.Constant(i32, h)]), align=8)
        return context.get_dummy_value()

    return sig, codegen


def _exp8_accumulate(builder, t, tot, fmax, floor, fma, floor_c, log2e, ln2_hi, ln2_lo, half, poly, v8i, v4d, i32,
                     lo_hi):
    """``tot[h] += fpext(exp(t)[4h:4h+4])`` for a <8 x float> t <= 0: the Cody-Waite exp of
    :mod:`distattn.projection._scoring` (clamped at -87, degree-6 polynomial, 2^k by bits)."""
    v8f = t.type
    t = builder.call(fmax, [t, floor_c])
    k = builder.call(floor, [builder.fadd(builder.fmul(t, log2e), half)])
    r = builder.fsub(builder.fsub(t, builder.fmul(k, ln2_hi)), builder.fmul(k, ln2_lo))
    p = poly[0]
    for c in poly[1:]:
        p = builder.call(fma, [r, p, c])
    p = builder.call(fma, [r, p, poly[-1]])          # 1 + r (1 + r (1/2 + ...))
    pow2 = builder.bitcast(builder.shl(builder.add(builder.fptosi(k, v8i), _ir.Constant(v8i, [127] * 8)),
                                       _ir.Constant(v8i, [23] * 8)), v8f)
    e = builder.fmul(p, pow2)
    for h in range(2):
        part = builder.shuffle_vector(e, e, _ir.Constant(_ir.VectorType(i32, 4), lo_hi[4 * h:4 * h + 4]))
        builder.store(builder.fadd(builder.load(tot[h]), builder.fpext(part, v4d)), tot[h])



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
def _causal_kernel(ids, offsets, order, indptr, indices, data, col_starts, scale, prior, prior_weight,
                   out_logp, out_rank):
    """Blocks of ``_LANES`` consecutive positions share one pass over the rows of S they touch.

    ``F[k * L + b]`` holds the evidence after position ``b`` of the block. Each prefix type
    whose row enters the block gets a slot with its *cumulative* weights over the lanes
    (``wts[slot * L + b]`` = its total coefficient added by positions ``<= b``), so a stored
    entry ``S[v, k]`` updates one cache line ``F[k*L : k*L+L]`` for all lanes at once: a row
    touched by most positions (frequent words) is streamed once per block instead of once
    per position. Columns are processed in L2-sized blocks, and the block's positions are
    scored together (max, rank count and log-sum-exp vectorise across lanes)."""
    L = _LANES
    V = indptr.size - 1
    n_cols = V  # S is square (vocab x vocab)
    n_cb = col_starts.shape[1] - 1
    with_prior = prior_weight > 0.0
    for jd in nb.prange(order.size):
        d = order[jd]
        start, stop = offsets[d], offsets[d + 1]
        if stop - start < 2:
            continue
        F = np.zeros(n_cols * L)
        g = np.zeros(V)
        h = np.zeros(V, np.int32)
        slot = np.full(V, -1, np.int32)
        slot_v = np.empty(V, np.int32)
        wts = np.empty(V * L)
        tgt = np.empty(L, np.int64)
        lane_scale = np.empty(L)
        m = np.empty(L)
        tv = np.empty(L)
        total = np.empty(L)
        cnt = np.empty(L, np.int64)
        row = np.empty(n_cols if with_prior else 0)
        work = np.empty(n_cols if with_prior else 0, np.float32)
        bits = np.empty(n_cols if with_prior else 0, np.int32)
        n_known = 0
        carried = True  # every column's lanes already hold the same value (the scoring pass sets them)
        for t0 in range(start, stop - 1, L):
            # 1. the coefficients each position adds (sequential: h and g evolve)
            n_slots = 0
            any_target = False
            for b in range(L):
                t = t0 + b
                tgt[b] = -1
                lane_scale[b] = scale
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
                    lane_scale[b] = scale / n_known if n_known > 0 else scale
                    any_target = True
            for sl in range(n_slots):
                slot[slot_v[sl]] = -1
            # 2. F for every lane, one L2-sized column block at a time
            for b in range(L):
                m[b] = -np.inf
            for cb in range(n_cb):
                k0 = cb * _COL_BLOCK
                k1 = min(k0 + _COL_BLOCK, n_cols)
                if not carried:
                    for k in range(k0, k1):      # every lane starts from the previous block's last
                        last = F[k * L + L - 1]
                        for c in range(L):
                            F[k * L + c] = last
                for sl in range(n_slots):
                    v = slot_v[sl]
                    _scatter(F, indices, data, col_starts[v, cb], col_starts[v, cb + 1], wts, sl * L)
                _lane_max(F, k0, k1, m)
            carried = False
            if not any_target:
                continue
            # 3. score the block's positions
            if with_prior:
                for b in range(L):
                    if tgt[b] >= 0:
                        for k in range(n_cols):
                            row[k] = F[k * L + b]
                        lp, rk = score_row(row, lane_scale[b], tgt[b], prior, prior_weight, work, bits)
                        out_logp[t0 + b] = lp
                        out_rank[t0 + b] = rk
                continue
            for b in range(L):
                tv[b] = F[max(tgt[b], 0) * L + b]
            _lane_scores(F, n_cols, m, lane_scale, tv, total, cnt)   # also carries F to the next block
            carried = True
            for b in range(L):
                if tgt[b] >= 0:
                    out_logp[t0 + b] = (tv[b] - m[b]) * lane_scale[b] - math.log(total[b])
                    out_rank[t0 + b] = max(cnt[b] - 1, 0)


def causal_plan(S: sp.csr_array) -> tuple[np.ndarray, np.ndarray]:
    """The per-S tables of :func:`causal_scores`: S's column indices (2-byte when they fit)
    and where each row's column blocks start. Build once per S and pass as ``plan=``."""
    # The kernel streams ~1e5 stored entries of S per position on a realistic PPMI and is
    # bound by memory traffic: 2-byte column indices (when they fit) make it ~1.3x faster.
    indices = S.indices.astype(np.uint16) if S.shape[1] <= 1 << 16 else S.indices
    return indices, _column_block_starts(S.indptr, indices, S.shape[1], _COL_BLOCK)


def causal_scores(docs, S: sp.csr_array, *, temperature: float = 1.0, prior: np.ndarray | None = None,
                  prior_weight: float = 0.0, plan: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
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
    plan : optional
        ``causal_plan(S)`` for this S, to reuse across calls (built here when omitted).

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
    indices, col_starts = causal_plan(S) if plan is None else plan
    offsets = np.ascontiguousarray(docs.offsets)
    # longest documents first, handed out one at a time: no core idles on a long last one
    order = np.argsort(-np.diff(offsets), kind="stable")
    previous = nb.set_parallel_chunksize(1)
    try:
        _causal_kernel(np.ascontiguousarray(docs.ids, dtype=np.int32), offsets, order, S.indptr, indices, S.data,
                       col_starts, 1.0 / temperature, prior_arr, float(prior_weight), out_logp, out_rank)
    finally:
        nb.set_parallel_chunksize(previous)
    return out_logp, out_rank
