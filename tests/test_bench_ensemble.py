"""``benchmarks/ensemble_rows.py``: rows from separate GPU calls, averaged only when they score
the same reviews."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ensemble_rows  # noqa: E402


def write(path, val, test, val_labels=(1, 0, 1, 0), test_labels=(1, 1, 0), val_idx=(3, 5, 8, 9)):
    np.savez(path, val=np.asarray(val, float), test=np.asarray(test, float), val_labels=np.asarray(val_labels),
             test_labels=np.asarray(test_labels), val_idx=np.asarray(val_idx))
    return str(path)


def test_mean_ensemble_of_rows(tmp_path, capsys):
    a = write(tmp_path / "probs_A.npz", [0.9, 0.6, 0.4, 0.1], [0.7, 0.2, 0.4])    # val 2/4, test 2/3
    b = write(tmp_path / "probs_B.npz", [0.8, 0.2, 0.7, 0.3], [0.4, 0.9, 0.1])    # val 4/4, test 2/3
    out = ensemble_rows.main([a, b, "--json", str(tmp_path / "e.json")])
    assert out["members"]["A"] == {"val": 0.5, "test": pytest.approx(2 / 3)}
    assert out["members"]["B"] == {"val": 1.0, "test": pytest.approx(2 / 3)}
    # means: val [0.85, 0.4, 0.55, 0.2] -> all right; test [0.55, 0.55, 0.25] -> all right
    assert out["mean_ensemble"] == {"val": 1.0, "test": 1.0}
    assert (tmp_path / "e.json").exists() and "mean of all 2" in capsys.readouterr().out


def test_rows_that_score_other_reviews_are_refused(tmp_path):
    a = write(tmp_path / "probs_A.npz", [0.9, 0.6, 0.4, 0.1], [0.7, 0.2, 0.4])
    b = write(tmp_path / "probs_B.npz", [0.9, 0.6, 0.4, 0.1], [0.7, 0.2, 0.4], val_idx=(3, 5, 8, 10))
    with pytest.raises(SystemExit, match="val_idx differ"):
        ensemble_rows.main([a, b])
    c = write(tmp_path / "probs_C.npz", [0.9, 0.6, 0.4, 1.5], [0.7, 0.2, 0.4])
    with pytest.raises(SystemExit, match=r"must be in \[0, 1\]"):
        ensemble_rows.main([a, c])
    np.savez(tmp_path / "probs_D.npz", val=np.zeros(4))
    with pytest.raises(SystemExit, match="missing test, test_labels"):
        ensemble_rows.main([a, str(tmp_path / "probs_D.npz")])
    with pytest.raises(SystemExit, match="at least two"):
        ensemble_rows.main([a])
    with pytest.raises(SystemExit, match="no such file"):
        ensemble_rows.main([a, str(tmp_path / "nope.npz")])
