"""What to train: a task turns data into batches, a loss, and evaluation metrics.

A task offers ``plan(batch_size, epoch, seed, rank, world)`` (index arrays, see
:func:`epoch_plan`), ``make_batch(index)``, ``loss(model, batch)``,
``evaluate(model, device, autocast)`` → ``{set_name: {metric: value}}`` and ``fingerprint()``.
It may also declare ``eval_metrics``, the metric names each set's evaluation gives: a
``TrainConfig.select_on`` naming another metric is then refused before training (without the
declaration, after the first evaluation).
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from distattn.models.precision import at_least_float32
from distattn.train.data import ClassificationData, LMData, _check_count, epoch_plan

__all__ = ["ClassificationTask", "LMTask", "eval_mode", "to_device"]


def to_device(batch: dict, device: torch.device) -> dict:
    pin = device.type == "cuda"
    return {k: (v.pin_memory().to(device, non_blocking=True) if pin else v.to(device))
            if torch.is_tensor(v) else v for k, v in batch.items()}


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Run ``model`` in evaluation mode (no dropout) and give it back in the mode it had:
    evaluation and prediction are deterministic whoever calls them."""
    was = [m.training for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, t in zip(model.modules(), was):
            m.training = t


def _check_eval_sets(eval_sets) -> dict:
    """``{name: data}`` with at least one item in each set: an empty one once scored NaN (or, for an
    LM, perplexity 1.0)."""
    if not isinstance(eval_sets, dict):
        raise TypeError(f"eval_sets must be a dict {{name: data}}; got {type(eval_sets).__name__}")
    for name, data in eval_sets.items():
        if not hasattr(data, "batch") or not hasattr(data, "__len__"):
            raise TypeError(f"eval set {name!r} is a {type(data).__name__}; it must be a data object "
                            f"(ClassificationData, LMData, MaskedLMData)")
        if len(data) == 0:
            raise ValueError(f"eval set {name!r} is empty; leave it out or give it documents")
    return dict(eval_sets)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """CUDA float32 matmuls and convolutions in TF32 (``enabled``) or strict float32 while inside;
    the previous (process-wide) settings come back on exit, so what runs after a training run does
    not depend on whether one ran before it in the process."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def in_eval_mode(method):
    """Decorator for a task's ``evaluate(model, ...)`` / ``predict(model, ...)``: it runs under :func:`eval_mode` and
    without gradients."""
    @functools.wraps(method)
    def wrapper(self, model, *args, **kwargs):
        with torch.no_grad(), eval_mode(model):
            return method(self, model, *args, **kwargs)
    return wrapper


def _logits_and_loss(model, out):
    """An LM's ``(logits, loss)``; anything else (a classifier reads the targets as its attention mask and
    returns logits) would be trained on as if it were a loss."""
    if not (isinstance(out, tuple) and len(out) == 2):
        name = type(getattr(model, "_orig_mod", model)).__name__
        raise TypeError(f"this task needs a language model whose model(ids, targets) returns (logits, loss) "
                        f"(TransformerLM, ProjectionMatchedLM, MaskedLM); {name} returned "
                        f"{type(out).__name__}{tuple(out.shape) if torch.is_tensor(out) else ''}")
    return out


class ClassificationTask:
    """Binary classification with a logit model ``model(ids, attention_mask) -> (B,)``; BCE loss.

    ``eval_sets``: ``{name: ClassificationData}`` scored at each epoch (accuracy, loss).
    ``length_grouping``: see :func:`epoch_plan` (0 = plain shuffling, as in the seed).
    """

    eval_metrics = ("accuracy", "loss", "n")

    def __init__(self, train: ClassificationData, eval_sets: dict | None = None, *, length_grouping: int = 0,
                 eval_batch_size: int = 256):
        self.train = train
        self.eval_sets = _check_eval_sets(eval_sets or {})
        self.length_grouping = length_grouping
        self.eval_batch_size = _check_count(eval_batch_size, "eval_batch_size")

    def fingerprint(self) -> dict:
        return {"task": "classification", "train": self.train.fingerprint(), "length_grouping": self.length_grouping,
                "eval": {k: v.fingerprint() for k, v in self.eval_sets.items()}}

    def plan(self, batch_size, epoch, seed, rank=0, world=1):
        return epoch_plan(len(self.train), batch_size, epoch=epoch, seed=seed, rank=rank, world=world,
                          lengths=self.train.lengths, length_grouping=self.length_grouping)

    def make_batch(self, index):
        return self.train.batch(index)

    def loss(self, model, batch):
        logits = model(batch["ids"], batch["attention_mask"])
        logits = at_least_float32(logits)                  # float32, float64 for a float64 model
        return F.binary_cross_entropy_with_logits(logits, batch["labels"].to(logits.dtype))

    @in_eval_mode
    def predict(self, model, data: ClassificationData, device, autocast=contextlib.nullcontext) -> np.ndarray:
        """Positive-class probabilities for every document of ``data``, in order (the model in
        evaluation mode, then back in its own)."""
        order = np.argsort(-data.lengths, kind="stable")           # little padding
        probs = np.empty(len(data), dtype=np.float64)
        for start in range(0, len(order), self.eval_batch_size):
            idx = order[start:start + self.eval_batch_size]
            b = to_device(data.batch(idx), device)
            with autocast():
                logits = model(b["ids"], b["attention_mask"])
            probs[idx] = torch.sigmoid(at_least_float32(logits)).cpu().numpy()
        return probs

    @in_eval_mode
    def evaluate(self, model, device, autocast=contextlib.nullcontext) -> dict:
        out = {}
        for name, data in self.eval_sets.items():
            p = np.clip(self.predict(model, data, device, autocast), 1e-7, 1 - 1e-7)
            y = data.labels.astype(np.float64)
            out[name] = {"accuracy": float(((p >= 0.5) == (y == 1)).mean()),
                         "loss": float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()), "n": int(len(y))}
        return out


class LMTask:
    """Next-token prediction: ``model(ids, targets) -> (logits, loss)``. Evaluation: mean loss and
    perplexity on each eval set (at most ``max_eval_sequences`` sequences of each)."""

    kind = "lm"
    eval_metrics = ("loss", "perplexity", "n_tokens")

    def __init__(self, train: LMData, eval_sets: dict | None = None, *, eval_batch_size: int = 64,
                 max_eval_sequences: int | None = 2048):
        self.train = train
        self.eval_sets = _check_eval_sets(eval_sets or {})
        self.eval_batch_size = _check_count(eval_batch_size, "eval_batch_size")
        self.max_eval_sequences = (None if max_eval_sequences is None
                                   else _check_count(max_eval_sequences, "max_eval_sequences"))

    def fingerprint(self) -> dict:
        return {"task": self.kind, "train": self.train.fingerprint(), "max_eval_sequences": self.max_eval_sequences,
                "eval": {k: v.fingerprint() for k, v in self.eval_sets.items()}}

    def plan(self, batch_size, epoch, seed, rank=0, world=1):
        return epoch_plan(len(self.train), batch_size, epoch=epoch, seed=seed, rank=rank, world=world)

    def make_batch(self, index):
        return self.train.batch(index)

    def loss(self, model, batch):
        return _logits_and_loss(model, model(batch["ids"], batch["targets"]))[1]

    @in_eval_mode
    def evaluate(self, model, device, autocast=contextlib.nullcontext) -> dict:
        out = {}
        for name, data in self.eval_sets.items():
            n = len(data) if self.max_eval_sequences is None else min(len(data), self.max_eval_sequences)
            total, count = 0.0, 0
            for start in range(0, n, self.eval_batch_size):
                b = to_device(data.batch(np.arange(start, min(n, start + self.eval_batch_size))), device)
                k = int((b["targets"] >= 0).sum())
                if k == 0:              # no target (all OOV): a model's mean loss over none may be NaN, and NaN * 0 is NaN
                    continue
                with autocast():
                    _, loss = _logits_and_loss(model, model(b["ids"], b["targets"]))
                total += float(loss) * k
                count += k
            # no target at all: NaN, not the perfect loss 0 / perplexity 1 that total / max(count, 1) gave
            mean = total / count if count else math.nan
            out[name] = {"loss": mean, "perplexity": math.exp(mean), "n_tokens": count}
        return out
