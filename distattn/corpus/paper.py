"""The toy corpus of the projection paper (``shared/seeds/003_8065cadafb1b3474.txt``).

Sections 2.5 and 3.2 of the paper work through two examples, "river bank flooded" and
"bank loan", on a 7-word vocabulary and a hand-written 7×7 co-occurrence matrix S. The data
live as plain files in ``corpora/paper/`` (``vocabulary.json``, ``cooccurrence.csv``,
``examples.json``, ``printings.json``); ``ERRATA.md`` there lists where the paper's prose
disagrees with its own algebra.

>>> paper = load_paper_corpus()
>>> paper.words[:3]
['river', 'bank', 'loan']
>>> paper.cooc.shape
(7, 7)
>>> paper.examples["bank_loan"]
['bank', 'loan']
>>> paper.encode("bank_loan").tolist()
[1, 2]
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np
import scipy.sparse as sp

from distattn.corpus.documents import Corpus, Document
from distattn.corpus.vocabulary import Vocabulary
from distattn.paths import corpora_dir

__all__ = ["PaperCorpus", "load_paper_corpus", "paper_corpus_dir"]

_FILES = ("vocabulary.json", "cooccurrence.csv", "examples.json", "printings.json")


def paper_corpus_dir() -> Path:
    """``corpora/paper`` (see :func:`distattn.paths.corpora_dir`)."""
    return corpora_dir() / "paper"


class PaperCorpus(Corpus):
    """The paper's toy data.

    Attributes
    ----------
    words : list of str, length 7
        The vocabulary in the paper's order (row/column order of S).
    cooc : scipy.sparse.csr_array of float64, shape (7, 7)
        The co-occurrence matrix S as displayed in section 2.5 (symmetric).
    examples : dict of str -> list of str
        The worked example sequences (``"river_bank_flooded"``, ``"bank_loan"``).
    printings : dict of str -> ndarray of shape (7, 7)
        Every matrix the paper prints as S (they disagree; see ``ERRATA.md``).
    directory : pathlib.Path
        Where the files were read from.

    Iterating yields one :class:`~distattn.corpus.documents.Document` per example (text =
    the words joined by spaces), so the corpus also works with ``tokenize_corpus``.
    """

    name = "paper"

    def __init__(self, words: list[str], cooc: sp.csr_array, examples: dict[str, list[str]],
                 printings: dict[str, np.ndarray], directory: Path):
        self.words = words
        self.cooc = cooc
        self.examples = examples
        self.printings = printings
        self.directory = directory

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def vocabulary(self) -> Vocabulary:
        """The words as a :class:`~distattn.corpus.vocabulary.Vocabulary` without specials, so
        that word ``i`` has id ``i`` as in the paper."""
        return Vocabulary(self.words, specials=())

    def encode(self, example_or_words: str | list[str]) -> np.ndarray:
        """Token ids (int64) of a named example or of a list of words."""
        if isinstance(example_or_words, str) and example_or_words not in self.examples:
            # a bare KeyError('bank') read as if the word bank were unknown
            raise KeyError(f"{example_or_words!r} is not an example of the paper corpus (examples: "
                           f"{list(self.examples)}); pass the words of a sequence as a list, e.g. "
                           f"[{example_or_words!r}]")
        words = self.examples[example_or_words] if isinstance(example_or_words, str) else example_or_words
        index = {w: i for i, w in enumerate(self.words)}
        unknown = [w for w in words if w not in index]
        if unknown:
            raise KeyError(f"words {unknown} are not in the paper vocabulary {self.words}")
        return np.array([index[w] for w in words], dtype=np.int64)

    def __iter__(self) -> Iterator[Document]:
        for name, words in self.examples.items():
            yield Document(" ".join(words), split="all", name=name)

    def fingerprint(self) -> dict:
        digest = hashlib.sha256()
        for name in _FILES:
            digest.update((self.directory / name).read_bytes())
        return {"corpus": "paper", "sha256": digest.hexdigest()}

    def __repr__(self) -> str:
        return f"PaperCorpus(words={self.words}, examples={list(self.examples)})"


def load_paper_corpus(directory: str | os.PathLike | None = None) -> PaperCorpus:
    """Read the paper's toy vocabulary, co-occurrence matrix and example sequences.

    Parameters
    ----------
    directory : path, optional
        Defaults to :func:`paper_corpus_dir`.
    """
    directory = paper_corpus_dir() if directory is None else Path(directory)
    missing = [name for name in _FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"paper corpus directory {str(directory)!r} lacks {missing}")
    words = json.loads((directory / "vocabulary.json").read_text(encoding="utf-8"))["words"]
    with open(directory / "cooccurrence.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0][1:], rows[1:]
    if header != words or [r[0] for r in body] != words:
        raise ValueError(f"cooccurrence.csv labels {header} / {[r[0] for r in body]} "
                         f"do not match vocabulary.json {words}")
    cooc = sp.csr_array(np.array([[float(x) for x in r[1:]] for r in body], dtype=np.float64))
    examples = json.loads((directory / "examples.json").read_text(encoding="utf-8"))["examples"]
    for name, seq in examples.items():
        unknown = [w for w in seq if w not in words]
        if unknown:
            raise ValueError(f"example {name!r} uses words {unknown} outside the vocabulary {words}")
    printed = json.loads((directory / "printings.json").read_text(encoding="utf-8"))["printings"]
    printings = {name: np.array(p["matrix"], dtype=np.float64) for name, p in printed.items()}
    return PaperCorpus(words, cooc, examples, printings, directory)
