"""distattn.train: data, schedule, the trainer, checkpoints (kill and resume), DDP over gloo, LM metrics."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from distattn.corpus.ragged import RaggedIds
from distattn.models import LMConfig, TransformerClassifier, TransformerLM, seed_classifier_config
from distattn.train import (CheckpointMismatchError, ClassificationData, ClassificationTask, LMData, LMTask,
                            NextTokenScorer, TrainConfig, Trainer, epoch_plan, evaluate_lm, load_checkpoint,
                            load_model, lr_factor, pick_device, save_model, seed_everything)
from distattn.train.recipes import seed_train_config

REPO = Path(__file__).resolve().parents[1]
V = 30


def toy_docs(n=64, seed=0):
    """Label 1 iff token 3 occurs more often than token 4: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for i in range(n):
        y = i % 2
        d = rng.integers(5, V, rng.integers(4, 14))
        d[rng.random(len(d)) < 0.5] = 3 if y else 4
        docs.append(d)
        labels.append(y)
    return docs, np.array(labels)


def tiny_classifier():
    return TransformerClassifier(seed_classifier_config(vocab_size=V, d_model=16, d_ff=32, n_heads=2, head_hidden=8,
                                                        max_len=16, init="gpt2"))


def quiet(**kw):
    base = dict(device="cpu", progress=False, log_every=1000)
    base.update(kw)
    return TrainConfig(**base)


# -- data -------------------------------------------------------------------------------------------

def test_epoch_plan_is_deterministic_and_split_over_processes():
    a = epoch_plan(50, 8, epoch=3, seed=1)
    assert [x.tolist() for x in a] == [x.tolist() for x in epoch_plan(50, 8, epoch=3, seed=1)]
    assert len(a) == 6 and all(len(x) == 8 for x in a)                 # the partial batch is dropped
    assert [x.tolist() for x in a] != [x.tolist() for x in epoch_plan(50, 8, epoch=4, seed=1)]
    r0, r1 = epoch_plan(50, 8, epoch=3, seed=1, world=2, rank=0), epoch_plan(50, 8, epoch=3, seed=1, world=2, rank=1)
    assert all(np.array_equal(np.concatenate([x, y]), g) for x, y, g in zip(r0, r1, a))
    with pytest.raises(ValueError, match="divisible"):
        epoch_plan(50, 7, world=2)
    lengths = np.arange(50)
    grouped = epoch_plan(50, 5, lengths=lengths, length_grouping=10)      # one window: sorted batches
    assert all(lengths[b].max() - lengths[b].min() == 4 for b in grouped)
    assert sorted(np.concatenate(grouped).tolist()) == list(range(50))


def test_classification_batches_and_truncation():
    docs = [np.arange(2, 12), np.array([5, 6])]
    data = ClassificationData(docs, [1, 0], max_len=6)
    b = data.batch([0, 1])
    assert b["ids"].tolist() == [[2, 3, 4, 5, 6, 7], [5, 6, 0, 0, 0, 0]]
    assert b["attention_mask"].sum(1).tolist() == [6, 2] and b["n_tokens"] == 8
    ht = ClassificationData(docs, [1, 0], max_len=6, truncation="head+tail", head_fraction=0.5)
    assert ht.batch([0])["ids"].tolist() == [[2, 3, 4, 9, 10, 11]]
    assert ClassificationData(docs, [1, 0], max_len=6, pad_multiple=4).batch([1])["ids"].shape == (1, 4)


@pytest.mark.parametrize("head_fraction, kept", [
    (0, [8, 9, 10, 11]),             # tail only (kept the first token: [2, 9, 10, 11])
    (0.0, [8, 9, 10, 11]),
    (0.1, [2, 9, 10, 11]),           # a positive share keeps at least one head token
    (0.5, [2, 3, 10, 11]),
    (1, [2, 3, 4, 5]),               # head only
    (1.0, [2, 3, 4, 5]),
])
def test_head_tail_truncation_honours_the_boundary_fractions(head_fraction, kept):
    data = ClassificationData([np.arange(2, 12)], [1], max_len=4, truncation="head+tail", head_fraction=head_fraction)
    assert data.batch([0])["ids"].tolist() == [kept]


def test_classification_data_bad_input():
    docs = [np.arange(2, 12), np.array([5, 6])]
    with pytest.raises(ValueError, match="longer than max_len=6"):
        ClassificationData(docs, [1, 0], max_len=6, truncation="error")
    with pytest.raises(ValueError, match="empty batch"):
        ClassificationData(docs, [1, 0]).batch([])
    with pytest.raises(ValueError, match="label -1"):
        ClassificationData(docs, [1, -1])
    with pytest.raises(ValueError, match="negative token id"):
        ClassificationData([np.array([2, -1])], [1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ClassificationData(docs, [1, 0], vocab_size=8)
    with pytest.raises(ValueError, match="truncation must be one of"):
        ClassificationData(docs, [1, 0], truncation="tail")


def test_lm_stream_puts_bos_before_each_document():
    data = LMData([np.array([5, 6, 7]), np.array([8, -1])], seq_len=3, oov_id=1)
    b = data.batch([0, 1])
    assert b["ids"].tolist() == [[0, 5, 6], [7, 0, 8]]
    assert b["targets"].tolist() == [[5, 6, 7], [0, 8, -1]]          # the OOV target is ignored
    with pytest.raises(ValueError, match="negative token id"):
        LMData([np.array([5, -1])], seq_len=1)


def test_lm_batch_refuses_sequence_indices_out_of_range():
    data = LMData([np.arange(2, 20)], seq_len=4)                     # 19 tokens with bos: 4 sequences
    assert len(data) == 4 and data.batch([3])["targets"].tolist() == [[14, 15, 16, 17]]
    with pytest.raises(IndexError, match=r"sequence indices must be in \[0, 4\); got -1\.\.-1"):
        data.batch([-1])                 # wrapped: the stream's last tokens, the last target its first (bos)
    with pytest.raises(IndexError, match=r"sequence indices must be in \[0, 4\); got 0\.\.4"):
        data.batch([0, 4])


def test_lr_schedule_warms_up_then_decays():
    cfg = TrainConfig(lr=1.0, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    f = [lr_factor(s, 20, cfg) for s in range(20)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[4] == 1.0
    assert all(a >= b for a, b in zip(f[4:], f[5:])) and abs(f[-1] - 0.1) < 0.01
    assert lr_factor(10, 20, seed_train_config()) == 1.0


@pytest.mark.parametrize("schedule, want", [
    ("linear", [0.5, 1.0, 1.0, 0.82, 0.64, 0.46, 0.28, 0.1]),
    ("cosine", [0.5, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * k / 5)) for k in range(6)]),
    ("constant", [0.5] + [1.0] * 7),
])
def test_lr_schedule_used_by_the_optimizer_ends_at_the_floor(schedule, want):
    """The learning rate each optimizer step used: warm-up from lr/warmup_steps to lr, then the decay down
    to min_lr_ratio x lr at the last step (the decay counted one step too many: the last step's lr stayed
    above the floor, 0.28 instead of 0.1 here with the linear schedule)."""
    docs, y = toy_docs(64)
    used = []
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    try:
        Trainer(tiny_classifier(), ClassificationTask(ClassificationData(docs, y, max_len=16)),
                quiet(epochs=1, batch_size=8, lr=1.0, warmup_steps=2, schedule=schedule, min_lr_ratio=0.1)).fit()
    finally:
        hook.remove()
    assert used == pytest.approx(want)
    assert lr_factor(0, 1, quiet(min_lr_ratio=0.1)) == 1.0          # a one-step run trains at lr


def test_train_config_errors_name_the_value():
    with pytest.raises(ValueError, match="schedule must be one of"):
        TrainConfig(schedule="step").validate()
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1; got 0"):
        TrainConfig(batch_size=0).validate()
    want = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert pick_device().type == want and pick_device("cpu").type == "cpu"


def test_pick_device_refuses_a_cuda_index_beyond_the_visible_devices(monkeypatch):
    """cuda:N was not checked against device_count(): a bad index failed later, at the first tensor moved
    there, with CUDA's 'invalid device ordinal'."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda", 1) and pick_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"device='cuda:2' was requested but this machine has 2 CUDA devices; "
                                         r"allowed: 'cuda' or 'cuda:0' to 'cuda:1'"):
        pick_device("cuda:2")


@pytest.mark.parametrize("requested", ["cpu:0", "cuda:-1", "cuda:x", "gpu", "CPU", None, 0])
def test_pick_device_names_the_value_and_what_is_allowed(requested, monkeypatch):
    """torch's errors were 'Invalid device string', a list of every device type torch knows ('gpu') or a
    TypeError (None); 'cpu:0' was taken although TrainConfig refuses it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=re.escape(f"device={requested!r} is invalid; allowed: 'auto', 'cpu', "
                                                   f"'cuda', 'cuda:N' or 'mps'")):
        pick_device(requested)


def test_pick_device_says_what_is_allowed_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda:0' was requested but CUDA is not available; allowed here: "
                                         r"'auto', 'cpu'$"):
        pick_device("cuda:0")
    with pytest.raises(ValueError, match=r"device='mps' was requested but MPS is not available .*allowed here: "
                                         r"'auto', 'cpu'$"):
        pick_device("mps")
    assert pick_device(torch.device("cpu")) == torch.device("cpu")


