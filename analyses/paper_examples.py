"""Print the worked examples of the projection paper (sections 2.5 and 3.2) with distattn.

For each example sequence: the selector Q, the association profiles QS, M = Q S Qᵀ, Norm(M),
the evidence E = M (QS), e_global and the next-token distribution softmax(e_global / τ).
Where the paper's prose disagrees with these numbers, see corpora/paper/ERRATA.md.

    python analyses/paper_examples.py
    python analyses/paper_examples.py --example bank_loan --decimals 3 --normalization row
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from distattn.cli import run_script
from distattn.corpus.paper import load_paper_corpus
from distattn.projection import (association_profiles, context_matrix, global_evidence, next_token_distribution,
                                 row_normalize, selector, vocabulary_evidence)


def show(name: str, matrix, rows, cols, decimals: int) -> None:
    matrix = np.atleast_2d(matrix.toarray() if hasattr(matrix, "toarray") else np.asarray(matrix))
    width = max(8, decimals + 6)
    print(f"\n{name}")
    print(" " * 9 + "".join(f"{c:>{width}}" for c in cols))
    for label, row in zip(rows, matrix):
        print(f"{label:>9}" + "".join(f"{x:>{width}.{decimals}f}" for x in row))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    paper = load_paper_corpus()
    parser.add_argument("--example", choices=sorted(paper.examples), action="append",
                        help="example to print (repeatable; default: all)")
    parser.add_argument("--decimals", type=int, default=2, help="decimals printed (default 2, as in the paper)")
    parser.add_argument("--temperature", type=float, default=1.0, help="τ of the output softmax (paper: 1)")
    parser.add_argument("--normalization", choices=["none", "row", "softmax"], default="none",
                        help="attention mixing the profiles in E (paper: none, i.e. raw M)")
    args = parser.parse_args(argv)
    if not 0 <= args.decimals <= 15:
        parser.error(f"--decimals must be an integer from 0 to 15; got {args.decimals}")
    if not 0 < args.temperature < float("inf"):     # the library's check, before any table is printed
        raise ValueError(f"temperature must be a finite real number > 0; got {args.temperature!r}")

    words, S = paper.words, paper.cooc
    show("S (co-occurrence operator, section 2.5)", S, words, words, 0)
    for name in args.example or list(paper.examples):
        ids = paper.encode(name)
        seq = paper.examples[name]
        print(f"\n{'=' * 72}\n{name.replace('_', ' ')!r}: token ids {ids.tolist()}")
        show("Q (selector)", selector(ids, len(words)), seq, words, 0)
        show("QS (association profiles)", association_profiles(ids, S), seq, words, 0)
        show("M = Q S Qᵀ", context_matrix(ids, S), seq, seq, 0)
        show("Norm(M)", row_normalize(context_matrix(ids, S)), seq, seq, args.decimals)
        show(f"E = A (QS), A = {args.normalization}", vocabulary_evidence(ids, S, normalization=args.normalization),
             seq, words, args.decimals if args.normalization != "none" else 0)
        e = global_evidence(ids, S, normalization=args.normalization)
        show("e_global (mean of E's rows)", e, ["e_global"], words, args.decimals)
        p = next_token_distribution(ids, S, temperature=args.temperature, normalization=args.normalization)
        show(f"softmax(e_global / {args.temperature:g})", p, ["p"], words, args.decimals)
        print(f"\nprediction: {words[int(np.argmax(p))]!r} (p = {p.max():.8f})")


if __name__ == "__main__":
    sys.exit(run_script(main))
