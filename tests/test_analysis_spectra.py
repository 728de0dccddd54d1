"""distattn.analysis: factored matrices, spectra, subspace angles, QK–PMI correlation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

from distattn.analysis import (FactoredMatrix, as_factored, circuit_alignment, circuit_spectra, effective_rank,
                               energy_fraction, power_law_fit, principal_angles, qk_pmi_correlation,
                               qk_pmi_correlations, spectrum, spectrum_summary, stable_rank, subspace_alignment,
                               top_frequent_ids)

rng = np.random.default_rng(0)


# --------------------------------------------------------------------------- FactoredMatrix

def _factors(n=30, r=4, m=25, seed=0):
    g = np.random.default_rng(seed)
    return g.standard_normal((n, r)), g.standard_normal((r, m))


def test_factored_svd_matches_dense_and_reconstructs():
    L, R = _factors()
    F = FactoredMatrix(L, R)
    dense = L @ R
    u, s, vt = F.svd()
    assert u.shape == (30, 4) and s.shape == (4,) and vt.shape == (4, 25)
    np.testing.assert_allclose(u * s @ vt, dense, atol=1e-10)
    np.testing.assert_allclose(s, np.linalg.svd(dense, compute_uv=False)[:4], rtol=1e-10)
    np.testing.assert_allclose(F.singular_values, s, rtol=1e-12)
    np.testing.assert_allclose(u.T @ u, np.eye(4), atol=1e-10)
    assert F.frobenius_sq == pytest.approx(np.sum(dense ** 2), rel=1e-10)


def test_factored_entries_rows_submatrix_and_composition():
    L, R = _factors()
    F = FactoredMatrix(L, R)
    dense = L @ R
    assert F.entry(3, 7) == pytest.approx(dense[3, 7])
    np.testing.assert_allclose(F.rows([1, 4]), dense[[1, 4]])
    rows, cols = np.array([5, 0, 9]), np.array([2, 2, 24, 1])
    np.testing.assert_allclose(F.submatrix(rows, cols), dense[np.ix_(rows, cols)])
    G = FactoredMatrix(*_factors(25, 6, 10, seed=1))
    np.testing.assert_allclose((F @ G).to_dense(), dense @ G.to_dense(), atol=1e-10)
    assert (F @ G).inner_dim == 4                           # through the smaller inner dimension
    X = rng.standard_normal((25, 3))
    np.testing.assert_allclose((F @ X).to_dense(), dense @ X, atol=1e-10)
    Y = rng.standard_normal((2, 30))
    np.testing.assert_allclose((Y @ F).to_dense(), Y @ dense, atol=1e-10)
    np.testing.assert_allclose(F.T.to_dense(), dense.T)


def test_rows_of_a_stack_of_heads_keep_each_head_with_its_own_right_factor():
    # rows(5) of (H, n, m) heads was head h's row times every head's right factor: (H, H, m)
    F = FactoredMatrix(rng.standard_normal((3, 6, 2)), rng.standard_normal((3, 2, 7)))
    dense = F.to_dense()
    assert F.rows(5).shape == (3, 7)
    np.testing.assert_allclose(F.rows(5), dense[:, 5], atol=1e-12)
    ids = np.array([[1, 2], [0, 5]])
    np.testing.assert_allclose(F.rows(ids), dense[:, ids], atol=1e-12)
    np.testing.assert_allclose(F.rows([4, 1]), dense[:, [4, 1]], atol=1e-12)
    np.testing.assert_allclose(F.rows(slice(2, 5)), dense[:, 2:5], atol=1e-12)
    np.testing.assert_allclose(F.rows(dense[0, :, 0] > 0), dense[:, dense[0, :, 0] > 0], atol=1e-12)
    np.testing.assert_allclose(F[1].rows(ids), dense[1][ids], atol=1e-12)


def test_submatrix_of_a_stack_of_heads_keeps_each_head_with_its_own_factors():
    # a scalar or 2-D row index multiplied every head's rows with every head's columns
    F = FactoredMatrix(rng.standard_normal((3, 6, 2)), rng.standard_normal((3, 2, 7)))
    dense = F.to_dense()
    grid = np.array([[0, 1], [2, 3], [5, 0]])                 # 3 rows of ids, as many as heads
    for rows, cols in ((4, [1, 3]), (grid, [1, 3]), ([0, 5], 2), (grid, grid), ([2, 2, 0], [6, 0])):
        want = dense[..., rows, :][..., :, cols]
        got = F.submatrix(rows, cols)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-12)
    assert F[0].submatrix(4, 1) == pytest.approx(dense[0, 4, 1])


def test_a_stack_of_heads_composes_with_one_factored_matrix():
    # heads broadcast against a single matrix, as F @ X does for a dense X
    stack = FactoredMatrix(rng.standard_normal((3, 6, 2)), rng.standard_normal((3, 2, 5)))
    one = FactoredMatrix(rng.standard_normal((5, 1)), rng.standard_normal((1, 4)))
    wide = FactoredMatrix(rng.standard_normal((5, 3)), rng.standard_normal((3, 7)))    # inner dim 3 > 2
    for a, b in ((stack, one), (one.T, stack.T), (stack, wide)):
        product = a @ b
        np.testing.assert_allclose(product.to_dense(), a.to_dense() @ b.to_dense(), atol=1e-10)
    with pytest.raises(ValueError, match="cannot compose"):
        stack @ FactoredMatrix(rng.standard_normal((2, 5, 1)), rng.standard_normal((2, 1, 4)))


def test_factored_eigenvalues_and_heads():
    L, R = _factors(12, 3, 12)
    F = FactoredMatrix(L, R)
    ev = np.sort_complex(F.eigenvalues())
    dense_ev = np.linalg.eigvals(L @ R)
    top = dense_ev[np.argsort(-np.abs(dense_ev))[:3]]
    np.testing.assert_allclose(ev, np.sort_complex(top), atol=1e-9)
    stack = FactoredMatrix(rng.standard_normal((3, 12, 2)), rng.standard_normal((3, 2, 9)))
    assert stack.shape == (3, 12, 9) and len(stack) == 3
    np.testing.assert_allclose(stack.singular_values[1], np.linalg.svd(stack[1].to_dense(), compute_uv=False)[:2],
                               rtol=1e-10)
    with pytest.raises(IndexError):
        F[0]


def test_as_factored_duck_types_and_errors():
    import torch
    L, R = _factors()

    class AB:
        A = torch.tensor(L, dtype=torch.float32, requires_grad=True)
        B = torch.tensor(R, dtype=torch.float32)

    class LR:
        left, right = L, R

    for obj in (AB(), LR(), (L, R), FactoredMatrix(L, R)):
        np.testing.assert_allclose(as_factored(obj).to_dense(), L @ R, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="left/right or A/B"):
        as_factored(np.eye(3))
    with pytest.raises(ValueError, match="same r"):
        FactoredMatrix(np.ones((3, 2)), np.ones((3, 4)))


# --------------------------------------------------------------------------- metrics

def test_closed_form_metrics_identity_and_rank_one():
    n = 6
    ident = spectrum(np.eye(n))
    assert effective_rank(ident) == pytest.approx(n)
    assert stable_rank(ident) == pytest.approx(n)
    assert energy_fraction(ident, 2) == pytest.approx(2 / n)
    u, v = rng.standard_normal(8), rng.standard_normal(5)
    rank1 = spectrum(np.outer(u, v))
    assert effective_rank(rank1) == pytest.approx(1.0, abs=1e-6)
    assert stable_rank(rank1) == pytest.approx(1.0)
    assert energy_fraction(rank1, 1) == pytest.approx(1.0)
    # a geometric spectrum: p_i = σ_i / Σσ, erank = exp(H(p))
    s = 0.5 ** np.arange(5)
    p = s / s.sum()
    assert effective_rank(s) == pytest.approx(np.exp(-(p * np.log(p)).sum()))


def test_sparse_truncated_spectrum_keeps_exact_energy():
    X = sp.random(80, 60, density=0.2, random_state=1, format="csr")
    dense_s = np.linalg.svd(X.toarray(), compute_uv=False)
    fro = float((X.toarray() ** 2).sum())
    for algorithm in ("arpack", "randomized"):
        spec = spectrum(X, 6, algorithm=algorithm)
        assert spec.truncated and spec.shape == (80, 60)
        np.testing.assert_allclose(spec.singular_values, dense_s[:6], rtol=1e-4 if algorithm == "randomized" else 1e-8)
        assert spec.frobenius_sq == pytest.approx(fro)
        assert stable_rank(spec) == pytest.approx(fro / dense_s[0] ** 2, rel=1e-6)
        assert energy_fraction(spec, 6) == pytest.approx((dense_s[:6] ** 2).sum() / fro, rel=1e-5)
    with pytest.raises(ValueError, match="needs k"):
        spectrum(X)
    full = spectrum(X, algorithm="dense")
    assert not full.truncated and len(full) == 60


def _with_duplicates(X):
    """The same matrix as a non-canonical CSR: every stored entry split into two halves, in a
    shuffled column order (valid scipy input: duplicates are summed)."""
    X = sp.csr_array(X)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    r, c = np.concatenate([rows, rows]), np.concatenate([X.indices, X.indices])
    data = np.concatenate([X.data, X.data]) / 2
    order = np.lexsort((np.random.default_rng(0).random(r.size), r))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=X.shape[0]))])
    out = sp.csr_array((data[order], c[order], indptr), shape=X.shape)
    assert not out.has_canonical_format
    np.testing.assert_array_equal(out.toarray(), X.toarray())
    return out


def test_sparse_spectrum_energy_of_a_matrix_with_duplicate_entries():
    # ‖A‖_F² was the sum of the squared *stored* values: with duplicates (a + b)² read as a² + b²,
    # so the stable rank and the energy fractions came out wrong (here halved / doubled)
    X = sp.random(40, 30, density=0.2, random_state=2, format="csr")
    D = _with_duplicates(X)
    fro = float((X.toarray() ** 2).sum())
    for algorithm in ("arpack", "randomized", "dense"):
        spec = spectrum(D, 5, algorithm=algorithm)
        assert spec.frobenius_sq == pytest.approx(fro)
        assert stable_rank(spec) == pytest.approx(stable_rank(spectrum(X, 5, algorithm=algorithm)), rel=1e-5)
    assert D.nnz == 2 * X.nnz                            # the caller's matrix is left as it was


def test_factored_spectrum_is_complete_and_exact():
    L, R = _factors(40, 5, 35)
    spec = spectrum(FactoredMatrix(L, R), name="qk")
    dense = np.linalg.svd(L @ R, compute_uv=False)
    np.testing.assert_allclose(spec.singular_values, dense[:5], rtol=1e-10)
    assert not spec.truncated
    assert energy_fraction(spec, 5) == pytest.approx(1.0)
    summary = spectrum_summary(spec, energy_ks=(1, 5, 50))
    assert summary["k"] == 5 and set(summary["energy_fraction"]) == {1, 5} and summary["name"] == "qk"
    specs = circuit_spectra(FactoredMatrix(rng.standard_normal((3, 40, 4)), rng.standard_normal((3, 4, 40))), "QK")
    assert [s.name for s in specs] == ["QK[0]", "QK[1]", "QK[2]"]
    with pytest.raises(ValueError, match="index the"):
        spectrum(FactoredMatrix(rng.standard_normal((2, 5, 2)), rng.standard_normal((2, 2, 5))))


def _wwfit_reference(evals):
    """WeightWatcher's WWFit.fit_power_law, transcribed with its per-xmin loop."""
    data = np.sort(np.asarray(evals, dtype=np.float64))
    N = len(data)
    log_data = np.log(data)
    alphas, Ds = np.zeros(N - 1), np.ones(N - 1)
    for i, xmin in enumerate(data[:-1]):
        n = float(N - i)
        alpha = 1 + n / (np.sum(log_data[i:]) - n * log_data[i])
        alphas[i] = alpha
        if alpha > 1:
            Ds[i] = np.max(np.abs(1 - (data[i:] / xmin) ** (-alpha + 1) - np.arange(n) / n))
    i = int(np.argmin(Ds))
    return alphas[i], data[i], Ds[i]


