"""distattn.analysis against independent references written here from the formulas (plain numpy,
scipy and networkx: explicit centring matrices, per-row loops, power iteration), not against the
library's own helpers. Small random inputs plus the edge cases the docstrings name."""

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.linalg import subspace_angles
from scipy.spatial.distance import cdist, jensenshannon
from scipy.stats import entropy as scipy_entropy
from scipy.stats import spearmanr

from distattn.analysis import (FactoredMatrix, attention_flow, attention_graph, attention_rollout, center_gram,
                               cka, cka_matrix, cross_entropy, effective_rank, energy_fraction, entropy,
                               exponential_kernel, graph_metrics, hsic, in_degree, js_divergence,
                               kl_divergence, linear_cka, pagerank, perplexity, perplexity_from_nll,
                               polynomial_kernel, power_law_fit, principal_angles, psd_check,
                               qk_pmi_correlation, rbf_cka, rbf_kernel, row_agreement, row_entropy,
                               sense_communities, spectral_gap, spectrum, stable_rank, subspace_alignment,
                               word_neighbourhood)
from distattn.analysis.agreement import agreement_scores

RNG = np.random.default_rng(1234)


def stochastic(R, rng=RNG, zeros=0.0):
    A = rng.random((R, R))
    if zeros:
        A[rng.random((R, R)) < zeros] = 0.0
        A[np.arange(R), rng.integers(0, R, R)] += 0.1     # no empty row
    return A / A.sum(1, keepdims=True)


# ---------------------------------------------------------------------------------------------- references

def ref_effective_rank(s):
    """Roy & Vetterli 2007: exp(-Σ p log p), p = σ / Σσ, zero σ dropped."""
    s = np.asarray(s, float)
    p = s[s > 0] / s.sum()
    return math.exp(-sum(x * math.log(x) for x in p))


def ref_hsic(K, L):
    n = K.shape[0]
    H = np.eye(n) - np.ones((n, n)) / n
    return np.trace(K @ H @ L @ H) / (n - 1) ** 2


def ref_cka(K, L):
    return ref_hsic(K, L) / math.sqrt(ref_hsic(K, K) * ref_hsic(L, L))


def ref_js_bits(p, q):
    m = (p + q) / 2
    def kl(a, b):
        return sum(x * math.log2(x / y) for x, y in zip(a, b) if x > 0)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def ref_pagerank(A, d=0.85, iters=5000):
    """Power iteration on the Google matrix of the random walk i -> j with probability A[i, j]."""
    R = A.shape[0]
    P = A / A.sum(1, keepdims=True)
    x = np.full(R, 1 / R)
    for _ in range(iters):
        x = d * x @ P + (1 - d) / R
    return x / x.sum()


def ref_wwfit(lam):
    """WWFit, one candidate at a time: α = 1 + n / Σ log(λ/xmin), D = max |1 - (λ/xmin)^(1-α) - i/n|."""
    lam = np.sort(lam)
    best = None
    for c in range(len(lam) - 1):
        tail = lam[c:]
        n = len(tail)
        denom = np.sum(np.log(tail / lam[c]))
        alpha = 1 + n / denom if denom > 0 else np.inf
        if not np.isfinite(alpha) or alpha <= 1:
            D = 1.0
        else:
            D = max(abs(1 - (tail[i] / lam[c]) ** (1 - alpha) - i / n) for i in range(n))
        if best is None or D < best[0]:
            best = (D, alpha, lam[c], n)
    return best


# ---------------------------------------------------------------------------------------------- spectra

@pytest.mark.parametrize("shape", [(7, 5), (5, 7), (1, 4), (6, 1)])
def test_spectrum_of_a_dense_matrix_is_numpys_svd(shape):
    X = RNG.standard_normal(shape)
    spec = spectrum(X)
    np.testing.assert_allclose(spec.singular_values, np.linalg.svd(X, compute_uv=False), atol=1e-12)
    assert spec.frobenius_sq == pytest.approx(np.sum(X ** 2))
    assert not spec.truncated


