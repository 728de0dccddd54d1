"""Masked-LM batches: packed sequences with BERT's 80/10/10 corruption, reproducible per token.

Every random choice is a hash of ``(seed, epoch, stream position)`` (splitmix64), so a token's
fate does not depend on which batch, process or resumed run draws it: masks change from epoch
to epoch (RoBERTa's dynamic masking) and a killed run resumes with the same masks.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np
import torch

from distattn.train.data import _check_ids, _check_seq_len, as_ragged, epoch_plan, packed_stream, cached_checksum
from distattn.train.tasks import LMTask, in_eval_mode, to_device

__all__ = ["MaskedLMData", "MaskedLMTask", "hashed_uniform"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hashed_uniform(seed: int, epoch: int, stream: int, positions: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) floats, one per position: a pure function of all four arguments."""
    key = _mix(_mix(_mix(np.array([int(seed) % 2**64], dtype=np.uint64)) + np.uint64(int(epoch) % 2**64))
               + np.uint64(stream))
    z = _mix(np.asarray(positions, dtype=np.uint64) + key)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


class MaskedLMData:
    """Documents packed as in :class:`~distattn.train.LMData` (``[bos] doc_0 [bos] doc_1 ...``), cut
    into sequences of ``seq_len``; in each, ``K = round(mask_prob · seq_len)`` positions are chosen
    at random among real tokens (not ``bos``, not OOV) and corrupted: ``[MASK]`` with probability
    ``replace[0]``, a random id in ``[random_low, mask_id)`` with ``replace[1]``, unchanged otherwise.

    ``batch(index, epoch)`` returns ``{"ids": (B, seq_len), "positions": (B, K), "targets": (B, K)
    (-1 where a row had fewer than K eligible tokens), "n_tokens"}``.
    """

    def __init__(self, docs, *, seq_len: int, mask_id: int, mask_prob: float = 0.15,
                 replace: tuple[float, float] = (0.8, 0.1), random_low: int = 2, seed: int = 0, bos_id: int = 0,
                 oov_id: int | None = None):
        ragged = as_ragged(docs)
        _check_seq_len(seq_len)
        if isinstance(mask_id, bool) or not isinstance(mask_id, (int, np.integer)) or mask_id < 1:
            raise ValueError(f"mask_id must be an integer >= 1; got {mask_id!r}")
        if isinstance(mask_prob, bool) or not isinstance(mask_prob, numbers.Real) or not 0 < mask_prob < 1:
            raise ValueError(f"mask_prob must be a number in (0, 1); got {mask_prob!r}")   # np.float32 too
        for name, value in (("bos_id", bos_id), ("oov_id", oov_id)):
            # unchecked, bos_id=-1 with oov_id=1 made every separator the OOV id, and a bad bos_id was
            # blamed on the documents
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                                      or not 0 <= value < mask_id):
                raise ValueError(f"{name}={value!r} is invalid; allowed: a token id in [0, mask_id={mask_id})")
        p_mask, p_random = (float(x) for x in replace)
        if not (p_mask >= 0 and p_random >= 0 and p_mask + p_random <= 1):     # NaN once passed: nothing was masked
            raise ValueError(f"replace=(p_mask, p_random) must be >= 0 with a sum <= 1; got {replace!r}")
        if isinstance(random_low, bool) or not isinstance(random_low, (int, np.integer)) or not 0 <= random_low < mask_id:
            # a float (2.5) or True once passed; random ids are drawn from the integers [random_low, mask_id)
            raise ValueError(f"random_low must be in [0, mask_id={mask_id}); got {random_low!r}")
        stream, is_bos = packed_stream(ragged, bos_id)
        self.eligible = ~is_bos & (stream >= 0)
        if oov_id is not None:
            stream[stream < 0] = oov_id
        _check_ids(stream, mask_id, "masked-LM documents (ids must be below mask_id)")
        self.stream, self.seq_len, self.mask_id, self.bos_id = stream, int(seq_len), int(mask_id), bos_id
        self.mask_prob, self.replace, self.random_low, self.seed = float(mask_prob), (p_mask, p_random), random_low, seed
        self.n_masked = max(1, round(self.mask_prob * self.seq_len))
        self.n_sequences = len(stream) // self.seq_len
        if self.n_sequences == 0 and len(ragged):
            raise ValueError(f"the documents hold {len(stream)} tokens with separators, fewer than seq_len = "
                             f"{seq_len}; use a shorter seq_len")

    def __len__(self) -> int:
        return self.n_sequences

    def fingerprint(self) -> dict:
        return {"kind": "mlm", "n_sequences": self.n_sequences, "seq_len": self.seq_len, "mask_id": self.mask_id,
                "mask_prob": self.mask_prob, "replace": list(self.replace), "random_low": self.random_low,
                "seed": self.seed, "bos_id": self.bos_id,
                # the eligible mask too: OOV tokens given oov_id are never masked, real oov_id tokens may be,
                # and the two streams are equal (a checkpoint of one resumed the other)
                "checksum": cached_checksum(self, self.stream, self.eligible)}

    def batch(self, index, epoch: int = 0) -> dict:
        index = np.asarray(index, dtype=np.int64)
        if index.size == 0:
            raise ValueError("empty batch: no sequences were selected")
        if index.min() < 0 or index.max() >= self.n_sequences:
            raise IndexError(f"sequence indices must be in [0, {self.n_sequences}); got {index.min()}..{index.max()}")
        T, K = self.seq_len, self.n_masked
        pos = index[:, None] * T + np.arange(T)[None, :]
        score = hashed_uniform(self.seed, epoch, 0, pos)
        eligible = self.eligible[pos]
        score[~eligible] = 2.0                                          # chosen only if a row runs short
        chosen = np.sort(np.argpartition(score, K - 1, axis=1)[:, :K], axis=1)
        rows = np.arange(len(index))[:, None]
        gpos = pos[rows, chosen]
        ids = self.stream[pos].astype(np.int64)
        targets = np.where(eligible[rows, chosen], ids[rows, chosen], -1)
        fate = hashed_uniform(self.seed, epoch, 1, gpos)
        draw = hashed_uniform(self.seed, epoch, 2, gpos)
        random_ids = self.random_low + np.minimum((draw * (self.mask_id - self.random_low)).astype(np.int64),
                                                  self.mask_id - self.random_low - 1)
        p_mask, p_random = self.replace
        new = np.where(fate < p_mask, self.mask_id, np.where(fate < p_mask + p_random, random_ids, ids[rows, chosen]))
        ids[rows, chosen] = np.where(targets >= 0, new, ids[rows, chosen])
        return {"ids": torch.from_numpy(ids), "positions": torch.from_numpy(chosen.astype(np.int64)),
                "targets": torch.from_numpy(targets.astype(np.int64)), "n_tokens": int(index.size * T)}


