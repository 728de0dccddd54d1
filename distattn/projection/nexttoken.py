"""Model-agnostic causal next-token evaluation: perplexity, top-1 and top-k accuracy.

The model
---------
Anything that scores the next token from a prefix:

* an object with ``next_token_logits(token_ids) -> scores``, or
* a callable ``model(token_ids) -> scores``,

where ``token_ids`` is one document (1-D int64 array; OOV tokens are -1 unless
``context_oov_id`` substitutes an id) and ``scores`` has one row per position: row ``t`` holds
unnormalised log-probabilities (logits or log-probabilities, a numpy array or a torch tensor
on any device) of the token at ``t + 1`` given ``token_ids[:t + 1]``. It may have ``length``
or ``length - 1`` rows, or be an iterable of consecutive row blocks (to bound memory for long
documents). The evaluator applies ``log_softmax(scores / temperature)`` itself, so already
normalised log-probabilities are fine too.

A model may also offer a fused ``score_next_tokens(documents, *, temperature, prior,
prior_weight) -> (logp, rank)`` returning flat per-token arrays (see
:func:`distattn.projection.causal.causal_scores`), or ``NotImplemented`` to fall back; the
projection predictor, the n-gram baselines and future torch LMs all go through the same
evaluator and the same metric code.

Conventions
-----------
* Causal: position ``t`` of a held-out document predicts token ``t + 1`` from the prefix only;
  the first token of a document is never predicted.
* OOV: a position whose *target* is out of vocabulary (negative id or ``unk_id``) is skipped
  and counted in ``n_oov_targets``; perplexity and accuracies are over in-vocabulary targets
  only, so compare models on the same vocabulary. OOV tokens in the *context* are passed to
  the model as -1 (or ``context_oov_id``); the projection predictor skips them.
* Ranks count the other tokens with a score at least the target's (ties count against the
  target): top-k correct means ``rank < k``.
* Optional interpolation with a prior (e.g. the unigram): ``p = (1 - w) softmax(s/τ) + w·prior``.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar

from distattn.corpus.ragged import RaggedIds
from distattn.projection import _checks
from distattn.projection._scoring import score_rows

__all__ = ["NextTokenReport", "evaluate_next_token", "fit_temperature", "unigram_prior", "prediction_targets"]


@dataclass(frozen=True)
class NextTokenReport:
    """Metrics of one evaluation.

    Attributes
    ----------
    n_predictions : positions scored (in-vocabulary targets).
    n_oov_targets : positions skipped because their target is OOV.
    mean_nll : mean negative log-likelihood in nats.
    perplexity : ``exp(mean_nll)``.
    top_k_accuracy : {k: fraction of predictions with rank < k}.
    temperature, prior_weight : the settings used.
    """

    n_predictions: int
    n_oov_targets: int
    mean_nll: float
    perplexity: float
    top_k_accuracy: dict = field(default_factory=dict)
    temperature: float = 1.0
    prior_weight: float = 0.0

    @property
    def top1_accuracy(self) -> float:
        return self.top_k_accuracy.get(1, float("nan"))

    @property
    def top10_accuracy(self) -> float:
        return self.top_k_accuracy.get(10, float("nan"))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["top_k_accuracy"] = {str(k): v for k, v in self.top_k_accuracy.items()}
        return d


def prediction_targets(docs) -> tuple[np.ndarray, np.ndarray]:
    """For flat token index t: ``target[t] = ids[t+1]`` when t+1 is in the same document
    (else -2), and whether that target is in vocabulary.

    ``docs``: a :class:`~distattn.corpus.RaggedIds`, an ``(ids, offsets)`` tuple or a list of id
    sequences; negative ids are out of vocabulary. Returns ``(targets, scored)``; ``targets == -1`` marks OOV targets."""
    if isinstance(docs, tuple):          # as everywhere else: a tuple is (ids, offsets), not two documents
        if len(docs) != 2:
            raise TypeError(f"a tuple docs must be (ids, offsets); got a tuple of length {len(docs)} "
                            f"(pass several documents as a list)")
        docs = RaggedIds(np.asarray(docs[0]), np.asarray(docs[1]))
    elif isinstance(docs, np.ndarray) and docs.ndim == 0:       # once numpy's "iteration over a 0-d array"
        raise TypeError("docs must be a RaggedIds, an (ids, offsets) pair or a list of id arrays; got a 0-d array")
    elif not (hasattr(docs, "ids") and hasattr(docs, "offsets")):
        docs = RaggedIds.from_sequences(docs)
    n = docs.n_tokens
    targets = np.full(n, -2, dtype=np.int64)
    if n > 1:
        targets[:-1] = np.maximum(docs.ids[1:], -1)        # any negative id is OOV: -1
    last = docs.offsets[1:][docs.lengths > 0] - 1
    targets[last] = -2
    return targets, targets >= 0


def unigram_prior(documents, vocab_size: int, *, smoothing: float = 1.0, unk_id: int | None = None) -> np.ndarray:
    """Add-δ unigram probabilities ``(count(v) + δ) / (N + δ·vocab_size)`` from training
    documents (OOV tokens not counted). Shape (vocab_size,), sums to 1, all > 0 when δ > 0."""
    vocab_size = _checks.positive_int(vocab_size, "vocab_size")
    if (isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real) or not np.isfinite(smoothing)
            or smoothing < 0):
        raise ValueError(f"smoothing must be a finite real number >= 0; got {smoothing!r}")
    docs = _checks.documents(documents, vocab_size, unk_id=unk_id)
    counts = np.bincount(docs.ids[docs.ids >= 0], minlength=vocab_size).astype(np.float64) + smoothing
    if counts.sum() == 0:
        raise ValueError("unigram_prior needs at least one in-vocabulary token when smoothing is 0")
    return counts / counts.sum()


def _model_vocab_size(model, vocab_size):
    own = getattr(model, "vocab_size_", None) or getattr(model, "vocab_size", None)
    if vocab_size is not None and own is not None and int(own) != int(vocab_size):
        raise ValueError(f"vocab_size={vocab_size} does not match the model's vocab_size {own}")
    if vocab_size is None:
        vocab_size = own
    if vocab_size is None:
        raise ValueError("vocab_size is needed: pass vocab_size= or give the model a vocab_size attribute")
    return _checks.positive_int(int(vocab_size), "vocab_size")


def _limit(docs, max_predictions):
    if max_predictions is None:
        return docs
    max_predictions = _checks.positive_int(max_predictions, "max_predictions")
    _, scored = prediction_targets(docs)
    cumulative = np.concatenate([[0], np.cumsum(scored)])
    per_doc = cumulative[docs.offsets[1:]] - cumulative[docs.offsets[:-1]]
    n_docs = int(np.searchsorted(np.cumsum(per_doc), max_predictions)) + 1
    return docs.take(np.arange(min(n_docs, len(docs))))


def _score_block(block, targets, temperature, prior, prior_weight):
    """(logp, rank) of each row of a numpy or torch block, for ``softmax(block / temperature)``;
    rows with target < 0 give NaN/-1.

    A CPU tensor is scored by the numba kernel below, in one pass and in place (torch's
    log_softmax and comparison would allocate (n, V) temporaries); others where they live."""
    if hasattr(block, "detach") and block.device.type == "cpu":
        block = _scoring_dtype(block).numpy()
    if hasattr(block, "detach"):                      # a torch tensor on an accelerator: score where it lives
        return _score_block_torch(block, targets, temperature, prior, prior_weight)
    x = np.asarray(block)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    x = np.ascontiguousarray(x)
    logp = np.full(x.shape[0], np.nan)
    rank = np.full(x.shape[0], -1, dtype=np.int64)
    prior32 = np.zeros(0, np.float32) if prior is None else prior.astype(np.float32)
    score_rows(x, np.ascontiguousarray(targets, dtype=np.int64), float(temperature), prior32,
               float(prior_weight if prior is not None else 0.0), logp, rank)
    return logp, rank


def _scoring_dtype(block):
    """A torch block detached, in float32, or float64 when given so (as a numpy array keeps it)."""
    import torch

    block = block.detach()
    return block if block.dtype == torch.float64 else block.float()


def _score_block_torch(block, targets, temperature, prior, prior_weight):
    """:func:`_score_block` in torch, on the block's device."""
    import torch

    x = _scoring_dtype(block)
    # the max first, then / τ: x * (1/τ) was inf * 0 = NaN for a subnormal τ; a τ that the
    # block's dtype cannot hold (float32: below 1.2e-38) divides in float64
    z = x - x.amax(1, keepdim=True)
    info = torch.finfo(z.dtype)
    z = z / temperature if info.tiny <= temperature <= info.max else (z.double() / temperature).to(z.dtype)
    t = torch.as_tensor(targets, device=x.device)
    tc = t.clamp(min=0)[:, None]
    lp = torch.log_softmax(z, dim=-1)
    if prior is None:
        logp = lp.gather(1, tc)[:, 0]
        rank = (x >= x.gather(1, tc)).sum(1) - 1
    else:
        mix = (1 - prior_weight) * lp.exp() + prior_weight * torch.as_tensor(prior, device=x.device, dtype=x.dtype)
        pt = mix.gather(1, tc)
        logp = torch.log(pt[:, 0])
        rank = (mix >= pt).sum(1) - 1
    logp = logp.double().cpu().numpy()
    rank = rank.cpu().numpy().astype(np.int64)
    off = targets < 0
    logp[off], rank[off] = np.nan, -1
    return logp, rank


