"""Positional (sec. 4), asymmetric (sec. 5), multi-head and cross-attention (sec. 6) variants."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from distattn.corpus.paper import load_paper_corpus
from distattn.projection import (CorpusPositional, Head, combine_heads, context_matrix, corpus_position_matrix, cross_context_matrix,
                                 cross_vocabulary_evidence, directional_context_matrix, directional_factors,
                                 embedding_basis, factored_svd, multihead_context_matrices, multihead_evidence,
                                 nmf_heads, positional_context_matrix, positional_distributions, row_normalize, softmax_rows,
                                 sinusoidal_encoding, sinusoidal_position_matrix, svd_heads, vocabulary_evidence)
from distattn.stats import ppmi


# --------------------------------------------------------------------------- positional

@pytest.fixture(scope="module")
def with_the():
    """The paper's vocabulary plus "the" (id 7), which co-occurs with every word."""
    paper = load_paper_corpus()
    S = np.zeros((8, 8))
    S[:7, :7] = paper.cooc.toarray()
    S[7, :7] = S[:7, 7] = [3, 3, 2, 2, 1, 2, 1]
    words = paper.words + ["the"]
    encode = lambda text: np.array([words.index(w) for w in text.split()])  # noqa: E731
    return sp.csr_array(S), encode


def permutation_equivalent(A, B):
    """Is there a permutation π with B = A[π][:, π]?"""
    n = A.shape[0]
    return any(np.allclose(A[np.ix_(p, p)], B) for p in map(list, itertools.permutations(range(n))))


def test_without_position_the_two_orders_are_permutations(with_the):
    S, encode = with_the
    a, b = encode("the river flooded the bank"), encode("the bank flooded the river")
    Ma, Mb = context_matrix(a, S), context_matrix(b, S)
    assert not np.array_equal(Ma, Mb)
    np.testing.assert_array_equal(Ma[np.ix_([0, 4, 2, 3, 1], [0, 4, 2, 3, 1])], Mb)
    assert permutation_equivalent(Ma, Mb)


def test_corpus_position_matrix_breaks_permutation_invariance(with_the):
    S, encode = with_the
    corpus = [encode(t) for t in ("the river flooded the bank", "the river flooded the shore",
                                  "the flooded river rely the", "the bank loan money rely", "river bank shore the the")]
    pi = positional_distributions(corpus, 8, max_length=6)
    a, b = encode("the river flooded the bank"), encode("the bank flooded the river")
    Pa, Pb = (corpus_position_matrix(pi, 5, scale=0.5) for _ in range(2))
    Ma = positional_context_matrix(a, S, Pa).total
    Mb = positional_context_matrix(b, S, Pb).total
    assert not permutation_equivalent(Ma, Mb)


def test_sinusoidal_position_matrix_breaks_permutation_invariance(with_the):
    S, encode = with_the
    U = embedding_basis(S, 4)
    assert U.shape == (8, 4)
    np.testing.assert_allclose(U.T @ U, np.eye(4), atol=1e-10)
    P = sinusoidal_position_matrix(5, U, scale=2.0)
    assert P.shape == (5, 8)
    a, b = encode("the river flooded the bank"), encode("the bank flooded the river")
    Ma = positional_context_matrix(a, S, P).total
    Mb = positional_context_matrix(b, S, P).total
    assert not permutation_equivalent(Ma, Mb)


@pytest.mark.parametrize("sparse_P", [True, False])
def test_positional_blocks_sum_to_the_augmented_projection(with_the, sparse_P):
    S, encode = with_the
    ids = np.array([7, 0, 4, -1, 1])
    rng = np.random.default_rng(0)
    P = rng.random((5, 8))
    blocks = positional_context_matrix(ids, S, sp.csr_array(P) if sparse_P else P)
    Q = np.zeros((5, 8))
    Q[[0, 1, 2, 4], ids[[0, 1, 2, 4]]] = 1                  # OOV position: zero row of Q
    Sd = S.toarray()
    np.testing.assert_allclose(blocks.content_content, Q @ Sd @ Q.T)
    np.testing.assert_allclose(blocks.content_position, Q @ Sd @ P.T)
    np.testing.assert_allclose(blocks.position_content, P @ Sd @ Q.T)
    np.testing.assert_allclose(blocks.position_position, P @ Sd @ P.T)
    np.testing.assert_allclose(blocks.total, (Q + P) @ Sd @ (Q + P).T)
    assert blocks.block_matrix().shape == (10, 10)


