"""Batches from encoded corpora: padded classification batches and packed LM sequences.

Batch order is a pure function of ``(seed, epoch)``: a resumed run, or each of ``world`` DDP
processes, rebuilds exactly the same plan and takes its own slice.
"""

from __future__ import annotations

import hashlib
import numbers

import numpy as np
import torch

from distattn.corpus.ragged import RaggedIds

TRUNCATIONS = ("head", "head+tail", "error")

__all__ = ["ClassificationData", "LMData", "epoch_plan", "as_ragged", "TRUNCATIONS"]


def as_ragged(docs) -> RaggedIds:
    """An EncodedCorpus, RaggedIds or list of int sequences as RaggedIds."""
    if isinstance(docs, RaggedIds):
        return docs
    tokens = getattr(docs, "tokens", None)
    if isinstance(tokens, RaggedIds):
        return tokens
    if isinstance(docs, (list, tuple)):
        return RaggedIds.from_sequences(docs)
    raise TypeError(f"documents must be an EncodedCorpus, RaggedIds or a list of id sequences; got "
                    f"{type(docs).__name__}")


def _check_seq_len(seq_len) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1; got {seq_len!r}")


def packed_stream(ragged: RaggedIds, bos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``[bos] doc_0 [bos] doc_1 ...`` as one int32 array, and the mask of its ``bos`` slots."""
    stream = np.empty(ragged.n_tokens + len(ragged), dtype=np.int32)
    starts = ragged.offsets[:-1] + np.arange(len(ragged))
    is_bos = np.zeros(len(stream), dtype=bool)
    is_bos[starts] = True
    stream[is_bos] = bos_id
    stream[~is_bos] = ragged.ids
    return stream, is_bos


def stream_checksum(*arrays: np.ndarray) -> str:
    """A content hash of the arrays (dtype, shape and every element) for fingerprints: a resume on
    data that differs in any token is refused. (It summed about 4 096 sampled ids, so data changed
    at unsampled positions resumed silently.) BLAKE2b runs at about 1 GB/s."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:                       # RaggedIds and the packed streams hold int32 ids whatever was given
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def cached_checksum(owner, *arrays: np.ndarray) -> str:
    """``stream_checksum(*arrays)``, computed once per ``owner`` (a dataset, whose arrays do not
    change; its fingerprint goes into every checkpoint saved)."""
    if owner.__dict__.get("_content_hash") is None:
        owner._content_hash = stream_checksum(*arrays)
    return owner._content_hash


def _check_ids(ids: np.ndarray, vocab_size: int | None, what: str) -> None:
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        raise ValueError(f"{what} hold negative token id {lo} (out-of-vocabulary marker); encode with oov='unk' "
                         f"or pass oov_id= to map them")
    if vocab_size is not None and hi >= vocab_size:
        raise ValueError(f"{what} hold token id {hi}, outside the vocabulary [0, {vocab_size})")


def _check_count(value, name: str) -> int:
    """An integer >= 1 (batch sizes, strides), numpy integers included."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= 1")
    return int(value)


def _check_special(value, name: str, vocab_size: int | None) -> None:
    """A special id the data puts into batches itself (padding, separators, OOV)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 or \
            (vocab_size is not None and value >= vocab_size):
        upper = "vocab_size" if vocab_size is None else f"vocab_size={vocab_size}"
        raise ValueError(f"{name}={value!r} is invalid; allowed: a token id in [0, {upper})")


def epoch_plan(n_items: int, batch_size: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True,
               drop_last: bool = True, rank: int = 0, world: int = 1, lengths: np.ndarray | None = None,
               length_grouping: int = 0) -> list[np.ndarray]:
    """Item indices of each batch this process sees in ``epoch``.

    The global batch of ``batch_size`` items is split evenly over ``world`` processes (so which
    items each step trains on together does not depend on the number of processes; the trained
    weights still do, since the trainer seeds dropout per process). ``length_grouping = g > 0`` sorts the
    shuffled items by length within windows of ``g`` global batches (less padding), then
    shuffles the order of the batches.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    for name, value, low in (("n_items", n_items, 0), ("world", world, 1), ("rank", rank, 0), ("seed", seed, 0),
                             ("epoch", epoch, 0), ("length_grouping", length_grouping, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    if rank >= world:          # a rank out of range once gave another process's batches (rank=-1: the last one's)
        raise ValueError(f"rank={rank} must be below world={world}")
    if lengths is not None and len(lengths) != n_items:
        raise ValueError(f"lengths has {len(lengths)} entries for n_items={n_items}; they must match")
    if batch_size % world:
        raise ValueError(f"batch_size={batch_size} must be divisible by the number of processes world={world}")
    rng = np.random.default_rng([int(seed), int(epoch)])
    order = rng.permutation(n_items) if shuffle else np.arange(n_items)
    if length_grouping and lengths is not None:
        window = length_grouping * batch_size
        for start in range(0, n_items, window):
            chunk = order[start:start + window]
            order[start:start + window] = chunk[np.argsort(-lengths[chunk], kind="stable")]
    stop = (n_items // batch_size) * batch_size if drop_last else n_items
    batches = [order[i:i + batch_size] for i in range(0, stop, batch_size)]
    if length_grouping and shuffle and lengths is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    if world > 1:
        batches = [np.array_split(b, world)[rank] for b in batches]
    return batches


class ClassificationData:
    """Labelled documents as right-padded batches.

    Parameters
    ----------
    docs : EncodedCorpus, RaggedIds or list of id sequences
    labels : array of 0/1, optional (default: ``docs.labels``)
    max_len : int
        Documents are cut to this many tokens.
    truncation : {"head", "head+tail", "error"}
        ``"head"`` keeps the first ``max_len`` tokens (the seed); ``"head+tail"`` keeps the first
        ``head_fraction·max_len`` and the last ones; ``"error"`` refuses longer documents.
    head_fraction : float in [0, 1], default 0.25
        ``"head+tail"``: the share of ``max_len`` taken from the start (at least one token when it is
        above 0); 0 keeps the tail only, 1 the head only.
    pad_id : int, default 0
        Fills the batches beyond each document (the models' ``padding_idx``).
    vocab_size : int, optional
        Checked against the ids.
    pad_multiple : int
        Batches are padded to a multiple of this length (fewer distinct shapes for the GPU kernels).
    """

    def __init__(self, docs, labels=None, *, max_len: int = 256, truncation: str = "head",
                 head_fraction: float = 0.25, pad_id: int = 0, vocab_size: int | None = None, pad_multiple: int = 1):
        self.docs = as_ragged(docs)
        if labels is None:
            labels = getattr(docs, "labels", None)
            if labels is None:
                raise ValueError("labels are needed: pass labels= or an EncodedCorpus with labels")
        self.labels = np.asarray(labels)
        if self.labels.shape != (len(self.docs),):
            raise ValueError(f"labels has shape {self.labels.shape}; expected ({len(self.docs)},), one per document")
        bad = np.flatnonzero((self.labels != 0) & (self.labels != 1))
        if bad.size:
            raise ValueError(f"document {bad[0]} has label {self.labels[bad[0]]!r}; classification needs labels 0 "
                             f"or 1 (unlabelled documents, label -1, cannot be used)")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {TRUNCATIONS}; got {truncation!r}")
        if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral) or max_len < 1:
            raise ValueError(f"max_len must be an integer >= 1; got {max_len!r}")
        lengths = self.docs.lengths
        if truncation == "error" and len(lengths) and lengths.max() > max_len:
            i = int(np.argmax(lengths))
            raise ValueError(f"document {i} has {lengths[i]} tokens, longer than max_len={max_len}; use "
                             f"truncation='head' or 'head+tail', or a larger max_len")
        _check_ids(self.docs.ids, vocab_size, "documents")
        if isinstance(pad_multiple, bool) or not isinstance(pad_multiple, numbers.Integral) or pad_multiple < 1:
            raise ValueError(f"pad_multiple must be an integer >= 1; got {pad_multiple!r}")
        if (isinstance(head_fraction, bool) or not isinstance(head_fraction, numbers.Real)
                or not 0.0 <= head_fraction <= 1.0):
            raise ValueError(f"head_fraction must be a number in [0, 1] (the share of max_len kept from the start "
                             f"with truncation='head+tail'); got {head_fraction!r}")
        _check_special(pad_id, "pad_id", vocab_size)
        max_len, pad_multiple = int(max_len), int(pad_multiple)          # np.int64 (lengths.max()) is fine
        self.max_len, self.truncation, self.pad_id, self.pad_multiple = max_len, truncation, pad_id, pad_multiple
        self.head = max_len
        if truncation == "head+tail":      # head_fraction=0 kept one head token (max(1, 0)), not the tail only
            self.head = int(round(head_fraction * max_len))
            self.head = max(1, self.head) if head_fraction > 0 else 0
        self.lengths = np.minimum(lengths, max_len)

    def __len__(self) -> int:
        return len(self.docs)

    def fingerprint(self) -> dict:
        return {"kind": "classification", "n_docs": len(self), "n_tokens": int(self.docs.n_tokens),
                "max_len": self.max_len, "truncation": self.truncation, "head": self.head,
                "checksum": cached_checksum(self, self.docs.ids, self.docs.offsets),
                "labels": hashlib.sha256(self.labels.astype(np.int8).tobytes()).hexdigest()[:16]}

    def _doc(self, i: int) -> np.ndarray:
        d = self.docs[i]
        if len(d) <= self.max_len:
            return d
        if self.truncation == "head+tail":
            return np.concatenate([d[: self.head], d[len(d) - (self.max_len - self.head):]])
        return d[: self.max_len]

    def batch(self, index) -> dict:
        """``{"ids": (B, T) int64, "attention_mask": (B, T) bool, "labels": (B,) float32, "n_tokens": int}``,
        T the longest (truncated) document in the batch."""
        index = np.asarray(index)
        if index.size == 0:
            raise ValueError("empty batch: no documents were selected")
        T = max(1, int(self.lengths[index].max()))
        T = min(self.max_len, -(-T // self.pad_multiple) * self.pad_multiple)   # fewer distinct shapes
        ids = np.full((len(index), T), self.pad_id, dtype=np.int64)
        for row, i in enumerate(index):          # a loop over documents, not tokens
            d = self._doc(int(i))
            ids[row, : len(d)] = d
        mask = np.arange(T)[None, :] < self.lengths[index][:, None]
        return {"ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                "labels": torch.from_numpy(self.labels[index].astype(np.float32)),
                "n_tokens": int(self.lengths[index].sum())}


class LMData:
    """Documents packed into one stream ``[bos] doc_0 [bos] doc_1 ...``, cut into sequences of
    ``seq_len`` inputs with next-token targets.

    ``bos_id`` (default 0, the ``<pad>`` id, unused otherwise) marks document starts, so a model
    trained on the stream can score a document from its first token (see
    :class:`distattn.train.NextTokenScorer`). Negative ids (OOV with ``oov="negative"``) become
    ``oov_id`` in the inputs and are ignored as targets.
    """

    def __init__(self, docs, *, seq_len: int, bos_id: int = 0, oov_id: int | None = None,
                 vocab_size: int | None = None):
        ragged = as_ragged(docs)
        _check_seq_len(seq_len)
        _check_special(bos_id, "bos_id", vocab_size)
        if oov_id is not None:
            _check_special(oov_id, "oov_id", vocab_size)
        lengths = ragged.lengths
        stream, _ = packed_stream(ragged, bos_id)
        self.targets_stream = stream.copy()
        if oov_id is not None:
            stream[stream < 0] = oov_id
        _check_ids(stream, vocab_size, "LM documents")
        self.stream, self.seq_len, self.bos_id = stream, seq_len, bos_id
        self.n_sequences = max(0, (len(stream) - 1) // seq_len)      # no documents: 0, not -1
        if self.n_sequences == 0 and len(lengths):
            raise ValueError(f"the documents hold {len(stream)} tokens with separators, fewer than seq_len + 1 = "
                             f"{seq_len + 1}; use a shorter seq_len")

    def __len__(self) -> int:
        return self.n_sequences

    def fingerprint(self) -> dict:
        return {"kind": "lm", "n_sequences": self.n_sequences, "seq_len": self.seq_len, "bos_id": self.bos_id,
                "checksum": cached_checksum(self, self.stream, self.targets_stream)}

    def batch(self, index) -> dict:
        """``{"ids": (B, seq_len) int64, "targets": (B, seq_len) int64, "n_tokens": int}``."""
        index = np.asarray(index)
        if index.size == 0:
            raise ValueError("empty batch: no sequences were selected")
        if index.min() < 0 or index.max() >= self.n_sequences:     # -1 wrapped around the stream: the last
            # seq_len tokens, the last one's target the stream's first token, a sequence the data does not hold
            raise IndexError(f"sequence indices must be in [0, {self.n_sequences}); got {index.min()}..{index.max()}")
        pos = index[:, None] * self.seq_len + np.arange(self.seq_len)[None, :]
        ids = torch.from_numpy(self.stream[pos].astype(np.int64))
        targets = torch.from_numpy(np.maximum(self.targets_stream[pos + 1], -1).astype(np.int64))
        return {"ids": ids, "targets": targets, "n_tokens": int(index.size * self.seq_len)}