def test_spectrum_of_a_sparse_matrix_top_k_is_the_leading_singular_values():
    X = sp.random(40, 30, density=0.3, random_state=3, format="csr")
    s = np.linalg.svd(X.toarray(), compute_uv=False)
    for algorithm in ("arpack", "dense", "randomized"):
        spec = spectrum(X, 5, algorithm=algorithm)
        np.testing.assert_allclose(spec.singular_values, s[:5], rtol=1e-4)
        assert spec.truncated
        assert spec.frobenius_sq == pytest.approx(np.sum(X.toarray() ** 2))


def test_spectrum_of_a_factored_matrix_is_the_products_svd():
    left, right = RNG.standard_normal((9, 3)), RNG.standard_normal((3, 8))
    spec = spectrum(FactoredMatrix(left, right))
    s = np.linalg.svd(left @ right, compute_uv=False)
    np.testing.assert_allclose(spec.singular_values, s[:3], atol=1e-10)
    assert spec.frobenius_sq == pytest.approx(np.sum((left @ right) ** 2))


def test_effective_rank_matches_roy_vetterli():
    s = np.abs(RNG.standard_normal(10))
    assert effective_rank(s) == pytest.approx(ref_effective_rank(s))
    assert effective_rank(spectrum(np.outer(RNG.random(5), RNG.random(4)))) == pytest.approx(1.0, abs=1e-6)
    assert effective_rank(np.ones(6)) == pytest.approx(6.0)
    assert effective_rank(np.array([3.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert effective_rank(np.zeros(4)) == 0.0


def test_stable_rank_and_energy_fraction_match_their_formulas():
    X = RNG.standard_normal((12, 8))
    s = np.linalg.svd(X, compute_uv=False)
    assert stable_rank(spectrum(X)) == pytest.approx(np.sum(s ** 2) / s[0] ** 2)
    assert stable_rank(spectrum(np.outer(np.ones(3), np.arange(1.0, 5.0)))) == pytest.approx(1.0)
    for k in (1, 3, 8):
        assert energy_fraction(spectrum(X), k) == pytest.approx(np.sum(s[:k] ** 2) / np.sum(X ** 2))
    # truncated: the denominator is the full ‖X‖_F², not the sum of the values kept
    Xs = sp.csr_array(X)
    assert energy_fraction(spectrum(Xs, 3, algorithm="arpack"), 3) == pytest.approx(np.sum(s[:3] ** 2) / np.sum(X ** 2))
    assert stable_rank(spectrum(Xs, 3, algorithm="arpack")) == pytest.approx(np.sum(s ** 2) / s[0] ** 2)


def test_power_law_fit_matches_a_candidate_by_candidate_wwfit():
    sigma = np.sqrt(RNG.pareto(2.5, 60) + 1.0)
    fit = power_law_fit(sigma)
    D, alpha, xmin, n = ref_wwfit(sigma ** 2)
    assert fit.alpha == pytest.approx(alpha)
    assert fit.xmin == pytest.approx(xmin)
    assert fit.ks_distance == pytest.approx(D)
    assert fit.n_tail == n
    assert fit.sigma == pytest.approx((alpha - 1) / math.sqrt(n))


def test_principal_angles_match_scipy_and_alignment_of_a_matrix_with_itself_is_one():
    U1, U2 = RNG.standard_normal((10, 3)), RNG.standard_normal((10, 4))
    np.testing.assert_allclose(principal_angles(U1, U2), np.sort(subspace_angles(U1, U2)), atol=1e-10)
    X = RNG.standard_normal((10, 6))
    a = subspace_alignment(X, 2.0 * X, 3)
    assert a.mean_cos2 == pytest.approx(1.0)
    assert a.chance == pytest.approx(3 / 10)


# ---------------------------------------------------------------------------------------------- kernels

def test_hsic_and_cka_match_the_centring_matrix_formulas():
    X, Y = RNG.standard_normal((8, 3)), RNG.standard_normal((8, 5))
    K, L = X @ X.T, Y @ Y.T
    assert hsic(K, L) == pytest.approx(ref_hsic(K, L))
    A = RNG.random((8, 8))                     # non-symmetric: hsic is tr(A H L H) as written
    assert hsic(A, L) == pytest.approx(ref_hsic(A, L))
    assert hsic(L, A) == pytest.approx(ref_hsic(L, A))
    assert cka(K, L) == pytest.approx(ref_cka(K, L))
    S = (A + A.T) / 2
    assert cka(A, L) == pytest.approx(ref_cka(S, L))
    assert cka(A, L, "gram") == pytest.approx(ref_cka(A @ A.T, L @ L))
    n = 8
    H = np.eye(n) - 1 / n
    np.testing.assert_allclose(center_gram(A), H @ A @ H, atol=1e-12)


def test_linear_cka_is_kornblith_with_centred_features():
    X, Y = RNG.standard_normal((10, 3)), RNG.standard_normal((10, 6)) + 5.0
    assert linear_cka(X, Y) == pytest.approx(ref_cka(X @ X.T, Y @ Y.T))
    assert linear_cka(X, 3.0 * X @ np.linalg.qr(RNG.standard_normal((3, 3)))[0] + 7.0) == pytest.approx(1.0)
    assert math.isnan(linear_cka(np.ones((5, 2)), X[:5]))


def test_cka_of_a_constant_kernel_is_nan_and_cka_matrix_agrees_with_cka():
    K = RNG.random((6, 6))
    assert math.isnan(cka(np.ones((6, 6)), K))
    kernels = {"a": K, "b": RNG.random((6, 6)), "c": np.full((6, 6), 2.0)}
    names, C = cka_matrix(kernels)
    assert names == ["a", "b", "c"]
    assert C[0, 1] == pytest.approx(cka(kernels["a"], kernels["b"]))
    assert C[0, 0] == pytest.approx(1.0)
    assert np.isnan(C[2]).all() and np.isnan(C[:, 2]).all()


def test_kernels_match_their_definitions():
    X, Y = RNG.standard_normal((5, 4)), RNG.standard_normal((6, 4))
    np.testing.assert_allclose(rbf_kernel(X, Y, gamma=0.3), np.exp(-0.3 * cdist(X, Y, "sqeuclidean")), atol=1e-12)
    d2 = cdist(X, X, "sqeuclidean")
    m2 = np.median(d2[d2 > 0])
    np.testing.assert_allclose(rbf_kernel(X, gamma="median"), np.exp(-d2 / (2 * m2)), atol=1e-12)
    np.testing.assert_allclose(rbf_kernel(X), np.exp(-d2 / 4), atol=1e-12)
    np.testing.assert_allclose(polynomial_kernel(X, Y, degree=3, gamma=0.5, coef0=2.0),
                               (0.5 * X @ Y.T + 2.0) ** 3)
    np.testing.assert_allclose(polynomial_kernel(X, Y), (X @ Y.T / 4 + 1.0) ** 2)
    E = exponential_kernel(X, Y)
    scores = X @ Y.T / 2.0
    soft = np.exp(scores - scores.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    np.testing.assert_allclose(E / E.sum(1, keepdims=True), soft, atol=1e-12)
    np.testing.assert_allclose(exponential_kernel(X, Y, stabilize=False), np.exp(scores))
    assert rbf_cka(X, X[:, ::-1]) == pytest.approx(1.0)


def test_psd_check_on_known_spectra():
    Q = np.linalg.qr(RNG.standard_normal((5, 5)))[0]
    K = Q @ np.diag([3.0, 1.0, 0.5, 0.0, -0.2]) @ Q.T
    out = psd_check(K)
    assert not out["is_psd"] and out["n_negative"] == 1
    assert out["min_eigenvalue"] == pytest.approx(-0.2) and out["max_eigenvalue"] == pytest.approx(3.0)
    assert psd_check(np.ones((4, 4)))["is_psd"]
    B = RNG.random((3, 2))
    assert psd_check(B @ B.T)["is_psd"]


# ---------------------------------------------------------------------------------------------- information

def test_entropy_cross_entropy_kl_and_perplexity_in_nats_and_bits():
    p = RNG.random((4, 6))
    p /= p.sum(1, keepdims=True)
    q = RNG.random(6)
    q /= q.sum()
    np.testing.assert_allclose(entropy(p), scipy_entropy(p, axis=1))
    np.testing.assert_allclose(entropy(p, base=2), scipy_entropy(p, base=2, axis=1))
    np.testing.assert_allclose(entropy(p.T, axis=0), scipy_entropy(p, axis=1))
    np.testing.assert_allclose(kl_divergence(p, q), [scipy_entropy(r, q) for r in p], atol=1e-12)
    np.testing.assert_allclose(cross_entropy(p, q, base=2), [-(r * np.log2(q)).sum() for r in p])
    np.testing.assert_allclose(perplexity(p), np.exp(scipy_entropy(p, axis=1)))
    assert perplexity(np.full(7, 1 / 7)) == pytest.approx(7.0)
    assert entropy(np.array([0.0, 1.0, 0.0])) == 0.0
    assert entropy(np.array([1.0])) == 0.0
    assert cross_entropy(np.array([0.5, 0.5]), np.array([1.0, 0.0])) == np.inf
    assert cross_entropy(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 0.0
    nll = RNG.random(9) * 3
    assert perplexity_from_nll(nll) == pytest.approx(math.exp(nll.mean()))
    assert perplexity_from_nll(nll / math.log(2), base=2) == pytest.approx(math.exp(nll.mean()))


def test_js_divergence_is_scipys_squared_jensen_shannon_distance_in_bits():
    P, Q = RNG.random((5, 7)), RNG.random((5, 7))
    P[0, :3] = 0.0
    Q[1, 3:] = 0.0
    P /= P.sum(1, keepdims=True)
    Q /= Q.sum(1, keepdims=True)
    np.testing.assert_allclose(js_divergence(P, Q), jensenshannon(P, Q, base=2, axis=1) ** 2, atol=1e-12)
    np.testing.assert_allclose(js_divergence(P, Q), [ref_js_bits(p, q) for p, q in zip(P, Q)], atol=1e-12)
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- agreement

def ref_row_agreement(T, P, causal, diagonal):
    """Per row: restrict to allowed keys, renormalise, uniform for an empty prediction, JS in bits,
    scipy's Spearman, tie-aware argmax agreement."""
    R = T.shape[0]
    out = {"js": np.full(R, np.nan), "spearman": np.full(R, np.nan), "top1": np.full(R, np.nan)}
    for i in range(R):
        keys = [j for j in range(R) if (j <= i or not causal) and (j != i or diagonal == "keep")]
        if not keys or T[i, keys].sum() == 0:
            continue
        t = T[i, keys] / T[i, keys].sum()
        p = P[i, keys] / P[i, keys].sum() if P[i, keys].sum() > 0 else np.full(len(keys), 1 / len(keys))
        out["js"][i] = ref_js_bits(t, p)
        if len(keys) >= 2 and np.ptp(t) > 0 and np.ptp(p) > 0:
            out["spearman"][i] = spearmanr(t, p).statistic
        st = set(np.flatnonzero(t >= t.max() - 1e-12))
        sq = set(np.flatnonzero(p >= p.max() - 1e-12))
        out["top1"][i] = len(st & sq) / (len(st) * len(sq))
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("diagonal", ["keep", "drop"])
def test_row_agreement_matches_a_row_by_row_reference(causal, diagonal):
    R = 7
    T = np.round(stochastic(R, zeros=0.3), 2)         # ties and zeros
    P = np.round(RNG.random((R, R)), 1)
    P[3] = 0.0                                        # an out-of-vocabulary prediction row
    P[5, :5] = 0.0                                    # no mass on row 5's causal keys
    T[2] = 0.0                                        # a padded target row
    got = row_agreement(T, P, causal=causal, diagonal=diagonal)
    ref = ref_row_agreement(T, P, causal, diagonal)
    for key in ("js", "spearman", "top1"):
        np.testing.assert_allclose(got[key], ref[key], atol=1e-10, err_msg=key)


def test_agreement_scores_average_over_all_rows_of_all_sequences():
    Ts = [stochastic(4), stochastic(6)]
    Ps = [stochastic(4), stochastic(6)]
    rows = [ref_row_agreement(t, p, False, "keep") for t, p in zip(Ts, Ps)]
    js = np.concatenate([r["js"] for r in rows])
    s = agreement_scores(Ts, Ps)
    assert s.js_mean == pytest.approx(js.mean())
    assert s.n_rows == 10
    assert s.spearman_mean == pytest.approx(np.nanmean(np.concatenate([r["spearman"] for r in rows])))


# ---------------------------------------------------------------------------------------------- graphs

def test_attention_graph_edges_weights_threshold_and_self_loops():
    A = stochastic(5, zeros=0.4)
    G = attention_graph(A, tokens=list("abcde"))
    assert G.is_directed()
    assert set(G.edges) == {(i, j) for i in range(5) for j in range(5) if A[i, j] > 0}
    for i, j, w in G.edges(data="weight"):
        assert w == A[i, j]
    assert all(G.has_edge(i, i) for i in range(5) if A[i, i] > 0)
    H = attention_graph(A, threshold=0.2)
    assert set(H.edges) == {(i, j) for i in range(5) for j in range(5) if A[i, j] > 0.2}
    assert G.nodes[2] == {"position": 2, "token": "c"}


def test_pagerank_in_degree_row_entropy_match_their_definitions():
    A = stochastic(6, zeros=0.3)
    np.testing.assert_allclose(pagerank(A), ref_pagerank(A), atol=1e-9)
    np.testing.assert_allclose(pagerank(A, damping=0.5), ref_pagerank(A, 0.5), atol=1e-9)
    np.testing.assert_allclose(pagerank(np.full((4, 4), 0.25)), 0.25, atol=1e-12)
    np.testing.assert_allclose(in_degree(A), A.sum(0))
    np.testing.assert_allclose(row_entropy(A), scipy_entropy(A, axis=1))
    np.testing.assert_allclose(row_entropy(A, base=2), scipy_entropy(A, base=2, axis=1))
    np.testing.assert_allclose(row_entropy(np.full((5, 5), 0.2)), math.log(5))
    m = graph_metrics(np.array([[1.0]]))
    assert m["pagerank"].tolist() == [1.0] and m["spectral_gap"] == 1.0 and m["row_entropy"].tolist() == [0.0]


def test_spectral_gap_matches_the_second_eigenvalue_modulus():
    A = stochastic(6)
    mod = np.sort(np.abs(np.linalg.eigvals(A)))[::-1]
    assert spectral_gap(A) == pytest.approx(1 - mod[1])
    assert spectral_gap(np.full((4, 4), 0.25)) == pytest.approx(1.0)
    assert spectral_gap(np.eye(4)) == pytest.approx(0.0)
    causal = np.tril(np.ones((4, 4)))
    causal /= causal.sum(1, keepdims=True)
    assert spectral_gap(causal) == pytest.approx(0.5)        # eigenvalues 1, 1/2, 1/3, 1/4
    sink = np.zeros((4, 4))
    sink[:, 0] = 1.0                                          # reducible, rank one
    assert spectral_gap(sink) == pytest.approx(1.0)
    two_classes = np.kron(np.eye(2), np.full((2, 2), 0.5))   # two closed sets of tokens
    assert spectral_gap(two_classes) == pytest.approx(0.0)
    assert spectral_gap(np.array([[0.0, 1.0], [1.0, 0.0]])) == pytest.approx(0.0)   # periodic


def test_word_neighbourhood_and_sense_communities_match_dense_references():
    V = 12
    P = np.maximum(RNG.standard_normal((V, V)), 0.0)
    P = np.round(P, 1)
    c, k = 4, 5
    row = P[c].copy()
    row[c] = 0
    cand = [j for j in range(V) if row[j] > 0]
    nbrs = sorted(cand, key=lambda j: (-row[j], j))[:k]
    G = word_neighbourhood(sp.csr_array(P), c, k, include_word=False)
    assert sorted(G.nodes) == sorted(nbrs)
    expected = {frozenset((a, b)): (P[a, b] + P[b, a]) / 2 for a in nbrs for b in nbrs
                if a < b and (P[a, b] + P[b, a]) / 2 > 0}
    assert {frozenset(e) for e in G.edges} == set(expected)
    for a, b, w in G.edges(data="weight"):
        assert w == pytest.approx(expected[frozenset((a, b))])
    Gw = word_neighbourhood(sp.csr_array(P), c, k)
    assert Gw.has_node(c) and all(Gw[c][n]["weight"] == pytest.approx(P[c, n]) for n in nbrs)
    sc = sense_communities(sp.csr_array(P), c, k)
    assert sorted(n for part in sc.communities for n in part) == sorted(nbrs)
    assert sum(sc.share) == pytest.approx(1.0)
    for part, share in zip(sc.communities, sc.share):
        assert share == pytest.approx(sum(row[n] for n in part) / sum(row[n] for n in nbrs))
    if G.number_of_edges():
        parts = [set(p) for p in sc.communities]
        assert sc.modularity == pytest.approx(nx.community.modularity(G, parts, weight="weight"))


# ---------------------------------------------------------------------------------------------- flow

def test_rollout_and_flow_match_the_products_and_networkx_max_flow():
    L, H, R = 3, 2, 4
    A = np.stack([np.stack([stochastic(R, zeros=0.3) for _ in range(H)]) for _ in range(L)])
    Ahat = [0.5 * A[l].mean(0) + 0.5 * np.eye(R) for l in range(L)]
    Ahat = [a / a.sum(1, keepdims=True) for a in Ahat]
    np.testing.assert_allclose(attention_rollout(A), Ahat[2] @ Ahat[1] @ Ahat[0], atol=1e-12)
    G = nx.DiGraph()
    for l in range(1, L + 1):
        for i in range(R):
            for j in range(R):
                if Ahat[l - 1][i, j] > 0:
                    G.add_edge((l - 1, j), (l, i), capacity=Ahat[l - 1][i, j])
    ref = np.array([[nx.maximum_flow_value(G, (0, j), (L, i)) for j in range(R)] for i in range(R)])
    np.testing.assert_allclose(attention_flow(A), ref, atol=1e-9)
    ref2 = np.array([[sum(min(Ahat[1][i, k], Ahat[0][k, j]) for k in range(R)) for j in range(R)] for i in range(R)])
    np.testing.assert_allclose(attention_flow(A[:2]), ref2, atol=1e-12)
    np.testing.assert_allclose(attention_flow(A[:1]), Ahat[0], atol=1e-12)
    one = np.ones((1, 1, 1, 1))
    assert attention_rollout(one).tolist() == [[1.0]] and attention_flow(one).tolist() == [[1.0]]


# ---------------------------------------------------------------------------------------------- circuits

@pytest.mark.parametrize("orientation", ["query_key", "key_query"])
def test_qk_pmi_correlation_is_scipys_spearman_over_ordered_distinct_pairs(orientation):
    V, d = 15, 3
    left, right = RNG.standard_normal((V, d)), RNG.standard_normal((d, V))
    P = np.maximum(np.round(RNG.standard_normal((V, V)), 1), 0.0)
    ids = np.array([3, 0, 7, 11, 5, 9])
    qk = left @ right
    x, y = [], []
    for a in ids:
        for b in ids:
            if a != b:
                x.append(qk[a, b])
                y.append(P[a, b] if orientation == "query_key" else P[b, a])
    x, y = np.array(x), np.array(y)
    r = qk_pmi_correlation(FactoredMatrix(left, right), sp.csr_array(P), ids, orientation=orientation)
    ref = spearmanr(x, y)
    assert r.rho_all == pytest.approx(ref.statistic) and r.pvalue_all == pytest.approx(ref.pvalue)
    assert r.n_pairs_all == 30
    pos = y > 0
    assert r.n_pairs_positive == pos.sum()
    assert r.rho_positive == pytest.approx(spearmanr(x[pos], y[pos]).statistic)