# -- training ---------------------------------------------------------------------------------------

def test_trainer_learns_and_writes_metrics(tmp_path):
    docs, y = toy_docs()
    seed_everything(0)
    model = tiny_classifier()
    task = ClassificationTask(ClassificationData(docs[:48], y[:48], max_len=16),
                              {"val": ClassificationData(docs[48:], y[48:], max_len=16)})
    out = Trainer(model, task, quiet(epochs=10, batch_size=8, lr=5e-3, warmup_steps=3, select_on="val/accuracy",
                                     save_best=True), out_dir=tmp_path).fit()
    assert out["history"][-1]["eval"]["val"]["accuracy"] >= 0.9
    assert out["history"][-1]["train_loss"] < out["history"][0]["train_loss"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, 11))
    assert metrics["best"]["epoch"] == out["best"]["epoch"]
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "best.pt").exists()
    assert not list(tmp_path.glob("*.part*"))                              # atomic writes leave nothing
    accs = [h["eval"]["val"]["accuracy"] for h in out["history"]]
    assert out["best"]["epoch"] == 1 + int(np.argmax(accs))                # the first epoch with the top accuracy
    again = load_model(tmp_path / "best.pt")
    assert isinstance(again, TransformerClassifier)
    got = task.evaluate(again, torch.device("cpu"))["val"]                  # best.pt holds that epoch's weights:
    want = out["history"][out["best"]["epoch"] - 1]["eval"]["val"]           # its loss pins the epoch even on ties
    assert got["accuracy"] == want["accuracy"] and got["loss"] == pytest.approx(want["loss"], rel=1e-6)


def _best_run(out_dir, callbacks=()):
    """6 epochs of 6 steps whose validation loss is lowest before the last."""
    docs, y = toy_docs()
    seed_everything(0)
    task = ClassificationTask(ClassificationData(docs[:48], y[:48], max_len=16),
                              {"val": ClassificationData(docs[48:], y[48:], max_len=16)})
    trainer = Trainer(tiny_classifier(), task, quiet(epochs=6, batch_size=8, lr=1e-2, warmup_steps=3,
                                                     select_on="val/loss", save_best=True), out_dir=out_dir,
                      callbacks=callbacks)
    return trainer, trainer.fit()


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_best_state_dict_holds_the_best_epoch_and_a_resume_takes_it_from_the_checkpoint_not_best_pt(tmp_path):
    """The weights of the best epoch are the Trainer's own (``best_state_dict``, also in checkpoint.pt),
    not read back from best.pt: another run training in the same out_dir (two compare runs of one
    config) writes best.pt at its own improvements. A run stopped after its best epoch and resumed
    restores them from its checkpoint, whatever best.pt holds by then."""
    trainer, out = _best_run(tmp_path / "a")
    best = trainer.best_state_dict
    losses = [h["eval"]["val"]["loss"] for h in out["history"]]
    assert out["best"]["epoch"] == 1 + int(np.argmin(losses)) < len(losses)     # (4 under torch 2.13, 3 under 2.4)
    assert all(v.device.type == "cpu" for v in best.values()) and not _same(best, trainer.model.state_dict())
    assert _same(best, load_model(tmp_path / "a" / "best.pt").state_dict())

    def stop(trainer, step, loss):              # in the epoch after the best one, past its checkpoint
        if step == 6 * out["best"]["epoch"] + 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _best_run(tmp_path / "b", [stop])
    save_model(tiny_classifier(), tmp_path / "b" / "best.pt")      # another run's weights in best.pt
    again, res = _best_run(tmp_path / "b")
    assert res["best"] == out["best"] and _history(tmp_path / "b") == _history(tmp_path / "a")
    assert _same(again.best_state_dict, best)
    assert Trainer(tiny_classifier(), again.task, quiet(epochs=1)).best_state_dict is None    # before fit()


def test_a_checkpoint_without_best_weights_resumes_with_best_pt_and_a_warning(tmp_path):
    """A checkpoint written before checkpoints held the best epoch's weights: a resume takes them from
    best.pt, saying that nothing ties that file to the run; with no best.pt, it says they are lost."""
    trainer, _ = _best_run(tmp_path)
    best = trainer.best_state_dict
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    del ckpt["best_model"]
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.warns(UserWarning, match=r"written before checkpoints held the best epoch's weights: they are "
                                         r"restored from .*best\.pt"):
        again, _ = _best_run(tmp_path)
    assert _same(again.best_state_dict, best)
    (tmp_path / "best.pt").unlink()
    with pytest.warns(UserWarning, match=r"holds no weights of its best epoch \(\d\) and there is no best\.pt"):
        lost, _ = _best_run(tmp_path)
    assert lost.best_state_dict is None


def test_predict_and_evaluate_run_without_dropout_and_restore_the_mode():
    cpu = torch.device("cpu")
    docs, y = toy_docs(32)
    seed_everything(0)
    model = TransformerClassifier(seed_classifier_config(vocab_size=V, d_model=16, d_ff=32, n_heads=2, head_hidden=8,
                                                         max_len=16, dropout=0.5, head_dropout=0.5))
    data = ClassificationData(docs, y, max_len=16)
    task = ClassificationTask(data, {"all": data})
    model.eval()
    want = task.predict(model, data, cpu)
    model.train()
    model.head[0].eval()                 # a mixed state must come back as it was
    modes = [m.training for m in model.modules()]
    got = [task.predict(model, data, cpu) for _ in range(2)]
    assert np.array_equal(got[0], want) and np.array_equal(got[1], want)     # no dropout noise
    assert task.evaluate(model, cpu) == task.evaluate(model, cpu)
    assert [m.training for m in model.modules()] == modes
    lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=16, dropout=0.5)).train()
    lm_task = LMTask(LMData(RaggedIds.from_sequences(docs), seq_len=16), {"all": LMData(RaggedIds.from_sequences(docs),
                                                                                         seq_len=16)})
    assert lm_task.evaluate(lm, cpu) == lm_task.evaluate(lm, cpu) and lm.training


def test_an_eval_set_without_a_target_reports_nan_not_a_perfect_score():
    # every target out of vocabulary: the mean over no token was total / max(0, 1) = 0, a loss of 0
    # and a perplexity of 1.0, the best score there is
    lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=16)).eval()
    oov = RaggedIds.from_sequences([np.full(40, -1)])
    task = LMTask(LMData(RaggedIds.from_sequences([np.arange(2, 40)]), seq_len=8),
                  {"oov": LMData(oov, seq_len=8, oov_id=1)})
    got = task.evaluate(lm, torch.device("cpu"))["oov"]
    assert got["n_tokens"] == 0 and math.isnan(got["loss"]) and math.isnan(got["perplexity"])


def test_checkpoint_from_another_config_is_refused(tmp_path):
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=8), out_dir=tmp_path).fit()
    other = TransformerClassifier(seed_classifier_config(vocab_size=V, d_model=32, d_ff=32, n_heads=2, max_len=16))
    with pytest.raises(CheckpointMismatchError, match=r"model.d_model: checkpoint 16, this run 32"):
        Trainer(other, task, quiet(epochs=1, batch_size=8), out_dir=tmp_path).fit()
    with pytest.raises(CheckpointMismatchError, match=r"train.lr: checkpoint 0.0003, this run 0.001"):
        Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=8, lr=1e-3), out_dir=tmp_path).fit()
    with pytest.raises(CheckpointMismatchError, match="d_model"):
        load_checkpoint(tmp_path / "checkpoint.pt", other)
    save_model(tiny_classifier(), tmp_path / "m.pt")
    with pytest.raises(CheckpointMismatchError, match="d_model"):
        load_model(tmp_path / "m.pt", other)


def test_resume_continues_a_finished_run_without_training(tmp_path):
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    first = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()
    second = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()
    assert second["summary"]["steps"] == first["summary"]["steps"] == 4
    assert [h["train_loss"] for h in second["history"]] == [h["train_loss"] for h in first["history"]]


