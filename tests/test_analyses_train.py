"""analyses/train_imdb.py on tiny slices of IMDB: each recipe runs end to end and writes its
metrics; the two-stage mlm recipe resumes instead of retraining."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analyses" / "train_imdb.py"
TINY = ["--limit-docs", "40", "--max-steps", "3", "--batch-size", "8", "--d-model", "32", "--layers", "1",
        "--max-len", "64"]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("train-imdb-cache")


def run(args, archive, cache):
    env = dict(os.environ, DISTATTN_DATA_DIR=str(archive.parent), DISTATTN_CACHE_DIR=str(cache),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.parametrize("what", ["seed", "lm", "mlm"])
def test_train_imdb_recipes_run_and_the_two_stage_mlm_resumes(what, imdb_archive, shared_cache, tmp_path):
    out = tmp_path / what
    args = [what, "--out", str(out), *([] if what == "seed" else TINY),
            *(["--limit-docs", "40", "--max-steps", "2", "--batch-size", "8"] if what == "seed" else []),
            *(["--checkpoint-every", "1"] if what != "lm" else [])]
    run(args, imdb_archive, shared_cache)
    runs = {"seed": [out], "lm": [out], "mlm": [out / "pretrain", out / "finetune"]}[what]
    for d in runs:
        metrics = json.loads((d / "metrics.json").read_text())
        assert metrics["summary"]["steps"] > 0
        assert (d / "checkpoint.pt").exists()
        assert metrics["train_config"]["checkpoint_every"] == (0 if what == "lm" else 1)
    if what == "lm":
        report = json.loads((out / "test_next_token.json").read_text())
        assert report["n_predictions"] > 0 and report["perplexity"] > 1
    if what in ("seed", "mlm"):
        final = json.loads((runs[-1] / "metrics.json").read_text())["history"][-1]["eval"]["test"]
        assert final["n"] == 40 and 0 <= final["accuracy"] <= 1
    if what != "mlm":
        return
    before = {d: json.loads((d / "metrics.json").read_text())["summary"] for d in runs}
    run(args, imdb_archive, shared_cache)                         # a finished run resumes, trains nothing
    for d in runs:
        after = json.loads((d / "metrics.json").read_text())["summary"]
        assert after["steps"] == before[d]["steps"] and after["tokens"] == before[d]["tokens"]
        # the throughput the training process measured stays (it was rewritten as None), labelled
        assert before[d]["steady_tokens_per_s"] is not None
        assert after == {**before[d], "timing_from_an_earlier_process": True}


@pytest.mark.parametrize("recipe, args, message", [
    ("seed", ["--checkpoint-every", "-2"], "argument --checkpoint-every: got -2; allowed: an integer >= 0"),
    ("seed", ["--epochs", "0"], "argument --epochs: got 0; allowed: an integer >= 1"),    # once read as "the default 5"
    ("seed", ["--seed", "-1"], "argument --seed: got -1; allowed: an integer >= 0"),
    ("seed", ["--max-len", "x"], "argument --max-len: got 'x'; allowed: an integer >= 1"),
    ("seed", ["--positional", "alibi"], "argument --positional: invalid choice: 'alibi'"),
    ("seed", ["--d-model", "32", "--layers", "1"],          # once silently ignored: the seed's d=256 model trained
     "conflicting options: --layers, --d-model are not used by the seed recipe"),
    ("seed", ["--finetune-epochs", "2"], "conflicting options: --finetune-epochs is not used by the seed recipe"),
    # once a model error about n_heads=2, a count the user never chose, after tokenizing IMDB
    ("lm", ["--d-model", "129"], "--d-model 129 is not divisible by 2 heads (the default d_model // 64); choose --heads"),
    ("lm", ["--d-model", "96", "--heads", "5"], "--d-model 96 is not divisible by 5 heads (--heads)"),
    # the only IMDB script without --data-dir: it read $DISTATTN_DATA_DIR alone
    ("seed", ["--data-dir", "/no/such/dir"], "argument --data-dir: got '/no/such/dir', which does not exist"),
])
def test_train_imdb_refuses_bad_arguments_before_reading_data(tmp_path, recipe, args, message):
    env = dict(os.environ, DISTATTN_DATA_DIR=str(tmp_path / "no-data"), DISTATTN_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(SCRIPT), recipe, "--out", str(tmp_path / "x"), *args],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and message in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "x").exists() and not (tmp_path / "cache").exists()


def test_analyses_scripts_end_bad_input_with_one_error_line(tmp_path):
    script = REPO / "analyses" / "paper_examples.py"
    res = subprocess.run([sys.executable, str(script), "--temperature", "0"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == "error: temperature must be a finite real number > 0; got 0.0"
    assert res.stdout == ""                          # once S, Q, QS, M, Norm(M), E and e_global came first
    res = subprocess.run([sys.executable, str(script), "--temperature", "0"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, DISTATTN_TRACEBACK="1"))
    assert res.returncode == 1 and "Traceback" in res.stderr                  # the debugging switch


def test_split_effect_proxy_runs_on_a_slice(imdb_archive, tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("split_effect", REPO / "analyses" / "split_effect.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--limit-docs", "600", "--data-dir", str(imdb_archive.parent), "--json", str(tmp_path / "t.json")])
    assert len(rows) == 6 and {r["tokenizer"] for r in rows} == {"toolkit", "seed-literal"}
    for r in rows:
        assert r["n_train"] + r["n_test"] == 600 and 0.5 < r["accuracy"] <= 1.0   # 600 reviews: better than chance
    assert json.loads((tmp_path / "t.json").read_text())["rows"] == rows


def test_bag_of_words_is_binary_and_drops_oov():
    import importlib.util
    from distattn.corpus.ragged import RaggedIds
    spec = importlib.util.spec_from_file_location("split_effect", REPO / "analyses" / "split_effect.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Enc:
        tokens = RaggedIds.from_sequences([[0, 2, 2, -1], [], [1, 1]])
    X = mod.bag_of_words(Enc(), 3).toarray()
    assert X.tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]


@pytest.mark.parametrize("script, args, target", [
    *[(s, a, t) for s, a in (("spectra.py", ["--out"]), ("attention_vs_ppmi.py", ["--out"]),
                             ("train_imdb.py", ["seed", "--out"])) for t in ("file", "below_file")],
    ("projection_vs_ngrams.py", ["--quick", "--json"], "below_file"),
    ("split_effect.py", ["--limit-docs", "40", "--json"], "below_file"),
    *[("ngram_baseline.py", [flag], "below_file") for flag in ("--json", "--probs")]])
def test_analyses_refuse_an_output_path_they_cannot_write_before_any_work(tmp_path, script, args, target):
    """--out naming an existing file, or --out/--json below one, once ended with a FileExistsError
    traceback, after the work (train_imdb: after training; split_effect: after the six fits)."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    path = blocker if target == "file" else blocker / "sub" / "t.json"
    env = dict(os.environ, DISTATTN_DATA_DIR=str(tmp_path / "no-data"), DISTATTN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(REPO / "analyses" / script), *args, str(path)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert f"error: argument {args[-1]}: got {str(path)!r}" in last, last
    assert ("which is a file" if target == "file" else "is a file") in last, last
    assert blocker.read_text() == "x" and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("args, message", [
    (["--limit-docs", "0"], "argument --limit-docs: got 0; allowed: an integer >= 20"),   # once: all 50k reviews
    (["--limit-docs", "3"], "argument --limit-docs: got 3; allowed: an integer >= 20"),   # once: a scikit-learn error
    (["--seed", "-1"], "argument --seed: got -1; allowed: an integer >= 0"),   # once: "expected non-negative integer"
    (["--C", "0"], "argument --C: got 0.0; allowed: a finite number > 0"),       # once: scikit-learn, after tokenizing
])
def test_split_effect_refuses_bad_numbers_before_reading_data(tmp_path, args, message):
    env = dict(os.environ, DISTATTN_DATA_DIR=str(tmp_path / "no-data"), DISTATTN_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(REPO / "analyses" / "split_effect.py"), *args,
                          "--json", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and message in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "cache").exists()


def test_train_imdb_help_gives_the_batch_sizes_the_recipes_use():
    """--help once said 'mlm 64' while the mlm recipe fine-tunes its classifier at finetune_config's 32."""
    import re

    from distattn.train.recipes import finetune_config, lm_train_config, seed_train_config
    res = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert res.returncode == 0, res.stderr[-2000:]
    text = " ".join(res.stdout.split())
    match = re.search(r"default: the recipe's \(seed (\d+), lm (\d+), mlm (\d+) pretraining, (\d+) fine-tuning\)", text)
    assert match, text
    assert tuple(map(int, match.groups())) == (seed_train_config().batch_size, lm_train_config().batch_size, 64,
                                               finetune_config().batch_size)
