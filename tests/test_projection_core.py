"""Core projection: Q, M, Norm(M), softmax, QS, E, e_global; batched numpy and torch paths;
the estimator; bad input."""

import re

import numpy as np
import pytest
import scipy.sparse as sp

from distattn.corpus.ragged import RaggedIds
from distattn.projection import (ProjectionPredictor, association_profiles, attention_weights, context_matrices,
                                 context_matrix, evaluate_next_token, global_evidence, global_evidences, log_softmax,
                                 masked_attention, next_token_distribution, row_normalize, scaled_softmax, selector,
                                 softmax_rows, vocabulary_evidence)

V = 40


@pytest.fixture(scope="module")
def S():
    rng = np.random.default_rng(1)
    A = sp.random_array((V, V), density=0.25, rng=rng, data_sampler=lambda size: rng.integers(1, 9, size).astype(float))
    return sp.csr_array(A + A.T)


def dense_reference(ids, S, normalization="none"):
    """Q S Qᵀ and E by literal dense matrix products (the paper's algebra)."""
    Sd = S.toarray()
    Q = np.zeros((len(ids), V))
    Q[np.arange(len(ids)), ids] = 1
    M = Q @ Sd @ Q.T
    if normalization == "row":
        sums = M.sum(1, keepdims=True)
        A = np.where(sums > 0, M / np.where(sums > 0, sums, 1), 1 / len(ids))
    elif normalization == "softmax":
        A = np.exp(M - M.max(1, keepdims=True))
        A /= A.sum(1, keepdims=True)
    else:
        A = M
    return M, A @ (Q @ Sd)


@pytest.mark.parametrize("normalization", ["none", "row", "softmax"])
def test_matches_dense_algebra(S, normalization):
    ids = np.array([3, 7, 3, 12, 39, 0, 7])
    M, E = dense_reference(ids, S, normalization)
    np.testing.assert_allclose(context_matrix(ids, S), M)
    np.testing.assert_allclose(vocabulary_evidence(ids, S, normalization=normalization), E, rtol=1e-12)
    np.testing.assert_allclose(global_evidence(ids, S, normalization=normalization), E.mean(0), rtol=1e-12)


def test_selector_and_profiles_shapes_types(S):
    Q = selector([2, 5, 2], V)
    assert isinstance(Q, sp.csr_array) and Q.shape == (3, V) and Q.sum() == 3
    QS = association_profiles([2, 5, 2], S)
    assert isinstance(QS, sp.csr_array) and QS.shape == (3, V)
    np.testing.assert_array_equal(QS.toarray(), S.toarray()[[2, 5, 2]])


def test_accepts_any_sparse_or_dense_S(S):
    ids = [1, 4, 9]
    ref = context_matrix(ids, S)
    for form in (S.toarray(), sp.coo_matrix(S), sp.csc_array(S), S.astype(np.int64), S.toarray().tolist()):
        np.testing.assert_array_equal(context_matrix(ids, form), ref)


def test_context_matrix_is_symmetric_for_symmetric_S_and_not_otherwise(S):
    ids = [1, 4, 9, 20]
    M = context_matrix(ids, S)
    np.testing.assert_array_equal(M, M.T)
    A = S.toarray()
    A[1, 4] += 5
    assert not np.array_equal(context_matrix(ids, A), context_matrix(ids, A).T)


# --------------------------------------------------------------------------- normalisation

def test_row_normalize_zero_row_policies():
    M = np.array([[0., 2., 2.], [0., 0., 0.], [1., 0., 3.]])
    u = row_normalize(M)
    np.testing.assert_allclose(u, [[0, .5, .5], [1 / 3, 1 / 3, 1 / 3], [.25, 0, .75]])
    np.testing.assert_allclose(row_normalize(M, zero_rows="self")[1], [0, 1, 0])
    np.testing.assert_array_equal(row_normalize(M, zero_rows="zero")[1], [0, 0, 0])
    for policy in ("uniform", "self", "zero"):
        assert not np.isnan(row_normalize(np.zeros((3, 3)), zero_rows=policy)).any()
    # batched along the last axis
    np.testing.assert_allclose(row_normalize(np.stack([M, 2 * M])), np.stack([u, u]))


def test_row_normalize_rejects_bad_input():
    with pytest.raises(ValueError, match="non-negative.*-1"):
        row_normalize([[1., -1.], [0., 1.]])
    with pytest.raises(ValueError, match="zero_rows must be one of"):
        row_normalize(np.eye(2), zero_rows="nan")
    with pytest.raises(ValueError, match="square"):
        row_normalize(np.zeros((2, 3)), zero_rows="self")
    with pytest.raises(ValueError, match="NaN or inf"):
        row_normalize([[np.nan, 1.]])


