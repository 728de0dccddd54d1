"""Word-similarity benchmarks: WordSim-353 and SimLex-999 from gensim's bundled test data.

The score of a pair is the cosine similarity of its two word vectors; the result is the
Spearman (and Pearson) correlation with the human ratings over the pairs whose words are
both in the vocabulary. Pairs with an out-of-vocabulary word are *excluded* (gensim's
default, ``dummy4unknown=False``) and counted in ``oov_ratio``; results on different
vocabularies are therefore only comparable together with ``n_found``. A word whose vector is
all zeros (it never co-occurred) has no direction and counts as out of vocabulary, as in
``SVDEmbeddings.to_keyed_vectors()``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping

import numpy as np
from scipy import stats

__all__ = [
    "SIMILARITY_DATASETS",
    "SimilarityDataset",
    "SimilarityResult",
    "load_similarity_dataset",
    "evaluate_similarity",
]

# name -> file name in gensim's test data (gensim.test.utils.datapath)
SIMILARITY_DATASETS = {"wordsim353": "wordsim353.tsv", "simlex999": "simlex999.txt"}


@dataclasses.dataclass(frozen=True)
class SimilarityDataset:
    """Word pairs with human similarity ratings: ``word1[i]``, ``word2[i]``, ``score[i]``
    (each of length n_pairs)."""

    name: str
    word1: tuple[str, ...]
    word2: tuple[str, ...]
    score: np.ndarray

    def __len__(self) -> int:
        return len(self.score)


@dataclasses.dataclass(frozen=True)
class SimilarityResult:
    """Correlations with human ratings over the ``n_found`` in-vocabulary pairs.

    ``oov_ratio = (n_pairs - n_found) / n_pairs`` is a fraction in [0, 1] (gensim reports the
    same quantity in percent).
    """

    dataset: str
    spearman: float
    pearson: float
    n_pairs: int
    n_found: int
    oov_ratio: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _parse_pairs(lines, source: str) -> tuple[list[str], list[str], list[float]]:
    w1, w2, score = [], [], []
    for line_no, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        try:
            a, b, s = parts
            value = float(s)
        except ValueError:
            raise ValueError(
                f"{source}, line {line_no}: expected 'word1<TAB>word2<TAB>score', got {line!r}"
            ) from None
        if not math.isfinite(value):  # a NaN score made both correlations NaN
            raise ValueError(f"{source}, line {line_no}: the score {s!r} is not a finite number")
        w1.append(a)
        w2.append(b)
        score.append(value)
    return w1, w2, score


def load_similarity_dataset(name: str) -> SimilarityDataset:
    """Load a word-similarity dataset.

    Parameters
    ----------
    name : str
        ``"wordsim353"`` or ``"simlex999"`` (gensim's bundled copies), or a path to a file in
        the same format: ``#`` comment lines, then ``word1<TAB>word2<TAB>score`` lines.

    Returns
    -------
    SimilarityDataset with 353 / 999 pairs for the bundled sets (words as written in the file).
    """
    if name in SIMILARITY_DATASETS:
        from gensim.test.utils import datapath

        path = datapath(SIMILARITY_DATASETS[name])
    elif os.path.isfile(name):
        path = name
    else:
        looks_like_path = os.sep in name or "/" in name or os.path.splitext(name)[1]
        why = " (a directory, not a file)" if os.path.isdir(name) else " (no such file)" if looks_like_path else ""
        raise ValueError(
            f"Unknown similarity dataset {name!r}{why}; valid names are "
            f"{sorted(SIMILARITY_DATASETS)}, or the path of a tab-separated pairs file."
        )
    try:  # utf-8-sig: a byte-order mark once became part of the first word, silently out of vocabulary
        with open(path, encoding="utf-8-sig") as fh:
            w1, w2, score = _parse_pairs(fh, str(path))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 ({exc.reason}); re-encode the file as UTF-8") from None
    return SimilarityDataset(str(name), tuple(w1), tuple(w2), np.asarray(score, dtype=np.float64))


def _vocabulary(vectors) -> tuple[np.ndarray, list]:
    """(matrix (n, dim), keys in row order) from KeyedVectors, a fitted SVDEmbeddings, a
    mapping word -> vector, or a ``(matrix, words)`` pair."""
    if hasattr(vectors, "index_to_key") and hasattr(vectors, "vectors"):  # KeyedVectors
        return np.asarray(vectors.vectors), list(vectors.index_to_key)
    if hasattr(vectors, "to_keyed_vectors") and hasattr(vectors, "vectors_"):  # SVDEmbeddings
        if getattr(vectors, "words_", None) is None:
            raise ValueError("The SVDEmbeddings was fitted without words; pass (vectors_, words).")
        keep = [i for i, w in enumerate(vectors.words_) if w is not None]
        return vectors.vectors_[keep], [vectors.words_[i] for i in keep]
    if isinstance(vectors, Mapping):
        keys = list(vectors)
        if not keys:
            return np.zeros((0, 0)), []
        return np.stack([np.asarray(vectors[k], dtype=np.float64) for k in keys]), keys
    if isinstance(vectors, tuple) and len(vectors) == 2:
        matrix, words = np.asarray(vectors[0]), list(vectors[1])
        if matrix.ndim != 2 or matrix.shape[0] != len(words):
            raise ValueError(
                f"(matrix, words) needs a 2-D matrix with one row per word; got matrix shape "
                f"{matrix.shape} and {len(words)} words."
            )
        return matrix, words
    raise TypeError(
        "vectors must be gensim KeyedVectors, a fitted SVDEmbeddings, a mapping word -> "
        f"vector, or a (matrix, words) tuple; got {type(vectors).__name__}."
    )


def evaluate_similarity(vectors, name_or_pairs="wordsim353", lowercase: bool = True) -> SimilarityResult:
    """Correlate cosine similarities with human ratings.

    Parameters
    ----------
    vectors : KeyedVectors | SVDEmbeddings | Mapping[str, array] | (ndarray (n, dim), words)
        The word vectors. Rows whose word is ``None`` and rows that are all zeros are ignored
        (their words are out of vocabulary).
    name_or_pairs : str | SimilarityDataset | iterable of (word1, word2, score)
        A dataset name (see :func:`load_similarity_dataset`), a loaded dataset, or pairs.
    lowercase : bool, default True
        Compare case-insensitively: both the dataset words and the vocabulary are lowercased;
        when several vocabulary words collapse to one, the first in row order wins (as in
        gensim's ``case_insensitive=True``, which upper-cases instead).

    Returns
    -------
    SimilarityResult(dataset, spearman, pearson, n_pairs, n_found, oov_ratio). Pairs with an
    out-of-vocabulary word (including a word whose vector is all zeros) are excluded from the
    correlations and counted in ``n_pairs - n_found`` and ``oov_ratio``. A correlation with
    constant cosines or constant ratings is undefined: NaN (``null`` in the CLI's JSON), with no
    warning printed.

    Raises
    ------
    ValueError
        If fewer than 2 pairs are in the vocabulary (no correlation is defined).
    """
    if isinstance(name_or_pairs, SimilarityDataset):
        data = name_or_pairs
    elif isinstance(name_or_pairs, (str, os.PathLike)):
        data = load_similarity_dataset(os.fspath(name_or_pairs))
    else:
        triples = [tuple(t) for t in name_or_pairs]
        bad = [t for t in triples if len(t) != 3]
        if bad:
            raise ValueError(f"pairs must be (word1, word2, score) triples; got {bad[0]!r}")
        data = SimilarityDataset(
            "pairs",
            tuple(t[0] for t in triples),
            tuple(t[1] for t in triples),
            np.asarray([float(t[2]) for t in triples], dtype=np.float64),
        )
    if not np.isfinite(data.score).all():  # a NaN score made both correlations NaN
        bad = int(np.flatnonzero(~np.isfinite(data.score))[0])
        raise ValueError(f"pair {bad} ({data.word1[bad]!r}, {data.word2[bad]!r}) of {data.name!r} has the score "
                         f"{float(data.score[bad])!r}; scores must be finite numbers")

    matrix, keys = _vocabulary(vectors)
    fold = str.lower if lowercase else (lambda w: w)
    # an all-zero row has no direction: out of vocabulary, as in SVDEmbeddings.to_keyed_vectors()
    # (it was scored with a cosine of 0 and counted as found). Only the rows of the dataset's words
    # are read: a (V, dim) test of the whole matrix cost V x dim bytes (900 MB for 3M x 300 vectors)
    # and read a memory-mapped matrix in full
    wanted = {fold(w) for w in data.word1} | {fold(w) for w in data.word2}
    index: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        word = fold(str(key))
        if word in wanted and word not in index and np.any(matrix[i]):
            index[word] = i  # first occurrence with a usable vector wins

    i1 = np.fromiter((index.get(fold(w), -1) for w in data.word1), dtype=np.int64, count=len(data))
    i2 = np.fromiter((index.get(fold(w), -1) for w in data.word2), dtype=np.int64, count=len(data))
    found = (i1 >= 0) & (i2 >= 0)
    n_pairs, n_found = len(data), int(found.sum())
    if n_found < 2:
        raise ValueError(
            f"Only {n_found} of the {n_pairs} pairs of {data.name!r} have both words in the "
            "vocabulary (with a non-zero vector); at least 2 are needed for a correlation."
        )

    a = np.asarray(matrix[i1[found]], dtype=np.float64)
    b = np.asarray(matrix[i2[found]], dtype=np.float64)
    for rows, idx in ((a, i1[found]), (b, i2[found])):  # a NaN cosine was ranked as if it were a number
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.any():
            raise ValueError(f"the vector of {keys[int(idx[np.argmax(bad)])]!r} contains NaN or inf; "
                             "word vectors must be finite")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    cosine = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    gold = data.score[found]
    with warnings.catch_warnings():      # constant input: NaN, which the result says; not scipy's lines on stderr
        warnings.simplefilter("ignore", getattr(stats, "ConstantInputWarning", RuntimeWarning))
        spearman = float(stats.spearmanr(gold, cosine).statistic)
        pearson = float(stats.pearsonr(gold, cosine).statistic)
    return SimilarityResult(
        dataset=data.name,
        spearman=spearman,
        pearson=pearson,
        n_pairs=n_pairs,
        n_found=n_found,
        oov_ratio=(n_pairs - n_found) / n_pairs,
    )