def test_a_resume_in_another_precision_warns_and_metrics_record_each_segment(tmp_path):
    """precision="auto" is bf16 on CUDA and fp32 elsewhere, and the device is not in the fingerprint:
    a checkpoint trained on CUDA resumed on a CPU in fp32 without a word, and metrics.json named only
    the last process's precision. Now summary.segments records each part and a change warns."""
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))

    class Stop(Exception):
        pass

    def stop_at_step_3(tr, step, loss):      # the checkpoint of epoch 1 (step 2) is the last on disk
        if step == 3:
            raise Stop
    with pytest.raises(Stop):
        Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path, callbacks=[stop_at_step_3]).fit()
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["state"].get("segments") == [{"from_step": 0, "device": "cpu", "bf16": False, "world_size": 1}]
    ckpt["state"]["segments"] = [{"from_step": 0, "device": "cuda:0", "bf16": True, "world_size": 1}]
    torch.save(ckpt, tmp_path / "checkpoint.pt")          # as a CUDA process under precision="auto" writes it
    with pytest.warns(UserWarning, match=r"was trained bf16 on cuda:0 in 1 process up to step 2; it resumes fp32 on "
                                         r"cpu in 1 process \(precision='auto'\)"):
        out = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()
    want = [{"from_step": 0, "device": "cuda:0", "bf16": True, "world_size": 1},
            {"from_step": 2, "device": "cpu", "bf16": False, "world_size": 1}]
    assert out["summary"]["steps"] == 4 and out["summary"]["segments"] == want
    assert json.loads((tmp_path / "metrics.json").read_text())["summary"]["segments"] == want
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # the finished run again: nothing trained, no warning
        assert Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()["summary"][
            "segments"] == want

def test_checkpoint_frequency_is_runtime_only(tmp_path):
    """A run checkpointed under one checkpoint_every resumes under another, and so does a checkpoint
    written before checkpoint_every left the fingerprint; a setting that changes the result still refuses."""
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    first = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()
    again = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, checkpoint_every=1), out_dir=tmp_path).fit()
    assert again["summary"]["steps"] == first["summary"]["steps"] == 4 and again["summary"]["tokens"] == \
        first["summary"]["tokens"]
    # resumed: nothing was trained again, the measured throughput is the first run's
    assert again["summary"]["steady_tokens_per_s"] == first["summary"]["steady_tokens_per_s"] is not None
    assert again["summary"]["timing_from_an_earlier_process"] is True
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert "checkpoint_every" not in ckpt["fingerprint"]["train"]
    ckpt["fingerprint"]["train"]["checkpoint_every"] = 0               # as older checkpoints hold it
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    old = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, checkpoint_every=3), out_dir=tmp_path).fit()
    assert old["summary"]["steps"] == 4 and old["summary"]["steady_tokens_per_s"] == \
        first["summary"]["steady_tokens_per_s"]
    load_checkpoint(tmp_path / "checkpoint.pt", tiny_classifier(),
                    {"train": quiet(epochs=2, batch_size=8, checkpoint_every=5).fingerprint()} | {
                        "model": Trainer(tiny_classifier(), task, quiet()).fingerprint()["model"]})
    with pytest.raises(CheckpointMismatchError, match=r"train.max_steps: checkpoint None, this run 3"):
        Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, max_steps=3), out_dir=tmp_path).fit()


def test_checkpoint_of_the_earlier_lr_schedule_is_refused(tmp_path):
    """lr_factor once stopped one step above min_lr_ratio: a checkpoint written then (no lr_schedule
    in its fingerprint) would resume on another schedule, so it is refused, naming the version."""
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, max_steps=1), out_dir=tmp_path).fit()
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["fingerprint"]["train"]["lr_schedule"] == 2
    del ckpt["fingerprint"]["train"]["lr_schedule"]                     # as checkpoints of version 1 hold it
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointMismatchError, match=r"train.lr_schedule: checkpoint None, this run 2"):
        Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, max_steps=1), out_dir=tmp_path).fit()


KILL_SCRIPT = textwrap.dedent("""
    import signal, sys, numpy as np, torch
    torch.set_num_threads(1)
    from distattn.models import TransformerClassifier, seed_classifier_config
    from distattn.train import ClassificationData, ClassificationTask, Trainer, TrainConfig, seed_everything, save_model
    out, slow = sys.argv[1], sys.argv[2] == "slow"
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 30, rng.integers(3, 14)) for _ in range(48)]
    y = np.array([int((d < 15).mean() > 0.5) for d in docs])
    seed_everything(0)
    model = TransformerClassifier(seed_classifier_config(vocab_size=30, d_model=16, d_ff=32, n_heads=2, head_hidden=8,
                                                         max_len=16, dropout=0.1))
    task = ClassificationTask(ClassificationData(docs[:40], y[:40], max_len=16),
                              {"val": ClassificationData(docs[40:], y[40:], max_len=16)})

    def stop_at_step_7(tr, step, loss):     # callbacks run before a step's checkpoint: step 6's is the last on disk
        if step == 7:
            print("AT_STEP_7", flush=True)
            signal.pause()                  # wait here for the parent's SIGKILL
    cbs = [stop_at_step_7] if slow else []
    cfg = TrainConfig(epochs=3, batch_size=8, lr=3e-3, warmup_steps=2, checkpoint_every=2, device="cpu",
                      progress=False)
    Trainer(model, task, cfg, out_dir=out, callbacks=cbs).fit()
    save_model(model, out + "/final.pt")
    print("DONE", flush=True)
""")


def _run_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _history(path):
    h = json.loads((Path(path) / "metrics.json").read_text())["history"]
    return [{k: v for k, v in e.items() if not k.endswith("seconds")} for e in h]


def test_killed_run_resumes_to_the_same_result(tmp_path):
    script = tmp_path / "train_kill.py"
    script.write_text(KILL_SCRIPT)
    env = _run_env()
    a, b = tmp_path / "a", tmp_path / "b"
    subprocess.run([sys.executable, str(script), str(a), "fast"], env=env, check=True, timeout=120,
                   capture_output=True)

    proc = subprocess.Popen([sys.executable, str(script), str(b), "slow"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    reached = False
    watchdog = threading.Timer(120, proc.kill)                   # a stalled child fails the test, not hangs it
    watchdog.start()
    try:
        for line in proc.stdout:                                 # epoch logs, then the marker at step 7
            if line.strip() == b"AT_STEP_7":
                reached = True
                break
    finally:
        watchdog.cancel()
        proc.kill()                                              # SIGKILL, mid-training (or a child gone wrong)
        proc.wait(timeout=30)
    assert reached, proc.stderr.read().decode()[-2000:]
    assert proc.returncode == -signal.SIGKILL                    # killed, not finished
    assert not (b / "final.pt").exists()
    state = torch.load(b / "checkpoint.pt", weights_only=False)["state"]
    assert state["step"] == 6                                    # mid-epoch 2 of 3 (5 steps an epoch)

    subprocess.run([sys.executable, str(script), str(b), "fast"], env=env, check=True, timeout=120,
                   capture_output=True)
    wa, wb = torch.load(a / "final.pt")["model"], torch.load(b / "final.pt")["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _history(a) == _history(b)


DDP_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np, torch
    torch.set_num_threads(1)
    from distattn.models import TransformerLM, LMConfig
    from distattn.train import LMData, LMTask, Trainer, TrainConfig, seed_everything, setup_distributed
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 30, rng.integers(5, 20)) for _ in range(40)]
    seed_everything(0)
    model = TransformerLM(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, max_len=8))
    cfg = TrainConfig(epochs=2, batch_size=8, lr=3e-3, warmup_steps=2, device="cpu", progress=False)
    res = Trainer(model, LMTask(LMData(docs, seq_len=8)), cfg, out_dir=out + "/run").fit()
    rank, world, _ = setup_distributed()
    torch.save({"state": model.state_dict(), "world": world, "summary": res["summary"]}, f"{out}/rank{rank}.pt")
