"""Ensemble classifier rows of ``bench_models.py --part best`` run in separate calls.

Each pretrained row writes ``probs_<row>.npz`` (its val-picked fine-tune's probabilities on the
validation reviews and on test, with the labels and the validation indices). This script
combines the rows given, after checking that they score the same reviews, and prints every
member's accuracy and two ensembles':

- ``mean``: the plain mean of the members' probabilities; nothing in it is chosen, on test or on
  validation. Members with different calibrations (a sharp attention classifier beside NB-LR's
  soft scores) weigh unequally in it: the sharper one decides most reviews.
- ``stacked``: logistic regression on the members' logits (each scaled by its spread on the
  validation reviews), fitted on the validation reviews only, then applied to test. Its ``val``
  accuracy is out-of-fold (5-fold cross-validation on the validation reviews), so it is not scored
  on the reviews that fitted it. A member whose own settings were picked on these validation
  reviews (the epoch, NB-LR's C and β) looks a little better there than it is, and may be
  weighted a little too much; test is never used.

Each ensemble's test accuracy is also given as a gain over the member with the best
validation accuracy (the member one would have picked without the ensemble), with a 95 %
paired bootstrap interval over the test reviews (``--bootstrap`` resamples, seed 0).

    python benchmarks/ensemble_rows.py OUT1/probs_F_*.npz OUT2/probs_H_*.npz [--json result.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from distattn.atomic import write_json
from distattn.cli import non_negative_int, output_file

CV_FOLDS = 5
EPS = 1e-6          # probabilities are clipped to [EPS, 1 - EPS] before the logit


def load(paths: list[str]) -> dict[str, dict]:
    if len(paths) < 2:
        raise SystemExit(f"an ensemble needs at least two probs_*.npz files; got {len(paths)}")
    rows, ref = {}, None
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise SystemExit(f"{p}: no such file")
        with np.load(path) as z:
            missing = {"val", "test", "val_labels", "test_labels", "val_idx"} - set(z.files)
            if missing:
                raise SystemExit(f"{p}: not a bench_models probs file (missing {', '.join(sorted(missing))})")
            row = {k: z[k] for k in z.files}
        if ref is None:
            ref = row
        else:
            for k in ("val_labels", "test_labels", "val_idx"):
                if not np.array_equal(row[k], ref[k]):
                    raise SystemExit(f"{p}: its {k} differ from {paths[0]}'s; the rows score other reviews")
        for k in ("val", "test"):
            if row[k].shape != row[f"{k}_labels"].shape or not np.all((row[k] >= 0) & (row[k] <= 1)):
                raise SystemExit(f"{p}: {k} probabilities must be in [0, 1], one per review")
        stem = path.stem.removeprefix("probs_")
        # a third file of one row name in a folder of one name (each call unpacks to <dir>/bench/) took
        # the second's name and replaced it: the path as given, then its position, tell them apart
        names = (stem, f"{stem} ({path.parent.name})", f"{stem} ({p})", f"{stem} ({p}, #{len(rows) + 1})")
        name = next(n for n in names if n not in rows)
        rows[name] = row
    return rows


def correct(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per review: is the 0.5-thresholded probability the label?"""
    return (probs >= 0.5) == (labels == 1)


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(correct(probs, labels).mean())


def logits(rows: dict[str, dict], split: str, scale: np.ndarray | None = None):
    """The members' logits on ``split`` as columns; each divided by ``scale`` (the members'
    standard deviations on validation, computed when ``scale`` is None)."""
    from scipy.special import logit

    x = np.column_stack([logit(np.clip(r[split], EPS, 1 - EPS)) for r in rows.values()])
    if scale is None:
        spread = x.std(axis=0)
        scale = np.where(spread > 0, spread, 1.0)
    return x / scale, scale


