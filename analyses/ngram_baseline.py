"""NBSVM, the bag-of-n-grams baseline of the IMDB classifiers, on the official split (train → test).

The issue's bar for a better classifier is "NBSVM with bigrams reaches 91.2 %" (Wang & Manning
2012). This measures that model on the toolkit's tokens and the attention classifiers' 30k
vocabulary (the statistics layer's: train+unsup, never test; a word outside it is no feature and
breaks the n-grams around it, rather than one pooled ``<unk>``), on the 25k test reviews. Two rows,
each fixed before test is scored:

* ``paper``: NBSVM as the paper ran it (binarized n-grams up to ``--ngram``, α = 1, L2-loss SVM
  with C = 1, β = 0.25), trained on all 25k train reviews;
* ``picked``: NB logistic regression (it gives probabilities) with C and β chosen by accuracy
  on ``--n-val`` validation reviews held out of train (the split ``benchmarks/bench_models.py``
  holds out: ``default_rng(--val-seed).permutation``), trained on the rest; then the same
  setting refit on all of train (``picked, refit``).

``--probs FILE`` writes the ``picked`` row's validation and test probabilities in the format of
``benchmarks/ensemble_rows.py``: with the same ``--n-val`` and ``--val-seed`` as a
``bench_models.py --part best`` run, its rows and this one score the same reviews and can be
averaged there.

    python analyses/ngram_baseline.py                       # ~3 min on 2 cores; prints a table
    python analyses/ngram_baseline.py --probs probs_nbsvm.npz --json nbsvm.json
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from distattn.cli import check_data_dir, non_negative_int, output_file, positive_int, run_script


def _number_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: comma-separated numbers") from None
    if not values:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: at least one number")
    return values


def validation_split(n: int, n_val: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices: the split ``bench_models.py`` holds out of train."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=non_negative_int, default=30_000,
                    help="ids incl. <pad> and <unk>, the classifiers' vocabulary (default 30000); 0: every word of "
                         "train+unsup")
    ap.add_argument("--ngram", type=positive_int, default=2, help="largest n-gram order, 1 to 3 (default 2: NBSVM-bi)")
    ap.add_argument("--n-val", type=positive_int, default=2500, help="validation reviews held out of train")
    ap.add_argument("--val-seed", type=non_negative_int, default=0)
    ap.add_argument("--C", type=_number_list, default=[0.1, 0.3, 1.0, 3.0], help="C values searched (picked row)")
    ap.add_argument("--beta", type=_number_list, default=[0.25, 0.5, 1.0], help="β values searched (picked row)")
    ap.add_argument("--limit-docs", type=positive_int, default=None,
                    help="a random subset of train and of test (quick checks; at least 2 × --n-val train reviews)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--probs", type=output_file, default=None, help="write the picked row's probabilities here (.npz)")
    ap.add_argument("--json", type=output_file, default=None, help="also write the table here")
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if not 1 <= args.ngram <= 3:
        ap.error(f"argument --ngram: got {args.ngram}; allowed: 1, 2 or 3")
    if 0 < args.vocab_size < 3:
        ap.error(f"argument --vocab-size: got {args.vocab_size}; allowed: 0 (every word) or an integer >= 3")
    bad_c = [c for c in args.C if not 0 < c < float("inf")]
    bad_b = [b for b in args.beta if not 0 <= b <= 1]
    if bad_c or bad_b:
        ap.error(f"argument {'--C' if bad_c else '--beta'}: got {(bad_c or bad_b)[0]}; allowed: "
                 + ("finite numbers > 0" if bad_c else "numbers in [0, 1]"))
    if args.n_val >= 25_000:         # once "the corpus is empty: no documents", after the paper row was fitted
        ap.error(f"argument --n-val: got {args.n_val}; allowed: fewer than the 25,000 train reviews")
    if args.limit_docs is not None and args.limit_docs < 2 * args.n_val:
        ap.error(f"argument --limit-docs: got {args.limit_docs}; allowed: at least 2 × --n-val = {2 * args.n_val}")
    try:
        check_data_dir(args.data_dir)
    except ValueError as exc:
        ap.error(str(exc))

    from distattn.corpus import get_corpus, tokenize_corpus
    from distattn.models import NBSVMClassifier

    t0 = time.perf_counter()
    tc = tokenize_corpus(get_corpus("imdb", data_dir=args.data_dir))
    vocab = tc.split("train+unsup").vocabulary(max_size=args.vocab_size - 2 if args.vocab_size else None)

    def part(name):
        split = tc.split(name)
        return split.sample(min(args.limit_docs, len(split)), seed=0) if args.limit_docs else split

    train, test = part("train").encode(vocab, oov="negative"), part("test").encode(vocab, oov="negative")
    y, y_test = np.asarray(train.labels), np.asarray(test.labels)
    tr_idx, va_idx = validation_split(len(y), args.n_val, args.val_seed)
    docs, docs_test = train.tokens, test.tokens
    docs_tr, docs_va = docs.take(tr_idx), docs.take(va_idx)
    order = (1, args.ngram)
    print(f"vocabulary {len(vocab):,} ids (train+unsup); train {len(y):,} ({len(tr_idx):,} + {len(va_idx):,} "
          f"validation), test {len(y_test):,}; n-grams {order[0]}..{order[1]}  [{time.perf_counter() - t0:.1f}s]",
          flush=True)

    rows, search = [], []

    def row(name, setting, model, fit_s, val=None):
        acc = float(model.score(docs_test, y_test))
        rows.append({"row": name, **setting, "val_accuracy": val, "test_accuracy": acc, "fit_seconds": fit_s,
                     "n_features": int(model.n_features_)})
        print(f"{name:15s} {setting['loss']:13s} C {setting['C']:<5g} β {setting['beta']:<5g} "
              f"features {model.n_features_:>10,}  val {'-' if val is None else f'{val:.4f}':>6}  "
              f"test {acc:.4f}  ({fit_s:.1f}s)", flush=True)

    t = time.perf_counter()
    paper = NBSVMClassifier(ngram_range=order).fit(docs, y)
    row("paper", {"loss": "squared_hinge", "C": 1.0, "beta": 0.25}, paper, time.perf_counter() - t)

    best = None
    for C in args.C:
        t = time.perf_counter()
        fitted = NBSVMClassifier(ngram_range=order, loss="log", C=C, beta=1.0).fit(docs_tr, y[tr_idx])
        fit_s = time.perf_counter() - t
        for beta in args.beta:
            model = fitted.interpolated(beta)
            val = float(model.score(docs_va, y[va_idx]))
            search.append({"C": C, "beta": beta, "val_accuracy": val})
            print(f"  search: C {C:<5g} β {beta:<5g} val {val:.4f}", flush=True)
            if best is None or val > best[0]:                   # ties: the first in the grid's order
                best = (val, C, beta, model, fit_s)
    val, C, beta, picked, fit_s = best
    setting = {"loss": "log", "C": C, "beta": beta}
    row("picked", setting, picked, fit_s, val)
    t = time.perf_counter()
    refit = NBSVMClassifier(ngram_range=order, loss="log", C=C, beta=beta).fit(docs, y)
    row("picked, refit", setting, refit, time.perf_counter() - t)

    if args.probs:
        from distattn.atomic import atomic_path
        with atomic_path(args.probs, suffix=".npz") as tmp:
            np.savez(tmp, val=picked.predict_proba(docs_va)[:, 1], test=picked.predict_proba(docs_test)[:, 1],
                     val_labels=y[va_idx], test_labels=y_test, val_idx=va_idx)
        print(f"wrote {args.probs}")
    print(f"total {time.perf_counter() - t0:.1f}s")
    result = {"args": vars(args), "vocab_size": len(vocab), "rows": rows, "search": search}
    if args.json:
        from distattn.atomic import write_json
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.exit(run_script(main))
