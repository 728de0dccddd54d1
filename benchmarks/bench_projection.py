"""Throughput of the causal projection predictor (predicted positions per second).

A synthetic corpus (Zipfian vocabulary with topical documents) gives a realistic sparse PPMI
(window 5, context smoothing 0.75) of ``--vocab-size`` words; held-out documents are then
scored causally (every position predicts the next token from its prefix only) by

* the fused numba kernel (``ProjectionPredictor().score_next_tokens``, the default path of
  ``evaluate_next_token``),
* the generic path (``next_token_logits`` per document, then the shared scoring kernel),
* a naive reference: ``next_token_distribution`` recomputed from scratch for every prefix,
* the torch path on the GPU, when CUDA is present,

all in the same process, with their log-likelihoods checked against each other.

With ``--imdb`` the operator is the real IMDB PPMI instead (the statistics pipeline: vocabulary
of ``--vocab-size`` words and co-occurrence window 10, harmonic weighting, from train+unsup;
PPMI with context smoothing 0.75), and the held-out documents are test reviews (a fixed-seed
sample of about ``--heldout-tokens`` tokens; OOV tokens are skipped in the context and as
targets).

    python benchmarks/bench_projection.py                 # vocab 30k, the lead's target case
    python benchmarks/bench_projection.py --tokens 300000 --vocab-size 5000   # quick
    python benchmarks/bench_projection.py --imdb          # real IMDB PPMI, test reviews
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from distattn.corpus.ragged import RaggedIds
from distattn.projection import ProjectionPredictor, evaluate_next_token, next_token_distribution
from distattn.stats import cooccurrence, ppmi


def synthetic_corpus(vocab_size: int, n_tokens: int, mean_length: float, seed: int,
                     n_topics: int = 200, topic_words: int = 300, topic_share: float = 0.35) -> RaggedIds:
    """Zipf(1.05) background plus one topic per document (a random subset of words)."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, vocab_size + 1) ** 1.05
    zipf /= zipf.sum()
    topics = rng.integers(0, vocab_size, size=(n_topics, topic_words))
    lengths = np.maximum(2, rng.lognormal(np.log(mean_length) - 0.3, 0.77, size=int(n_tokens / mean_length) + 1)
                         .astype(np.int64))
    lengths = lengths[np.cumsum(lengths) <= n_tokens] if lengths.sum() > n_tokens else lengths
    n = int(lengths.sum())
    doc_topic = np.repeat(rng.integers(0, n_topics, size=lengths.size), lengths)
    background = rng.choice(vocab_size, size=n, p=zipf)
    topical = topics[doc_topic, np.minimum(rng.zipf(1.3, size=n) - 1, topic_words - 1)]
    ids = np.where(rng.random(n) < topic_share, topical, background).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return RaggedIds(ids, offsets)


def naive_logp(S, docs: RaggedIds, max_positions: int) -> tuple[np.ndarray, float]:
    """log p(target) from scratch for every prefix (the reference), and its positions/s.

    Positions follow the evaluator's order: those with an in-vocabulary target (id >= 0); a
    prefix without an in-vocabulary token predicts the uniform distribution."""
    out, t0 = [], time.perf_counter()
    for doc in docs:
        for t in range(len(doc) - 1):
            if doc[t + 1] < 0:
                continue
            if (doc[:t + 1] >= 0).any():
                out.append(next_token_distribution(doc[:t + 1], S, log=True)[doc[t + 1]])
            else:
                out.append(-np.log(S.shape[0]))
            if len(out) == max_positions:
                return np.array(out), len(out) / (time.perf_counter() - t0)
    return np.array(out), len(out) / (time.perf_counter() - t0)


