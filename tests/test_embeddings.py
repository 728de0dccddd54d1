"""Truncated-SVD embeddings: reconstruction, eig semantics, w+c, signs, export."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose
from sklearn.utils.estimator_checks import parametrize_with_checks

from distattn.memory import MemoryBudgetError
from distattn.stats.embeddings import SVDEmbeddings, truncated_svd
from distattn.stats.weighting import ppmi

ALGORITHMS = ["arpack", "randomized"]


def low_rank(n_rows=30, n_cols=20, rank=3, seed=0):
    rng = np.random.default_rng(seed)
    # well-separated singular values so both algorithms agree on every triplet
    left, _ = np.linalg.qr(rng.standard_normal((n_rows, rank)))
    right, _ = np.linalg.qr(rng.standard_normal((n_cols, rank)))
    return left @ np.diag([9.0, 4.0, 1.5][:rank]) @ right.T


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("as_sparse", [False, True])
def test_reconstruction_and_singular_values(algorithm, as_sparse):
    X = low_rank()
    model = SVDEmbeddings(dim=3, eig=1.0, normalize=False, algorithm=algorithm)
    model.fit(sp.csr_array(X) if as_sparse else X)
    assert_allclose(model.singular_values_, [9.0, 4.0, 1.5], rtol=1e-8)
    assert_allclose(model.word_vectors_ @ model.components_, X, atol=1e-8)
    assert model.word_vectors_.shape == (30, 3)
    assert model.context_vectors_.shape == (20, 3)
    assert model.vectors_ is model.word_vectors_


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_eig_semantics(algorithm):
    X = low_rank()
    s = np.array([9.0, 4.0, 1.5])
    m0 = SVDEmbeddings(dim=3, eig=0.0, normalize=False, algorithm=algorithm).fit(X)
    assert_allclose(m0.word_vectors_.T @ m0.word_vectors_, np.eye(3), atol=1e-10)  # bare U
    assert_allclose(m0.context_vectors_, m0.components_.T, atol=1e-12)
    m1 = SVDEmbeddings(dim=3, eig=1.0, normalize=False, algorithm=algorithm).fit(X)
    assert_allclose(m1.word_vectors_, m0.word_vectors_ * s, atol=1e-8)  # U Σ
    half = SVDEmbeddings(dim=3, eig=0.5, normalize=False, algorithm=algorithm).fit(X)
    assert_allclose(half.word_vectors_ @ half.context_vectors_.T, X, atol=1e-8)
    assert_allclose(half.word_vectors_, m0.word_vectors_ * np.sqrt(s), atol=1e-8)


def test_signs_are_deterministic_and_algorithm_independent():
    X = low_rank()
    runs = [
        SVDEmbeddings(dim=3, eig=1.0, normalize=False, algorithm=a, random_state=seed).fit(X)
        for a in ALGORITHMS
        for seed in (0, 1, 12345)
    ]
    for other in runs[1:]:
        assert_allclose(other.word_vectors_, runs[0].word_vectors_, atol=1e-8)
        assert_allclose(other.components_, runs[0].components_, atol=1e-8)
    u = runs[0].word_vectors_
    biggest = np.argmax(np.abs(u), axis=0)
    assert np.all(u[biggest, np.arange(3)] > 0)


def test_truncated_svd_flip_preserves_product_and_matches_numpy():
    rng = np.random.default_rng(5)
    X = sp.random_array((40, 25), density=0.3, rng=rng, format="csr")
    u, s, vt = truncated_svd(X, 5)
    ref = np.linalg.svd(X.toarray(), compute_uv=False)[:5]
    assert_allclose(s, ref, rtol=1e-8)
    assert np.all(np.diff(s) <= 0)
    U, S, Vt = np.linalg.svd(X.toarray())
    assert_allclose((u * s) @ vt, (U[:, :5] * S[:5]) @ Vt[:5], atol=1e-8)


def test_wc_and_normalize():
    rng = np.random.default_rng(6)
    counts = rng.poisson(1.0, size=(25, 25)).astype(float)
    counts = counts + counts.T
    P = ppmi(sp.csr_array(counts), cds=0.75)
    model = SVDEmbeddings(dim=4, eig=0.5, wc=True).fit(P)
    summed = model.word_vectors_ + model.context_vectors_
    expected = summed / np.linalg.norm(summed, axis=1, keepdims=True)
    assert_allclose(model.vectors_, expected, atol=1e-12)
    assert_allclose(np.linalg.norm(model.vectors_, axis=1), 1.0)
    plain = SVDEmbeddings(dim=4, eig=0.5).fit(P)
    assert plain.vectors_ is not plain.word_vectors_
    norms = np.linalg.norm(plain.word_vectors_, axis=1, keepdims=True)
    assert_allclose(plain.vectors_, plain.word_vectors_ / norms, atol=1e-12)


def test_zero_rows_stay_zero_and_finite():
    X = low_rank()
    X[4] = 0
    model = SVDEmbeddings(dim=3).fit(X)
    assert np.all(np.isfinite(model.vectors_))
    assert_allclose(model.vectors_[4], 0, atol=1e-12)


@pytest.mark.parametrize("eig", [0.0, 0.5, 1.0])
def test_transform_folds_rows_in(eig):
    X = low_rank()
    raw = SVDEmbeddings(dim=3, eig=eig, normalize=False).fit(X)
    assert_allclose(raw.transform(X), raw.word_vectors_, atol=1e-8)
    assert_allclose(raw.transform(sp.csr_array(X[:5])), raw.word_vectors_[:5], atol=1e-8)
    normed = SVDEmbeddings(dim=3, eig=eig).fit(X)
    assert_allclose(normed.transform(X), normed.vectors_, atol=1e-8)
    assert_allclose(normed.fit_transform(X), normed.vectors_, atol=1e-8)


def test_transform_with_zero_singular_value_is_finite():
    X = low_rank(rank=2)  # rank 2, but ask for 3 triplets
    model = SVDEmbeddings(dim=3, eig=0.5, normalize=False).fit(X)
    assert model.singular_values_[2] < 1e-8
    out = model.transform(X)
    assert np.all(np.isfinite(out))
    assert_allclose(out[:, 2], 0)
    with pytest.raises(ValueError, match="expecting 20 features"):
        model.transform(X[:, :5])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("eig", [0.0, 0.5])
def test_directions_past_the_rank_are_zero_in_fit_as_in_transform(algorithm, eig):
    X = low_rank(rank=2)  # rank 2, dim 3: the third singular vectors are an arbitrary completion
    raw = SVDEmbeddings(dim=3, eig=eig, normalize=False, algorithm=algorithm).fit(X)
    assert_allclose(raw.word_vectors_[:, 2], 0, atol=0)
    assert_allclose(raw.context_vectors_[:, 2], 0, atol=0)
    assert_allclose(raw.transform(X), raw.word_vectors_, atol=1e-8)
    normed = SVDEmbeddings(dim=3, eig=eig, algorithm=algorithm).fit(X)
    assert_allclose(normed.vectors_, normed.transform(X), atol=1e-8)
    # rows 0 and 1 of a rank-1 matrix are proportional: one direction, cosine 1
    X1 = np.outer([1.0, 2, 3, 4, 5, 6], [1.0, 1, 2, 0, 1, 3, 1])
    one = SVDEmbeddings(dim=3, eig=eig, algorithm=algorithm).fit(X1)
    assert_allclose(one.vectors_ @ one.vectors_.T, np.ones((6, 6)), atol=1e-8)


def test_keyed_vectors_round_trip():
    rng = np.random.default_rng(7)
    counts = rng.poisson(2.0, size=(12, 30)).astype(float)
    counts[3] = counts[2] * 2  # word 3 shares word 2's contexts
    words = ["<pad>", "<unk>"] + [f"w{i}" for i in range(2, 12)]
    model = SVDEmbeddings(dim=5).fit(ppmi(sp.csr_array(counts)), words=words)
    kv = model.to_keyed_vectors([None, None] + words[2:])
    assert kv.index_to_key == words[2:]
    assert kv.vector_size == 5
    assert_allclose(kv["w7"], model.vectors_[7], rtol=1e-6)
    assert kv.most_similar("w2", topn=1)[0][0] == "w3"
    assert len(model.to_keyed_vectors()) == 12  # words from fit
    kv64 = model.to_keyed_vectors(words, dtype=np.float64)
    assert kv64.vectors.dtype == np.float64
    assert_allclose(kv64.vectors, model.vectors_)


def test_keyed_vectors_leave_out_words_that_never_co_occurred():
    # <pad> and <unk> get no counts when out-of-vocabulary tokens are dropped before counting; their
    # zero rows came out of gensim's most_similar with a NaN similarity
    rng = np.random.default_rng(3)
    counts = rng.poisson(2.0, size=(10, 10)).astype(float)
    counts = counts + counts.T
    counts[:2] = 0
    counts[:, :2] = 0
    words = ["<pad>", "<unk>"] + [f"w{i}" for i in range(2, 10)]
    model = SVDEmbeddings(dim=3).fit(ppmi(sp.csr_array(counts)), words=words)
    assert not model.vectors_[:2].any()
    kv = model.to_keyed_vectors()
    assert kv.index_to_key == words[2:]
    assert all(np.isfinite(sim) for _, sim in kv.most_similar("w4", topn=20))
    assert model.to_keyed_vectors(drop_zero=False).index_to_key == words
    with pytest.raises(ValueError, match="repeated: \\['<pad>'\\]"):   # checked before zero rows go
        model.to_keyed_vectors(["<pad>", "<pad>"] + words[2:])


def test_errors(monkeypatch):
    X = low_rank()
    for bad in (0, 20, 2.5, True):
        with pytest.raises(ValueError, match=r"dim must be .*min\(X.shape\) = 20"):
            SVDEmbeddings(dim=bad).fit(X)
    with pytest.raises(ValueError, match=r"algorithm must be one of .*'lanczos'"):
        SVDEmbeddings(dim=3, algorithm="lanczos").fit(X)
    with pytest.raises(ValueError, match=r"eig must be .*-1"):
        SVDEmbeddings(dim=3, eig=-1).fit(X)
    with pytest.raises(ValueError, match="square"):
        SVDEmbeddings(dim=3, wc=True).fit(X)
    with pytest.raises(ValueError, match="words has 2 entries but X has 30 rows"):
        SVDEmbeddings(dim=3).fit(X, words=["a", "b"])
    model = SVDEmbeddings(dim=3).fit(X)
    with pytest.raises(ValueError, match="needs words"):
        model.to_keyed_vectors()
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        model.to_keyed_vectors(["a"] * 2 + [str(i) for i in range(28)])
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", "1K")
    with pytest.raises(MemoryBudgetError, match="SVDEmbeddings"):
        SVDEmbeddings(dim=3).fit(X)


def test_svd_refuses_non_finite_input_and_integer_dtypes():
    from distattn.stats.embeddings import truncated_svd
    X = np.eye(5)
    X[2, 3] = np.nan
    with pytest.raises(ValueError, match="X contains NaN or inf"):          # once ARPACK's own error
        truncated_svd(sp.csr_array(X), 2)
    with pytest.raises(ValueError, match="dtype must be float32 or float64, got int64"):
        SVDEmbeddings(dim=2, dtype=np.int64).fit(sp.csr_array(np.eye(5)))  # once all-zero vectors


def test_sparse_formats_without_a_flat_data_array_still_reach_the_svd():
    X = np.diag([5.0, 4.0, 3.0, 2.0, 1.0])
    for fmt in (sp.lil_array, sp.dok_array, sp.csr_array):
        _, s, _ = truncated_svd(fmt(X), 2)
        assert_allclose(s, [5.0, 4.0])


@pytest.mark.parametrize("algorithm", ["arpack", "randomized"])
@pytest.mark.parametrize("sparse", [False, True])
def test_an_all_zero_matrix_gives_zero_vectors_with_either_algorithm(algorithm, sparse):
    """ARPACK raised ArpackError 'Starting vector is zero' on an all-zero matrix (e.g. the PPMI of a
    small corpus with a large neg); the randomized solver already gave zeros."""
    X = sp.csr_array((5, 5)) if sparse else np.zeros((5, 5))
    model = SVDEmbeddings(dim=2, algorithm=algorithm).fit(X)
    assert model.vectors_.shape == (5, 2) and not model.vectors_.any()
    assert not model.singular_values_.any() and model.components_.shape == (2, 5)
    assert not model.transform(X).any()


def test_inputs_of_the_wrong_kind_are_refused_by_name():
    """truncated_svd on a list of rows raised AttributeError ('list' object has no attribute 'shape')
    and on a 1-D array 'not enough values to unpack'; words='abc' was split into characters."""
    u, s, vt = truncated_svd([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], 1)
    assert_allclose(s, [3.0])
    with pytest.raises(ValueError, match=r"X must be a 2-D matrix .*shape \(3,\)"):
        truncated_svd(np.ones(3), 1)
    X = np.diag([3.0, 2.0, 1.0])
    with pytest.raises(TypeError, match="words='abc' is a string"):
        SVDEmbeddings(dim=1).fit(X, words="abc")
    with pytest.raises(TypeError, match="words='abc' is a string"):
        SVDEmbeddings(dim=1).fit(X).to_keyed_vectors("abc")


def test_fit_takes_y_second_so_a_pipeline_does_not_pass_labels_as_words():
    """fit's signature was fit(X, words=None, y=None): scikit-learn passes y as the second positional
    argument (Pipeline, cross-validation, check_fit_score_takes_y), so the labels became ``words_``
    (and a y that is not a list raised TypeError). y comes second now and is ignored; words is
    given by keyword."""
    from sklearn.pipeline import make_pipeline
    from sklearn.utils.estimator_checks import check_fit_score_takes_y

    from distattn.stats.weighting import PPMITransformer

    X = low_rank()
    labels = np.arange(X.shape[0]) % 2
    check_fit_score_takes_y("SVDEmbeddings", SVDEmbeddings(dim=1))
    assert SVDEmbeddings(dim=3).fit(X, labels).words_ is None
    pipe = make_pipeline(PPMITransformer(), SVDEmbeddings(dim=3)).fit(np.abs(X), labels)
    assert pipe[-1].words_ is None
    words = [f"w{i}" for i in range(X.shape[0])]
    assert SVDEmbeddings(dim=3).fit(X, words=words).words_ == words
    assert SVDEmbeddings(dim=3).fit(X, None, words).words_ == words


def _svd_expected_failures(estimator):
    # With one sample or one feature no dim satisfies 1 <= dim < min(X.shape); the error says so
    # in those words rather than in the phrases these checks look for.
    reason = "the error names the dim bound 1 <= dim < min(X.shape), not '1 sample' / '1 feature'"
    return {"check_fit2d_1sample": reason, "check_fit2d_1feature": reason}


@pytest.mark.filterwarnings("ignore")
@parametrize_with_checks([SVDEmbeddings(dim=1), SVDEmbeddings(dim=1, algorithm="arpack", eig=1.0)],
                         expected_failed_checks=_svd_expected_failures)
def test_sklearn_compatible(estimator, check):
    """SVDEmbeddings accepts sparse input, but its tags said input_tags.sparse=False
    (check_estimator_sparse_tag: 'The tag is inconsistent and must be fixed')."""
    check(estimator)


def test_words_given_where_y_goes_are_named_in_a_warning():
    """fit(X, words) (the order before y came second) would drop the words unseen: a y holding a
    distinct string per row warns; class labels (repeated strings, numbers) do not."""
    import warnings

    X = low_rank()
    words = [f"w{i}" for i in range(X.shape[0])]
    with pytest.warns(UserWarning, match="pass them as words="):
        assert SVDEmbeddings(dim=3).fit(X, words).words_ is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SVDEmbeddings(dim=3).fit(X, ["pos", "neg"] * (X.shape[0] // 2) + ["pos"] * (X.shape[0] % 2))
        SVDEmbeddings(dim=3).fit(X, np.arange(X.shape[0]))