def test_positional_distributions_vectorised_matches_loop():
    rng = np.random.default_rng(3)
    docs = [rng.integers(-1, 6, size=n) for n in (0, 1, 4, 7, 7, 3)]
    pi = positional_distributions(docs, 6, max_length=5).toarray()
    ref = np.zeros((5, 6))
    for doc in docs:
        for r, tok in enumerate(doc[:5]):
            if tok >= 0:
                ref[r, tok] += 1
    ref = ref / np.maximum(ref.sum(1, keepdims=True), 1)
    np.testing.assert_allclose(pi, ref)
    with pytest.raises(ValueError, match="length=6 exceeds the 5 positions"):
        corpus_position_matrix(pi, 6)


def test_corpus_positional_matches_the_per_sequence_blocks():
    rng = np.random.default_rng(5)
    V = 40
    A = sp.random_array((V, V), density=0.2, rng=rng)
    S = sp.csr_array(A + 2 * A.T)                               # not symmetric
    docs = [rng.integers(-1, V, size=n) for n in rng.integers(1, 30, size=60)]
    pi = positional_distributions(docs, V, max_length=25)
    pos = CorpusPositional(S, pi, scale=0.7)
    for ids in ([3], rng.integers(-1, V, size=12), rng.integers(0, V, size=25)):
        ref = positional_context_matrix(ids, S, corpus_position_matrix(pi, len(ids), scale=0.7))
        got = pos(ids)
        for block in ("content_content", "content_position", "position_content", "position_position"):
            np.testing.assert_allclose(getattr(got, block), getattr(ref, block), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="the sequence has 26 tokens; the distributions cover 25 positions"):
        pos(np.zeros(26, dtype=int))
    with pytest.raises(ValueError, match=r"distributions must have shape \(max_length, vocab_size=40\)"):
        CorpusPositional(S, pi[:, :39])


def test_sinusoidal_encoding_values():
    pe = sinusoidal_encoding(3, 5, base=100.0)
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1, 0])
    np.testing.assert_allclose(pe[2, :2], [np.sin(2), np.cos(2)])
    np.testing.assert_allclose(pe[1, 2:4], [np.sin(100 ** -0.4), np.cos(100 ** -0.4)])


def test_position_matrix_shape_is_checked(with_the):
    S, encode = with_the
    with pytest.raises(ValueError, match=r"position_matrix must have shape \(length, vocab_size\) = \(3, 8\)"):
        positional_context_matrix([0, 1, 2], S, np.zeros((3, 7)))


def test_a_basis_without_columns_is_named_as_the_basis():
    """sinusoidal_position_matrix(length, basis) with a (vocab_size, 0) basis said 'dim must be an
    integer >= 1; got 0': an argument the caller never passed."""
    with pytest.raises(ValueError, match=r"basis must have at least one column \(its dim\); got shape \(5, 0\)"):
        sinusoidal_position_matrix(3, np.zeros((5, 0)))


def test_position_inputs_refuse_nan_and_a_1d_distribution(with_the):
    """A NaN in P, in the basis or in the distributions once gave NaN blocks without a word, and a
    1-D distributions array gave a (1,)-shaped 'position matrix'."""
    S, encode = with_the
    V = S.shape[0]
    nan_pi = np.full((3, V), np.nan)
    with pytest.raises(ValueError, match="position_matrix must be finite; it holds NaN or inf"):
        positional_context_matrix([0, 1, 2], S, nan_pi)
    with pytest.raises(ValueError, match="position_matrix must be finite; it holds NaN or inf"):
        positional_context_matrix([0, 1, 2], S, sp.csr_array(nan_pi))
    with pytest.raises(ValueError, match="basis must be finite; it holds NaN or inf"):
        sinusoidal_position_matrix(3, np.full((V, 2), np.nan))
    with pytest.raises(ValueError, match="distributions must be finite; it holds NaN or inf"):
        corpus_position_matrix(nan_pi, 2)
    with pytest.raises(ValueError, match="distributions must be finite; it holds NaN or inf"):
        CorpusPositional(S, nan_pi)
    with pytest.raises(ValueError, match=r"distributions must be 2-D \(max_length, vocab_size\); got shape \(8,\)"):
        corpus_position_matrix(np.full(V, 1 / V), 1)


