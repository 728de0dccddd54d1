"""How much the IMDB classifiers' validation reviews share movies with their training reviews.

The official split keeps each movie on one side (Maas et al. 2011): a test review is about a
movie no training review is about. The validation reviews that ``benchmarks/bench_models.py`` and
``analyses/ngram_baseline.py`` hold out of train are drawn at random, review by review, so they
are about movies the remaining training reviews also cover. This prints

* the movies of train, test and unsup, and how many they share (from the archive's url lists,
  :func:`distattn.corpus.read_imdb_movie_ids`);
* for that validation split (``--n-val`` reviews, ``default_rng(--val-seed).permutation``), the
  share of validation reviews whose movie is also in the rest of train;
* with ``--nbsvm``: NB logistic regression (uni+bigrams, the baseline's C × β grid) scored on
  that random validation split and on a movie-disjoint one (whole movies drawn at random until
  ``--n-val`` reviews), each beside the test accuracy of the same fit: which one tracks test,
  and what each one's pick scores on test.

    python analyses/movie_overlap.py                  # seconds
    python analyses/movie_overlap.py --nbsvm --json overlap.json   # ~5 min on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from distattn.cli import check_data_dir, non_negative_int, output_file, positive_int, run_script
from distattn.corpus import movie_disjoint_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ngram_baseline import build_parser as baseline_parser  # noqa: E402  (the baseline's grid and vocabulary)
from ngram_baseline import validation_split as random_validation  # noqa: E402  (bench_models' split)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-val", type=positive_int, default=2500, help="validation reviews held out of train")
    ap.add_argument("--val-seed", type=non_negative_int, default=0)
    ap.add_argument("--nbsvm", action="store_true", help="also score NB-LR on both validation splits and on test")
    ap.add_argument("--limit-docs", type=positive_int, default=None,
                    help="--nbsvm: a random subset of train and of test (quick checks; at least 2 × --n-val)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", type=output_file, default=None, help="also write the results here")
    return ap


def overlap(movies: dict[str, np.ndarray], n_val: int, val_seed: int) -> dict:
    sets = {k: set(v) for k, v in movies.items()}
    out = {"movies": {k: len(v) for k, v in sets.items()},
           "shared_movies": {"train&test": len(sets["train"] & sets["test"]),
                             "train&unsup": len(sets["train"] & sets["unsup"]),
                             "test&unsup": len(sets["test"] & sets["unsup"])}}
    train = movies["train"]
    tr, va = random_validation(len(train), n_val, val_seed)
    out["random_validation"] = {"reviews": len(va), "movies": len(set(train[va])),
                                "share_of_reviews_whose_movie_is_in_the_rest_of_train":
                                    float(np.isin(train[va], train[tr]).mean())}
    test_in_train = float(np.isin(movies["test"], train).mean())
    out["test_reviews_whose_movie_is_in_train"] = test_in_train
    print(f"movies: train {out['movies']['train']:,}, test {out['movies']['test']:,}, unsup "
          f"{out['movies']['unsup']:,}; shared: train & test {out['shared_movies']['train&test']}, train & unsup "
          f"{out['shared_movies']['train&unsup']}, test & unsup {out['shared_movies']['test&unsup']}")
    rv = out["random_validation"]
    print(f"random validation ({rv['reviews']:,} reviews of {rv['movies']:,} movies): "
          f"{rv['share_of_reviews_whose_movie_is_in_the_rest_of_train']:.1%} are about a movie the rest of train "
          f"covers; test: {test_in_train:.1%} of its reviews")
    return out


def nbsvm_grid(args, movies_train: np.ndarray) -> dict:
    from scipy.stats import spearmanr

    from distattn.corpus import get_corpus, tokenize_corpus
    from distattn.models import NBSVMClassifier

    grid = baseline_parser().parse_args([])              # the baseline's C × β grid and vocabulary
    tc = tokenize_corpus(get_corpus("imdb", data_dir=args.data_dir))
    vocab = tc.split("train+unsup").vocabulary(max_size=grid.vocab_size - 2)
    train, test = tc.split("train").encode(vocab, oov="negative"), tc.split("test").encode(vocab, oov="negative")
    docs, y, docs_test, y_test = train.tokens, np.asarray(train.labels), test.tokens, np.asarray(test.labels)
    if args.limit_docs:
        rng = np.random.default_rng(0)
        keep = np.sort(rng.permutation(len(y))[:args.limit_docs])
        docs, y, movies_train = docs.take(keep), y[keep], movies_train[keep]
        keep = np.sort(rng.permutation(len(y_test))[:args.limit_docs])
        docs_test, y_test = docs_test.take(keep), y_test[keep]
    splits = {"random": random_validation(len(y), args.n_val, args.val_seed),
              "movie-disjoint": movie_disjoint_split(movies_train, args.n_val, args.val_seed)}
    out = {"grid": [], "picked": {}, "spearman_val_test": {}}
    for name, (tr, va) in splits.items():
        cells = []
        for C in grid.C:
            fitted = NBSVMClassifier(ngram_range=(1, 2), loss="log", C=C, beta=1.0).fit(docs.take(tr), y[tr])
            for beta in grid.beta:
                model = fitted.interpolated(beta)
                cell = {"validation": name, "C": C, "beta": beta, "n_val": len(va),
                        "val_accuracy": float(model.score(docs.take(va), y[va])),
                        "test_accuracy": float(model.score(docs_test, y_test))}
                cells.append(cell)
                print(f"  {name:15s} C {C:<5g} β {beta:<5g} val {cell['val_accuracy']:.4f}  "
                      f"test {cell['test_accuracy']:.4f}", flush=True)
        best = max(cells, key=lambda c: c["val_accuracy"])          # ties: the first in the grid's order
        rho = spearmanr([c["val_accuracy"] for c in cells], [c["test_accuracy"] for c in cells]).statistic
        out["grid"] += cells
        out["picked"][name] = best
        out["spearman_val_test"][name] = None if np.isnan(rho) else float(rho)
        print(f"{name} validation ({len(va):,} reviews): picks C {best['C']:g} β {best['beta']:g}, val "
              f"{best['val_accuracy']:.4f} → test {best['test_accuracy']:.4f} (val − test "
              f"{best['val_accuracy'] - best['test_accuracy']:+.4f}); Spearman(val, test) over the grid "
              f"{out['spearman_val_test'][name]}", flush=True)
    return out


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.limit_docs is not None and not args.nbsvm:
        ap.error("argument --limit-docs: only with --nbsvm")
    if args.limit_docs is not None and args.limit_docs < 2 * args.n_val:
        ap.error(f"argument --limit-docs: got {args.limit_docs}; allowed: at least 2 × --n-val = {2 * args.n_val}")
    if args.n_val >= 25_000:
        ap.error(f"argument --n-val: got {args.n_val}; allowed: fewer than the 25,000 train reviews")
    try:
        check_data_dir(args.data_dir)
    except ValueError as exc:
        ap.error(str(exc))

    from distattn.corpus import ImdbCorpus
    from distattn.corpus.imdb import EXPECTED_COUNTS, SPLITS

    t0 = time.perf_counter()
    ids = np.asarray(ImdbCorpus(split="+".join(SPLITS), data_dir=args.data_dir).movie_ids())   # one archive read
    sizes = dict.fromkeys(SPLITS, 0)                   # reviews per split; the ids come in SPLITS order
    for (top, sub), n in EXPECTED_COUNTS.items():
        sizes["unsup" if sub == "unsup" else top] += n
    movies = dict(zip(SPLITS, np.split(ids, np.cumsum([sizes[s] for s in SPLITS])[:-1])))
    result = {"args": vars(args), **overlap(movies, args.n_val, args.val_seed)}
    if args.nbsvm:
        result["nbsvm"] = nbsvm_grid(args, movies["train"])
    print(f"total {time.perf_counter() - t0:.1f}s")
    if args.json:
        from distattn.atomic import write_json
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.exit(run_script(main))