def test_softmax_and_scaled_softmax():
    x = np.array([[1e4, 1e4 - 1, 0.], [0., 0., 0.]])
    p = softmax_rows(x)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(1), 1)
    np.testing.assert_allclose(p[0, :2], [1 / (1 + np.e ** -1), np.e ** -1 / (1 + np.e ** -1)])
    np.testing.assert_allclose(scaled_softmax(x, 16), softmax_rows(x, temperature=4.0))
    with pytest.raises(ValueError, match="temperature must be a finite real number > 0"):
        softmax_rows(x, temperature=0)


def test_softmax_and_log_softmax_take_a_tiny_temperature_or_huge_scores():
    """Both divided by the temperature before subtracting the max: x / τ overflowed to inf and
    the rows came out all NaN (a subnormal τ, or finite scores near 1e307 with τ < 1)."""
    x = np.array([[1.0, 3.0, 2.0], [1e307, -1e307, 0.0]])
    np.testing.assert_array_equal(softmax_rows(x, temperature=1e-310), [[0, 1, 0], [1, 0, 0]])
    e = np.exp([-20.0, 0.0, -10.0])
    np.testing.assert_allclose(softmax_rows(x, temperature=0.1), [e / e.sum(), [1, 0, 0]], rtol=1e-12)
    np.testing.assert_array_equal(log_softmax(x, temperature=1e-310), [[-np.inf, 0, -np.inf], [0, -np.inf, -np.inf]])
    np.testing.assert_array_equal(log_softmax(x[1], temperature=0.1), [0, -np.inf, -1e307 / 0.1])
    np.testing.assert_array_equal(log_softmax(x, temperature=0.5, axis=0)[:, 0], log_softmax(x[:, 0], temperature=0.5))
    np.testing.assert_array_equal(log_softmax(np.zeros((2, 0))), np.zeros((2, 0)))


def test_next_token_distribution_refuses_evidence_that_overflows():
    # finite S near 1e308 with normalization='none': e = M(QS) overflowed to inf and p came out all NaN
    S = sp.csr_array(np.array([[1e308, 1e308, 0], [1e308, 0, 1e308], [0, 1e308, 1e308]]))
    with np.errstate(over="ignore"), pytest.raises(ValueError, match=r"evidence e_global overflows float64 .*"
                                                                       r"normalization='none'"):
        next_token_distribution([0, 1, 2], S)
    np.testing.assert_allclose(next_token_distribution([0, 1, 2], S, normalization="row"), [1 / 3] * 3)
    # rows whose sum overflows are still normalised (they were W / inf: all zeros, summing to 0)
    np.testing.assert_allclose(row_normalize(np.array([[1e308, 1e308, 0.0], [1.0, 3.0, 0.0]])),
                               [[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]])
    for bad in (np.inf, np.nan):
        with pytest.raises(ValueError, match=r"logits contain NaN or \+inf"):
            log_softmax(np.array([0.0, bad]))
    np.testing.assert_array_equal(log_softmax(np.array([0.0, -np.inf])), [0.0, -np.inf])


def test_predictor_log_proba_takes_a_tiny_temperature():
    # predict_log_proba divided e_global by τ before log-sum-exp: NaN rows at τ = 1e-310
    from distattn.corpus.paper import load_paper_corpus
    paper = load_paper_corpus()
    docs = [paper.encode("river_bank_flooded"), paper.encode("bank_loan")]
    e = ProjectionPredictor(normalization="row").fit(paper.cooc).transform(docs)
    lp = ProjectionPredictor(normalization="row", temperature=1e-310).fit(paper.cooc).predict_log_proba(docs)
    want = np.where(e == e.max(axis=1, keepdims=True), 0.0, -np.inf)
    assert (want == 0).sum() == 2        # one top word each, so the limit is one-hot
    np.testing.assert_array_equal(lp, want)


def test_log_softmax_is_finite_for_huge_evidence():
    lp = log_softmax(np.array([2e4, 1e4, 0.0]), temperature=1.0)
    assert np.all(np.isfinite(lp)) and lp[0] == 0.0 and lp[1] == -1e4
    np.testing.assert_allclose(np.exp(log_softmax([3.0, 1.0, 2.0], temperature=0.5)).sum(), 1.0)


