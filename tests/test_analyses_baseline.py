"""``analyses/ngram_baseline.py``: the NBSVM baseline on an IMDB slice, its validation protocol,
its probabilities file for ``benchmarks/ensemble_rows.py``, and its bad arguments."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analyses" / "ngram_baseline.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_validation_split_is_the_one_bench_models_holds_out():
    """--probs files are averaged with bench_models' rows only if both hold out the same reviews."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        bench = _load("bench_models", REPO / "benchmarks" / "bench_models.py")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    mod = _load("ngram_baseline", SCRIPT)
    for n, n_val, seed in ((25_000, 2_500, 0), (600, 60, 3)):
        for a, b in zip(mod.validation_split(n, n_val, seed), bench.train_val_split(n, n_val, seed)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.imdb
def test_ngram_baseline_runs_on_a_slice(imdb_archive, tmp_path, capsys, monkeypatch):
    from distattn.models import NBSVMClassifier
    mod = _load("ngram_baseline", SCRIPT)
    probs, table = tmp_path / "probs_nbsvm.npz", tmp_path / "t.json"
    fitted_ids = []
    fit = NBSVMClassifier.fit
    monkeypatch.setattr(NBSVMClassifier, "fit", lambda self, docs, y: (fitted_ids.append(docs.ids), fit(self, docs, y))[1])
    out = mod.main(["--limit-docs", "600", "--n-val", "150", "--C", "0.3,1", "--beta", "0.25,1",
                    "--data-dir", str(imdb_archive.parent), "--probs", str(probs), "--json", str(table)])
    rows = {r["row"]: r for r in out["rows"]}
    assert list(rows) == ["paper", "picked", "picked, refit"]
    # out-of-vocabulary words reach NBSVM as -1 (no feature), not as <unk> = 1, one feature
    # that pooled every unknown word (and <pad> = 0 never occurs)
    assert len(fitted_ids) == 4 and all((ids == -1).any() and not np.isin(ids, [0, 1]).any() for ids in fitted_ids)
    assert rows["paper"]["loss"] == "squared_hinge" and (rows["paper"]["C"], rows["paper"]["beta"]) == (1.0, 0.25)
    for r in rows.values():
        assert 0.6 < r["test_accuracy"] <= 1.0, r            # 600 reviews: well above chance
    # the picked setting is the validation argmax of the search, nothing chosen on test
    assert len(out["search"]) == 4
    top = max(s["val_accuracy"] for s in out["search"])
    first = next(s for s in out["search"] if s["val_accuracy"] == top)
    assert (rows["picked"]["C"], rows["picked"]["beta"], rows["picked"]["val_accuracy"]) == \
        (first["C"], first["beta"], top)
    assert json.loads(table.read_text())["rows"] == out["rows"]
    # the probabilities file is the one ensemble_rows.py averages, and matches the picked row
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        ensemble_rows = _load("ensemble_rows", REPO / "benchmarks" / "ensemble_rows.py")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    with np.load(probs) as z:
        assert z["val_idx"].shape == (150,) and z["test"].shape == (600,)
        assert ((z["test"] >= 0.5) == (z["test_labels"] == 1)).mean() == pytest.approx(rows["picked"]["test_accuracy"])
        assert ((z["val"] >= 0.5) == (z["val_labels"] == 1)).mean() == pytest.approx(top)
    twin = tmp_path / "probs_twin.npz"
    twin.write_bytes(probs.read_bytes())
    result = ensemble_rows.main([str(probs), str(twin)])
    assert result["mean_ensemble"]["test"] == pytest.approx(rows["picked"]["test_accuracy"])


@pytest.mark.parametrize("args, message", [
    (["--ngram", "4"], "argument --ngram: got 4; allowed: 1, 2 or 3"),
    (["--vocab-size", "2"], "argument --vocab-size: got 2; allowed: 0 (every word) or an integer >= 3"),
    (["--C", "1,0"], "argument --C: got 0.0; allowed: finite numbers > 0"),
    (["--beta", "0.5,2"], "argument --beta: got 2.0; allowed: numbers in [0, 1]"),
    (["--C", "a"], "argument --C: got 'a'; allowed: comma-separated numbers"),
    (["--limit-docs", "100"], "argument --limit-docs: got 100; allowed: at least 2 × --n-val = 5000"),
    (["--n-val", "0"], "argument --n-val: got 0; allowed: an integer >= 1"),
    # once "error: the corpus is empty: no documents", after tokenizing IMDB and fitting the paper row
    (["--n-val", "25000", "--limit-docs", "50000"],
     "argument --n-val: got 25000; allowed: fewer than the 25,000 train reviews"),
])
def test_ngram_baseline_refuses_bad_arguments_before_reading_data(tmp_path, args, message):
    env = dict(os.environ, DISTATTN_DATA_DIR=str(tmp_path / "no-data"), DISTATTN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(SCRIPT), *args, "--json", str(tmp_path / "t.json")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and message in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "cache").exists()
