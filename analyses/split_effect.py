"""How much do the split and the tokenizer move IMDB accuracy? A bag-of-words proxy for the seed gap.

The seed (000_48942d33924f2728.txt) reports 86.18 % on "the IMDB Dataset of 50K Movie Reviews",
the Kaggle copy of the same 50k labelled reviews, which is usually split at random. The official
aclImdb split keeps each movie's reviews on one side; a random split does not, and a 40k/10k
split also trains on more reviews. Training the transformer under each setting needs a GPU, so
this script measures the same contrasts with a cheap stand-in: logistic regression on binary
bag-of-words over the first ``--max-len`` tokens, vocabulary = the 30k most frequent words of the
training side, for the toolkit's tokenizer and the seed's literal one.

    python analyses/split_effect.py                      # ~1 min on 2 cores; prints a table
    python analyses/split_effect.py --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression

from distattn.cli import check_data_dir, non_negative_int, output_file, run_script
from distattn.corpus import RegexTokenizer, SeedLiteralTokenizer, get_corpus, tokenize_corpus

TOKENIZERS = {"toolkit": RegexTokenizer, "seed-literal": SeedLiteralTokenizer}


def bag_of_words(enc, n_features: int) -> sparse.csr_matrix:
    """Binary document × word matrix (OOV ids < 0 dropped), without a per-token Python loop."""
    ids, lengths = enc.tokens.ids, enc.tokens.lengths
    rows = np.repeat(np.arange(len(lengths)), lengths)
    keep = ids >= 0
    X = sparse.csr_matrix((np.ones(int(keep.sum())), (rows[keep], ids[keep])), shape=(len(lengths), n_features))
    X.sum_duplicates()
    X.data[:] = 1.0
    return X


def splits(tc, seed: int) -> dict:
    """Index pairs (train, test): the official split and two random splits of the same reviews."""
    is_train = tc.docs.split_mask("train")
    n = len(tc)
    perm = np.random.default_rng(seed).permutation(n)
    return {"official (train → test)": (np.flatnonzero(is_train), np.flatnonzero(~is_train)),
            "random, same sizes": (np.sort(perm[: n // 2]), np.sort(perm[n // 2:])),
            "random 80/20": (np.sort(perm[: n * 4 // 5]), np.sort(perm[n * 4 // 5:]))}


def run(tc, train_idx, test_idx, max_len: int, vocab_size: int, C: float) -> dict:
    tr, te = tc.take(train_idx), tc.take(test_idx)
    vocab = tr.vocabulary(max_size=vocab_size - 2)
    Xtr = bag_of_words(tr.encode(vocab, oov="negative").truncate(max_len), len(vocab))
    enc_te = te.encode(vocab, oov="negative").truncate(max_len)
    Xte = bag_of_words(enc_te, len(vocab))
    clf = LogisticRegression(C=C, max_iter=2000).fit(Xtr, tr.labels)
    return {"accuracy": float(clf.score(Xte, te.labels)), "n_train": len(train_idx), "n_test": len(test_idx),
            "test_token_coverage": float((enc_te.tokens.ids >= 0).mean())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-len", type=int, default=256, help="tokens kept per review (the seed's max_len)")
    ap.add_argument("--vocab-size", type=int, default=30_000)
    ap.add_argument("--C", type=float, default=0.1, help="inverse L2 strength of the logistic regression")
    ap.add_argument("--seed", type=non_negative_int, default=42, help="seed of the random splits")
    ap.add_argument("--limit-docs", type=int, default=None, help="a random subset of the 50k reviews (quick checks)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", type=output_file, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    if args.max_len < 1 or args.vocab_size < 3:
        ap.error(f"--max-len must be >= 1 and --vocab-size >= 3; got {args.max_len}, {args.vocab_size}")
    if not (args.C > 0 and args.C < float("inf")):                # once refused by scikit-learn after tokenizing
        ap.error(f"argument --C: got {args.C}; allowed: a finite number > 0")
    if args.limit_docs is not None and args.limit_docs < 20:   # 0 once meant all 50k reviews; 3 a scikit-learn error
        ap.error(f"argument --limit-docs: got {args.limit_docs}; allowed: an integer >= 20 (each split needs "
                 "reviews on both sides)")
    try:
        check_data_dir(args.data_dir)
    except ValueError as exc:
        ap.error(str(exc))

    rows = []
    for name, make in TOKENIZERS.items():
        t = time.perf_counter()
        tc = tokenize_corpus(get_corpus("imdb", split="train+test", data_dir=args.data_dir, progress=False),
                             tokenizer=make())
        if args.limit_docs:
            tc = tc.sample(args.limit_docs, seed=0)
        for split_name, (a, b) in splits(tc, args.seed).items():
            r = run(tc, a, b, args.max_len, args.vocab_size, args.C)
            rows.append({"tokenizer": name, "split": split_name, **r})
            print(f"{name:13s} {split_name:24s} train {r['n_train']:6d} test {r['n_test']:6d}  "
                  f"accuracy {r['accuracy']:.4f}  test-token coverage {r['test_token_coverage']:.3f}", flush=True)
        print(f"  ({name}: {time.perf_counter() - t:.1f}s)", flush=True)
    if args.json:
        from distattn.atomic import write_json
        write_json(args.json, {"args": vars(args), "rows": rows})
    return rows


if __name__ == "__main__":
    sys.exit(run_script(main))
