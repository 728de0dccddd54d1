"""``benchmarks/probe_ngram_attention.py`` on a tiny prepared file: NB ratios, the bigram features,
and every variant's code path (the IMDB run itself is recorded in benchmarks/results)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import probe_ngram_attention as probe  # noqa: E402

V = 40


def _prep(path: Path, n: int = 240, seed: int = 0) -> Path:
    """Reviews of random words 4..39; a positive one says "not bad" (ids 2, 3 — only as a bigram: each
    word alone is as common on both sides), a negative one "bad not"."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    docs = []
    for y in labels:
        words = list(rng.integers(4, V, size=rng.integers(6, 30)))
        at = rng.integers(0, len(words))
        words[at:at] = [2, 3] if y else [3, 2]
        docs.append(words)
    ids = np.concatenate(docs).astype(np.uint16)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    np.savez(path, words="\n".join(["<pad>", "<unk>"] + [f"w{i}" for i in range(2, V)]), train_ids=ids,
             train_offsets=offsets, train_labels=labels.astype(np.int8),
             svd=rng.standard_normal((V, 256)).astype(np.float16))
    return path


def test_a_sentiment_carried_by_a_bigram_alone_gets_its_nb_ratio(tmp_path):
    D = probe.load(str(_prep(tmp_path / "p.npz")), max_len=16, n_val=40)
    assert len(D["tr"]) == 200 and len(D["va"]) == 40 and not set(D["tr"]) & set(D["va"])
    code = lambda a, b: a * V + b
    assert np.array_equal(probe.bigram_codes(np.array([5, 2, 3, 1, 4]), np.array([0, 3]), V),
                          [-1, code(5, 2), code(2, 3), -1, -1])      # a review's start and <unk> break bigrams
    ids, bi = D["ids"], D["bi"]
    pos = np.flatnonzero((ids[:-1] == 2) & (ids[1:] == 3)) + 1       # where "not bad" ends
    neg = np.flatnonzero((ids[:-1] == 3) & (ids[1:] == 2)) + 1
    assert D["r_bi"][bi[pos]].min() > 2.0 > -2.0 > D["r_bi"][bi[neg]].max()
    assert abs(D["r_uni"][2]) < 0.5 and abs(D["r_uni"][3]) < 0.5 and D["r_uni"][0] == D["r_uni"][1] == 0
    assert all(len(r) <= 16 for r in D["rows"])


def test_every_variant_runs_and_uniform_pooling_reads_the_bigram(tmp_path):
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_ngram_attention.py"), "--prep",
                        str(_prep(tmp_path / "p.npz")), "--n-val", "40", "--epochs", "1", "--max-len", "16",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    results = {x["variant"]: x for x in json.loads(out.read_text())["results"]}
    assert list(results) == list(probe.VARIANTS)
    assert results["uniform"]["val_by_epoch"][0] >= 0.95          # the NB ratios alone, before any step
    for x in results.values():
        assert len(x["val_by_epoch"]) == 2 and x["best_val"] == max(x["val_by_epoch"])


def test_a_variant_leaves_the_nb_ratios_to_the_next_as_they_were(tmp_path):
    """The values were built on the NB arrays' own memory (``from_pretrained`` of ``from_numpy``): training
    one variant changed them, and every later variant started from the one before's trained values
    (on IMDB its val before any step went from uniform's 0.8872 to 0.9156)."""
    D = probe.load(str(_prep(tmp_path / "p.npz")), max_len=16, n_val=40)
    before = D["r_uni"].copy(), D["r_bi"].copy()
    first = probe.run_variant(D, "uniform", epochs=1, max_len=16, seed=0)
    assert np.array_equal(D["r_uni"], before[0]) and np.array_equal(D["r_bi"], before[1])
    for name in ("pool", "uniform"):
        assert probe.run_variant(D, name, epochs=1, max_len=16, seed=0)["val_by_epoch"][0] == first["val_by_epoch"][0]


@pytest.mark.parametrize("argv, message", [(["--variants", "uniform,nope"], "unknown ['nope']"),
                                           (["--n-val", "240"], "n_val=240: expected 1 to 239"),
                                           (["--epochs", "0"], "need epochs >= 1")])
def test_bad_options_are_refused_by_name(tmp_path, argv, message):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_ngram_attention.py"), "--prep",
                        str(_prep(tmp_path / "p.npz")), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr
