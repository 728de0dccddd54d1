"""Word-similarity evaluation, cross-checked against gensim's evaluate_word_pairs."""

from __future__ import annotations

import numpy as np
import pytest
from gensim.models import KeyedVectors
from gensim.test.utils import datapath

from distattn.stats.embeddings import SVDEmbeddings
from distattn.stats.similarity import (
    SIMILARITY_DATASETS,
    SimilarityResult,
    evaluate_similarity,
    load_similarity_dataset,
)


def test_load_bundled_datasets():
    ws = load_similarity_dataset("wordsim353")
    assert len(ws) == 353
    assert (ws.word1[0], ws.word2[0], ws.score[0]) == ("love", "sex", 6.77)
    sl = load_similarity_dataset("simlex999")
    assert len(sl) == 999
    assert (sl.word1[0], sl.word2[0], sl.score[0]) == ("old", "new", 1.58)


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"'men3000'.*\['simlex999', 'wordsim353'\]"):
        load_similarity_dataset("men3000")


def test_custom_file_and_bad_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("# comment\na\tb\t1.5\n\nc\td\t2\n", encoding="utf-8")
    data = load_similarity_dataset(str(path))
    assert data.word1 == ("a", "c") and list(data.score) == [1.5, 2.0]
    path.write_text("a b 1.5\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1"):
        load_similarity_dataset(str(path))


def random_keyed_vectors(name, keep=0.8, dim=16, seed=0):
    data = load_similarity_dataset(name)
    vocab = sorted({w.lower() for w in data.word1 + data.word2})
    rng = np.random.default_rng(seed)
    vocab = [w for w in vocab if rng.random() < keep] + ["zzz_extra"]
    kv = KeyedVectors(dim)
    kv.add_vectors(vocab, rng.standard_normal((len(vocab), dim)).astype(np.float32))
    return kv


@pytest.mark.parametrize("name", sorted(SIMILARITY_DATASETS))
def test_matches_gensim(name):
    kv = random_keyed_vectors(name)
    ours = evaluate_similarity(kv, name)
    pearson, spearman, oov_percent = kv.evaluate_word_pairs(datapath(SIMILARITY_DATASETS[name]))
    assert isinstance(ours, SimilarityResult)
    assert ours.spearman == pytest.approx(spearman.statistic, abs=1e-4)
    assert ours.pearson == pytest.approx(pearson.statistic, abs=1e-4)
    assert 100 * ours.oov_ratio == pytest.approx(oov_percent)
    assert ours.n_pairs == len(load_similarity_dataset(name))
    assert 0 < ours.n_found < ours.n_pairs
    assert ours.as_dict()["dataset"] == name


def test_input_kinds_agree():
    kv = random_keyed_vectors("wordsim353", seed=1)
    ref = evaluate_similarity(kv, "wordsim353")
    as_mapping = {k: kv[k] for k in kv.index_to_key}
    as_tuple = (kv.vectors, kv.index_to_key)
    data = load_similarity_dataset("wordsim353")
    triples = list(zip(data.word1, data.word2, data.score))
    for vectors, pairs in [(as_mapping, "wordsim353"), (as_tuple, data), (kv, triples)]:
        got = evaluate_similarity(vectors, pairs)
        assert got.spearman == pytest.approx(ref.spearman, abs=1e-9)
        assert got.n_found == ref.n_found


def test_lowercase_and_oov():
    vectors = {"Cat": np.array([1.0, 0.0]), "dog": np.array([0.9, 0.1]), "car": np.array([0.0, 1.0])}
    pairs = [("cat", "dog", 9.0), ("cat", "car", 1.0), ("dog", "car", 2.0), ("cat", "xyz", 5.0)]
    res = evaluate_similarity(vectors, pairs)
    assert (res.n_pairs, res.n_found, res.oov_ratio) == (4, 3, 0.25)
    assert res.spearman == pytest.approx(1.0)
    with pytest.raises(ValueError, match="Only 1 of the 4 pairs"):
        evaluate_similarity(vectors, pairs, lowercase=False)


def test_zero_vector_word_is_out_of_vocabulary():
    vectors = {"a": np.zeros(2), "b": np.array([1.0, 0.0]), "c": np.array([1.0, 0.1]), "d": np.array([0.0, 1.0])}
    pairs = [("a", "b", 0.0), ("b", "c", 1.0), ("a", "c", 0.5), ("c", "d", 0.2)]
    res = evaluate_similarity(vectors, pairs)
    assert (res.n_pairs, res.n_found, res.oov_ratio) == (4, 2, 0.5)   # a's pairs are excluded, not cosine 0
    assert res.spearman == pytest.approx(1.0)
    # when cases collapse, an all-zero "A" does not shadow a usable "a"
    res = evaluate_similarity({"A": np.zeros(2), "a": np.array([1.0, 0.0]), "b": np.array([0.8, 0.6]),
                               "c": np.array([0.0, 1.0])}, [("a", "b", 2.0), ("a", "c", 1.0)])
    assert (res.n_found, res.spearman) == (2, pytest.approx(1.0))


