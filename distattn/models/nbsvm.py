"""A bag-of-n-grams baseline for the classifiers: NBSVM (Wang & Manning 2012, "Baselines and
Bigrams: Simple, Good Sentiment and Topic Classification", ACL).

The issue's yardstick for a better IMDB classifier is "NBSVM with bigrams reaches 91.2 %". This
is that model on the toolkit's own token ids, so the figure can be measured on the same tokens,
vocabulary and test reviews as the attention models (``analyses/ngram_baseline.py``):

* features: binarized n-gram indicators x̂ (every n-gram of ``ngram_range`` seen in training);
* the naive-Bayes log-count ratio ``r = log((p / |p|₁) / (q / |q|₁))``, ``p = α + Σ_{y=1} x̂``,
  ``q = α + Σ_{y=0} x̂``; the linear model is fitted on ``x̂ ∘ r``;
* an L2-regularised linear model: ``loss="squared_hinge"`` (the paper's L2-loss SVM) or
  ``loss="log"`` (logistic regression, which gives probabilities);
* the paper's interpolation ``w' = (1 - β) w̄ + β w`` with ``w̄ = |w|₁ / |V|`` (β = 1: the plain
  linear model), between the MNB decision ``Σ r`` and the linear model's. The intercept ``b``
  (the paper's liblinear fitted none) is scaled to ``β b``, since the MNB side has none: left at
  ``b`` it outweighs the shrunk weights, and NBSVM-bi lost a point on IMDB.

A document is a sequence of token ids; negative ids (out of vocabulary), an ``EncodedCorpus``'s
``<unk>`` and ``<pad>`` ids, and at prediction ids above every id seen in fit, break n-grams and
are not features (the paper counts only the n-grams it observes; ``<unk>`` would pool every
unknown word into one feature). Encode plain id lists with ``oov="negative"`` for the same. Counting is vectorised over the
whole corpus: no Python loop per document.

>>> from distattn.models import NBSVMClassifier
>>> docs = [[2, 3, 4], [5, 3, 4], [2, 6], [5, 6]] * 5        # "not"=5 flips "good"=3 / "bad"=6
>>> y = [1, 0, 0, 1] * 5
>>> clf = NBSVMClassifier(ngram_range=(1, 2)).fit(docs, y)
>>> clf.predict([[2, 3], [5, 3], [5, 6]]).tolist()
[1, 0, 1]
"""

from __future__ import annotations

import copy

import numpy as np
from scipy import sparse
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from distattn.corpus import RaggedIds

__all__ = ["NBSVMClassifier", "ngram_codes"]

LOSSES = ("squared_hinge", "log")
MAX_ORDER = 3


def _order_bases(vocab_size: int, lo: int, hi: int) -> list[int]:
    """Start of each order's code range: order n's codes lie in [base_n, base_n + V**n)."""
    bases, base = [], 0
    for n in range(lo, hi + 1):
        bases.append(base)
        base += vocab_size ** n
    if base >= 2 ** 62:
        raise ValueError(f"n-grams up to order {hi} over a vocabulary of {vocab_size:,} ids do not fit in int64 "
                         "codes; use a smaller ngram_range or vocabulary")
    return bases


