"""distattn.analysis: kernels, CKA, PSD checks, and attention agreement with baselines."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import pairwise

from distattn.analysis import (agreement_scores, attention_agreement, center_gram, cka, cka_matrix,
                               exponential_kernel, head_agreement, hsic, js_divergence, linear_cka, linear_kernel,
                               polynomial_kernel, previous_token_attention, projection_kernel, psd_check, rbf_cka,
                               rbf_kernel, row_agreement, symmetrize, uniform_attention)

rng = np.random.default_rng(0)


# --------------------------------------------------------------------------- kernels

def test_kernels_match_scikit_learn_and_definitions():
    X, Y = rng.standard_normal((7, 4)), rng.standard_normal((5, 4))
    np.testing.assert_allclose(linear_kernel(X, Y), X @ Y.T)
    np.testing.assert_allclose(rbf_kernel(X, Y, gamma=0.3), pairwise.rbf_kernel(X, Y, gamma=0.3), atol=1e-12)
    np.testing.assert_allclose(rbf_kernel(X), pairwise.rbf_kernel(X), atol=1e-12)
    np.testing.assert_allclose(polynomial_kernel(X, Y, degree=3, coef0=0.5),
                               pairwise.polynomial_kernel(X, Y, degree=3, coef0=0.5), rtol=1e-12)
    q, k = rng.standard_normal((6, 8)), rng.standard_normal((6, 8))
    raw = exponential_kernel(q, k, stabilize=False)
    np.testing.assert_allclose(raw, np.exp(q @ k.T / np.sqrt(8)))
    stable = exponential_kernel(q, k)
    np.testing.assert_allclose(stable / raw, (stable / raw)[0, 0])              # a constant factor
    softmax = np.exp(q @ k.T / np.sqrt(8))
    softmax /= softmax.sum(1, keepdims=True)
    np.testing.assert_allclose(stable / stable.sum(1, keepdims=True), softmax)
    M = np.array([[2.0, 1.0, 0.0], [1.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(projection_kernel(M, normalize=True), [[2 / 3, 1 / 3, 0], [0.25, 0.25, 0.5], [0, 0, 0]])


def test_rbf_median_bandwidth_ignores_identical_rows():
    # a sequence's embeddings repeat for a repeated word; the distance between identical rows is 0,
    # not rounding noise, so it is neither counted as a "non-zero" distance nor kept off exp(0) = 1
    X = np.random.default_rng(0).normal(size=(7, 5)) * 3 + 10
    X = np.vstack([X, X[:3]])
    d2 = np.square(X[:, None, :] - X[None, :, :]).sum(-1)
    m2 = np.median(d2[d2 > 0])
    K = rbf_kernel(X, gamma="median")
    np.testing.assert_allclose(K, np.exp(-d2 / (2 * m2)), rtol=1e-12, atol=1e-14)
    assert np.all(np.diag(K) == 1.0) and np.all(K[7:, :3].diagonal() == 1.0)


def test_cka_errors_name_the_offending_kernel():
    # every kernel was checked as "A" (symmetrize's own argument), whichever of them was wrong
    K = linear_kernel(rng.standard_normal((4, 2)))
    with pytest.raises(ValueError, match="^L must be a square"):
        cka(K, np.ones((4, 3)))
    with pytest.raises(ValueError, match="^K contains NaN"):
        cka(np.full((4, 4), np.nan), K)
    with pytest.raises(ValueError, match=r"^kernels\['bad'\] must be a square"):
        cka_matrix({"good": K, "bad": np.ones((4, 3))})
    with pytest.raises(ValueError, match="^Y must have at least 2 rows"):
        rbf_cka(rng.standard_normal((4, 2)), rng.standard_normal((1, 2)))
    with pytest.raises(ValueError, match="^K must be a square"):
        psd_check(np.ones((2, 3)))



@pytest.mark.parametrize("tol", [float("nan"), -1.0, "1e-8"])
def test_psd_check_refuses_an_impossible_tolerance(tol):
    # NaN made every comparison false: the identity was reported as not PSD
    with pytest.raises(ValueError, match="tol must be"):
        psd_check(np.eye(3), tol=tol)

def test_hsic_matches_explicit_centering_matrix():
    K, L = linear_kernel(rng.standard_normal((6, 3))), rbf_kernel(rng.standard_normal((6, 2)))
    H = np.eye(6) - np.ones((6, 6)) / 6
    np.testing.assert_allclose(center_gram(K), H @ K @ H, atol=1e-12)
    assert hsic(K, L) == pytest.approx(np.trace(K @ H @ L @ H) / 25)


def test_cka_invariances_and_linear_cka_equivalence():
    X, Y = rng.standard_normal((12, 5)), rng.standard_normal((12, 3))
    K = linear_kernel(X)
    assert cka(K, 3.0 * K) == pytest.approx(1.0)
    assert cka(K, K + 5.0) == pytest.approx(1.0)                               # constants are centred away
    assert linear_cka(X, Y) == pytest.approx(cka(linear_kernel(X), linear_kernel(Y)))
    Q = np.linalg.qr(rng.standard_normal((5, 5)))[0]
    assert linear_cka(X, 2.0 * X @ Q) == pytest.approx(1.0)                    # orthogonal + isotropic scale
    assert 0.0 <= linear_cka(X, Y) < 1.0
    assert rbf_cka(X, X) == pytest.approx(1.0)
    assert np.isnan(cka(np.ones((4, 4)), K[:4, :4]))


def test_cka_of_constant_kernels_is_nan_not_their_centring_noise():
    # a constant kernel that is not exactly representable (uniform attention 1/R, 0.1) centres to
    # rounding noise, not zeros: the CKA of that noise was any number, 1 for two constant kernels
    K = linear_kernel(rng.standard_normal((6, 3)))
    for c in (0.1, 0.3, 1 / 7):
        C = np.full((6, 6), c)
        assert np.isnan(cka(C, K)) and np.isnan(cka(C, C)) and np.isnan(cka(C, np.full((6, 6), 0.7)))
        names, M = cka_matrix({"const": C, "linear": K, "other": np.full((6, 6), 0.7)})
        assert np.isnan(M[0]).all() and np.isnan(M[2]).all() and M[1, 1] == pytest.approx(1.0)
        X = np.full((6, 3), c)
        assert np.isnan(linear_cka(X, rng.standard_normal((6, 2)))) and np.isnan(linear_cka(X, X))
    assert cka(K, 3.0 * K + 0.1) == pytest.approx(1.0)                        # variation is kept


def test_symmetrize_choices_and_cka_of_attention():
    A = rng.random((5, 5))
    A /= A.sum(1, keepdims=True)
    np.testing.assert_allclose(symmetrize(A, "mean"), (A + A.T) / 2)
    np.testing.assert_allclose(symmetrize(A, "gram"), A @ A.T)
    with pytest.raises(ValueError, match="not symmetric"):
        symmetrize(A, "none")
    with pytest.raises(ValueError, match="how must be"):
        symmetrize(A, "max")
    L = linear_kernel(rng.standard_normal((5, 2)))
    # the HSIC cross term only sees the symmetric part
    assert hsic(A, L) == pytest.approx(hsic(symmetrize(A), L))
    assert cka(A, A.T) == pytest.approx(1.0)
    assert cka(A, A.T, "gram") != pytest.approx(1.0)


def test_cka_matrix_is_symmetric_with_unit_diagonal():
    X = rng.standard_normal((8, 4))
    kernels = {"linear": linear_kernel(X), "rbf": rbf_kernel(X), "poly": polynomial_kernel(X),
               "exp": exponential_kernel(X)}
    names, C = cka_matrix(kernels)
    assert names == list(kernels)
    np.testing.assert_allclose(np.diag(C), 1.0)
    np.testing.assert_allclose(C, C.T)
    assert C[0, 1] == pytest.approx(cka(kernels["linear"], kernels["rbf"]))


def test_psd_check():
    X = rng.standard_normal((6, 3))
    assert psd_check(linear_kernel(X))["is_psd"]
    assert psd_check(rbf_kernel(X))["is_psd"]
    res = psd_check(np.array([[0.0, 1.0], [1.0, 0.0]]))
    assert not res["is_psd"] and res["min_eigenvalue"] == pytest.approx(-1.0) and res["n_negative"] == 1
    assert not psd_check(np.array([[1.0, 3.0], [0.0, 1.0]]))["is_psd"]         # symmetric part has eigenvalue -0.5
    assert psd_check(np.array([[1.0, 2.0], [0.0, 1.0]]))["is_psd"]             # symmetric part [[1,1],[1,1]]


# --------------------------------------------------------------------------- agreement

def _rows(R, causal=False, seed=0):
    g = np.random.default_rng(seed)
    A = g.random((R, R)) ** 2
    if causal:
        A = np.tril(A)
    return A / A.sum(1, keepdims=True)


def test_identical_attention_agrees_perfectly():
    A = _rows(6)
    s = agreement_scores(A, A)
    assert s.js_mean == pytest.approx(0.0, abs=1e-12) and s.spearman_mean == pytest.approx(1.0)
    assert s.top1 == 1.0 and s.n_rows == 6 and s.n_skipped == 0



@pytest.mark.parametrize("tol", [-1e-9, float("nan"), "0"])
def test_agreement_refuses_a_tie_tolerance_that_is_not_a_non_negative_number(tol):
    A = _rows(6)
    with pytest.raises(ValueError, match="tie_atol must be a finite real number >= 0"):
        agreement_scores(A, A, tie_atol=tol)              # a negative or NaN one made every top-1 score 0
def test_js_divergence_bounds_and_value():
    assert js_divergence([1.0, 0.0], [0.0, 1.0]) == pytest.approx(1.0)
    P, Q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    M = (P + Q) / 2
    expected = 0.5 * stats.entropy(P, M, base=2) + 0.5 * stats.entropy(Q, M, base=2)
    assert js_divergence(P, Q) == pytest.approx(expected)


def test_row_spearman_matches_scipy_with_ties():
    T = np.round(_rows(7, seed=1), 1)
    P = np.round(_rows(7, seed=2), 1)
    T /= T.sum(1, keepdims=True)
    P /= P.sum(1, keepdims=True)
    rho = row_agreement(T, P)["spearman"]
    for i in range(7):
        expected = stats.spearmanr(T[i], P[i]).statistic
        assert (np.isnan(rho[i]) and np.isnan(expected)) or rho[i] == pytest.approx(expected)


def test_causal_masking_ignores_the_future_and_renormalises():
    T = _rows(5, causal=True, seed=3)
    P = T + np.triu(rng.random((5, 5)), 1)              # arbitrary mass on future keys
    s = agreement_scores(T, P, causal=True)
    assert s.js_mean == pytest.approx(0.0, abs=1e-12) and s.top1 == 1.0
    assert agreement_scores(T, P, causal=False).js_mean > 0.05
    r = row_agreement(T, P, causal=True)
    assert np.isnan(r["spearman"][0])                  # one key: Spearman undefined


def test_diagonal_drop_and_skips():
    T = 0.9 * np.eye(4) + 0.1 * _rows(4, seed=4)
    P = _rows(4, seed=5)
    keep = agreement_scores(T, P)
    drop = agreement_scores(T, P, diagonal="drop")
    assert keep.top1 < 0.5 and keep.n_rows == 4 and drop.n_rows == 4
    from scipy.spatial.distance import jensenshannon        # an independent JS (its square, in bits)

    def js_ref(t, p):
        return jensenshannon(t, p, base=2) ** 2
    off = [np.delete(np.arange(4), i) for i in range(4)]    # "drop": each row without its own position
    want_drop = np.mean([js_ref(T[i, o] / T[i, o].sum(), P[i, o] / P[i, o].sum()) for i, o in enumerate(off)])
    assert drop.js_mean == pytest.approx(want_drop, rel=1e-9)
    assert keep.js_mean == pytest.approx(np.mean([js_ref(T[i], P[i]) for i in range(4)]), rel=1e-9)
    assert abs(drop.js_mean - keep.js_mean) > 0.05          # the dominant diagonal really was removed
    causal_drop = agreement_scores(np.tril(T) / np.tril(T).sum(1, keepdims=True), P, causal=True, diagonal="drop")
    assert causal_drop.n_rows == 3 and causal_drop.n_skipped == 1      # row 0 has no key left


def test_top1_ties_count_as_random_tie_breaking():
    T = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    P = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [0.2, 0.2, 0.6]])
    np.testing.assert_allclose(row_agreement(T, P)["top1"], [0.5, 1.0, 1 / 3])


def test_baselines_beside_the_prediction():
    R = 6
    prev = previous_token_attention(R)
    scores = attention_agreement([prev, prev], [prev, _rows(R)], causal=True)
    assert set(scores) == {"prediction", "uniform", "previous_token"}
    assert scores["previous_token"].js_mean == pytest.approx(0.0) and scores["previous_token"].top1 == 1.0
    # uniform over the prefix agrees by chance: mean of 1/(i+1), and its Spearman is undefined
    assert scores["uniform"].top1 == pytest.approx(np.mean(1 / np.arange(1, R + 1)))
    assert np.isnan(scores["uniform"].spearman_mean) and scores["uniform"].n_spearman == 0
    np.testing.assert_allclose(uniform_attention(3, causal=True), [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])


def test_zero_prediction_rows_fall_back_to_uniform():
    T = _rows(4, seed=6)
    P = _rows(4, seed=7)
    P[2] = 0.0                                          # e.g. an out-of-vocabulary position
    s = agreement_scores(T, P)
    assert s.n_fallback == 1 and s.n_rows == 4
    r = row_agreement(T, P)
    assert r["js"][2] == pytest.approx(js_divergence(T[2], np.full(4, 0.25)))


def test_head_agreement_table():
    seqs = [np.stack([np.stack([_rows(5, True, s), previous_token_attention(5)])]) for s in range(3)]  # (1, 2, 5, 5)
    proj = [_rows(5, seed=s + 10) for s in range(3)]
    rows = head_agreement(seqs, {"projection": proj, "asymmetric": proj}, causal=True)
    assert len(rows) == 2 * 4
    head1_prev = [r for r in rows if r["head"] == 1 and r["predictor"] == "previous_token"][0]
    assert head1_prev["js_mean"] == pytest.approx(0.0) and head1_prev["n_rows"] == 15
    with pytest.raises(ValueError, match="same shape"):
        agreement_scores(np.eye(3), np.eye(4))


def test_kernels_refuse_mismatched_shapes_and_non_finite_parameters():
    X = rng.random((4, 3))
    with pytest.raises(ValueError, match=r"K and L must have the same shape .*\(3, 3\) and \(4, 4\)"):
        cka(np.eye(3), np.eye(4))                         # once a numpy broadcasting error
    with pytest.raises(ValueError, match="scale must be a finite real number; got nan"):
        exponential_kernel(X, scale=np.nan)               # once an all-NaN kernel
    with pytest.raises(ValueError, match="gamma must be a finite real number; got nan"):
        polynomial_kernel(X, gamma=np.nan)
    with pytest.raises(ValueError, match="gamma must be a finite positive number, None or 'median'; got inf"):
        rbf_kernel(X, gamma=np.inf)
    assert np.isfinite(rbf_kernel(X, gamma=np.float32(0.5))).all()


def test_head_agreement_and_rollout_refuse_ragged_or_empty_stacks():
    from distattn.analysis import attention_rollout
    T = _rows(3, seed=1)
    with pytest.raises(ValueError, match=r"sequence 0 has \(2, 1\), sequence 1 has \(1, 1\)"):
        head_agreement([np.stack([T[None], T[None]]), T[None, None]], [T, T])
    with pytest.raises(ValueError, match="attentions is empty"):
        attention_rollout([])


def test_a_predictor_named_like_a_baseline_is_refused():
    """{"uniform": ...} or {"previous_token": ...} once came back as the baseline's scores, the
    caller's predictor silently dropped."""
    T = [np.full((4, 4), 0.25)]
    P = [np.eye(4)]
    for name in ("uniform", "previous_token"):
        with pytest.raises(ValueError, match=rf"predictor names \['{name}'\] are reserved for the baselines"):
            attention_agreement(T, {name: P})
        with pytest.raises(ValueError, match="reserved for the baselines"):
            head_agreement([np.full((1, 1, 4, 4), 0.25)], {name: P})
    assert set(attention_agreement(T, {"mine": P})) == {"mine", "uniform", "previous_token"}


