"""The batched projection in torch, on the GPU when there is one (``device=None`` picks CUDA
if available, else the CPU).

S travels as its CSR arrays; the entries ``S[id_r, id_s]`` are found by a binary search
(``torch.searchsorted``) over the sorted keys ``row * vocab_size + col``, and the profile
rows ``S[id_r]`` are scattered into a dense (positions, vocab_size) block. Nothing forms a
vocab×vocab product. Results match :mod:`distattn.projection.batch` (float32 by default).

On the CPU the dense rows are written by a numba kernel, straight from the CSR arrays, into a
buffer the caller may reuse (:class:`Workspace`): the torch scatter's index arrays, one int64
per stored entry, and fresh blocks of hundreds of MB cost more in page faults than the
arithmetic (``benchmarks/bench_device_scorers.py``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp
import torch

from distattn.memory import check_memory
from distattn.projection import _checks
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES
from distattn.threads import start_numba_threads

__all__ = ["Workspace", "resolve_device", "torch_context_matrices", "torch_attention", "torch_vocabulary_evidence",
           "torch_global_evidence", "torch_causal_weights", "torch_causal_scores"]


def resolve_device(device=None) -> torch.device:
    """``None`` or ``"auto"``: CUDA when available, else CPU; otherwise ``torch.device(device)``."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _temperature(value, name: str, dtype: torch.dtype) -> float:
    """A temperature that divides scores of ``dtype``: in float32 (or a narrower type) one below
    the smallest normal number becomes a subnormal or 0 there, and the scores / τ came out NaN
    (an all-zero attention row after ``nan_to_num``, NaN log p); float64 takes any τ > 0."""
    tau = _checks.positive_float(value, name)
    if dtype.is_floating_point and dtype != torch.float64 and tau < torch.finfo(dtype).tiny:
        tiny = torch.finfo(dtype).tiny
        raise ValueError(f"{name}={value!r} is too small for {dtype} scores: below {tiny!r}, the smallest normal "
                         f"{dtype}, it rounds to a subnormal or to 0 there and the probabilities come out NaN; "
                         f"allowed: {name} >= {tiny!r}, or the computation in torch.float64")
    return tau


