"""Projection variants and n-gram baselines scored causally on a torch device (GPU if present),
in batches of documents: the engine behind the IMDB next-token table
(``analyses/projection_vs_ngrams.py``) and ``python -m distattn.compare``.

Every class implements ``score_next_tokens(docs, temperature=...)`` (and n-grams
``next_token_logits``) for :func:`distattn.projection.evaluate_next_token` and
:func:`distattn.projection.fit_temperature`; each is checked against the library's numpy
definitions by the table script and the tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings

import numpy as np
import scipy.sparse as sp

from distattn.projection import _checks
from distattn.projection.nexttoken import _score_block

__all__ = ["causal_layout", "CausalProjection", "Symmetric", "Positional", "Asymmetric", "MultiHead", "DeviceNgram"]



def causal_layout(docs, batch_positions: int):
    """Batches of documents, their in-vocabulary tokens packed to the left.

    Yields ``(ids, pos, d, j, flat)``: ids (b, L) int64 in-vocabulary ids (-1 padding), pos
    (b, L) their absolute positions in the document, and for every prediction to make, the
    batch row d, the packed index j of the target token (predicted from the prefix of packed
    tokens ``< j``) and the flat index of the predicting position (target's flat index - 1).
    A document's first token is never a target; a target whose prefix holds no in-vocabulary
    token is predicted from an empty prefix (uniform), as in the library.
    """
    lengths = docs.lengths
    doc_of = np.repeat(np.arange(len(docs)), lengths)
    position = np.arange(docs.n_tokens) - docs.offsets[:-1][doc_of]
    known = docs.ids >= 0
    kflat = np.flatnonzero(known)
    kdoc, kpos, kid = doc_of[known], position[known], docs.ids[known].astype(np.int64)
    klen = np.bincount(kdoc, minlength=len(docs))
    kj = np.arange(kflat.size) - np.concatenate([[0], np.cumsum(klen)])[kdoc]
    target = kpos > 0
    order = np.argsort(klen, kind="stable")
    order = order[klen[order] > 0]
    bounds = np.cumsum(klen[order])
    starts = np.searchsorted(bounds, np.arange(0, bounds[-1] if bounds.size else 0, batch_positions), side="right")
    starts = np.unique(starts)
    row_of = np.full(len(docs), -1)
    for a, b in zip(starts, list(starts[1:]) + [order.size]):
        sel = order[a:b]
        if sel.size == 0:
            continue
        row_of[:] = -1
        row_of[sel] = np.arange(sel.size)
        row = row_of[kdoc]
        mine = row >= 0
        L = int(klen[sel].max())
        ids = np.full((sel.size, L), -1, dtype=np.int64)
        pos = np.zeros((sel.size, L), dtype=np.int64)
        ids[row[mine], kj[mine]] = kid[mine]
        pos[row[mine], kj[mine]] = kpos[mine]
        v = mine & target
        yield ids, pos, row[v], kj[v], kflat[v] - 1


def _docs_key(docs) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(docs.ids, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(docs.offsets, dtype=np.int64).tobytes())
    return h.hexdigest()


class CausalProjection:
    """A projection variant scored causally on a torch device, in batches of documents.

    Subclasses give ``block_sums(ids, pos)``: (b, L, V) with row t = Σ_{s≤t} C[t, s] value_s,
    ``C[t, s] = Σ_{r≤t} A⁽ᵗ⁾[r, s]`` (``torch_causal_weights``); e_t is that over t + 1.

    Implements ``score_next_tokens`` for :func:`evaluate_next_token`. Inside ``caching()``
    the logits of one document set are kept on the device, so ``fit_temperature`` (which
    re-scores the validation set ~20 times) computes the projection once. The (b, L, V)
    blocks are written into reused buffers (``work``, a :class:`~distattn.projection.torch_ops.Workspace`),
    which spares the CPU a page fault per 4 KiB of every fresh block.
    """

    def __init__(self, vocab_size: int, device, batch_positions: int = 8192):
        self.vocab_size = vocab_size
        self.device = device
        self.batch_positions = batch_positions
        self._caching = False
        self._cache = None
        self.offset = None          # optional (V,) tensor added to e_t / τ (log unigram: a product of experts)
        from distattn.projection.torch_ops import Workspace
        self.work = Workspace()

    def block_sums(self, ids, pos):
        raise NotImplementedError

    def _rows(self, ids):
        """S[ids] (b, L, V) in the workspace (``self.csr``'s S)."""
        return self.csr.dense_rows(ids, out=self.work.get("rows", (*ids.shape, self.vocab_size), self.csr.data.dtype,
                                                           ids.device))

    def _bmm(self, C, D):
        """C @ D (b, L, V) in the workspace, valid until the next block; D (b, K, V), or (K, V) shared."""
        import torch
        out = self.work.get("sums", (C.shape[0], C.shape[1], D.shape[-1]), D.dtype, D.device)
        return torch.bmm(C, D, out=out) if D.dim() == 3 else torch.matmul(C, D, out=out)

    def _blocks(self, docs, reuse: bool = False):
        """(flat, target, x, rank) per batch: x (n, V) the evidence e_t of each prediction, rank
        None on the CPU (scored later, with log p). ``reuse``: x lives in the workspace, valid
        until the next batch (not for the cache)."""
        import torch
        for ids, pos, d, j, flat in causal_layout(docs, self.batch_positions):
            ids_t = torch.as_tensor(ids, device=self.device)
            F = self.block_sums(ids_t, torch.as_tensor(pos, device=self.device))
            d_t = torch.as_tensor(d, device=self.device)
            src = torch.as_tensor(j - 1, device=self.device)
            rows = d_t * F.shape[1] + src.clamp(min=0)
            F = F.reshape(-1, F.shape[-1])
            x = torch.index_select(F, 0, rows, out=self.work.get("x", (rows.numel(), F.shape[1]), F.dtype, F.device)) \
                if reuse else F[rows]
            del F
            x /= (src.clamp(min=0) + 1).to(x.dtype)[:, None]
            x[src < 0] = 0.0
            tgt = ids_t[d_t, torch.as_tensor(j, device=self.device)]
            rank = None if x.device.type == "cpu" else ((x >= x.gather(1, tgt[:, None])).sum(1) - 1).cpu().numpy()
            yield flat, tgt, x, rank

    @contextlib.contextmanager
    def caching(self):
        """Keep the evidence of one document set while inside (a generator, not a class made per
        call: such a class is freed only by the cycle collector, and the model with it)."""
        self._caching = True
        try:
            yield self
        finally:
            self._caching, self._cache = False, None
            if str(self.device).startswith("cuda"):
                import torch
                torch.cuda.empty_cache()

    def cached_blocks(self, docs):
        key = _docs_key(docs)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, list(self._blocks(docs)))
        return self._cache[1]

    def logit_scale(self, docs) -> float:
        """Median over positions of the standard deviation of e_t (for τ's search bounds)."""
        import torch
        stds = torch.cat([x.std(dim=1) for _, _, x, _ in self.cached_blocks(docs)])
        return float(stds.median())

    def score_next_tokens(self, docs, *, temperature=1.0, prior=None, prior_weight=0.0):
        import torch

        from distattn.projection.torch_ops import _temperature
        if prior is not None and prior_weight > 0:
            raise ValueError("priors are not supported by this scorer")
        logp = np.full(docs.n_tokens, np.nan)
        rank = np.full(docs.n_tokens, -1, dtype=np.int64)
        blocks = self.cached_blocks(docs) if self._caching else self._blocks(docs, reuse=True)
        for flat, tgt, x, rk in blocks:
            _temperature(temperature, "temperature", x.dtype)
            if self.offset is None and x.device.type == "cpu":     # one fused pass, no (n, V) temporaries
                logp[flat], rank[flat] = _score_block(x.numpy(), tgt.numpy(), temperature, None, 0.0)
                continue
            z = (x - x.amax(1, keepdim=True)) / temperature   # the max first: x / τ overflowed to inf (NaN log p)
            if self.offset is not None:          # product of experts: e_t / τ + log p_unigram
                z = z + self.offset
            if self.offset is not None or rk is None:
                rk = ((z >= z.gather(1, tgt[:, None])).sum(1) - 1).cpu().numpy()
            lp = torch.log_softmax(z, dim=1).gather(1, tgt[:, None])[:, 0]
            logp[flat] = lp.double().cpu().numpy()
            rank[flat] = rk
        return logp, rank


def _matrix(S, vocab_size):
    """S checked at the scorers' boundary, as the library's functions check it: square, of the
    vocabulary's size, finite, canonical (the binary search over its keys needs sorted, unrepeated
    column indices; a matrix left unsorted by a sum or product was silently misread)."""
    return _checks.cooc_matrix(S, vocab_size, name="S")


def _torch_csr(S, device):
    import torch

    from distattn.projection.torch_ops import _DeviceCSR
    return _DeviceCSR(S, device, torch.float32)


class Symmetric(CausalProjection):
    """M = Q S Qᵀ, A = M / Norm(M) / softmax(M/τ_att), values QS."""

    def __init__(self, S, normalization, vocab_size, device, attention_temperature=1.0, **kw):
        super().__init__(vocab_size, device, **kw)
        self.csr = _torch_csr(_matrix(S, vocab_size), device)
        self.normalization, self.tau_att = normalization, attention_temperature

    def block_sums(self, ids, pos):
        from distattn.projection.torch_ops import _context, torch_causal_weights
        C = torch_causal_weights(_context(self.csr, ids), self.normalization, attention_temperature=self.tau_att)
        return self._bmm(C, self._rows(ids))


class Positional(CausalProjection):
    """M' = (Q+P) S (Q+P)ᵀ, A = Norm(M'), values (Q+P) S, P[r] = λ π_r (absolute positions).

    An OOV token drops out entirely, as in the other scorers: its row and column of M' and its value
    row are zero, its position's P row included. :func:`~distattn.projection.positional_context_matrix`
    keeps an OOV token's P row instead (its position exists, its Q row is zero), so the two agree on
    in-vocabulary documents only."""

    def __init__(self, S, pi, scale, vocab_size, device, **kw):
        import torch
        super().__init__(vocab_size, device, **kw)
        S = _matrix(S, vocab_size)
        self.csr = _torch_csr(S, device)
        _checks.real(pi, "distributions")
        pi = sp.csr_array(pi, dtype=np.float64)           # sparse or array-like, as CorpusPositional takes it
        if pi.ndim != 2 or pi.shape[1] != vocab_size:
            raise ValueError(f"distributions must have shape (max_length, vocab_size={vocab_size}); got {pi.shape}")
        _checks.finite(pi, "distributions")
        P = torch.as_tensor(pi.toarray() * scale, dtype=torch.float32, device=device)         # (Lmax, V)
        St = _torch_sparse(S, device)
        Stt = _torch_sparse(_matrix(S.T, vocab_size), device)
        self.PS = (Stt @ P.T.contiguous()).T.contiguous()            # P S   : [r, j] = Σ_v P[r, v] S[v, j]
        self.PSt = (St @ P.T.contiguous()).T.contiguous()            # P Sᵀ  : [s, i] = Σ_v P[s, v] S[i, v]
        self.PSP = self.PS @ P.T                        # P S Pᵀ

    def block_sums(self, ids, pos):
        import torch

        from distattn.projection.torch_ops import _context, torch_causal_weights
        last = int(pos.max()) if pos.numel() else -1
        if last >= self.PS.shape[0]:        # else an IndexError deep in the gathers (a device-side assert on CUDA)
            raise ValueError(f"a document has a token at position {last} (counting from 0); the positional "
                             f"distributions cover {self.PS.shape[0]} positions (recompute positional_distributions "
                             f"with max_length >= {last + 1}, or truncate the documents)")
        known = ids >= 0
        k = ids.clamp(min=0)
        M = _context(self.csr, ids)
        M = M + self.PSt[pos[:, None, :], k[:, :, None]]       # Q S Pᵀ [r, s] = (P Sᵀ)[p_s, id_r]
        M = M + self.PS[pos[:, :, None], k[:, None, :]]        # P S Qᵀ [r, s] = (P S)[p_r, id_s]
        M = M + self.PSP[pos[:, :, None], pos[:, None, :]]     # P S Pᵀ
        M = M * (known[:, :, None] & known[:, None, :])
        values = self._rows(ids)
        shift = self.work.get("positional", values.shape, values.dtype, values.device)
        torch.index_select(self.PS, 0, pos.reshape(-1), out=shift.view(-1, self.vocab_size))
        values += shift.mul_(known[..., None])                  # + (P S)[p_r] at in-vocabulary tokens
        return self._bmm(torch_causal_weights(M, "row"), values)


def _torch_sparse(S, device):
    import torch
    with warnings.catch_warnings():       # not the caller's filters: theirs would lose every "sparse" warning
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")   # torch's beta / invariant-check notices
        return torch.sparse_csr_tensor(torch.as_tensor(S.indptr.astype(np.int64)),
                                       torch.as_tensor(S.indices.astype(np.int64)),
                                       torch.as_tensor(S.data, dtype=torch.float32), size=S.shape).to(device)


class Asymmetric(CausalProjection):
    """M_dir = Q W_Q W_Kᵀ Qᵀ, A = softmax(M_dir / τ_att); values QS (``S`` given) or Q W_Q W_Kᵀ."""

    def __init__(self, W_Q, W_K, vocab_size, device, S=None, attention_temperature=1.0, **kw):
        import torch
        super().__init__(vocab_size, device, **kw)
        shapes = [tuple(np.shape(W_Q)), tuple(np.shape(W_K))]
        if len(shapes[0]) != 2 or shapes[0] != shapes[1] or shapes[0][0] != vocab_size:
            # a mismatch surfaced later as a torch shape or index error inside the scoring
            raise ValueError(f"W_Q and W_K must both have shape (vocab_size={vocab_size}, r); got {shapes[0]} "
                             f"and {shapes[1]}")
        _checks.real(W_Q, "W_Q")
        _checks.real(W_K, "W_K")
        self.WQ = torch.as_tensor(W_Q, dtype=torch.float32, device=device)
        self.WK = torch.as_tensor(W_K, dtype=torch.float32, device=device)
        for name, W in (("W_Q", self.WQ), ("W_K", self.WK)):
            if not bool(torch.isfinite(W).all()):
                raise ValueError(f"{name} must be finite; it holds NaN or inf")
        self.csr = None if S is None else _torch_csr(_matrix(S, vocab_size), device)
        self.tau_att = attention_temperature

    def block_sums(self, ids, pos):
        import torch

        from distattn.projection.torch_ops import torch_causal_weights
        m = (ids >= 0)[..., None].float()
        k = ids.clamp(min=0)
        q, key = self.WQ[k] * m, self.WK[k] * m
        C = torch_causal_weights(torch.bmm(q, key.transpose(1, 2)), "softmax", attention_temperature=self.tau_att)
        if self.csr is not None:
            return self._bmm(C, self._rows(ids))
        return self._bmm(torch.bmm(C, q), self.WK.T)


class MultiHead(CausalProjection):
    """Σ_i Attn⁽ⁱ⁾ (Q S⁽ⁱ⁾), S⁽ⁱ⁾ = A_i B_iᵀ, Attn⁽ⁱ⁾ from M⁽ⁱ⁾ = Q S⁽ⁱ⁾ Qᵀ (``multihead_evidence``)."""

    def __init__(self, heads, normalization, vocab_size, device, attention_temperature=1.0, **kw):
        import torch

        from distattn.projection.multihead import _check_heads
        super().__init__(vocab_size, device, **kw)
        heads = _check_heads(heads)
        if heads[0].vocab_size != vocab_size:    # scored silently over the heads' own vocabulary instead
            raise ValueError(f"the heads cover a vocabulary of {heads[0].vocab_size} words, not "
                             f"vocab_size={vocab_size}")
        self.heads = [(torch.as_tensor(h.query, dtype=torch.float32, device=device),
                       torch.as_tensor(h.key, dtype=torch.float32, device=device)) for h in heads]
        self.keys = torch.cat([b for _, b in self.heads], 1)
        self.normalization, self.tau_att = normalization, attention_temperature

    def block_sums(self, ids, pos):
        import torch

        from distattn.projection.torch_ops import torch_causal_weights
        m = (ids >= 0)[..., None].float()
        k = ids.clamp(min=0)
        Z = []
        for A, B in self.heads:  # a loop over heads
            a, b = A[k] * m, B[k] * m
            C = torch_causal_weights(torch.bmm(a, b.transpose(1, 2)), self.normalization,
                                     attention_temperature=self.tau_att)
            Z.append(torch.bmm(C, a))
        return self._bmm(torch.cat(Z, -1), self.keys.T)


class DeviceNgram:
    """A fitted UnigramLM / KneserNeyLM whose log-probabilities are computed on a torch device
    (the library's formulas, vectorised per document; checked against the library)."""

    def __init__(self, model, device):
        import torch
        self.model, self.device = model, device
        self.vocab_size = model.vocab_size_
        if hasattr(model, "log_prob_"):
            self.logp = torch.as_tensor(model.log_prob_, dtype=torch.float32, device=device)
            return
        self.unigram = torch.as_tensor(model.unigram_, dtype=torch.float32, device=device)
        self.levels = [self._level(model.middle_)] + ([self._level(model.top_)] if model.order == 3 else [])

    def _level(self, level):
        import torch
        c = level.counts
        data = np.maximum(c.data - level.discount, 0.0) * np.repeat(level.inv_total, np.diff(c.indptr))
        t = lambda a, dt=None: torch.as_tensor(a, dtype=dt, device=self.device)  # noqa: E731
        return (t(c.indptr.astype(np.int64)), t(c.indices.astype(np.int64)), t(data, torch.float32),
                t(level.backoff, torch.float32))

    def _apply(self, level, rows, lower):
        import torch
        indptr, indices, data, backoff = level
        rows_t = torch.as_tensor(rows, device=self.device)
        seen = rows_t >= 0
        r = rows_t.clamp(min=0)
        out = lower * torch.where(seen, backoff[r], torch.ones((), device=self.device))[:, None]
        which = torch.nonzero(seen).squeeze(1)
        starts = indptr[r[which]]
        counts = indptr[r[which] + 1] - starts
        row_of = torch.repeat_interleave(which, counts)
        first = torch.cumsum(counts, 0) - counts
        entry = torch.arange(int(counts.sum()), device=self.device) - torch.repeat_interleave(first - starts, counts)
        out.index_put_((row_of, indices[entry]), data[entry], accumulate=True)
        return out

    def next_token_logits(self, token_ids):
        import torch
        ids = np.asarray(token_ids, dtype=np.int64)
        n = ids.size
        if hasattr(self, "logp"):
            return self.logp.expand(n, self.vocab_size)
        p = self._apply(self.levels[0], ids, self.unigram.expand(n, self.vocab_size))
        if len(self.levels) == 2:
            prev = np.concatenate([[-1], ids[:-1]])
            p = self._apply(self.levels[1], self.model._context_rows(prev, ids), p)
        return torch.log(p)