@pytest.mark.parametrize("normalization", ["none", "row"])
def test_predictor_next_token_scores_take_a_tiny_temperature(normalization):
    """next_token_logits divided e_t by τ before subtracting the max (e_t / τ = inf at τ = 1e-310),
    and the fused path scaled by 1 / τ = inf: evaluate_next_token failed with "the model
    produced NaN scores". The limit is one-hot at each prefix's top word, as predict_log_proba's."""
    from distattn.corpus.paper import load_paper_corpus
    from distattn.projection import evaluate_next_token
    paper = load_paper_corpus()
    docs = [paper.encode("river_bank_flooded"), paper.encode("bank_loan")]
    model = ProjectionPredictor(normalization=normalization).fit(paper.cooc)
    tiny = ProjectionPredictor(normalization=normalization, temperature=1e-310).fit(paper.cooc)
    for doc in docs:
        e = model.next_token_logits(doc)
        np.testing.assert_array_equal(tiny.next_token_logits(doc), np.where(e == e.max(1, keepdims=True), 0.0, -np.inf))
    _, logp, _ = evaluate_next_token(tiny, docs, return_scores=True)
    want = np.concatenate([np.r_[log_softmax(model.next_token_logits(d)[:-1], temperature=1e-310)[
        np.arange(len(d) - 1), d[1:]], np.nan] for d in docs])
    np.testing.assert_array_equal(logp, want)
    assert np.isnan(logp).sum() == len(docs) and (logp == -np.inf).any()


def test_next_token_distribution_temperature(S):
    ids = [3, 7, 12]
    e = global_evidence(ids, S)
    p = next_token_distribution(ids, S, temperature=7.0)
    np.testing.assert_allclose(p, np.exp(e / 7) / np.exp(e / 7).sum())
    np.testing.assert_allclose(next_token_distribution(ids, S, temperature=7.0, log=True), np.log(p))


# --------------------------------------------------------------------------- OOV, length 1, bad input

def test_oov_positions_are_invisible(S):
    ids = np.array([3, -1, 7, 5])
    clean = np.array([3, 7, 5])
    M = context_matrix(ids, S)
    np.testing.assert_array_equal(M[[0, 2, 3]][:, [0, 2, 3]], context_matrix(clean, S))
    assert not M[1].any() and not M[:, 1].any()
    for norm in ("none", "row", "softmax"):
        E = vocabulary_evidence(ids, S, normalization=norm)
        np.testing.assert_allclose(E[[0, 2, 3]], vocabulary_evidence(clean, S, normalization=norm))
        assert not E[1].any()
        np.testing.assert_allclose(global_evidence(ids, S, normalization=norm),
                                   global_evidence(clean, S, normalization=norm))
    # unk_id marks OOV the same way
    np.testing.assert_array_equal(context_matrix([3, 5, 7, 5], S, unk_id=5)[[0, 2]][:, [0, 2]],
                                  context_matrix([3, 7], S))


def test_length_one_sequence(S):
    i = 7
    M = context_matrix([i], S)
    assert M.shape == (1, 1) and M[0, 0] == S[[i], [i]][0]
    np.testing.assert_array_equal(row_normalize(np.zeros((1, 1))), [[1.0]])
    e = global_evidence([i], S, normalization="row")          # attends to itself: its own profile
    np.testing.assert_allclose(e, S.toarray()[i])
    p = next_token_distribution([i], S)
    assert p.shape == (V,) and p.sum() == pytest.approx(1)


@pytest.mark.parametrize("fn", [context_matrix, vocabulary_evidence, global_evidence, next_token_distribution,
                                association_profiles])
def test_bad_sequences_raise_clear_errors(S, fn):
    with pytest.raises(ValueError, match="empty"):
        fn([], S)
    with pytest.raises(ValueError, match="no in-vocabulary token.*OOV"):
        fn([-1, -1], S)
    with pytest.raises(ValueError, match=r"ids \[40, 41\] outside \[0, vocab_size=40\)"):
        fn([1, 40, 41], S)
    with pytest.raises(TypeError, match="integer token ids"):
        fn([1.5, 2.0], S)
    with pytest.raises(ValueError, match="1-D"):
        fn([[1, 2]], S)


@pytest.mark.parametrize("fn", [context_matrix, vocabulary_evidence, global_evidence, next_token_distribution,
                                association_profiles])
def test_huge_unsigned_ids_are_refused_not_read_as_oov(S, fn):
    """uint64 ids >= 2**63 (e.g. 0 - 1 in uint64) wrapped to negative int64 and were silently
    treated as out-of-vocabulary tokens instead of refused as ids >= vocab_size."""
    ids = np.array([3, 5], dtype=np.uint64) - np.uint64(4)           # [2**64 - 1, 1]
    with pytest.raises(ValueError, match=r"ids \[18446744073709551615\] outside \[0, vocab_size=40\)"):
        fn(ids, S)
    with pytest.raises(ValueError, match="outside"):
        selector(ids, V)