def test_power_law_fit_matches_weightwatcher_loop_and_recovers_alpha():
    sv = np.sqrt(rng.pareto(2.0, size=300) + 1.0) * rng.uniform(0.5, 2.0, size=300)
    fit = power_law_fit(sv)
    alpha, xmin, D = _wwfit_reference(sv ** 2)
    assert fit.alpha == pytest.approx(alpha, rel=1e-10)
    assert fit.xmin == pytest.approx(xmin, rel=1e-12)
    assert fit.ks_distance == pytest.approx(D, rel=1e-10)
    # a pure Pareto sample with p(λ) ∝ λ^-2.5 for λ >= 1
    lam = (1.0 - rng.uniform(size=4000)) ** (-1.0 / 1.5)
    fit = power_law_fit(lam, squared=False)
    assert fit.alpha == pytest.approx(2.5, abs=0.12)
    fixed = power_law_fit(lam, squared=False, xmin=1.0)
    assert fixed.n_tail >= 3999 and fixed.alpha == pytest.approx(2.5, abs=0.1)
    with pytest.raises(ValueError, match="at least 2"):
        power_law_fit([1.0, 0.0])


def test_power_law_fit_of_a_tail_of_ties_is_not_rounding_noise():
    """Σ log(λ_i / xmin) over a tail of equal eigenvalues was a difference of two sums whose
    rounding residue has either sign: for some values alpha came out ~1e15 with D = (n-1)/n
    and a tail of arbitrary length (all equal λ: alpha 3.4e15, n_tail 6 of 10), for others inf."""
    for x in np.concatenate([[9.784830567017442], np.random.default_rng(4).uniform(0.1, 10.0, 30)]):
        for n in (2, 3, 5, 10):
            fit = power_law_fit([x] * n, squared=False)
            assert (fit.alpha, fit.ks_distance, fit.n_tail) == (np.inf, 1.0, n)
    # a tail of ties inside a spectrum is no candidate either: D = 1 whatever the rounding
    lam = np.array([1.0, 2.0] + [9.784830567017442] * 10)
    fit = power_law_fit(lam, squared=False, xmin=lam[5])
    assert fit.alpha == np.inf and fit.ks_distance == 1.0


