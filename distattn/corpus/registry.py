"""Named corpora, so that ``--corpus NAME`` can list the valid names when it is wrong."""

from __future__ import annotations

import inspect
from typing import Callable

_REGISTRY: dict[str, tuple[Callable, str]] = {}


class UnknownCorpusError(ValueError):
    pass


def register_corpus(name: str, factory: Callable, description: str = "") -> None:
    """Register ``factory(**kwargs)`` under ``name`` (overwrites)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string; got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable (factory(**options) -> Corpus); got {factory!r}")
    _REGISTRY[name] = (factory, description)


def check_corpus_options(corpus: str, path=None, data_dir=None) -> None:
    """The command-line rule of every entry point: ``--path`` belongs to ``--corpus text`` and
    ``--data-dir`` to ``--corpus imdb``; either with another corpus was silently ignored."""
    for option, value, owner in (("--path", path, "text"), ("--data-dir", data_dir, "imdb")):
        if value is not None and value != "" and corpus != owner:
            raise ValueError(f"conflicting options: {option} is only used with --corpus {owner}, not --corpus {corpus}")


def available_corpora() -> dict[str, str]:
    """Name -> description of every registered corpus."""
    return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def get_corpus(name: str, **kwargs):
    """Build the corpus registered under ``name``."""
    if name not in _REGISTRY:
        raise UnknownCorpusError(f"unknown corpus {name!r}; valid names: {', '.join(sorted(_REGISTRY))}")
    factory = _REGISTRY[name][0]
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:                                   # a typo such as splt= must not be ignored
            raise TypeError(f"get_corpus({name!r}) got unknown option(s) {unknown}; allowed: "
                            f"{', '.join(params) or 'none'}")
    return factory(**kwargs)


def _imdb(split="train+test+unsup", data_dir=None, download=True, progress=True):
    from distattn.corpus.imdb import ImdbCorpus
    return ImdbCorpus(split=split, data_dir=data_dir, download=download, progress=progress)


def _text(path=None, encoding="utf-8"):
    from distattn.corpus.text import TextCorpus
    return TextCorpus(path, encoding=encoding)


def _paper():
    from distattn.corpus.paper import load_paper_corpus
    return load_paper_corpus()


register_corpus("imdb", _imdb, "IMDB movie reviews (aclImdb_v1.tar.gz): splits train, test, unsup")
register_corpus("text", _text, "your own text: a .txt file (a document per line), a directory of .txt files, or .jsonl")
register_corpus("paper", _paper, "the 7-word toy vocabulary and co-occurrence matrix of 003_8065cadafb1b3474.txt")