def test_huge_unsigned_ids_in_a_list_of_documents_are_refused_not_read_as_oov(S):
    """A list of uint64 documents went through an int64 cast first, so 2**64 - 1 (0 - 1 in
    uint64) became -1: silently an OOV token in context_matrices, global_evidences, ...
    (RaggedIds.from_sequences, which every list of documents goes through, refuses it now)."""
    doc = np.array([3, 5, 6], dtype=np.uint64) - np.uint64(4)      # [2**64 - 1, 1, 2]
    with pytest.raises(ValueError, match=r"document 1 holds token id 18446744073709551615, beyond int64"):
        context_matrices([np.array([1, 2]), doc], S)
    with pytest.raises(ValueError, match="beyond int64"):
        global_evidences([doc], S)
    with pytest.raises(ValueError, match=r"contains ids \[40\] outside \[0, vocab_size="):   # an ordinary id past V
        context_matrices([np.array([1, 40], dtype=np.uint64)], S)


def test_bad_cooc_raises_clear_errors():
    with pytest.raises(ValueError, match=r"square .*got shape \(3, 4\)"):
        context_matrix([0, 1], np.ones((3, 4)))
    with pytest.raises(ValueError, match="2-D"):
        context_matrix([0], np.ones(3))
    with pytest.raises(ValueError, match="NaN or inf"):
        context_matrix([0], np.array([[np.inf]]))
    with pytest.raises(ValueError, match=r"cooc has shape \(4, 4\) but the vocabulary has vocab_size=5"):
        ProjectionPredictor(vocabulary=5).fit(np.eye(4))
    from distattn.corpus.vocabulary import Vocabulary
    fitted = ProjectionPredictor(vocabulary=Vocabulary(["a", "b"], specials=("<unk>",))).fit(np.eye(3))
    assert fitted.vocab_size_ == 3                           # <unk> + 2 words: the shapes agree
    with pytest.raises(ValueError, match="normalization must be one of"):
        vocabulary_evidence([0], np.eye(3), normalization="l2")


def test_cooc_must_match_the_model_vocabulary(S):
    from distattn.projection import evaluate_next_token
    with pytest.raises(ValueError, match="vocab_size=41 does not match the model's vocab_size 40"):
        evaluate_next_token(ProjectionPredictor().fit(S), [[1, 2, 3]], vocab_size=41)


# --------------------------------------------------------------------------- batched numpy

def test_batched_context_matrices_match_single(S):
    docs = [np.array([3, 7, 3]), np.array([5]), np.array([1, -1, 2, 9, 9]), np.array([], dtype=int)]
    Ms, lengths = context_matrices(docs, S)
    assert Ms.shape == (4, 5, 5) and lengths.tolist() == [3, 1, 5, 0]
    for d, doc in enumerate(docs[:3]):
        np.testing.assert_array_equal(Ms[d, :len(doc), :len(doc)], context_matrix(doc, S))
    assert not Ms[1, 1:].any() and not Ms[3].any()
    # flat ids + offsets and RaggedIds give the same
    ragged = RaggedIds.from_sequences(docs)
    np.testing.assert_array_equal(context_matrices((ragged.ids, ragged.offsets), S)[0], Ms)
    np.testing.assert_array_equal(context_matrices(ragged, S, max_length=2)[0], Ms[:, :2, :2])


@pytest.mark.parametrize("normalization", ["none", "row", "softmax"])
@pytest.mark.parametrize("zero_rows", ["uniform", "self", "zero"])
def test_batched_global_evidence_matches_single(S, normalization, zero_rows):
    rng = np.random.default_rng(2)
    docs = [rng.integers(-1, V, size=n) for n in (1, 2, 5, 9, 30, 3)]
    docs[0][0] = 4
    docs.append(np.array([-1, -1]))
    out = global_evidences(docs, S, normalization=normalization, zero_rows=zero_rows, chunk_pairs=50)
    assert out.shape == (len(docs), V)
    for d, doc in enumerate(docs[:-1]):
        np.testing.assert_allclose(out[d], global_evidence(doc, S, normalization=normalization, zero_rows=zero_rows),
                                   rtol=1e-12, atol=1e-12)
    assert not out[-1].any()          # an all-OOV document has no evidence


def test_masked_attention_rows_sum_to_one_over_known(S):
    Ms, lengths = context_matrices([[1, 2, 3], [4, -1]], S)
    known = np.array([[1, 1, 1], [1, 0, 0]], dtype=bool)
    for norm in ("row", "softmax"):
        A = masked_attention(Ms, known, norm)
        np.testing.assert_allclose(A.sum(-1)[known], 1.0)
        assert not A[1, :, 1:].any() and not A[1, 1:].any()


