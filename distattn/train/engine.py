"""The training loop: one readable function's worth of nanoGPT habits.

* device: cuda, then mps, then cpu (``TrainConfig.device = "auto"``);
* bf16 autocast and TF32 on CUDA, fused AdamW, optional ``torch.compile``;
* gradient clipping, linear warm-up then cosine (or linear / constant) decay;
* determinism: data order is a function of ``(seed, epoch)`` and the torch RNG is re-seeded
  from ``(seed, rank, step)`` before every step, so a run killed and resumed from its last
  checkpoint under the same number of processes takes exactly the same steps as one that never
  stopped (a checkpoint resumes under another number too, for elastic restarts, but each
  process then draws other dropout masks for its share of the batch); AdamW is the fused kernel on
  the CPU too, since torch's default CPU AdamW rounds differently from process to process on
  several threads (``benchmarks/probe_cpu_reproducibility.py``);
* atomic checkpoints (``checkpoint.pt``) every ``checkpoint_every`` steps and at each epoch's
  end, refused with :class:`CheckpointMismatchError` when written by another configuration;
* evaluation at each epoch's end, history written to ``metrics.json`` atomically;
* a tqdm bar with tokens/s;
* DDP when launched by ``torchrun`` (``WORLD_SIZE > 1``): nccl on CUDA, gloo on CPU; the global
  batch ``batch_size`` is split evenly over the processes.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import dataclasses
import json
import math
import numbers
import os
import random
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from distattn.atomic import atomic_path, write_json
from distattn.train.tasks import tf32_matmuls, to_device

SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("auto", "bf16", "fp32")
DECAYS = ("matrices", "all")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CHECKPOINT_FORMAT = 1
LR_SCHEDULE_VERSION = 2    # lr_factor: 2 reaches min_lr_ratio at the last step (1 stopped one step above it)
# settings that change how a run is carried out but not what it computes: a checkpoint written under
# one value resumes under another (e.g. a longer run resumed with more frequent checkpoints)
RUNTIME_ONLY = ("device", "compile", "progress", "quiet", "log_every", "resume", "checkpoint_every")

__all__ = ["TrainConfig", "Trainer", "CheckpointMismatchError", "pick_device", "seed_everything", "lr_factor",
           "setup_distributed", "load_checkpoint", "save_model", "load_model"]


class CheckpointMismatchError(ValueError):
    """A checkpoint was written by a run with another model, training or data configuration."""


@dataclass
class TrainConfig:
    epochs: int = 1
    batch_size: int = 64                 # global: split evenly over DDP processes
    lr: float = 3e-4
    weight_decay: float = 0.01
    decay: str = "matrices"              # "matrices": weight decay on ≥2-D weights only; "all": every parameter
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    max_steps: int | None = None
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"              # bf16 autocast on CUDA, fp32 elsewhere
    compile: bool | str = False          # True or a torch.compile mode ("default", "reduce-overhead", ...)
    tf32: bool = True
    fused: bool = True                   # fused AdamW on CUDA and CPU (see make_optimizer)
    checkpoint_every: int = 0            # steps; 0: only at the end of each epoch
    resume: bool = True
    select_on: str | None = None         # "set/metric", e.g. "val/accuracy": records the best epoch
    save_best: bool = False              # with select_on: also keep the best weights (Trainer.best_state_dict,
    #                                      best.pt, and in checkpoint.pt, which then holds two copies of the weights)
    log_every: int = 50
    progress: bool = True                # a tqdm bar; without it one line per epoch is printed
    quiet: bool = False                  # neither bar nor epoch lines

    def validate(self) -> "TrainConfig":
        for name, low in (("epochs", 1), ("batch_size", 1), ("log_every", 1), ("warmup_steps", 0),
                          ("checkpoint_every", 0), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {v!r}")
            setattr(self, name, int(v))          # np.int64 is an integer too; metrics.json needs a Python int
        if self.max_steps is not None:
            v = self.max_steps
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"max_steps must be None or an integer >= 1; got {v!r}")
            self.max_steps = int(v)
        betas = self.betas
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(isinstance(b, numbers.Real) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1); got {betas!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, numbers.Real) or not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps must be a number in (0, 1); got {self.eps!r}")
        real = lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)     # lr=True was lr=1.0
        if not (real(self.lr) and self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a finite number > 0; got {self.lr!r}")
        if not (real(self.weight_decay) and 0 <= self.weight_decay < math.inf):
            raise ValueError(f"weight_decay must be a finite number >= 0; got {self.weight_decay!r}")
        if self.grad_clip is not None and not (real(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be None or a number > 0; got {self.grad_clip!r}")
        if not (real(self.min_lr_ratio) and 0.0 <= self.min_lr_ratio <= 1.0):
            raise ValueError(f"min_lr_ratio must be a number in [0, 1]; got {self.min_lr_ratio!r}")
        # numpy scalars pass these checks; Python floats go on (AdamW refused np.float32 betas, and
        # metrics.json could not hold np.float32 after an epoch's training)
        self.betas = tuple(float(b) for b in betas)
        self.eps, self.lr, self.weight_decay = float(self.eps), float(self.lr), float(self.weight_decay)
        self.min_lr_ratio = float(self.min_lr_ratio)
        self.grad_clip = None if self.grad_clip is None else float(self.grad_clip)
        for name in ("tf32", "fused", "resume", "save_best", "progress", "quiet"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):     # resume="no" was truthy: it resumed
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
            setattr(self, name, bool(getattr(self, name)))
        if self.save_best and self.select_on is None:
            raise ValueError("save_best=True needs select_on='set/metric' (e.g. 'val/accuracy') to know which "
                             "epoch is best; without it no best.pt was written")
        for name, allowed in (("schedule", SCHEDULES), ("precision", PRECISIONS), ("decay", DECAYS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}")
        if self.device not in ("auto", "cpu", "cuda", "mps") and not re.fullmatch(r"cuda:\d+", str(self.device)):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'; got {self.device!r}")
        if not (isinstance(self.compile, bool) or self.compile in COMPILE_MODES):
            raise ValueError(f"compile must be True, False or one of {COMPILE_MODES}; got {self.compile!r}")
        if self.select_on is not None and (not isinstance(self.select_on, str) or self.select_on.count("/") != 1):
            raise ValueError(f"select_on must look like 'set/metric' (e.g. 'val/accuracy'); got {self.select_on!r}")
        return self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(d["betas"])
        return d

    def fingerprint(self) -> dict:
        """The settings that decide what a run computes: ``to_dict()`` less RUNTIME_ONLY, and the
        version of :func:`lr_factor` (2: the decay reaches ``min_lr_ratio`` at the last step; a
        checkpoint of version 1 would resume on another schedule, and a cached model trained on it
        would be reused)."""
        return {**_result_settings(self.to_dict()), "lr_schedule": LR_SCHEDULE_VERSION}


def _result_settings(train: dict) -> dict:
    return {k: v for k, v in train.items() if k not in RUNTIME_ONLY}


# -- small helpers -------------------------------------------------------------------------------

def pick_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    """cuda (this process's GPU under torchrun), then mps, then cpu; or ``requested``: 'cpu', 'cuda',
    'cuda:N' or 'mps' (refused when this machine has no such device)."""
    text = str(requested) if isinstance(requested, torch.device) else requested
    # torch's own errors named every device type it knows ('gpu'), a bare 'Invalid device string' ('cuda:x',
    # 'cuda:-1') or a TypeError (None)
    if not isinstance(text, str) or not (text in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", text)):
        raise ValueError(f"device={requested!r} is invalid; allowed: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if requested != "auto":
        dev = torch.device(requested)
        if dev.type == "cuda" and not torch.cuda.is_available():
            mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
            raise ValueError(f"device={requested!r} was requested but CUDA is not available; allowed here: 'auto', "
                             f"'cpu'{', ' + repr('mps') if mps else ''}")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            # it failed later, at the first tensor moved there, with CUDA's 'invalid device ordinal'
            n = torch.cuda.device_count()
            raise ValueError(f"device={requested!r} was requested but this machine has {n} CUDA device"
                             f"{'s' if n != 1 else ''}; allowed: 'cuda' or 'cuda:0' to 'cuda:{n - 1}'")
        if dev.type == "mps" and not (getattr(torch.backends, "mps", None) is not None
                                      and torch.backends.mps.is_available()):
            raise ValueError(f"device={requested!r} was requested but MPS is not available (it needs Apple silicon "
                             f"and a torch built with MPS); allowed here: 'auto', 'cpu'"
                             f"{', ' + repr('cuda') if torch.cuda.is_available() else ''}")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup_distributed(device: str = "auto") -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)``; joins the process group when launched with WORLD_SIZE > 1:
    nccl when the run is on CUDA, gloo otherwise (``device="cpu"`` on a machine with CUDA too)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        on_cuda = torch.cuda.is_available() and (device == "auto" or str(device).startswith("cuda"))
        backend = "nccl" if on_cuda else "gloo"     # nccl carries no CPU tensors
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend)
        # the group this call made is torn down at exit: left to the interpreter's teardown, gloo's
        # threads could abort a finished process ("terminate called without an active exception")
        atexit.register(_destroy_process_group)
    return dist.get_rank(), dist.get_world_size(), local_rank


def _destroy_process_group() -> None:
    if dist.is_initialized():
        # gloo ranks tear down together: alone, a finished rank still aborted now and then (SIGABRT).
        # Bounded, since a rank leaving on an error meets a peer still inside another collective;
        # not nccl, whose barrier has no such bound (and where the abort was never seen)
        if dist.get_backend() == "gloo":
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
            except RuntimeError:      # a peer gone or timed out: tear down anyway
                pass
        dist.destroy_process_group()


def lr_factor(step: int, total: int, config: TrainConfig) -> float:
    """Multiplier of ``config.lr`` at ``step`` (0-based, of ``total``): linear warm-up from ``1 / warmup_steps``
    to 1 at step ``warmup_steps - 1``, then the schedule from 1 at step ``warmup_steps`` down to ``min_lr_ratio``
    at the last step, ``total - 1``."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    # the last step is total - 1: over total - warmup_steps its lr stayed one step above the floor
    p = min(1.0, (step - config.warmup_steps) / max(1, total - 1 - config.warmup_steps))
    lo = config.min_lr_ratio
    if config.schedule == "linear":
        return 1.0 - (1.0 - lo) * p
    return lo + (1.0 - lo) * 0.5 * (1.0 + math.cos(math.pi * p))


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if config.decay == "all":
        groups = [{"params": params, "weight_decay": config.weight_decay}]
    else:
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # torch's default CPU AdamW (one tensor at a time) rounds differently from process to process on
    # several threads; the fused kernel does not (benchmarks/probe_cpu_reproducibility.py)
    fused = bool(config.fused and device.type in ("cuda", "cpu"))
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps, fused=fused)


