"""``python -m distattn.stats``: build co-occurrence, PPMI and (optionally) SVD embeddings for
a corpus, print a summary and write the matrices to ``--out``."""

from __future__ import annotations

import argparse
import json
import sys

from distattn.atomic import ensure_writable_dir, jsonable, missing_dirs, remove_empty_dirs
from distattn.memory import max_memory_setting
from distattn.stats.pipeline import StatsConfig, build_statistics


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: …)`` unless the help already names the default (--split, --jobs, the
    counting options: their parser default is a placeholder, None or False)."""

    def _get_help_string(self, action):
        if "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    d = StatsConfig()
    p = argparse.ArgumentParser(prog="python -m distattn.stats", description=__doc__,
                                formatter_class=_DefaultsFormatter)
    p.add_argument("--corpus", default=d.corpus, help="corpus name: imdb, text or paper")
    p.add_argument("--path", default=None, help="with --corpus text: a .txt file, a directory of .txt files, or .jsonl")
    p.add_argument("--split", default=None,
                   help=f"with --corpus imdb: train, test, unsup, joined with + (default: {d.split})")
    p.add_argument("--data-dir", default=None, help="where aclImdb_v1.tar.gz is (else $DISTATTN_DATA_DIR, the cache)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help=f"regular words kept (plus <pad>, <unk>) (default: {d.vocab_size})")
    p.add_argument("--min-count", type=int, default=None,
                   help=f"fewest occurrences a kept word needs (default: {d.min_count})")
    p.add_argument("--window", type=int, default=None,
                   help=f"co-occurrence window: the largest distance between two tokens counted (default: {d.window})")
    p.add_argument("--weighting", default=None, help=f"none or harmonic (1/d) (default: {d.weighting})")
    p.add_argument("--directional", action="store_true", help="count j after i only (default: symmetric)")
    p.add_argument("--oov", default=None, help=f"drop (GloVe) or gap (hyperwords) (default: {d.oov})")
    p.add_argument("--cds", type=float, default=d.cds, help="PPMI context-distribution smoothing")
    p.add_argument("--neg", type=float, default=d.neg, help="PPMI shift log(neg)")
    p.add_argument("--svd-dim", type=int, default=d.svd_dim, help="SVD embedding dimension (0: none)")
    p.add_argument("--eig", type=float, default=d.eig, help="eigenvalue weighting of the SVD embeddings")
    p.add_argument("--evaluate", action="store_true", help="score the embeddings on WordSim-353 and SimLex-999")
    p.add_argument("--out", default=None,
                   help="directory for vocab.json, cooc.npz, ppmi.npz, embeddings.npy (with --svd-dim), stats.json")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--jobs", type=int, default=None, help="threads for counting (default: all CPUs)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.split is not None and args.corpus != "imdb":     # it was silently ignored
        print(f"error: conflicting options: --split is only used with --corpus imdb, not --corpus {args.corpus}",
              file=sys.stderr)
        return 2
    d = StatsConfig()
    # the options that shape the counting, None when not given: the paper corpus's matrix is given
    # as it is, and with it they were ignored (stats.json still claimed them)
    counting = {"--vocab-size": args.vocab_size, "--min-count": args.min_count, "--window": args.window,
                "--weighting": args.weighting, "--directional": args.directional or None, "--oov": args.oov}
    split = d.split if args.split is None else args.split
    cfg = StatsConfig(corpus=args.corpus, path=args.path, split=split if args.corpus == "imdb" else None,
                      data_dir=args.data_dir,
                      vocab_size=d.vocab_size if args.vocab_size is None else args.vocab_size,
                      min_count=d.min_count if args.min_count is None else args.min_count,
                      window=d.window if args.window is None else args.window,
                      weighting=d.weighting if args.weighting is None else args.weighting,
                      symmetric=not args.directional, oov=d.oov if args.oov is None else args.oov,
                      cds=args.cds, neg=args.neg, svd_dim=args.svd_dim, eig=args.eig)
    if args.evaluate and not args.svd_dim:
        print("error: --evaluate needs --svd-dim > 0", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs={args.jobs} is invalid; allowed: an integer >= 1 (omit it for all CPUs)", file=sys.stderr)
        return 2
    try:
        cfg.validate()                   # bad values fail before --out is touched or anything is counted
        max_memory_setting()             # read otherwise only by a memory check, which a cached entry skips
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    given = [option for option, value in counting.items() if value is not None]
    if args.corpus == "paper" and given:
        print(f"error: conflicting options: {given[0]} is only used with --corpus imdb or text, not --corpus paper "
              "(its co-occurrence matrix is given, not counted)", file=sys.stderr)
        return 2
    if args.corpus != "paper" and not args.no_cache:     # the tokenized corpus and the counts are kept there
        from distattn.paths import cache_dir
        cache_root = cache_dir(create=False)
        try:
            ensure_writable_dir(cache_root)
        except OSError as exc:          # it failed as "error: [Errno 17] File exists: ..." once tokenizing began
            print(f"error: cannot write the cache directory {str(cache_root)!r} (set DISTATTN_CACHE_DIR to a "
                  f"writable directory, or pass --no-cache): {exc.strerror or exc}", file=sys.stderr)
            return 2
    fresh = missing_dirs(args.out) if args.out else []
    if args.out:                         # an unwritable --out fails now, not after the counting
        try:
            ensure_writable_dir(args.out)
        except OSError as exc:
            remove_empty_dirs(fresh)
            print(f"error: cannot write to --out {args.out!r}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    try:
        stats = build_statistics(cfg, cache=not args.no_cache, progress=sys.stderr.isatty(), n_jobs=args.jobs)
    except (ValueError, FileNotFoundError, OSError, MemoryError) as exc:
        remove_empty_dirs(fresh)         # an --out made for this run goes again; nothing was written in it
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = stats.summary()
    if not summary.get("cooc_nnz", 1):
        print("warning: the co-occurrence matrix is empty: no two in-vocabulary tokens of one document lie "
              f"within --window {cfg.window} of each other", file=sys.stderr)
    if args.evaluate:
        from distattn.stats.similarity import evaluate_similarity
        # a word whose vector is all zero (it never co-occurred) is out of vocabulary, as in the
        # KeyedVectors export: its pairs scored a cosine of 0 and counted as found
        words = [w if row.any() else None for w, row in zip(stats.vocab.itos, stats.embeddings)]
        summary["similarity"] = {}
        for name in ("wordsim353", "simlex999"):
            try:
                summary["similarity"][name] = evaluate_similarity((stats.embeddings, words), name).as_dict()
            except ValueError as exc:    # e.g. a small vocabulary that holds none of the dataset's pairs
                summary["similarity"][name] = {"error": str(exc)}
                print(f"warning: {name} not scored: {exc}", file=sys.stderr)
    if args.out:
        try:
            summary["written"] = [str(p) for p in stats.save(args.out)]
        except OSError as exc:
            print(f"error: cannot write to --out {args.out!r}: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(jsonable(summary), indent=1))     # strict JSON: an undefined correlation is null, not NaN
    return 0


if __name__ == "__main__":
    from distattn.cli import run_script
    sys.exit(run_script(main))
