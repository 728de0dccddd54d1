"""``benchmarks/bench_models.py``'s ``svd_vectors``: the PPMI-SVD init of a model narrower than the
prepared vectors (row B or D, d=256, run on the 512-d arrays of ``.gpu/prep512``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_models  # noqa: E402

from distattn.stats import SVDEmbeddings, ppmi  # noqa: E402


def test_narrower_model_gets_the_rank_d_vectors_prepare_imdb_would_write():
    """prepare_imdb writes SVDEmbeddings(dim, eig=0.5).vectors_, rows L2-normalised at the full
    width; the first d columns of those rows were once used as they were (row norms about 0.6 to
    0.9), not the rank-d vectors the script says it uses."""
    counts = sp.random(120, 120, density=0.2, random_state=1, format="csr")
    counts = counts + counts.T
    counts.data = np.round(counts.data * 10) + 1
    P = ppmi(counts.tocsr(), cds=0.75)
    wide = SVDEmbeddings(dim=24, eig=0.5, algorithm="arpack").fit(P).vectors_
    narrow = SVDEmbeddings(dim=12, eig=0.5, algorithm="arpack").fit(P).vectors_
    wide[5] = 0.0                       # an all-zero row (a special id) stays zero
    narrow[5] = 0.0
    got = bench_models.svd_vectors({"svd": wide.astype(np.float32)}, 12, smoke=False)
    assert got.shape == (120, 12)
    sign = np.sign((got * narrow).sum(axis=0))          # each component's sign is arbitrary
    np.testing.assert_allclose(got * sign, narrow, atol=1e-5)
    assert not got[5].any()


def test_vectors_of_the_models_width_are_used_as_prepared():
    v = np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)
    assert np.array_equal(bench_models.svd_vectors({"svd": v}, 8, smoke=False), v)
