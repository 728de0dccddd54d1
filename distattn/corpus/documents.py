"""Documents and the streamed corpus protocol (gensim's habit: a corpus is an iterable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

NO_LABEL = -1


@dataclass(frozen=True)
class Document:
    """One document. ``text`` is ``str`` or UTF-8 ``bytes``; ``label`` is an int class in
    [0, 127] (IMDB: 1 = positive, 0 = negative) or ``NO_LABEL`` (-1); ``rating`` is in [0, 127],
    0 when unknown. Tokenization refuses other values, naming the document."""

    text: str | bytes
    label: int = NO_LABEL
    rating: int = 0
    split: str = ""
    name: str = ""


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