# --------------------------------------------------------------------------- asymmetric

def directional_corpus(n_pairs=6, n_docs=300, seed=0):
    """Documents made of (cause, effect) pairs: word k is always followed by word k + n_pairs."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        ks = rng.integers(0, n_pairs, size=8)
        docs.append(np.stack([ks, ks + n_pairs], 1).ravel())
    return docs


def next_word_counts(docs, n):
    """C[i, j] = #(j right after i), the window-1 directional counts."""
    C = np.zeros((n, n))
    for d in docs:                       # a few hundred short documents
        np.add.at(C, (d[:-1], d[1:]), 1)
    return C


def test_directional_ppmi_factors_give_asymmetric_attention():
    docs = directional_corpus()
    X = ppmi(sp.csr_array(next_word_counts(docs, 12)))
    W_Q, W_K = directional_factors(X, 6)
    assert W_Q.shape == W_K.shape == (12, 6)
    seq = [0, 6, 1, 7]                      # cause, effect, cause, effect
    M = directional_context_matrix(seq, W_Q, W_K)
    assert np.abs(M - M.T).max() > 0.25 * np.abs(M).max()
    assert M[0, 1] > M[1, 0] + 0.5          # cause -> its effect scores higher than the reverse
    # the symmetric operator of the same corpus cannot tell the directions apart
    C = next_word_counts(docs, 12)
    Ssym = ppmi(sp.csr_array(C + C.T))
    Msym = context_matrix(seq, Ssym)
    np.testing.assert_allclose(Msym, Msym.T)


def test_directional_factors_reproduce_a_low_rank_operator():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(10, 3)) @ rng.normal(size=(3, 10))
    W_Q, W_K = directional_factors(X, 3)
    np.testing.assert_allclose(W_Q @ W_K.T, X, atol=1e-9)
    ids = [1, 5, 5, -1, 9]
    M = directional_context_matrix(ids, W_Q, W_K)
    ref = X[np.ix_([1, 5, 5, 0, 9], [1, 5, 5, 0, 9])]
    ref[3] = ref[:, 3] = 0
    np.testing.assert_allclose(M, ref, atol=1e-9)
    # caller-supplied factors with W_Q = W_K give a symmetric M
    M_sym = directional_context_matrix(ids, W_Q, W_Q)
    np.testing.assert_allclose(M_sym, M_sym.T)


def test_factored_svd_without_forming_the_product():
    rng = np.random.default_rng(5)
    A, B = rng.normal(size=(50, 4)), rng.normal(size=(40, 4))
    u, s, vt = factored_svd(A, B)
    np.testing.assert_allclose(s, np.linalg.svd(A @ B.T, compute_uv=False)[:4])
    np.testing.assert_allclose(u * s @ vt, A @ B.T, atol=1e-10)
    with pytest.raises(ValueError, match="same number of columns"):
        factored_svd(A, B[:, :3])
    for m, n in ((7, 4), (3, 9), (2, 2)):        # rank d above min(m, n): once shapes that did not multiply
        A, B = rng.normal(size=(m, 5)), rng.normal(size=(n, 5))
        u, s, vt = factored_svd(A, B)
        k = min(m, n)
        assert (u.shape, s.shape, vt.shape) == ((m, k), (k,), (k, n))
        np.testing.assert_allclose(u * s @ vt, A @ B.T, atol=1e-10)


def test_factor_shapes_are_checked():
    with pytest.raises(ValueError, match=r"same shape|both have shape"):
        directional_context_matrix([0], np.ones((3, 2)), np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"outside \[0, vocab_size=3\)"):
        directional_context_matrix([3], np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="key_factor must be finite; it holds NaN or inf"):
        directional_context_matrix([0, 1], np.ones((3, 2)), np.full((3, 2), np.nan))


def test_scores_that_overflow_the_directional_product_are_refused_by_name():
    """Finite factors whose products overflow float64 once gave an inf M_dir (NaN attention or
    evidence downstream) with only a RuntimeWarning; multihead_evidence blamed 'M'."""
    W = np.full((3, 2), 1e155)
    for make in (lambda: directional_context_matrix([0, 1], W, W),
                 lambda: multihead_evidence([0, 1], [Head(W, W)], normalization="softmax")):
        with pytest.raises(ValueError, match=r"M_dir = W_Q\[ids\] W_K\[ids\]ᵀ overflows float64"):
            make()


