"""``report.html``: one self-contained page (inline CSS, figures as data: URIs, no scripts, no
network), and the closing table printed in the terminal."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from distattn.atomic import atomic_path

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;
color:#1d1d1f;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em} h2{margin-top:2em;border-bottom:2px solid #e5e5ea;padding-bottom:.2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em} th,td{border:1px solid #d2d2d7;padding:.3em .6em;
text-align:right} th{background:#f5f5f7} td:first-child,th:first-child{text-align:left}
tr.best td{background:#e8f5e9;font-weight:600} .muted{color:#6e6e73;font-size:.9em}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #e5e5ea} figcaption{color:#6e6e73;font-size:.9em}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:1em} code{background:#f5f5f7;padding:0 .2em}
"""


def _img(path: Path, caption: str) -> str:
    if not path.exists():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    return (f'<figure><img alt="{html.escape(caption)}" src="data:{mime};base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _fmt(x, nd=4):
    if x is None:
        return "–"
    if isinstance(x, float):
        if not math.isfinite(x):         # NaN, inf: null in metrics.json and a dash in the terminal too
            return "–"
        return f"{x:,.{nd}f}" if abs(x) < 1e5 else f"{x:.3g}"
    return html.escape(str(x))


def _fixed(x, spec: str) -> str:
    """``x`` formatted with ``spec``; "–" for a missing (null in metrics.json) or non-finite number."""
    if x is None or not math.isfinite(x):
        return "–"
    return format(x, spec)


def _table(headers, rows, best=None, nd=4) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>"]
    for i, r in enumerate(rows):
        cls = ' class="best"' if best is not None and i == best else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{_fmt(c, nd)}</td>"
                                          for c in r) + "</tr>")
    return "".join(out) + "</table>"


def headline(metrics: dict) -> list[tuple[str, str, str, str]]:
    """(question, projection side, learned side / baseline, reading) rows of the headline table."""
    rows = []
    an = metrics.get("analysis", {})
    corr = [c for c in an.get("attention_pmi_correlation", []) if c["statistic"] == "PPMI"]
    if corr:
        import numpy as np
        for model in sorted({c["model"] for c in corr}):
            cs = [c for c in corr if c["model"] == model]
            rhos = [c["rho_all"] for c in cs if c["rho_all"] is not None and math.isfinite(c["rho_all"])]
            rho = float(np.mean(rhos)) if rhos else None      # every head's ρ undefined: a dash, not "+nan"
            rows.append((f"Spearman(QK scores, PPMI), {model}, mean over heads",
                         _fixed(rho, "+.3f"), f"{cs[0]['n_pairs_all']:,} word pairs", "0 = unrelated, 1 = same ordering"))
    summ = an.get("agreement_summary")
    if summ:
        sc = summ["mean_over_heads"]
        for p in [k for k in sc if k not in ("uniform", "previous_token")]:
            rows.append((f"Jensen–Shannon divergence to {summ['model']}'s heads: {p}",
                         _fixed(sc[p]["js_mean"], ".3f"),
                         f"uniform {_fixed(sc.get('uniform', {}).get('js_mean'), '.3f')}, "
                         f"previous-token {_fixed(sc.get('previous_token', {}).get('js_mean'), '.3f')}",
                         "lower = closer; must beat both baselines to mean anything"))
    nt = metrics.get("next_token", [])
    if nt:
        best = {}
        for r in nt:      # a NaN perplexity would stay best (every comparison with it is False), an inf one print "inf"
            fam = r.get("family")
            if (r.get("perplexity") is not None and math.isfinite(r["perplexity"])
                    and (fam not in best or r["perplexity"] < best[fam]["perplexity"])):
                best[fam] = r
        if "projection" in best:
            other = [f"{best[f]['model']} {best[f]['perplexity']:.1f}" for f in ("ngram", "learned") if f in best]
            rows.append(("Next-token perplexity: best projection vs best n-gram / learned LM",
                         f"{best['projection']['model']} {best['projection']['perplexity']:.1f}", "; ".join(other),
                         "lower is better"))
    return rows


def _senses(sc: dict) -> str:
    """The Louvain communities of a word's PPMI neighbourhood as a table, largest share first."""
    rows = sorted(zip(sc.get("communities", []), sc.get("share", [])), key=lambda r: -r[1])
    return (f"<h3>Senses of <b>{html.escape(str(sc.get('word')))}</b>: Louvain communities of its PPMI "
            f"neighbourhood (modularity {_fixed(sc.get('modularity'), '.3f')})</h3>"
            + _table(["community", "share of the word's PPMI mass", "words"],
                     [[i + 1, share, ", ".join(words)] for i, (words, share) in enumerate(rows)]))