# --------------------------------------------------------------------------- subspaces

def test_principal_angles_match_scipy_and_alignment_bounds():
    A, B = rng.standard_normal((20, 4)), rng.standard_normal((20, 3))
    np.testing.assert_allclose(principal_angles(A, B), np.sort(scipy.linalg.subspace_angles(A, B)), atol=1e-10)
    U = np.linalg.qr(rng.standard_normal((30, 30)))[0]
    X = (U[:, :5] * [9, 8, 7, 6, 5]) @ np.linalg.qr(rng.standard_normal((30, 5)))[0].T
    same = subspace_alignment(X, 2 * X, 5, algorithm="dense")
    assert same.mean_cos2 == pytest.approx(1.0) and np.allclose(same.angles_deg, 0, atol=1e-5)
    Y = (U[:, 5:10] * [9, 8, 7, 6, 5]) @ np.linalg.qr(rng.standard_normal((30, 5)))[0].T
    other = subspace_alignment(X, Y, 5, algorithm="dense")
    assert other.mean_cos2 == pytest.approx(0.0, abs=1e-10) and other.chance == pytest.approx(5 / 30)


def test_circuit_alignment_with_sparse_statistic():
    g = np.random.default_rng(3)
    U = np.linalg.qr(g.standard_normal((50, 50)))[0]
    P = sp.csr_array((U[:, :3] * [5.0, 4.0, 3.0]) @ U[:, :3].T)
    heads = FactoredMatrix(np.stack([U[:, :3], U[:, 10:13]]), np.stack([U[:, :3].T, U[:, 10:13].T]))
    res = circuit_alignment(P, heads, 3, algorithm="arpack")
    assert res[0].mean_cos2 == pytest.approx(1.0, abs=1e-8)
    assert res[1].mean_cos2 == pytest.approx(0.0, abs=1e-8)


