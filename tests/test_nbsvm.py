"""The NBSVM baseline (distattn.models.NBSVMClassifier) against scikit-learn's own n-gram
counting and the paper's formulas, and its bad-input errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from sklearn.base import clone
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.svm import LinearSVC

from distattn.corpus import RaggedIds
from distattn.models import NBSVMClassifier
from distattn.models.nbsvm import ngram_codes


def _random_docs(seed=0, n=120, vocab=40):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, rng.integers(0, 25)) for _ in range(n)]
    y = rng.integers(0, 2, n)
    return docs, y


def _as_text(docs):
    return [" ".join(f"w{t}" for t in d) for d in docs]


@pytest.mark.parametrize("ngram_range", [(1, 1), (1, 2), (2, 2), (1, 3), (2, 3)])
def test_features_are_sklearns_binary_ngrams(ngram_range):
    """The same document × n-gram 0/1 matrix as CountVectorizer(binary=True), up to column order."""
    docs, y = _random_docs()
    clf = NBSVMClassifier(ngram_range=ngram_range).fit(docs, y)
    X = clf.transform(docs).toarray()
    cv = CountVectorizer(binary=True, ngram_range=ngram_range, token_pattern=r"\S+", lowercase=False)
    ref = cv.fit_transform(_as_text(docs)).toarray()
    assert X.shape == ref.shape
    # columns as sets of documents: the multisets of columns agree
    key = lambda M: sorted(map(tuple, M.T.astype(int)))
    assert key(X) == key(ref)
    assert clf.n_features_ == len(cv.vocabulary_)


def test_negative_ids_break_ngrams():
    docs = RaggedIds.from_sequences([[1, 2, -1, 3, 4], [2, 3]])
    codes, owners = ngram_codes(docs, 5, (2, 2))
    V = 5                                              # (2, 2): bigram codes start at 0
    assert sorted(zip(owners.tolist(), codes.tolist())) == [(0, 1 * V + 2), (0, 3 * V + 4), (1, 2 * V + 3)]
    codes, owners = ngram_codes(docs, 5, (1, 2))       # bigrams after the V unigram codes
    assert sorted(codes[owners == 1].tolist()) == [2, 3, V + 2 * V + 3]


def test_log_count_ratio_and_interpolation_follow_the_paper():
    docs, y = _random_docs(1)
    clf = NBSVMClassifier(ngram_range=(1, 2), alpha=0.5, C=0.7, beta=0.3).fit(docs, y)
    X = clf.transform(docs).toarray()
    p = 0.5 + X[y == 1].sum(0)
    q = 0.5 + X[y == 0].sum(0)
    np.testing.assert_allclose(clf.r_, np.log(p / p.sum()) - np.log(q / q.sum()))
    svm = LinearSVC(C=0.7, loss="squared_hinge", dual=True, max_iter=10_000, tol=1e-4, random_state=0).fit(X * clf.r_, y)
    w = svm.coef_.ravel()
    np.testing.assert_allclose(clf.linear_coef_, w, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(clf.coef_, 0.7 * np.abs(w).mean() + 0.3 * w, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(clf.decision_function(docs), (X * clf.r_) @ clf.coef_ + 0.3 * svm.intercept_[0],
                               rtol=1e-6, atol=1e-9)
    # beta changed after the fit: the same as fitting with it
    again = NBSVMClassifier(ngram_range=(1, 2), alpha=0.5, C=0.7, beta=1.0).fit(docs, y)
    np.testing.assert_allclose(clf.interpolated(1.0).decision_function(docs), again.decision_function(docs),
                               rtol=1e-6, atol=1e-9)
    assert clf.beta == 0.3                         # the original is left as it was


def test_bigrams_separate_what_unigrams_cannot():
    """Label = "not" (5) before the sentiment word flips it; every unigram is as frequent in
    both classes, so only bigram features can tell them apart."""
    rng = np.random.default_rng(0)
    docs, y = [], []
    for _ in range(200):
        neg, word = rng.integers(0, 2), rng.choice([3, 6])            # 3 "good", 6 "bad"
        filler = rng.integers(10, 30, 4).tolist()
        docs.append(filler[:2] + ([5] if neg else [7]) + [word] + filler[2:] + [7 if neg else 5])
        y.append(int((word == 3) != bool(neg)))
    docs_tr, docs_te, y_tr, y_te = docs[:150], docs[150:], np.array(y[:150]), np.array(y[150:])
    uni = NBSVMClassifier(ngram_range=(1, 1)).fit(docs_tr, y_tr).score(docs_te, y_te)
    bi = NBSVMClassifier(ngram_range=(1, 2)).fit(docs_tr, y_tr).score(docs_te, y_te)
    assert bi == 1.0 and uni < 0.75


def test_probabilities_and_labels():
    docs, y = _random_docs(2)
    labels = np.where(y == 1, "pos", "neg")
    clf = NBSVMClassifier(loss="log", beta=1.0).fit(docs, labels)
    assert clf.classes_.tolist() == ["neg", "pos"]
    proba = clf.predict_proba(docs)
    assert proba.shape == (len(docs), 2)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    assert (clf.predict(docs) == np.where(proba[:, 1] > 0.5, "pos", "neg")).all()
    svm = NBSVMClassifier().fit(docs, y)
    assert not hasattr(svm, "predict_proba") and hasattr(clf, "predict_proba")
    with pytest.raises(AttributeError, match="has no attribute 'predict_proba'") as exc:
        svm.predict_proba(docs)
    assert "predict_proba needs loss='log'" in str(exc.value.__cause__)        # the reason, chained
    extreme = NBSVMClassifier(loss="log", beta=1.0, C=1e4).fit([[1, 1, 1]] * 3 + [[2, 2]] * 3, [1] * 3 + [0] * 3)
    with np.errstate(all="raise"):                 # a large margin gives 0/1, not an overflow warning
        assert np.isfinite(extreme.predict_proba([[1] * 200, [2] * 200])).all()
    assert clone(clf).get_params() == clf.get_params()


def test_ids_unseen_in_fit_are_out_of_vocabulary_at_prediction():
    clf = NBSVMClassifier(ngram_range=(1, 2)).fit([[0, 1], [1, 2]], [0, 1])
    # 7 is beyond every id fit saw: no feature, and it breaks the bigram (2, 7) rather than
    # aliasing another code
    np.testing.assert_array_equal(clf.transform([[2, 7], [2]]).toarray(), clf.transform([[2], [2]]).toarray())
    # an empty or all-unseen document scores the intercept alone rather than raising
    assert clf.transform([[], [-1, 9]]).nnz == 0
    np.testing.assert_allclose(clf.decision_function([[], [-1, 9]]), clf.intercept_)


def test_ragged_input_equals_lists():
    docs, y = _random_docs(3)
    a = NBSVMClassifier().fit(docs, y).decision_function(docs)
    b = NBSVMClassifier().fit(RaggedIds.from_sequences(docs), y).decision_function(RaggedIds.from_sequences(docs))
    np.testing.assert_allclose(a, b)


@pytest.mark.parametrize("params, error, message", [
    (dict(ngram_range=(0, 2)), ValueError, r"ngram_range must be a pair \(lo, hi\) of integers with 1 <= lo <= hi <= 3"),
    (dict(ngram_range=(2, 1)), ValueError, "ngram_range must be a pair"),
    (dict(ngram_range=2), ValueError, "got 2"),
    (dict(ngram_range=(1, 4)), ValueError, "hi <= 3"),
    (dict(alpha=0), ValueError, "alpha must be a finite number > 0; got 0"),
    (dict(C=float("nan")), ValueError, "C must be a finite number > 0; got nan"),
    (dict(beta=1.5), ValueError, r"beta must be a number in \[0, 1\]; got 1.5"),
    (dict(loss="hinge"), ValueError, r"loss='hinge' is not one of \('squared_hinge', 'log'\)"),
    (dict(min_df=0), ValueError, "min_df must be an integer >= 1; got 0"),
    (dict(fit_intercept="no"), TypeError, "fit_intercept must be True or False; got 'no'"),
])
def test_bad_parameters_are_named(params, error, message):
    docs, y = _random_docs()
    with pytest.raises(error, match=message):
        NBSVMClassifier(**params).fit(docs, y)


def test_bad_data_is_named():
    docs, y = _random_docs()
    with pytest.raises(ValueError, match=r"y has shape \(3,\); expected \(120,\)"):
        NBSVMClassifier().fit(docs, y[:3])
    with pytest.raises(ValueError, match=r"exactly two classes in y; got 3"):
        NBSVMClassifier().fit(docs, np.arange(len(docs)) % 3)
    with pytest.raises(ValueError, match="y is needed"):
        NBSVMClassifier().fit(docs)
    with pytest.raises(ValueError, match="the corpus is empty: no documents"):
        NBSVMClassifier().fit([], [])
    with pytest.raises(TypeError, match="wrap a single id array in a list"):
        NBSVMClassifier().fit(np.array([1, 2, 3]), [0, 1, 0])
    with pytest.raises(TypeError, match="dtype float64"):
        NBSVMClassifier().fit([[0.5, 1.0], [2.0]], [0, 1])
    with pytest.raises(ValueError, match="min_df=5"):
        NBSVMClassifier(min_df=5).fit([[1, 2], [3, 4]], [0, 1])
    from sklearn.exceptions import NotFittedError
    with pytest.raises(NotFittedError):
        NBSVMClassifier().predict(docs)
    with pytest.raises(ValueError, match="beta must be"):
        NBSVMClassifier().fit(docs, y).interpolated(-0.1)


def test_min_df_keeps_frequent_ngrams_only():
    docs, y = _random_docs(4)
    full = NBSVMClassifier(ngram_range=(1, 2)).fit(docs, y)
    df = np.asarray((full.transform(docs) > 0).sum(0)).ravel()
    pruned = NBSVMClassifier(ngram_range=(1, 2), min_df=3).fit(docs, y)
    np.testing.assert_array_equal(pruned.features_, full.features_[df >= 3])
    assert sparse.issparse(pruned.transform(docs))


@pytest.mark.parametrize("bad_refit", ["three_classes", "min_df_too_high"])
def test_a_failed_refit_leaves_the_fitted_model_as_it_was(bad_refit):
    """fit set classes_, vocab_size_ and features_ before its last checks: a refit refused for three
    classes left the old weights with the new classes_, so predict silently returned the wrong
    labels ('b'/'a' for 1/0), and one refused for min_df left features_ that no longer matched coef_
    (predict: 'matmul: dimension mismatch')."""
    docs, y = _random_docs()
    clf = NBSVMClassifier().fit(docs, y)
    before = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in vars(clf).items() if k.endswith("_")}
    expected = clf.predict(docs)
    with pytest.raises(ValueError):
        if bad_refit == "three_classes":
            clf.fit(docs, np.array(["a", "b", "c"])[np.arange(len(docs)) % 3])
        else:
            clf.set_params(min_df=10_000).fit(docs, y)
    for k, v in before.items():
        assert np.array_equal(getattr(clf, k), v), k
    np.testing.assert_array_equal(clf.predict(docs), expected)


def test_unk_and_pad_of_an_encoded_corpus_are_not_features():
    # an EncodedCorpus's <unk> (every out-of-vocabulary word) was an ordinary id: a unigram
    # feature and bigrams such as (good, <unk>) with learned weights, pooling all unknown words,
    # where the statistics layer (as_ragged) and this docstring treat it as out of vocabulary
    from distattn.corpus import Vocabulary
    from distattn.corpus.tokenized import DocumentTable, EncodedCorpus

    vocab = Vocabulary(["good", "bad", "movie"])                # <pad>=0 <unk>=1 good=2 bad=3 movie=4
    docs = [[2, 1, 4], [3, 1, 4, 0], [2, 4, 1], [3, 4, 1, 1]] * 3
    y = [1, 0, 1, 0] * 3
    n = len(docs)
    enc = EncodedCorpus(RaggedIds.from_sequences(docs), vocab, DocumentTable([-1] * n, [0] * n, [0] * n, ["all"]))
    clf = NBSVMClassifier(ngram_range=(1, 2)).fit(enc, y)
    V = clf.vocab_size_
    unigrams = clf.features_[clf.features_ < V]
    bigrams = clf.features_[clf.features_ >= V] - V
    assert sorted(unigrams.tolist()) == [2, 3, 4]
    assert not np.isin(bigrams // V, [0, 1]).any() and not np.isin(bigrams % V, [0, 1]).any()
    # the same model as the documents with <unk> and <pad> encoded as -1 (oov="negative")
    negative = [[-1 if t in (0, 1) else t for t in d] for d in docs]
    ref = NBSVMClassifier(ngram_range=(1, 2)).fit(negative, y)
    np.testing.assert_array_equal(clf.features_, ref.features_)
    np.testing.assert_allclose(clf.decision_function(enc), ref.decision_function(negative))
    # at prediction too: a document of unknown words scores the intercept alone
    unk_only = EncodedCorpus(RaggedIds.from_sequences([[1, 1, 0]]), vocab, DocumentTable([-1], [0], [0], ["all"]))
    np.testing.assert_allclose(clf.decision_function(unk_only), clf.intercept_)