def write_report(run_dir: Path, env: dict, metrics: dict) -> Path:
    fig = run_dir / "figures"
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>distattn report: "
             f"{html.escape(env['config']['corpus'])}</title><style>{CSS}</style></head><body>",
             f"<h1>Is learned attention projected co-occurrence?</h1><p class='muted'>corpus "
             f"<b>{html.escape(env['config']['corpus'])}</b> · "
             + (f"profile <b>{env['profile']}</b> · " if env.get("profile") is not None else "")   # none: --corpus paper
             + f"device {html.escape(env['device'])} · "
             + (f"seed {env['seed']} · " if env.get("seed") is not None else "")      # none: --corpus paper
             + f"distattn {env['versions']['distattn']} · git "
             f"{html.escape(str(env.get('git_hash'))[:10])}{' with uncommitted changes' if env.get('git_dirty') else ''} · total {metrics['timings_s'].get('total', 0):.0f} s</p>"]
    hl = headline(metrics)
    if hl:
        parts.append("<h2>The question in one table</h2>" + _table(["measure", "value", "beside it", "reading"], hl))
    data = metrics.get("data")
    if data:
        parts.append("<p class='muted'>" + " · ".join(f"{k.replace('_', ' ')}: {v:,}" for k, v in data.items()
                                                      if isinstance(v, int)) + "</p>")
    nt = metrics.get("next_token", [])
    if nt:
        best = min(range(len(nt)), key=lambda i: nt[i]["perplexity"] if nt[i]["perplexity"] is not None
                   and math.isfinite(nt[i]["perplexity"]) else math.inf)   # a NaN row would win the comparison
        kind = "reviews" if env["config"]["corpus"] == "imdb" else "documents"
        parts.append("<h2>Next-token prediction: n-grams, projections, language models</h2>"
                     "<p class='muted'>Same test positions for every row (targets that are out of vocabulary "
                     f"are skipped); τ fitted on held-out validation {kind} for the projection rows.</p>"
                     + _table(["model", "family", "τ", "perplexity", "top-1", "top-10", "positions", "seconds"],
                              [[r["model"], r["family"], r.get("temperature"), r["perplexity"], r["top1"], r["top10"],
                                r.get("positions"), r.get("seconds")] for r in nt], best=best))
    clf = metrics.get("classifier")
    if clf:
        rows = [["seed: " + clf["config"], clf["test_accuracy"], clf.get("train_seconds")]]
        best = metrics.get("classifier_best")
        if best:
            rows.append(["best: " + best["config"], best["test_accuracy"], best.get("train_seconds")])
        rows.append(["seed paper (000_48942d33924f2728.txt), as reported", 0.8618, None])
        parts.append("<h2>Sentiment classifier</h2>" + _table(["model", "test accuracy", "train seconds"], rows))
    elif data and data.get("classifier_skipped"):          # a text corpus without both labels: say why
        parts.append(f"<h2>Sentiment classifier</h2><p class='muted'>Not trained: "
                     f"{html.escape(str(data['classifier_skipped']))}.</p>")
    an = metrics.get("analysis", {})
    if an.get("heatmaps"):
        seed_examples = sum(1 for h in an["heatmaps"] if h.get("expected"))
        which = (f"The {'five' if seed_examples == 5 else f'{seed_examples} of the five'} example reviews of "
                 "000_48942d33924f2728.txt §IV.B, then held-out test reviews." if seed_examples
                 else "Held-out test documents.")
        # "learned_heads" 0: a --no-models run, whose heatmaps hold the projection alone (entries from before
        # the key was recorded had learned heads whenever they had a figure to show beside it)
        learned = any(h.get("learned_heads", 1) for h in an["heatmaps"])
        parts.append(("<h2>Attention side by side: projection vs learned heads</h2>" if learned else
                      "<h2>Attention of the projection (no model trained)</h2>")
                     + f"<p class='muted'>{which} Rows attend to columns.</p>")
        for h in an["heatmaps"]:
            cap = h["example"] + (f" (seed paper: {h['expected']}" + (f"; our classifier p(positive) = "
                                                                       f"{_fixed(h['p_positive'], '.2f')}" if 'p_positive' in h else "")
                                  + ")" if h.get("expected") else "")
            parts.append(_img(fig / h["figure"], cap))
    if an.get("agreement_summary"):
        sc = an["agreement_summary"]["mean_over_heads"]
        parts.append("<h2>Agreement with the learned heads</h2>" + _img(fig / "agreement.png", "Agreement")
                     + _table(["predictor", "Jensen–Shannon (↓)", "row Spearman (↑)", "top-1 (↑)"],
                              [[p, v["js_mean"], v["spearman_mean"], v["top1"]] for p, v in sc.items()]))
    if an.get("spectra"):
        parts.append("<h2>Spectra</h2><div class='grid'>" + _img(fig / "spectra_statistics.png", "Corpus statistics")
                     + _img(fig / "spectra_circuits.png", "PPMI and the learned circuits") + "</div>"
                     + _table(["matrix", "effective rank", "stable rank", "power-law α", "energy top-10"],
                              [[n, s["effective_rank"], s["stable_rank"], (s.get("power_law") or {}).get("alpha"),
                                s["energy_fraction"].get(10, s["energy_fraction"].get("10"))]
                               for n, s in an["spectra"].items()]))
    if an.get("attention_pmi_correlation"):
        parts.append("<h3>Attention–PMI correlation per head</h3>" + _table(
            # each ρ beside its own count: one "pairs" column gave the all-pairs count beside ρ (PPMI > 0) too
            ["model", "head", "statistic", "ρ (all pairs)", "pairs", "ρ (PPMI > 0)", "pairs (PPMI > 0)"],
            [[c["model"], c["head"], c["statistic"], c["rho_all"], c["n_pairs_all"], c["rho_positive"],
              c.get("n_pairs_positive")] for c in an["attention_pmi_correlation"]]))
    if an.get("graph") or an.get("cka"):
        parts.append("<h2>Graphs and kernels</h2><div class='grid'>" + _img(fig / "attention_graph.png", "Attention graph")
                     + _img(fig / "cka.png", "CKA matrix") + "</div>")
        g = an.get("graph")
        if g:
            parts.append(f"<p>Spectral gap {_fixed(g['spectral_gap'], '.3f')}; PageRank top: {html.escape(', '.join(g['pagerank_top']))}; "
                         f"rollout into the last token: {html.escape(', '.join(g['rollout_last_row_top']))}; "
                         f"flow into the last token: {html.escape(', '.join(g['flow_to_last_top']))}. GraphML in "
                         "<code>graphs/</code>.</p>")
    if an.get("bank_senses"):           # PPMI only: shown with --no-models too
        if not (an.get("graph") or an.get("cka")):
            parts.append("<h2>Graphs and kernels</h2>")
        parts.append(_senses(an["bank_senses"]))
    paper = metrics.get("paper")
    if paper:
        parts.append("<h2>The paper's bank/river examples (003_8065cadafb1b3474.txt §2.5, §3.2)</h2>")
        for name, ex in paper.items():
            seq = " ".join(ex["sequence"])
            # the paper's digits (Norm(M) to 2 places, e_global to 1): metrics.json holds them
            # rounded to 3 and 2 places, so a 4th place would be a padded zero, not the value's
            parts.append(f"<h3>“{html.escape(seq)}” → prediction <b>{html.escape(ex['prediction'])}</b></h3>"
                         + _table(["", *ex["sequence"]], [[w, *row] for w, row in zip(ex["sequence"], ex["norm_M"])],
                                  nd=2)
                         + _table(["e_global", *ex["vocabulary"]], [["", *ex["e_global"]]], nd=1)
                         + _img(fig / f"paper_{seq.replace(' ', '_')}.png", f"Norm(M) for “{seq}”"))
    t = metrics["timings_s"]
    parts.append("<h2>Run</h2>" + _table(["stage", "seconds"], [[k, v] for k, v in t.items()])
                 + f"<p class='muted'>Command: <code>{html.escape(env['command'])}</code>. Files: "
                 "<code>config.json</code>, <code>metrics.json</code>, <code>figures/</code>, <code>graphs/</code>, "
                 "<code>checkpoints/</code>.</p></body></html>")
    path = run_dir / "report.html"
    with atomic_path(path) as tmp:
        tmp.write_text("".join(parts), encoding="utf-8")
    return path


