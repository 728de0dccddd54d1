"""The vocabulary: words in frequency order, with reserved ids for ``<pad>`` and ``<unk>``."""

from __future__ import annotations

import json
import operator
import os
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from distattn.atomic import config_hash, write_json

PAD = "<pad>"
UNK = "<unk>"
DEFAULT_SPECIALS = (PAD, UNK)
OOV_POLICIES = ("unk", "drop", "error", "negative")


def _not_a_string(value, name: str, allowed: str) -> None:
    """A str is iterable, so it would silently count as a sequence of one-character tokens."""
    if isinstance(value, (str, bytes)):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise TypeError(f"{name}={shown!r} is a string; allowed: {allowed}")


def _counts(counts, n_words: int) -> np.ndarray:
    """``counts`` as int64, one per word: floats that are not whole numbers, NaN and negative
    values are refused (they were truncated, or raised numpy's bare conversion error)."""
    arr = np.asarray(counts)
    if arr.ndim != 1 or len(arr) != n_words:
        raise ValueError(f"counts has shape {arr.shape}, but there are {n_words} words; allowed: one count per word")
    if not arr.size:
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        wrong = ~np.isfinite(arr) | (arr != np.round(arr)) | (arr < 0)
    else:
        wrong = np.ones(arr.shape, bool) if arr.dtype.kind not in "iu" else arr < 0
    if wrong.any():
        bad = int(np.flatnonzero(wrong)[0])
        raise ValueError(f"counts[{bad}] is {arr[bad].item()!r} ({arr.dtype}); allowed: non-negative integers")
    return arr.astype(np.int64)


