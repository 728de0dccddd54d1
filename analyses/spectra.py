"""SVD spectra of the statistics and of a model's circuits, side by side.

For a corpus: the co-occurrence matrix S, its PPMI, the directional PPMI (text corpora), the
PPMI-SVD word embeddings; for a model: every head's vocabulary-space QK circuit
W_E W_Q (W_E W_K)ᵀ and OV circuit W_E W_V W_O W_U (factored: only the small cores are
decomposed). Prints effective rank, stable rank, energy in the top k and the WeightWatcher
power-law α for each, the principal angles between PPMI's and each QK head's top singular
subspaces, and writes spectra.json and spectra.png.

    python analyses/spectra.py                                   # the paper's toy S, a random model
    python analyses/spectra.py --corpus text --path reviews.txt --k 200 --model lm --out out/spectra
    python analyses/spectra.py --model none --out out/spectra    # statistics only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distattn.analysis import circuit_spectra, spectrum, spectrum_summary, subspace_alignment
from distattn.analysis.sources import build_model, corpus_statistics
from distattn.atomic import jsonable, write_json
from distattn.cli import check_data_dir, non_negative_int, output_dir, positive_int, run_script
from distattn.corpus.registry import check_corpus_options
from distattn.stats import SVDEmbeddings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=["paper", "text", "imdb"], default="paper",
                   help="statistics source (default: paper, the 7-word toy S)")
    p.add_argument("--path", help="--corpus text: a .txt file, a directory of .txt files, or .jsonl")
    p.add_argument("--data-dir", help="--corpus imdb: directory holding aclImdb_v1.tar.gz")
    p.add_argument("--vocab-size", type=positive_int, default=5000, help="most frequent words kept (text corpora)")
    p.add_argument("--window", type=positive_int, default=5, help="co-occurrence window (text corpora)")
    p.add_argument("--k", type=positive_int, default=100,
                   help="top singular values of the sparse statistics (default 100)")
    p.add_argument("--model", choices=["random", "lm", "none"], default="random",
                   help="circuits of a seeded random attention-only model (numpy), a freshly initialised "
                        "distattn.models.TransformerLM, or none")
    p.add_argument("--d-model", type=positive_int, default=32)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--out", type=output_dir, default="out/spectra", help="directory for spectra.json and spectra.png")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:                                                    # once ignored: --path x.txt ran on the paper's toy S
        check_corpus_options(args.corpus, args.path, args.data_dir)
        check_data_dir(args.data_dir)
    except ValueError as exc:
        parser().error(str(exc))
    if args.model != "none" and args.d_model % args.heads:     # once the model's error, after the statistics
        parser().error(f"argument --heads: got {args.heads}; allowed: a divisor of --d-model {args.d_model}")
    stats = corpus_statistics(args.corpus, path=args.path, data_dir=args.data_dir, vocab_size=args.vocab_size,
                              window=args.window)
    n = len(stats.words)
    k = min(args.k, n)
    specs = [spectrum(stats.cooc, k, name="S (co-occurrence)"), spectrum(stats.ppmi, k, name="PPMI")]
    if stats.directional_ppmi is not None:
        specs.append(spectrum(stats.directional_ppmi, k, name="directional PPMI"))
    emb_dim = min(args.d_model, n - 1)
    emb = SVDEmbeddings(dim=emb_dim, normalize=False, algorithm="arpack").fit(stats.ppmi).vectors_
    specs.append(spectrum(emb, name=f"PPMI-SVD embeddings (d={emb_dim})"))
    alignments = {}
    if args.model != "none":
        model = build_model(args.model, n, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                            random_state=args.seed)
        qk = model.qk_circuit(0)
        specs += circuit_spectra(qk, f"QK L0 ({args.model})")
        specs += circuit_spectra(model.ov_circuit(0), f"OV L0 ({args.model})")
        d_head = args.d_model // args.heads
        k_align = max(1, min(d_head, n - 2))
        for h in range(args.heads):
            for side in ("left", "right"):
                a = subspace_alignment(stats.ppmi, qk[h], k_align, side,
                                       algorithm="arpack")
                alignments[f"PPMI vs QK L0 head {h} ({'query' if side == 'left' else 'key'} side)"] = a.to_dict()

    summaries = [spectrum_summary(s, energy_ks=(1, 10, 100)) for s in specs]
    print(f"corpus {stats.name}: vocabulary {n}, top k = {k} for sparse statistics\n")
    print(f"{'matrix':<36} {'shape':>13} {'k':>5} {'σ1':>10} {'eff.rank':>9} {'stable':>8} {'E@10':>6} "
          f"{'α':>6} {'n_tail':>6}")
    for s in summaries:
        pl = s["power_law"] or {}
        e10 = s["energy_fraction"].get(10, s["energy_fraction"].get(1))
        print(f"{s['name']:<36} {str(tuple(s['shape'])):>13} {s['k']:>5}{'*' if s['truncated'] else ' '}"
              f"{s['sigma_max']:>9.3g} {s['effective_rank']:>9.2f} {s['stable_rank']:>8.2f} {e10:>6.3f} "
              f"{pl.get('alpha', float('nan')):>6.2f} {pl.get('n_tail', 0):>6}")
    print("\n* truncated spectrum: stable rank and energy fractions use the exact ‖A‖_F²; effective rank and α "
          "use the values computed. E@10: energy in the top 10 (top 1 if fewer).")
    if alignments:
        print(f"\nsubspace alignment (top {k_align} singular vectors; mean cos² = 1 identical, chance = k/n):")
        for name, a in alignments.items():
            print(f"  {name:<48} mean cos² {a['mean_cos2']:.3f} (chance {a['chance']:.3f}), "
                  f"smallest angle {a['angles_deg'][0]:.1f}°")

    out = Path(args.out)
    write_json(out / "spectra.json", jsonable({"corpus": stats.name, "vocab_size": n, "spectra": summaries,
                                               "alignment": alignments}))     # NaN/inf as null: strict JSON
    from distattn.analysis import figures
    figures.plot_spectra(specs, out / "spectra.png", title=f"Singular values — corpus {stats.name}, model {args.model}",
                         normalize=True)
    print(f"\nwrote {out / 'spectra.json'} and {out / 'spectra.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
