"""The corpus-derived positional projection (Q+P)S(Q+P)ᵀ for many sequences: the per-sequence
:func:`~distattn.projection.positional_context_matrix` (sparse P times sparse S for every
sequence) beside :class:`~distattn.projection.CorpusPositional` (the position-only products
once, then gathers), in the same process, at the compare profile's analysis sizes (IMDB PPMI,
``analysis_len`` tokens per test review). Prints seconds per sequence and the largest relative
difference of the two results.

    python benchmarks/bench_positional.py                  # the full profile's sizes
    python benchmarks/bench_positional.py --profile quick --sequences 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from distattn.compare.config import PROFILE_SIZES, CompareConfig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="full", choices=sorted(PROFILE_SIZES))
    parser.add_argument("--sequences", type=int, default=3, help="sequences timed with the per-sequence reference")
    args = parser.parse_args(argv)

    from distattn.compare.stages import load_data, stage_statistics
    from distattn.projection import (CorpusPositional, corpus_position_matrix, positional_context_matrix,
                                     positional_distributions)
    sizes = PROFILE_SIZES[args.profile]
    data = load_data(CompareConfig(corpus="imdb", profile=args.profile), sizes, progress=False)
    stats = stage_statistics(data, sizes)
    V = len(data.vocab)
    pi = positional_distributions(data.stat_neg, V, sizes.analysis_len)
    seqs = [data.test_neg[i][:sizes.analysis_len] for i in range(args.sequences)]
    t = time.perf_counter()
    ref = [positional_context_matrix(s, stats.P, corpus_position_matrix(pi, s.size)) for s in seqs]
    t_ref = (time.perf_counter() - t) / len(seqs)
    t = time.perf_counter()
    pos = CorpusPositional(stats.P, pi)
    t_build = time.perf_counter() - t
    t = time.perf_counter()
    got = [pos(s) for s in seqs]
    t_new = (time.perf_counter() - t) / len(seqs)
    err = max(np.max(np.abs(a.total - b.total)) / np.max(np.abs(a.total)) for a, b in zip(ref, got))
    print(f"profile {args.profile}: PPMI {V:,}^2 with {stats.P.nnz:,} non-zeros, sequences of {sizes.analysis_len} "
          f"tokens")
    print(f"positional_context_matrix per sequence : {t_ref:8.2f} s")
    print(f"CorpusPositional                       : {t_build:8.2f} s once, then {t_new * 1e3:.2f} ms per sequence "
          f"(max relative difference {err:.1e})")
    n = sizes.analysis_seqs
    print(f"the profile's {n} sequences            : {t_ref * n:8.0f} s before, {t_build + t_new * n:.1f} s after")


if __name__ == "__main__":
    main()