# --------------------------------------------------------------------------- QK vs PMI

def _ppmi(vocab=40, density=0.3, seed=0, symmetric=True):
    g = np.random.default_rng(seed)
    P = g.exponential(1.0, (vocab, vocab)) * (g.uniform(size=(vocab, vocab)) < density)
    if symmetric:
        P = np.triu(P) + np.triu(P, 1).T
    return P


def test_qk_pmi_correlation_is_one_for_the_ppmi_block_and_minus_one_reversed():
    P = _ppmi()
    ids = np.arange(3, 23)
    same = qk_pmi_correlation(FactoredMatrix(P, np.eye(40)), sp.csr_array(P), ids)
    assert same.rho_all == pytest.approx(1.0) and same.rho_positive == pytest.approx(1.0)
    assert same.n_pairs_all == 20 * 19
    block = P[np.ix_(ids, ids)]
    assert same.n_pairs_positive == int(((block > 0) & ~np.eye(20, dtype=bool)).sum())
    reversed_ = qk_pmi_correlation((-np.exp(P), np.eye(40)), P, ids)      # monotone decreasing
    assert reversed_.rho_all == pytest.approx(-1.0) and reversed_.rho_positive == pytest.approx(-1.0)
    dense = qk_pmi_correlation(P, P, ids)
    assert dense.rho_all == pytest.approx(1.0)
    noise = qk_pmi_correlation(rng.standard_normal((40, 40)), P, ids)
    assert abs(noise.rho_all) < 0.2


def test_qk_pmi_correlation_orientation_for_directional_ppmi():
    D = _ppmi(symmetric=False, seed=4)
    ids = top_frequent_ids(D.sum(1) + D.sum(0), 25)
    # a causal head scoring key b for query a by "a follows b" = D[b, a]
    qk = (D.T, np.eye(40))
    assert qk_pmi_correlation(qk, sp.csr_array(D), ids, orientation="key_query").rho_all == pytest.approx(1.0)
    assert qk_pmi_correlation(qk, sp.csr_array(D), ids, orientation="query_key").rho_all < 0.9
    with pytest.raises(ValueError, match="orientation"):
        qk_pmi_correlation(qk, D, ids, orientation="both")
    with pytest.raises(ValueError, match="distinct"):
        qk_pmi_correlation(qk, D, np.array([1, 1, 2]))


