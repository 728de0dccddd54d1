"""PPMI-SVD embeddings from IMDB against gensim Word2Vec on the same tokens, side by side.

Prints wall times and WordSim-353 / SimLex-999 Spearman scores for both (never asserts).

    python benchmarks/bench_embeddings.py [--max-docs N] [--skip-word2vec]

Settings (issue "Foundation"): PPMI-SVD with window 2, cds 0.75, eig 0.5, dim 300 on all
100,000 IMDB reviews; Word2Vec(vector_size=300, window=5, min_count=5, epochs=5, workers=2).
Both start from the same cached tokenized corpus; each side's time covers its vocabulary,
its counting/training, and (ours) PPMI and SVD.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.environ.get("DISTATTN_DATA_DIR"))
    ap.add_argument("--max-docs", type=int, default=0, help="use a random sample of N reviews (0: all)")
    ap.add_argument("--vocab-size", type=int, default=30_000)
    ap.add_argument("--weighting", default="harmonic", help="harmonic = hyperwords' dynamic window at window 2")
    ap.add_argument("--skip-word2vec", action="store_true")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()

    from distattn.corpus import get_corpus, tokenize_corpus
    from distattn.stats import SVDEmbeddings, cooccurrence, evaluate_similarity, ppmi

    tc = tokenize_corpus(get_corpus("imdb", data_dir=args.data_dir, progress=False))
    if args.max_docs:
        tc = tc.sample(args.max_docs, seed=0)
    print(f"corpus: {len(tc):,} reviews, {tc.n_tokens:,} tokens")
    rows = []

    t0 = time.perf_counter()
    vocab = tc.vocabulary(max_size=args.vocab_size)
    enc = tc.encode(vocab, oov="negative")
    S = cooccurrence(enc, window=2, weighting=args.weighting)
    t1 = time.perf_counter()
    P = ppmi(S, cds=0.75)
    t2 = time.perf_counter()
    emb = SVDEmbeddings(dim=300, eig=0.5, algorithm="randomized", dtype=np.float32).fit(P)
    t3 = time.perf_counter()
    ours = {n: evaluate_similarity((emb.vectors_, vocab.itos), n) for n in ("wordsim353", "simlex999")}
    rows.append({"method": f"PPMI-SVD (window 2 {args.weighting}, cds .75, eig .5, dim 300, vocab {len(vocab.words)})",
                 "seconds": t3 - t0, "detail": f"count {t1 - t0:.1f} s, ppmi {t2 - t1:.1f} s, svd {t3 - t2:.1f} s",
                 **{n: r.as_dict() for n, r in ours.items()}})

    if not args.skip_word2vec:
        from gensim.models import Word2Vec
        types = tc.types
        sentences = [[types[i] for i in doc] for doc in tc.tokens]   # not timed: both sides start from tokens
        t0 = time.perf_counter()
        w2v = Word2Vec(sentences, vector_size=300, window=5, min_count=5, epochs=5, workers=2, seed=0)
        t1 = time.perf_counter()
        theirs = {n: evaluate_similarity(w2v.wv, n) for n in ("wordsim353", "simlex999")}
        rows.append({"method": f"gensim Word2Vec (300, window 5, min_count 5, 5 epochs, 2 workers, vocab {len(w2v.wv)})",
                     "seconds": t1 - t0, "detail": "", **{n: r.as_dict() for n, r in theirs.items()}})

    print(f"\n{'method':<95} {'time s':>8} {'WS353':>7} {'found':>7} {'SimLex':>7} {'found':>7}")
    for r in rows:
        ws, sl = r["wordsim353"], r["simlex999"]
        print(f"{r['method']:<95} {r['seconds']:8.1f} {ws['spearman']:7.4f} {ws['n_found']:>3}/{ws['n_pairs']:<3} "
              f"{sl['spearman']:7.4f} {sl['n_found']:>3}/{sl['n_pairs']:<3}")
        if r["detail"]:
            print(f"   ({r['detail']})")
    if len(rows) == 2:
        print(f"\ntime ratio PPMI-SVD / Word2Vec = {rows[0]['seconds'] / rows[1]['seconds']:.3f} (target <= 0.2)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB; load average {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
