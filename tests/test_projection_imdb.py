"""Directional attention on real IMDB text (section 5): with W_Q, W_K the rank-d_k SVD factors of a
directional PPMI, M_dir = Q W_Q W_Kᵀ Qᵀ is clearly not symmetric, while the symmetric
projection M = Q S Qᵀ of symmetric counts is."""

from __future__ import annotations

import numpy as np
import pytest

from distattn.corpus import default_tokenizer, read_imdb_archive, tokenize_corpus
from distattn.projection import context_matrix, directional_context_matrix, directional_factors, factored_svd
from distattn.stats import cooccurrence, ppmi

pytestmark = pytest.mark.imdb

D_K = 32
SENTENCE = "one of the best movies i have ever seen , the acting was great and the story kept me watching until the end"


@pytest.fixture(scope="module")
def imdb_sample(imdb_archive):
    """2,500 train reviews (fixed seed), a 4,000-word vocabulary, OOV as -1."""
    docs = read_imdb_archive(imdb_archive, splits=("train",))
    pick = np.sort(np.random.default_rng(0).choice(len(docs), size=2500, replace=False))
    tc = tokenize_corpus([docs[i] for i in pick], cache=False)
    vocab = tc.vocabulary(max_size=4000, specials=())
    return tc.encode(vocab, oov="negative").tokens, vocab


@pytest.fixture(scope="module")
def directional(imdb_sample):
    docs, vocab = imdb_sample
    X = ppmi(cooccurrence(docs, len(vocab), window=5, weighting="harmonic", symmetric=False), cds=0.75)
    W_Q, W_K = directional_factors(X, D_K, algorithm="randomized", random_state=0)
    return X, W_Q, W_K


def _encode(vocab, text):
    ids = np.array([vocab.stoi.get(w, -1) for w in default_tokenizer()(text)])
    assert (ids >= 0).mean() > 0.9
    return ids


def _asymmetry(M):
    return np.linalg.norm(M - M.T) / np.linalg.norm(M)


def test_directional_ppmi_is_not_symmetric(directional, imdb_sample):
    X, _, _ = directional
    _, vocab = imdb_sample
    assert X.shape == (len(vocab), len(vocab)) and X.nnz > 100_000
    assert _asymmetry(X.toarray()) > 0.2
    of, the = vocab.stoi["of"], vocab.stoi["the"]
    assert X[of, the] > X[the, of]            # "the" follows "of" far more than the reverse


def test_rank_dk_factors_reproduce_the_truncated_svd(directional):
    X, W_Q, W_K = directional
    assert W_Q.shape == W_K.shape == (X.shape[0], D_K)
    _, s, _ = factored_svd(W_Q, W_K)
    assert np.all(np.diff(s) <= 1e-9 * s[0]) and s[-1] > 0
    # W_Q W_Kᵀ is the best rank-d_k approximation: it captures a real share of X
    sample = np.random.default_rng(1).choice(X.shape[0], 300, replace=False)
    block = X[sample][:, sample].toarray()
    approx = W_Q[sample] @ W_K[sample].T
    assert np.linalg.norm(block - approx) < np.linalg.norm(block)


def test_sentence_M_dir_has_a_clear_antisymmetric_part(directional, imdb_sample):
    _, W_Q, W_K = directional
    docs, vocab = imdb_sample
    ids = _encode(vocab, SENTENCE)
    M_dir = directional_context_matrix(ids, W_Q, W_K)
    known = ids >= 0
    assert M_dir.shape == (ids.size, ids.size)
    assert np.all(M_dir[~known] == 0) and np.all(M_dir[:, ~known] == 0)
    ratio = _asymmetry(M_dir)
    assert ratio > 0.05, ratio
    # the same holds for real review text, not just one sentence
    for doc in list(docs)[:5]:
        window = doc[doc >= 0][:40]
        assert _asymmetry(directional_context_matrix(window, W_Q, W_K)) > 0.05


def test_symmetric_projection_stays_symmetric(imdb_sample):
    docs, vocab = imdb_sample
    S = cooccurrence(docs, len(vocab), window=5, weighting="harmonic", symmetric=True)
    M = context_matrix(_encode(vocab, SENTENCE), S)
    np.testing.assert_array_equal(M, M.T)
