import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from distattn.corpus import EmptyCorpusError, RaggedIds, Vocabulary
from distattn.corpus.tokenized import DocumentTable, EncodedCorpus
from distattn.memory import MemoryBudgetError
from distattn.stats import cooccurrence
from distattn.stats.reference import coo_cooccurrence, reference_cooccurrence

V = 12


def corpora(max_docs=6, max_len=30, vocab=V, oov=True):
    lo = -1 if oov else 0
    return st.lists(st.lists(st.integers(lo, vocab - 1), max_size=max_len), min_size=1, max_size=max_docs).filter(
        lambda docs: any(t >= 0 for d in docs for t in d))


def assert_same(a, b, rtol=1e-12):
    a, b = sp.csr_array(a), sp.csr_array(b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a.toarray(), b.toarray(), rtol=rtol, atol=1e-12)


def test_hand_example():
    # "a b a" with window 2: pairs (a,b)@1, (b,a)@1, (a,a)@2
    S = cooccurrence([[0, 1, 0]], 2, window=2, weighting="harmonic")
    np.testing.assert_allclose(S.toarray(), [[2 * 0.5, 2.0], [2.0, 0.0]])
    D = cooccurrence([[0, 1, 0]], 2, window=2, weighting="harmonic", symmetric=False)
    np.testing.assert_allclose(D.toarray(), [[0.5, 1.0], [1.0, 0.0]])


@settings(max_examples=60, deadline=None)
@given(docs=corpora(), window=st.integers(1, 7), weighting=st.sampled_from(["none", "harmonic"]),
       symmetric=st.booleans(), oov=st.sampled_from(["drop", "gap"]))
def test_matches_glove_reference(docs, window, weighting, symmetric, oov):
    ours = cooccurrence(docs, V, window=window, weighting=weighting, symmetric=symmetric, oov=oov, n_jobs=2)
    ref = reference_cooccurrence(docs, V, window, weighting, symmetric, oov)
    assert_same(ours, ref)
    assert ours.has_canonical_format and ours.indices.dtype == np.int32


@settings(max_examples=40, deadline=None)
@given(docs=corpora(), window=st.integers(1, 6), weighting=st.sampled_from(["none", "harmonic"]))
def test_symmetric_is_symmetric_and_sum_of_directions(docs, window, weighting):
    S = cooccurrence(docs, V, window=window, weighting=weighting)
    D = cooccurrence(docs, V, window=window, weighting=weighting, symmetric=False)
    assert abs(S - S.T).max() == 0
    assert_same(S, D + D.T)
    # the "before" matrix is the transpose of the "after" one
    rev = [list(reversed(d)) for d in docs]
    assert_same(cooccurrence(rev, V, window=window, weighting=weighting, symmetric=False), D.T)


@settings(max_examples=40, deadline=None)
@given(docs=corpora(oov=False), window=st.integers(1, 6))
def test_unweighted_total_is_number_of_pairs(docs, window):
    D = cooccurrence(docs, V, window=window, symmetric=False)
    n_pairs = sum(max(0, len(d) - k) for d in docs for k in range(1, window + 1))
    assert D.sum() == n_pairs
    assert cooccurrence(docs, V, window=window).sum() == 2 * n_pairs


@settings(max_examples=40, deadline=None)
@given(docs=corpora(), window=st.integers(1, 6), symmetric=st.booleans(), oov=st.sampled_from(["drop", "gap"]))
def test_per_offset_sums_to_window(docs, window, symmetric, oov):
    per = cooccurrence(docs, V, window=window, per_offset=True, symmetric=symmetric, oov=oov)
    assert len(per) == window
    assert_same(sum(per[1:], per[0]), cooccurrence(docs, V, window=window, symmetric=symmetric, oov=oov))
    for d in range(1, window + 1):
        assert_same(per[d - 1], reference_cooccurrence(docs, V, window, "none", symmetric, oov, offset=d))
    harm = cooccurrence(docs, V, window=window, per_offset=True, weighting="harmonic", symmetric=symmetric, oov=oov)
    assert_same(sum(harm[1:], harm[0]),
                cooccurrence(docs, V, window=window, weighting="harmonic", symmetric=symmetric, oov=oov))


def test_oov_drop_vs_gap_distances():
    docs = [[0, -1, 1]]
    assert cooccurrence(docs, 2, window=1, oov="drop")[0, 1] == 1   # distance counts in-vocab tokens only
    assert cooccurrence(docs, 2, window=1, oov="gap")[0, 1] == 0    # the OOV token keeps its place
    assert cooccurrence(docs, 2, window=2, oov="gap", weighting="harmonic")[0, 1] == 0.5


def test_documents_are_boundaries():
    S = cooccurrence([[0, 1], [2, 3]], 4, window=5)
    assert S[1, 2] == 0 and S[0, 1] == 1 and S[2, 3] == 1