""")


def test_ddp_gloo_two_processes_match_one(tmp_path):
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    env = _run_env()
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    ddp.mkdir()
    single.mkdir()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), str(ddp)], env=env, timeout=180, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    env1 = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    subprocess.run([sys.executable, str(script), str(single)], env=env1, check=True, timeout=120, capture_output=True)
    r0, r1 = torch.load(ddp / "rank0.pt"), torch.load(ddp / "rank1.pt")
    one = torch.load(single / "rank0.pt")
    assert r0["world"] == r1["world"] == 2 and one["world"] == 1
    assert r0["summary"]["steps"] == one["summary"]["steps"] > 0
    for k in one["state"]:
        assert torch.equal(r0["state"][k], r1["state"][k]), k                       # ranks stay in sync
        assert torch.allclose(r0["state"][k], one["state"][k], atol=1e-5), k        # = one process, global batch
    assert not torch.allclose(one["state"]["trunk.blocks.0.attn.qkv.weight"],
                              TransformerLM(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2,
                                                     max_len=8)).state_dict()["trunk.blocks.0.attn.qkv.weight"])


# -- next-token evaluation with the shared metric ---------------------------------------------------

def tiny_trained_lm():
    torch.manual_seed(0)
    return TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8)).eval()


def test_scorer_matches_brute_force_windows():
    lm = tiny_trained_lm()
    rng = np.random.default_rng(1)
    docs = [rng.integers(2, V, n) for n in (1, 2, 5, 8, 9, 21)]
    ragged = RaggedIds.from_sequences(docs)
    logp, rank = NextTokenScorer(lm, stride=1, batch_size=4).score_next_tokens(ragged)
    for d, doc in enumerate(docs):
        x = np.concatenate([[0], doc])
        for p in range(1, len(doc)):
            a = max(0, p + 1 - 8)             # stride 1: every prediction sees a full window
            with torch.no_grad():
                row = lm(torch.tensor(x[a:p + 1])[None])[0, -1]
            t = ragged.offsets[d] + p - 1
            assert abs(torch.log_softmax(row, -1)[x[p + 1]].item() - logp[t]) < 1e-5
            assert rank[t] == int((row >= row[x[p + 1]]).sum()) - 1
        assert np.isnan(logp[ragged.offsets[d + 1] - 1])         # the last token predicts nothing


def test_evaluate_lm_uses_the_shared_metric_and_skips_unk_targets():
    from distattn.projection.nexttoken import NextTokenReport, evaluate_next_token
    lm = tiny_trained_lm()
    rng = np.random.default_rng(2)
    docs = [rng.integers(1, V, n) for n in (6, 12, 30)]
    rep = evaluate_lm(lm, docs, unk_id=1)
    assert isinstance(rep, NextTokenReport)
    n_unk_targets = sum(int((d[1:] == 1).sum()) for d in docs)
    assert rep.n_oov_targets == n_unk_targets and rep.n_predictions == sum(len(d) - 1 for d in docs) - n_unk_targets
    assert 1 < rep.perplexity < 10 * V and 0 <= rep.top1_accuracy <= rep.top10_accuracy <= 1

    class PerDocument:                   # the evaluator's generic path, through next_token_logits
        vocab_size = V

        def __init__(self, scorer):
            self.scorer = scorer

        def next_token_logits(self, ids):
            return self.scorer.next_token_logits(ids)

    slow = evaluate_next_token(PerDocument(NextTokenScorer(lm)), docs, vocab_size=V, unk_id=1)
    assert abs(slow.mean_nll - rep.mean_nll) < 1e-5 and slow.top_k_accuracy == rep.top_k_accuracy


def test_lm_trains_on_the_stream():
    rng = np.random.default_rng(3)
    docs = [np.roll(np.tile([5, 6, 7, 8], 6), rng.integers(4)) for _ in range(20)]
    seed_everything(0)
    lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8))
    res = Trainer(lm, LMTask(LMData(docs, seq_len=8), {"train": LMData(docs, seq_len=8)}),
                  quiet(epochs=12, batch_size=8, lr=1e-2, warmup_steps=2)).fit()
    assert res["history"][-1]["eval"]["train"]["perplexity"] < 2.0
    assert evaluate_lm(lm, docs[:3]).top1_accuracy > 0.9


def test_cpu_training_uses_the_fused_adamw_unless_told_not_to():
    """torch's default CPU AdamW rounds differently from process to process on several threads
    (benchmarks/probe_cpu_reproducibility.py: 3 weight hashes in 12 processes on 2 threads, 1 fused);
    the engine takes the fused kernel on the CPU as on CUDA, and ``fused=False`` gives the default back."""
    from distattn.train.engine import make_optimizer

    model = tiny_classifier()
    cpu = torch.device("cpu")
    assert make_optimizer(model, quiet(), cpu).defaults["fused"] is True
    assert not make_optimizer(model, quiet(fused=False), cpu).defaults["fused"]
    assert not make_optimizer(model, quiet(), torch.device("meta")).defaults["fused"]


def test_plans_and_scorers_refuse_values_that_once_misbehaved():
    """rank=-1 silently gave the last process's batches; world=0 divided by zero; stride=0 was
    replaced by the default; batch_size=-1 surfaced as 'the model produced NaN scores'."""
    from distattn.train import epoch_plan
    from distattn.train.lm_eval import NextTokenScorer
    from distattn.train.tasks import ClassificationTask
    for kwargs, message in [(dict(rank=-1, world=2), "rank must be an integer >= 0; got -1"),
                            (dict(rank=2, world=2), "rank=2 must be below world=2"),
                            (dict(world=0), "world must be an integer >= 1; got 0"),
                            (dict(seed=-1), "seed must be an integer >= 0; got -1"),
                            (dict(lengths=np.ones(3)), "lengths has 3 entries for n_items=8")]:
        with pytest.raises(ValueError, match=message):
            epoch_plan(8, 4, **kwargs)
    assert [b.tolist() for b in epoch_plan(8, 4, shuffle=False, rank=1, world=2)] == [[2, 3], [6, 7]]
    from distattn.models import LMConfig, TransformerLM
    lm = TransformerLM(LMConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8))
    for kwargs, message in [(dict(stride=0), "stride=0 is invalid; allowed: an integer >= 1"),
                            (dict(batch_size=-1), "batch_size=-1 is invalid"),
                            (dict(bos_id=99), r"bos_id=99 is invalid; allowed: a token id in \[0, vocab_size=20\)"),
                            (dict(oov_id=-2), "oov_id=-2 is invalid")]:
        with pytest.raises(ValueError, match=message):
            NextTokenScorer(lm, **kwargs)
    docs, y = toy_docs(8)
    with pytest.raises(ValueError, match="eval_batch_size=0 is invalid; allowed: an integer >= 1"):
        ClassificationTask(ClassificationData(docs, y, max_len=16), eval_batch_size=0)


def test_lm_scorer_takes_the_one_hot_limit_at_a_tiny_temperature():
    """NextTokenScorer divided the logits by the temperature before the log-sum-exp: at 1e-310 they
    overflowed to inf (NaN log p, 'the model produced NaN scores'), and below float32's smallest normal
    the division was by 0. The limit: log p 0 where the target is the argmax, about -gap/τ elsewhere."""
    from distattn.models import LMConfig, TransformerLM
    from distattn.train.lm_eval import NextTokenScorer
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8))
    docs = RaggedIds.from_sequences([np.array([2, 3, 4, 5, 6, 7]), np.array([9, 8, 7])])
    scorer = NextTokenScorer(lm, bos_id=0, oov_id=1)
    lp1, rk1 = scorer.score_next_tokens(docs, temperature=1.0)
    scored = ~np.isnan(lp1)
    assert scored.sum() == 5 + 2                                          # tokens after the first of each
    for tau in (1e-46, 1e-310):
        lp, rk = scorer.score_next_tokens(docs, temperature=tau)
        np.testing.assert_array_equal(rk, rk1)                               # the order does not depend on τ
        assert not np.isnan(lp[scored]).any()
        top = rk1[scored] == 0
        assert (lp[scored][top] == 0).all() and (lp[scored][~top] < -1e40).all()     # -1e45 at 1e-46, -inf at 1e-310


def test_data_refuses_special_ids_outside_the_vocabulary():
    docs = [np.array([2, 3, 4]), np.array([5, 6])]
    with pytest.raises(ValueError, match=r"head_fraction must be a number in \[0, 1\]"):
        ClassificationData(docs, [0, 1], max_len=4, truncation="head+tail", head_fraction=2)
    with pytest.raises(ValueError, match=r"pad_id=99 is invalid; allowed: a token id in \[0, vocab_size=10\)"):
        ClassificationData(docs, [0, 1], max_len=4, pad_id=99, vocab_size=10)
    with pytest.raises(ValueError, match="bos_id=-3 is invalid"):                # once blamed on the documents
        LMData(docs, seq_len=2, bos_id=-3)


@pytest.mark.parametrize("field, value, message", [
    ("betas", (0.9, 1.5), r"betas must be two numbers in \[0, 1\)"),
    ("eps", "x", r"eps must be a number in \(0, 1\)"),
    ("max_steps", True, "max_steps must be None or an integer >= 1"),
    ("select_on", 3, "select_on must look like 'set/metric'"),
])
def test_train_config_checks_the_optimizer_fields(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value}).validate()


def test_numpy_scalars_are_accepted_where_python_numbers_are():
    """The checks use numbers.Integral/Real: np.int64(8) is a fine batch size."""
    from distattn.analysis import pagerank
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import evaluate_lm
    from distattn.train.lm_eval import NextTokenScorer
    lm = TransformerLM(LMConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8))
    NextTokenScorer(lm, stride=np.int64(4), batch_size=np.int64(8), bos_id=np.int64(0), oov_id=np.int32(1))
    docs = [np.array([2, 3, 4, 5, 6])]
    assert evaluate_lm(lm, docs, unk_id=np.int64(1)).n_predictions == 4
    with pytest.raises(ValueError, match=r"unk_id=99 is invalid; allowed: a token id in \[0, vocab_size=20\)"):
        evaluate_lm(lm, docs, unk_id=99)
    with pytest.raises(ValueError, match="batch_size=None is invalid"):
        NextTokenScorer(lm, batch_size=None)
    np.testing.assert_allclose(pagerank(np.full((3, 3), 1 / 3), damping=np.float32(0.85)), 1 / 3)
    ClassificationData([np.array([2, 3])], [1], max_len=4, truncation="head+tail", head_fraction=np.float32(0.25))
    TrainConfig(betas=(np.float32(0.9), 0.95), eps=np.float64(1e-8)).validate()


def test_a_diverged_run_stops_before_saving_nan_weights(tmp_path):
    """lr=1e30 once trained on with a NaN loss, wrote NaN weights to checkpoint.pt and NaN losses to
    metrics.json, and resuming carried on from them."""
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16), {"val": ClassificationData(docs, y, max_len=16)})
    with pytest.raises(FloatingPointError, match=r"training loss became nan by step 2 \(epoch 1\).*lr \(now 1e\+30\)"):
        Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, lr=1e30, grad_clip=None),
                out_dir=tmp_path).fit()
    assert not (tmp_path / "checkpoint.pt").exists() and not (tmp_path / "metrics.json").exists()


def test_a_checkpoint_trained_on_other_labels_is_refused(tmp_path):
    """The data fingerprint once held the documents but not the labels: a shuffled-label control run
    into the same out_dir silently resumed (here: returned) the run trained on the true labels."""
    docs, y = toy_docs(16)
    Trainer(tiny_classifier(), ClassificationTask(ClassificationData(docs, y, max_len=16)),
            quiet(epochs=1, batch_size=8), out_dir=tmp_path).fit()
    flipped = ClassificationTask(ClassificationData(docs, 1 - y, max_len=16))
    with pytest.raises(CheckpointMismatchError, match=r"task\.train\.labels: checkpoint '[0-9a-f]{16}', this run"):
        Trainer(tiny_classifier(), flipped, quiet(epochs=1, batch_size=8), out_dir=tmp_path).fit()
    same = ClassificationTask(ClassificationData(docs, y.astype(bool), max_len=16))     # same labels, another dtype
    assert Trainer(tiny_classifier(), same, quiet(epochs=1, batch_size=8), out_dir=tmp_path).fit()["summary"]["steps"] == 2


def test_a_checkpoint_trained_on_other_tokens_is_refused(tmp_path):
    """The data fingerprint summed (a sample of) the ids: swapping two tokens, or moving a document
    boundary, kept the sum, and a run on the changed data silently resumed the old one."""
    docs, y = toy_docs(16)
    Trainer(tiny_classifier(), ClassificationTask(ClassificationData(docs, y, max_len=16)),
            quiet(epochs=1, batch_size=8), out_dir=tmp_path / "clf").fit()
    swapped = [d.copy() for d in docs]
    swapped[0][[0, 1]] = swapped[0][[1, 0]]
    assert swapped[0][0] != swapped[0][1]
    moved = [d.copy() for d in docs]
    moved[0], moved[1] = np.concatenate([docs[0], docs[1][:1]]), docs[1][1:]     # same ids, another boundary
    for other in (swapped, moved):
        with pytest.raises(CheckpointMismatchError, match=r"task\.train\.checksum"):
            Trainer(tiny_classifier(), ClassificationTask(ClassificationData(other, y, max_len=16)),
                    quiet(epochs=1, batch_size=8), out_dir=tmp_path / "clf").fit()
    same = [d.astype(np.int32) for d in docs]                      # the same data in another dtype resumes
    assert Trainer(tiny_classifier(), ClassificationTask(ClassificationData(same, y, max_len=16)),
                   quiet(epochs=1, batch_size=8), out_dir=tmp_path / "clf").fit()["summary"]["steps"] == 2

    lm = dict(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=8)
    Trainer(TransformerLM(LMConfig(**lm)), LMTask(LMData(RaggedIds.from_sequences(docs), seq_len=8)),
            quiet(epochs=1, batch_size=4), out_dir=tmp_path / "lm").fit()
    with pytest.raises(CheckpointMismatchError, match=r"task\.train\.checksum"):
        Trainer(TransformerLM(LMConfig(**lm)), LMTask(LMData(RaggedIds.from_sequences(swapped), seq_len=8)),
                quiet(epochs=1, batch_size=4), out_dir=tmp_path / "lm").fit()


def test_tf32_is_set_for_a_training_run_and_for_scoring_only(tmp_path):
    """Trainer.fit switched CUDA's TF32 on for the rest of the process, so an evaluation gave other
    figures after a training run than in a fresh process; now each sets it for itself."""
    from distattn.train import NextTokenScorer
    seen = []

    def record(module, args):
        seen.append(torch.backends.cuda.matmul.allow_tf32)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        docs, _ = toy_docs(16)
        lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=8))
        handle = lm.register_forward_pre_hook(record)
        Trainer(lm, LMTask(LMData(RaggedIds.from_sequences(docs), seq_len=8)),
                quiet(epochs=1, batch_size=4, tf32=True)).fit()
        assert seen and all(seen)                                   # on while training ...
        assert torch.backends.cuda.matmul.allow_tf32 is False       # ... and off again after it
        assert torch.backends.cudnn.allow_tf32 is False
        for precision, want in (("tf32", True), ("fp32", False), ("bf16", False)):
            seen.clear()
            NextTokenScorer(lm, precision=precision).score_next_tokens(RaggedIds.from_sequences(docs[:2]))
            assert seen and all(s is want for s in seen), precision
            assert torch.backends.cuda.matmul.allow_tf32 is False
        handle.remove()
        with pytest.raises(ValueError, match=r"precision must be one of 'tf32', 'fp32', 'bf16'; got 'fp16'"):
            NextTokenScorer(lm, precision="fp16")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_empty_or_capped_to_nothing_eval_sets_are_refused():
    """An empty eval set once scored accuracy=nan, loss=nan; max_eval_sequences=0 scored perplexity 1.0 on no
    tokens; LMData([]) had length -1 ('__len__() should return >= 0')."""
    docs, y = toy_docs(16)
    train = ClassificationData(docs, y, max_len=16)
    with pytest.raises(ValueError, match="eval set 'test' is empty"):
        ClassificationTask(train, {"test": ClassificationData([], [], max_len=16)})
    with pytest.raises(TypeError, match="eval set 'test' is a tuple"):
        ClassificationTask(train, {"test": (docs, y)})
    assert len(LMData([], seq_len=4)) == 0
    stream = LMData(docs, seq_len=4)
    with pytest.raises(ValueError, match="eval set 'val' is empty"):
        LMTask(stream, {"val": LMData([], seq_len=4)})
    for bad in (0, -5):
        with pytest.raises(ValueError, match=f"max_eval_sequences={bad} is invalid; allowed: an integer >= 1"):
            LMTask(stream, {"val": stream}, max_eval_sequences=bad)
    assert LMTask(stream, {"val": stream}, max_eval_sequences=None).max_eval_sequences is None


@pytest.mark.parametrize("field, value, message", [
    ("min_lr_ratio", "0.1", r"min_lr_ratio must be a number in \[0, 1\]; got '0.1'"),     # once TypeError '<='
    ("min_lr_ratio", None, r"min_lr_ratio must be a number in \[0, 1\]; got None"),
    ("lr", True, "lr must be a finite number > 0; got True"),                            # once lr=1.0
    ("weight_decay", float("inf"), "weight_decay must be a finite number >= 0; got inf"),
    ("resume", "no", "resume must be True or False; got 'no'"),                          # once truthy: resumed
    ("fused", "False", "fused must be True or False; got 'False'"),
    ("save_best", True, "save_best=True needs select_on"),                               # once no best.pt, silently
    ("device", "cuda:x", "device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'; got 'cuda:x'"),  # once at fit()
])
def test_train_config_checks_types_and_dependent_fields(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value}).validate()
    TrainConfig(lr=np.float32(1e-3), min_lr_ratio=np.float64(0.1), resume=np.bool_(False), device="cuda:1",
                save_best=True, select_on="val/accuracy").validate()


def test_a_warmup_longer_than_the_run_is_reported():
    """warmup_steps=100 on a 4-step run once trained silently at 1-4 % of lr (a recipe's warm-up on small data)."""
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    with pytest.warns(UserWarning, match=r"warmup_steps=100 is longer than this run's 4 steps: the learning rate "
                                         r"peaks at 0.04 x lr=0.0003"):
        Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, warmup_steps=100)).fit()