def test_qk_pmi_correlations_of_several_heads_match_scipy_and_the_one_head_call():
    from scipy import stats
    P = _ppmi(symmetric=False, seed=6)
    ids = np.arange(2, 32)
    g = np.random.default_rng(9)
    left, right = g.standard_normal((3, 40, 4)), g.standard_normal((3, 4, 40))
    left[1] = np.round(left[1], 0)                                    # ties in the scores
    rows = qk_pmi_correlations((left, right), sp.csr_array(P), ids, orientation="key_query")
    assert len(rows) == 3
    off = ~np.eye(ids.size, dtype=bool)
    y = P[np.ix_(ids, ids)].T[off]
    for h, r in enumerate(rows):
        x = (left[h] @ right[h])[np.ix_(ids, ids)][off]
        ref = stats.spearmanr(x, y)
        ref_pos = stats.spearmanr(x[y > 0], y[y > 0])
        assert r.rho_all == pytest.approx(ref.statistic, abs=1e-12) and r.pvalue_all == pytest.approx(ref.pvalue)
        assert r.rho_positive == pytest.approx(ref_pos.statistic, abs=1e-12)
        assert r.pvalue_positive == pytest.approx(ref_pos.pvalue)
        assert r == qk_pmi_correlation((left[h], right[h]), P, ids, orientation="key_query")


@pytest.mark.parametrize("algorithm,k", [("randomized", 8), ("arpack", 8), ("dense", 8), ("randomized", 39)])
def test_spectrum_return_vectors_are_the_singular_vectors_of_its_values(algorithm, k):
    X = sp.csr_array(_ppmi(symmetric=False, seed=3))
    plain = spectrum(X, k, algorithm=algorithm)
    spec, u, vt = spectrum(X, k, algorithm=algorithm, return_vectors=True)
    np.testing.assert_allclose(spec.singular_values, plain.singular_values, rtol=1e-12)   # LAPACK with/without uv
    assert u.shape == (40, k) and vt.shape == (k, 40)
    np.testing.assert_allclose(u.T @ (X @ vt.T), np.diag(spec.singular_values), atol=1e-3 * spec.singular_values[0])
    np.testing.assert_allclose(u.T @ u, np.eye(k), atol=1e-5)


def test_average_ranks_match_scipy_rankdata():
    from scipy.stats import rankdata
    from distattn.analysis._ranks import average_ranks, spearman
    g = np.random.default_rng(2)
    X = g.integers(0, 4, size=(7, 9, 11)).astype(float)
    X[0, 0, :3] = np.inf
    for axis in (0, 1, 2, -1):
        np.testing.assert_array_equal(average_ranks(X, axis=axis), rankdata(X, axis=axis))
    np.testing.assert_array_equal(average_ranks(np.array([3.0])), [1.0])
    assert average_ranks(np.zeros(0)).shape == (0,)
    assert np.isnan(spearman([1, 2, 3], [5, 5, 5])[0]) and np.isnan(spearman([1, 2], [3, 4])[0])


def test_top_frequent_ids_excludes_and_breaks_ties_by_id():
    assert top_frequent_ids([5, 9, 9, 1, 7], 3, exclude=[1]).tolist() == [2, 4, 0]


def test_top_frequent_ids_takes_row_sums_not_the_matrix():
    import scipy.sparse as sp
    S = sp.csr_matrix(np.array([[0, 2, 1], [2, 0, 5], [1, 5, 0]]))
    assert top_frequent_ids(S.sum(axis=1), 2).tolist() == [1, 2]            # np.matrix (3, 1), as old scipy gives
    assert top_frequent_ids(sp.csr_array(S).sum(axis=1), 2).tolist() == [1, 2]
    for bad, kind in ((S, "a scipy.sparse matrix"), (S.toarray(), r"shape \(3, 3\)")):
        with pytest.raises(ValueError, match=rf"counts must be a 1-D array of per-id counts .*; got {kind}"):
            top_frequent_ids(bad, 2)        # once "setting an array element with a sequence" or ids of the raveled matrix


def test_qk_pmi_correlation_needs_one_vocabulary_on_both_sides():
    g = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"head 0's qk circuit has shape \(8, 8\) but ppmi has shape \(6, 6\)"):
        qk_pmi_correlation(g.random((8, 8)), g.random((6, 6)), [0, 1, 2])   # once correlated different words
    from distattn.analysis import top_frequent_ids
    with pytest.raises(ValueError, match=r"exclude must hold ids in \[0, 3\); got \[-1\]"):
        top_frequent_ids([1, 2, 3], 2, exclude=[-1])                          # once dropped the last id
    assert top_frequent_ids([1, 2, 3], 2, exclude=[2]).tolist() == [1, 0]