def test_chunked_threaded_identical():
    rng = np.random.default_rng(0)
    docs = [rng.integers(-1, 50, size=rng.integers(0, 200)) for _ in range(300)]
    base = cooccurrence(docs, 50, window=10, weighting="harmonic", n_jobs=1)
    for kw in ({"n_jobs": 2}, {"chunk_tokens": 997}, {"chunk_tokens": 1, "n_jobs": 2}):
        other = cooccurrence(docs, 50, window=10, weighting="harmonic", **kw)
        assert np.array_equal(base.indptr, other.indptr) and np.array_equal(base.indices, other.indices)
        assert np.array_equal(base.data, other.data)   # bit-identical, not just close
    assert_same(base, coo_cooccurrence(RaggedIds.from_sequences(docs).drop(np.concatenate(docs) >= 0), 50, 10,
                                       "harmonic"))


def test_encoded_corpus_unk_is_oov():
    vocab = Vocabulary(["a", "b"])  # <pad>=0 <unk>=1 a=2 b=3
    enc = EncodedCorpus(RaggedIds.from_sequences([[2, 1, 3]]), vocab,
                        DocumentTable([-1], [0], [0], ["all"]))
    S = cooccurrence(enc, window=1)
    assert S.shape == (4, 4) and S[2, 3] == 1 and S[1].sum() == 0


