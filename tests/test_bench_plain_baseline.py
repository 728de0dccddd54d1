"""``benchmarks/bench_models.py``'s plain-PyTorch fp32 LM baseline: the tokens/s it reports."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_models  # noqa: E402

from distattn.corpus.ragged import RaggedIds  # noqa: E402
from distattn.models import LMConfig, TransformerLM  # noqa: E402
from distattn.train import LMData  # noqa: E402


def test_plain_lm_throughput_runs_every_step_it_counts():
    """tokens/s is steps × batch × seq_len over the timed seconds; with more steps than one epoch's
    batches (``--set plain_steps=...``) it ran only that epoch's and still counted all of them
    (here 9 run, 30 counted: tokens/s 3.3× too high)."""
    ids = np.random.default_rng(0).integers(2, 50, 400).astype(np.int32)
    data = LMData(RaggedIds(ids, np.array([0, 200, 400])), seq_len=8)       # 49 sequences: 12 batches of 4
    calls = []
    batch = data.batch
    data.batch = lambda index: (calls.append(len(index)), batch(index))[1]
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=8))
    res = bench_models.plain_lm_throughput(lm, data, batch_size=4, steps=30, warmup=3, lr=1e-3,
                                           device=torch.device("cpu"))
    assert res["steps"] == 30 and len(calls) == 3 + 30 and set(calls) == {4}