def _generic_scores(model, docs, targets, vocab_size, temperature, prior, prior_weight, context_oov_id):
    fn = getattr(model, "next_token_logits", None)
    fn = fn if callable(fn) else model
    if not callable(fn):
        raise TypeError(f"model must have next_token_logits(token_ids) or be callable; got {type(model).__name__}")
    logp = np.full(docs.n_tokens, np.nan)
    rank = np.full(docs.n_tokens, -1, dtype=np.int64)
    for d in range(len(docs)):                        # a loop over documents, not tokens
        start, stop = int(docs.offsets[d]), int(docs.offsets[d + 1])
        if stop - start < 2:
            continue
        ctx = docs.ids[start:stop].astype(np.int64)
        if context_oov_id is not None:
            ctx[ctx < 0] = context_oov_id
        out = fn(ctx)
        blocks = [out] if (hasattr(out, "shape") and getattr(out, "ndim", 0) == 2) else out
        row = 0
        for block in blocks:
            if getattr(block, "ndim", 0) != 2 or block.shape[1] != vocab_size:
                raise ValueError(f"the model returned scores of shape {tuple(getattr(block, 'shape', ()))} for a "
                                 f"document of length {stop - start}; expected (rows, vocab_size={vocab_size})")
            n = min(block.shape[0], stop - start - 1 - row)
            if n > 0:
                lp, rk = _score_block(block[:n], targets[start + row:start + row + n], temperature,
                                      prior, prior_weight)
                logp[start + row:start + row + n] = lp
                rank[start + row:start + row + n] = rk
            row += block.shape[0]
        if row < stop - start - 1:
            raise ValueError(f"the model returned {row} rows for document {d} of length {stop - start}; "
                             f"at least {stop - start - 1} are needed (row t predicts token t+1)")
    return logp, rank


