"""``ProjectionPredictor``: the parameter-free projection predictor as a scikit-learn estimator.

>>> from distattn.corpus.paper import load_paper_corpus
>>> paper = load_paper_corpus()
>>> model = ProjectionPredictor().fit(paper.cooc)
>>> [paper.words[i] for i in model.predict([paper.encode("river_bank_flooded"), paper.encode("bank_loan")])]
['shore', 'money']

``fit(S)`` stores the validated operator S; the same object then gives the per-sequence
matrices (``context_matrix``, ``attention``, ``evidence``), batched e_global (``transform``),
next-token distributions (``predict_proba``), and the causal next-token interface used by
:func:`distattn.projection.nexttoken.evaluate_next_token` (``next_token_logits`` and the fused
``score_next_tokens``).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from distattn.projection import _checks
from distattn.projection.batch import global_evidences
from distattn.projection.causal import _causal_scores, causal_logits, causal_plan, causal_weights
from distattn.projection.core import (NORMALIZATIONS, ZERO_ROW_POLICIES, _gather, _global_evidence, _profiles,
                                      attention_weights, log_softmax)

__all__ = ["ProjectionPredictor"]


class ProjectionPredictor(BaseEstimator):
    """p(next | sequence) = softmax(e_global / temperature), e_global = mean_r [A (QS)]_r.

    Parameters
    ----------
    normalization : {"none", "row", "softmax"}, default "none"
        Attention A from M = Q S Qᵀ: raw M (the paper), Norm(M), or softmax(M / τ_att).
    temperature : float > 0, default 1.0
        τ of the output softmax.
    zero_rows : {"uniform", "zero", "self"}, default "uniform"
        Zero-row policy of Norm(M) (see :func:`~distattn.projection.core.row_normalize`).
    attention_temperature : float > 0, default 1.0
        τ_att for ``normalization="softmax"``.
    unk_id : int, optional
        An id to treat as out-of-vocabulary, besides negative ids.
    device : None, "auto", "cpu", "cuda", ...
        ``None`` computes with numpy/scipy/numba; anything else uses the torch path on that
        device (``"auto"``: CUDA if available).
    vocabulary : int or sized object (e.g. a ``Vocabulary``), optional
        The vocabulary S must match; ``fit`` raises if S is not (len, len).

    Attributes
    ----------
    cooc_ : scipy.sparse.csr_array, shape (vocab_size, vocab_size)
    vocab_size_ : int
    """

    def __init__(self, normalization: str = "none", temperature: float = 1.0, zero_rows: str = "uniform",
                 attention_temperature: float = 1.0, unk_id: int | None = None, device=None, vocabulary=None):
        self.normalization = normalization
        self.temperature = temperature
        self.zero_rows = zero_rows
        self.attention_temperature = attention_temperature
        self.unk_id = unk_id
        self.device = device
        self.vocabulary = vocabulary

    # ------------------------------------------------------------------ fitting
    def fit(self, cooc, y=None) -> "ProjectionPredictor":
        """Validate the parameters and store S (any scipy sparse matrix or array-like)."""
        self._check_params()
        if self.vocabulary is None:
            expected = None
        elif isinstance(self.vocabulary, (int, np.integer)) and not isinstance(self.vocabulary, bool):
            expected = int(self.vocabulary)
        elif hasattr(self.vocabulary, "__len__") and not isinstance(self.vocabulary, (str, bytes)):
            expected = len(self.vocabulary)
        else:
            raise ValueError(f"vocabulary must be None, a vocabulary size (int) or a sized vocabulary "
                             f"(e.g. a Vocabulary or a list of words); got {self.vocabulary!r}")
        S = _checks.cooc_matrix(cooc, vocab_size=expected)
        _checks._check_unk_id(self.unk_id, S.shape[0])
        self.cooc_ = S
        self.vocab_size_ = self.cooc_.shape[0]
        self._causal_plan = None  # the fused kernel's per-S tables, built on first use
        return self

    def _check_params(self) -> None:
        """The hyperparameters, checked at fit and again at every use (``set_params`` after fit
        must not give NaN or an inverted distribution)."""
        _checks.choice(self.normalization, "normalization", NORMALIZATIONS)
        _checks.choice(self.zero_rows, "zero_rows", ZERO_ROW_POLICIES)
        _checks.positive_float(self.temperature, "temperature")
        _checks.positive_float(self.attention_temperature, "attention_temperature")

    def _fitted(self) -> None:
        check_is_fitted(self, "cooc_")
        self._check_params()

    def _ids(self, token_ids) -> np.ndarray:
        self._fitted()
        return _checks.token_ids(token_ids, self.vocab_size_, unk_id=self.unk_id)

    def _docs(self, documents):
        self._fitted()
        return _checks.documents(documents, self.vocab_size_, unk_id=self.unk_id)

    def _attention(self, ids: np.ndarray) -> np.ndarray:
        return attention_weights(_gather(self.cooc_, ids), self.normalization, zero_rows=self.zero_rows,
                                 attention_temperature=self.attention_temperature, known=ids >= 0)

    # ------------------------------------------------------------------ one sequence
    def context_matrix(self, token_ids) -> np.ndarray:
        """M = Q S Qᵀ, shape (length, length)."""
        ids = self._ids(token_ids)
        return _gather(self.cooc_, ids)

    def attention(self, token_ids) -> np.ndarray:
        """A (M, Norm(M) or softmax(M/τ_att)), shape (length, length)."""
        return self._attention(self._ids(token_ids))

    def evidence(self, token_ids) -> np.ndarray:
        """E = A (QS), shape (length, vocab_size)."""
        ids = self._ids(token_ids)
        return np.asarray(self._attention(ids) @ _profiles(self.cooc_, ids))

    def global_evidence(self, token_ids) -> np.ndarray:
        """e_global, shape (vocab_size,)."""
        ids = self._ids(token_ids)
        return _global_evidence(self.cooc_, ids, self._attention(ids))

    # ------------------------------------------------------------------ many sequences
    def transform(self, documents) -> np.ndarray:
        """e_global of every document, shape (n_docs, vocab_size)."""
        docs = self._docs(documents)
        if self.device is None:
            return global_evidences(docs, self.cooc_, normalization=self.normalization, zero_rows=self.zero_rows,
                                    attention_temperature=self.attention_temperature)
        import torch

        from distattn.projection.torch_ops import torch_global_evidence
        return torch_global_evidence(docs, self.cooc_, normalization=self.normalization, zero_rows=self.zero_rows,
                                     attention_temperature=self.attention_temperature, device=self.device,
                                     dtype=torch.float64).cpu().numpy()

    def predict_log_proba(self, documents) -> np.ndarray:
        """log softmax(e_global / temperature) of every document, shape (n_docs, vocab_size).

        A document without an in-vocabulary token gets the uniform distribution."""
        # log_softmax shifts by the row max before dividing: e / τ overflowed to inf (NaN) for a tiny τ
        return log_softmax(self.transform(documents), temperature=self.temperature, axis=1)

    def predict_proba(self, documents) -> np.ndarray:
        """softmax(e_global / temperature), shape (n_docs, vocab_size); rows sum to 1."""
        return np.exp(self.predict_log_proba(documents))

    def predict(self, documents) -> np.ndarray:
        """The most probable next token of every document, shape (n_docs,) (ties: lowest id)."""
        return np.argmax(self.transform(documents), axis=1)

    # ------------------------------------------------------------------ causal next-token interface
    def next_token_logits(self, token_ids) -> np.ndarray:
        """Causal logits: row t is ``(e_t - max e_t) / temperature`` for the prefix ``token_ids[:t+1]``,
        the logits ``e_t / temperature`` shifted by a constant (the softmax is unchanged); the max
        is subtracted first, as in ``log_softmax``: ``e_t / temperature`` overflowed to inf (NaN
        log p) for a tiny temperature.

        OOV tokens are skipped (a prefix with no in-vocabulary token gives zeros, i.e. the
        uniform distribution). Shape (length, vocab_size), a numpy array (a torch tensor on
        ``device`` when one is set).
        """
        self._fitted()
        ids = _checks.token_ids(token_ids, self.vocab_size_, unk_id=self.unk_id, require_known=False)
        known = ids >= 0
        row = np.cumsum(known) - 1               # the prefix row each position uses
        k = ids[known]
        if self.device is not None:
            import torch

            from distattn.projection.torch_ops import _context, _DeviceCSR, resolve_device, torch_causal_weights
            self._float32_temperatures(self.temperature, f"temperature={self.temperature!r}")
            dev = resolve_device(self.device)
            csr = _DeviceCSR(self.cooc_, dev, torch.float32)
            kt = torch.as_tensor(k, device=dev)[None]
            C = torch_causal_weights(_context(csr, kt), self.normalization, zero_rows=self.zero_rows,
                                     attention_temperature=self.attention_temperature)
            logits = torch.bmm(C, csr.dense_rows(kt))[0]
            logits -= logits.amax(-1, keepdim=True)
            logits /= torch.arange(1, k.size + 1, device=dev, dtype=logits.dtype)[:, None] * self.temperature
            logits = torch.cat([logits, torch.zeros(1, self.vocab_size_, device=dev, dtype=logits.dtype)])
            return logits[torch.as_tensor(row, device=dev)]   # row -1 picks the zero row
        C = causal_weights(_gather(self.cooc_, k), self.normalization, zero_rows=self.zero_rows,
                           attention_temperature=self.attention_temperature)
        e = causal_logits(k, self.cooc_, C)
        if e.size:
            e -= e.max(axis=1, keepdims=True)
        with np.errstate(over="ignore"):      # a tiny temperature: -inf where p is 0
            logits = np.vstack([e / self.temperature, np.zeros((1, self.vocab_size_))])
        return logits[row]

    def _float32_temperatures(self, tau: float, what: str) -> None:
        """With ``device`` set the scores are float32, where a temperature (or attention_temperature)
        below the smallest normal float32 rounds to a subnormal or 0 and the probabilities come out
        NaN; the numpy path (``device=None``) computes in float64."""
        tiny = float(np.finfo(np.float32).tiny)
        checks = [(tau, what)]
        if self.normalization == "softmax":
            checks.append((self.attention_temperature, f"attention_temperature={self.attention_temperature!r}"))
        for value, name in checks:
            if value < tiny:
                raise ValueError(f"{name} is below {tiny!r}, the smallest normal float32: with device={self.device!r} "
                                 f"the predictor scores in float32, where it rounds to a subnormal or 0; allowed: "
                                 f"a temperature >= {tiny!r}, or device=None (numpy, float64)")

    def score_next_tokens(self, documents, *, temperature: float = 1.0, prior=None, prior_weight: float = 0.0):
        """Fused scoring for :func:`~distattn.projection.nexttoken.evaluate_next_token`.

        Returns flat ``(logp, rank)`` arrays (see
        :func:`~distattn.projection.causal.causal_scores`) for the logits
        ``next_token_logits / temperature``, or ``NotImplemented`` when no fused path applies.
        """
        docs = self._docs(documents)
        tau = self.temperature * _checks.positive_float(temperature, "temperature")
        if tau == 0:        # once a ZeroDivisionError (or numba's SystemError) from the scoring kernel
            raise ValueError(f"temperature={temperature!r} times the predictor's temperature={self.temperature!r} "
                             f"underflows to 0; use a larger temperature")
        if self.device is not None:
            from distattn.projection.torch_ops import torch_causal_scores
            self._float32_temperatures(tau, f"temperature={temperature!r} times the predictor's temperature="
                                            f"{self.temperature!r} (= {tau!r})")
            return torch_causal_scores(docs, self.cooc_, normalization=self.normalization, zero_rows=self.zero_rows,
                                       attention_temperature=self.attention_temperature, temperature=tau,
                                       prior=prior, prior_weight=prior_weight, device=self.device)
        if self.normalization != "none":
            return NotImplemented
        cached = getattr(self, "_causal_plan", None)   # (the S it was built for, its tables)
        if cached is None or cached[0] is not self.cooc_:
            cached = self._causal_plan = (self.cooc_, causal_plan(self.cooc_))
        prior = _checks.prior(prior, prior_weight, self.vocab_size_)     # docs and S were validated above
        return _causal_scores(docs, self.cooc_, tau, prior, 0.0 if prior is None else float(prior_weight), cached[1])
