"""``benchmarks/bench_models.py --set KEY=JSON``: the sizes a GPU session may change without
editing the script, checked before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_models  # noqa: E402

FULL = bench_models.SIZES["full"]


def test_overrides_parse_to_the_defaults_kinds():
    got = bench_models.parse_overrides(["pre_epochs=12", "pre_lr=1e-3", "ft_lrs=[0.0001, 0.0003]",
                                        'compile="max-autotune"', "mfu_variants=[[512, true]]"], FULL)
    assert got == {"pre_epochs": 12, "pre_lr": 1e-3, "ft_lrs": (0.0001, 0.0003), "compile": "max-autotune",
                   "mfu_variants": ((512, True),)}
    assert bench_models.parse_overrides(['seedsplit_splits=["random_25k_25k"]'], FULL) == {
        "seedsplit_splits": ("random_25k_25k",)}
    assert bench_models.parse_overrides([], FULL) == {}


@pytest.mark.parametrize("item, message", [
    ("epochs=3", "KEY one of"),                         # not a size of the profile
    ("pre_epochs", "expected KEY=VALUE"),
    ("pre_epochs=six", "must be JSON"),
    ("pre_epochs=2.5", "takes a int like 6"),
    ("pre_epochs=true", "takes a int like 6"),
    ("ft_truncation=3", "takes a str like 'head'"),
    ('seedsplit_splits=["random_1k"]', r"unknown split\(s\) \['random_1k'\]; known: \['random_25k_25k'"),
])
def test_bad_overrides_name_the_value_and_what_is_allowed(item, message):
    with pytest.raises(SystemExit, match=message):
        bench_models.parse_overrides([item], FULL)


def test_seedsplit_runs_only_the_chosen_splits(tmp_path):
    """``seedsplit_splits`` picks which random splits of train+test the seed recipe runs (tiny sizes)."""
    from types import SimpleNamespace

    import numpy as np

    from distattn.corpus.ragged import RaggedIds

    rng = np.random.default_rng(0)

    def docs(n):
        lengths = rng.integers(3, 12, n)
        return RaggedIds(rng.integers(2, 50, lengths.sum()).astype(np.int32),
                         np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    data = {"train": docs(40), "test": docs(40), "train_labels": np.tile([0, 1], 20), "test_labels": np.tile([0, 1], 20),
            "vocab_from": "train+unsup"}
    sizes = {**bench_models.SIZES["smoke"], **bench_models.parse_overrides(['seedsplit_splits=["random_40k_10k"]'],
                                                                          bench_models.SIZES["smoke"])}
    out = bench_models.part_seedsplit(data, SimpleNamespace(sizes=sizes, runs=tmp_path), bench_models.torch.device("cpu"))
    assert [(r["split"], r["seed"], r["n_train"], r["n_test"]) for r in out["runs"]] == [("random_40k_10k", 0, 64, 16)]
    assert len(out["runs"][0]["test_accuracy_per_epoch"]) == sizes["seed_epochs"]


def test_seedsplit_seeds_train_one_model_per_seed_on_the_same_split(tmp_path):
    """``seedsplit_seeds`` runs the seed recipe once per model seed on one fixed split, each in its own run
    directory; the same seed twice gives the same accuracies, another seed its own run."""
    from types import SimpleNamespace

    import numpy as np

    from distattn.corpus.ragged import RaggedIds

    rng = np.random.default_rng(1)

    def docs(n):
        lengths = rng.integers(3, 12, n)
        return RaggedIds(rng.integers(2, 50, lengths.sum()).astype(np.int32),
                         np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    data = {"train": docs(80), "test": docs(80), "train_labels": np.tile([0, 1], 40), "test_labels": np.tile([0, 1], 40),
            "vocab_from": "train+unsup"}
    smoke = bench_models.SIZES["smoke"]
    sizes = {**smoke, **bench_models.parse_overrides(['seedsplit_splits=["random_25k_25k"]', "seedsplit_seeds=[0, 3, 0]"],
                                                     smoke)}
    out = bench_models.part_seedsplit(data, SimpleNamespace(sizes=sizes, runs=tmp_path), bench_models.torch.device("cpu"))
    runs = out["runs"]
    assert [(r["split"], r["seed"], r["n_train"]) for r in runs] == [("random_25k_25k", s, 80) for s in (0, 3, 0)]
    assert runs[0]["test_accuracy_per_epoch"] == runs[2]["test_accuracy_per_epoch"]
    assert (tmp_path / "seedsplit_random_25k_25k").is_dir() and (tmp_path / "seedsplit_random_25k_25k_s3").is_dir()
