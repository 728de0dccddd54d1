"""Torch LMs under the shared next-token metric (:mod:`distattn.projection.nexttoken`).

:class:`NextTokenScorer` adapts a causal LM to the evaluator's protocol, so a torch model, the
projection predictor and the n-gram baselines are scored by the same code:

* ``score_next_tokens(documents, temperature, prior, prior_weight)`` — the evaluator's fused
  path: batched windows on the model's device, returning flat ``(logp, rank)`` arrays;
* ``next_token_logits(token_ids)`` — the per-document path (used when a prior is mixed in).

Each document is scored as ``[bos] + doc`` (the training stream of :class:`LMData` puts ``bos``
before every document), so the first prediction, of token 1 from token 0, sees exactly the
prefix. Documents longer than the model's ``max_len`` are scored with overlapping windows: every
prediction beyond the first window has at least ``max_len - stride`` tokens of context.
"""

from __future__ import annotations

import numpy as np
import torch

from distattn.models.precision import at_least_float32
from distattn.train.data import _check_count, _check_special
from distattn.train.tasks import tf32_matmuls

__all__ = ["NextTokenScorer", "evaluate_lm", "SCORING_PRECISIONS"]

SCORING_PRECISIONS = ("tf32", "fp32", "bf16")


class NextTokenScorer:
    """Wrap ``model`` (``model(ids) -> logits (B, T, V)``, a ``config.max_len``) for the next-token evaluator.

    Parameters
    ----------
    model : causal LM (:class:`~distattn.models.TransformerLM`, :class:`~distattn.models.ProjectionMatchedLM`)
    bos_id : int
        Prepended to every document (0: the ``<pad>`` id that :class:`LMData` uses).
    oov_id : int, default 1
        Replaces negative (OOV) context ids; 1 is the vocabulary's ``<unk>``.
    stride : int, optional
        New predictions per extra window for long documents (default ``max_len // 2``).
    batch_size : int
        Windows per forward pass.
    device : torch.device or str, optional
        Where the windows run; default the model's device.
    precision : {"tf32", "fp32", "bf16"}
        On CUDA: float32 with TF32 matmuls (the default, what the trainer uses), strict float32, or
        bf16 autocast (which blurs ranks with ties). Set for the scoring itself, so the figures do
        not depend on what ran before in the process. The CPU computes float32 for all three.
    """

    def __init__(self, model, *, bos_id: int = 0, oov_id: int = 1, stride: int | None = None, batch_size: int = 64,
                 device=None, precision: str = "tf32"):
        if not getattr(model.config, "causal", True):
            raise ValueError(f"next-token scoring needs a causal model; {type(model).__name__} has causal=False "
                             f"(a bidirectional model sees the token it would predict)")
        self.model = model
        self.max_len = int(model.config.max_len)
        self.vocab_size = int(model.config.vocab_size)
        _check_special(bos_id, "bos_id", self.vocab_size)
        _check_special(oov_id, "oov_id", self.vocab_size)
        self.bos_id, self.oov_id = bos_id, oov_id
        self.stride = max(1, self.max_len // 2) if stride is None else _check_count(stride, "stride")
        if not 1 <= self.stride <= self.max_len - 1 and self.max_len > 1:
            raise ValueError(f"stride must be in [1, max_len - 1 = {self.max_len - 1}]; got {self.stride}")
        if precision not in SCORING_PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(map(repr, SCORING_PRECISIONS))}; got {precision!r}")
        self.batch_size, self.precision = _check_count(batch_size, "batch_size"), precision
        self.device = torch.device(device) if device is not None else next(model.parameters()).device

    def _windows(self, docs):
        """(doc, window start in x = [bos]+doc, first scored row, stop row) for every window."""
        out = []
        W, s = self.max_len, self.stride
        for d, L in enumerate(docs.lengths):
            L = int(L)
            if L < 2:
                continue
            n_rows = L                     # x has L + 1 tokens; rows 1..L-1 predict doc tokens 1..L-1
            a = 0
            out.append((d, 0, 1, min(W, n_rows)))
            end = min(W, n_rows)
            while end < n_rows:
                a = end + s - W if end + s <= n_rows else n_rows - W
                a = max(a, 0)
                out.append((d, a, end, min(a + W, n_rows)))
                end = min(a + W, n_rows)
        return out

    @torch.no_grad()
    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        with tf32_matmuls(self.precision == "tf32"):
            if self.precision == "bf16" and self.device.type == "cuda":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = self.model(ids)
            else:
                out = self.model(ids)
        return at_least_float32(out)          # float32 (also for bf16 logits); float64 for a float64 model

    @torch.no_grad()
    def score_next_tokens(self, documents, *, temperature: float = 1.0, prior=None, prior_weight: float = 0.0):
        if prior is not None and prior_weight > 0:
            return NotImplemented            # the evaluator then mixes the prior itself, per document
        ids_all = np.asarray(documents.ids, dtype=np.int64)
        offsets = np.asarray(documents.offsets)
        logp = np.full(len(ids_all), np.nan)
        rank = np.full(len(ids_all), -1, dtype=np.int64)
        windows = self._windows(documents)
        windows.sort(key=lambda w: -(w[3] - w[1]))           # similar lengths together
        for start in range(0, len(windows), self.batch_size):
            chunk = windows[start:start + self.batch_size]
            T = max(w[3] - w[1] for w in chunk)
            x = np.full((len(chunk), T + 1), self.bos_id, dtype=np.int64)     # +1 column: targets
            for r, (d, a, _, stop) in enumerate(chunk):
                doc = ids_all[offsets[d]:offsets[d + 1]]
                xd = np.concatenate([[self.bos_id], doc])
                seg = xd[a:stop + 1]
                x[r, : len(seg)] = seg
            inputs = x[:, :T].copy()
            inputs[inputs < 0] = self.oov_id
            z = self._logits(torch.from_numpy(inputs).to(self.device))
            tgt = torch.from_numpy(np.maximum(x[:, 1:T + 1], 0)).to(self.device)
            # ranks on the raw logits (τ > 0 keeps the order); then the max first and / τ, in place (no
            # second (B, T, V) array), in float64 when τ is below the dtype's smallest normal: logits / τ
            # overflowed to inf for a tiny τ (NaN log p, 'the model produced NaN scores'), and a τ that
            # float32 cannot hold divided by 0
            rk = ((z >= z.gather(-1, tgt[..., None])).sum(-1) - 1).cpu().numpy()
            z.sub_(z.amax(-1, keepdim=True))
            z = z.div_(temperature) if temperature >= torch.finfo(z.dtype).tiny else z.double().div_(temperature)
            lp = (z.gather(-1, tgt[..., None])[..., 0] - torch.logsumexp(z, dim=-1)).double().cpu().numpy()
            for r, (d, a, first, stop) in enumerate(chunk):
                # row p of x predicts x[p + 1] = doc[p]; the evaluator's flat index for it is offsets[d] + p - 1
                rows = np.arange(first, stop)
                flat = offsets[d] + rows - 1
                logp[flat] = lp[r, rows - a]
                rank[flat] = rk[r, rows - a]
        # targets that are OOV keep their (meaningless) scores; the evaluator skips them
        return logp, rank

    @torch.no_grad()
    def next_token_logits(self, token_ids) -> torch.Tensor:
        """Rows ``t`` = scores of token ``t + 1`` given ``token_ids[:t + 1]`` for one document."""
        doc = np.asarray(token_ids, dtype=np.int64)
        L = len(doc)
        # _logits' dtype: float32, float64 for a float64 model
        dtype = torch.promote_types(next((p.dtype for p in self.model.parameters()), torch.float32), torch.float32)
        rows = torch.empty(max(L - 1, 0), self.vocab_size, device=self.device, dtype=dtype)
        from distattn.corpus.ragged import RaggedIds
        for d, a, first, stop in self._windows(RaggedIds(doc.astype(np.int32), np.array([0, L]))):
            x = np.concatenate([[self.bos_id], doc])[a:stop]
            x[x < 0] = self.oov_id
            logits = self._logits(torch.from_numpy(x)[None].to(self.device))[0]
            rows[first - 1:stop - 1] = logits[first - a:stop - a]
        return rows


def evaluate_lm(model, documents, *, unk_id: int | None = 1, bos_id: int = 0, stride: int | None = None,
                batch_size: int = 64, max_predictions: int | None = None, top_k=(1, 10), device=None,
                precision: str = "tf32", **kwargs):
    """Perplexity and top-k accuracy of a causal LM on held-out ``documents`` with the shared metric.

    Positions whose target is ``<unk>`` (``unk_id``) or negative are skipped, as for the
    projection predictor, so numbers are comparable on the same vocabulary. Returns
    :class:`distattn.projection.nexttoken.NextTokenReport`.
    """
    from distattn.projection.nexttoken import evaluate_next_token

    ragged = getattr(documents, "tokens", documents)
    if unk_id is not None:
        _check_special(unk_id, "unk_id", int(model.config.vocab_size))
    if device is None:
        device = next(model.parameters()).device
    scorer = NextTokenScorer(model, bos_id=bos_id, oov_id=unk_id if unk_id is not None else 1, stride=stride,
                             batch_size=batch_size, device=device, precision=precision)
    return evaluate_next_token(scorer, ragged, vocab_size=scorer.vocab_size, unk_id=unk_id,
                               max_predictions=max_predictions, top_k=top_k, **kwargs)