@pytest.mark.parametrize("kw, match", [
    ({"window": 0}, "window must be a positive integer, got 0"),
    ({"window": -3}, "window must be a positive integer"),
    ({"window": 2.5}, "window must be a positive integer"),
    ({"weighting": "linear"}, "weighting='linear' is not one of"),
    ({"oov": "keep"}, "oov='keep' is not one of"),
    ({"backend": "spark"}, "backend='spark'"),
    ({"symmetric": "no"}, "symmetric must be True or False, got 'no'"),        # once truthy: the symmetric S
    ({"per_offset": 1}, "per_offset must be True or False, got 1"),
    ({"chunk_tokens": 2.5}, "chunk_tokens must be an integer >= 1, got 2.5"),   # once accepted
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        cooccurrence([[0, 1]], 2, **kw)


def test_empty_inputs():
    with pytest.raises(EmptyCorpusError, match="no documents"):
        cooccurrence([], 5, window=2)
    with pytest.raises(EmptyCorpusError, match="no in-vocabulary tokens"):
        cooccurrence([[], []], 5, window=2)
    with pytest.raises(EmptyCorpusError, match="no in-vocabulary tokens"):
        cooccurrence([[-1, -1]], 5, window=2)
    # empty documents among others are fine
    S = cooccurrence([[], [0, 1], []], 2, window=2)
    assert S.sum() == 2


def test_ids_out_of_range():
    with pytest.raises(ValueError, match="token id 7 is out of range for vocab_size=5"):
        cooccurrence([[0, 7]], 5, window=2)


def test_refuses_vocabulary_too_large_before_allocating():
    with pytest.raises(MemoryBudgetError, match="vocab_size=2,000,000,000"):
        cooccurrence([[0, 1, 2]], 2_000_000_000, window=2)
    with pytest.raises(MemoryBudgetError, match="would need about"):
        cooccurrence([[0, 1, 2]], 100_000, window=2, max_memory=1 << 20)


def test_an_explicit_max_memory_is_named_in_the_refusal(monkeypatch):
    """With max_memory= given, the refusal said "set DISTATTN_MAX_MEMORY to change the limit",
    which changes nothing there; max_memory=inf (no limit) raised OverflowError, and a negative,
    NaN, bool or "8G" one gave a bare int() error or a refusal of "-1 B allowed"."""
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", "1T")
    with pytest.raises(MemoryBudgetError, match="would need about") as exc:
        cooccurrence([[0, 1, 2]], 100_000, window=2, max_memory=1 << 20)
    assert "DISTATTN_MAX_MEMORY" not in str(exc.value) and "max_memory" in str(exc.value)
    assert cooccurrence([[0, 1, 2]], 3, window=2, max_memory=float("inf")).nnz == 6
    for bad in (-1, float("nan"), True, "8G"):
        with pytest.raises(ValueError, match=r"max_memory must be a number of bytes >= 0 \(inf: no limit\); got "):
            cooccurrence([[0, 1, 2]], 3, window=2, max_memory=bad)


def test_memory_estimate_counts_the_threads_counting_uses(monkeypatch):
    """The per-thread scratch was multiplied by os.cpu_count() even with n_jobs=1, so on a
    many-core host a single-threaded count that fits was refused."""
    import os
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    docs = [[0, 1, 2, 1, 0]]
    assert cooccurrence(docs, 100_000, window=2, n_jobs=1, max_memory=32 << 20).nnz == 7
    with pytest.raises(MemoryBudgetError, match="would need about"):     # 64 threads' scratch does not fit
        cooccurrence(docs, 100_000, window=2, max_memory=32 << 20)

@pytest.mark.imdb
def test_imdb_counts_match_reference_on_a_sample(imdb_tokenized):
    sample = imdb_tokenized.sample(200, seed=1)
    vocab = imdb_tokenized.vocabulary(max_size=5000)
    enc = sample.encode(vocab, oov="negative")
    S = cooccurrence(enc, window=10, weighting="harmonic")
    ref = reference_cooccurrence(list(enc.tokens), len(vocab), 10, "harmonic", True, "drop")
    assert_same(S, ref)
    assert S.nnz > 10_000


def test_empty_inputs_without_vocab_size_are_empty_corpus_errors():
    """Without vocab_size, [[], []] or all-OOV ids were reported as 'vocab_size must be a positive
    integer, got 0', blaming an argument the caller never passed; vocab_size=True was read as 1."""
    with pytest.raises(EmptyCorpusError, match="2 documents but no in-vocabulary tokens"):
        cooccurrence([[], []], window=2)
    with pytest.raises(EmptyCorpusError, match="no in-vocabulary tokens"):
        cooccurrence([[-1, -1]], window=2)
    with pytest.raises(ValueError, match="vocab_size must be a positive integer, got True"):
        cooccurrence([[0, 0]], True, window=2)


def _all_pairs(docs, n, window, weighting, symmetric, oov, unk=None):
    """An independent brute force: every ordered pair of positions (i, j) of a document, i < j."""
    M = np.zeros((n, n))
    for doc in docs:
        toks = [-1 if t == unk else int(t) for t in doc]
        if oov == "drop":
            toks = [t for t in toks if t >= 0]
        for i in range(len(toks)):
            for j in range(len(toks)):
                d = j - i
                if 1 <= d <= window and toks[i] >= 0 and toks[j] >= 0:
                    w = 1.0 / d if weighting == "harmonic" else 1.0
                    M[toks[i], toks[j]] += w
                    if symmetric:
                        M[toks[j], toks[i]] += w
    return M


@pytest.mark.parametrize("window", [1, 3, 9, 40])           # 9 and 40: wider than every document
@pytest.mark.parametrize("oov", ["drop", "gap"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("weighting", ["none", "harmonic"])
def test_all_pairs_brute_force_with_short_and_empty_documents(window, oov, symmetric, weighting):
    docs = [[], [3], [0, -1, 1], [2, 2, -1, -1, 0, 3, 1, 2], [-1], [1, 0], []]
    got = cooccurrence(docs, 4, window=window, weighting=weighting, symmetric=symmetric, oov=oov, chunk_tokens=2)
    assert_same(got, _all_pairs(docs, 4, window, weighting, symmetric, oov), rtol=1e-15)


@pytest.mark.parametrize("oov", ["drop", "gap"])
def test_encoded_corpus_unk_follows_the_oov_mode(oov):
    vocab = Vocabulary(["a", "b"])  # <pad>=0 <unk>=1 a=2 b=3
    docs = [[2, 1, 3, 1, 1, 2], [1], [3, 2]]
    enc = EncodedCorpus(RaggedIds.from_sequences(docs), vocab, DocumentTable([-1] * 3, [0] * 3, [0] * 3, ["all"]))
    for window in (1, 2, 6):
        got = cooccurrence(enc, window=window, weighting="harmonic", oov=oov)
        assert_same(got, _all_pairs(docs, 4, window, "harmonic", True, oov, unk=1), rtol=1e-15)


@pytest.mark.parametrize("symmetric", [True, False])
def test_harmonic_counts_past_the_integer_range_are_accurate_and_chunk_independent(symmetric):
    # 6,000 (directional: 12,000) documents of 1,000 copies of one word, window 22: the entry
    # times lcm(1..22) passes 2**53, where the integer weights lcm/d stopped summing exactly. The
    # one-chunk count was off by about 1e-10 relative and differed from a chunked (or Dask) count.
    from fractions import Fraction
    n_docs, length, window = 6000 if symmetric else 12000, 1000, 22
    r = RaggedIds(np.zeros(n_docs * length, np.int32), np.arange(n_docs + 1, dtype=np.int64) * length)
    true = (2 if symmetric else 1) * n_docs * sum(Fraction(length - d, d) for d in range(1, window + 1))
    whole = cooccurrence(r, 1, window=window, weighting="harmonic", symmetric=symmetric, n_jobs=1)
    chunked = cooccurrence(r, 1, window=window, weighting="harmonic", symmetric=symmetric, n_jobs=1,
                           chunk_tokens=7 * length)
    for m in (whole, chunked):
        assert m.dtype == np.float64 and abs(m.data[0] - float(true)) <= 1e-13 * float(true)
    assert whole.data[0] == chunked.data[0]      # bit for bit