# --------------------------------------------------------------------------- multi-head

@pytest.fixture(scope="module")
def sym_S():
    rng = np.random.default_rng(6)
    A = rng.random((30, 30)) * (rng.random((30, 30)) < 0.3)
    return A + A.T


def test_svd_heads_sum_to_the_truncated_operator(sym_S):
    heads = svd_heads(sym_S, n_heads=3, head_rank=2)
    assert len(heads) == 3 and all(h.rank == 2 for h in heads)
    u, s, vt = np.linalg.svd(sym_S)
    S6 = (u[:, :6] * s[:6]) @ vt[:6]
    ids = np.array([0, 4, 4, 17, 29])
    Ms = multihead_context_matrices(ids, heads)
    assert Ms.shape == (3, 5, 5)
    np.testing.assert_allclose(combine_heads(Ms, "sum"), S6[np.ix_(ids, ids)], atol=1e-9)
    # heads are ordered by strength: each head's operator norm is a block of singular values
    norms = [np.linalg.norm(h.query @ h.key.T, 2) for h in heads]
    np.testing.assert_allclose(norms, s[[0, 2, 4]], rtol=1e-8)


def test_a_precomputed_svd_gives_the_same_heads_and_factors(sym_S):
    u, s, vt = np.linalg.svd(sym_S)
    wide = (u[:, :10], s[:10], vt[:10])                       # more triplets than asked for: a prefix is used
    for got, want in zip(svd_heads(sym_S, 3, 2, svd=wide), svd_heads(sym_S, 3, 2)):
        np.testing.assert_allclose(got.query @ got.key.T, want.query @ want.key.T, atol=1e-9)
    X = sym_S + np.triu(sym_S)                                  # not symmetric
    ux, sx, vtx = np.linalg.svd(X)
    W_Q, W_K = directional_factors(X, 4, svd=(ux[:, :6], sx[:6], vtx[:6]))
    R_Q, R_K = directional_factors(X, 4)
    np.testing.assert_allclose(W_Q @ W_K.T, R_Q @ R_K.T, atol=1e-9)
    with pytest.raises(ValueError, match="holds 10 singular triplets; rank 12 needs more"):
        svd_heads(sym_S, 3, 4, svd=wide)
    with pytest.raises(ValueError, match="factors a 29 x 30 matrix"):
        svd_heads(sym_S, 3, 2, svd=(u[1:, :10], s[:10], vt[:10]))
    with pytest.raises(ValueError, match="descending"):
        directional_factors(X, 4, svd=(ux[:, :6], sx[:6][::-1], vtx[:6]))
    with pytest.raises(ValueError, match=r"must be \(u \(m, r\)"):
        directional_factors(X, 4, svd=(ux[:, :6], sx[:5], vtx[:6]))


def test_multihead_evidence_uses_each_heads_own_values(sym_S):
    heads = svd_heads(sym_S, n_heads=2, head_rank=3)
    ids = np.array([1, 2, 3, -1])
    E = multihead_evidence(ids, heads)
    ref = np.zeros((4, 30))
    for h in heads:
        Si = h.query @ h.key.T
        k = [0, 1, 2]
        ref[k] += Si[np.ix_(ids[k], ids[k])] @ Si[ids[k]]
    np.testing.assert_allclose(E, ref, atol=1e-9)
    Esm = multihead_evidence(ids, heads, normalization="softmax")
    assert Esm.shape == (4, 30) and not Esm[3].any()


def test_nmf_heads_are_non_negative_and_row_normalisable(sym_S):
    heads = nmf_heads(sym_S, n_heads=2, head_rank=3, max_iter=300)
    assert all((h.query >= 0).all() and (h.key >= 0).all() for h in heads)
    strength = [np.linalg.norm(h.query @ h.key.T) for h in heads]
    assert strength[0] >= strength[1]
    Ms = multihead_context_matrices([0, 5, 9, 12], heads)
    A = combine_heads(Ms, "mean_row")
    np.testing.assert_allclose(A.sum(1), 1.0)
    np.testing.assert_allclose(A, np.mean([row_normalize(M) for M in Ms], axis=0))
    B = combine_heads(Ms, "mean_softmax", attention_temperature=2.0)
    np.testing.assert_allclose(B.sum(1), 1.0)
    E = multihead_evidence([0, 5, 9, 12], heads, normalization="row")
    assert E.shape == (4, 30) and (E >= 0).all()


