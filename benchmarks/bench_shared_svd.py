"""One SVD per statistics matrix, shared by the stages, against one SVD per use (the old way).

``python -m distattn.compare`` needs truncated SVDs of PPMI and of directional PPMI in four
places: the PPMI-SVD embeddings (statistics), the multi-head and asymmetric projections, and
the spectra (analysis). The statistics stage now factorises each matrix once, at the largest
rank any stage asks for, and the others take prefixes. This script times both ways on the
same matrices, in one process, and checks that they agree.

    python benchmarks/bench_shared_svd.py                 # the full profile's sizes (IMDB, 30k words)
    python benchmarks/bench_shared_svd.py --profile quick
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="full", choices=("quick", "full"))
    args = parser.parse_args(argv)

    import torch

    from distattn import analysis as A
    from distattn.compare.config import CompareConfig
    from distattn.compare.stages import clamp_rank, load_data, svd_ranks, top_svd
    from distattn.projection import directional_factors, svd_heads
    from distattn.stats import SVDEmbeddings, cooccurrence, ppmi

    cfg = CompareConfig(corpus="imdb", profile=args.profile, device="cpu", train_models=False).validate()
    sizes = cfg.sizes()
    data = load_data(cfg, sizes, progress=False)
    V = len(data.vocab)
    P = ppmi(cooccurrence(data.stat_neg, V, window=sizes.window, weighting="harmonic"), cds=0.75)
    P_dir = ppmi(cooccurrence(data.stat_neg, V, window=sizes.window, weighting="harmonic", symmetric=False), cds=0.75)
    dim, k, d_k = clamp_rank(sizes.svd_dim, V), clamp_rank(sizes.spectrum_k, V), clamp_rank(sizes.asym_rank, V)
    n_heads = min(sizes.heads[0], clamp_rank(sizes.heads[0], V))
    head_rank = clamp_rank(sizes.heads[1], V // n_heads)
    print(f"profile {args.profile}: PPMI {V:,}^2 ({P.nnz:,} non-zeros), directional PPMI ({P_dir.nnz:,}); "
          f"embeddings {dim}, heads {n_heads}x{head_rank}, d_k {d_k}, spectrum k {k}; torch threads "
          f"{torch.get_num_threads()}")

    t0 = time.perf_counter()
    times = {}
    t = time.perf_counter()
    emb_old = SVDEmbeddings(dim=dim, eig=0.5, dtype=np.float32).fit(P).vectors_
    times["embeddings (SVD of PPMI)"] = time.perf_counter() - t
    t = time.perf_counter()
    heads_old = svd_heads(P, n_heads, head_rank, algorithm="randomized")
    times["multi-head projection (SVD of PPMI)"] = time.perf_counter() - t
    t = time.perf_counter()
    WQ_old, WK_old = directional_factors(P_dir, d_k, algorithm="randomized")
    times["asymmetric projection (SVD of directional PPMI)"] = time.perf_counter() - t
    t = time.perf_counter()
    spec_P_old = A.spectrum(P, k, name="PPMI")
    times["spectrum of PPMI"] = time.perf_counter() - t
    t = time.perf_counter()
    spec_D_old = A.spectrum(P_dir, k, name="directional PPMI")
    times["spectrum of directional PPMI"] = time.perf_counter() - t
    old_total = time.perf_counter() - t0

    t0 = time.perf_counter()
    rank_P, rank_D = svd_ranks(sizes, V)
    t = time.perf_counter()
    svd_P = top_svd(P, rank_P)
    t_P = time.perf_counter() - t
    t = time.perf_counter()
    svd_D = top_svd(P_dir, rank_D)
    t_D = time.perf_counter() - t
    heads_new = svd_heads(P, n_heads, head_rank, svd=svd_P.triple())
    WQ_new, WK_new = directional_factors(P_dir, d_k, svd=svd_D.triple())
    new_total = time.perf_counter() - t0

    print("\none SVD per use (before):")
    for name, sec in times.items():
        print(f"  {name:<50} {sec:7.1f}s")
    print(f"  {'total':<50} {old_total:7.1f}s")
    print("one SVD per matrix (now):")
    print(f"  {f'PPMI, rank {rank_P}':<50} {t_P:7.1f}s")
    print(f"  {f'directional PPMI, rank {rank_D}':<50} {t_D:7.1f}s")
    print(f"  {'total (the prefixes cost nothing)':<50} {new_total:7.1f}s")
    print(f"speed-up {old_total / new_total:.2f}x")

    # accuracy: both ways against an exact (ARPACK) SVD, with basis-free measures (within a
    # cluster of near-equal singular values any orthonormal basis is as good)
    from distattn.stats.embeddings import truncated_svd
    t = time.perf_counter()
    uP, sP, vtP = truncated_svd(P, rank_P, algorithm="arpack")
    uD, sD, vtD = truncated_svd(P_dir, rank_D, algorithm="arpack")
    print(f"\naccuracy against ARPACK (exact to solver tolerance; {time.perf_counter() - t:.1f}s):")
    top = np.argsort(-np.bincount(np.maximum(data.stat_neg.ids, 0), minlength=V))[:2000]
    top = top[top > 1]

    def cosines(E):
        E = np.asarray(E, dtype=np.float64)[top]
        E = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-30)
        return (E @ E.T)[np.triu_indices(len(top), 1)]
    exact_cos = cosines(uP[:, :dim] * np.sqrt(sP[:dim]))
    emb_new = svd_P.u[:, :dim] * np.sqrt(svd_P.s[:dim])
    for name, E in (("before", emb_old), ("now", emb_new)):
        c = cosines(E)
        print(f"  embeddings {name:>6}: word-pair cosines of the {len(top)} most frequent words, "
              f"max |error| {np.max(np.abs(c - exact_cos)):.2e}, Pearson r {np.corrcoef(c, exact_cos)[0, 1]:.6f}")

    def op_error(pairs, u, s, vt, r, cols):
        ref = (u[:, :r] * s[:r]) @ vt[:r, cols]
        got = sum(a[:, None] if a.ndim == 1 else a for a in [q @ k[cols].T for q, k in pairs])
        return np.linalg.norm(got - ref) / np.linalg.norm(ref)
    cols = top[:500]
    r_heads = n_heads * head_rank
    for name, heads in (("before", heads_old), ("now", heads_new)):
        err = op_error([(h.query, h.key) for h in heads], uP, sP, vtP, r_heads, cols)
        print(f"  multi-head {name:>6}: sum of the {n_heads} head operators vs the exact rank-{r_heads} "
              f"truncation (500 frequent key columns): relative error {err:.2e}")
    for name, (WQ, WK) in (("before", (WQ_old, WK_old)), ("now", (WQ_new, WK_new))):
        err = op_error([(WQ, WK)], uD, sD, vtD, d_k, cols)
        print(f"  asymmetric {name:>6}: W_Q W_Kᵀ vs the exact rank-{d_k} truncation: relative error {err:.2e}")
    for name, old, new, exact in (("PPMI", spec_P_old.singular_values, svd_P.s[:k], sP[:k]),
                                  ("directional PPMI", spec_D_old.singular_values, svd_D.s[:k], sD[:k])):
        print(f"  spectrum of {name}: max relative error of the top {k} values: before "
              f"{np.max(np.abs(old - exact) / exact):.2e}, now {np.max(np.abs(new - exact) / exact):.2e}")

if __name__ == "__main__":
    main()