def test_an_lm_task_refuses_a_model_that_returns_no_loss():
    """Trainer(classifier, LMTask(...)) once trained: the classifier read the targets as its attention mask,
    and logits[1], one example's logit, was minimised as the 'loss' (train_loss went negative)."""
    docs, _ = toy_docs(16)
    task = LMTask(LMData(docs, seq_len=8), {"val": LMData(docs, seq_len=8)})
    with pytest.raises(TypeError, match=r"needs a language model .*TransformerClassifier returned Tensor\(2,\)"):
        Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=2)).fit()
    with pytest.raises(TypeError, match="TransformerClassifier returned Tensor"):
        task.evaluate(tiny_classifier(), torch.device("cpu"))


def test_resuming_an_lm_run_with_another_eval_cap_is_refused(tmp_path):
    """max_eval_sequences was not in the task fingerprint, so a resumed run could score its later
    epochs on another subset of the eval set than its earlier ones, in one history."""
    docs = [np.tile([5, 6, 7, 8], 6) for _ in range(12)]

    def run(cap):
        seed_everything(0)
        lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8))
        task = LMTask(LMData(docs, seq_len=8), {"val": LMData(docs, seq_len=8)}, max_eval_sequences=cap)
        return Trainer(lm, task, quiet(epochs=1, batch_size=8, warmup_steps=0), out_dir=tmp_path).fit()
    run(4)
    with pytest.raises(CheckpointMismatchError, match=r"task\.max_eval_sequences: checkpoint 4, this run 8"):
        run(8)
    assert run(4)["summary"]["steps"] > 0                     # the same cap still resumes (here: returns)