def test_principal_angles_of_linearly_dependent_columns_are_those_of_their_span():
    # span{e1} (a zero second column adds nothing) is orthogonal to span{e2}; QR completed the
    # zero column to e2 and reported a shared direction (angle 0)
    U1 = np.zeros((3, 2))
    U1[0, 0] = 1.0
    U2 = np.array([[0.0], [1.0], [0.0]])
    np.testing.assert_allclose(principal_angles(U1, U2), [np.pi / 2], atol=1e-12)
    A = rng.standard_normal((10, 2))
    A = np.hstack([A, A @ [[1.0], [2.0]]])                 # rank 2 in three columns
    B = rng.standard_normal((10, 3))
    np.testing.assert_allclose(principal_angles(A, B), np.sort(scipy.linalg.subspace_angles(A, B)), atol=1e-10)


def test_subspace_helpers_refuse_non_finite_bases():
    from distattn.projection.asymmetric import factored_svd
    U = np.eye(4)[:, :2]
    bad = U.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="U1 and U2 must be finite"):
        principal_angles(bad, U)
    with pytest.raises(ValueError, match="left must be finite; it holds NaN or inf"):
        factored_svd(bad, U)
    np.testing.assert_allclose(principal_angles(U, U), [0.0, 0.0], atol=1e-7)


def test_spectrum_metrics_refuse_a_matrix_for_its_singular_values():
    A = np.array([[0.7, 0.3], [0.4, 0.6]])          # e.g. an attention matrix passed instead of spectrum(A)
    for metric in (effective_rank, stable_rank, lambda s: energy_fraction(s, 1), power_law_fit):
        with pytest.raises(ValueError, match=r"got an array of shape \(2, 2\). Pass spectrum\(X\)"):
            metric(A)                                # once read the four entries as singular values
    assert effective_rank(spectrum(A)) == pytest.approx(effective_rank(np.linalg.svd(A, compute_uv=False)))
    assert effective_rank(np.array([[3.0], [1.0]])) == effective_rank([3.0, 1.0])   # a column of values is fine


def test_qk_pmi_correlation_and_top_frequent_ids_refuse_nan():
    g = np.random.default_rng(1)
    qk, P = g.random((6, 6)), g.random((6, 6))
    bad = P.copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="ppmi holds NaN or inf"):
        qk_pmi_correlation(qk, bad, [0, 1, 2, 3])           # once a rho and p-value with NaN ranked as a value
    with pytest.raises(ValueError, match="ppmi holds NaN or inf"):
        qk_pmi_correlation(qk, sp.csr_array(bad), [0, 1, 2, 3])
    qk_bad = qk.copy()
    qk_bad[2, 3] = np.inf
    with pytest.raises(ValueError, match="head 0's qk circuit holds NaN or inf"):
        qk_pmi_correlation(qk_bad, P, [0, 1, 2, 3])
    assert np.isfinite(qk_pmi_correlation(qk_bad, P, [0, 1, 2]).rho_all)   # only the words compared matter
    with pytest.raises(ValueError, match=r"counts must be finite; ids \[1\] hold NaN or inf"):
        top_frequent_ids([3.0, np.nan, 1.0], 2)                # once dropped id 1 silently


def test_dense_only_analyses_name_a_sparse_input():
    """Every analysis that reads attention, kernels, bases or distributions as dense arrays once
    failed on a scipy.sparse input with numpy's 'setting an array element with a sequence'."""
    import distattn.analysis as A
    M = np.full((3, 3), 1 / 3)
    Ms = sp.csr_array(M)
    calls = [lambda: A.attention_graph(Ms), lambda: A.pagerank(Ms), lambda: A.entropy(Ms),
             lambda: A.js_divergence(Ms, M), lambda: A.cka(Ms, M), lambda: A.linear_cka(Ms, M),
             lambda: A.attention_rollout(Ms), lambda: A.row_agreement(Ms, M), lambda: A.principal_angles(Ms, M),
             lambda: FactoredMatrix(Ms, M), lambda: FactoredMatrix(M, M) @ Ms]
    for call in calls:
        with pytest.raises(TypeError, match=r"got a scipy.sparse matrix of shape \(3, 3\) \(pass x.toarray\(\)"):
            call()
    assert A.entropy(M).tolist() == pytest.approx([np.log(3)] * 3)


