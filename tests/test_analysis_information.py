"""distattn.analysis.information, and the worked examples of seeds 001 and 002."""

from __future__ import annotations

import numpy as np
import pytest

from distattn.analysis import (cross_entropy, dot_product_variance, entropy, kl_divergence, linear_kernel, perplexity,
                               perplexity_from_nll)


def test_entropy_units_and_perplexity_of_uniform():
    p = np.full(8, 1 / 8)
    assert entropy(p) == pytest.approx(np.log(8))
    assert entropy(p, base=2) == pytest.approx(3.0)
    assert perplexity(p) == pytest.approx(8.0)                # e^{H} (seed 001), the same in any base
    assert entropy([1.0, 0.0, 0.0]) == 0.0
    np.testing.assert_allclose(entropy(np.array([[0.5, 0.5], [1.0, 0.0]]), base=2), [1.0, 0.0])


def test_cross_entropy_and_kl():
    p, q = np.array([0.7, 0.2, 0.1]), np.array([0.5, 0.25, 0.25])
    assert cross_entropy(p, q) == pytest.approx(-(p * np.log(q)).sum())
    assert cross_entropy(p, p) == pytest.approx(entropy(p))
    assert kl_divergence(p, q, base=2) == pytest.approx((p * np.log2(p / q)).sum())
    assert cross_entropy([1.0, 0.0], [0.0, 1.0]) == np.inf
    assert perplexity(p, q) == pytest.approx(np.exp(cross_entropy(p, q)))
    with pytest.raises(ValueError, match="sum to 1"):
        entropy([0.5, 0.6])
    with pytest.raises(ValueError, match="base"):
        entropy(p, base=1)


def test_perplexity_from_nll():
    assert perplexity_from_nll(np.full(10, np.log(5.0))) == pytest.approx(5.0)
    assert perplexity_from_nll(np.full(10, np.log2(5.0)), base=2) == pytest.approx(5.0)



@pytest.mark.parametrize("base", [float("nan"), float("inf")])
def test_a_non_finite_log_base_is_refused(base):
    # log(nan) = nan and log(inf) = inf: every entropy came out NaN or 0 without an error
    with pytest.raises(ValueError, match="base must be"):
        entropy([0.5, 0.5], base=base)
    with pytest.raises(ValueError, match="base must be"):
        perplexity_from_nll([1.0], base=base)

@pytest.mark.parametrize("dim", [4, 64])
def test_dot_product_variance_is_dim(dim):
    """Seed 002, section 11: Var⟨x, y⟩ = d for x, y ~ N(0, I_d); the scaled score has variance 1."""
    res = dot_product_variance(dim, n_samples=40_000, random_state=dim)
    se = np.sqrt((2 * dim**2 + 6 * dim) / 40_000)            # from E⟨x, y⟩⁴ = 3d² + 6d, not from the code
    assert res["expected"] == dim and res["std_error"] == pytest.approx(se)
    assert abs(res["variance"] - dim) < 5 * se
    assert abs(res["mean"]) < 5 * np.sqrt(dim / 40_000)
    scaled = dot_product_variance(dim, n_samples=40_000, scaled=True, random_state=dim + 1)
    assert scaled["expected"] == 1.0 and scaled["std_error"] == pytest.approx(se / dim)
    assert abs(scaled["variance"] - 1.0) < 5 * se / dim


def test_toy_embedding_example_of_seed_002():
    """Section 7: V = 6, d = 2, the prompt "dog eats fish fast", α = (0.4, 0.3, 0.2, 0.1)."""
    vocab = ["cat", "dog", "fish", "runs", "eats", "fast"]
    E = np.array([[1.0, 1.0], [1.2, 1.1], [0.9, 1.3], [-1.0, -1.1], [-1.2, -1.0], [-0.8, -1.3]])
    one_hot = np.eye(6)
    assert np.linalg.norm(one_hot[0] - one_hot[1]) == pytest.approx(np.sqrt(2))
    ids = [vocab.index(w) for w in "dog eats fish fast".split()]
    X = one_hot[ids] @ E                                      # x_i = Eᵀ e_i, stacked as rows
    np.testing.assert_array_equal(X, [[1.2, 1.1], [-1.2, -1.0], [0.9, 1.3], [-0.8, -1.3]])
    K = linear_kernel(X)                                      # the library's Gram matrix of the prompt
    assert K[0, 2] == pytest.approx(2.51, abs=1e-12)          # dog · fish (the paper's figure)
    assert K[0, 1] == pytest.approx(-2.54, abs=1e-12)         # dog · eats
    np.testing.assert_allclose(K, K.T, rtol=0, atol=0)
    alpha = np.array([0.4, 0.3, 0.2, 0.1])
    x_new = alpha @ X
    np.testing.assert_allclose(x_new, [0.22, 0.27], rtol=0, atol=1e-12)
    assert tuple(np.round(x_new, 2)) == (0.22, 0.27)
    assert not any(np.allclose(x_new, e) for e in E)          # not any single token's embedding


def test_two_distributions_must_cover_the_same_outcomes():
    from distattn.analysis import js_divergence
    with pytest.raises(ValueError, match=r"p has shape \(2,\) and q has shape \(1,\)"):
        kl_divergence([0.5, 0.5], [1.0])                                  # once broadcast to 0.0
    with pytest.raises(ValueError, match=r"P has shape \(3, 3\) and Q has shape \(4,\)"):
        js_divergence(np.eye(3), [1, 0, 0, 0])
    with pytest.raises(ValueError, match="P must sum to 1 along axis -1 .*found a sum of 2.0"):
        js_divergence([2, 0], [0, 5])                                    # once clipped to 1
    with pytest.raises(ValueError, match="p must be finite; it holds NaN or inf"):
        entropy([np.nan, 1.0])
    # many rows against one distribution still broadcast
    np.testing.assert_allclose(js_divergence(np.eye(3), [1, 0, 0]), [0.0, 1.0, 1.0])
    np.testing.assert_allclose(cross_entropy(np.full((2, 2), 0.5), [0.5, 0.5]), [np.log(2)] * 2)
