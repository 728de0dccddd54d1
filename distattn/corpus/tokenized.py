"""Tokenized corpora: provisional type ids in corpus order, cached on disk by a hash of the
corpus fingerprint and the tokenizer config.

The cached form does not depend on any vocabulary: ``types`` lists every distinct token in
order of first occurrence, ``tokens`` holds type ids, and ``type_counts`` their counts, so any
vocabulary (``min_count``, ``max_size``) is built and applied in a vectorised step.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from distattn.atomic import atomic_dir, check_files, config_hash, ensure_writable_dir, read_sealed_json, seal, sha256_file
from distattn.corpus.documents import NO_LABEL, Corpus, Document, check_split
from distattn.corpus.ragged import RaggedIds
from distattn.corpus.tokenize import default_tokenizer, tokenize_to_bytes, tokenizer_config, unicode_tokenizer
from distattn.corpus.vocabulary import DEFAULT_SPECIALS, Vocabulary, _not_a_string
from distattn.paths import cache_dir

log = logging.getLogger(__name__)
FORMAT = 2      # 2: meta.json sealed (atomic.seal)
_CHUNK_DOCS = 4096


class EmptyCorpusError(ValueError):
    """The corpus has no documents, or no tokens at all."""


def _int8_field(values, name: str, lo: int, hi: int) -> np.ndarray:
    """Per-document integers stored as int8: anything else is refused, naming the document."""
    if isinstance(values, np.ndarray) and values.dtype == np.int8:
        return values
    arr = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
    if arr.dtype == object:
        bad = next((i for i, v in enumerate(arr) if isinstance(v, (bool, np.bool_)) or
                    not isinstance(v, (int, np.integer))), None)
        if bad is not None:
            raise ValueError(f"document {bad} has {name} {arr[bad]!r}; a {name} must be an integer in [{lo}, {hi}]")
        arr = arr.astype(np.int64)
    elif arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"document 0 has {name} {arr[0]!r} ({arr.dtype}); a {name} must be an integer in [{lo}, {hi}]")
    out_of_range = np.flatnonzero((arr < lo) | (arr > hi))
    if out_of_range.size:
        i = int(out_of_range[0])
        raise ValueError(f"document {i} has {name} {int(arr[i])}; a {name} must be an integer in [{lo}, {hi}]")
    return arr.astype(np.int8)


class DocumentTable:
    """Per-document metadata shared by tokenized and encoded corpora."""

    __slots__ = ("labels", "ratings", "split_codes", "split_names")

    def __init__(self, labels, ratings, split_codes, split_names):
        self.labels = _int8_field(labels, "label", -1, 127)
        self.ratings = _int8_field(ratings, "rating", 0, 127)
        self.split_names = list(split_names)
        # int8 holds the codes of 128 splits: a 129th overflowed (numpy 2: OverflowError; numpy 1: it
        # wrapped to -128, and no name selected its documents)
        self.split_codes = np.asarray(split_codes).astype(np.int8 if len(self.split_names) <= 128 else np.int32)

    def take(self, docs: np.ndarray) -> "DocumentTable":
        return DocumentTable(self.labels[docs], self.ratings[docs], self.split_codes[docs], self.split_names)

    def split_mask(self, split: str | Sequence[str]) -> np.ndarray:
        wanted = parse_splits(split)
        unknown = [s for s in wanted if s not in self.split_names]
        if unknown:
            raise ValueError(f"split {unknown[0]!r} is not in this corpus; it has {self.split_names}")
        codes = [self.split_names.index(s) for s in wanted]
        return np.isin(self.split_codes, codes)


def parse_splits(split: str | Sequence[str]) -> list[str]:
    """``"train+unsup"`` or ``["train", "unsup"]`` -> ``["train", "unsup"]``."""
    if isinstance(split, str):
        parts = [p.strip() for p in split.split("+")]
    else:
        parts = [str(p).strip() for p in split]
    if not parts or any(not p for p in parts):
        raise ValueError(f"bad split specification {split!r}; use e.g. 'train' or 'train+unsup'")
    return parts


class _SubsetMixin:
    def _subset_docs(self, docs):
        docs = np.asarray(docs)
        if docs.dtype == bool:
            if docs.shape != (len(self),):       # a short mask once silently kept only its own length
                raise ValueError(f"a boolean mask must have one entry per document ({len(self)}); got shape "
                                 f"{docs.shape}")
            docs = np.flatnonzero(docs)
        elif docs.size and docs.dtype.kind not in "iu":
            raise TypeError(f"documents must be selected by integer indices or a boolean mask; got dtype {docs.dtype}")
        return docs

    def split(self, split: str | Sequence[str]):
        """The documents of the given split(s), e.g. ``"train+unsup"``."""
        return self.take(self.docs.split_mask(split))

    def sample(self, n: int, seed: int = 0):
        """``n`` documents drawn without replacement (kept in corpus order)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        n = min(n, len(self))
        rng = np.random.default_rng(seed)
        return self.take(np.sort(rng.choice(len(self), size=n, replace=False)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_tokens(self) -> int:
        return self.tokens.n_tokens

    @property
    def labels(self) -> np.ndarray:
        return self.docs.labels


class TokenizedCorpus(_SubsetMixin):
    """A corpus after tokenization, before any vocabulary.

    Attributes
    ----------
    types : list of str, every distinct token (provisional type ids index it)
    type_counts : ndarray of int64, count of each type *in this selection of documents*
    tokens : :class:`RaggedIds` of type ids
    docs : :class:`DocumentTable`
    """

    def __init__(self, types: list[str], tokens: RaggedIds, docs: DocumentTable,
                 type_counts: np.ndarray | None = None, source: dict | None = None):
        self.types = types
        self.tokens = tokens
        self.docs = docs
        if type_counts is None:
            type_counts = np.bincount(tokens.ids, minlength=len(types)).astype(np.int64)
        self.type_counts = type_counts
        self.source = source or {}

    def take(self, docs) -> "TokenizedCorpus":
        docs = self._subset_docs(docs)
        return TokenizedCorpus(self.types, self.tokens.take(docs), self.docs.take(docs), None, self.source)

    def vocabulary(self, min_count: int = 1, max_size: int | None = None,
                   specials: Sequence[str] = DEFAULT_SPECIALS) -> Vocabulary:
        """A vocabulary from this corpus's counts (decreasing count, ties alphabetical)."""
        present = np.flatnonzero(self.type_counts)
        return Vocabulary.from_counts([self.types[i] for i in present], self.type_counts[present],
                                      min_count=min_count, max_size=max_size, specials=specials)

    def encode(self, vocab: Vocabulary, oov: str = "unk") -> "EncodedCorpus":
        """Map to vocabulary ids. ``oov``: ``"unk"`` (unknown -> ``<unk>``), ``"negative"``
        (unknown -> -1, the statistics layer's OOV marker) or ``"drop"`` (removed; documents
        keep their places)."""
        if oov not in ("unk", "negative", "drop"):
            raise ValueError(f"oov={oov!r} is not one of ('unk', 'negative', 'drop')")
        if oov == "unk" and vocab.unk_id is None:
            raise ValueError("oov='unk' needs a vocabulary with an <unk> special; use oov='negative' or 'drop'")
        missing = vocab.unk_id if oov == "unk" else -1
        table = np.fromiter((vocab.stoi.get(t, missing) for t in self.types), dtype=np.int32,
                            count=len(self.types))
        tokens = self.tokens.map(table)
        if oov == "drop":
            tokens = tokens.drop(tokens.ids >= 0)
        return EncodedCorpus(tokens, vocab, self.docs, self.source)

    def __repr__(self) -> str:
        return f"TokenizedCorpus(n_docs={len(self)}, n_tokens={self.n_tokens}, n_types={len(self.types)})"

    # persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, replace: bool = True) -> None:
        """Write atomically into directory ``path`` (a temporary directory, then a rename).

        ``replace=False`` keeps a ``path`` that exists by the time of the rename (another process
        wrote the same entry first) and discards this copy."""
        path = Path(path)
        if replace and path.exists():
            shutil.rmtree(path)
        with atomic_dir(path) as tmp:
            np.save(tmp / "ids.npy", self.tokens.ids)
            np.save(tmp / "offsets.npy", self.tokens.offsets)
            np.save(tmp / "type_counts.npy", self.type_counts)
            np.save(tmp / "labels.npy", self.docs.labels)
            np.save(tmp / "ratings.npy", self.docs.ratings)
            np.save(tmp / "split_codes.npy", self.docs.split_codes)
            (tmp / "types.json").write_text(json.dumps(self.types, ensure_ascii=False), encoding="utf-8")
            # each file's sha256, checked by load: a bit flipped on disk leaves every file readable
            files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
            # plain JSON values first (a source's paths and the like as strings), which seal() hashes
            meta = json.loads(json.dumps({"format": FORMAT, "split_names": self.docs.split_names,
                                          "source": self.source, "files": files}, default=str))
            (tmp / "meta.json").write_text(json.dumps(seal(meta), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = True) -> "TokenizedCorpus":
        path = Path(path)
        meta = read_sealed_json(path / "meta.json")
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} holds tokenized-corpus format {meta.get('format')}, expected {FORMAT}")
        check_files(path, meta["files"], "meta.json")
        mode = "r" if mmap else None
        tokens = RaggedIds(np.load(path / "ids.npy", mmap_mode=mode), np.load(path / "offsets.npy"))
        docs = DocumentTable(np.load(path / "labels.npy"), np.load(path / "ratings.npy"),
                             np.load(path / "split_codes.npy"), meta["split_names"])
        types = json.loads((path / "types.json").read_text(encoding="utf-8"))
        return cls(types, tokens, docs, np.load(path / "type_counts.npy"), meta.get("source"))


class EncodedCorpus(_SubsetMixin):
    """Documents as vocabulary ids (int32), with their vocabulary and metadata. Ids are -1
    where a token is out of vocabulary and the encoding used ``oov="negative"``."""

    def __init__(self, tokens: RaggedIds, vocab: Vocabulary, docs: DocumentTable, source: dict | None = None):
        self.tokens = tokens
        self.vocab = vocab
        self.docs = docs
        self.source = source or {}

    def take(self, docs) -> "EncodedCorpus":
        docs = self._subset_docs(docs)
        return EncodedCorpus(self.tokens.take(docs), self.vocab, self.docs.take(docs), self.source)

    def truncate(self, max_len: int) -> "EncodedCorpus":
        return EncodedCorpus(self.tokens.truncate(max_len), self.vocab, self.docs, self.source)

    def __iter__(self):
        return iter(self.tokens)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[i]

    def __repr__(self) -> str:
        return f"EncodedCorpus(n_docs={len(self)}, n_tokens={self.n_tokens}, vocab_size={len(self.vocab)})"


def tokenize_corpus(corpus: Iterable[Document] | Corpus, tokenizer=None, cache: bool | str | os.PathLike = True,
                    progress: bool = False) -> TokenizedCorpus:
    """Tokenize a corpus, reading it from the on-disk cache when the same corpus fingerprint
    and tokenizer config were tokenized before.

    ``tokenizer``: a callable ``str -> list[str]``; default: the corpus's ``default_tokenizer()``
    (IMDB: the seed's ASCII words, :func:`default_tokenizer`), else words of any script
    (:func:`~distattn.corpus.tokenize.unicode_tokenizer`). Only a
    tokenizer with a ``config()`` method (:class:`RegexTokenizer`, :class:`WhitespaceTokenizer`,
    :class:`SeedLiteralTokenizer`, or your own class returning a JSON-able dict that changes when
    its output would) is cached: a plain function or lambda is tokenized afresh every time.
    ``cache``: True (the user cache directory), False (no cache), or a directory; a corpus
    without a ``fingerprint()`` (e.g. a list of strings) is never cached.

    A plain ``str`` or ``bytes`` document becomes a :class:`Document` of split ``"all"``, as in
    the built-in corpora, and so does a split of None (absent, as a ``.jsonl`` null; a label of None
    is ``NO_LABEL``); a split that ``TokenizedCorpus.split`` could never select (empty,
    containing ``+`` or with spaces at its ends) is refused, naming the document.
    """
    _not_a_string(corpus, "corpus", "a Corpus, e.g. get_corpus('text', path=...), or a list of strings or "
                                    "Documents (a string would be read as one document per character)")
    if tokenizer is None:       # the corpus's own (IMDB: the seed's ASCII words), else words of any script
        tokenizer = corpus.default_tokenizer() if hasattr(corpus, "default_tokenizer") else unicode_tokenizer()
    if not callable(tokenizer):
        raise TypeError(f"tokenizer={tokenizer!r} is not callable; allowed: a callable str -> list[str], e.g. "
                        "RegexTokenizer() or WhitespaceTokenizer()")
    fingerprint = corpus.fingerprint() if hasattr(corpus, "fingerprint") else None
    key = None
    tok_config = tokenizer_config(tokenizer)
    # what the tokens came from, which the caches built on them key on (the statistics' counts, the
    # compare stages): the tokenizer too, unless it is the seed's (IMDB's keys are unchanged). Without
    # it, a text corpus's counts cached while its default was the seed's ASCII tokenizer were served
    # to its unicode_tokenizer tokens whenever the vocabulary came out the same
    source = {"fingerprint": fingerprint}
    if tok_config != default_tokenizer().config():
        source["tokenizer"] = tok_config
    if cache and fingerprint is not None and tok_config is not None:
        key = config_hash({"format": FORMAT, "corpus": fingerprint, "tokenizer": tok_config})
        root = Path(cache) if not isinstance(cache, bool) else cache_dir() / "tokenized"
        entry = root / f"{getattr(corpus, 'name', 'corpus')}-{key}"
        if (entry / "meta.json").exists():
            try:
                cached = TokenizedCorpus.load(entry)
            # a damaged entry is rebuilt, never trusted; EOFError: an empty .npy (numpy raises it for a
            # file of zero bytes, what a crash before the data reached the disk can leave)
            except (OSError, ValueError, KeyError, EOFError) as exc:
                log.warning("ignoring damaged tokenized cache %s: %s", entry, exc)
                shutil.rmtree(entry, ignore_errors=True)
            else:
                cached.source = source
                return cached
        elif entry.exists():                   # no meta.json: not an entry this code wrote whole
            shutil.rmtree(entry, ignore_errors=True)
        try:                                   # an unwritable cache fails now, not after the tokenizing
            ensure_writable_dir(root)
        except OSError as exc:
            raise OSError(f"cache={str(root)!r} is not a writable directory ({exc.strerror or exc}); pass "
                          "another directory, or cache=False to tokenize without caching") from exc
    tc = _tokenize(corpus, tokenizer, source, progress)
    if key is not None:
        # an entry another process wrote meanwhile (same key, same tokens) is kept: removing it
        # before the rename once pulled it from under that process's load
        tc.save(entry, replace=False)
        tc = TokenizedCorpus.load(entry)
    return tc


def _short(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _tokenize(corpus, tokenizer, source, progress) -> TokenizedCorpus:
    type_ids: defaultdict = defaultdict(itertools.count().__next__)
    lookup = type_ids.__getitem__
    id_chunks, lengths, labels, ratings, split_codes = [], [], [], [], []
    split_names: list[str] = []
    pending: list[list[bytes]] = []

    def flush():
        flat = list(itertools.chain.from_iterable(pending))
        id_chunks.append(np.fromiter(map(lookup, flat), dtype=np.int32, count=len(flat)))
        lengths.extend(map(len, pending))
        pending.clear()

    it = iter(corpus)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"tokenize {getattr(corpus, 'name', '')}", unit="doc")
    for i, doc in enumerate(it):
        if not isinstance(doc, Document):
            doc = Document(doc)
        if not isinstance(doc.text, (str, bytes, bytearray)):   # a list of tokens once failed inside the tokenizer
            raise TypeError(f"document {i} is {type(doc.text).__name__} {_short(doc.text)}; allowed: a str, UTF-8 "
                            "bytes or a Document (pre-tokenized text: join the tokens with spaces and pass "
                            "tokenizer=WhitespaceTokenizer())")
        pending.append(tokenize_to_bytes(tokenizer, doc.text))
        labels.append(NO_LABEL if doc.label is None else doc.label)     # absent, as a JSONL null (TextCorpus)
        ratings.append(doc.rating)
        split = "all" if doc.split is None else doc.split     # absent, as a JSONL null (TextCorpus)
        if split not in split_names:    # '' (the old default) was kept, and then no name selected it
            check_split(split, f"document {i}" + (f" ({doc.name!r})" if doc.name else ""))
            split_names.append(split)
        split_codes.append(split_names.index(split))
        if len(pending) >= _CHUNK_DOCS:
            flush()
    if pending:
        flush()
    if not lengths:
        raise EmptyCorpusError(f"corpus {getattr(corpus, 'name', '')!r} has no documents")
    ids = np.concatenate(id_chunks)
    if len(ids) == 0:
        raise EmptyCorpusError(f"corpus {getattr(corpus, 'name', '')!r} has {len(lengths)} documents but no tokens")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    types = [t.decode("utf-8") for t in type_ids]
    docs = DocumentTable(labels, ratings, split_codes, split_names)
    return TokenizedCorpus(types, RaggedIds(ids, offsets), docs, None, source)