DDP_NAN_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np, torch
    torch.set_num_threads(1)
    from distattn.models import TransformerLM, LMConfig
    from distattn.train import LMData, LMTask, Trainer, TrainConfig, seed_everything, setup_distributed
    out = sys.argv[1]
    rank, world, _ = setup_distributed()

    class PoisonedOnRank1(LMTask):
        # the loss of rank 1's last step of epoch 1 is NaN: only that rank's running loss is non-finite
        calls = 0
        def loss(self, model, batch):
            PoisonedOnRank1.calls += 1
            value = super().loss(model, batch)
            return value * float("nan") if rank == 1 and PoisonedOnRank1.calls == LAST else value

    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 30, rng.integers(5, 20)) for _ in range(40)]
    seed_everything(0)
    task = PoisonedOnRank1(LMData(docs, seq_len=8))
    LAST = len(task.plan(8, 0, 0, rank, world))
    model = TransformerLM(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, max_len=8))
    cfg = TrainConfig(epochs=2, batch_size=8, lr=3e-3, warmup_steps=2, device="cpu", progress=False)
    try:
        Trainer(model, task, cfg, out_dir=out + "/run").fit()
    except FloatingPointError as exc:
        open(f"{out}/rank{rank}.err", "w").write(str(exc))
        raise
""")


def test_ddp_ranks_stop_together_when_one_rank_diverges(tmp_path):
    """Each rank checks its own running loss: when one rank's last step before a flush was NaN, the
    other rank once went on and saved checkpoint.pt (NaN weights: the all-reduce had spread them) and
    metrics.json."""
    script = tmp_path / "nan_ddp.py"
    script.write_text(DDP_NAN_SCRIPT)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), str(tmp_path)], env=_run_env(), timeout=180, capture_output=True, text=True)
    assert r.returncode != 0
    assert (tmp_path / "rank1.err").read_text().startswith("the training loss became nan by step")
    assert (tmp_path / "rank0.err").read_text().startswith("the training loss became non-finite on another rank")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()           # nothing saved after the NaN step
    assert not (tmp_path / "run" / "metrics.json").exists()


DDP_LOSS_SCRIPT = textwrap.dedent("""
    import sys, json, numpy as np, torch
    torch.set_num_threads(1)
    from distattn.models import TransformerClassifier, seed_classifier_config
    from distattn.train import ClassificationData, ClassificationTask, Trainer, TrainConfig, seed_everything
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 30, rng.integers(3, 14)) for _ in range(32)]
    y = np.array([int((d < 15).mean() > 0.5) for d in docs])
    seed_everything(0)
    model = TransformerClassifier(seed_classifier_config(vocab_size=30, d_model=16, d_ff=32, n_heads=2, head_hidden=8,
                                                         max_len=16, dropout=0.0, head_dropout=0.0))
    cfg = TrainConfig(epochs=2, batch_size=8, lr=3e-3, checkpoint_every=3, device="cpu", progress=False, quiet=True)
    Trainer(model, ClassificationTask(ClassificationData(docs, y, max_len=16)), cfg, out_dir=out).fit()
""")


def test_ddp_train_loss_is_the_mean_over_all_ranks(tmp_path):
    """metrics.json's train_loss under DDP once held rank 0's half of each global batch only."""
    script = tmp_path / "loss_ddp.py"
    script.write_text(DDP_LOSS_SCRIPT)
    env = _run_env()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), str(tmp_path / "ddp")], env=env, timeout=180, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    env1 = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    subprocess.run([sys.executable, str(script), str(tmp_path / "one")], env=env1, check=True, timeout=120,
                   capture_output=True)
    ddp, one = _history(tmp_path / "ddp"), _history(tmp_path / "one")
    assert len(ddp) == len(one) == 2
    for a, b in zip(ddp, one):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)


def test_a_cpu_run_under_torchrun_on_a_gpu_host_joins_over_gloo(monkeypatch):
    """device='cpu' under torchrun on a machine with CUDA once joined an nccl group, which carries no CPU
    tensors: DDP's first broadcast failed ("No backend type associated with device type cpu")."""
    import torch.distributed as dist

    class Joined(Exception):
        pass

    def init_process_group(backend=None, **kw):
        raise Joined(backend)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    with pytest.raises(Joined) as joined:
        Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=8)).fit()
    assert joined.value.args == ("gloo",)


def test_numpy_integers_are_accepted_by_train_config_and_classification_data(tmp_path):
    """max_len=lengths.max() or batch_size=np.int64(8) were refused as 'must be an integer >= 1'."""
    docs, y = toy_docs(16)
    lengths = np.array([len(d) for d in docs])
    data = ClassificationData(docs, y, max_len=lengths.max(), pad_multiple=np.int64(2))
    assert data.max_len == lengths.max() and type(data.max_len) is int
    cfg = quiet(epochs=np.int64(2), batch_size=np.int64(8), warmup_steps=np.int64(1), max_steps=np.int64(3),
                log_every=np.int32(5), seed=np.int64(0))
    out = Trainer(tiny_classifier(), ClassificationTask(data), cfg, out_dir=tmp_path).fit()
    assert out["summary"]["steps"] == 3
    saved = json.loads((tmp_path / "metrics.json").read_text())["train_config"]
    assert saved["batch_size"] == 8 and saved["max_steps"] == 3


def test_numpy_floats_in_train_config_reach_metrics_json(tmp_path):
    """lr=np.float32(...) passed validate(), trained an epoch, then failed writing metrics.json
    ('Object of type float32 is not JSON serializable'), and again at each resume."""
    docs, y = toy_docs(16)
    f = np.float32
    cfg = quiet(epochs=1, batch_size=8, lr=f(1e-3), weight_decay=f(0.01), eps=f(1e-8), betas=(f(0.9), f(0.95)),
                min_lr_ratio=f(0.1), grad_clip=f(1.0), tf32=np.True_)
    Trainer(tiny_classifier(), ClassificationTask(ClassificationData(docs, y, max_len=16)), cfg, out_dir=tmp_path).fit()
    saved = json.loads((tmp_path / "metrics.json").read_text())["train_config"]
    assert saved["lr"] == pytest.approx(1e-3) and saved["betas"] == pytest.approx([0.9, 0.95])


def test_a_model_file_in_place_of_the_checkpoint_is_refused_by_name(tmp_path):
    """A save_model file named checkpoint.pt (same format number, no fingerprint) failed with KeyError: 'fingerprint'."""
    docs, y = toy_docs(16)
    save_model(tiny_classifier(), tmp_path / "checkpoint.pt")
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    with pytest.raises(CheckpointMismatchError, match="is not a distattn training checkpoint"):
        Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=8), out_dir=tmp_path).fit()


