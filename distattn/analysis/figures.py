"""Figures for the three comparison views, drawn with matplotlib's Agg canvas (no pyplot, no
global backend switch, safe in scripts and servers) and saved atomically as PNG or SVG (the
format follows the file suffix).

* :func:`plot_spectra` — singular values on log-log axes, several matrices overlaid, effective
  rank in the legend;
* :func:`plot_attention_comparison` — attention heatmaps side by side (projection vs heads)
  with token labels and one shared colour scale;
* :func:`plot_attention_graph` — one attention matrix as a graph over the tokens;
* :func:`plot_cka_matrix` — pairwise CKA heatmap with values written in the cells;
* :func:`plot_agreement` — JS / Spearman / top-1 bars per predictor, baselines hatched.

Every function returns the path written.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path

import numpy as np

from distattn.analysis.factored import to_numpy
from distattn.analysis.spectra import effective_rank
from distattn.atomic import atomic_path

__all__ = ["FORMATS", "save_figure", "plot_spectra", "plot_attention_comparison", "plot_attention_graph",
           "plot_cka_matrix", "plot_agreement"]

FORMATS = ("png", "svg")


def _new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save ``fig`` atomically; the suffix (.png or .svg) picks the format."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"figure path must end in one of {['.' + f for f in FORMATS]}, got {str(path)!r}")
    with atomic_path(path, suffix="." + fmt) as tmp:
        fig.savefig(tmp, format=fmt)
    return path


def plot_spectra(spectra, path, *, title: str = "Singular value spectra", normalize: bool = False) -> Path:
    """Log-log plot of σ_i against i for each spectrum.

    ``spectra``: a list of :class:`Spectrum`, or a dict ``{label: singular values}``.
    ``normalize`` divides each curve by its σ_1 (compares shapes of matrices on different
    scales). The legend gives each curve's effective rank (over the values plotted).
    """
    items = [(s.name or f"matrix {i}", s.singular_values) for i, s in enumerate(spectra)] \
        if not isinstance(spectra, dict) else [(k, to_numpy(v)) for k, v in spectra.items()]
    if not items:
        raise ValueError("no spectra to plot")
    outside = len(items) > 4
    fig = _new_figure(10.5 if outside else 7, 4.8)
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]
    for n, (label, s) in enumerate(items):
        s = np.sort(np.asarray(s, dtype=np.float64))[::-1]
        s = s[s > 0]
        if s.size == 0:
            continue
        y = s / s[0] if normalize else s
        ax.loglog(np.arange(1, s.size + 1), y, marker="." if s.size <= 50 else None, linestyle=styles[(n // 10) % 4],
                  label=f"{label} (eff. rank {effective_rank(s):.1f}, k={s.size})")
    ax.set_xlabel("index i")
    ax.set_ylabel("σ_i / σ_1" if normalize else "singular value σ_i")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if outside:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_attention_comparison(matrices: dict, path, tokens=None, *, title: str = "Attention",
                              shared_scale: bool = True, max_cols: int = 5) -> Path:
    """Heatmaps of several (R, R) attention matrices side by side (rows = queries, columns =
    keys), e.g. ``{"projection Norm(QSQᵀ)": A, "L0 H0": ..., ...}``. ``shared_scale`` uses one
    colour scale [0, max] for all panels so colours compare across them."""
    if not matrices:
        raise ValueError("no matrices to plot")
    mats = {k: to_numpy(v) for k, v in matrices.items()}
    shapes = {m.shape for m in mats.values()}
    if len(shapes) != 1 or any(len(s) != 2 or s[0] != s[1] for s in shapes):
        raise ValueError(f"all matrices must be square and of one shape; got {sorted(shapes)}")
    R = next(iter(shapes))[0]
    if tokens is not None and len(tokens) != R:
        raise ValueError(f"tokens has {len(tokens)} labels but the matrices are {R} x {R}")
    n = len(mats)
    cols = min(n, max_cols)
    rows = int(np.ceil(n / cols))
    cell = max(2.6, min(5.0, 0.22 * R + 1.2))
    fig = _new_figure(cell * cols + 1.2, cell * rows + 0.6)
    # the colour scale from the finite entries: one NaN (drawn blank) made it NaN for every panel
    finite_max = {k: float(m[np.isfinite(m)].max()) if np.isfinite(m).any() else 0.0 for k, m in mats.items()}
    vmax = max(finite_max.values()) if shared_scale else None
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    labels = [str(t) for t in tokens] if tokens is not None and R <= 40 else None
    for k, (ax, (name, m)) in enumerate(zip(axes.ravel(), mats.items())):
        image = ax.imshow(m, cmap="viridis", vmin=0.0, vmax=vmax if shared_scale else finite_max[name],
                          interpolation="nearest")
        ax.set_title(name, fontsize=9)
        # token labels on the outer panels only (every panel shares them): text layout is
        # most of the drawing time
        row, col = divmod(k, cols)
        bottom = row == rows - 1 or k + cols >= n
        if labels is not None:
            if bottom:
                ax.set_xticks(range(R), labels, rotation=90, fontsize=7)
            if col == 0:
                ax.set_yticks(range(R), labels, fontsize=7)
        if not bottom:
            ax.set_xticks([])
        if col != 0:
            ax.set_yticks([])
        if bottom:
            ax.set_xlabel("key")
        if col == 0:
            ax.set_ylabel("query")
        if not shared_scale:
            fig.colorbar(image, ax=ax, shrink=0.8)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if shared_scale and image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_attention_graph(attention, path, tokens=None, *, threshold: float | None = None, top_k: int = 3,
                         title: str = "Attention graph") -> Path:
    """Draw one (R, R) attention matrix as a graph: tokens on a circle, an arrow from each
    query to its ``top_k`` strongest other keys (an integer >= 1; or to every other key above
    ``threshold``, a finite number >= 0), width and colour by weight; node size by weighted in-degree (attention
    received). Self-attention is no arrow and does not count among the ``top_k``: it is shown
    as the node's colour (darker = more attention to itself)."""
    import matplotlib
    import networkx as nx
    from matplotlib import cm, colors

    A = to_numpy(attention)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"attention must be (R, R), got {A.shape}")
    if not np.all(np.isfinite(A)):      # NaN node sizes and colour scale: a figure with no nodes and no edges
        raise ValueError("attention must be finite; it has NaN or infinite entries")
    R = A.shape[0]
    labels = [str(t) for t in tokens] if tokens is not None else [str(i) for i in range(R)]
    if len(labels) != R:
        raise ValueError(f"tokens has {len(labels)} labels but the attention has {R} positions")
    keep = np.zeros_like(A, dtype=bool)
    if threshold is not None:
        # NaN or inf drew no arrow without a word; a negative one drew zero weights (NaN widths)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not np.isfinite(threshold) \
                or threshold < 0:
            raise ValueError(f"threshold must be a finite real number >= 0 (a weight: arrows to the keys above "
                             f"it); got {threshold!r}")
        keep = A > threshold
    else:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1 (arrows per query); got {top_k!r}")
        # the diagonal last: a token's attention to itself must not take one of its top_k arrows
        order = np.argsort(-np.where(np.eye(R, dtype=bool), -np.inf, A), axis=1, kind="stable")[:, :top_k]
        keep[np.repeat(np.arange(R), order.shape[1]), order.ravel()] = True
        keep &= A > 0
    np.fill_diagonal(keep, False)
    G = nx.DiGraph()
    G.add_nodes_from(range(R))
    i, j = np.nonzero(keep)
    G.add_weighted_edges_from(zip(i.tolist(), j.tolist(), A[i, j].tolist()))
    pos = nx.circular_layout(G)
    fig = _new_figure(6.5, 6)
    ax = fig.add_subplot()
    norm = colors.Normalize(vmin=0.0, vmax=float(A.max()) or 1.0)
    cmap = matplotlib.colormaps["viridis"]
    weights = A[i, j]
    nx.draw_networkx_edges(G, pos, ax=ax, edgelist=list(zip(i.tolist(), j.tolist())),
                           width=0.5 + 4.0 * weights / (weights.max() if weights.size else 1.0),
                           edge_color=weights, edge_cmap=cmap, edge_vmin=0.0, edge_vmax=norm.vmax,
                           arrows=True, arrowsize=12, connectionstyle="arc3,rad=0.12", node_size=600)
    received = A.sum(axis=0)
    nx.draw_networkx_nodes(G, pos, ax=ax, node_size=300 + 900 * received / max(received.max(), 1e-12),
                           node_color=np.diag(A), cmap="Oranges", vmin=0.0, vmax=1.0, edgecolors="black")
    nx.draw_networkx_labels(G, pos, ax=ax, labels=dict(enumerate(labels)), font_size=8)
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.7, label="attention weight (edge)")
    ax.set_title(f"{title}\n(arrow: query → key; node size: attention received; node colour: self-attention)",
                 fontsize=9)
    ax.set_axis_off()
    return save_figure(fig, path)


