"""Smoke runs of the projection analyses (subprocesses, as a user runs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ANALYSES = ROOT / "analyses"


def _run(args, env=None, timeout=120):
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("script", ["projection_vs_ngrams.py", "paper_examples.py"])
def test_help(script):
    out = _run([ANALYSES / script, "--help"])
    assert "usage:" in out


def test_list_rows():
    out = _run([ANALYSES / "projection_vs_ngrams.py", "--list-rows"])
    for key in ("unigram", "kn3", "raw", "ppmi_norm", "ppmi_softmax", "positional", "asym", "mh_svd", "mh_nmf"):
        assert key in out


def test_paper_examples_runs():
    out = _run([ANALYSES / "paper_examples.py"])
    assert "M = Q S Qᵀ" in out and "prediction:" in out
    out = _run([ANALYSES / "paper_examples.py", "--example", "bank_loan", "--normalization", "row", "--decimals", "3"])
    assert "'money'" in out


@pytest.mark.imdb
def test_projection_vs_ngrams_quick(imdb_archive, tmp_path):
    table = tmp_path / "table.json"
    out = _run([ANALYSES / "projection_vs_ngrams.py", "--quick", "--device", "cpu", "--json", table],
               env={"DISTATTN_DATA_DIR": str(imdb_archive.parent), "DISTATTN_CACHE_DIR": str(tmp_path / "cache")})
    result = json.loads(table.read_text())
    assert result["complete"] is True          # the per-row rewrites say False until the last row is in
    keys = [r["key"] for r in result["rows"]]
    assert keys == ["unigram", "kn2", "kn3", "raw", "ppmi", "ppmi_norm", "ppmi_softmax", "positional", "asym",
                    "asym_fact", "ppmi_norm_uni", "asym_fact_uni", "mh_svd", "mh_nmf"]
    positions = {r["positions"] for r in result["rows"]}
    assert positions == {result["data"]["positions_evaluated"]} and positions.pop() > 100   # same positions
    for r in result["rows"]:
        assert np.isfinite(r["perplexity"]) and 1 < r["perplexity"] < 1e5, r
        assert 0 <= r["top1"] <= r["top10"] <= 1, r
        assert (r["temperature"] is None) == (r["key"] in ("unigram", "kn2", "kn3")), r
        assert r["model"] in out
    rows = {r["key"]: r for r in result["rows"]}
    assert rows["kn3"]["perplexity"] < rows["unigram"]["perplexity"]
    # the batched torch scorers match the library's numpy functions and kernels
    assert result["checks"] and all(v < 1e-3 for v in result["checks"].values()), result["checks"]
    assert "lowest perplexity" in out and "OOV" in out


@pytest.mark.parametrize("args, message", [
    (["--n-eval", "0"], "argument --n-eval: got 0; allowed: an integer >= 1"),        # once perplexity nan, exit 0
    (["--n-val", "-3"], "argument --n-val: got -3; allowed: an integer >= 1"),     # once "negative dimensions ..."
    (["--max-len", "1"], "argument --max-len: got 1; allowed: an integer >= 2"),   # once "zero-size array ..."
    (["--batch-positions", "0"], "argument --batch-positions: got 0; allowed: an integer >= 1"),
    (["--nmf-heads", "-1"], "argument --nmf-heads: got -1; allowed: an integer >= 0"),
    (["--seed", "-1"], "argument --seed: got -1; allowed: an integer >= 0"),
    (["--cds", "nan"], "argument --cds: got nan; allowed: a real number in (0, 1]"),
    (["--attention-temperature", "0"], "argument --attention-temperature: got 0.0; allowed: a finite real number > 0"),
])
def test_projection_vs_ngrams_refuses_bad_numbers_before_reading_data(tmp_path, args, message):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISTATTN_DATA_DIR": str(tmp_path / "no-data"),
           "DISTATTN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(ANALYSES / "projection_vs_ngrams.py"), "--quick", "--json",
                           str(tmp_path / "t.json"), *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "cache").exists()   # no partial table


def test_projection_vs_ngrams_ends_unknown_rows_with_an_error_line_and_exit_2(tmp_path):
    """--rows foo once raised SystemExit: 'unknown rows ['foo']; see --list-rows', exit code 1 and no
    'error:' prefix; --rows , ran no row at all and exited 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISTATTN_DATA_DIR": str(tmp_path / "no-data"),
           "DISTATTN_CACHE_DIR": str(tmp_path / "cache")}
    for rows, what in (("foo", "unknown rows ['foo']"), (",", "no row")):
        proc = subprocess.run([sys.executable, str(ANALYSES / "projection_vs_ngrams.py"), "--quick", "--rows", rows],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --rows {rows!r}: {what}; allowed: "), proc.stderr
    # the NMF row asked for by name with no NMF heads once ran nothing and exited 0
    proc = subprocess.run([sys.executable, str(ANALYSES / "projection_vs_ngrams.py"), "--quick", "--rows", "mh_nmf",
                           "--nmf-heads", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        "error: conflicting options: --rows names mh_nmf but --nmf-heads 0 means no NMF row", proc.stderr[-2000:]


@pytest.mark.imdb
def test_projection_vs_ngrams_ends_too_many_reviews_with_an_error_line_and_exit_2(imdb_archive, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISTATTN_DATA_DIR": str(imdb_archive.parent),
           "DISTATTN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(ANALYSES / "projection_vs_ngrams.py"), "--quick", "--n-eval", "999999",
                           "--json", str(tmp_path / "t.json")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]                           # once exit code 1, no "error:"
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: asked for 6 validation / 999999 test reviews; the corpus has 25000 train / 25000 test reviews "
        "(allowed: --n-val < 25000, --n-eval <= 25000)")
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("device, message", [
    ("foo", "error: --device 'foo' is not a device; allowed: auto, cpu, cuda, cuda:N, mps"),
    ("cuda:99", "error: --device 'cuda:99' was requested but cuda is not available here")])
def test_projection_vs_ngrams_names_a_device_it_cannot_use(tmp_path, device, message):
    """--device foo once ended with torch's RuntimeError traceback, --device cuda on a machine without
    CUDA with an AssertionError traceback ("Torch not compiled with CUDA enabled")."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISTATTN_DATA_DIR": str(tmp_path / "no-data"),
           "DISTATTN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(ANALYSES / "projection_vs_ngrams.py"), "--quick", "--device", device,
                           "--json", str(tmp_path / "t.json")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "t.json").exists()


def test_projection_vs_ngrams_quick_keeps_a_size_given_equal_to_its_default(monkeypatch):
    """--quick --max-len 256 once ran with max_len 40: a size given on the command line was replaced by the
    quick one whenever it equalled the parser's default."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("projection_vs_ngrams", ANALYSES / "projection_vs_ngrams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Stop(Exception):
        pass

    def stop(args, log):
        raise Stop(args)
    monkeypatch.setattr(module, "load_data", stop)
    with pytest.raises(Stop) as exc:
        module.main(["--quick", "--device", "cpu", "--max-len", "256", "--n-eval", "2000", "--n-val", "7"])
    args = exc.value.args[0]
    assert (args.max_len, args.n_eval, args.n_val) == (256, 2000, 7)
    assert (args.vocab_size, args.stat_docs, args.heads) == (1500, 1000, 2)      # not given: the quick sizes


def test_projection_vs_ngrams_json_is_written_atomically(tmp_path):
    """A failed write (a value JSON cannot hold) once left ``<json>.tmp`` beside the results file; it
    now keeps the previous file and leaves nothing else."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("projection_vs_ngrams", ANALYSES / "projection_vs_ngrams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "rows.json"
    module.save_json(path, {"rows": [1.5, np.float32(2.0)]})
    assert json.loads(path.read_text()) == {"rows": [1.5, 2.0]}
    with pytest.raises(TypeError):
        module.save_json(path, {"rows": [object()]})
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]
    assert json.loads(path.read_text()) == {"rows": [1.5, 2.0]}
    # a non-finite value (a check that came out inf, a NaN perplexity) is null: a bare NaN or Infinity
    # was written, which strict JSON readers refuse
    module.save_json(path, {"rows": [float("nan"), np.float64(np.inf)], "gap": np.array([1.0, np.nan])})
    strict = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))
    assert strict == {"rows": [None, None], "gap": [1.0, None]}