def ngram_codes(docs: RaggedIds, vocab_size: int, ngram_range: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Every n-gram occurrence of ``docs`` as an int64 code and its document number.

    An n-gram ``(t_1, …, t_n)`` has code ``base_n + Σ_j t_j V^(n-j)``: distinct n-grams get
    distinct codes. N-grams that hold a negative (out-of-vocabulary) id are left out.
    """
    lo, hi = ngram_range
    ids = docs.ids.astype(np.int64)
    doc = docs.doc_index()
    ends = docs.offsets[1:][doc]                 # one past the last token of each token's document
    position = np.arange(len(ids), dtype=np.int64)
    codes, owners = [], []
    for n, base in zip(range(lo, hi + 1), _order_bases(vocab_size, lo, hi)):
        start = np.flatnonzero(position + n <= ends)
        code = np.zeros(len(start), dtype=np.int64)
        ok = np.ones(len(start), dtype=bool)
        for j in range(n):
            t = ids[start + j]
            ok &= t >= 0
            code = code * vocab_size + np.maximum(t, 0)
        codes.append(code[ok] + base)
        owners.append(doc[start[ok]])
    return np.concatenate(codes), np.concatenate(owners)


def _check_docs(docs, vocab_size: int | None = None) -> tuple[RaggedIds, int]:
    """``docs`` as RaggedIds (the statistics layer's :func:`as_ragged`) and the id range; an
    ``EncodedCorpus``'s ``<unk>`` and ``<pad>`` ids are marked out of vocabulary. With
    ``vocab_size`` given (the fitted range), ids at or above it were never seen in fit and are
    marked out of vocabulary too."""
    from distattn.stats.cooccurrence import as_ragged      # loaded with this module, on first use

    vocab = getattr(docs, "vocab", None)
    specials = [i for i in (getattr(vocab, "unk_id", None), getattr(vocab, "pad_id", None)) if i is not None]
    if vocab_size is None:
        ragged, vocab_size, _ = as_ragged(docs)
        unseen = np.isin(ragged.ids, specials)
    else:
        ragged, _, _ = as_ragged(docs, np.iinfo(np.int32).max)  # every id passes; the unseen ones go below
        unseen = (ragged.ids >= vocab_size) | np.isin(ragged.ids, specials)
    if unseen.any():
        ragged = RaggedIds(np.where(unseen, -1, ragged.ids), ragged.offsets)
    return ragged, vocab_size


class NBSVMClassifier(ClassifierMixin, BaseEstimator):
    """NBSVM on binarized n-grams of token-id documents (binary labels).

    Parameters
    ----------
    ngram_range : (int, int)
        Smallest and largest n-gram order, ``1 <= lo <= hi <= 3``; ``(1, 2)`` is the paper's
        NBSVM-bi, ``(1, 3)`` its NBSVM-tri.
    alpha : float
        Smoothing of the log-count ratio (> 0; the paper's α = 1).
    C : float
        Inverse regularisation strength of the linear model (> 0; the paper's C = 1).
    beta : float
        Interpolation ``w' = (1 - β) w̄ + β w`` in [0, 1] (the paper's β = 0.25; 1 = no interpolation).
    loss : {"squared_hinge", "log"}
        The paper's L2-loss SVM, or logistic regression (needed for :meth:`predict_proba`).
    min_df : int
        Keep the n-grams found in at least this many training documents (>= 1).
    fit_intercept : bool
        Fit an intercept ``b`` (then interpolated to ``β b``); False is the paper's liblinear default.
    max_iter, tol, random_state : int, float, int or None
        Passed to the solver (liblinear, whose coordinate descent visits the documents in a
        random order: the default 0 makes a fit repeatable).

    Attributes
    ----------
    classes_ : the two labels, sorted; ``classes_[1]`` is the positive one.
    vocab_size_ : the id range seen in fit; ``ngram_range_``: the orders fit used.
    features_ : sorted int64 n-gram codes, one per column (see :func:`ngram_codes`).
    r_ : log-count ratio per feature; ``coef_``, ``intercept_``: the interpolated weights (on ``x̂ ∘ r``);
    ``linear_coef_``, ``linear_intercept_``: the linear model's own (β = 1).
    """

    def __init__(self, ngram_range=(1, 2), alpha: float = 1.0, C: float = 1.0, beta: float = 0.25,
                 loss: str = "squared_hinge", min_df: int = 1, fit_intercept: bool = True, max_iter: int = 10_000,
                 tol: float = 1e-4, random_state: int | None = 0):
        self.ngram_range = ngram_range
        self.alpha = alpha
        self.C = C
        self.beta = beta
        self.loss = loss
        self.min_df = min_df
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    # -- validation -------------------------------------------------------------------------
    def _check_params(self) -> tuple[int, int]:
        rng = self.ngram_range
        if (not isinstance(rng, (tuple, list)) or len(rng) != 2
                or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in rng)
                or not 1 <= rng[0] <= rng[1] <= MAX_ORDER):
            raise ValueError(f"ngram_range must be a pair (lo, hi) of integers with 1 <= lo <= hi <= {MAX_ORDER}; "
                             f"got {rng!r}")
        for name in ("alpha", "C"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                    or not np.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float, np.number)) \
                or not 0 <= self.beta <= 1:
            raise ValueError(f"beta must be a number in [0, 1]; got {self.beta!r}")
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be True or False; got {self.fit_intercept!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is not one of {LOSSES}")
        for name in ("min_df", "max_iter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if isinstance(self.tol, bool) or not isinstance(self.tol, (int, float, np.number)) or not self.tol > 0:
            raise ValueError(f"tol must be a number > 0; got {self.tol!r}")
        return int(rng[0]), int(rng[1])

    def _binary(self, docs: RaggedIds, codes: np.ndarray, owners: np.ndarray, features=None) -> sparse.csr_matrix:
        """Document × feature 0/1 matrix over ``features`` (default ``features_``; codes not among
        them are dropped)."""
        features = self.features_ if features is None else features
        col = np.searchsorted(features, codes)
        col[col == len(features)] = 0
        known = features[col] == codes if len(features) else np.zeros(len(codes), bool)
        n_feat = len(features)
        pairs = np.unique(owners[known] * n_feat + col[known])
        return sparse.csr_matrix((np.ones(len(pairs)), (pairs // n_feat, pairs % n_feat)),
                                 shape=(len(docs), n_feat))

    # -- scikit-learn API -------------------------------------------------------------------
    def fit(self, docs, y=None) -> "NBSVMClassifier":
        """Learn the n-gram features, their log-count ratios and the linear model.

        ``docs``: an ``EncodedCorpus``, :class:`RaggedIds` or a list of id sequences; ``y``: one
        label per document, two distinct values (default: an ``EncodedCorpus``'s labels)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.svm import LinearSVC

        lo, hi = self._check_params()
        if y is None:
            y = getattr(docs, "labels", None)
            if y is None:
                raise ValueError("y is needed: pass the labels, or an EncodedCorpus that has them")
        ragged, vocab_size = _check_docs(docs)
        y = np.asarray(y)
        if y.shape != (len(ragged),):
            raise ValueError(f"y has shape {y.shape}; expected ({len(ragged)},), one label per document")
        classes = np.unique(y)
        if len(classes) != 2:
            raise ValueError(f"NBSVM needs exactly two classes in y; got {len(classes)}: "
                             f"{classes[:5].tolist()}")
        positive = y == classes[1]
        codes, owners = ngram_codes(ragged, vocab_size, (lo, hi))
        features = np.unique(codes)
        X = self._binary(ragged, codes, owners, features)
        if self.min_df > 1:
            keep = np.flatnonzero(np.diff(X.tocsc().indptr) >= self.min_df)
            features, X = features[keep], X[:, keep]
        if X.shape[1] == 0:
            raise ValueError(f"no n-gram of orders {lo}..{hi} is found in at least min_df={self.min_df} training "
                             "documents (are the documents empty or out of vocabulary?)")
        p = self.alpha + np.asarray(X[positive].sum(axis=0)).ravel()
        q = self.alpha + np.asarray(X[~positive].sum(axis=0)).ravel()
        r = np.log(p / p.sum()) - np.log(q / q.sum())
        Xr = X @ sparse.diags(r)
        if self.loss == "log":
            model = LogisticRegression(C=self.C, solver="liblinear", fit_intercept=bool(self.fit_intercept),
                                       max_iter=self.max_iter, tol=self.tol, random_state=self.random_state)
        else:
            model = LinearSVC(C=self.C, loss="squared_hinge", dual=True, fit_intercept=bool(self.fit_intercept),
                              max_iter=self.max_iter, tol=self.tol, random_state=self.random_state)
        model.fit(Xr, positive.astype(np.int64))
        # set only now, so that a refit refused above leaves the fitted model as it was
        self.classes_, self.vocab_size_, self.ngram_range_ = classes, vocab_size, (lo, hi)
        self.features_, self.r_ = features, r
        self.linear_coef_ = model.coef_.ravel()
        self.linear_intercept_ = float(np.ravel(model.intercept_)[0]) if self.fit_intercept else 0.0
        self.n_features_ = len(self.features_)
        self._interpolate()
        return self

    def _interpolate(self) -> None:
        w = self.linear_coef_
        self.coef_ = (1.0 - self.beta) * (np.abs(w).sum() / len(w)) + self.beta * w
        self.intercept_ = self.beta * self.linear_intercept_

    def interpolated(self, beta: float) -> "NBSVMClassifier":
        """A copy of this fitted model with another β, without refitting: the linear model does
        not depend on β (``set_params(beta=…)`` alone would change nothing until the next fit)."""
        check_is_fitted(self, "linear_coef_")
        new = copy.copy(self)
        new.beta = beta
        new._check_params()
        new._interpolate()
        return new

    def _features(self, docs) -> sparse.csr_matrix:
        check_is_fitted(self, "coef_")
        ragged, _ = _check_docs(docs, self.vocab_size_)
        codes, owners = ngram_codes(ragged, self.vocab_size_, self.ngram_range_)    # the orders fit used
        return self._binary(ragged, codes, owners)

    def transform(self, docs) -> sparse.csr_matrix:
        """The binarized n-gram features ``x̂`` (documents × ``features_``)."""
        return self._features(docs)

    def decision_function(self, docs) -> np.ndarray:
        """``(x̂ ∘ r) · w' + b`` per document; > 0 means ``classes_[1]``."""
        return np.asarray(self._features(docs) @ (self.r_ * self.coef_)).ravel() + self.intercept_

    def predict(self, docs) -> np.ndarray:
        check_is_fitted(self, "coef_")
        return self.classes_[(self.decision_function(docs) > 0).astype(np.int64)]

    def _has_probabilities(self) -> bool:
        if self.loss != "log":
            raise AttributeError(f"predict_proba needs loss='log'; this model has loss={self.loss!r}, whose "
                                 "margin (decision_function) is not a probability")
        return True

    @available_if(_has_probabilities)
    def predict_proba(self, docs) -> np.ndarray:
        """(n_docs, 2) class probabilities, for ``loss="log"`` only (an SVM's margin is not one;
        ``hasattr(model, "predict_proba")`` is False then, as for scikit-learn's ``LinearSVC``)."""
        check_is_fitted(self, "coef_")
        p = expit(self.decision_function(docs))
        return np.column_stack([1.0 - p, p])