def evaluate_next_token(model, documents, *, vocab_size: int | None = None, temperature: float = 1.0,
                        prior=None, prior_weight: float = 0.0, unk_id: int | None = None,
                        context_oov_id: int | None = None, max_predictions: int | None = None,
                        top_k=(1, 10), return_scores: bool = False):
    """Causal next-token metrics of ``model`` on held-out ``documents``.

    Parameters
    ----------
    model : see the module docstring.
    documents : RaggedIds, (ids, offsets) or list of int arrays
    vocab_size : int, optional
        Defaults to the model's ``vocab_size_`` / ``vocab_size``.
    temperature : float > 0
        Scores are divided by it before the softmax.
    prior, prior_weight : optional
        Interpolate ``(1 - w) p_model + w prior``.
    unk_id : int, optional
        An id counted as OOV (besides negative ids); defaults to the model's ``unk_id``.
    context_oov_id : int, optional
        The id given to the model for OOV context tokens (default -1).
    max_predictions : int, optional
        Evaluate only the first documents holding at least this many predictions.
    top_k : tuple of int
        Accuracies to report.
    return_scores : bool
        Also return the flat per-token ``(logp, rank)`` arrays.

    Returns
    -------
    NextTokenReport, or (NextTokenReport, logp, rank)
    """
    V = _model_vocab_size(model, vocab_size)
    unk_id = getattr(model, "unk_id", None) if unk_id is None else unk_id
    temperature = _checks.positive_float(temperature, "temperature")
    prior = _checks.prior(prior, prior_weight, V)
    if isinstance(top_k, (numbers.Number, str)) or not isinstance(top_k, Iterable):
        raise ValueError(f"top_k must be a tuple of integers >= 1, e.g. (1, 10) or (5,); got {top_k!r}")
    top_k = tuple(_checks.positive_int(k, "top_k entry") for k in top_k)
    if context_oov_id is not None and (isinstance(context_oov_id, bool) or not isinstance(context_oov_id, numbers.Integral)
                                       or not -1 <= context_oov_id < V):
        raise ValueError(f"context_oov_id must be None, -1 (the default) or an id in [0, vocab_size={V}) "
                         f"(e.g. <unk>); got {context_oov_id!r}")
    if context_oov_id is not None:
        context_oov_id = None if context_oov_id == -1 else int(context_oov_id)
    docs = _limit(_checks.documents(documents, V, unk_id=unk_id), max_predictions)
    targets, scored = prediction_targets(docs)
    result = NotImplemented
    fast = getattr(model, "score_next_tokens", None)
    if callable(fast):
        ctx_docs = docs                               # the fused path sees the context the generic path gives
        if context_oov_id is not None:
            ctx_docs = RaggedIds(np.where(docs.ids < 0, context_oov_id, docs.ids), docs.offsets)
        result = fast(ctx_docs, temperature=temperature, prior=prior,
                      prior_weight=prior_weight if prior is not None else 0.0)
    if result is NotImplemented:
        result = _generic_scores(model, docs, targets, V, temperature, prior, prior_weight, context_oov_id)
    logp, rank = result
    if scored.any() and np.isnan(logp[scored]).any():
        t = int(np.flatnonzero(scored & np.isnan(logp))[0])
        raise ValueError(f"the model produced NaN scores (first at flat position {t})")
    n = int(scored.sum())
    nll = float(-logp[scored].mean()) if n else float("nan")
    report = NextTokenReport(
        n_predictions=n, n_oov_targets=int((targets == -1).sum()), mean_nll=nll,
        perplexity=float(np.exp(nll)) if n else float("nan"),
        top_k_accuracy={k: float((rank[scored] < k).mean()) if n else float("nan") for k in top_k},
        temperature=temperature, prior_weight=float(prior_weight if prior is not None else 0.0))
    return (report, logp, rank) if return_scores else report