class MaskedLMTask(LMTask):
    """Masked-token recovery with :class:`~distattn.models.MaskedLM`. Evaluation (epoch-0 masks, at
    most ``max_eval_sequences`` sequences per set): mean loss, perplexity and top-1 accuracy over
    the masked tokens."""

    kind = "mlm"
    eval_metrics = ("loss", "perplexity", "accuracy", "n_tokens")

    def plan(self, batch_size, epoch, seed, rank=0, world=1):
        # the epoch travels inside the indices (epoch · n + i), so make_batch can draw its masks
        n = len(self.train)
        return [b + epoch * n for b in epoch_plan(n, batch_size, epoch=epoch, seed=seed, rank=rank, world=world)]

    def make_batch(self, index):
        index = np.asarray(index, dtype=np.int64)
        n = len(self.train)
        return self.train.batch(index % n, epoch=int(index[0] // n))

    def _check_mask_id(self, model) -> None:
        """The data's [MASK] id must be the model's: another id (a valid word) trained silently."""
        if getattr(self, "_checked", None) is model:
            return
        raw = getattr(model, "module", model)                  # DDP
        raw = getattr(raw, "_orig_mod", raw)                   # torch.compile
        token = getattr(getattr(raw, "config", None), "mask_token", None)
        for name, data in [("train", self.train), *self.eval_sets.items()]:
            if token is not None and getattr(data, "mask_id", token) != token:
                raise ValueError(f"the {name} data's mask_id={data.mask_id} is not the model's mask token "
                                 f"{token}; build MaskedLMData with mask_id=model.config.mask_token")
        self._checked = model

    def loss(self, model, batch):
        self._check_mask_id(model)
        return model(batch["ids"], batch["positions"], batch["targets"])[1]

    @in_eval_mode
    def evaluate(self, model, device, autocast=contextlib.nullcontext) -> dict:
        self._check_mask_id(model)
        out = {}
        for name, data in self.eval_sets.items():
            n = len(data) if self.max_eval_sequences is None else min(len(data), self.max_eval_sequences)
            total, correct, count = 0.0, 0, 0
            for start in range(0, n, self.eval_batch_size):
                b = to_device(data.batch(np.arange(start, min(n, start + self.eval_batch_size))), device)
                keep = b["targets"] >= 0
                k = int(keep.sum())
                if k == 0:              # no masked token to score (see LMTask.evaluate)
                    continue
                with autocast():
                    logits, loss = model(b["ids"], b["positions"], b["targets"])
                total += float(loss) * k
                correct += int((logits.argmax(-1) == b["targets"])[keep].sum())
                count += k
            # no target at all: NaN, not the perfect loss 0 / perplexity 1 that total / max(count, 1) gave
            mean = total / count if count else math.nan
            out[name] = {"loss": mean, "perplexity": math.exp(mean), "accuracy": correct / count if count else math.nan,
                         "n_tokens": count}
        return out
