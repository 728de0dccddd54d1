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