def _num(x, width: int, nd: int) -> str:
    """``x`` to ``nd`` places in ``width`` columns; "–" for a missing (null) or non-finite number."""
    return f"{_fixed(x, f'{width}.{nd}f'):>{width}}"


def terminal_table(metrics: dict) -> str:
    lines = []
    nt = metrics.get("next_token", [])
    if nt:
        lines.append(f"{'model':52s} {'perplexity':>11} {'top-1':>7} {'top-10':>7}")
        for r in nt:     # metrics.json holds a non-finite perplexity as null
            lines.append(f"{r['model'][:52]:52s} {_num(r['perplexity'], 11, 2)} {_num(r['top1'], 7, 4)} "
                         f"{_num(r['top10'], 7, 4)}")
    if metrics.get("classifier"):
        lines.append(f"classifier test accuracy: {_fixed(metrics['classifier']['test_accuracy'], '.4f')} "
                     "(seed paper: 0.8618)")
    if metrics.get("classifier_best") and metrics["classifier_best"].get("test_accuracy") is not None:
        lines.append(f"best classifier (PPMI-SVD init) test accuracy: {metrics['classifier_best']['test_accuracy']:.4f}")
    for q, a, b, _ in headline(metrics):
        lines.append(f"{q}: {a}  [{b}]")
    if metrics.get("paper"):
        lines.append("paper examples: " + ", ".join(f"{' '.join(e['sequence'])} -> {e['prediction']}"
                                                     for e in metrics["paper"].values()))
    lines.append(f"total {metrics['timings_s'].get('total', 0):.1f} s")
    return "\n".join(lines)