def test_top_singular_vectors_and_subspace_alignment_check_the_matrix():
    from distattn.analysis import top_singular_vectors
    X = np.random.default_rng(2).standard_normal((5, 4))
    bad = X.copy()
    bad[1, 1] = np.nan
    for arg in (bad, sp.csr_array(bad)):
        with pytest.raises(ValueError, match="X contains NaN or inf"):
            top_singular_vectors(arg, 3)                    # once LinAlgError "SVD did not converge"
        with pytest.raises(ValueError, match="X contains NaN or inf"):
            subspace_alignment(arg, X, 3)
    with pytest.raises(ValueError, match=r"X must be 2-D, got shape \(4,\)"):
        top_singular_vectors(X[0], 1)                       # once "not enough values to unpack"
    assert top_singular_vectors(X, 2).shape == (5, 2)


def test_top_frequent_ids_refuses_a_0d_count():
    """A 0-d array was read as the counts of a one-word vocabulary and gave id 0."""
    with pytest.raises(ValueError, match=r"counts must be a 1-D array.*got shape \(\)"):
        top_frequent_ids(np.array(5), 2)


def test_factored_indexing_past_the_head_axes_is_refused():
    """F[0, [1, 0]] indexed right's inner axis with the row index too: with an inner dim of 2 it
    returned left[0, [1, 0]] @ right[0, [1, 0]], a wrong matrix, without an error."""
    g = np.random.default_rng(0)
    F = FactoredMatrix(g.standard_normal((3, 4, 2)), g.standard_normal((3, 2, 5)))
    assert F[1].shape == (4, 5) and F[[0, 2]].shape == (2, 4, 5)
    np.testing.assert_allclose(F[np.array([True, False, True])].to_dense(), F.to_dense()[[0, 2]], atol=1e-12)
    for bad in [(0, [1, 0]), (0, 1), (Ellipsis, 0), (None,)]:
        with pytest.raises(IndexError, match="indexes its 1 head axes only"):
            F[bad]


@pytest.mark.parametrize("kwargs, message", [({"xmin": float("nan")}, "xmin must be"),
                                             ({"xmin": "1.0"}, "xmin must be"),
                                             ({"rtol": float("nan")}, "rtol must be"),
                                             ({"rtol": -1.0}, "rtol must be")])
def test_power_law_fit_refuses_nan_settings(kwargs, message):
    # xmin=nan silently fitted from the smallest eigenvalue; rtol=nan dropped every eigenvalue
    # and then blamed the spectrum ("needs at least 2 non-zero eigenvalues, got 0")
    sv = np.sqrt(rng.pareto(2.0, size=50) + 1.0)
    with pytest.raises(ValueError, match=message):
        power_law_fit(sv, **kwargs)


def test_factored_matrix_times_a_vector_is_the_dense_vector_per_head():
    """F @ v for a vector failed with "FactoredMatrix needs left (..., n, r) ..." (right @ v is no
    matrix) although numpy and distattn.models' FactoredMatrix give the dense vector; v @ F too."""
    rng = np.random.default_rng(0)
    left, right = rng.normal(size=(3, 5, 2)), rng.normal(size=(3, 2, 7))
    F, dense = FactoredMatrix(left, right), left @ right
    v, w = rng.normal(size=7), rng.normal(size=5)
    np.testing.assert_allclose(F @ v, dense @ v)                        # (3, 5): each head's own product
    np.testing.assert_allclose(w @ F, w @ dense)                        # (3, 7)
    np.testing.assert_allclose(FactoredMatrix(left[0], right[0]) @ v, dense[0] @ v)
    with pytest.raises(ValueError, match="by a vector of length 5"):
        F @ w


def _flat_then_decaying(n=400, k=20, seed=0):
    """Top k singular values within 1 % of each other, then a slow decay from 0.95: a spectrum that
    stays flat past k, where 7 power iterations do not converge."""
    g = np.random.default_rng(seed)
    s = np.concatenate([np.linspace(1.0, 0.99, k), np.linspace(0.95, 0.5, n - k)])
    U, V = np.linalg.qr(g.standard_normal((n, n)))[0], np.linalg.qr(g.standard_normal((n, n)))[0]
    return (U * s) @ V.T, U, s, V


