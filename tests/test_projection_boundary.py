"""What a researcher passes in their own script: each bad argument is named in the error."""

import numpy as np
import pytest
import scipy.sparse as sp

from distattn.projection import (Head, attention_weights, causal_weights, combine_heads, context_matrix,
                                 cross_vocabulary_evidence, directional_context_matrix, directional_factors,
                                 factored_svd, global_evidence, multihead_evidence, next_token_distribution,
                                 selector, sinusoidal_position_matrix, svd_heads, vocabulary_evidence)

S = np.array([[0., 2., 1., 0.], [2., 0., 3., 1.], [1., 3., 0., 2.], [0., 1., 2., 1.]])


@pytest.mark.parametrize("call", [
    lambda: attention_weights(S[:3, :3], "softmax", attention_temperature=0),
    lambda: vocabulary_evidence([0, 1], S, normalization="softmax", attention_temperature=0),
    lambda: global_evidence([0, 1], S, normalization="softmax", attention_temperature=0),
    lambda: next_token_distribution([0, 1], S, temperature=2.0, normalization="softmax", attention_temperature=0),
    lambda: cross_vocabulary_evidence([0], [1, 2], S, normalization="softmax", attention_temperature=0),
    lambda: combine_heads(np.ones((2, 3, 3)), "mean_softmax", attention_temperature=0),
    lambda: multihead_evidence([0, 1], svd_heads(S, 1, 1), normalization="softmax", attention_temperature=0),
])
def test_a_bad_attention_temperature_is_named_as_such(call):
    """It was reported as 'temperature must be ... got 0', although the output temperature was
    valid (2.0 above) and the bad value was attention_temperature."""
    with pytest.raises(ValueError, match=r"^attention_temperature must be a finite real number > 0; got 0$"):
        call()


@pytest.mark.parametrize("algorithm", ["arpack", "randomized"])
def test_a_rank_too_large_for_the_vocabulary_names_the_callers_arguments(algorithm):
    """truncated_svd's 'dim must be an integer with 1 <= dim < min(X.shape) = 4 ..., got 4' came
    through, naming an argument the caller never passed."""
    with pytest.raises(ValueError, match=r"^n_heads \* head_rank must be an integer with "
                                         r"1 <= n_heads \* head_rank < min\(X.shape\) = 4 .*got 4"):
        svd_heads(S, 2, 2, algorithm=algorithm)
    with pytest.raises(ValueError, match=r"^rank must be an integer with 1 <= rank < min\(X.shape\) = 4 .*got 4"):
        directional_factors(S, 4, algorithm=algorithm)
    assert len(svd_heads(S, 3, 1, algorithm=algorithm)) == 3 and directional_factors(S, 3)[0].shape == (4, 3)


@pytest.mark.parametrize("sparse", [sp.csr_array, sp.csr_matrix, sp.coo_array, sp.dok_matrix])
def test_scipy_sparse_inputs_are_densified_like_elsewhere(sparse):
    """Each of these once ended in numpy's 'setting an array element with a sequence' (np.asarray
    of a scipy sparse object), while S, P, weights, row_normalize and softmax_rows took sparse."""
    ids = [0, 1, 3, 1]
    Q = selector(ids, 4)
    M = Q @ sp.csr_array(S) @ Q.T                      # the paper's algebra in scipy: M comes out sparse
    np.testing.assert_allclose(M.toarray(), context_matrix(ids, S))
    for normalization in ("none", "row", "softmax"):
        np.testing.assert_allclose(attention_weights(sparse(M), normalization),
                                   attention_weights(M.toarray(), normalization))
        np.testing.assert_allclose(causal_weights(sparse(M), normalization), causal_weights(M.toarray(), normalization))
    W_q, W_k = np.eye(4)[:, :2] + 0.5, np.eye(4)[:, 1:3] * 2.0
    np.testing.assert_allclose(directional_context_matrix(ids, sparse(W_q), sparse(W_k)), W_q[ids] @ W_k[ids].T)
    head = Head(sparse(W_q), sparse(W_k))
    assert isinstance(head.query, np.ndarray)
    np.testing.assert_allclose(head.context_matrix(ids), W_q[ids] @ W_k[ids].T)
    u, s, vt = factored_svd(sparse(W_q), sparse(W_k))
    np.testing.assert_allclose((u * s) @ vt, W_q @ W_k.T, atol=1e-12)
    np.testing.assert_allclose(sinusoidal_position_matrix(3, sparse(W_q)), sinusoidal_position_matrix(3, W_q))


