"""Ensemble classifier rows of ``bench_models.py --part best`` run in separate calls.

Each pretrained row writes ``probs_<row>.npz`` (its val-picked fine-tune's probabilities on the
validation reviews and on test, with the labels and the validation indices). This script
averages the probabilities of the rows given, after checking that they score the same reviews,
and prints every member's and the ensemble's accuracy. The ensemble is the plain mean of all
members: nothing in it is chosen on test (nor on validation).

    python benchmarks/ensemble_rows.py OUT1/probs_F_*.npz OUT2/probs_H_*.npz [--json result.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


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
        name = path.stem.removeprefix("probs_")
        if name in rows:
            name = f"{name} ({path.parent.name})"
        rows[name] = row
    return rows


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(((probs >= 0.5) == (labels == 1)).mean())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probs", nargs="+", help="probs_<row>.npz files written by bench_models.py --part best")
    ap.add_argument("--json", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    rows = load(args.probs)
    first = next(iter(rows.values()))
    out = {"members": {}, "n_val": int(first["val_labels"].size), "n_test": int(first["test_labels"].size)}
    for name, r in rows.items():
        out["members"][name] = {k: accuracy(r[k], r[f"{k}_labels"]) for k in ("val", "test")}
        print(f"{name:<55} val {out['members'][name]['val']:.4f}  test {out['members'][name]['test']:.4f}")
    out["mean_ensemble"] = {k: accuracy(np.mean([r[k] for r in rows.values()], axis=0), first[f"{k}_labels"])
                            for k in ("val", "test")}
    print(f"{f'mean of all {len(rows)}':<55} val {out['mean_ensemble']['val']:.4f}  "
          f"test {out['mean_ensemble']['test']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