def test_randomized_spectrum_reports_its_inaccuracy_on_a_flat_spectrum_and_tol_recomputes():
    """The randomized top-k is several % off where the spectrum stays flat past k, and said nothing
    (its docstring promised an accurate k-th value). It now records max_rel_residual, which bounds
    the distance to a true singular value, and tol recomputes with ARPACK."""
    from distattn.analysis import max_rel_residual, top_singular_vectors
    X, U, s, V = _flat_then_decaying()
    k = 20
    for A in (X, sp.csr_array(X)):
        spec, u, vt = spectrum(A, k, return_vectors=True)
        err = np.max(np.abs(spec.singular_values - s[:k]) / s[:k])
        residual = spec.extra["max_rel_residual"]
        assert err > 1e-2                                   # the case is a hard one
        assert residual >= err                              # the bound holds (a true value is within it)
        assert residual == pytest.approx(max_rel_residual(A, u, spec.singular_values, vt))
        assert "recomputed" not in spec.extra
        fixed, u2, _ = spectrum(A, k, return_vectors=True, tol=1e-3)
        assert fixed.extra["recomputed"] == "arpack"
        np.testing.assert_allclose(fixed.singular_values, s[:k], rtol=1e-6)
        assert np.mean(np.cos(principal_angles(u2, U[:, :k])) ** 2) > 0.999
        for side, exact in (("left", U), ("right", V)):
            basis = top_singular_vectors(A, k, side, tol=1e-3)
            assert np.mean(np.cos(principal_angles(basis, exact[:, :k])) ** 2) > 0.999
            assert np.mean(np.cos(principal_angles(top_singular_vectors(A, k, side), exact[:, :k])) ** 2) < 0.99


def test_a_spectrum_recomputed_with_arpack_records_the_residual_of_its_own_values():
    """With tol, a spectrum recomputed with ARPACK kept the randomized SVD's max_rel_residual (0.03 here), so
    spectrum_summary reported values exact to 1e-6 as several % off; it is now the residual of the triplets
    kept, as the docstring says."""
    from distattn.analysis import max_rel_residual
    X, _, s, _ = _flat_then_decaying()
    for A in (X, sp.csr_array(X)):
        fixed, u, vt = spectrum(A, 20, return_vectors=True, tol=1e-3)
        assert fixed.extra["recomputed"] == "arpack"
        np.testing.assert_allclose(fixed.singular_values, s[:20], rtol=1e-6)
        assert fixed.extra["max_rel_residual"] == pytest.approx(max_rel_residual(A, u, fixed.singular_values, vt))
        assert spectrum_summary(fixed)["max_rel_residual"] < 1e-3


def test_randomized_spectrum_keeps_its_result_when_it_converged():
    """A fast-decaying spectrum: the randomized values are accurate, the residual is small, and a
    loose tol does not recompute."""
    g = np.random.default_rng(1)
    n, k = 300, 10
    s = 0.5 ** np.arange(n, dtype=np.float64) + 1e-9
    U, V = np.linalg.qr(g.standard_normal((n, n)))[0], np.linalg.qr(g.standard_normal((n, n)))[0]
    X = (U * s) @ V.T
    spec = spectrum(X, k, tol=1e-3)
    assert spec.extra["max_rel_residual"] < 1e-3
    assert "recomputed" not in spec.extra
    np.testing.assert_allclose(spec.singular_values, s[:k], rtol=1e-3)


def test_max_rel_residual_of_exact_triplets_is_zero_and_of_a_zero_spectrum_is_zero():
    from distattn.analysis import max_rel_residual
    X = np.diag([3.0, 2.0, 1.0])
    u, s, vt = np.linalg.svd(X)
    assert max_rel_residual(X, u, s, vt) < 1e-12
    assert max_rel_residual(X, u, np.zeros(3), vt) == 0.0
    # a wrong value: residual |3 - 2.7| / 2.7 on the first triplet
    assert max_rel_residual(X, u, np.array([2.7, 2.0, 1.0]), vt) == pytest.approx(0.3 / 2.7)


def test_max_rel_residual_of_a_rank_deficient_matrix_is_small_when_its_values_are_accurate():
    """k above the rank: the zero values come back as float32 noise (about 1e-7 sigma_1), accurate, but
    relative to themselves their residual read 2.3, so metrics.json showed a tiny corpus's spectra as
    far off and tol recomputed them for nothing. Values below 1e-3 sigma_1 are judged against that."""
    g = np.random.default_rng(0)
    n, rank, k = 200, 5, 20
    X = g.standard_normal((n, rank)) @ g.standard_normal((rank, n))
    spec = spectrum(X, k, tol=1e-3)
    assert spec.extra["max_rel_residual"] < 1e-3
    assert "recomputed" not in spec.extra
    np.testing.assert_allclose(spec.singular_values[:rank], np.linalg.svd(X, compute_uv=False)[:rank], rtol=1e-5)


@pytest.mark.parametrize("tol", [-1e-3, float("nan"), float("inf"), "0.01", True])
def test_an_invalid_tol_is_refused_naming_it(tol):
    from distattn.analysis import top_singular_vectors
    X = np.random.default_rng(0).standard_normal((30, 20))
    for fn in (lambda: spectrum(X, 5, tol=tol), lambda: top_singular_vectors(X, 5, tol=tol)):
        with pytest.raises(ValueError, match="tol=.*allowed: None"):
            fn()