def fit_temperature(model, documents, *, vocab_size: int | None = None, bounds=(1e-2, 1e4), prior=None,
                    prior_weight: float = 0.0, unk_id: int | None = None, max_predictions: int | None = 20_000,
                    xatol: float = 1e-2) -> float:
    """The temperature τ minimising the validation perplexity of ``model``.

    A bounded 1-D search (``scipy.optimize.minimize_scalar``) over ``log τ`` in ``bounds``;
    every step re-runs :func:`evaluate_next_token` on the validation ``documents`` (limited
    to ``max_predictions``), so a fit costs about 15-25 evaluations; ``xatol`` is the
    tolerance on ``log τ`` (0.01: 1 % in τ). Use the result as
    ``evaluate_next_token(..., temperature=τ)``.
    """
    if isinstance(bounds, str) or not isinstance(bounds, Iterable) or len(bounds := tuple(bounds)) != 2:
        raise ValueError(f"bounds must be (low, high) with 0 < low < high; got {bounds!r}")
    lo, hi = (_checks.positive_float(b, "bounds entry") for b in bounds)
    if not lo < hi:
        raise ValueError(f"bounds must be (low, high) with 0 < low < high; got {bounds!r}")
    V = _model_vocab_size(model, vocab_size)
    unk_id = getattr(model, "unk_id", None) if unk_id is None else unk_id   # as evaluate_next_token
    docs = _limit(_checks.documents(documents, V, unk_id=unk_id), max_predictions)
    if not prediction_targets(docs)[1].any():
        raise ValueError("the validation documents hold no in-vocabulary prediction target")

    def nll(log_tau):
        return evaluate_next_token(model, docs, vocab_size=V, temperature=float(np.exp(log_tau)), prior=prior,
                                   prior_weight=prior_weight, unk_id=unk_id, top_k=()).mean_nll

    res = minimize_scalar(nll, bounds=(np.log(lo), np.log(hi)), method="bounded", options={"xatol": xatol})
    return float(np.exp(res.x))