@pytest.mark.parametrize("eval_set, select_on, message", [
    # no 'val' set: refused only after the first epoch had trained (and that epoch was not saved)
    ("test", "val/accuracy", r"select_on='val/accuracy': the task has no evaluation set 'val'; its eval_sets are \['test'\]"),
    # a typo of 'val/accuracy': refused only after the first epoch had trained
    ("val", "val/acc", r"select_on='val/acc': the task's evaluation gives no metric 'acc'; "
                       r"it gives \['accuracy', 'loss', 'n'\]"),
])
def test_a_select_on_the_task_cannot_give_is_refused_before_training(tmp_path, eval_set, select_on, message):
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16),
                              eval_sets={eval_set: ClassificationData(docs, y, max_len=16)})
    steps = []
    trainer = Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=8, select_on=select_on),
                      out_dir=tmp_path, callbacks=[lambda tr, step, loss: steps.append(step)])
    with pytest.raises(ValueError, match=message):
        trainer.fit()
    assert steps == [] and not (tmp_path / "checkpoint.pt").exists()


def test_declared_eval_metrics_are_the_ones_evaluate_gives():
    """The names a task declares up front (eval_metrics, checked against select_on before training) are
    exactly the keys its evaluate returns for each set."""
    docs, y = toy_docs(16)
    data = ClassificationData(docs, y, max_len=16)
    task = ClassificationTask(data, eval_sets={"val": data})
    out = task.evaluate(tiny_classifier(), torch.device("cpu"))
    assert sorted(out["val"]) == sorted(task.eval_metrics)
    lm_docs = RaggedIds.from_sequences([np.arange(2, 20)] * 4)
    lm_task = LMTask(LMData(lm_docs, seq_len=8), {"val": LMData(lm_docs, seq_len=8)})
    lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8))
    assert sorted(lm_task.evaluate(lm, torch.device("cpu"))["val"]) == sorted(lm_task.eval_metrics)


def test_a_task_without_declared_metrics_still_trains_and_is_checked_after_evaluation(tmp_path):
    """eval_metrics is optional: a duck-typed task without it trains, and a bad select_on metric is
    refused once the evaluation shows what it gives."""
    docs, y = toy_docs(16)
    inner = ClassificationTask(ClassificationData(docs, y, max_len=16),
                               eval_sets={"val": ClassificationData(docs, y, max_len=16)})

    class Plain:                          # the protocol only: no eval_metrics
        eval_sets = inner.eval_sets
        plan, make_batch, loss = inner.plan, inner.make_batch, inner.loss
        evaluate, fingerprint = inner.evaluate, inner.fingerprint

    out = Trainer(tiny_classifier(), Plain(), quiet(epochs=1, batch_size=8, select_on="val/loss")).fit()
    assert out["best"]["epoch"] == 1
    with pytest.raises(ValueError, match=r"select_on='val/acc': the evaluation has no such entry"):
        Trainer(tiny_classifier(), Plain(), quiet(epochs=1, batch_size=8, select_on="val/acc")).fit()


def test_ddp_token_count_is_the_real_count_summed_over_ranks(tmp_path):
    """Under DDP summary.tokens was rank 0's real tokens times the world size: with padded classification
    batches of unequal real length on the two ranks it was not the count one process reports."""
    script = tmp_path / "tokens_ddp.py"
    script.write_text(DDP_LOSS_SCRIPT.replace("default_rng(0)", "default_rng(2)"))     # ranks: 263 and 249 tokens
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), str(tmp_path / "ddp")], env=_run_env(), timeout=180, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    ddp = json.loads((tmp_path / "ddp" / "metrics.json").read_text())["summary"]
    ckpt = torch.load(tmp_path / "ddp" / "checkpoint.pt", weights_only=False)["state"]
    # the documents the two epochs trained on, each real (unpadded) token once: 4 batches of 8 an epoch
    rng = np.random.default_rng(2)
    lengths = np.minimum([len(rng.integers(2, 30, rng.integers(3, 14))) for _ in range(32)], 16)
    want = int(sum(lengths[b].sum() for e in range(2) for b in epoch_plan(32, 8, epoch=e, seed=0)))
    assert ddp["world_size"] == 2
    assert ddp["tokens"] == ckpt["tokens"] == want


class _EpochLengthTask(ClassificationTask):
    """A custom task whose epochs differ in length: epoch e trains on the first sizes[e] documents."""

    def __init__(self, data, sizes):
        super().__init__(data)
        self.sizes = sizes

    def plan(self, batch_size, epoch, seed, rank=0, world=1):
        n = self.sizes[min(epoch, len(self.sizes) - 1)]
        return epoch_plan(n, batch_size, epoch=epoch, seed=seed, rank=rank, world=world)


@pytest.mark.parametrize("sizes", [(32, 16), (16, 32)])
def test_epochs_of_different_lengths_train_the_epochs_asked_for(sizes):
    """The step budget was epochs x the first epoch's length: with a shorter second epoch a third one was
    trained (and recorded), with a longer one the second stopped half-way yet was recorded as done; the
    schedule's end was wrong either way."""
    docs, labels = toy_docs(32)
    task = _EpochLengthTask(ClassificationData(docs, labels), sizes)
    out = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8, warmup_steps=1, schedule="linear",
                                                 min_lr_ratio=0.5)).fit()
    steps = [sizes[0] // 8, (sizes[0] + sizes[1]) // 8]
    assert [h["epoch"] for h in out["history"]] == [1, 2]
    assert [h["step"] for h in out["history"]] == steps and out["summary"]["steps"] == steps[1]
    assert out["history"][0]["lr"] == pytest.approx(3e-4 * (1 - 0.5 * (steps[0] - 2) / (steps[1] - 2)))
    assert out["history"][-1]["lr"] == pytest.approx(3e-4 * 0.5)           # the last step is at the floor


def test_many_epochs_under_a_small_max_steps_plan_only_the_epochs_that_run():
    """Every epoch's length is planned up front, but only until max_steps is covered: epochs=10_000 with
    max_steps=3 planned 10,000 epochs before the first step."""
    docs, labels = toy_docs(32)
    calls = []

    class Counting(ClassificationTask):
        def plan(self, batch_size, epoch, seed, rank=0, world=1):
            calls.append(epoch)
            return super().plan(batch_size, epoch, seed, rank, world)

    out = Trainer(tiny_classifier(), Counting(ClassificationData(docs, labels)),
                  quiet(epochs=10_000, batch_size=16, max_steps=3, warmup_steps=1)).fit()
    assert out["summary"]["steps"] == 3
    assert max(calls) == 1 and len(calls) <= 4         # epochs 0 and 1 planned, then trained


def test_a_fresh_run_without_save_best_leaves_no_earlier_best_pt(tmp_path):
    """resume=False started over in out_dir, but a best.pt of the earlier run stayed when the new run kept none:
    beside the new metrics.json (whose "best" is this run's epoch) it held the other run's weights."""
    docs, y = toy_docs()
    task = ClassificationTask(ClassificationData(docs[:48], y[:48], max_len=16),
                              {"val": ClassificationData(docs[48:], y[48:], max_len=16)})
    seed_everything(0)
    Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=16, select_on="val/accuracy", save_best=True),
            out_dir=tmp_path).fit()
    assert (tmp_path / "best.pt").exists()
    seed_everything(1)
    out = Trainer(tiny_classifier(), task, quiet(epochs=1, batch_size=16, lr=1e-3, select_on="val/accuracy",
                                                 resume=False), out_dir=tmp_path).fit()
    assert json.loads((tmp_path / "metrics.json").read_text())["best"]["epoch"] == out["best"]["epoch"] == 1
    assert not (tmp_path / "best.pt").exists()


def test_load_model_names_a_file_with_weights_but_no_model_config(tmp_path):
    """A file holding "model" weights but neither model_config nor a training fingerprint failed with
    AttributeError ('NoneType' object has no attribute 'items') when a model was given, TypeError
    about a 'NoneType' config without one."""
    torch.save({"model": tiny_classifier().state_dict()}, tmp_path / "weights.pt")
    for model in (tiny_classifier(), None):
        with pytest.raises(ValueError, match="weights.pt holds weights but no model config"):
            load_model(tmp_path / "weights.pt", model)