def test_attention_weights_known_mask_equals_dropping(S):
    ids = np.array([3, -1, 7])
    M = context_matrix(ids, S)
    A = attention_weights(M, "softmax", known=ids >= 0)
    np.testing.assert_allclose(A[np.ix_([0, 2], [0, 2])], softmax_rows(context_matrix([3, 7], S)))



@pytest.mark.parametrize("normalization", ["none", "row", "softmax"])
def test_attention_weights_with_no_known_position_is_all_zero(normalization):
    # an all-OOV sequence: "softmax" failed with numpy's "zero-size array to reduction operation"
    A = attention_weights(np.ones((2, 2)), normalization, known=np.zeros(2, dtype=bool))
    assert A.shape == (2, 2) and not A.any()
# --------------------------------------------------------------------------- torch path (CPU here; CUDA if present)

def test_torch_softmax_paths_take_a_tiny_temperature_or_huge_scores(S):
    """torch_attention divided M by τ before torch.softmax: M / τ overflowed to inf, softmax gave
    NaN and nan_to_num zeroed the rows (a silently empty e_global); torch_causal_scores' logits / τ
    gave NaN log p. Subtracting the max first gives the limit, as the numpy path does."""
    import torch
    from distattn.projection import torch_global_evidence
    from distattn.projection.torch_ops import torch_attention, torch_causal_scores
    M = torch.tensor([[[1.0, 3.0, 2.0], [3.0, 1.0, 0.0], [2.0, 0.0, 1.0]]], dtype=torch.float64)
    known = torch.tensor([[True, True, False]])
    want = [[[0, 1, 0], [1, 0, 0], [0, 0, 0]]]
    np.testing.assert_array_equal(torch_attention(M, known, "softmax", attention_temperature=1e-310).numpy(), want)
    np.testing.assert_array_equal(torch_attention(M * 1e300, known, "softmax", attention_temperature=1e-10).numpy(),
                                  want)
    docs = [np.array([3, 7, 3, 9]), np.array([1, -1, 2])]
    g = torch_global_evidence(docs, S, normalization="softmax", attention_temperature=1e-310, device="cpu",
                              dtype=torch.float64)
    np.testing.assert_allclose(g.numpy(), global_evidences(docs, S, normalization="softmax",
                                                           attention_temperature=1e-310), rtol=1e-12)
    assert g.numpy().sum(1).min() > 0
    logp, rank = torch_causal_scores([np.array([3, 7, 3, 9, 7, 3])], S, temperature=1e-310, device="cpu",
                                     dtype=torch.float64)
    assert not np.isnan(logp[:5]).any() and np.isnan(logp[5])
    assert S[3, 3] == 0 and logp[0] == -np.log(V)        # the first prefix's evidence is all zero: uniform at any τ
    np.testing.assert_array_equal(logp[1:5] == 0, rank[1:5] == 0)
    assert np.all((logp[1:5] == 0) | (logp[1:5] == -np.inf))


def test_torch_paths_refuse_a_temperature_that_float32_cannot_hold(S):
    """A float32 tensor divided by τ = 1e-46 (0 in float32) gave NaN: torch_attention's rows came
    out all zero after nan_to_num (a silently empty e_global), torch_causal_weights and
    torch_causal_scores NaN. A τ below float32's smallest normal is refused, naming the dtype and
    the smallest allowed value; float64 still takes it, and the smallest normal still works."""
    import torch
    from distattn.projection.torch_ops import torch_attention, torch_causal_scores, torch_causal_weights
    M = torch.tensor([[[1.0, 3.0, 2.0], [3.0, 1.0, 0.0], [2.0, 0.0, 1.0]]])
    known = torch.tensor([[True, True, False]])
    tiny = torch.finfo(torch.float32).tiny
    doc = [np.array([3, 7, 3, 9, 7, 3])]
    for tau in (1e-46, 1e-310, tiny / 2):
        msg = re.escape(f"temperature={tau!r} is too small for torch.float32 scores: below {tiny!r}") + \
            r".*" + re.escape(f"temperature >= {tiny!r}")
        with pytest.raises(ValueError, match="attention_" + msg):
            torch_attention(M, known, "softmax", attention_temperature=tau)
        with pytest.raises(ValueError, match="attention_" + msg):
            torch_causal_weights(M, "softmax", attention_temperature=tau)
        with pytest.raises(ValueError, match=msg):
            torch_causal_scores(doc, S, temperature=tau, device="cpu")
        # the predictor scores in float32 with a device, and cannot switch to float64: it offers device=None
        pred_msg = re.escape(f"temperature={tau!r} is below {tiny!r}, the smallest normal float32") + r".*" + \
            re.escape(f"a temperature >= {tiny!r}, or device=None (numpy, float64)")
        with pytest.raises(ValueError, match=pred_msg):
            ProjectionPredictor(temperature=tau, device="cpu").fit(S).next_token_logits(doc[0])
    # ProjectionPredictor.score_next_tokens scales by its temperature times the evaluation's: the message
    # named the product as 'temperature=1e-40', a value the caller never passed, and offered float64
    pred = ProjectionPredictor(temperature=1e-20, device="cpu").fit(S)
    with pytest.raises(ValueError, match=re.escape("temperature=1e-20 times the predictor's temperature=1e-20 "
                                                   "(= 1e-40) is below")):
        pred.score_next_tokens(doc, temperature=1e-20)
    with pytest.raises(ValueError, match=re.escape("attention_temperature=1e-40 is below")):
        ProjectionPredictor(normalization="softmax", attention_temperature=1e-40, device="cpu").fit(S) \
            .next_token_logits(doc[0])
    np.testing.assert_array_equal(torch_attention(M, known, "softmax", attention_temperature=tiny).numpy(),
                                  [[[0, 1, 0], [1, 0, 0], [0, 0, 0]]])
    assert not torch_causal_weights(M, "softmax", attention_temperature=tiny).isnan().any()
    logp, _ = torch_causal_scores(doc, S, temperature=tiny, device="cpu")
    assert not np.isnan(logp[:5]).any()
    assert not torch_causal_weights(M.double(), "softmax", attention_temperature=1e-310).isnan().any()


