"""PMI / PPMI weighting: closed forms, dense/sparse agreement, edge cases, sklearn API."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.utils.estimator_checks import parametrize_with_checks

from distattn.stats.weighting import PPMITransformer, pmi, ppmi


def naive_pmi(C, cds=1.0):
    """Reference: the hyperwords definitions, one entry at a time."""
    C = np.asarray(C, dtype=float)
    total = C.sum()
    smoothed = C.sum(axis=0) ** cds
    out = np.full(C.shape, -np.inf)
    for w in range(C.shape[0]):
        for c in range(C.shape[1]):
            if C[w, c] > 0:
                p_wc = C[w, c] / total
                p_w = C[w].sum() / total
                p_c = smoothed[c] / smoothed.sum()
                out[w, c] = math.log(p_wc / (p_w * p_c))
    return out


HAND = np.array([[2.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


# ----------------------------------------------------------------------- closed forms

def test_independence_gives_zero_pmi():
    C = np.outer([1.0, 2.0, 5.0], [3.0, 1.0, 4.0, 2.0])
    assert_allclose(pmi(C), 0.0, atol=1e-12)
    S = pmi(sp.csr_array(C))
    assert S.nnz == C.size  # PMI = 0 entries stay stored: implicit entries mean -inf
    assert_allclose(S.toarray(), 0.0, atol=1e-12)
    P = ppmi(sp.csr_array(C))
    assert P.nnz <= C.size and (P.nnz == 0 or np.abs(P.data).max() < 1e-12)   # clipped at 0, nothing positive
    assert_allclose(ppmi(C), 0.0, atol=1e-12)


def test_two_by_two_closed_form():
    C = np.array([[1.0, 0.0], [0.0, 1.0]])  # P(w,c)=1/2, P(w)=P(c)=1/2 -> log 2
    assert_allclose(pmi(C), [[math.log(2), -np.inf], [-np.inf, math.log(2)]])
    assert_allclose(ppmi(sp.csr_array(C)).toarray(), [[math.log(2), 0], [0, math.log(2)]])


def test_hand_computed_three_by_three():
    # total 4, row sums (3, 1, 0), column sums (3, 1, 0)
    expected = np.array(
        [
            [math.log(2 * 4 / 9), math.log(4 / 3), -np.inf],
            [math.log(4 / 3), -np.inf, -np.inf],
            [-np.inf, -np.inf, -np.inf],
        ]
    )
    assert_allclose(pmi(HAND), expected)
    assert_allclose(ppmi(HAND), np.maximum(expected, 0))
    S = pmi(sp.coo_array(HAND))
    assert_array_equal(S.toarray() != 0, HAND != 0)
    assert_allclose(S.toarray()[HAND > 0], expected[HAND > 0])


def test_context_smoothing_closed_form():
    a = 0.75
    p_c = np.array([3**a, 1.0]) / (3**a + 1)
    got = pmi(HAND, cds=a)
    assert_allclose(got[0, 0], math.log(2 / 3) - math.log(p_c[0]))
    assert_allclose(got[0, 1], math.log(1 / 3) - math.log(p_c[1]))
    assert_allclose(got[1, 0], math.log(1 / 1) - math.log(p_c[0]))
    # smoothing raises the probability of the rare context, so its PMI drops
    assert got[0, 1] < pmi(HAND, cds=1.0)[0, 1]
    assert got[0, 0] > pmi(HAND, cds=1.0)[0, 0]


@pytest.mark.parametrize("cds", [1.0, 0.75, 0.3])
def test_matches_naive_reference(cds):
    rng = np.random.default_rng(1)
    C = rng.poisson(0.7, size=(7, 9)).astype(float)
    C[2] = 0
    C[:, 4] = 0
    assert_allclose(pmi(C, cds=cds), naive_pmi(C, cds))
    S = pmi(sp.csr_array(C), cds=cds).toarray()
    assert_allclose(S[C > 0], naive_pmi(C, cds)[C > 0])


@pytest.mark.parametrize("neg", [1, 2, 5, 15.5])
def test_shift(neg):
    rng = np.random.default_rng(2)
    C = rng.poisson(1.5, size=(8, 6)).astype(float)
    expected = np.maximum(naive_pmi(C, 0.75) - math.log(neg), 0)
    assert_allclose(ppmi(C, neg=neg, cds=0.75), expected, atol=1e-12)
    assert_allclose(ppmi(sp.csr_array(C), neg=neg, cds=0.75).toarray(), expected, atol=1e-12)
    if neg > 1:
        assert ppmi(sp.csr_array(C), neg=neg).nnz <= ppmi(sp.csr_array(C)).nnz


# ----------------------------------------------------------------------- formats, edge cases

@pytest.mark.parametrize(
    "fmt", [sp.csr_array, sp.csr_matrix, sp.csc_array, sp.coo_matrix, sp.lil_array, sp.dok_array]
)
def test_sparse_output_contract(fmt):
    rng = np.random.default_rng(3)
    C = rng.poisson(0.5, size=(10, 12)).astype(np.int32)
    C[0] = 0
    for fn in (pmi, ppmi):
        out = fn(fmt(C))
        assert isinstance(out, sp.csr_array)
        assert out.dtype == np.float64
        assert out.has_sorted_indices
        assert np.all(np.isfinite(out.data))
    assert np.all(ppmi(fmt(C)).data > 0)  # explicit zeros eliminated
    assert_allclose(ppmi(fmt(C)).toarray(), ppmi(C))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_sparse_output_has_int32_indices_where_they_fit(index_dtype):
    rows, cols = np.array([0, 1, 2, 2], dtype=index_dtype), np.array([1, 0, 2, 0], dtype=index_dtype)
    coo = sp.coo_array((np.array([1.0, 2.0, 3.0, 4.0]), (rows, cols)), shape=(3, 3))
    csr = sp.csr_array((coo.data, cols, np.array([0, 1, 2, 4], dtype=index_dtype)), shape=(3, 3))
    for C in (coo, csr):
        for out in (pmi(C), ppmi(C), PPMITransformer().fit_transform(C)):
            assert out.indices.dtype == np.int32 and out.indptr.dtype == np.int32
        assert_allclose(ppmi(C).toarray(), ppmi(C.toarray()))


def test_duplicates_and_explicit_zeros_in_input():
    rows, cols = np.array([0, 0, 1, 1, 2]), np.array([1, 1, 0, 2, 2])
    vals = np.array([1.0, 2.0, 4.0, 0.0, 0.0])
    C = sp.coo_array((vals, (rows, cols)), shape=(3, 3))
    out = pmi(C)
    assert out.nnz == 2  # (0,1) summed to 3, (1,0) = 4; stored zeros dropped
    assert_allclose(out.toarray()[[0, 1], [1, 0]], pmi(C.toarray())[[0, 1], [1, 0]])


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_dense_input_types_and_no_mutation():
    C = np.array([[1, 2], [3, 0]])
    copy = C.copy()
    out = ppmi(np.asmatrix(C))
    assert type(out) is np.ndarray and out.dtype == np.float64
    assert_allclose(ppmi(C.tolist()), out)
    assert_array_equal(C, copy)
    S = sp.csr_array(C.astype(float))
    data = S.data.copy()
    ppmi(S)
    assert_array_equal(S.data, data)


def test_zero_rows_columns_and_all_zero_matrix():
    C = np.zeros((4, 5))
    C[1, 2] = 3.0
    C[3, 0] = 1.0
    for X in (C, sp.csr_array(C)):
        out = ppmi(X, neg=2, cds=0.75)
        dense = out.toarray() if sp.issparse(out) else out
        assert np.all(np.isfinite(dense)) and np.all(dense >= 0)
        assert_array_equal(dense[[0, 2]], 0)
        assert_array_equal(dense[:, [1, 3, 4]], 0)
    Z = np.zeros((3, 3))
    assert_array_equal(ppmi(Z), 0)
    assert ppmi(sp.csr_array(Z)).nnz == 0
    assert pmi(sp.csr_array(Z)).nnz == 0
    assert np.all(np.isneginf(pmi(Z)))  # no NaN even for 0/0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"neg": 0.5}, r"neg must be .*>= 1.*0\.5"),
        ({"neg": np.inf}, "neg must be"),
        ({"cds": 0}, r"cds must be .*\(0, 1\].*0"),
        ({"cds": 1.5}, r"cds must be .*1\.5"),
        ({"cds": "0.75"}, "cds must be"),
    ],
)
def test_parameter_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ppmi(HAND, **kwargs)


def test_input_errors():
    with pytest.raises(ValueError, match=r"minimum found is -2\.5"):
        ppmi(np.array([[1.0, -2.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"minimum found is -1\.0"):
        pmi(sp.csr_array(np.array([[1.0, -1.0]])))
    with pytest.raises(ValueError, match="NaN or inf"):
        ppmi(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="2-D"):
        ppmi(np.ones(3))


# ----------------------------------------------------------------------- property test

@st.composite
def sparse_counts(draw):
    n_rows = draw(st.integers(1, 12))
    n_cols = draw(st.integers(1, 12))
    density = draw(st.floats(0.0, 1.0))
    seed = draw(st.integers(0, 2**32 - 1))
    integer = draw(st.booleans())
    rng = np.random.default_rng(seed)
    mask = rng.random((n_rows, n_cols)) < density
    if integer:
        values = rng.integers(1, 10**6, size=mask.sum()).astype(float)
    else:
        values = np.exp(rng.uniform(-20, 25, size=mask.sum()))
    C = np.zeros((n_rows, n_cols))
    C[mask] = values
    return C


@settings(max_examples=60, deadline=None)
@given(C=sparse_counts(), neg=st.sampled_from([1, 2, 5]), cds=st.sampled_from([1.0, 0.75, 0.5]))
def test_ppmi_property(C, neg, cds):
    S = ppmi(sp.csr_array(C), neg=neg, cds=cds)
    D = ppmi(C, neg=neg, cds=cds)
    assert np.all(np.isfinite(S.data)) and np.all(S.data > 0)
    assert np.all(np.isfinite(D)) and np.all(D >= 0)
    assert_allclose(S.toarray(), D, rtol=1e-12, atol=1e-12)
    P = pmi(sp.csr_array(C), cds=cds)
    assert np.all(np.isfinite(P.data))
    assert P.nnz == np.count_nonzero(C)
    T = PPMITransformer(neg=neg, cds=cds).fit_transform(sp.csr_array(C))
    assert_allclose(T.toarray(), D, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------- transformer

def test_transformer_matches_function_and_is_row_wise():
    rng = np.random.default_rng(4)
    C = sp.random_array((20, 15), density=0.3, rng=rng, format="csr") * 10
    tr = PPMITransformer(neg=2, cds=0.75).fit(C)
    assert tr.n_features_in_ == 15
    assert_allclose(tr.transform(C).toarray(), ppmi(C, neg=2, cds=0.75).toarray())
    subset = tr.transform(C[[3, 7]]).toarray()
    assert_allclose(subset, tr.transform(C).toarray()[[3, 7]])
    dense = tr.transform(C.toarray())
    assert isinstance(dense, np.ndarray)
    assert_allclose(dense, tr.transform(C).toarray())


def test_transformer_unseen_context_is_zero_not_inf():
    fit_counts = np.array([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])  # context 2 never seen
    tr = PPMITransformer(cds=1.0).fit(fit_counts)
    assert np.isneginf(tr.context_log_prob_[2])
    new = np.array([[1.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    for X in (new, sp.csr_array(new)):
        out = tr.transform(X)
        dense = out.toarray() if sp.issparse(out) else out
        assert np.all(np.isfinite(dense))
        assert dense[0, 2] == 0 and np.all(dense[1] == 0)


def test_transformer_errors():
    with pytest.raises(ValueError, match=r"Negative values in data passed to PPMITransformer.fit"):
        PPMITransformer().fit(np.array([[1.0, -3.0]]))
    tr = PPMITransformer().fit(HAND)
    with pytest.raises(ValueError, match=r"PPMITransformer.transform: the minimum found is -1"):
        tr.transform(np.array([[1.0, -1.0, 0.0]]))
    with pytest.raises(ValueError, match="cds must be"):
        PPMITransformer(cds=2).fit(HAND)
    with pytest.raises(ValueError, match="neg must be"):
        PPMITransformer(neg=0).fit(HAND)


@parametrize_with_checks([PPMITransformer(), PPMITransformer(neg=5, cds=1.0)])
def test_sklearn_compatible(estimator, check):
    check(estimator)