def _model_config(model: nn.Module) -> dict:
    model = _unwrap(model)          # a DDP wrapper has no config: its files held {"class": "DistributedDataParallel"}
    cfg = getattr(model, "config", None)
    return cfg.to_dict() if hasattr(cfg, "to_dict") else {"class": type(model).__name__}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def check_fingerprint(found: dict, expected: dict, path) -> None:
    a, b = _flatten(found), _flatten(expected)
    diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    if diff:
        lines = "; ".join(f"{k}: checkpoint {v[0]!r}, this run {v[1]!r}" for k, v in list(diff.items())[:8])
        more = f" (and {len(diff) - 8} more)" if len(diff) > 8 else ""
        raise CheckpointMismatchError(f"checkpoint {path} was written by another configuration: {lines}{more}. "
                                      f"Use another out_dir, delete the checkpoint, or set resume=False.")


def _without_runtime(fingerprint: dict) -> dict:
    """``fingerprint`` without the RUNTIME_ONLY train settings (older checkpoints still hold some of them)."""
    if not isinstance(fingerprint.get("train"), dict):
        return fingerprint
    return {**fingerprint, "train": _result_settings(fingerprint["train"])}


def save_model(model: nn.Module, path) -> None:
    """Weights and model config, written atomically (``torch.save``)."""
    with atomic_path(path) as tmp:
        torch.save({"format": CHECKPOINT_FORMAT, "model_config": _model_config(model),
                    "model": _unwrap(model).state_dict()}, tmp)