def test_zero_vector_coverage_agrees_with_keyed_vectors_export():
    rng = np.random.default_rng(3)
    X = rng.random((6, 10))
    X[1] = 0                                                     # "a" never co-occurred
    model = SVDEmbeddings(dim=3).fit(X, words=["p", "a", "b", "c", "d", "e"])
    pairs = [("a", "b", 1.0), ("c", "d", 2.0), ("b", "e", 3.0), ("c", "e", 0.5)]
    direct = evaluate_similarity(model, pairs)
    via_kv = evaluate_similarity(model.to_keyed_vectors(), pairs)
    assert "a" not in model.to_keyed_vectors()
    assert (direct.n_found, direct.oov_ratio) == (via_kv.n_found, via_kv.oov_ratio) == (3, 0.25)
    assert direct.spearman == pytest.approx(via_kv.spearman)
    assert direct.pearson == pytest.approx(via_kv.pearson, abs=1e-6)


def test_svd_embeddings_input():
    rng = np.random.default_rng(2)
    X = rng.random((6, 10))
    words = [None, "a", "b", "c", "d", "e"]
    model = SVDEmbeddings(dim=3).fit(X, words=words)
    pairs = [("a", "b", 1.0), ("c", "d", 2.0), ("a", "e", 3.0)]
    direct = evaluate_similarity(model, pairs)
    via_kv = evaluate_similarity(model.to_keyed_vectors(), pairs)
    assert direct.spearman == pytest.approx(via_kv.spearman)
    with pytest.raises(TypeError, match="KeyedVectors"):
        evaluate_similarity([1, 2, 3], pairs)


def test_non_finite_scores_and_vectors_are_refused_not_correlated(tmp_path):
    """A 'nan' score parsed as float('nan') and made spearman/pearson NaN; a NaN word vector gave a
    NaN cosine that spearmanr ranked as a number (a plausible-looking, wrong correlation)."""
    vectors = {"a": np.array([1.0, 0.0]), "b": np.array([1.0, 0.2]), "c": np.array([0.0, 1.0])}
    pairs = [("a", "b", 9.0), ("a", "c", 1.0), ("b", "c", 2.0)]
    assert evaluate_similarity(vectors, pairs).n_found == 3
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tb\t9\na\tc\tnan\nb\tc\t2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs.tsv, line 2: the score 'nan' is not a finite number"):
        evaluate_similarity(vectors, str(path))
    with pytest.raises(ValueError, match=r"pair 1 \('a', 'c'\) of 'pairs' has the score inf"):
        evaluate_similarity(vectors, [("a", "b", 9.0), ("a", "c", float("inf")), ("b", "c", 2.0)])
    with pytest.raises(ValueError, match=r"the vector of 'c' contains NaN or inf"):
        evaluate_similarity({**vectors, "c": np.array([np.nan, 1.0])}, pairs)


def test_dataset_file_with_byte_order_mark_or_another_encoding_or_missing(tmp_path):
    """A UTF-8 byte-order mark (Excel, Notepad) became part of the first word, so that pair was
    silently out of vocabulary; a Latin-1 file raised a bare UnicodeDecodeError without the file;
    a missing path was reported only as an unknown dataset name."""
    vectors = {"a": np.array([1.0, 0.0]), "b": np.array([1.0, 0.2]), "c": np.array([0.0, 1.0])}
    path = tmp_path / "pairs.tsv"
    path.write_bytes("\ufeffa\tb\t9\na\tc\t1\nb\tc\t2\n".encode("utf-8"))
    assert load_similarity_dataset(str(path)).word1 == ("a", "a", "b")
    assert evaluate_similarity(vectors, str(path)).n_found == 3
    path.write_bytes("caf\xe9\tb\t9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"pairs.tsv: not UTF-8 .*re-encode the file as UTF-8"):
        load_similarity_dataset(str(path))
    with pytest.raises(ValueError, match=r"'.*missing.tsv' \(no such file\); valid names"):
        evaluate_similarity(vectors, str(tmp_path / "missing.tsv"))
    with pytest.raises(ValueError, match=r"\(a directory, not a file\)"):
        evaluate_similarity(vectors, str(tmp_path))


def test_constant_cosines_give_nan_without_scipys_warning():
    """Every cosine equal (here: every vector the same): the correlations are undefined, NaN, and
    `stats --evaluate` printed scipy's ConstantInputWarning lines beside its null."""
    import warnings
    vectors = {w: np.ones(3) for w in ("a", "b", "c", "d")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = evaluate_similarity(vectors, [("a", "b", 1.0), ("c", "d", 2.0), ("a", "d", 3.0)])
    assert np.isnan(res.spearman) and np.isnan(res.pearson) and res.n_found == 3