def plot_cka_matrix(names, C, path, *, title: str = "CKA between kernels") -> Path:
    """Heatmap of a pairwise CKA matrix (``kernels.cka_matrix``), values written in the cells."""
    C = to_numpy(C)
    names = [str(n) for n in names]
    if C.shape != (len(names), len(names)):
        raise ValueError(f"C must be ({len(names)}, {len(names)}) for {len(names)} names, got {C.shape}")
    size = max(4.0, 0.7 * len(names) + 2.5)
    fig = _new_figure(size + 1.0, size)
    ax = fig.add_subplot()
    # CKA lies in [0, 1] for PSD kernels; symmetrised attention need not be PSD and can give
    # negative values, shown then on a diverging scale
    signed = bool(np.nanmin(C) < 0) if np.isfinite(C).any() else False
    image = ax.imshow(C, cmap="RdBu_r" if signed else "magma", vmin=-1.0 if signed else 0.0, vmax=1.0)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for a in range(len(names)):
        for b in range(len(names)):
            v = C[a, b]
            dark = np.isnan(v) or (abs(v) > 0.6 if signed else v < 0.6)
            ax.text(b, a, "nan" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    fig.colorbar(image, ax=ax, shrink=0.8, label="CKA")
    ax.set_title(title)
    return save_figure(fig, path)


def plot_agreement(scores: dict, path, *, title: str = "Agreement with learned attention") -> Path:
    """Grouped bars of mean JS divergence (lower is better), mean Spearman ρ and top-1 agreement
    for each predictor. ``scores``: ``{name: AgreementScores or dict}`` as returned by
    ``agreement.attention_agreement``; the baselines ("uniform", "previous_token") are drawn
    grey and hatched. A NaN Spearman (undefined, e.g. for uniform rows) is marked "n/a"."""
    if not scores:
        raise ValueError("no scores to plot")
    names = list(scores)
    get = lambda s, k: (s.to_dict() if hasattr(s, "to_dict") else dict(s))[k]  # noqa: E731
    metrics = [("js_mean", "JS divergence (bits) ↓"), ("spearman_mean", "Spearman ρ ↑"), ("top1", "top-1 agreement ↑")]
    fig = _new_figure(4.0 * len(metrics), 4.2)
    axes = fig.subplots(1, len(metrics))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for ax, (key, label) in zip(axes, metrics):
        for x, name in enumerate(names):
            v = float(get(scores[name], key))
            baseline = name in ("uniform", "previous_token")
            colour = "#b0b0b0" if baseline else palette[x % len(palette)]
            ax.bar(x, 0.0 if np.isnan(v) else v, color=colour, hatch="//" if baseline else None,
                   edgecolor="black", linewidth=0.6)
            ax.text(x, (0.0 if np.isnan(v) else v) + 0.01, "n/a" if np.isnan(v) else f"{v:.2f}",
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_ylim(-1.05 if key == "spearman_mean" else 0.0, 1.1)
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.grid(True, axis="y", alpha=0.3)
    n_rows = get(scores[names[0]], "n_rows")
    fig.suptitle(f"{title} ({n_rows} rows; grey hatched = baselines)")
    return save_figure(fig, path)