def test_combine_heads_keeps_out_of_vocabulary_positions_out_of_the_attention(sym_S):
    # an OOV position has a zero row and column in every M^(i); as a key it must get no weight
    ids = np.array([0, 5, -1, 12])
    known = ids >= 0
    heads = nmf_heads(sym_S, n_heads=2, head_rank=3, max_iter=300)
    Ms = multihead_context_matrices(ids, heads)
    sub = np.ix_(np.flatnonzero(known), np.flatnonzero(known))
    for method, one in (("mean_softmax", lambda M: softmax_rows(M, temperature=2.0)),
                        ("mean_row", row_normalize)):
        A = combine_heads(Ms, method, attention_temperature=2.0, known=known)
        assert not A[2].any() and not A[:, 2].any()
        np.testing.assert_allclose(A[known].sum(1), 1.0)
        np.testing.assert_allclose(A[sub], np.mean([one(M[sub]) for M in Ms], axis=0))
    S = combine_heads(Ms, "sum", known=known)
    np.testing.assert_allclose(S, Ms.sum(0) * np.outer(known, known))
    # all known: the mask changes nothing
    np.testing.assert_array_equal(combine_heads(Ms[:, sub[0], sub[1]], "mean_softmax", known=np.ones(3, bool)),
                                  combine_heads(Ms[:, sub[0], sub[1]], "mean_softmax"))
    with pytest.raises(ValueError, match=r"known must be a boolean mask of shape \(4,\)"):
        combine_heads(Ms, "mean_softmax", known=[1, 1, 0, 1])


def test_multihead_errors(sym_S):
    with pytest.raises(ValueError, match="non-negative S"):
        nmf_heads(sym_S - 1.0, 2, 2)
    with pytest.raises(ValueError, match="method must be one of"):
        combine_heads(np.zeros((2, 3, 3)), "concat")
    with pytest.raises(ValueError, match="mean_row' needs non-negative heads"):
        combine_heads(multihead_context_matrices([0, 1, 2], svd_heads(sym_S, 3, 2)) - 5.0, "mean_row")
    with pytest.raises(ValueError, match="non-empty sequence of Head"):
        multihead_context_matrices([0], [])
    with pytest.raises(ValueError, match="share one vocab_size"):
        multihead_context_matrices([0], [Head(np.ones((3, 1)), np.ones((3, 1))), Head(np.ones((4, 1)), np.ones((4, 1)))])



def test_row_normalisation_of_signed_scores_points_at_an_option_of_the_caller(sym_S):
    """multihead_evidence (and vocabulary_evidence) with normalization='row' on signed scores
    passed on row_normalize's hint, 'Use softmax_rows for signed scores': a function the caller
    never called; the option that works is normalization='softmax'."""
    ids = [0, 1, 2, 5, 7]
    heads = svd_heads(sym_S, 3, 2)
    with pytest.raises(ValueError, match=r"normalization='row' needs non-negative heads \(e.g. nmf_heads\); head \d's "
                                         r"scores reach .*Use normalization='softmax' or 'none' for signed heads"):
        multihead_evidence(ids, heads, normalization="row")
    multihead_evidence(ids, heads, normalization="softmax")                  # the hint's option works
    from distattn.projection import attention_weights, global_evidence
    signed = sym_S - 0.5
    for call in (lambda: vocabulary_evidence(ids, signed, normalization="row"),
                 lambda: global_evidence(ids, signed, normalization="row"),
                 lambda: attention_weights(signed[:3, :3], "row")):
        with pytest.raises(ValueError, match=r"normalization='row' needs non-negative weights; the minimum is .*"
                                             r"Use normalization='softmax' for signed scores"):
            call()
    vocabulary_evidence(ids, signed, normalization="softmax")


