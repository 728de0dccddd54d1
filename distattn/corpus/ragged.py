"""Ragged integer sequences: one flat ``int32`` array plus document offsets.

This is how every later stage sees a tokenized corpus: ``ids[offsets[i]:offsets[i+1]]`` is
document ``i``. Subsetting, truncation and iteration are vectorised.
"""

from __future__ import annotations

import operator
from typing import Iterable, Iterator, Sequence

import numpy as np


def _integers(values, name: str, allowed: str = "integer token ids (out of vocabulary: -1)") -> np.ndarray:
    """``values`` as an integer array; floats, bools and strings are refused, not truncated."""
    arr = np.asarray(values)
    if arr.size == 0 and arr.dtype.kind in "fiu":                  # [] or np.array([]) is float64: fine
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} has dtype {arr.dtype}; allowed: {allowed}")
    return arr


class RaggedIds:
    """Documents as a flat id array and offsets.

    Parameters
    ----------
    ids : ndarray of int32, shape (n_tokens,)
    offsets : ndarray of int64, shape (n_docs + 1,), non-decreasing, ``offsets[0] == 0`` and
        ``offsets[-1] == n_tokens``.
    """

    __slots__ = ("ids", "offsets")

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        ids = _integers(ids, "ids")
        offsets = _integers(offsets, "offsets", "integer positions").astype(np.int64, copy=False)
        if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError(f"ids must be 1-D and offsets 1-D non-empty; got shapes {ids.shape}, {offsets.shape}")
        if offsets[0] != 0 or offsets[-1] != len(ids) or np.any(np.diff(offsets) < 0):
            raise ValueError(
                f"offsets must start at 0, end at len(ids)={len(ids)} and never decrease; "
                f"got start {offsets[0]}, end {offsets[-1]}")
        if ids.dtype != np.int32:
            if len(ids) and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
                raise ValueError("token ids do not fit in int32")
            ids = ids.astype(np.int32)
        self.ids = ids
        self.offsets = offsets

    @classmethod
    def from_sequences(cls, seqs: Iterable[Sequence[int]]) -> "RaggedIds":
        arrays = [_integers(s, f"document {i}") for i, s in enumerate(seqs)]
        for i, a in enumerate(arrays):
            if a.ndim != 1:
                raise ValueError(f"document {i} must be a 1-D sequence of token ids; got shape {a.shape}")
            if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:   # the cast would wrap it
                raise ValueError(f"document {i} holds token id {int(a.max())}, beyond int64 (an unsigned "
                                 f"underflow such as 0 - 1?); ids are integers in [-2**63, 2**63)")
        arrays = [a.astype(np.int64, copy=False) for a in arrays]   # uint64 + int64 would concatenate to float64
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        """Document ``i``'s ids; a slice gives a :class:`RaggedIds` of those documents (it failed
        comparing an int with a slice)."""
        n = len(self)
        if isinstance(i, slice):
            return self.take(np.arange(n)[i])
        try:
            if isinstance(i, (bool, np.bool_)):
                raise TypeError
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"RaggedIds indices are integers or slices (take() for arrays of them); got "
                            f"{type(i).__name__}") from None
        if not -n <= i < n:
            raise IndexError(f"document index {i} out of range for {n} documents")
        i %= n
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self.ids[self.offsets[i]:self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def take(self, docs: np.ndarray | Sequence[int]) -> "RaggedIds":
        """The documents with the given indices (or boolean mask), in that order."""
        docs = np.asarray(docs)
        if docs.ndim != 1:       # numpy's own errors: "object too deep for desired array", "len() of unsized object"
            raise ValueError(f"document indices must be 1-D (r[i] for one document); got shape {docs.shape}")
        if docs.dtype == bool:
            if len(docs) != len(self):
                raise ValueError(f"mask has length {len(docs)}, expected {len(self)}")
            docs = np.flatnonzero(docs)
        elif docs.size and docs.dtype.kind not in "iu":     # astype truncated 0.9 to document 0
            raise TypeError(f"document indices have dtype {docs.dtype}; allowed: integer indices or a boolean mask")
        docs = docs.astype(np.int64, copy=False)
        if len(docs) and (docs.min() < 0 or docs.max() >= len(self)):
            raise IndexError(f"document indices must lie in [0, {len(self)}); got {docs.min()}..{docs.max()}")
        starts = self.offsets[docs]
        lengths = self.offsets[docs + 1] - starts
        return RaggedIds(self.ids[_gather_index(starts, lengths)], _offsets(lengths))

    def truncate(self, max_len: int) -> "RaggedIds":
        """Keep at most the first ``max_len`` tokens of each document."""
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 0:
            raise ValueError(f"max_len must be an integer >= 0, got {max_len!r}")
        starts = self.offsets[:-1]
        lengths = np.minimum(self.lengths, max_len)
        return RaggedIds(self.ids[_gather_index(starts, lengths)], _offsets(lengths))

    def map(self, table: np.ndarray) -> "RaggedIds":
        """Replace every id ``i`` by ``table[i]``; every id must lie in ``[0, len(table))``."""
        table = np.asarray(table)
        if len(self.ids) and (self.ids.min() < 0 or self.ids.max() >= len(table)):  # -1 read table[-1]
            bad = int(self.ids.min()) if self.ids.min() < 0 else int(self.ids.max())
            raise ValueError(f"id {bad} has no entry in a table of {len(table)} entries; allowed ids: "
                             f"0..{len(table) - 1} (out of vocabulary, -1, cannot be mapped)")
        return RaggedIds(table[self.ids], self.offsets.copy())

    def drop(self, keep: np.ndarray) -> "RaggedIds":
        """Remove the tokens where the boolean ``keep`` (one per token) is False; documents
        keep their places (a document may become empty)."""
        keep = np.asarray(keep, dtype=bool)
        csum = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=csum[1:])
        return RaggedIds(self.ids[keep], csum[self.offsets])

    def reverse(self) -> "RaggedIds":
        """Every document's tokens in reverse order (documents keep their places): the input of
        a right-to-left ("backward") language model."""
        starts = np.repeat(self.offsets[:-1], self.lengths)
        ends = np.repeat(self.offsets[1:], self.lengths)
        index = starts + ends - 1 - np.arange(self.n_tokens, dtype=np.int64)
        return RaggedIds(self.ids[index], self.offsets.copy())

    def doc_index(self) -> np.ndarray:
        """The document number of every token, shape (n_tokens,)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)

    def __repr__(self) -> str:
        return f"RaggedIds(n_docs={len(self)}, n_tokens={self.n_tokens})"


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each (s, l), without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out_starts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(np.asarray(starts, np.int64) - out_starts, lengths)
