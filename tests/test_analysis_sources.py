"""distattn.analysis.sources and the two analysis scripts, end to end on the paper corpus."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from distattn.analysis.sources import RandomAttentionModel, corpus_statistics

ROOT = Path(__file__).resolve().parents[1]


def test_random_model_layer0_pattern_is_the_softmax_of_its_qk_circuit():
    m = RandomAttentionModel(20, d_model=12, n_heads=3, n_layers=2, causal=True, random_state=1)
    ids = np.array([4, 7, 7, 19, 0])
    P = m.patterns(ids)
    assert P.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(P.sum(-1), 1.0)
    assert np.all(np.triu(P, 1) == 0)
    qk = m.qk_circuit(0)
    for h in range(3):
        scores = m.temperature * qk[h].submatrix(ids, ids) / np.sqrt(m.d_head)
        scores = np.where(np.tril(np.ones((5, 5), dtype=bool)), scores, -np.inf)
        expected = np.exp(scores - scores.max(1, keepdims=True))
        np.testing.assert_allclose(P[0, h], expected / expected.sum(1, keepdims=True), atol=1e-12)
    assert m.ov_circuit(1).shape == (3, 20, 20)


def test_paper_statistics():
    cs = corpus_statistics("paper")
    assert cs.words[1] == "bank" and cs.ppmi.shape == (7, 7) and cs.directional_ppmi is None
    assert [list(s) for s in cs.sequences] == [[0, 1, 4], [1, 2]]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,outputs", [("spectra", ["spectra.json", "spectra.png"]),
                                          ("attention_vs_ppmi", ["report.json", "heatmaps.png", "graph.png",
                                                                 "cka.png", "agreement.png", "attention.graphml"])])
def test_scripts_run_on_the_paper_corpus(name, outputs, tmp_path, capsys):
    assert _script(name).main(["--out", str(tmp_path), "--d-model", "8", "--heads", "2"]) == 0
    for f in outputs:
        assert (tmp_path / f).stat().st_size > 100
    report = json.loads((tmp_path / outputs[0]).read_text())
    assert report["corpus"] == "paper"
    if name == "attention_vs_ppmi":
        senses = report["senses"]["co-occurrence"]["communities"]
        assert sorted(map(sorted, senses)) == [["flooded", "river", "shore"], ["loan", "money", "rely"]]
    assert "wrote" in capsys.readouterr().out
