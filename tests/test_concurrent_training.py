"""Two processes training the same model into the same directory at the same time: the Trainer's
``out_dir`` and the compare's models-stage cache entry (two ``python -m distattn.compare`` runs of
one config). Neither may crash (a checkpoint replaced while the other reads it), both must end with
the results of one uninterrupted run, and the directory must be left loadable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from distattn.train import load_model

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import numpy as np, torch
    torch.set_num_threads(1)
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import LMData, LMTask, Trainer, TrainConfig, save_model, seed_everything
    mode, out, result, go, wait = sys.argv[1:6]
    while not os.path.exists(go):            # started together: each waits for the same signal
        time.sleep(0.005)
    # "checkpoint": start once the other process has written its first checkpoint, so that this one
    # resumes from it while the other goes on replacing it
    while wait == "checkpoint" and not any(Path(out).glob("**/checkpoint.pt")):
        time.sleep(0.005)
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 30, rng.integers(5, 20)) for _ in range(24)]
    seed_everything(0)
    model = TransformerLM(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, max_len=8))
    task = LMTask(LMData(docs, seq_len=8), {"val": LMData(docs[:8], seq_len=8)})
    cfg = TrainConfig(epochs=3, batch_size=4, lr=3e-3, warmup_steps=2, device="cpu", progress=False, quiet=True,
                      checkpoint_every=1, select_on="val/loss", save_best=True)
    if len(sys.argv) > 6:                    # pause after step 2 (its checkpoint.pt written) until told to go on
        import distattn.train
        pause = Path(sys.argv[6])

        class Pausing(distattn.train.Trainer):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.callbacks.append(self.pause)

            @staticmethod
            def pause(trainer, step, loss):
                if step == 2:
                    (pause / "paused").touch()
                    while not (pause / "resume").exists():
                        time.sleep(0.005)
        distattn.train.Trainer = Pausing
    if mode == "trainer":
        res = Trainer(model, task, cfg, out_dir=out).fit()
        history = res["history"]
    else:
        os.environ["DISTATTN_CACHE_DIR"] = out
        from distattn.compare.stages import _train
        # "compare-nocache": --no-cache, training in a directory of its own, then storing into the entry
        trained = _train("lm", model, task, cfg, {"test": "concurrent"}, cache=mode == "compare")
        history, model = trained.metrics["history"], trained.model
    save_model(model, result + ".pt")
    with open(result + ".json", "w") as fh:
        json.dump([{k: v for k, v in e.items() if not k.endswith("seconds")} for e in history], fh)
""")


def _run(tmp_path, mode, second):
    """One run alone in ``alone``, and two in ``shared``: ``a``, and ``b`` started with it or at
    ``a``'s first checkpoint. Returns each one's (weights, history)."""
    script = tmp_path / "train_concurrent.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    go = tmp_path / "go"
    runs = [("single", "alone", "go"), ("a", "shared", "go"), ("b", "shared", second)]
    procs = [subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / out), str(tmp_path / name), str(go),
                               wait], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, out, wait in runs]
    go.touch()
    try:
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            p.kill()
    results = [(torch.load(tmp_path / f"{n}.pt")["model"], json.loads((tmp_path / f"{n}.json").read_text()))
               for n, _, _ in runs]
    single = results[0]
    for weights, history in results[1:]:
        assert weights.keys() == single[0].keys() and all(torch.equal(weights[k], single[0][k]) for k in weights)
        assert history == single[1] and len(history) == 3


def test_two_trainers_in_one_out_dir_neither_crashes_and_both_match_one_run(tmp_path):
    _run(tmp_path, "trainer", "checkpoint")
    alone, shared = tmp_path / "alone", tmp_path / "shared"
    steps = json.loads((alone / "metrics.json").read_text())["summary"]["steps"]
    assert json.loads((shared / "metrics.json").read_text())["summary"]["steps"] == steps > 0
    for name in ("checkpoint.pt", "best.pt"):
        ours, theirs = load_model(shared / name).state_dict(), load_model(alone / name).state_dict()
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert not [p.name for p in shared.iterdir() if p.name.endswith(".part")]


@pytest.mark.parametrize("second", ["go", "checkpoint"])
def test_two_compare_runs_training_one_cache_entry_neither_crashes_and_both_match_one_run(tmp_path, second):
    _run(tmp_path, "compare", second)
    (alone,) = (tmp_path / "alone" / "compare").iterdir()
    (entry,) = (tmp_path / "shared" / "compare").iterdir()
    assert entry.name == alone.name
    steps = json.loads((alone / "done.json").read_text())["summary"]["steps"]
    assert json.loads((entry / "done.json").read_text())["summary"]["steps"] == steps > 0
    ours, theirs = load_model(entry / "model.pt").state_dict(), load_model(alone / "model.pt").state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert not [p.name for p in entry.iterdir() if p.name.endswith(".part")]


def test_compare_runs_with_and_without_no_cache_on_one_entry_none_crashes_and_all_match_one_run(tmp_path):
    """Three processes on one models-stage entry: a cached run paused mid-training in the entry, and
    meanwhile a --no-cache run (training in a directory of its own, then storing model.pt and done.json
    into the entry) and another cached run started together; then the first goes on, finds the entry
    finished and uses the model stored there (a finished entry is never replaced). None may crash,
    each must end with the weights and history of one uninterrupted run, and the entry must be whole
    (its weights the ones done.json records), with nothing left beside it."""
    from distattn.compare.stages import _weights_sha256
    script = tmp_path / "train_concurrent.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    go, pause = tmp_path / "go", tmp_path / "pause"
    go.touch()
    pause.mkdir()

    def start(mode, out, name, *extra):
        return subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / out), str(tmp_path / name),
                                 str(go), "go", *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def finish(p):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]

    procs = [start("compare", "alone", "single"), start("compare", "shared", "paused", str(pause))]
    try:
        finish(procs[0])
        deadline = time.monotonic() + 300
        while not (pause / "paused").exists():
            assert procs[1].poll() is None and time.monotonic() < deadline, procs[1].communicate()[1][-3000:]
            time.sleep(0.01)
        procs += [start("compare-nocache", "shared", "nocache"), start("compare", "shared", "cached")]
        for p in procs[2:]:
            finish(p)
        (entry,) = (tmp_path / "shared" / "compare").iterdir()     # the --no-cache run's own directory is gone
        assert procs[1].poll() is None and (entry / "done.json").exists() and (entry / "checkpoint.pt").exists()
        (pause / "resume").touch()
        finish(procs[1])
    finally:
        for p in procs:
            p.kill()
    results = {n: (torch.load(tmp_path / f"{n}.pt")["model"], json.loads((tmp_path / f"{n}.json").read_text()))
               for n in ("single", "paused", "nocache", "cached")}
    weights, history = results.pop("single")
    for name, (w, h) in results.items():
        assert w.keys() == weights.keys() and all(torch.equal(w[k], weights[k]) for k in w), name
        assert h == history and len(h) == 3, name
    (alone,) = (tmp_path / "alone" / "compare").iterdir()
    (entry,) = (tmp_path / "shared" / "compare").iterdir()
    assert entry.name == alone.name
    done = json.loads((entry / "done.json").read_text())
    assert done["summary"]["steps"] == json.loads((alone / "done.json").read_text())["summary"]["steps"] > 0
    model = load_model(entry / "model.pt")
    assert _weights_sha256(model) == done["weights_sha256"]
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert not [p.name for p in entry.iterdir() if p.name.endswith(".part")]