def _json_type(value) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    for kind, name in ((bool, "boolean"), (str, "string"), (int, "integer"), (float, "number"), (list, "array"),
                       (dict, "object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def _short(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _integer_id(value, pos: int) -> int:
    """``value`` (ids[pos] of :meth:`Vocabulary.decode`) as an int: anything with ``__index__``
    but a bool (numpy and torch integers); a float, a bool or a string is a TypeError."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"ids[{pos}] = {_short(value)} is a {type(value).__name__}, not an integer id; allowed: "
                    f"integers (int, numpy integers), e.g. an int64 array")


class Vocabulary:
    """An id <-> word map. Specials come first (``<pad>`` = 0, ``<unk>`` = 1 by default), then
    words by decreasing count, ties broken alphabetically.

    Parameters
    ----------
    words : sequence of str
        Regular words, already in id order (after the specials).
    counts : sequence of int, optional
        Corpus count of each regular word.
    specials : tuple of str
        Reserved tokens placed before the words. ``()`` for a vocabulary without them (the
        paper's toy vocabulary).
    """

    def __init__(self, words: Sequence[str], counts: Sequence[int] | None = None,
                 specials: Sequence[str] = DEFAULT_SPECIALS):
        _not_a_string(words, "words", "a sequence of words")
        _not_a_string(specials, "specials", "a tuple of special tokens")
        words = list(words)
        specials = tuple(specials)
        itos = list(specials) + words
        stoi = {w: i for i, w in enumerate(itos)}
        if len(stoi) != len(itos):
            dup = [w for w, c in Counter(itos).items() if c > 1][:5]
            raise ValueError(f"vocabulary has duplicate entries, e.g. {dup}")
        if counts is not None:
            counts = _counts(counts, len(words))
        self.specials = specials
        self.itos = itos
        self.stoi = stoi
        wc = np.zeros(len(itos), dtype=np.int64)
        if counts is not None:
            wc[len(specials):] = counts
        self.counts = wc

    # construction -------------------------------------------------------------------------
    @classmethod
    def from_counts(cls, words: Sequence[str], counts: Sequence[int], min_count: int = 1,
                    max_size: int | None = None, specials: Sequence[str] = DEFAULT_SPECIALS) -> "Vocabulary":
        """Keep words with ``count >= min_count``, the ``max_size`` most frequent of them
        (specials not counted), ordered by decreasing count then alphabetically."""
        if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 1:
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer))
                                     or max_size < 1):
            raise ValueError(f"max_size must be None or an integer >= 1, got {max_size!r}")
        _not_a_string(words, "words", "a sequence of words")
        words = list(words)
        counts = _counts(counts, len(words))
        words_arr = np.asarray(words, dtype=object)
        keep = np.flatnonzero(counts >= min_count)
        special_set = set(specials)
        if special_set:
            keep = np.array([i for i in keep if words_arr[i] not in special_set], dtype=np.int64)
        # decreasing count, ties alphabetical: sorted by word (Python's order: numpy's fixed-width
        # str drops trailing NULs, which split() keeps in a token, so "a" and "a\x00" tied in
        # first-seen order), then stably by count
        alpha = np.array(sorted(keep.tolist(), key=lambda i: str(words_arr[i])), dtype=np.int64)
        order = alpha[np.argsort(-counts[alpha], kind="stable")]
        if max_size is not None:
            order = order[:max_size]
        return cls([str(w) for w in words_arr[order]], counts[order], specials)

    @classmethod
    def build(cls, documents: Iterable[Iterable[str]], min_count: int = 1, max_size: int | None = None,
              specials: Sequence[str] = DEFAULT_SPECIALS) -> "Vocabulary":
        """Count the tokens of tokenized documents and build a vocabulary. Documents with no token
        at all (none given, or an iterator already consumed) are refused rather than giving a
        vocabulary of specials alone."""
        _not_a_string(documents, "documents", "an iterable of token lists")
        counter: Counter = Counter()
        n_docs = 0
        for i, doc in enumerate(documents):
            _not_a_string(doc, f"documents[{i}]", "a list of tokens (tokenize the text first)")
            counter.update(doc)
            n_docs = i + 1
        if not counter:
            raise ValueError(f"documents held no tokens ({n_docs} documents"
                             + (", an iterator already consumed?)" if n_docs == 0 else ", all empty)")
                             + "; a vocabulary needs at least one token")
        words = list(counter)
        return cls.from_counts(words, [counter[w] for w in words], min_count, max_size, specials)

    # lookup -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __getitem__(self, word: str) -> int:
        return self.stoi[word]

    def __iter__(self):
        return iter(self.itos)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos and self.specials == other.specials \
            and np.array_equal(self.counts, other.counts)

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)}, specials={self.specials})"

    @property
    def pad_id(self) -> int | None:
        return self.stoi.get(PAD) if PAD in self.specials else None

    @property
    def unk_id(self) -> int | None:
        return self.stoi.get(UNK) if UNK in self.specials else None

    @property
    def n_specials(self) -> int:
        return len(self.specials)

    @property
    def words(self) -> list[str]:
        """The regular words (no specials), in id order."""
        return self.itos[self.n_specials:]

    def id_of(self, word: str, default: int | None = None) -> int | None:
        return self.stoi.get(word, default)

    def encode(self, tokens: Iterable[str], oov: str = "unk") -> np.ndarray:
        """Token strings to an int32 id array.

        ``oov``: ``"unk"`` maps unknown words to ``<unk>``; ``"drop"`` removes them;
        ``"negative"`` maps them to -1 (the statistics layer's OOV marker); ``"error"`` raises.
        """
        if oov not in OOV_POLICIES:
            raise ValueError(f"oov={oov!r} is not one of {OOV_POLICIES}")
        if oov == "unk" and self.unk_id is None:
            raise ValueError("oov='unk' needs a vocabulary with an <unk> special")
        _not_a_string(tokens, "tokens", "a list of tokens (tokenize the text first)")
        tokens = list(tokens)
        missing = -1 if oov != "unk" else self.unk_id
        ids = np.fromiter((self.stoi.get(t, missing) for t in tokens), dtype=np.int32, count=len(tokens))
        if oov == "drop":
            ids = ids[ids >= 0]
        elif oov == "error" and (ids < 0).any():
            bad = [t for t in tokens if t not in self.stoi][:5]
            raise KeyError(f"out-of-vocabulary tokens: {bad}")
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids to token strings. -1 (the out-of-vocabulary marker of ``encode(oov="negative")``)
        gives ``"<unk>"``; any other id outside ``[0, len(self))`` is an IndexError naming it (it
        gave ``"<unk>"`` too: ids of another vocabulary read as unknown words without a word). Ids
        are integers (an int, a numpy integer, an integer array); a float, a bool or a string is a
        TypeError naming it (``int()`` truncated them: 1.7 decoded as id 1, ``True`` as id 1)."""
        # an integer array is checked at once; its tolist() gives Python ints
        checked = isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind in "iu"
        words = []
        for pos, i in enumerate(ids.tolist() if checked else ids):
            if not checked and type(i) is not int:
                i = _integer_id(i, pos)
            if 0 <= i < len(self.itos):
                words.append(self.itos[i])
            elif i == -1:
                words.append(UNK)
            else:
                raise IndexError(f"ids[{pos}] = {i} is not an id of this vocabulary; allowed: 0 to {len(self.itos) - 1}, "
                                 f"or -1 (out of vocabulary, decoded as {UNK!r})")
        return words

    # persistence --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": "distattn.Vocabulary/1", "specials": list(self.specials),
                "words": self.words, "counts": self.counts[self.n_specials:].tolist()}

    @classmethod
    def from_dict(cls, d: dict, source: str | os.PathLike | None = None) -> "Vocabulary":
        """The inverse of :meth:`to_dict`. A malformed dict (a field missing or of the wrong type,
        a token twice, counts of another length than the words) is a ValueError naming the field
        and what is expected, and ``source`` (the file it was read from) when given; a missing
        field was a bare KeyError such as ``'counts'``."""
        where = f"{source}: " if source is not None else ""
        if not isinstance(d, dict):
            raise ValueError(f"{where}not a distattn vocabulary file (a JSON {_json_type(d)}; expected an object "
                             f"with the fields 'format', 'specials', 'words' and 'counts')")
        if d.get("format") != "distattn.Vocabulary/1":
            raise ValueError(f"{where}not a distattn vocabulary file (format={d.get('format')!r})")
        for name, what, ok in (("specials", "a list of strings", lambda v: isinstance(v, str)),
                               ("words", "a list of strings", lambda v: isinstance(v, str)),
                               ("counts", "a list of non-negative integers, one per word",
                                lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)):
            if name not in d:
                raise ValueError(f"{where}the field {name!r} is missing; expected {what}")
            value = d[name]
            if not isinstance(value, list):
                raise ValueError(f"{where}the field {name!r} is a JSON {_json_type(value)}; expected {what}")
            bad = next((i for i, v in enumerate(value) if not ok(v)), None)
            if bad is not None:
                raise ValueError(f"{where}{name}[{bad}] is {_short(value[bad])} (a JSON {_json_type(value[bad])}); "
                                 f"expected {what}")
        specials, words, counts = d["specials"], d["words"], d["counts"]
        if len(counts) != len(words):
            raise ValueError(f"{where}the field 'counts' has {len(counts)} entries but 'words' has {len(words)}; "
                             "expected one count per word")
        seen: dict = {}
        for name, tokens in (("specials", specials), ("words", words)):
            for i, token in enumerate(tokens):
                if token in seen:
                    raise ValueError(f"{where}{name}[{i}] is {_short(token)}, already {seen[token]}; expected each "
                                     "token once in 'specials' and 'words' together")
                seen[token] = f"{name}[{i}]"
        return cls(words, counts, tuple(specials))

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically."""
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        with open(path, encoding="utf-8") as fh:
            try:
                d = json.load(fh)
            except json.JSONDecodeError as exc:        # e.g. a truncated file: it named no file
                raise ValueError(f"{path}: not a distattn vocabulary file: not valid JSON ({exc.msg}: line "
                                 f"{exc.lineno} column {exc.colno})") from None
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}: not a distattn vocabulary file: not UTF-8 ({exc.reason}: byte "
                                 f"{exc.start + 1})") from None
        return cls.from_dict(d, source=path)

    def fingerprint(self) -> str:
        """A hash of the words and specials (for cache keys)."""
        return config_hash({"specials": list(self.specials), "words": self.words})
