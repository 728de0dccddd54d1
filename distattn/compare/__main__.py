"""``python -m distattn.compare``: the whole study in one command.

Loads the corpus, builds the statistics, runs the projection predictors, trains (or loads
cached) models, computes the comparison views, and writes ``<out>/<corpus>-<timestamp>/`` with
``config.json``, ``metrics.json``, ``report.html``, ``figures/``, ``graphs/`` and ``checkpoints/``.
Every stage is cached by a hash of its config; a second identical run reuses them.
"""

from __future__ import annotations

import argparse
import logging
import sys

from distattn.compare.config import DEVICES, PROFILES, CompareConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distattn.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="imdb", help="imdb, text (with --path) or paper (default: imdb)")
    p.add_argument("--path", default=None, help="--corpus text: a .txt file (a document per line), a directory of "
                                                ".txt files, or a .jsonl file with 'text' (and optional 'label')")
    p.add_argument("--data-dir", default=None, help="--corpus imdb: where aclImdb_v1.tar.gz is "
                                                    "(else $DISTATTN_DATA_DIR, else the cache; else it is downloaded)")
    p.add_argument("--profile", default="auto", choices=PROFILES,
                   help="quick: data subset and small models (CPU); full: all data, seed-size models (GPU); "
                        "auto: full on a GPU, else quick (default)")
    p.add_argument("--out", default="runs", help="parent of the run directory (default: runs/)")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-docs", type=int, default=None, help="cap every document set (smoke runs)")
    p.add_argument("--no-models", action="store_true",
                   help="skip model training (statistics, projections and their analysis views only)")
    p.add_argument("--no-cache", action="store_true", help="recompute every stage (the tokenized corpus is still read from the cache)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or stage log")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s",
                        stream=sys.stderr)
    cfg = CompareConfig(corpus=args.corpus, path=args.path, data_dir=args.data_dir, profile=args.profile,
                        out=args.out, seed=args.seed, device=args.device, max_docs=args.max_docs,
                        train_models=not args.no_models)
    from distattn.compare.run import OutputDirError, command_line, run
    # the arguments parsed, not sys.argv: main(argv) called from Python has its host's sys.argv
    command = command_line(sys.argv if argv is None else [__file__, *argv])
    try:
        cfg.validate()
        run_dir = run(cfg, cache=not args.no_cache, progress=not args.quiet, command=command)
    except KeyboardInterrupt:
        if args.no_cache:           # --no-cache neither reads the cache nor resumes: the same command starts over
            print("interrupted: with --no-cache the same command recomputes every stage from the start; run it "
                  "without --no-cache to reuse the models this run finished", file=sys.stderr)
        else:
            print("interrupted: finished stages are cached, and training resumes from its last checkpoint when the "
                  "same command is run again", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, OutputDirError, MemoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import json

    from distattn.compare.report import terminal_table
    metrics = json.loads((run_dir / "metrics.json").read_text())
    print(terminal_table(metrics))
    print(f"report: {run_dir / 'report.html'}")
    return 0


if __name__ == "__main__":
    from distattn.cli import run_script
    sys.exit(run_script(main))