def test_a_single_head_where_a_list_is_expected_says_so(sym_S):
    """multihead_evidence(ids, head) once failed with "'Head' object is not iterable"."""
    from distattn.projection.device_scorers import MultiHead
    head = svd_heads(sym_S, 1, 2)[0]
    for call in (lambda h: multihead_evidence([0, 1, 2], h), lambda h: multihead_context_matrices([0, 1, 2], h),
                 lambda h: MultiHead(h, "none", 30, "cpu")):
        with pytest.raises(TypeError, match=r"heads must be a list of Head objects .*got a single Head: pass \[head\]"):
            call(head)
        with pytest.raises(TypeError, match=r"heads must be a list of Head objects .*got int"):
            call(3)
    np.testing.assert_array_equal(multihead_evidence([0, 1, 2], [head]), multihead_evidence([0, 1, 2], (head,)))

# --------------------------------------------------------------------------- cross-attention

def test_cross_projection(sym_S):
    tgt, src = np.array([3, 8, -1]), np.array([1, 8, 20, 20])
    M = cross_context_matrix(tgt, src, sym_S)
    ref = sym_S[np.ix_([3, 8, 0], src)]
    ref[2] = 0
    np.testing.assert_allclose(M, ref)
    E = cross_vocabulary_evidence(tgt, src, sym_S)
    np.testing.assert_allclose(E, M @ sym_S[src])
    Er = cross_vocabulary_evidence(tgt, src, sym_S, normalization="row")
    np.testing.assert_allclose(Er[:2], row_normalize(M[:2]) @ sym_S[src])
    # a sequence attending to itself is self-attention
    np.testing.assert_allclose(cross_vocabulary_evidence(src, src, sym_S, normalization="softmax"),
                               vocabulary_evidence(src, sym_S, normalization="softmax"))
    with pytest.raises(ValueError, match="zero_rows='self' needs a square"):
        cross_vocabulary_evidence(tgt, src, sym_S, zero_rows="self")
    with pytest.raises(ValueError, match="source_ids is empty"):
        cross_context_matrix(tgt, [], sym_S)


def test_cross_row_normalisation_of_signed_scores_points_at_an_option_of_the_caller(sym_S):
    """cross_vocabulary_evidence(normalization='row') on a signed S passed on row_normalize's hint,
    'Use softmax_rows for signed scores': a function the caller never called (as
    vocabulary_evidence once did); the option that works is normalization='softmax'."""
    tgt, src = np.array([3, 8]), np.array([1, 8, 20])
    signed = sym_S - 0.5
    with pytest.raises(ValueError, match=r"normalization='row' needs non-negative weights; the minimum is .*"
                                         r"Use normalization='softmax' for signed scores"):
        cross_vocabulary_evidence(tgt, src, signed, normalization="row")
    cross_vocabulary_evidence(tgt, src, signed, normalization="softmax")        # the hint's option works


def test_combine_heads_refuses_nan_and_an_empty_stack():
    with pytest.raises(ValueError, match="head_matrices must be finite; it holds NaN or inf"):
        combine_heads(np.full((2, 3, 3), np.nan), "sum")            # once a NaN matrix
    with pytest.raises(ValueError, match="head_matrices must be finite; it holds NaN or inf"):
        combine_heads(np.full((2, 3, 3), np.nan), "mean_softmax")
    with pytest.raises(ValueError, match=r"n_heads >= 1; got \(0, 3, 3\)"):
        combine_heads(np.zeros((0, 3, 3)), "sum")                   # once an all-zero (3, 3) attention


def test_head_stores_its_factors_as_float64_arrays():
    import torch
    for q, k in (([[1, 2], [3, 4], [5, 6]], [[1, 0], [0, 1], [1, 1]]),
                 (torch.ones(3, 2), torch.ones(3, 2))):
        head = Head(q, k)                        # once stored raw: .rank raised AttributeError ('list' has no
        assert isinstance(head.query, np.ndarray) and head.query.dtype == np.float64     # shape), torch failed at @
        assert head.rank == 2 and head.vocab_size == 3
        Q, K = np.asarray(q, float)[[0, 2]], np.asarray(k, float)
        np.testing.assert_allclose(multihead_evidence([0, 2], [head]), (Q @ K[[0, 2]].T) @ (Q @ K.T))


def test_0d_distributions_are_named():
    """A 0-d distributions array once ended with scipy's 'function missing 1 required positional
    argument: 'shape''."""
    with pytest.raises(ValueError, match=r"distributions must be 2-D \(max_length, vocab_size\); got shape \(\)"):
        corpus_position_matrix(np.array(0.5), 1)