@pytest.mark.parametrize("normalization", ["none", "row", "softmax"])
def test_torch_path_matches_numpy(S, normalization):
    import torch
    from distattn.projection import torch_context_matrices, torch_global_evidence, torch_vocabulary_evidence
    docs = [np.array([3, 7, 3, 9]), np.array([5]), np.array([1, -1, 2])]
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        M, known = torch_context_matrices(docs, S, device=device, dtype=torch.float64)
        np.testing.assert_allclose(M.cpu().numpy(), context_matrices(docs, S)[0])
        assert known.cpu().numpy().tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 1, 0]]
        g = torch_global_evidence(docs, S, normalization=normalization, device=device, dtype=torch.float64)
        np.testing.assert_allclose(g.cpu().numpy(), global_evidences(docs, S, normalization=normalization),
                                   rtol=1e-10)
        E = torch_vocabulary_evidence(docs, S, normalization=normalization, device=device, dtype=torch.float64)
        for d, doc in enumerate(docs):
            np.testing.assert_allclose(E[d, :len(doc)].cpu().numpy(),
                                       vocabulary_evidence(doc, S, normalization=normalization), rtol=1e-10)


# --------------------------------------------------------------------------- estimator

def test_estimator_api(S):
    model = ProjectionPredictor(normalization="row", temperature=3.0).fit(S)
    assert model.get_params()["temperature"] == 3.0 and model.vocab_size_ == V
    ids = [3, 7, 12]
    np.testing.assert_allclose(model.attention(ids), row_normalize(context_matrix(ids, S)))
    np.testing.assert_allclose(model.evidence(ids), vocabulary_evidence(ids, S, normalization="row"))
    np.testing.assert_allclose(model.global_evidence(ids), global_evidence(ids, S, normalization="row"))
    np.testing.assert_allclose(model.predict_proba([ids])[0],
                               next_token_distribution(ids, S, temperature=3.0, normalization="row"))
    assert model.predict([ids, [5]]).shape == (2,)


def test_estimator_validates_at_fit():
    model = ProjectionPredictor(normalization="max")           # stored unchanged ...
    assert model.normalization == "max"
    with pytest.raises(ValueError, match=r"normalization must be one of \('none', 'row', 'softmax'\); got 'max'"):
        model.fit(np.eye(3))                                    # ... validated at fit
    with pytest.raises(ValueError, match="temperature must be a finite real number > 0; got -1"):
        ProjectionPredictor(temperature=-1).fit(np.eye(3))
    from sklearn.exceptions import NotFittedError
    with pytest.raises(NotFittedError):
        ProjectionPredictor().context_matrix([0])