def test_agreement_inputs_that_are_not_matrices_are_named():
    """One matrix as a nested list was read as a list of 1-D rows ('got (2,) and (2,)'); a 0-d
    array ended with numpy's 'iteration over a 0-d array'."""
    M = [[0.5, 0.5], [0.5, 0.5]]
    for call in (lambda: agreement_scores(M, M), lambda: attention_agreement(M, M),
                 lambda: head_agreement([np.full((1, 1, 2, 2), 0.5)], {"p": M})):
        with pytest.raises(ValueError, match=r"is a nested list of 2 1-D rows, not a list of \(R, R\) matrices; "
                                             r"pass np\.asarray\(\.\.\.\) for one matrix"):
            call()
    z = np.array(0.5)
    for call in (lambda: agreement_scores(z, z), lambda: attention_agreement(z, z),
                 lambda: head_agreement([np.full((1, 1, 2, 2), 0.5)], {"p": z})):
        with pytest.raises(ValueError, match=r"must be one \(R, R\) array, an \(n_seq, R, R\) array or a list of "
                                             r"\(R_s, R_s\) arrays; got an array of shape \(\)"):
            call()
    with pytest.raises(ValueError, match=r"head_patterns must be a list over sequences of \(layers, heads, R, R\) "
                                         r"arrays or one \(n_seq, layers, heads, R, R\) array; got an array of "
                                         r"shape \(\)"):
        head_agreement(z, {"p": [np.eye(2)]})
    T = [np.full((2, 2), 0.5), np.full((3, 3), 1 / 3)]                  # lists of matrices of several sizes still work
    assert agreement_scores(T, T).n_rows == 5
    assert len(head_agreement([t[None, None] for t in T], {"p": T})) == 3