def test_head_profiles_validates_its_ids():
    """Head.profiles is public (Q S⁽ⁱ⁾ of a sequence) but took ids unchecked: a list raised
    AttributeError ('list' object has no attribute 'size'), an id >= vocab_size numpy's IndexError."""
    W_q, W_k = np.eye(4)[:, :2] + 0.5, np.eye(4)[:, 1:3] * 2.0
    head = Head(W_q, W_k)
    expected = W_q[[0, 3]] @ W_k.T
    np.testing.assert_allclose(head.profiles([0, 3]), expected)
    out = head.profiles([0, -2, 3])                       # any negative id is OOV: a zero row
    np.testing.assert_allclose(out[[0, 2]], expected)
    assert not out[1].any()
    with pytest.raises(ValueError, match=r"token_ids contains ids \[4\] outside \[0, vocab_size=4\)"):
        head.profiles(np.array([0, 4]))


@pytest.mark.parametrize("normalization", ["none", "softmax"])
def test_a_misspelt_zero_rows_is_refused_whatever_the_normalization(normalization):
    """The predictor, the batch and causal paths and weights= refused zero_rows='unifrom' always;
    these accepted it silently unless normalization='row'."""
    for call in (lambda: attention_weights(S[:3, :3], normalization, zero_rows="unifrom"),
                 lambda: global_evidence([0, 1], S, normalization=normalization, zero_rows="unifrom"),
                 lambda: next_token_distribution([0, 1], S, normalization=normalization, zero_rows="unifrom"),
                 lambda: cross_vocabulary_evidence([0], [1, 2], S, normalization=normalization, zero_rows="unifrom"),
                 lambda: multihead_evidence([0, 1], svd_heads(S, 1, 1), normalization=normalization,
                                            zero_rows="unifrom")):
        with pytest.raises(ValueError, match=r"^zero_rows must be one of \('uniform', 'zero', 'self'\); got 'unifrom'"):
            call()


def test_attention_weights_none_returns_a_copy_not_the_callers_matrix():
    """With normalization='none' a float64 M came back as the caller's own array, so editing A
    edited M (a float32 M was copied): the result is now always a new array."""
    M = np.arange(9, dtype=np.float64).reshape(3, 3)
    A = attention_weights(M, "none")
    np.testing.assert_array_equal(A, M)
    A[0, 0] = 100.0
    assert M[0, 0] == 0.0


def test_complex_inputs_are_refused_by_name():
    """A complex S, P, W_Q, W_K (or scores) lost its imaginary part with only numpy's
    ComplexWarning, and the projection went on with the real part."""
    import torch

    from distattn.projection import CorpusPositional, masked_attention, positional_context_matrix, row_normalize
    from distattn.projection import softmax_rows
    from distattn.projection.device_scorers import Asymmetric, Symmetric
    Sc = S + 1j * np.eye(4)
    W = np.ones((4, 2))
    P = np.ones((2, 4)) / 4
    calls = [
        ("cooc", lambda: context_matrix([0, 1], Sc)),
        ("cooc", lambda: vocabulary_evidence([0, 1], sp.csr_array(Sc))),
        ("S", lambda: Symmetric(Sc, "none", 4, "cpu")),
        ("W_K", lambda: Asymmetric(W, W * 1j, 4, "cpu")),
        ("query_factor", lambda: directional_context_matrix([0, 1], W * 1j, W)),
        ("key_factor", lambda: Head(W, torch.as_tensor(W * (1 + 1j)))),
        ("left", lambda: factored_svd((W * 1j).tolist(), W)),
        ("right", lambda: factored_svd(W.tolist(), W * 1j)),
        ("position_matrix", lambda: positional_context_matrix([0, 1], S, P * 1j)),
        ("distributions", lambda: CorpusPositional(S, sp.csr_array(P * 1j))),
        ("M", lambda: attention_weights(Sc, "row")),
        ("M", lambda: causal_weights(Sc)),
        ("M", lambda: masked_attention(Sc[None], np.ones((1, 4), bool))),
        ("weights", lambda: global_evidence([0, 1], S, weights=np.eye(2) * 1j)),
        ("weights", lambda: row_normalize(Sc)),
        ("scores", lambda: softmax_rows([[1j, 0.0]])),
        ("head_matrices", lambda: combine_heads(Sc[None])),
    ]
    for name, call in calls:
        with pytest.raises(ValueError, match=rf"^{name} must be real; got complex values"):
            call()


def test_negative_weight_messages_show_the_minimum_as_a_plain_number():
    # numpy 2's repr made it "the minimum is np.float64(-2.0)"
    from distattn.projection import attention_weights, causal_weights, row_normalize
    M = np.array([[1.0, -2.0], [3.0, 4.0]])
    for call in (lambda: row_normalize(M), lambda: attention_weights(M, "row"),
                 lambda: causal_weights(M, "row")):
        with pytest.raises(ValueError, match=r"the minimum is -2\.0\b"):
            call()