def test_attention_weights_checks_the_known_mask_against_M():
    from distattn.projection import attention_weights
    M = np.arange(9.0).reshape(3, 3)
    with pytest.raises(ValueError, match=r"known must be a boolean mask of shape \(3,\)"):
        attention_weights(M, "row", known=np.array([True, False]))      # once silently the wrong rows
    with pytest.raises(ValueError, match=r"M must be square"):
        attention_weights(np.ones(3), "row")
    A = attention_weights(M, "row", known=np.array([True, False, True]))
    assert A[1].sum() == 0 and A[:, 1].sum() == 0 and A[0].sum() == pytest.approx(1.0)
    raw = attention_weights(M, "none", known=np.array([True, False, True]))     # once M, mask ignored
    assert raw.tolist() == [[0.0, 0.0, 2.0], [0.0, 0.0, 0.0], [6.0, 0.0, 8.0]]
    assert attention_weights(M, "none", known=np.ones(3, bool)).tolist() == M.tolist()


def test_unk_id_must_be_an_id_of_the_vocabulary():
    with pytest.raises(ValueError, match=r"unk_id must be None or a token id in \[0, vocab_size=3\); got 'x'"):
        ProjectionPredictor(unk_id="x").fit(np.eye(3))                         # refused at fit, sklearn-style
    with pytest.raises(ValueError, match="got 1.5"):
        context_matrix([0, 1], np.eye(3), unk_id=1.5)


def test_causal_weights_and_batch_evidence_check_their_shapes_and_sizes():
    from distattn.projection import global_evidences
    from distattn.projection.causal import causal_weights
    with pytest.raises(ValueError, match=r"M must be square \(length, length\); got shape \(3,\)"):
        causal_weights(np.ones(3))
    with pytest.raises(ValueError, match="chunk_pairs must be an integer >= 1; got -5"):
        global_evidences([np.array([0, 1])], np.eye(3), chunk_pairs=-5)


def test_causal_softmax_weights_take_a_tiny_temperature_or_huge_scores():
    """causal_weights and torch_causal_weights divided M by τ before the prefix log-sum-exp: M / τ
    overflowed to inf and the weights came out NaN. Each prefix's softmax is now the limit."""
    import torch
    from distattn.projection.causal import causal_weights
    from distattn.projection.torch_ops import torch_causal_weights
    want = [[1, 0], [1, 1]]        # prefix 0: the one weight; prefix 1: row 0 -> column 1, row 1 -> column 0
    for M, tau in ((np.array([[1.0, 2.0], [2.0, 1.0]]), 1e-310), (np.array([[1e308, 1.7e308], [1.7e308, 0.0]]), 0.5)):
        np.testing.assert_array_equal(causal_weights(M, "softmax", attention_temperature=tau), want)
        got = torch_causal_weights(torch.as_tensor(M)[None], "softmax", attention_temperature=tau)
        np.testing.assert_array_equal(got[0].numpy(), want)
    M = np.random.default_rng(0).normal(size=(5, 5)) * 3        # ordinary scores: the prefix softmaxes
    C = causal_weights(M, "softmax", attention_temperature=0.7)
    for t in range(5):
        np.testing.assert_allclose(C[t, :t + 1], softmax_rows(M[:t + 1, :t + 1], temperature=0.7).sum(0), rtol=1e-12)
    np.testing.assert_allclose(torch_causal_weights(torch.as_tensor(M)[None], "softmax",
                                                    attention_temperature=0.7)[0].numpy(), C, rtol=1e-12)


