"""distattn.analysis.figures: every figure is written (atomically) as PNG or SVG."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require

require("matplotlib")

from distattn.analysis import (FactoredMatrix, agreement_scores, attention_agreement,  # noqa: E402
                               cka_matrix, linear_kernel, rbf_kernel, spectrum)
from distattn.analysis import figures  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
rng = np.random.default_rng(0)


def _rows(R, seed):
    A = np.random.default_rng(seed).random((R, R)) ** 3
    return A / A.sum(1, keepdims=True)


def _ok(path, kind="png"):
    data = path.read_bytes()
    assert len(data) > 2000
    assert data.startswith(PNG) if kind == "png" else b"<svg" in data[:2000]
    assert not list(path.parent.glob(".*part*"))


def test_spectra_plot(tmp_path):
    specs = [spectrum(rng.standard_normal((40, 30)), name="gaussian"),
             spectrum(FactoredMatrix(rng.standard_normal((40, 5)), rng.standard_normal((5, 40))), name="QK head")]
    _ok(figures.plot_spectra(specs, tmp_path / "spectra.png"))
    _ok(figures.plot_spectra({"a": [3, 2, 1]}, tmp_path / "spectra.svg", normalize=True), "svg")
    with pytest.raises(ValueError, match=".png"):
        figures.plot_spectra(specs, tmp_path / "spectra.jpg")


def test_attention_heatmaps_and_graph(tmp_path):
    tokens = "the river bank flooded after rain".split()
    mats = {"projection": _rows(6, 1), "L0 H0": _rows(6, 2), "L0 H1": np.tril(_rows(6, 3))}
    _ok(figures.plot_attention_comparison(mats, tmp_path / "heat.png", tokens=tokens))
    _ok(figures.plot_attention_graph(_rows(6, 4), tmp_path / "graph.png", tokens=tokens))
    with pytest.raises(ValueError, match="tokens"):
        figures.plot_attention_comparison(mats, tmp_path / "x.png", tokens=tokens[:3])


def test_cka_and_agreement_plots(tmp_path):
    X = rng.standard_normal((8, 3))
    names, C = cka_matrix({"linear": linear_kernel(X), "rbf": rbf_kernel(X), "attention": _rows(8, 5)})
    _ok(figures.plot_cka_matrix(names, C, tmp_path / "cka.png"))
    T = [np.tril(_rows(6, s)) / np.tril(_rows(6, s)).sum(1, keepdims=True) for s in range(3)]
    scores = attention_agreement(T, [_rows(6, s + 7) for s in range(3)], causal=True)
    scores["self"] = agreement_scores(T, T, causal=True)
    _ok(figures.plot_agreement(scores, tmp_path / "agreement.png"))


def _drawn(monkeypatch):
    """The figures passed to save_figure, kept for inspection."""
    kept = []
    save = figures.save_figure
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: (kept.append(fig), save(fig, path))[1])
    return kept


@pytest.mark.parametrize("shared_scale", [True, False])
def test_heatmap_colour_scale_ignores_nan_entries(tmp_path, monkeypatch, shared_scale):
    # one NaN (an undefined weight, drawn blank) made the colour scale NaN: every panel one
    # colour, the colour bar -0.1..0.1
    kept = _drawn(monkeypatch)
    with_nan = np.array([[np.nan, 0.6], [0.2, 0.8]])
    _ok(figures.plot_attention_comparison({"a": with_nan, "b": np.array([[0.5, 0.5], [0.3, 0.4]])},
                                          tmp_path / "heat.png", shared_scale=shared_scale))
    clims = [ax.images[0].get_clim() for ax in kept[0].axes if ax.images]
    assert clims == ([(0.0, 0.8), (0.0, 0.8)] if shared_scale else [(0.0, 0.8), (0.0, 0.5)])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_attention_graph_refuses_non_finite_weights(tmp_path, bad):
    # one NaN made every node size and the colour scale NaN: the figure was written with no
    # node and no edge, and no error
    A = _rows(4, 1)
    A[0, 1] = bad
    with pytest.raises(ValueError, match="finite"):
        figures.plot_attention_graph(A, tmp_path / "graph.png")
    assert not (tmp_path / "graph.png").exists()


def _edges(monkeypatch):
    """The edge lists plot_attention_graph draws."""
    import networkx as nx
    drawn = []
    draw = nx.draw_networkx_edges
    monkeypatch.setattr(nx, "draw_networkx_edges",
                        lambda G, pos, **kw: (drawn.append(sorted(kw["edgelist"])), draw(G, pos, **kw))[1])
    return drawn


def test_attention_graph_top_k_counts_other_keys_only(tmp_path, monkeypatch):
    # each token attends most to itself: the self-edge (not drawn) took one of the top_k
    # places, so top_k=1 drew no arrow at all and top_k=2 one per query
    drawn = _edges(monkeypatch)
    A = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.25, 0.35, 0.4]])
    figures.plot_attention_graph(A, tmp_path / "g1.png", top_k=1)
    figures.plot_attention_graph(A, tmp_path / "g2.png", top_k=2)
    figures.plot_attention_graph(A, tmp_path / "g5.png", top_k=5)
    assert drawn[0] == [(0, 1), (1, 0), (2, 1)]
    assert drawn[1] == drawn[2] == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


@pytest.mark.parametrize("top_k", [0, -1, 1.5, True])
def test_attention_graph_refuses_top_k_below_one(tmp_path, top_k):
    # top_k=0 (or negative) drew one arrow per query, as top_k=1
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        figures.plot_attention_graph(_rows(4, 1), tmp_path / "graph.png", top_k=top_k)
    assert not (tmp_path / "graph.png").exists()


@pytest.mark.parametrize("threshold", [np.nan, np.inf, -np.inf, -0.1, "0.2", True])
def test_attention_graph_refuses_a_threshold_that_is_not_a_finite_weight_at_least_zero(tmp_path, threshold):
    # NaN drew an empty graph silently; a negative threshold drew every zero-weight pair as an
    # arrow (with NaN widths when all were zero); a string failed inside numpy's comparison
    with pytest.raises(ValueError, match=r"threshold must be a finite real number >= 0"):
        figures.plot_attention_graph(np.eye(3), tmp_path / "graph.png", threshold=threshold)
    assert not (tmp_path / "graph.png").exists()


def test_attention_graph_threshold_draws_the_other_keys_above_it(tmp_path, monkeypatch):
    drawn = _edges(monkeypatch)
    A = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.25, 0.35, 0.4]])
    figures.plot_attention_graph(A, tmp_path / "g.png", threshold=0.15)
    figures.plot_attention_graph(A, tmp_path / "g0.png", threshold=0)
    assert drawn[0] == [(0, 1), (2, 0), (2, 1)]
    assert drawn[1] == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