class Workspace:
    """Named flat buffers that grow as needed and are handed out again as views.

    A fresh tensor of hundreds of MB is paid for in page faults on first touch (the kernel
    zeroes every page), which on the CPU costs more than the block's arithmetic; the CUDA
    caching allocator reuses memory by itself, so this matters on the CPU only, but it is
    correct anywhere. A view's contents hold until the same name is asked for again.
    """

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` backed by buffer ``name``."""
        n = int(np.prod(shape, dtype=np.int64))
        device = torch.device(device)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device.type != device.type \
                or (device.index is not None and buf.device.index != device.index):
            self._buffers.pop(name, None)          # freed before the larger one is made
            buf = self._buffers[name] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(tuple(shape))

    def clear(self) -> None:
        self._buffers.clear()


@nb.njit(parallel=True, nogil=True, cache=True)
def _fill_dense_rows(ids, indptr, indices, data, out):
    """``out[r] = S[ids[r]]`` (a zero row where ``ids[r] < 0``), rows in parallel."""
    for r in nb.prange(ids.shape[0]):
        row = out[r]
        row[:] = 0
        v = ids[r]
        if v >= 0:
            for k in range(indptr[v], indptr[v + 1]):
                row[indices[k]] = data[k]


class _DeviceCSR:
    """S's CSR arrays and sorted keys on a device. ``S`` must be canonical (sorted, unrepeated
    column indices: the binary search needs sorted keys), as ``_checks.cooc_matrix`` returns it."""

    def __init__(self, S: sp.csr_array, device: torch.device, dtype: torch.dtype):
        self.vocab_size = S.shape[0]
        self.indptr = torch.as_tensor(S.indptr.astype(np.int64), device=device)
        self.indices = torch.as_tensor(S.indices.astype(np.int64), device=device)
        self.data = torch.as_tensor(S.data, device=device, dtype=dtype)
        rows = torch.repeat_interleave(torch.arange(self.vocab_size, device=device), self.indptr.diff())
        self.keys = rows * self.vocab_size + self.indices

    def lookup(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``S[rows, cols]`` elementwise (0 where nothing is stored); rows/cols >= 0."""
        query = rows * self.vocab_size + cols
        if self.keys.numel() == 0:
            return torch.zeros(query.shape, dtype=self.data.dtype, device=query.device)
        pos = torch.searchsorted(self.keys, query).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys[pos] == query, self.data[pos], torch.zeros((), dtype=self.data.dtype,
                                                                                  device=query.device))

    def dense_rows(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``S[ids]`` as a dense (..., vocab_size) block; zero rows where ``ids < 0``.

        ``out``: a tensor of that shape, dtype and device to write into (a :class:`Workspace`
        view, say); its contents are overwritten."""
        shape = (*ids.shape, self.vocab_size)
        if out is None:
            out = torch.empty(shape, dtype=self.data.dtype, device=ids.device)
        elif tuple(out.shape) != shape or out.dtype != self.data.dtype or out.device != ids.device \
                or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {self.data.dtype} tensor of shape {shape} on {ids.device}; "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        flat = ids.reshape(-1)
        block = out.view(flat.numel(), self.vocab_size)
        if flat.device.type == "cpu":
            start_numba_threads()
            _fill_dense_rows(flat.contiguous().numpy(), self.indptr.numpy(), self.indices.numpy(),
                             self.data.numpy(), block.numpy())
        else:
            self.scatter_rows(flat, block.zero_())
        return out

    def scatter_rows(self, flat: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """Write the stored entries of ``S[flat[r]]`` into ``block[r]`` for ``flat[r] >= 0`` (the
        rest of ``block`` is left as it is: zero it first), in torch on any device. The path for an
        accelerator; on the CPU its index arrays, one int64 per stored entry, cost more than the
        numba kernel."""
        known = torch.nonzero(flat >= 0).squeeze(1)
        starts = self.indptr[flat[known]]
        counts = self.indptr[flat[known] + 1] - starts
        row_of = torch.repeat_interleave(known, counts)
        first = torch.cumsum(counts, 0) - counts
        entry = torch.arange(int(counts.sum()), device=flat.device) - torch.repeat_interleave(first - starts, counts)
        block[row_of, self.indices[entry]] = self.data[entry]
        return block


def _padded(docs, device, max_length=None, drop_oov=False):
    """(ids (n, L) int64 with -1 at OOV/padding, lengths (n,), positions of the tokens)."""
    if drop_oov:
        docs = docs.drop(docs.ids >= 0)
    if max_length is not None:
        docs = docs.truncate(_checks.positive_int(max_length, "max_length"))
    lengths = docs.lengths
    L = int(lengths.max()) if lengths.size else 0
    tok_doc = np.repeat(np.arange(len(lengths)), lengths)
    tok_pos = np.arange(docs.n_tokens) - np.repeat(docs.offsets[:-1], lengths)
    ids = np.full((len(lengths), L), -1, dtype=np.int64)
    ids[tok_doc, tok_pos] = docs.ids
    return torch.as_tensor(ids, device=device), lengths, docs


def _context(csr: _DeviceCSR, ids: torch.Tensor) -> torch.Tensor:
    known = ids >= 0
    r = ids.clamp(min=0)
    M = csr.lookup(r[:, :, None].expand(-1, -1, ids.shape[1]), r[:, None, :].expand(-1, ids.shape[1], -1))
    return M * (known[:, :, None] & known[:, None, :])


def torch_context_matrices(documents, cooc, *, device=None, dtype: torch.dtype = torch.float32,
                           unk_id: int | None = None, max_length: int | None = None):
    """Padded M = Q S Qᵀ of every document.

    Returns
    -------
    M : Tensor (n_docs, length, length) on ``device``
    known : bool Tensor (n_docs, length), the in-vocabulary, non-padding positions
    """
    S = _checks.cooc_matrix(cooc)
    docs = _checks.documents(documents, S.shape[0], unk_id=unk_id)
    dev = resolve_device(device)
    ids, _, _ = _padded(docs, dev, max_length)
    return _context(_DeviceCSR(S, dev, dtype), ids), ids >= 0


def torch_attention(M: torch.Tensor, known: torch.Tensor, normalization: str = "none", *,
                    zero_rows: str = "uniform", attention_temperature: float = 1.0) -> torch.Tensor:
    """A from padded M, normalising rows over the ``known`` columns (as
    :func:`distattn.projection.batch.masked_attention`)."""
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    pair = known[:, :, None] & known[:, None, :]
    if normalization == "none":
        return M * pair
    if normalization == "softmax":
        tau = _temperature(attention_temperature, "attention_temperature", M.dtype)
        x = M.masked_fill(~pair, float("-inf"))
        if x.shape[-1]:     # the max first: M / τ overflowed to inf for a tiny τ or huge M, and nan_to_num zeroed the row
            top = x.amax(-1, keepdim=True)
            x = x - torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        A = torch.softmax(x / tau, dim=-1)
        return torch.nan_to_num(A, nan=0.0) * pair
    W = M * pair
    _checks.non_negative(W)
    sums = W.sum(-1, keepdim=True)
    A = W / torch.where(sums == 0, torch.ones_like(sums), sums)
    zero = (sums[..., 0] == 0) & known
    if zero_rows == "uniform":
        n_known = known.sum(1).clamp(min=1).to(A.dtype)
        A = A + (zero[:, :, None] & known[:, None, :]).to(A.dtype) / n_known[:, None, None]
    elif zero_rows == "self":
        A = A + zero[:, :, None] * torch.eye(M.shape[-1], dtype=A.dtype, device=A.device)
    return A


def torch_vocabulary_evidence(documents, cooc, *, normalization: str = "none", zero_rows: str = "uniform",
                              attention_temperature: float = 1.0, device=None,
                              dtype: torch.dtype = torch.float32, unk_id: int | None = None,
                              max_length: int | None = None) -> torch.Tensor:
    """E = A (QS) of every document, padded: Tensor (n_docs, length, vocab_size)."""
    S = _checks.cooc_matrix(cooc)
    docs = _checks.documents(documents, S.shape[0], unk_id=unk_id)
    dev = resolve_device(device)
    ids, _, _ = _padded(docs, dev, max_length)
    check_memory(2.0 * ids.numel() * S.shape[0] * torch.finfo(dtype).bits / 8,
                 f"the dense evidence ({tuple(ids.shape)} x {S.shape[0]})")
    csr = _DeviceCSR(S, dev, dtype)
    A = torch_attention(_context(csr, ids), ids >= 0, normalization, zero_rows=zero_rows,
                        attention_temperature=attention_temperature)
    return torch.bmm(A, csr.dense_rows(ids))


def torch_global_evidence(documents, cooc, *, normalization: str = "none", zero_rows: str = "uniform",
                          attention_temperature: float = 1.0, device=None, dtype: torch.dtype = torch.float32,
                          unk_id: int | None = None, max_length: int | None = None,
                          batch_size: int = 64) -> torch.Tensor:
    """e_global of every document: Tensor (n_docs, vocab_size), the mean over in-vocabulary
    positions of E's rows, computed as ``w (QS)`` with ``w = mean_r A[r, :]``."""
    S = _checks.cooc_matrix(cooc)
    docs = _checks.documents(documents, S.shape[0], unk_id=unk_id)
    dev = resolve_device(device)
    csr = _DeviceCSR(S, dev, dtype)
    out = torch.zeros(len(docs), S.shape[0], dtype=dtype, device=dev)
    batch_size = _checks.positive_int(batch_size, "batch_size")
    for start in range(0, len(docs), batch_size):       # a loop over batches of documents
        idx = np.arange(start, min(len(docs), start + batch_size))
        ids, _, _ = _padded(docs.take(idx), dev, max_length)
        if ids.shape[1] == 0:
            continue
        known = ids >= 0
        A = torch_attention(_context(csr, ids), known, normalization, zero_rows=zero_rows,
                            attention_temperature=attention_temperature)
        w = A.sum(1) / known.sum(1, keepdim=True).clamp(min=1).to(dtype)          # (b, L)
        out[start:start + idx.size] = torch.bmm(w[:, None, :], csr.dense_rows(ids))[:, 0]
    return out


def torch_causal_weights(M: torch.Tensor, normalization: str = "none", *,
                         zero_rows: str = "uniform", attention_temperature: float = 1.0) -> torch.Tensor:
    """Batched :func:`distattn.projection.causal.causal_weights` for padded M (n, L, L) whose
    documents hold only in-vocabulary tokens, padded at the end."""
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    L = M.shape[1]
    ar = torch.arange(L, device=M.device)
    lower = ar[:, None] >= ar[None, :]
    if normalization == "none":
        return torch.cumsum(M, 1) * lower
    if normalization == "row":
        _checks.non_negative(M)
        prefix = torch.cumsum(M, 2).transpose(1, 2)                     # [t, r]
        zero = (prefix == 0) & lower
        W = torch.where(lower & ~zero, 1.0 / torch.where(prefix == 0, torch.ones_like(prefix), prefix),
                        torch.zeros_like(prefix))
        C = torch.bmm(W, M)
        if zero_rows == "uniform":
            C = C + (zero.sum(2).to(C.dtype) / (ar + 1).to(C.dtype))[:, :, None]
        elif zero_rows == "self":
            C = C + zero.to(C.dtype)
        return C * lower
    tau = _temperature(attention_temperature, "attention_temperature", M.dtype)
    C = torch.zeros_like(M)
    for t in range(L):                                                  # prefixes, O(L) small kernels
        X = M[:, :t + 1, :t + 1]
        # the prefix's row max first: M / τ overflowed to inf (NaN weights) for a tiny τ or huge M
        C[:, t, :t + 1] = torch.softmax((X - X.amax(-1, keepdim=True)) / tau, -1).sum(1)
    return C


def torch_causal_scores(documents, cooc, *, normalization: str = "none", zero_rows: str = "uniform",
                        attention_temperature: float = 1.0, temperature: float = 1.0,
                        prior: np.ndarray | None = None, prior_weight: float = 0.0, device=None,
                        dtype: torch.dtype = torch.float32, unk_id: int | None = None,
                        batch_positions: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """The causal projection's next-token scores, computed in batches on ``device``.

    Same contract as :func:`distattn.projection.causal.causal_scores` (flat ``logp``/``rank``
    arrays aligned with the tokens; entry t scores token t+1), for any normalisation.
    """
    S = _checks.cooc_matrix(cooc)
    V = S.shape[0]
    docs = _checks.documents(documents, V, unk_id=unk_id)
    dev = resolve_device(device)
    csr = _DeviceCSR(S, dev, dtype)
    temperature = _temperature(temperature, "temperature", dtype)
    batch_positions = _checks.positive_int(batch_positions, "batch_positions")
    prior = _checks.prior(prior, prior_weight, V)
    prior_t = None if prior is None else torch.as_tensor(prior, device=dev, dtype=dtype)
    out_logp = np.full(docs.n_tokens, np.nan)
    out_rank = np.full(docs.n_tokens, -1, dtype=np.int64)
    # compressed (in-vocabulary) tokens and where they stand in the flat array
    known = docs.ids >= 0
    flat_pos = np.flatnonzero(known)
    comp = docs.drop(known)
    doc_start = np.repeat(docs.offsets[:-1], docs.lengths)[known]   # start of each known token's document
    order = np.argsort(comp.lengths, kind="stable")
    bounds = np.cumsum(np.maximum(comp.lengths[order], 1))
    chunk_starts = np.searchsorted(bounds, np.arange(0, bounds[-1] if bounds.size else 0, batch_positions))
    for c0, c1 in zip(chunk_starts, list(chunk_starts[1:]) + [order.size]):   # batches of documents
        sel = order[c0:c1]
        if sel.size == 0:
            continue
        ids, lengths, sub = _padded(comp.take(sel), dev)
        L = ids.shape[1]
        if L == 0:
            continue
        check_memory(2.0 * ids.numel() * V * 4, f"a causal batch of {ids.numel()} positions x {V}")
        M = _context(csr, ids)
        C = torch_causal_weights(M, normalization, zero_rows=zero_rows,
                                 attention_temperature=attention_temperature)
        logits = torch.bmm(C, csr.dense_rows(ids))
        logits -= logits.amax(-1, keepdim=True)     # before dividing: logits / τ overflowed to inf (NaN log p)
        logits /= (torch.arange(1, L + 1, device=dev, dtype=dtype) * temperature)[None, :, None]
        # prediction of compressed token j uses the prefix row j-1; j = 0 uses an empty prefix
        logits = torch.cat([torch.zeros(len(sel), 1, V, device=dev, dtype=dtype), logits[:, :-1]], 1)
        target = ids
        # flat index of each compressed token, then of the position that predicts it
        sub_flat = np.full(ids.shape, -1, dtype=np.int64)
        tok_doc = np.repeat(np.arange(len(sel)), lengths)
        tok_pos = np.arange(sub.n_tokens) - np.repeat(sub.offsets[:-1], lengths)
        comp_index = (comp.offsets[sel][tok_doc] + tok_pos)
        sub_flat[tok_doc, tok_pos] = flat_pos[comp_index]
        predictor_pos = sub_flat - 1
        valid = np.zeros(ids.shape, dtype=bool)
        valid[tok_doc, tok_pos] = flat_pos[comp_index] > doc_start[comp_index]   # not a document's first token
        v = torch.as_tensor(valid, device=dev)
        lp = torch.log_softmax(logits, -1)
        tgt = target.clamp(min=0)[..., None]
        logp_t = lp.gather(-1, tgt)[..., 0]
        if prior_t is None:
            rank = (logits >= logits.gather(-1, tgt)).sum(-1) - 1
        else:
            mix = (1 - prior_weight) * lp.exp() + prior_weight * prior_t
            pt = mix.gather(-1, tgt)
            rank = (mix >= pt).sum(-1) - 1
            logp_t = torch.log(pt[..., 0])
        out_logp[predictor_pos[valid]] = logp_t[v].double().cpu().numpy()
        out_rank[predictor_pos[valid]] = rank[v].cpu().numpy()
    return out_logp, out_rank
