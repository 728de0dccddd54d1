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


def test_an_unwritable_json_path_is_refused_before_any_work(tmp_path, capsys):
    a = write(tmp_path / "probs_A.npz", [0.9, 0.6, 0.4, 0.1], [0.7, 0.2, 0.4])
    b = write(tmp_path / "probs_B.npz", [0.8, 0.2, 0.7, 0.3], [0.4, 0.9, 0.1])
    with pytest.raises(SystemExit):
        ensemble_rows.main([a, b, "--json", a + "/e.json"])
    err = capsys.readouterr()
    assert "is a file" in err.err and "mean of all" not in err.out


def test_too_few_validation_reviews_to_stack_still_give_the_mean(tmp_path, capsys):
    a = write(tmp_path / "probs_A.npz", [0.9, 0.6, 0.4, 0.1], [0.7, 0.2, 0.4])
    b = write(tmp_path / "probs_B.npz", [0.8, 0.2, 0.7, 0.3], [0.4, 0.9, 0.1])
    out = ensemble_rows.main([a, b])
    assert out["stacked"].startswith("not fitted") and "2 positive, 2 negative" in out["stacked"]
    assert out["mean_ensemble"] == {"val": 1.0, "test": 1.0}


def test_stacking_weighs_members_by_what_validation_shows(tmp_path, capsys):
    # member "sharp": confident (probabilities near 0/1) but right only 75 % of the time;
    # member "soft": scores near 0.5 but on the right side 90 % of the time. Their plain mean
    # follows "sharp"; logistic regression on validation logits learns to follow "soft".
    rng = np.random.default_rng(0)

    def split(n):
        y = rng.integers(0, 2, n)
        sign = np.where(y == 1, 1.0, -1.0)
        sharp = np.where(rng.random(n) < 0.75, sign, -sign) * rng.uniform(4.5, 5.5, n)
        soft = np.where(rng.random(n) < 0.90, sign, -sign) * rng.uniform(0.15, 0.2, n)
        return y, 1 / (1 + np.exp(-sharp)), 1 / (1 + np.exp(-soft))

    yv, sharp_v, soft_v = split(600)
    yt, sharp_t, soft_t = split(2000)
    idx = np.arange(600)
    a = write(tmp_path / "probs_sharp.npz", sharp_v, sharp_t, yv, yt, idx)
    b = write(tmp_path / "probs_soft.npz", soft_v, soft_t, yv, yt, idx)
    out = ensemble_rows.main([a, b])
    st = out["stacked"]
    assert out["mean_ensemble"]["test"] < out["members"]["soft"]["test"] - 0.1      # the mean follows "sharp"
    assert st["weights"]["soft"] > 1.5 * st["weights"]["sharp"] > 0
    assert st["test"] >= out["members"]["soft"]["test"] - 0.02
    assert abs(st["val"] - out["members"]["soft"]["val"]) < 0.05                      # out-of-fold, not the fit
    # the fit never sees test: other test labels change the score, not the predictions
    c = write(tmp_path / "probs_soft2.npz", soft_v, soft_t, yv, 1 - yt, idx)
    d = write(tmp_path / "probs_sharp2.npz", sharp_v, sharp_t, yv, 1 - yt, idx)
    flipped = ensemble_rows.main([d, c])["stacked"]
    assert flipped["test"] == pytest.approx(1 - st["test"])
    assert list(flipped["weights"].values()) == pytest.approx(list(st["weights"].values()))


def test_gain_over_the_val_best_member_has_a_paired_bootstrap_interval():
    ref = np.zeros(2_000, bool)
    ref[:1_600] = True                                   # 0.80
    better = ref.copy()
    better[1_600:1_700] = True                           # 0.85: right on 100 more reviews, wrong on none
    g = ensemble_rows.gain_over(better, ref, 500)
    assert g["gain"] == pytest.approx(0.05) and 0 < g["ci95"][0] < 0.05 < g["ci95"][1] < 0.07
    noisy = ref.copy()
    noisy[:10], noisy[1_600:1_612] = False, True        # 10 lost, 12 won: +0.001, not told apart from 0
    g = ensemble_rows.gain_over(noisy, ref, 500)
    assert g["gain"] == pytest.approx(0.001) and g["ci95"][0] < 0 < g["ci95"][1]
    assert "ci95" not in ensemble_rows.gain_over(noisy, ref, 0)


def test_the_reference_member_is_picked_on_validation(tmp_path, capsys):
    # B is the better on validation (A and B tie on test): the gain is measured against B, as one would pick it
    a = write(tmp_path / "probs_A.npz", [0.9, 0.6, 0.4, 0.1], [0.7, 0.2, 0.4])    # val 2/4, test 2/3
    b = write(tmp_path / "probs_B.npz", [0.8, 0.2, 0.7, 0.3], [0.4, 0.9, 0.1])    # val 4/4, test 2/3
    out = ensemble_rows.main([a, b, "--bootstrap", "0"])
    g = out["gain_over_val_best_member"]
    assert g["member"] == "B" and g["mean"] == {"gain": pytest.approx(1 / 3)} and "stacked" not in g


def test_rows_of_one_name_from_folders_of_one_name_are_all_members(tmp_path):
    """Each call's archive unpacks to ``<dir>/bench/probs_<row>.npz``: a third file of the same row name
    in a folder also called ``bench`` took the second's name and replaced it, silently."""
    paths = []
    for i, val in enumerate(([0.9, 0.6, 0.4, 0.1], [0.8, 0.2, 0.7, 0.3], [0.6, 0.4, 0.6, 0.4])):
        (tmp_path / f"call{i}" / "bench").mkdir(parents=True)
        paths.append(write(tmp_path / f"call{i}" / "bench" / "probs_F.npz", val, [0.7, 0.2, 0.4]))
    out = ensemble_rows.main(paths)
    assert len(out["members"]) == 3
    assert sorted(m["val"] for m in out["members"].values()) == [0.5, 1.0, 1.0]
