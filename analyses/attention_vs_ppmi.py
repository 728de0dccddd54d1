"""Is learned attention projected co-occurrence? One corpus, one model, every view.

1. Circuits: Spearman ρ between each head's vocabulary-space QK scores and PPMI over ordered
   pairs of the top-N frequent words (all pairs, and PPMI > 0 pairs), symmetric PPMI and, for
   text corpora, directional PPMI matched as "key before query".
2. Agreement on sequences: every head's attention against the projection Norm(Q S Qᵀ) (and the
   directional Norm(Q Dᵀ Qᵀ)), with the uniform and previous-token baselines (JS, Spearman, top-1).
3. Kernels (first sequence): CKA between the projection M, the heads' attention and linear / RBF
   kernels of PPMI-SVD token vectors; PSD checks.
4. Graphs: PageRank, entropy and spectral gap of the projection and of each layer-0 head;
   attention rollout and flow over the model's layers; a GraphML file; the PPMI sense
   communities of --word.

Writes report.json, figures (heatmaps.png, graph.png, cka.png, agreement.png) and
attention.graphml into --out.

    python analyses/attention_vs_ppmi.py                                   # paper toy S, random model
    python analyses/attention_vs_ppmi.py --corpus text --path reviews.txt --model lm --word bank
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from distattn.analysis import (attention_agreement, attention_flow, attention_graph, attention_rollout, cka_matrix,
                               graph_metrics, head_agreement, linear_kernel, psd_check, qk_pmi_correlation,
                               rbf_kernel, sense_communities, top_frequent_ids, write_graphml)
from distattn.analysis.sources import build_model, corpus_statistics
from distattn.atomic import jsonable, write_json
from distattn.cli import check_data_dir, non_negative_int, output_dir, positive_int, run_script
from distattn.corpus.registry import check_corpus_options
from distattn.corpus.vocabulary import UNK
from distattn.projection import context_matrix, row_normalize
from distattn.stats import SVDEmbeddings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=["paper", "text", "imdb"], default="paper")
    p.add_argument("--path", help="--corpus text: a .txt file, a directory of .txt files, or .jsonl")
    p.add_argument("--data-dir", help="--corpus imdb: directory holding aclImdb_v1.tar.gz")
    p.add_argument("--vocab-size", type=positive_int, default=5000)
    p.add_argument("--window", type=positive_int, default=5)
    p.add_argument("--sequences", type=positive_int, default=8, help="documents compared (text corpora)")
    p.add_argument("--max-len", type=positive_int, default=48, help="tokens per sequence")
    p.add_argument("--top-n", type=positive_int, default=500, help="most frequent words in the QK–PMI correlation")
    p.add_argument("--model", choices=["random", "lm"], default="random",
                   help="seeded random attention-only model (numpy) or a freshly initialised TransformerLM")
    p.add_argument("--d-model", type=positive_int, default=32)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--diagonal", choices=["keep", "drop"], default="keep",
                   help="compare attention to the query's own position or not")
    p.add_argument("--word", default="bank", help="word whose PPMI neighbourhood is split into senses")
    p.add_argument("--out", type=output_dir, default="out/attention_vs_ppmi")
    return p


def label(words, ids):
    return [words[i] if i >= 0 else "<oov>" for i in ids]


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:                                                    # once ignored: --path x.txt ran on the paper's toy S
        check_corpus_options(args.corpus, args.path, args.data_dir)
        check_data_dir(args.data_dir)
    except ValueError as exc:
        parser().error(str(exc))
    if args.d_model % args.heads:                 # once the model's own error, after the statistics were built
        parser().error(f"argument --heads: got {args.heads}; allowed: a divisor of --d-model {args.d_model}")
    for option, value in (("--max-len", args.max_len), ("--top-n", args.top_n)):
        if value < 2:                                       # once "head_patterns is empty" / "word_ids must be ..."
            parser().error(f"argument {option}: got {value}; allowed: an integer >= 2")
    out = Path(args.out)
    stats = corpus_statistics(args.corpus, path=args.path, data_dir=args.data_dir, vocab_size=args.vocab_size,
                              window=args.window, n_sequences=args.sequences, max_len=args.max_len)
    usable = [s for s in stats.sequences if len(s) >= 2 and (s >= 0).any()]   # all-OOV: nothing to project
    if not usable:
        raise ValueError(f"none of the first {len(stats.sequences)} documents has 2 or more tokens (--max-len "
                         f"{args.max_len}) with one in the vocabulary (--vocab-size {args.vocab_size}); the attention "
                         "views need sequences of at least 2 tokens")
    words, n = stats.words, len(stats.words)
    regular = words[stats.n_specials:]
    if len(regular) < 2:                         # once "word_ids must be a 1-D integer array of at least 2 ids"
        raise ValueError(f"the corpus has {len(regular)} distinct word ({', '.join(map(repr, regular))}) in its "
                         "vocabulary; the QK-PMI correlation and the kernels need at least 2")
    unk = words.index(UNK) if UNK in words[:stats.n_specials] else None   # OOV ids read as <unk>, not <pad>
    model = build_model(args.model, n, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                        random_state=args.seed, oov_id=unk)
    report = {"corpus": stats.name, "vocab_size": n, "model": args.model}

    # 1. circuits ------------------------------------------------------------------------
    ids = top_frequent_ids(stats.counts, min(args.top_n, n - stats.n_specials), exclude=range(stats.n_specials))
    rows = []
    for layer in range(args.layers):
        qk = model.qk_circuit(layer)
        for h in range(args.heads):
            r = {"layer": layer, "head": h,
                 "symmetric": qk_pmi_correlation(qk[h], stats.ppmi, ids).to_dict()}
            if stats.directional_ppmi is not None:
                r["directional"] = qk_pmi_correlation(qk[h], stats.directional_ppmi, ids,
                                                      orientation="key_query").to_dict()
            rows.append(r)
    report["qk_pmi"] = rows
    print(f"corpus {stats.name} (vocabulary {n}), model {args.model}: {args.layers} layers x {args.heads} heads")
    print(f"\n1. Spearman ρ(QK score, PPMI) over ordered pairs of the top {len(ids)} words")
    for r in rows:
        s = r["symmetric"]
        line = (f"  L{r['layer']} H{r['head']}: all pairs ρ={s['rho_all']:+.3f} (n={s['n_pairs_all']}), "
                f"PPMI>0 ρ={s['rho_positive']:+.3f} (n={s['n_pairs_positive']})")
        if "directional" in r:
            line += f"; directional PPMI>0 ρ={r['directional']['rho_positive']:+.3f}"
        print(line)

    # 2. agreement -------------------------------------------------------------------------
    seqs = usable
    projection = [row_normalize(context_matrix(s, stats.ppmi)) for s in seqs]
    predictions = {"Norm(QSQᵀ)": projection}
    if stats.directional_ppmi is not None:
        predictions["Norm(QDᵀQᵀ)"] = [row_normalize(context_matrix(s, stats.directional_ppmi.T.tocsr()))
                                      for s in seqs]
    patterns = [model.patterns(s) for s in seqs]
    table = head_agreement(patterns, predictions, causal=True, diagonal=args.diagonal)
    report["agreement"] = table
    print(f"\n2. agreement with each head over {len(seqs)} sequences (causal prefix, diagonal {args.diagonal}): "
          "JS bits ↓ / Spearman ↑ / top-1 ↑")
    for layer in range(args.layers):
        for h in range(args.heads):
            cells = [f"{r['predictor']}: {r['js_mean']:.3f}/{r['spearman_mean']:+.2f}/{r['top1']:.2f}"
                     for r in table if r["layer"] == layer and r["head"] == h]
            print(f"  L{layer} H{h}  " + " | ".join(cells))
    pooled_targets = [p[layer, h] for p in patterns for layer in range(args.layers) for h in range(args.heads)]
    repeat = args.layers * args.heads
    pooled = attention_agreement(pooled_targets, {k: [a for a in v for _ in range(repeat)]
                                                  for k, v in predictions.items()},
                                 causal=True, diagonal=args.diagonal)
    report["agreement_pooled"] = {k: v.to_dict() for k, v in pooled.items()}

    # 3. kernels -------------------------------------------------------------------------
    first = seqs[0]
    tokens = label(words, first)
    dim = max(1, min(args.d_model, n - 2))
    vectors = SVDEmbeddings(dim=dim, algorithm="arpack").fit(stats.ppmi).vectors_
    token_vectors = np.where((first >= 0)[:, None], vectors[np.maximum(first, 0)], 0.0)
    kernels = {"M = QSQᵀ": context_matrix(first, stats.ppmi), "Norm(M)": projection[0],
               "linear (PPMI-SVD)": linear_kernel(token_vectors),
               "RBF (PPMI-SVD)": rbf_kernel(token_vectors, gamma="median")}
    for h in range(args.heads):
        kernels[f"L0 H{h}"] = patterns[0][0, h]
    names, C = cka_matrix(kernels, "mean")
    report["cka"] = {"names": names, "matrix": C.tolist(), "symmetrize": "mean",
                     "psd": {k: psd_check(v) for k, v in kernels.items()}}
    print(f"\n3. CKA on the first sequence ({len(first)} tokens), kernels symmetrised as (A + Aᵀ)/2:")
    for a, name in enumerate(names):
        print(f"  {name:<18} " + " ".join(f"{C[a, b]:5.2f}" for b in range(len(names))) +
              f"   PSD: {report['cka']['psd'][name]['is_psd']}")

    # 4. graphs --------------------------------------------------------------------------
    graphs = {"projection": graph_metrics(projection[0], tokens)}
    for h in range(args.heads):
        graphs[f"L0 H{h}"] = graph_metrics(patterns[0][0, h], tokens)
    rollout = attention_rollout(patterns[0])
    flow = attention_flow(patterns[0], outputs=[len(first) - 1])[0] if args.layers <= 2 or len(first) <= 64 else None
    report["graphs"] = {k: {m: (v.tolist() if hasattr(v, "tolist") else v) for m, v in g.items()}
                        for k, g in graphs.items()}
    report["rollout_last_token"] = rollout[-1].tolist()
    report["flow_last_token"] = None if flow is None else flow.tolist()
    print("\n4. graphs on the first sequence: spectral gap / mean row entropy (nats) / top PageRank token")
    for k, g in graphs.items():
        print(f"  {k:<12} {g['spectral_gap']:.3f} / {np.mean(g['row_entropy']):.3f} / "
              f"{tokens[int(np.argmax(g['pagerank']))]!r}")
    top = np.argsort(-rollout[-1])[:3]
    print(f"  last token {tokens[-1]!r} draws most from (rollout): " +
          ", ".join(f"{tokens[j]!r} {rollout[-1][j]:.2f}" for j in top))
    if flow is not None:
        top = np.argsort(-flow)[:3]
        print(f"  last token {tokens[-1]!r} max-flow from: " + ", ".join(f"{tokens[j]!r} {flow[j]:.2f}" for j in top))
    write_graphml(attention_graph(projection[0], tokens), out / "attention.graphml")
    if args.word in words:
        for name, matrix in (("PPMI", stats.ppmi), ("co-occurrence", stats.cooc)):
            try:
                senses = sense_communities(matrix, args.word, k=30, words=words, seed=args.seed)
            except ValueError as exc:
                print(f"  {args.word!r} ({name}): {exc}")
                continue
            report.setdefault("senses", {})[name] = senses.to_dict()
            print(f"  senses of {args.word!r} from {name} neighbours: " +
                  " | ".join(", ".join(c[:6]) + f" ({s:.0%})" for c, s in zip(senses.communities, senses.share)))
    else:
        print(f"  {args.word!r} is not in the vocabulary; skipping sense communities")

    # figures and report -------------------------------------------------------------------
    from distattn.analysis import figures
    heat = {"projection Norm(QSQᵀ)": projection[0], **{f"L0 H{h}": patterns[0][0, h] for h in range(args.heads)}}
    figures.plot_attention_comparison(heat, out / "heatmaps.png", tokens=tokens,
                                      title=f"Projection vs layer-0 heads ({args.model} model)")
    figures.plot_attention_graph(projection[0], out / "graph.png", tokens=tokens,
                                 title="Projection attention Norm(QSQᵀ)")
    figures.plot_cka_matrix(names, C, out / "cka.png", title="CKA between kernels (first sequence)")
    figures.plot_agreement(pooled, out / "agreement.png", title="Agreement with all heads (pooled)")
    write_json(out / "report.json", jsonable(report))    # NaN (e.g. the uniform baseline's Spearman): null
    print(f"\nwrote {out}/report.json, heatmaps.png, graph.png, cka.png, agreement.png, attention.graphml")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
