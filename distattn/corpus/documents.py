"""Documents and the streamed corpus protocol (gensim's habit: a corpus is an iterable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

NO_LABEL = -1


@dataclass(frozen=True)
class Document:
    """One document. ``text`` is ``str`` or UTF-8 ``bytes``; ``label`` is an int class in
    [0, 127] (IMDB: 1 = positive, 0 = negative) or ``NO_LABEL`` (-1; None too: absent, as a
    ``.jsonl`` null); ``rating`` is in [0, 127], 0 when unknown; ``split`` is the name
    ``TokenizedCorpus.split`` selects it by: ``"all"`` by default (as in the built-in text and paper
    corpora; a plain string or bytes document gets it too, and so does ``split=None``: absent, as a
    ``.jsonl`` null), else a non-empty name without ``+`` (which joins splits, as in
    ``"train+unsup"``) and without spaces at its ends. Tokenization refuses other values, naming
    the document."""

    text: str | bytes
    label: int = NO_LABEL
    rating: int = 0
    split: str = "all"
    name: str = ""


def selectable_split(split) -> bool:
    """Whether ``TokenizedCorpus.split`` can select documents of split ``split`` by name: a
    non-empty string without ``+`` and without spaces at its ends (the selection parses ``"a+b"``
    as two splits, refuses ``""`` and strips spaces)."""
    return isinstance(split, str) and bool(split) and "+" not in split and split == split.strip()


def check_split(split, where: str) -> str:
    """``split`` if :func:`selectable_split`, else a ValueError naming ``where``, the value and
    what is allowed."""
    if not isinstance(split, str):
        raise ValueError(f"{where}: 'split' must be a string, got {split!r}")
    if not selectable_split(split):
        raise ValueError(f"{where}: 'split' {split!r} could never be selected ('+' joins splits, as in "
                         "'train+unsup'); allowed: a non-empty name without '+' and without spaces at its "
                         "ends, e.g. 'train'")
    return split


class Corpus:
    """Base class: an iterable of :class:`Document` with a ``fingerprint()`` that changes
    whenever the documents could change (used to key caches)."""

    name: str = "corpus"

    def __iter__(self) -> Iterator[Document]:  # pragma: no cover - abstract
        raise NotImplementedError

    def fingerprint(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def default_tokenizer(self):
        """The tokenizer :func:`~distattn.corpus.tokenize_corpus` uses when given none: words of any
        script (:func:`~distattn.corpus.tokenize.unicode_tokenizer`); IMDB overrides it with the seed's."""
        from distattn.corpus.tokenize import unicode_tokenizer
        return unicode_tokenizer()