def stack(rows: dict[str, dict]) -> tuple[dict | str, np.ndarray | None]:
    """Logistic regression on the members' validation logits: out-of-fold val accuracy, the
    refit on all validation reviews scored on test, and its weight per member, with its test
    predictions; or, with too few validation reviews to cross-validate, the reason it was not
    fitted (and None)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    first = next(iter(rows.values()))
    y_val, y_test = first["val_labels"] == 1, first["test_labels"] == 1
    if min(y_val.sum(), (~y_val).sum()) < CV_FOLDS:
        return (f"not fitted: {CV_FOLDS}-fold cross-validation needs at least {CV_FOLDS} validation reviews "
                f"of each class (got {int(y_val.sum())} positive, {int((~y_val).sum())} negative)"), None
    x_val, scale = logits(rows, "val")
    x_test, _ = logits(rows, "test", scale)
    model = LogisticRegression()
    oof = cross_val_predict(model, x_val, y_val, cv=StratifiedKFold(CV_FOLDS, shuffle=True, random_state=0))
    model.fit(x_val, y_val)
    pred = model.predict(x_test)
    return {"val": float((oof == y_val).mean()), "test": float((pred == y_test).mean()),
            "weights": dict(zip(rows, map(float, model.coef_[0]))), "intercept": float(model.intercept_[0])}, pred


def gain_over(correct: np.ndarray, reference: np.ndarray, resamples: int, seed: int = 0) -> dict:
    """Test accuracy of ``correct`` minus that of ``reference`` (per-review booleans), with a 95 %
    paired bootstrap interval: both are scored on the same resampled reviews."""
    diff = correct.astype(np.int8) - reference.astype(np.int8)
    out = {"gain": float(diff.mean())}
    if resamples:
        rng = np.random.default_rng(seed)
        means = np.array([diff[rng.integers(0, diff.size, diff.size)].mean() for _ in range(resamples)])
        out["ci95"] = [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probs", nargs="+", help="probs_<row>.npz files written by bench_models.py --part best")
    ap.add_argument("--bootstrap", type=non_negative_int, default=1000,
                    help="paired bootstrap resamples for the ensembles' gain over the val-best member (0: none)")
    ap.add_argument("--json", type=output_file, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    rows = load(args.probs)
    first = next(iter(rows.values()))
    out = {"members": {}, "n_val": int(first["val_labels"].size), "n_test": int(first["test_labels"].size)}
    for name, r in rows.items():
        out["members"][name] = {k: accuracy(r[k], r[f"{k}_labels"]) for k in ("val", "test")}
        print(f"{name:<55} val {out['members'][name]['val']:.4f}  test {out['members'][name]['test']:.4f}")
    mean = {k: np.mean([r[k] for r in rows.values()], axis=0) for k in ("val", "test")}
    out["mean_ensemble"] = {k: accuracy(mean[k], first[f"{k}_labels"]) for k in ("val", "test")}
    print(f"{f'mean of all {len(rows)}':<55} val {out['mean_ensemble']['val']:.4f}  "
          f"test {out['mean_ensemble']['test']:.4f}")
    out["stacked"], stacked_pred = stack(rows)
    st = out["stacked"]
    if stacked_pred is None:
        print(f"{'stacked':<55} {st}")
    else:
        print(f"{f'stacked (fitted on val; val {CV_FOLDS}-fold out-of-fold)':<55} val {st['val']:.4f}  "
              f"test {st['test']:.4f}")
        print("  stacking weights (per validation-std logit): "
              + ", ".join(f"{k} {w:+.3f}" for k, w in st["weights"].items()))
    best = max(out["members"], key=lambda k: out["members"][k]["val"])      # ties: the first given
    labels = first["test_labels"]
    reference = correct(rows[best]["test"], labels)
    out["gain_over_val_best_member"] = {"member": best}
    for name, right in (("mean", correct(mean["test"], labels)),
                        ("stacked", None if stacked_pred is None else stacked_pred == (labels == 1))):
        if right is None:
            continue
        g = out["gain_over_val_best_member"][name] = gain_over(right, reference, args.bootstrap)
        ci = f" (95 % paired bootstrap {g['ci95'][0]:+.4f} to {g['ci95'][1]:+.4f})" if "ci95" in g else ""
        print(f"  {name} − {best} (the val-best member) on test: {g['gain']:+.4f}{ci}")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