def test_attention_from_scores_refuses_nan_instead_of_returning_it():
    """softmax_rows, attention_weights, causal_weights and masked_attention once passed NaN
    scores through (a NaN attention, or NaN evidence downstream) without a word."""
    from distattn.projection.causal import causal_weights
    bad = np.array([[0.0, np.nan], [1.0, 2.0]])
    with pytest.raises(ValueError, match=r"scores contain NaN or \+inf"):
        softmax_rows(bad)
    with pytest.raises(ValueError, match=r"scores contain NaN or \+inf"):
        softmax_rows([[np.inf, 1.0]])
    with pytest.raises(ValueError, match="a row of scores is all -inf"):
        softmax_rows([[-np.inf, -np.inf], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"at least one column; got shape \(\)"):
        softmax_rows(3.0)
    np.testing.assert_allclose(softmax_rows([[-np.inf, 0.0]]), [[0.0, 1.0]])     # a masked entry is fine
    for normalization in ("none", "row", "softmax"):
        with pytest.raises(ValueError, match="M must be finite; it holds NaN or inf"):
            attention_weights(bad, normalization)
        with pytest.raises(ValueError, match="M must be finite; it holds NaN or inf"):
            causal_weights(bad, normalization)
        with pytest.raises(ValueError, match="M must be finite; it holds NaN or inf"):
            masked_attention(bad[None], np.ones((1, 2), bool), normalization)


def test_masked_attention_checks_its_shapes():
    M = np.ones((2, 3, 3))
    with pytest.raises(ValueError, match=r"known must be a boolean mask of shape \(n_docs, length\) = \(2, 3\)"):
        masked_attention(M, np.ones((2, 2), bool), "row")          # once a numpy broadcasting error
    with pytest.raises(ValueError, match=r"M must have shape \(n_docs, length, length\); got \(3, 3\)"):
        masked_attention(M[0], np.ones(3, bool), "row")            # once IndexError
    A = masked_attention(M.tolist(), np.array([[1, 1, 0], [1, 1, 1]]), "row")     # lists and 0/1 masks work
    np.testing.assert_allclose(A.sum(-1), [[1, 1, 0], [1, 1, 1]])


def test_given_weights_are_checked(S):
    ids = np.array([1, 5, 9])
    bad = np.ones((3, 3))
    bad[0, 2] = np.nan
    for fn in (vocabulary_evidence, global_evidence, next_token_distribution):
        with pytest.raises(ValueError, match="weights must be finite; it holds NaN or inf"):
            fn(ids, S, weights=bad)                                  # once NaN evidence / a NaN distribution
        with pytest.raises(ValueError, match="normalization must be one of"):
            fn(ids, S, weights=np.ones((3, 3)), normalization="rows")   # once ignored silently
    W = np.arange(9.0).reshape(3, 3)
    np.testing.assert_allclose(vocabulary_evidence(ids, S, weights=sp.csr_array(W)),   # once "setting an array
                               vocabulary_evidence(ids, S, weights=W))                  # element with a sequence"


def test_sparse_input_to_row_normalize_and_softmax_rows_is_memory_checked(monkeypatch):
    """Both densify a sparse input (softmax of a zero is not zero): a whole vocab x vocab S once went
    straight to .toarray() with no estimate."""
    from distattn.memory import MemoryBudgetError
    big = sp.eye_array(2000, format="csr")          # 32 MB dense
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", "4M")
    for fn in (row_normalize, softmax_rows):
        with pytest.raises(MemoryBudgetError, match=r"sparse \(2000, 2000\) matrix \(dense result\)"):
            fn(big)
    np.testing.assert_allclose(row_normalize(sp.eye_array(3, format="csr")), np.eye(3))   # small ones still work


def test_log_softmax_refuses_a_0d_array_as_softmax_rows_does():
    """A 0-d array came back as shape (1,), a log-probability of 0 for a "vocabulary" of one."""
    with pytest.raises(ValueError, match=r"logits must have at least one axis.*got shape \(\)"):
        log_softmax(np.array(0.5))


@pytest.mark.parametrize("device", [None, "cpu"])
def test_causal_row_normalisation_refuses_signed_weights_on_every_path(device):
    """Norm(M) has no meaning for signed scores (a PMI with negative entries): the numpy path
    refused them, but the torch path (``device=``) divided by signed prefix sums and scored the
    result as a perplexity."""
    rng = np.random.default_rng(0)
    signed = rng.normal(size=(10, 10))
    signed = signed + signed.T
    docs = [rng.integers(0, 10, 8) for _ in range(3)]
    model = ProjectionPredictor(normalization="row", device=device).fit(signed)
    with pytest.raises(ValueError, match="normalization='row' needs non-negative weights"):
        evaluate_next_token(model, docs)
    with pytest.raises(ValueError, match="normalization='row' needs non-negative weights"):
        model.next_token_logits(docs[0])


def test_softmax_rows_of_a_float32_sparse_matrix_is_float64():
    """The docstring promises float64; a float32 sparse input came back float32 (and was computed
    in float32), where the same values given dense came back float64."""
    x = np.array([[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]], dtype=np.float32)
    got = softmax_rows(sp.csr_array(x), temperature=0.3)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, softmax_rows(x, temperature=0.3))


def test_given_weights_leave_an_oov_tokens_evidence_row_zero():
    """The module promises zero rows of E at OOV positions; with weights= given, an OOV position's
    row of the caller's weights leaked into E (E[r] = Σ_s A[r, s] S[id_s])."""
    rng = np.random.default_rng(0)
    S = rng.random((6, 6))
    ids = np.array([1, -1, 3, 4])
    W = rng.random((4, 4))
    E = vocabulary_evidence(ids, S, weights=W)
    assert not E[1].any()
    want = W[[0, 2, 3]][:, [0, 2, 3]] @ S[[1, 3, 4]]          # known rows, known columns
    np.testing.assert_allclose(E[[0, 2, 3]], want, rtol=1e-12)
    assert not vocabulary_evidence(np.array([1, 2, 3]), S, weights=W[:3, :3], unk_id=2)[1].any()
    np.testing.assert_allclose(global_evidence(ids, S, weights=W), E[[0, 2, 3]].mean(axis=0), rtol=1e-12)
