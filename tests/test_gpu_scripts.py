"""``benchmarks/gpu_check.sh``, ``gpu_compare.sh`` and ``gpu_session.sh``, the owed GPU calls, run here with a stand-in
``python3`` (no GPU, no training): what they leave in ``$OUT`` is all a device call brings back, at
most 8 files, so a mistake in them would only show after the lent machine's minutes were spent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE_MAX_FILES = 8            # files the device machine brings back from $OUT

_MISSING = [tool for tool in ("bash", "timeout", "tar") if shutil.which(tool) is None]


@pytest.fixture(autouse=True)
def _tools():
    """The scripts need bash, timeout and tar: missing ones skip these tests here, fail them under CI."""
    if _MISSING:
        msg = f"needs {', '.join(_MISSING)}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)

FAKE_PYTHON = r'''#!{python}
"""Stands in for python3: `-c` runs the real interpreter; the benchmark and the compare are faked."""
import os, sys
from pathlib import Path
args = sys.argv[1:]
if args[0] == "-c":
    os.execv({python!r}, [{python!r}, *args])
if os.environ.get("FAKE_CALLS"):
    with open(os.environ["FAKE_CALLS"], "a") as fh:
        fh.write(" ".join(args) + "\n")
if args[0] == "benchmarks/bench_models.py":
    out = Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    for name in ["seed.json", "mfu.json", "seedvar.json", "seedsplit.json"] + [
            f"metrics_run_{{i}}.json" for i in range(9)] + ["probs_F.npz"]:
        (out / name).write_text(name)
    print("bench done")
    sys.exit(int(os.environ.get("FAKE_RC", "0")))
if args[0] == "benchmarks/ensemble_rows.py":
    import json
    Path(args[args.index("--json") + 1]).write_text(json.dumps(args))
    print("ensemble done")
    sys.exit(0)
if args[:2] == ["-m", "pytest"]:
    if os.environ.get("FAKE_ARGS_FILE"):
        Path(os.environ["FAKE_ARGS_FILE"]).write_text(" ".join(args))
    print(os.environ.get("FAKE_SMOKE_TEXT", "3 passed in 0.10s"))
    sys.exit(int(os.environ.get("FAKE_SMOKE_RC", "0")))
if args[:2] == ["-m", "distattn.compare"]:
    runs = Path(args[args.index("--out") + 1])
    runs.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ["DISTATTN_CACHE_DIR"])
    print("stage cache:", "warm" if cache.is_dir() and any(cache.iterdir()) else "empty")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"stage-{{len(list(cache.iterdir()))}}").write_text("cached")
    n = len(list(runs.glob("imdb-*")))
    run = runs / f"imdb-{{n}}"
    run.mkdir()
    (run / "config.json").write_text(run.name)
    if n == 0 and os.environ.get("FAKE_COLD") == "cut":        # killed by the timeout mid-run
        sys.exit(124)
    if n == 0 and os.environ.get("FAKE_COLD") == "hang":       # runs until the timeout kills it
        import time
        time.sleep(120)
    for name in ("metrics.json", "report.html"):
        (run / name).write_text(run.name)
    print("report", run)
    sys.exit(0)
sys.exit(f"unexpected call: {{args}}")
'''


def _fake_bin(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTATTN_", "FAKE_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["OUT"] = str(tmp_path / "out")
    return env


def _returned(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("rc", [0, 3])
def test_gpu_check_brings_every_bench_file_back_in_one_archive_and_keeps_the_exit_code(tmp_path, rc):
    env = _fake_bin(tmp_path)
    env.update(GPU_CHECK_STAGE=str(tmp_path / "stage"), FAKE_RC=str(rc))
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "seed,mfu", "--set", "x=1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == rc, done.stdout + done.stderr
    out = tmp_path / "out"
    assert _returned(out) == ["bench_seed_mfu.tar.gz", "log_seed_mfu.txt"]      # at most 8 come back
    with tarfile.open(out / "bench_seed_mfu.tar.gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    # the stand-in bench writes 14 files, one of them a row's probabilities, hence the ensemble's JSON too
    assert len(names) == 15 > DEVICE_MAX_FILES and "bench/probs_F.npz" in names and "bench/seed.json" in names
    assert "bench/ensemble_with_nbsvm.json" in names
    assert "bench done" in (out / "log_seed_mfu.txt").read_text()


@pytest.mark.parametrize("cold", ["done", "cut"])
def test_gpu_compare_copies_the_report_of_the_first_finished_run(tmp_path, cold):
    """A cold run cut by its timeout leaves a run directory without a report: the warm run's
    report is copied instead (the script once copied from the cut directory and failed)."""
    env = _fake_bin(tmp_path)
    env.update(COMPARE_RUNS=str(tmp_path / "runs"), COMPARE_CACHE=str(tmp_path / "cache"), FAKE_COLD=cold)
    (tmp_path / "out").mkdir()                  # as on the device machine
    done = subprocess.run(["bash", "benchmarks/gpu_compare.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    files = _returned(out)
    assert len(files) <= DEVICE_MAX_FILES
    assert {"report.html", "metrics.json", "config.json", "compare_cold.log", "compare_warm.log"} <= set(files)
    want = "imdb-0" if cold == "done" else "imdb-1"
    assert (out / "report.html").read_text() == want and (out / "config.json").read_text() == want
    assert "cold wall " in (out / "compare_cold.log").read_text()
    assert "warm wall " in (out / "compare_warm.log").read_text()
    # the wall times are numbers (they were computed with bc, which the device image need not have)
    for log in ("compare_cold.log", "compare_warm.log"):
        wall = (out / log).read_text().split("wall ")[-1].split()[0]
        assert float(wall) >= 0


def test_gpu_check_ensembles_its_rows_with_the_committed_nbsvm_probabilities(tmp_path):
    env = _fake_bin(tmp_path)
    env.update(GPU_CHECK_STAGE=str(tmp_path / "stage"))
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "best", "--rows", "F"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert "ensemble done" in (out / "log_best.txt").read_text()
    with tarfile.open(out / "bench_best.tar.gz") as tar:
        args = json.loads(tar.extractfile("bench/ensemble_with_nbsvm.json").read())
    nbsvm = "benchmarks/results/cpu_nbsvm_imdb/probs_nbsvm.npz"
    assert args[1].endswith("bench/probs_F.npz") and nbsvm in args and (ROOT / nbsvm).is_file()


def test_gpu_compare_run_again_on_a_warm_machine_is_cold_and_copies_its_own_report(tmp_path):
    """The device machine keeps /tmp while it stays warm. A second call once found the first call's
    stage cache (its "cold" run and wall time were a warm one's) and copied the oldest report under
    COMPARE_RUNS: the first call's, not its own."""
    env = _fake_bin(tmp_path)
    env.update(COMPARE_RUNS=str(tmp_path / "runs"), COMPARE_CACHE=str(tmp_path / "cache"))
    for call in (1, 2):
        out = tmp_path / f"out{call}"
        out.mkdir()
        env["OUT"] = str(out)
        done = subprocess.run(["bash", "benchmarks/gpu_compare.sh"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        # each call runs the compare twice (cold, warm): the second call's are imdb-2 and imdb-3
        want = f"imdb-{2 * (call - 1)}"
        assert (out / "report.html").read_text() == want and (out / "config.json").read_text() == want
        assert "stage cache: empty" in (out / "compare_cold.log").read_text()
        assert "stage cache: warm" in (out / "compare_warm.log").read_text()


@pytest.mark.parametrize("rc, text, runs", [
    (0, "3 passed, 1 warning in 0.10s (RuntimeError: a warning's text)", True),
    (1, "1 failed, 2 passed in 0.10s", False),
    (2, "no tests ran in 0.01s", False),
])
def test_gpu_compare_smoke_test_decides_by_pytest_exit_status_and_skips_the_imdb_tests(tmp_path, rc, text, runs):
    """The smoke check grepped pytest's last lines for "failed" or "error": a passing run whose summary
    held the word skipped the whole compare call. It ran the IMDB tests too, which with the archive
    carried tokenize the whole corpus inside the call's 600 s beside the compare's 520 s."""
    env = _fake_bin(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    env.update(OUT=str(out), COMPARE_RUNS=str(tmp_path / "runs"), COMPARE_CACHE=str(tmp_path / "cache"),
               FAKE_SMOKE_RC=str(rc), FAKE_SMOKE_TEXT=text, FAKE_ARGS_FILE=str(tmp_path / "pytest_args.txt"))
    done = subprocess.run(["bash", "benchmarks/gpu_compare.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "-m not imdb" in (tmp_path / "pytest_args.txt").read_text()
    assert (done.returncode == 0) == runs, done.stdout + done.stderr
    assert (out / "compare_cold.log").exists() == runs
    assert text in (out / "smoke.txt").read_text()
    if not runs:
        assert f"pytest exit {rc}" in done.stdout


def _session(tmp_path: Path, **env_extra) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    env = _fake_bin(tmp_path)
    env.update(SESSION_STAGE=str(tmp_path / "stage"), COMPARE_CACHE=str(tmp_path / "cache"), **env_extra)
    done = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    out = tmp_path / "out"
    with tarfile.open(out / "session.tar.gz") as tar:
        names = sorted(m.name.removeprefix("./") for m in tar.getmembers() if m.isfile())
    return done, out, names


def test_gpu_session_runs_the_compare_then_the_models_and_brings_everything_back_in_three_files(tmp_path):
    """The one call a session's 15 device-minutes allow: the compare cold and warm, then the seed,
    lm and mfu parts; the device brings back at most 8 files, so the steps' files travel as one
    archive (without the run directories' checkpoints, nor gpu_check.sh's own archive of bench/)."""
    done, out, names = _session(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _returned(out) == ["report.html", "session.log", "session.tar.gz"]
    assert (out / "report.html").read_text() == "imdb-0"           # the cold run's
    assert {"compare/compare_cold.log", "compare/compare_warm.log", "compare/report.html", "compare/metrics.json",
            "compare/config.json", "models/log_seed_lm_mfu.txt", "models/stage/bench/seed.json",
            "models/stage/bench/mfu.json"} <= set(names)
    assert not [n for n in names if n.startswith("runs/") or n.endswith(".tar.gz")], names
    assert not (tmp_path / "out" / "smoke.txt").exists() and not any("smoke" in n for n in names)
    log = (out / "session.log").read_text()
    assert "compare: up to 360 s" in log or "compare: up to 359 s" in log      # COMPARE_TIMEOUT 330 + the warm run's 30
    assert "compare: exit 0" in log and "models: exit 0" in log and "cold wall" in log and "warm wall" in log
    assert f"report {tmp_path / 'stage' / 'runs' / 'imdb-0'}" in log      # the cold run's lines that matter
    # the models step read the compare's cache and the carried archive: the same folders
    assert "stage cache: empty" in (tmp_path / "stage" / "compare" / "compare_cold.log").read_text()
    assert "bench done" in (tmp_path / "stage" / "models" / "log_seed_lm_mfu.txt").read_text()


def test_gpu_session_skips_a_step_it_has_no_time_left_for_and_says_so(tmp_path):
    done, out, names = _session(tmp_path, SESSION_DEADLINE="40", SESSION_MIN_COMPARE="100", SESSION_MIN_MODELS="5")
    assert done.returncode == 0, done.stdout + done.stderr
    log = (out / "session.log").read_text()
    assert "compare: skipped" in log and "it needs 100" in log and "models: up to" in log
    assert not [n for n in names if n.startswith("compare/")] and "models/stage/bench/seed.json" in names
    assert not (out / "report.html").exists()


def test_gpu_session_goes_on_to_the_models_when_the_cold_compare_is_cut_at_its_timeout(tmp_path):
    """A cold compare slower than its share of the call is killed; the warm run and the models step
    still run, and the session's exit status says that a step failed."""
    done, out, names = _session(tmp_path, FAKE_COLD="hang", COMPARE_TIMEOUT="2", SESSION_MIN_MODELS="5")
    assert done.returncode == 124, done.stdout + done.stderr
    log = (out / "session.log").read_text()
    assert "exit 124; cold wall" in log and "models: exit 0" in log
    assert (out / "report.html").read_text() == "imdb-1"           # the warm run's: the cold one made none
    assert "models/stage/bench/seed.json" in names


def test_gpu_session_rehearses_on_a_cpu_with_the_quick_profile_and_smoke_sizes(tmp_path):
    """COMPARE_PROFILE and SESSION_BENCH_ARGS let the session's steps run here at small sizes (the real
    compare and bench), so that its plumbing is checked before a lent machine's minutes are spent."""
    calls = tmp_path / "calls.txt"
    done, out, names = _session(tmp_path, COMPARE_PROFILE="quick", SESSION_BENCH_ARGS="--smoke --set x=1",
                                FAKE_CALLS=str(calls))
    assert done.returncode == 0, done.stdout + done.stderr
    compare = [c for c in calls.read_text().splitlines() if c.startswith("-m distattn.compare")]
    bench = [c for c in calls.read_text().splitlines() if c.startswith("benchmarks/bench_models.py")]
    assert len(compare) == 2 and all("--corpus imdb --profile quick" in c for c in compare)
    assert len(bench) == 1 and bench[0].startswith("benchmarks/bench_models.py --part seed,lm,mfu")
    assert bench[0].endswith("--smoke --set x=1")