def test_load_checkpoint_checks_the_model_config_whatever_else_it_is_asked_to_check(tmp_path):
    """expected_fingerprint={"train": ...} compared the training settings only: a checkpoint of a model with
    other n_heads (same parameter shapes) was loaded into this one without a word, as plain
    load_state_dict does."""
    docs, y = toy_docs(16)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    cfg = quiet(epochs=1, batch_size=8)
    Trainer(tiny_classifier(), task, cfg, out_dir=tmp_path).fit()
    other = TransformerClassifier(seed_classifier_config(vocab_size=V, d_model=16, d_ff=32, n_heads=4, head_hidden=8,
                                                         max_len=16, init="gpt2"))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointMismatchError, match=r"model.n_heads: checkpoint 2, this run 4"):
        load_checkpoint(tmp_path / "checkpoint.pt", other, expected_fingerprint={"train": cfg.fingerprint()})
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())
    load_checkpoint(tmp_path / "checkpoint.pt", tiny_classifier(), expected_fingerprint={"train": cfg.fingerprint()})


@pytest.mark.parametrize("select_on", ["val/loss", "val/accuracy"])
def test_a_nan_selected_metric_does_not_stay_the_best_epoch(tmp_path, select_on):
    """NaN compares False with everything: an epoch-1 value of NaN stayed "best" (and best.pt its weights)
    whatever the later epochs scored."""
    docs, y = toy_docs(32)

    class NaNFirst(ClassificationTask):
        calls = 0

        def evaluate(self, model, device, autocast=None):
            NaNFirst.calls += 1
            out = super().evaluate(model, device)
            if NaNFirst.calls == 1:
                out["val"] = {k: float("nan") for k in out["val"]}
            return out

    task = NaNFirst(ClassificationData(docs, y, max_len=16), {"val": ClassificationData(docs, y, max_len=16)})
    out = Trainer(tiny_classifier(), task, quiet(epochs=3, batch_size=16, select_on=select_on, save_best=True),
                  out_dir=tmp_path).fit()
    values = [h["eval"]["val"][select_on.split("/")[1]] for h in out["history"]]
    assert np.isnan(values[0]) and np.isfinite(values[1:]).all()
    pick = min if select_on == "val/loss" else max
    assert out["best"]["epoch"] == 2 + values[1:].index(pick(values[1:]))
    assert out["best"]["value"] == pick(values[1:])


def test_an_eval_batch_without_a_target_leaves_the_lm_loss_finite():
    """A model whose loss is torch's mean cross-entropy (NaN over no target) made an eval batch whose targets
    were all ignored (OOV) turn the set's loss into NaN (float(loss) * 0); such a batch is skipped now."""
    import torch.nn.functional as F
    from distattn.models import MaskedLM, MaskedLMConfig
    from distattn.train import MaskedLMData, MaskedLMTask

    class TorchMeanLM(TransformerLM):
        def forward(self, ids, targets=None, capture=False):
            logits = super().forward(ids)
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    class TorchMeanMLM(MaskedLM):
        def forward(self, ids, positions=None, targets=None, capture=False):
            logits, _ = super().forward(ids, positions, targets)
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    rng = np.random.default_rng(0)
    docs = [np.full(20, -1), rng.integers(2, V, 40)]           # the first sequences' targets: all OOV
    data = LMData(RaggedIds.from_sequences(docs), seq_len=8, oov_id=1)
    assert (data.batch([0])["targets"] < 0).all()
    torch.manual_seed(0)
    lm = TorchMeanLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8))
    got = LMTask(data, {"val": data}, eval_batch_size=1).evaluate(lm, torch.device("cpu"))["val"]
    assert np.isfinite(got["loss"]) and got["n_tokens"] == int((data.targets_stream[1:8 * len(data) + 1] >= 0).sum())
    mdata = MaskedLMData(RaggedIds.from_sequences(docs), seq_len=8, mask_id=V, oov_id=1)
    assert (mdata.batch([0])["targets"] < 0).all()
    mlm = TorchMeanMLM(MaskedLMConfig(vocab_size=V + 1, d_model=16, n_heads=2, n_layers=1, max_len=8))
    got = MaskedLMTask(mdata, {"val": mdata}, eval_batch_size=1).evaluate(mlm, torch.device("cpu"))["val"]
    assert np.isfinite(got["loss"]) and got["n_tokens"] > 0


def test_rerunning_a_finished_run_keeps_its_measured_throughput(tmp_path):
    """A finished run resumed (nothing left to train) rewrote metrics.json with steady_tokens_per_s None and
    this process's near-zero wall time: the throughput the real run measured was lost. The earlier
    figures stay, labelled as an earlier process's."""
    docs, y = toy_docs(32)
    task = ClassificationTask(ClassificationData(docs, y, max_len=16))
    first = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()["summary"]
    assert first["steady_tokens_per_s"] is not None and "timing_from_an_earlier_process" not in first
    for _ in range(2):                                          # and again: the figures are carried on
        again = Trainer(tiny_classifier(), task, quiet(epochs=2, batch_size=8), out_dir=tmp_path).fit()["summary"]
        written = json.loads((tmp_path / "metrics.json").read_text())["summary"]
        assert again == written
        assert again["timing_from_an_earlier_process"] is True
        assert {k: v for k, v in again.items() if k != "timing_from_an_earlier_process"} == first


DDP_UNEVEN_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, torch
    torch.set_num_threads(1)
    from distattn.models import TransformerLM, LMConfig
    from distattn.train import LMData, LMTask, Trainer, TrainConfig, seed_everything, setup_distributed
    out = sys.argv[1]
    rank, world, _ = setup_distributed("cpu")

    class Uneven(LMTask):                  # rank 1 plans one batch fewer in the second epoch
        def plan(self, batch_size, epoch, seed, rank=0, world=1):
            p = super().plan(batch_size, epoch, seed, rank, world)
            return p[:-1] if rank == 1 and epoch == 1 else p

    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 30, rng.integers(5, 20)) for _ in range(40)]
    seed_everything(0)
    model = TransformerLM(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, max_len=8))
    cfg = TrainConfig(epochs=2, batch_size=8, lr=3e-3, device="cpu", progress=False, quiet=True)
    try:
        Trainer(model, Uneven(LMData(docs, seq_len=8)), cfg, out_dir=out + "/run").fit()
    except ValueError as exc:
        open(f"{out}/rank{rank}.err", "w").write(str(exc))
        raise
""")


def test_ddp_ranks_whose_plans_differ_in_length_are_refused_before_training(tmp_path):
    """A custom task giving one rank fewer batches than another mismatched the processes' collectives
    (gloo aborted mid-run: "Received data size doesn't match expected size"; nccl can hang); the
    planned step counts are compared once before training and refused on every rank, naming them."""
    script = tmp_path / "uneven_ddp.py"
    script.write_text(DDP_UNEVEN_SCRIPT)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), str(tmp_path)], env=_run_env(), timeout=180, capture_output=True, text=True)
    assert r.returncode != 0
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.err").read_text().startswith(
            "the ranks plan different numbers of steps: rank 0 16, rank 1 15 in all; rank 0 8, rank 1 7 in epoch 2.")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()            # refused before the first step


def test_save_and_load_model_see_through_a_ddp_wrapper(tmp_path):
    """save_model unwrapped a DistributedDataParallel model for its weights but not for its config: the file
    held {"class": "DistributedDataParallel"}, so load_model(path) could not build the model, and loading
    into a wrapped model was refused as another configuration."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8))
        wrapped = torch.nn.parallel.DistributedDataParallel(lm)
        save_model(wrapped, tmp_path / "m.pt")
        assert torch.load(tmp_path / "m.pt", weights_only=False)["model_config"] == lm.config.to_dict()
        back = load_model(tmp_path / "m.pt")
        assert isinstance(back, TransformerLM) and torch.equal(back.lm_head.weight, lm.lm_head.weight)
        other = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=8))
        load_model(tmp_path / "m.pt", torch.nn.parallel.DistributedDataParallel(other))
        assert torch.equal(other.lm_head.weight, lm.lm_head.weight)
    finally:
        dist.destroy_process_group()


def test_a_subclass_that_adds_a_metric_may_select_on_it(tmp_path):
    """A ClassificationTask subclass whose evaluate adds a metric inherits eval_metrics, which does not
    list it: select_on on the new metric must train (checked after evaluation), not be refused up front."""
    docs, y = toy_docs(16)

    class WithMargin(ClassificationTask):
        def evaluate(self, model, device, autocast=contextlib.nullcontext):
            out = super().evaluate(model, device, autocast)
            return {name: {**m, "margin": 1.0 - m["loss"]} for name, m in out.items()}

    data = ClassificationData(docs, y, max_len=16)
    out = Trainer(tiny_classifier(), WithMargin(data, eval_sets={"val": data}),
                  quiet(epochs=1, batch_size=8, select_on="val/margin")).fit()
    assert out["best"]["epoch"] == 1
