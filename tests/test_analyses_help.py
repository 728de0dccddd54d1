"""Every research script in analyses/ answers --help (the smoke runs on tiny data live beside
each stage's tests: test_analyses_projection.py, test_analysis_sources.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"


@pytest.mark.parametrize("script", sorted(p.name for p in ANALYSES.glob("*.py")))
def test_help(script):
    res = subprocess.run([sys.executable, str(ANALYSES / script), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout


# every script that reads IMDB, with the arguments that make it read IMDB
DATA_DIR_SCRIPTS = [("spectra.py", ["--corpus", "imdb"]), ("attention_vs_ppmi.py", ["--corpus", "imdb"]),
                    ("split_effect.py", []), ("ngram_baseline.py", []), ("movie_overlap.py", []),
                    ("projection_vs_ngrams.py", ["--quick"])]


@pytest.mark.parametrize("script, argv", DATA_DIR_SCRIPTS, ids=[s for s, _ in DATA_DIR_SCRIPTS])
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_data_dir_that_is_not_a_directory_is_refused(script, argv, kind, tmp_path, monkeypatch, capsys):
    """A --data-dir that does not exist (a typo) or is a file was passed on to the archive search,
    which went on to $DISTATTN_DATA_DIR and the cache and then downloaded the archive: a run on
    another copy of IMDB, or a download, instead of the error python -m distattn.compare gives."""
    import importlib.util
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("DISTATTN_DATA_DIR", str(empty))           # the old code searched on: nothing there,
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DISTATTN_IMDB_URL", "http://127.0.0.1:9/aclImdb_v1.tar.gz")   # and a download fails fast
    bad = tmp_path / "typo"
    if kind == "file":
        bad.write_text("")
    spec = importlib.util.spec_from_file_location(script[:-3], ANALYSES / script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as exc:
        mod.main([*argv, "--data-dir", str(bad), "--out" if script in ("spectra.py", "attention_vs_ppmi.py")
                  else "--json", str(tmp_path / "out" / "x.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument --data-dir: got {str(bad)!r}" in err, err
    assert ("does not exist" if kind == "missing" else "is a file") in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache" / "aclImdb_v1.tar.gz.part").exists()