def imdb_operator(vocab_size: int, heldout_tokens: int, seed: int):
    """The IMDB PPMI of the statistics pipeline (train+unsup, window 10 harmonic, cds 0.75)
    and a fixed-seed sample of test reviews holding about ``heldout_tokens`` tokens."""
    from distattn.corpus import get_corpus, tokenize_corpus
    from distattn.stats.pipeline import StatsConfig, build_statistics

    config = StatsConfig(corpus="imdb", split="train+unsup", vocab_size=vocab_size, window=10,
                         weighting="harmonic", cds=0.75)
    stats = build_statistics(config, progress=False)
    tc = tokenize_corpus(get_corpus("imdb", progress=False))
    test = tc.split("test").encode(stats.vocab, oov="negative").tokens
    order = np.random.default_rng(seed).permutation(len(test))
    n = int(np.searchsorted(np.cumsum(test.lengths[order]), heldout_tokens)) + 1
    heldout = test.take(np.sort(order[:n]))
    desc = (f"IMDB train+unsup ({stats.n_docs:,} reviews, {stats.n_tokens:,} tokens), vocabulary {len(stats.vocab):,} "
            f"({vocab_size:,} words + specials), window 10 harmonic, cds 0.75")
    return stats.ppmi, heldout, desc


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=30_000)
    parser.add_argument("--tokens", type=int, default=3_000_000, help="training tokens for the PPMI")
    parser.add_argument("--heldout-tokens", type=int, default=40_000)
    parser.add_argument("--mean-length", type=float, default=230.0, help="mean document length (IMDB ~ 230)")
    parser.add_argument("--naive-positions", type=int, default=300)
    parser.add_argument("--generic-positions", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-gpu", action="store_true")
    parser.add_argument("--imdb", action="store_true",
                        help="the real IMDB PPMI (train+unsup) and test reviews instead of the synthetic corpus")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    if args.imdb:
        S, heldout, desc = imdb_operator(args.vocab_size, args.heldout_tokens, args.seed)
    else:
        train = synthetic_corpus(args.vocab_size, args.tokens, args.mean_length, args.seed)
        heldout = synthetic_corpus(args.vocab_size, args.heldout_tokens, args.mean_length, args.seed + 1)
        S = ppmi(cooccurrence(train, args.vocab_size, window=5), cds=0.75)
        desc = f"synthetic, {train.n_tokens:,} training tokens, window 5, cds 0.75"
    V = S.shape[0]
    nnz_row = np.diff(S.indptr)
    known = heldout.ids[heldout.ids >= 0]
    freq = np.bincount(known, minlength=V)
    print(f"corpus: {desc}; PPMI {V:,}^2 with {S.nnz:,} nonzeros "
          f"(mean {nnz_row.mean():.0f}/row, token-weighted {np.average(nnz_row, weights=freq):.0f}/row); "
          f"held-out {len(heldout)} docs, {heldout.n_tokens:,} tokens ({heldout.n_tokens - known.size:,} OOV)  "
          f"[{time.perf_counter() - t0:.1f}s]")

    model = ProjectionPredictor().fit(S)
    small = heldout.take(np.arange(2))
    evaluate_next_token(model, small)                                  # numba compilation
    t0 = time.perf_counter()
    report, logp, _ = evaluate_next_token(model, heldout, return_scores=True)
    fused_s = time.perf_counter() - t0
    print(f"fused numba kernel  : {report.n_predictions / fused_s:12,.0f} positions/s "
          f"({report.n_predictions:,} positions in {fused_s:.2f}s; top-10 accuracy {report.top10_accuracy:.3f})")

    class Generic:  # hides score_next_tokens, so the evaluator takes the generic path
        vocab_size = V

        def next_token_logits(self, ids):
            return model.next_token_logits(ids)

    t0 = time.perf_counter()
    rep_g, logp_g, _ = evaluate_next_token(Generic(), heldout, max_predictions=args.generic_positions,
                                           return_scores=True)
    generic_s = time.perf_counter() - t0
    ok = ~np.isnan(logp_g)
    print(f"generic logits path : {rep_g.n_predictions / generic_s:12,.0f} positions/s "
          f"(max |dlogp| vs fused {np.nanmax(np.abs(logp_g[ok] - logp[:logp_g.size][ok])):.1e})")

    ref, naive_rate = naive_logp(S, heldout, args.naive_positions)
    fused_first = logp[~np.isnan(logp)][:ref.size]
    print(f"naive reference     : {naive_rate:12,.0f} positions/s "
          f"(max |dlogp| vs fused {np.max(np.abs(ref - fused_first)):.1e} over {ref.size} positions)")
    print(f"speed-up fused/naive: {report.n_predictions / fused_s / naive_rate:12,.0f}x")

    if not args.no_gpu:
        import torch
        if torch.cuda.is_available():
            gpu = ProjectionPredictor(device="cuda").fit(S)
            evaluate_next_token(gpu, small)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            rep_t, logp_t, _ = evaluate_next_token(gpu, heldout, return_scores=True)
            torch.cuda.synchronize()
            gpu_s = time.perf_counter() - t0
            ok = ~np.isnan(logp)
            print(f"torch {torch.cuda.get_device_name()}: {rep_t.n_predictions / gpu_s:12,.0f} positions/s "
                  f"(max |dlogp| vs fused {np.max(np.abs(logp_t[ok] - logp[ok])):.1e})")
        else:
            print("torch GPU           : CUDA not available, skipped")


if __name__ == "__main__":
    main()
