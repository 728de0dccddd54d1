"""``analyses/movie_overlap.py``: how much the classifiers' validation reviews share movies with
their training reviews, and NB-LR scored on a random and on a movie-disjoint validation split."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analyses" / "movie_overlap.py"


def _load():
    spec = importlib.util.spec_from_file_location("movie_overlap", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_script_splits_with_the_librarys_functions():
    """Its movie-disjoint split is the library's (tested in tests/test_movie_split.py); its random
    split is ngram_baseline's, which tests/test_analyses_baseline.py checks equals bench_models'."""
    from distattn.corpus import movie_disjoint_split

    mod = _load()
    assert mod.movie_disjoint_split is movie_disjoint_split
    assert mod.random_validation.__module__ == "ngram_baseline"


@pytest.mark.imdb
def test_movie_overlap_runs_on_a_slice(imdb_archive, tmp_path):
    mod = _load()
    table = tmp_path / "o.json"
    out = mod.main(["--nbsvm", "--limit-docs", "600", "--n-val", "150", "--data-dir", str(imdb_archive.parent),
                    "--json", str(table)])
    assert out["shared_movies"]["train&test"] <= 1 and out["shared_movies"]["test&unsup"] == 0
    share = out["random_validation"]["share_of_reviews_whose_movie_is_in_the_rest_of_train"]
    assert share > 0.8 > 0.01 > out["test_reviews_whose_movie_is_in_train"]
    nb = out["nbsvm"]
    assert {c["validation"] for c in nb["grid"]} == {"random", "movie-disjoint"} and len(nb["grid"]) == 24
    for name, picked in nb["picked"].items():
        cells = [c for c in nb["grid"] if c["validation"] == name]
        assert picked == max(cells, key=lambda c: c["val_accuracy"])     # picked on validation, not test
        assert 0.6 < picked["test_accuracy"] <= 1.0
    assert nb["picked"]["movie-disjoint"]["n_val"] >= 150
    assert json.loads(table.read_text())["nbsvm"]["picked"] == nb["picked"]


@pytest.mark.parametrize("argv, message", [
    (["--limit-docs", "600"], "only with --nbsvm"),
    (["--nbsvm", "--limit-docs", "100"], "at least 2 × --n-val"),
    (["--n-val", "25000"], "fewer than the 25,000"),
    (["--n-val", "0"], "--n-val"),
])
def test_bad_arguments_are_refused_before_any_data_is_read(argv, message, capsys, tmp_path):
    mod = _load()
    with pytest.raises(SystemExit) as exc:
        mod.main(argv + ["--data-dir", str(tmp_path / "nothing_here")])
    assert exc.value.code == 2 and message in capsys.readouterr().err