def load_model(path, model: nn.Module | None = None) -> nn.Module:
    """Weights from :func:`save_model` or a training checkpoint. Without ``model`` one is built from the
    stored config, in the dtype of the stored weights; with one, its config must match (else
    :class:`CheckpointMismatchError`)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise ValueError(f"{path} is not a distattn model file or checkpoint")
    fingerprint = ckpt.get("fingerprint")
    stored = ckpt.get("model_config") or (fingerprint.get("model") if isinstance(fingerprint, dict) else None)
    if not isinstance(stored, dict):        # a bare {"model": state_dict}: None once reached check_fingerprint
        raise ValueError(f"{path} holds weights but no model config (neither 'model_config' nor a training "
                         f"fingerprint), so the model cannot be built or checked; write it with save_model")
    if model is None:
        from distattn.models import build_model
        model = build_model(stored)
        # the config holds no dtype: a float64 (or bf16) model's weights were copied into a float32 one
        dtypes = {v.dtype for v in ckpt["model"].values() if torch.is_tensor(v) and v.is_floating_point()}
        if len(dtypes) == 1:
            model.to(dtypes.pop())
    else:
        check_fingerprint(stored, _model_config(model), path)
    _unwrap(model).load_state_dict(ckpt["model"])
    return model


def load_checkpoint(path, model: nn.Module, expected_fingerprint: dict | None = None) -> dict:
    """Load a training checkpoint's weights into ``model`` after checking its fingerprint against
    ``expected_fingerprint`` (parts of :meth:`Trainer.fingerprint`: ``{"model": ..., "train":
    TrainConfig.fingerprint(), ...}``); the model's config is checked too unless ``expected_fingerprint``
    names another ``"model"`` (a config such as n_heads changes no weight shape)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT or "fingerprint" not in ckpt:
        raise ValueError(f"{path} is not a distattn training checkpoint (format {CHECKPOINT_FORMAT})")
    expected = {"model": _model_config(model), **(expected_fingerprint or {})}
    found = {k: _without_runtime(ckpt["fingerprint"]).get(k) for k in expected}
    check_fingerprint(found, _without_runtime(expected), path)
    _unwrap(model).load_state_dict(ckpt["model"])
    return ckpt


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def _check_same_plans(epoch_steps: list, max_steps: int | None, world: int, device: torch.device) -> None:
    """Under DDP every rank must take the same steps in each epoch: a custom task whose plans differed in
    length between the ranks mismatched the processes' collectives (gloo aborted mid-run, nccl can hang).
    Two small collectives, once before training."""
    left = sum(epoch_steps) if max_steps is None else min(max_steps, sum(epoch_steps))
    steps = []                          # the steps each epoch takes within the run's budget
    for n in epoch_steps:
        steps.append(min(n, left))
        left -= steps[-1]
        if left == 0:
            break
    on = device if dist.get_backend() == "nccl" else "cpu"
    size = torch.tensor([len(steps)], dtype=torch.int64, device=on)
    dist.all_reduce(size, op=dist.ReduceOp.MAX)
    mine = torch.full((int(size.item()),), -1, dtype=torch.int64, device=on)
    mine[:len(steps)] = torch.tensor(steps, dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    plans = [[int(n) for n in t.tolist() if n >= 0] for t in every]
    if any(p != plans[0] for p in plans):
        e = next(i for i in range(int(size.item())) if len({tuple(p[i:i + 1]) for p in plans}) > 1)
        raise ValueError(f"the ranks plan different numbers of steps: "
                         f"{', '.join(f'rank {r} {sum(p)}' for r, p in enumerate(plans))} in all; "
                         f"{', '.join(f'rank {r} {p[e] if e < len(p) else 0}' for r, p in enumerate(plans))} in "
                         f"epoch {e + 1}. Under "
                         f"DDP every process must take as many steps in each epoch (the task's plan(batch_size, "
                         f"epoch, seed, rank, world) must give each rank as many batches), else their collectives "
                         f"mismatch")


# -- the trainer ---------------------------------------------------------------------------------

@dataclass
class _State:
    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    loss_sum: float = 0.0       # this epoch's training loss so far (flushed at checkpoints)
    loss_count: int = 0
    tokens: int = 0
    history: list = dataclasses.field(default_factory=list)
    best: dict | None = None
    # how each stretch of steps was trained: {"from_step", "device", "bf16", "world_size"}, a new entry
    # when a resume changes one of them (precision="auto" is bf16 on CUDA only; the device is RUNTIME_ONLY)
    segments: list = dataclasses.field(default_factory=list)


def _declared_metrics(task) -> tuple | None:
    """The metric names ``task`` declares its ``evaluate`` gives (``eval_metrics``), or None where the
    declaration may not describe it: a subclass that overrides ``evaluate`` (and may add a metric)
    without declaring its own names inherits a list that is not its own; it is checked after its
    first evaluation, like a task that declares nothing."""
    own = getattr(task, "__dict__", {})
    if "eval_metrics" in own:
        return own["eval_metrics"]
    if "evaluate" in own:
        return None
    mro = type(task).__mro__
    declares = next((c for c in mro if "eval_metrics" in vars(c)), None)
    evaluates = next((c for c in mro if "evaluate" in vars(c)), None)
    if declares is None or (evaluates is not None and not issubclass(declares, evaluates)):
        return None
    return declares.eval_metrics


class Trainer:
    """Train ``model`` on ``task`` (see :mod:`distattn.train.tasks`) following ``config``.

    ``out_dir`` receives ``checkpoint.pt``, ``metrics.json`` (and ``best.pt`` with ``save_best``; without
    it, a ``best.pt`` an earlier run left there is removed when ``metrics.json`` is written); without
    ``out_dir`` nothing is written. ``callbacks``: functions ``f(trainer, step, loss_tensor)`` called after each step.
    ``fit()`` returns the summary that ``metrics.json`` also holds; its ``segments`` list the device, bf16
    and number of processes of each stretch of steps (a resume that changes them starts a new one, and a
    change of precision, e.g. ``precision="auto"`` resumed off CUDA, or of processes is warned about).

    With ``save_best``, ``best_state_dict`` holds the best epoch's weights (a state dict on the CPU) once
    ``fit()`` has run: the weights ``best`` describes, kept in memory and in ``checkpoint.pt`` (a resumed
    run restores them from there). ``best.pt`` is a copy written for other readers; this run never reads
    it back, as another run training in the same ``out_dir`` (two compare runs of one config) may have
    replaced it with weights of its own best epoch.
    """

    def __init__(self, model: nn.Module, task, config: TrainConfig, out_dir=None,
                 callbacks: Sequence[Callable] = ()):
        self.model, self.task, self.config = model, task, config.validate()
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.callbacks = list(callbacks)
        self.best_state_dict: dict | None = None

    def fingerprint(self) -> dict:
        return {"model": _model_config(self.model), "train": self.config.fingerprint(), "task": self.task.fingerprint()}

    # checkpoints
    def _save(self, raw, opt, state: _State, rank: int) -> None:
        if self.out_dir is None or rank != 0:
            return
        with atomic_path(self.out_dir / "checkpoint.pt") as tmp:
            torch.save({"format": CHECKPOINT_FORMAT, "fingerprint": self.fingerprint(), "model": raw.state_dict(),
                        "optimizer": opt.state_dict(), "state": dataclasses.asdict(state),
                        "best_model": self.best_state_dict}, tmp)

    def _metrics(self, state: _State, summary: dict, rank: int) -> None:
        if self.out_dir is not None and rank == 0:
            write_json(self.out_dir / "metrics.json", {"model_config": _model_config(self.model),
                                                       "train_config": self.config.to_dict(),
                                                       "history": state.history, "best": state.best,
                                                       "summary": summary})
            if not self.config.save_best:
                # a best.pt left by an earlier run (resume=False starts over) is not this run's: beside this
                # metrics.json, whose "best" is this run's epoch, it held another run's weights. It goes once
                # metrics.json no longer describes the run that wrote it, as checkpoint.pt is overwritten
                (self.out_dir / "best.pt").unlink(missing_ok=True)

    def _select(self, state: _State, record: dict, raw: nn.Module, rank: int) -> None:
        if self.config.select_on is None:
            return
        name, metric = self.config.select_on.split("/")
        if name not in record["eval"] or metric not in record["eval"][name]:
            raise ValueError(f"select_on={self.config.select_on!r}: the evaluation has no such entry; it gives "
                             f"{ {k: sorted(v) for k, v in record['eval'].items()} }")
        value = record["eval"][name][metric]
        better = (lambda a, b: a > b) if metric in ("accuracy", "top1", "top10") else (lambda a, b: a < b)
        # a NaN compares False with everything: a NaN best stayed best for good, so any number replaces it
        # (and a NaN never replaces a number)
        stale = state.best is None or (state.best["value"] != state.best["value"] and value == value)
        if stale or better(value, state.best["value"]):
            state.best = {"epoch": record["epoch"], "value": value, "eval": record["eval"]}
            if self.config.save_best:
                self.best_state_dict = {k: v.detach().to("cpu", copy=True) for k, v in raw.state_dict().items()}
                if self.out_dir is not None and rank == 0:
                    save_model(raw, self.out_dir / "best.pt")

    def _resumed_best(self, ckpt: dict, ckpt_path: Path, state: _State) -> dict | None:
        """The best epoch's weights a resumed run restores: the checkpoint's, or (a checkpoint written
        before checkpoints held them) those of ``best.pt`` beside it, which nothing ties to ``state.best``."""
        if ckpt.get("best_model") is not None:
            return ckpt["best_model"]
        legacy = ckpt_path.with_name("best.pt")
        if not legacy.exists():
            warnings.warn(f"{ckpt_path} holds no weights of its best epoch ({state.best['epoch']}) and there is "
                          f"no best.pt beside it; best_state_dict stays None until an epoch improves on it",
                          stacklevel=3)
            return None
        warnings.warn(f"{ckpt_path} was written before checkpoints held the best epoch's weights: they are "
                      f"restored from {legacy}, which another run training in {ckpt_path.parent} may have "
                      f"replaced", stacklevel=3)
        return dict(torch.load(legacy, map_location="cpu", weights_only=False)["model"])

    def fit(self) -> dict:
        with tf32_matmuls(self.config.tf32):     # for this run only (it was left on for the whole process)
            return self._fit()

    def _fit(self) -> dict:
        cfg, task = self.config, self.task
        sets, selected = getattr(task, "eval_sets", None), (cfg.select_on or "").split("/")[0]
        if cfg.select_on is not None and isinstance(sets, dict) and selected not in sets:
            # refused before training (it was refused after the first epoch, whose training was then lost)
            raise ValueError(f"select_on={cfg.select_on!r}: the task has no evaluation set {selected!r}; "
                             f"its eval_sets are {sorted(sets)}")
        metrics, metric = _declared_metrics(task), (cfg.select_on or "/").split("/")[1]
        if cfg.select_on is not None and metrics is not None and metric not in metrics:
            # a task that declares its metrics has a typo refused before training too (a task that does
            # not is checked after the first evaluation, in _select)
            raise ValueError(f"select_on={cfg.select_on!r}: the task's evaluation gives no metric {metric!r}; "
                             f"it gives {sorted(metrics)}")
        rank, world, local_rank = setup_distributed(cfg.device)
        device = pick_device(cfg.device, local_rank)
        bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
        autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

        raw = _unwrap(self.model).to(device)
        opt = make_optimizer(raw, cfg, device)
        # every epoch's length: a custom task's epochs may differ (epochs x the first one's length once ran an
        # extra epoch, or stopped one half-way, and put the schedule's end elsewhere)
        # (up to max_steps: many epochs under a small max_steps plan only the ones that run)
        epoch_steps = []
        for e in range(cfg.epochs):
            epoch_steps.append(len(task.plan(cfg.batch_size, e, cfg.seed, rank, world)))
            if epoch_steps[-1] == 0 or (cfg.max_steps is not None and sum(epoch_steps) >= cfg.max_steps):
                break
        if world > 1:       # before the refusal below, which then comes on every rank
            _check_same_plans(epoch_steps, cfg.max_steps, world, device)
        if 0 in epoch_steps:
            at = "" if epoch_steps[0] == 0 else f" in epoch {epoch_steps.index(0) + 1}"
            raise ValueError(f"the training data gives no full batch of batch_size={cfg.batch_size}{at}; use a "
                             f"smaller batch_size or more data")
        steps_per_epoch = min(epoch_steps)
        total = sum(epoch_steps) if cfg.max_steps is None else min(cfg.max_steps, sum(epoch_steps))
        if cfg.warmup_steps > total and rank == 0:      # a warning, not an error: short smoke runs of a recipe are fine
            warnings.warn(f"warmup_steps={cfg.warmup_steps} is longer than this run's {total} steps: the learning "
                          f"rate peaks at {total / cfg.warmup_steps:.3g} x lr={cfg.lr!r} and the {cfg.schedule!r} "
                          f"decay never starts; lower warmup_steps or train longer", stacklevel=2)

        state = _State()
        self.best_state_dict = None
        ckpt_path = None if self.out_dir is None else self.out_dir / "checkpoint.pt"
        if cfg.resume and ckpt_path is not None and ckpt_path.exists():
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT or "fingerprint" not in ckpt:
                raise CheckpointMismatchError(f"{ckpt_path} is not a distattn training checkpoint of format "
                                              f"{CHECKPOINT_FORMAT} (a save_model file has no training state)")
            check_fingerprint(_without_runtime(ckpt["fingerprint"]), self.fingerprint(), ckpt_path)
            raw.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            state = _State(**ckpt["state"])
            if cfg.save_best and state.best is not None:
                self.best_state_dict = self._resumed_best(ckpt, ckpt_path, state)
        here = {"from_step": state.step, "device": str(device), "bf16": bf16, "world_size": world}
        last = state.segments[-1] if state.segments else None
        if state.step < total and (last is None or any(last[k] != here[k] for k in ("device", "bf16", "world_size"))):
            if last is not None and rank == 0 and (last["bf16"] != bf16 or last["world_size"] != world):
                was, now = (f"{'bf16' if d['bf16'] else 'fp32'} on {d['device']} in {d['world_size']} "
                            f"process{'es' if d['world_size'] > 1 else ''}" for d in (last, here))
                warnings.warn(f"{ckpt_path} was trained {was} up to step {state.step}; it resumes {now} "
                              f"(precision={cfg.precision!r}), so the steps from here are not the ones the "
                              f"interrupted run would have taken; summary.segments in metrics.json records "
                              f"each part", stacklevel=2)
            state.segments.append(here)

        model = raw
        if world > 1:
            model = nn.parallel.DistributedDataParallel(raw, device_ids=[device.index] if device.type == "cuda" else None)
        if cfg.compile:
            model = torch.compile(model, mode=None if cfg.compile is True else cfg.compile)

        bar = None
        if cfg.progress and not cfg.quiet and rank == 0:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, initial=state.step, unit="step", dynamic_ncols=True, mininterval=2.0,
                       desc=type(raw).__name__)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        t_start = time.perf_counter()
        timing = {"tokens": 0, "seconds": 0.0}          # steady state: after this process's first steps
        warm_steps = min(10, max(1, min(steps_per_epoch, total - state.step) // 5))
        steps_here, t_window, tokens_window = 0, None, 0
        run_loss = torch.zeros((), device=device)
        pending_tokens = 0                              # this process's real tokens since the last flush
        log_tokens, log_t = 0, time.perf_counter()

        def flush_loss(window_tokens: int = 0) -> int:
            """Adds the running loss and this process's real tokens since the last flush to ``state``;
            returns ``window_tokens`` summed over the ranks (the steady-state window's count)."""
            nonlocal run_loss, pending_tokens
            value = float(run_loss)       # the sync this flush always had; no per-step check is added
            diverged = not math.isfinite(value)
            mean, tokens = value, pending_tokens
            if world > 1:                 # every rank flushes here: they stop together (one rank's NaN
                # step poisons all weights through the all-reduce), and the loss recorded is the mean over
                # the ranks (it was rank 0's share of each global batch alone); the token counts ride on the
                # same all-reduce (they were rank 0's times the world size, not the real count of padded
                # classification batches)
                both = torch.tensor([float(diverged), 0.0 if diverged else value, float(tokens), float(window_tokens)],
                                    dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
                dist.all_reduce(both, op=dist.ReduceOp.SUM)
                diverged, mean = bool(both[0].item() > 0), both[1].item() / world
                tokens, window_tokens = int(both[2].item()), int(both[3].item())
            if diverged:                  # refuse before a checkpoint or metrics.json records NaN weights
                raise FloatingPointError(
                    f"the training loss became {value if not math.isfinite(value) else 'non-finite on another rank'} "
                    f"by step {state.step} (epoch {state.epoch + 1}); nothing was "
                    f"saved since the last checkpoint. Lower lr (now {cfg.lr!r}), set grad_clip (now "
                    f"{cfg.grad_clip!r}) or check the inputs")
            state.loss_sum += mean
            state.tokens += tokens
            run_loss, pending_tokens = torch.zeros((), device=device), 0
            return window_tokens

        while state.step < total:
            plan = task.plan(cfg.batch_size, state.epoch, cfg.seed, rank, world)
            model.train()
            t_epoch = time.perf_counter()
            for index in plan[state.step_in_epoch:]:
                if state.step >= total:
                    break
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * lr_factor(state.step, total, cfg)
                torch.manual_seed((cfg.seed * 1_000_003 + rank * 10_007 + state.step) % (2**62))
                host = task.make_batch(index)
                batch = to_device(host, device)
                with autocast():
                    loss = task.loss(model, batch)
                loss.backward()
                if cfg.grad_clip is not None:
                    nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                run_loss += loss.detach().float()
                n_tok = host["n_tokens"]
                state.step += 1
                state.step_in_epoch += 1
                state.loss_count += 1
                pending_tokens += n_tok
                steps_here += 1
                log_tokens += n_tok * world          # the bar's estimate: no collective per logged step
                if t_window is not None:
                    tokens_window += n_tok
                if steps_here == warm_steps:
                    sync()
                    t_window, tokens_window = time.perf_counter(), 0
                if bar is not None:
                    bar.update(1)
                    if state.step % cfg.log_every == 0:
                        now = time.perf_counter()
                        avg = (state.loss_sum + float(run_loss)) / state.loss_count
                        bar.set_postfix(loss=f"{avg:.4f}", tok_s=f"{log_tokens / (now - log_t):,.0f}",
                                        lr=f"{opt.param_groups[0]['lr']:.2e}")
                        log_tokens, log_t = 0, now
                for cb in self.callbacks:
                    cb(self, state.step, loss)
                if (cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0
                        and state.step_in_epoch < len(plan) and state.step < total):
                    flush_loss()
                    self._save(raw, opt, state, rank)

            # end of an epoch (or of max_steps)
            sync()
            now = time.perf_counter()
            window_tokens = flush_loss(tokens_window if t_window is not None else 0)
            if t_window is not None:
                timing["tokens"] += window_tokens
                timing["seconds"] += now - t_window
            epoch_time = now - t_epoch
            model.eval()
            raw.eval()
            t_eval = time.perf_counter()
            evaluation = task.evaluate(raw, device, autocast)
            record = {"epoch": state.epoch + 1, "step": state.step, "train_loss": state.loss_sum / max(1, state.loss_count),
                      "lr": opt.param_groups[0]["lr"], "eval": evaluation,
                      "epoch_train_seconds": epoch_time, "eval_seconds": time.perf_counter() - t_eval}
            state.history.append(record)
            self._select(state, record, raw, rank)
            state.epoch += 1
            state.step_in_epoch = 0
            state.loss_sum, state.loss_count = 0.0, 0
            self._save(raw, opt, state, rank)
            summary = self._summary(state, timing, time.perf_counter() - t_start, device, bf16, world)
            self._metrics(state, summary, rank)
            if rank == 0 and not cfg.progress and not cfg.quiet:
                ev = "; ".join(f"{k}: " + ", ".join(f"{m}={v:.4f}" for m, v in d.items() if isinstance(v, float))
                               for k, d in evaluation.items())
                print(f"[{type(raw).__name__}] epoch {record['epoch']} step {state.step}/{total} "
                      f"train_loss={record['train_loss']:.4f} {ev} ({epoch_time:.1f}s)", flush=True)
            if t_window is not None:        # restart the window after evaluation
                sync()
                t_window, tokens_window = time.perf_counter(), 0
            model.train()
        if bar is not None:
            bar.close()
        raw.eval()
        summary = self._summary(state, timing, time.perf_counter() - t_start, device, bf16, world)
        if steps_here == 0:
            summary = self._earlier_timing(summary)
        self._metrics(state, summary, rank)
        return {"history": state.history, "best": state.best, "summary": summary}

    def _earlier_timing(self, summary: dict) -> dict:
        """``summary`` of a process that trained no step (a finished run run again): the timing of the
        process that trained, from the earlier metrics.json, labelled as such (it was rewritten as
        ``steady_tokens_per_s`` None and this process's near-zero wall time, and the measured figures were lost)."""
        path = None if self.out_dir is None else self.out_dir / "metrics.json"
        try:
            earlier = json.loads(path.read_text())["summary"]
        except (AttributeError, OSError, ValueError, KeyError, TypeError):
            return summary
        if not isinstance(earlier, dict) or earlier.get("steps") != summary["steps"]:
            return summary
        keys = ("steady_tokens_per_s", "wall_seconds_this_process", "device", "bf16", "world_size", "compile")
        return {**summary, **{k: earlier[k] for k in keys if k in earlier}, "timing_from_an_earlier_process": True}

    def _summary(self, state, timing, wall, device, bf16, world) -> dict:
        return {"steps": state.step, "epochs_done": state.epoch, "tokens": state.tokens,
                "steady_tokens_per_s": timing["tokens"] / timing["seconds"] if timing["seconds"] > 0 else None,
                "wall_seconds_this_process": wall, "device": str(device), "bf16": bf16, "world_size": world,
                "compile": self.config.compile, "segments": state.segments}
