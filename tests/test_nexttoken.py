"""Causal next-token evaluation: the fused projection kernel, the generic model protocol,
temperature fitting, n-gram baselines."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import log_softmax

from distattn.corpus.ragged import RaggedIds
from distattn.projection import (KneserNeyLM, ProjectionPredictor, UnigramLM, evaluate_next_token, fit_temperature,
                                 next_token_distribution, prediction_targets, unigram_prior)

V = 30


@pytest.fixture(scope="module")
def S():
    rng = np.random.default_rng(7)
    A = sp.random_array((V, V), density=0.3, rng=rng)
    return sp.csr_array(A + A.T) * 3.0


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(8)
    out = [rng.integers(-1, V, size=n) for n in (0, 1, 2, 6, 15, 40, 25)]
    out[3][:2] = -1                # a prefix that starts with OOV tokens
    return out


def naive(doc, S, tau, normalization="none", prior=None, w=0.0):
    """log p(doc[t+1] | doc[:t+1]) recomputed from scratch per position (NaN: nothing scored)."""
    out = np.full(len(doc), np.nan)
    for t in range(len(doc) - 1):
        if doc[t + 1] < 0:
            continue
        if (doc[:t + 1] >= 0).any():
            p = next_token_distribution(doc[:t + 1], S, temperature=tau, normalization=normalization)
        else:
            p = np.full(V, 1.0 / V)
        if prior is not None:
            p = (1 - w) * p + w * prior
        out[t] = np.log(p[doc[t + 1]])
    return out


class Generic:
    """Hides score_next_tokens so that the evaluator takes the generic logits path."""

    def __init__(self, model):
        self.model, self.vocab_size = model, model.vocab_size_

    def next_token_logits(self, ids):
        return self.model.next_token_logits(ids)


@pytest.mark.parametrize("tau", [1.0, 3.5])
def test_fused_kernel_matches_naive_reference(S, docs, tau):
    report, logp, rank = evaluate_next_token(ProjectionPredictor().fit(S), docs, temperature=tau, return_scores=True)
    ref = np.concatenate([naive(d, S, tau) for d in docs])
    np.testing.assert_array_equal(np.isnan(logp), np.isnan(ref))
    np.testing.assert_allclose(logp[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-6, atol=1e-6)
    assert report.n_predictions == int((~np.isnan(ref)).sum())
    assert report.mean_nll == pytest.approx(-np.nanmean(ref), rel=1e-6)
    assert report.perplexity == pytest.approx(np.exp(report.mean_nll))


def test_fused_kernel_on_a_large_vocabulary_long_documents_and_ranks():
    """Several of the kernel's column blocks (V > 2048) and position blocks (16 lanes), a prior,
    and ranks: the kernel's float32 lane increments keep log p within 1e-6 relative of the
    float64 reference, and a rank may differ only where another token ties the target to 1e-6."""
    rng = np.random.default_rng(11)
    n = 5000
    A = sp.random_array((n, n), density=0.01, rng=rng, data_sampler=lambda size: rng.uniform(0.0, 4.0, size))
    S_big = sp.csr_array(A + A.T)
    S_big.sort_indices()
    zipf = 1.0 / np.arange(1, n + 1)
    docs_big = [rng.choice(n, size=k, p=zipf / zipf.sum()) for k in (1, 17, 50, 130)]
    docs_big[2][[5, 20]] = -1
    prior = unigram_prior(docs_big, n, smoothing=0.5)
    model = ProjectionPredictor().fit(S_big)
    for w in (0.0, 0.2):
        _, logp, rank = evaluate_next_token(model, docs_big, temperature=2.5, prior=prior if w else None,
                                            prior_weight=w, return_scores=True)
        checked = 0
        for d, start in zip(docs_big, np.cumsum([0] + [len(d) for d in docs_big[:-1]])):
            for t in range(len(d) - 1):
                if d[t + 1] < 0 or not (d[:t + 1] >= 0).any():
                    continue
                p = (1 - w) * next_token_distribution(d[:t + 1], S_big, temperature=2.5) + w * prior
                target = p[d[t + 1]]
                assert logp[start + t] == pytest.approx(np.log(target), rel=1e-6, abs=1e-6)
                others = np.delete(p, d[t + 1])
                assert (others >= target * (1 + 1e-6)).sum() <= rank[start + t] <= (others >= target * (1 - 1e-6)).sum()
                checked += 1
        assert checked == 16 + 49 + 129 - 2                # the two OOV targets are not scored


def test_documents_are_dealt_to_balanced_worker_queues():
    from distattn.projection.causal import _balanced_queues
    lengths = np.random.default_rng(3).integers(1, 3000, size=200)
    for workers in (1, 2, 3, 8):
        ptr, queue = _balanced_queues(lengths, workers)
        assert ptr.size == workers + 1 and ptr[-1] == lengths.size
        np.testing.assert_array_equal(np.sort(queue), np.arange(lengths.size))    # each document exactly once
        loads = np.array([lengths[queue[ptr[w]:ptr[w + 1]]].sum() for w in range(workers)])
        assert loads.max() - loads.min() <= lengths.max()                         # greedy longest-first bound
    ptr, queue = _balanced_queues(lengths[:2], 8)                                  # more workers than documents
    assert ptr.size == 3 and sorted(queue) == [0, 1]


@pytest.mark.parametrize("normalization", ["none", "row", "softmax"])
def test_generic_path_matches_naive_reference(S, docs, normalization):
    model = ProjectionPredictor(normalization=normalization).fit(S)
    _, logp, rank = evaluate_next_token(Generic(model), docs, temperature=2.0, return_scores=True)
    ref = np.concatenate([naive(d, S, 2.0, normalization) for d in docs])
    np.testing.assert_allclose(logp[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-6, atol=1e-6)
    if normalization == "none":
        _, logp_f, rank_f = evaluate_next_token(model, docs, temperature=2.0, return_scores=True)
        np.testing.assert_array_equal(rank, rank_f)


@pytest.mark.parametrize("normalization", ["none", "row", "softmax"])
def test_torch_path_matches_numpy(S, docs, normalization):
    cpu = ProjectionPredictor(normalization=normalization).fit(S)
    dev = ProjectionPredictor(normalization=normalization, device="auto").fit(S)
    _, lp_np, rk_np = evaluate_next_token(Generic(cpu), docs, temperature=1.5, return_scores=True)
    _, lp_t, rk_t = evaluate_next_token(dev, docs, temperature=1.5, return_scores=True)            # fused, batched
    _, lp_g, rk_g = evaluate_next_token(Generic(dev), docs, temperature=1.5, return_scores=True)   # torch blocks
    ok = ~np.isnan(lp_np)
    for lp, rk in ((lp_t, rk_t), (lp_g, rk_g)):
        np.testing.assert_array_equal(np.isnan(lp), ~ok)
        np.testing.assert_allclose(lp[ok], lp_np[ok], rtol=1e-4, atol=1e-4)   # float32 on the device
        assert (rk[ok] == rk_np[ok]).mean() > 0.95


def test_prior_interpolation(S, docs):
    prior = unigram_prior(docs, V, smoothing=0.5)
    model = ProjectionPredictor().fit(S)
    for m in (model, Generic(model)):
        rep, logp, _ = evaluate_next_token(m, docs, prior=prior, prior_weight=0.3, return_scores=True)
        ref = np.concatenate([naive(d, S, 1.0, prior=prior, w=0.3) for d in docs])
        np.testing.assert_allclose(logp[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-5, atol=1e-6)
        assert rep.prior_weight == 0.3
    with pytest.raises(ValueError, match="needs a prior"):
        evaluate_next_token(model, docs, prior_weight=0.3)
    with pytest.raises(ValueError, match=r"prior_weight must be a real number in \[0, 1\)"):
        evaluate_next_token(model, docs, prior=prior, prior_weight=1.0)


def test_a_float32_prior_over_a_large_vocabulary_is_accepted():
    """A float32 probability vector normalised in float32 (a torch softmax, counts / counts.sum())
    sums to 1 only within float32 round-off, a few 1e-6 over 30k words: it was refused with
    'prior must be a probability vector ...; got shape (30000,), sum 1'."""
    import torch
    n = 30_000
    rng = np.random.default_rng(15)
    docs = [rng.integers(0, n, 50) for _ in range(3)]
    model = UnigramLM().fit(docs, n)
    prior = torch.softmax(torch.tensor(rng.normal(size=n) * 3, dtype=torch.float32), 0)
    assert abs(prior.double().sum().item() - 1) > 1e-6                   # the case that was refused
    got = evaluate_next_token(model, docs, prior=prior, prior_weight=0.2)
    exact = prior.double().numpy() / prior.double().sum().item()
    assert got.mean_nll == pytest.approx(evaluate_next_token(model, docs, prior=exact, prior_weight=0.2).mean_nll,
                                         rel=1e-6)
    with pytest.raises(ValueError, match=r"sum 1\.01 \(allowed: 1 within 1e-06\)"):   # a float64 vector: as before
        evaluate_next_token(model, docs, prior=np.full(n, 1.01 / n), prior_weight=0.2)


def test_oov_targets_are_skipped_and_counted(S):
    doc = np.array([3, -1, 4, 5, -1, 6])
    rep, logp, rank = evaluate_next_token(ProjectionPredictor().fit(S), [doc], return_scores=True)
    # position t predicts t+1: targets -1, 4, 5, -1, 6 -> 3 scored, 2 OOV, last position never
    assert rep.n_predictions == 3 and rep.n_oov_targets == 2
    assert np.isnan(logp[[0, 3, 5]]).all() and not np.isnan(logp[[1, 2, 4]]).any()
    assert (rank[[0, 3, 5]] == -1).all()
    # unk_id is OOV too
    assert evaluate_next_token(ProjectionPredictor().fit(S), [np.array([3, 9, 4])], unk_id=9).n_oov_targets == 1


def test_documents_as_flat_ids_and_offsets(S, docs):
    model = ProjectionPredictor().fit(S)
    ragged = RaggedIds.from_sequences(docs)
    a = evaluate_next_token(model, docs)
    b = evaluate_next_token(model, (ragged.ids, ragged.offsets))
    c = evaluate_next_token(model, ragged)
    assert a == b == c
    targets, scored = prediction_targets(ragged)
    assert scored.sum() == a.n_predictions


def test_uninformative_model_is_never_top_k_correct():
    class Uniform:
        vocab_size = 12

        def __call__(self, ids):
            return np.zeros((len(ids), 12))

    rep = evaluate_next_token(Uniform(), [np.arange(12)], top_k=(1, 5, 12))
    assert rep.mean_nll == pytest.approx(np.log(12))
    assert rep.top_k_accuracy == {1: 0.0, 5: 0.0, 12: 1.0}      # ties count against the target


def test_rank_and_top_k_from_known_logits():
    table = np.array([[0., 5., 1., 2.], [9., 0., 8., 7.], [0., 0., 3., 3.], [1., 2., 3., 4.]])

    def model(ids):                      # a callable: logits depend on the current token only
        return table[ids]

    rep, logp, rank = evaluate_next_token(model, [np.array([0, 1, 2, 3])], vocab_size=4, top_k=(1, 2),
                                          return_scores=True)
    # 0 -> 1 (rank 0), 1 -> 2 (rank 1), 2 -> 3 (tied with 2: rank 1)
    assert rank[:3].tolist() == [0, 1, 1]
    np.testing.assert_allclose(logp[:3], [log_softmax(table[0])[1], log_softmax(table[1])[2], log_softmax(table[2])[3]])
    assert rep.top_k_accuracy == {1: pytest.approx(1 / 3), 2: 1.0}


def test_model_may_yield_blocks_and_torch_tensors():
    import torch
    rng = np.random.default_rng(9)
    table = rng.normal(size=(V, V))
    doc = rng.integers(0, V, size=50)
    whole = evaluate_next_token(lambda ids: table[ids], [doc], vocab_size=V)
    blocks = evaluate_next_token(lambda ids: (table[ids[i:i + 7]] for i in range(0, len(ids), 7)), [doc], vocab_size=V)
    tensor = evaluate_next_token(lambda ids: torch.from_numpy(table[ids[:-1]]), [doc], vocab_size=V)
    assert blocks.mean_nll == pytest.approx(whole.mean_nll, rel=1e-6)
    assert tensor.mean_nll == pytest.approx(whole.mean_nll, rel=1e-6)
    assert blocks.top_k_accuracy == tensor.top_k_accuracy == whole.top_k_accuracy


def test_a_float64_torch_tensor_scores_as_the_same_numpy_array():
    """A model returning float64 torch tensors was scored in float32: logits 1e4 apart by 1e-3
    became ties, so ranks, top-1 and log p differed from the same logits as a numpy array."""
    import torch

    from distattn.projection.nexttoken import _score_block_torch
    rng = np.random.default_rng(10)
    table = 1e4 + rng.random((V, V)) * 1e-2          # raw-count sized logits, small differences
    doc = rng.integers(0, V, size=40)
    _, lp_np, rk_np = evaluate_next_token(lambda ids: table[ids], [doc], vocab_size=V, return_scores=True)
    _, lp_t, rk_t = evaluate_next_token(lambda ids: torch.from_numpy(table[ids]), [doc], vocab_size=V,
                                        return_scores=True)
    np.testing.assert_array_equal(rk_t, rk_np)
    np.testing.assert_allclose(lp_t, lp_np, rtol=0, atol=1e-9)
    # the accelerator path keeps float64 as well (run here on the CPU)
    targets = np.append(doc[1:], -2)
    lp_d, rk_d = _score_block_torch(torch.from_numpy(table[doc]), targets, 1.0, None, 0.0)
    np.testing.assert_array_equal(rk_d, rk_np)
    np.testing.assert_allclose(lp_d, lp_np, rtol=0, atol=1e-6)     # the numba scorer's exp is float32


@pytest.mark.parametrize("tau", [1e-40, 1e-310])
def test_a_tiny_temperature_scores_the_one_hot_limit_in_every_scorer(tau):
    """The scorers multiplied the logits by a precomputed 1/τ: for τ = 1e-310 it is inf and the
    target at the max gave 0 * inf = NaN (the generic path then blamed the model for NaN scores);
    the fused kernel's float32 scale overflowed already at τ = 1e-40, giving log p = +86. The
    max is subtracted first and then divided by τ, as log_softmax does: the one-hot limit."""
    import torch

    from distattn.projection.causal import causal_scores
    from distattn.projection.nexttoken import _score_block_torch
    S4 = sp.csr_array(np.eye(4) * 5.0 + 1.0)
    doc = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    ref = np.array([next_token_distribution(doc[:t + 1], S4, temperature=tau, log=True)[doc[t + 1]]
                    for t in range(doc.size - 1)])
    assert ref[0] == 0 and ref[7] == pytest.approx(-np.log(2)) and (ref[3:7] < -1e40).all()
    model = ProjectionPredictor().fit(S4)
    _, rank_ref = causal_scores([doc], S4)                             # ranks do not depend on τ
    prior = np.array([0.1, 0.2, 0.3, 0.4])
    with np.errstate(divide="ignore"):
        ref_prior = np.log(0.8 * np.exp(ref) + 0.2 * prior[doc[1:]])
    logp, rank = causal_scores([doc], S4, temperature=tau)
    np.testing.assert_allclose(logp[:-1], ref, rtol=1e-6)
    np.testing.assert_array_equal(rank, rank_ref)
    logp, _ = causal_scores([doc], S4, temperature=tau, prior=prior, prior_weight=0.2)
    np.testing.assert_allclose(logp[:-1], ref_prior, rtol=1e-6)
    with np.errstate(over="ignore"):                                  # perplexity exp(1e41) = inf
        _, logp, rank = evaluate_next_token(Generic(model), [doc], temperature=tau, return_scores=True)
    np.testing.assert_allclose(logp[:-1], ref, rtol=1e-6)
    np.testing.assert_array_equal(rank, rank_ref)
    logits = model.next_token_logits(doc)[:-1]
    for dtype in (torch.float32, torch.float64):                      # the accelerator path, run on the CPU
        logp, rank = _score_block_torch(torch.tensor(logits, dtype=dtype), doc[1:], tau, None, 0.0)
        want = ref if dtype == torch.float64 else np.where(ref < -np.finfo(np.float32).max, -np.inf, ref)
        np.testing.assert_allclose(logp, want, rtol=1e-6)
        np.testing.assert_array_equal(rank, rank_ref[:-1])


def test_a_temperature_product_that_underflows_is_refused_by_name(S, docs):
    """The fused path scores with the predictor's temperature times the evaluation's: two valid
    temperatures whose product underflows to 0 raised ZeroDivisionError from 1 / τ."""
    model = ProjectionPredictor(temperature=1e-200).fit(S)
    with pytest.raises(ValueError, match=r"temperature=1e-200 times the predictor's temperature=1e-200 underflows"):
        evaluate_next_token(model, docs, temperature=1e-200)


def test_model_protocol_errors():
    doc = [np.arange(5)]
    with pytest.raises(ValueError, match=r"scores of shape \(5, 3\).*vocab_size=5"):
        evaluate_next_token(lambda ids: np.zeros((len(ids), 3)), doc, vocab_size=5)
    with pytest.raises(ValueError, match="returned 2 rows.*at least 4"):
        evaluate_next_token(lambda ids: np.zeros((2, 5)), doc, vocab_size=5)
    with pytest.raises(ValueError, match="NaN"):
        evaluate_next_token(lambda ids: np.full((len(ids), 5), np.nan), doc, vocab_size=5)
    with pytest.raises(ValueError, match="vocab_size is needed"):
        evaluate_next_token(lambda ids: np.zeros((len(ids), 5)), doc)
    with pytest.raises(ValueError, match=r"outside \[0, vocab_size=5\)"):
        evaluate_next_token(lambda ids: np.zeros((len(ids), 5)), [np.array([1, 7])], vocab_size=5)


def test_max_predictions_limits_the_documents(S, docs):
    model = ProjectionPredictor().fit(S)
    full = evaluate_next_token(model, docs)
    part = evaluate_next_token(model, docs, max_predictions=10)
    assert 10 <= part.n_predictions < full.n_predictions


def test_fit_temperature_recovers_the_generating_temperature():
    rng = np.random.default_rng(10)
    n, tau_true = 15, 2.5
    table = rng.normal(scale=3.0, size=(n, n))
    probs = np.exp(log_softmax(table / tau_true, axis=1))
    cdf = np.cumsum(probs, axis=1)
    chains = [rng.integers(n, size=40)]
    for _ in range(100):                 # 40 Markov chains drawn from softmax(table[cur] / τ*)
        u = rng.random(40)[:, None]
        chains.append(np.minimum((u > cdf[chains[-1]]).sum(1), n - 1))
    docs = list(np.stack(chains, 1))
    tau = fit_temperature(lambda ids: table[ids], docs, vocab_size=n, bounds=(0.1, 100))
    assert tau == pytest.approx(tau_true, rel=0.1)
    nll = lambda t: evaluate_next_token(lambda ids: table[ids], docs, vocab_size=n, temperature=t).mean_nll  # noqa
    assert nll(tau) < nll(tau / 2) and nll(tau) < nll(tau * 2)


def test_fit_temperature_of_projection_predictor_beats_tau_one(S, docs):
    model = ProjectionPredictor().fit(S)
    tau = fit_temperature(model, docs, bounds=(0.05, 1e4))
    assert evaluate_next_token(model, docs, temperature=tau).mean_nll <= evaluate_next_token(model, docs).mean_nll


# --------------------------------------------------------------------------- baselines

@pytest.fixture(scope="module")
def train():
    rng = np.random.default_rng(11)
    base = rng.zipf(1.5, size=3000) % V
    cuts = np.sort(rng.choice(np.arange(1, 3000), size=40, replace=False))
    docs = np.split(base, cuts)
    docs[0][3] = -1                      # OOV tokens break n-grams
    return docs


@pytest.mark.parametrize("order", [2, 3])
def test_kneser_ney_rows_are_distributions(train, order):
    lm = KneserNeyLM(order=order).fit(train, V)
    probe = np.array([0, 1, 2, -1, 5, 29, 28, 0, 0, 17])      # seen, unseen and OOV contexts
    P = lm.probabilities(probe)
    assert P.shape == (10, V)
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-12)
    assert (P > 0).all()
    assert all(0 < d < 1 for d in lm.discounts_) and len(lm.discounts_) == order


@pytest.mark.parametrize("train_docs", [[], [np.array([1, 2]), np.array([3])]])
def test_kneser_ney_without_any_trigram_backs_off(train_docs):
    """A trigram model trained on documents with no trigram (none, or all shorter than 3 tokens)
    once raised IndexError at scoring (its back-off table was empty); every context backs off wholly
    to the lowest order (no continuation counts exist either)."""
    lm = KneserNeyLM(order=3).fit(train_docs, 5)
    P = lm.probabilities([0, 1, 2, 3])
    np.testing.assert_allclose(P, np.broadcast_to(lm.unigram_, (4, 5)), rtol=1e-12)
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-12)
    assert np.isfinite(evaluate_next_token(lm, [np.array([0, 1, 2])]).perplexity)


def test_kneser_ney_bigram_matches_a_loop_reference():
    docs = [np.array([0, 1, 2, 0, 1, 3]), np.array([1, 2, 2, 0])]
    Vs, D = 5, 0.5
    lm = KneserNeyLM(order=2, discount=D).fit(docs, Vs)
    pairs = [(d[i], d[i + 1]) for d in docs for i in range(len(d) - 1)]
    c = {}
    for p in pairs:
        c[p] = c.get(p, 0) + 1
    types = set(c)
    left = np.array([sum(1 for (u, w) in types if w == x) for x in range(Vs)], dtype=float)
    p1 = np.maximum(left - D, 0) / len(types) + D * np.count_nonzero(left) / len(types) / Vs
    for v in range(Vs):
        cv = sum(n for (u, w), n in c.items() if u == v)
        row = p1.copy() if cv == 0 else np.array(
            [max(c.get((v, w), 0) - D, 0) / cv + D * sum(1 for (u, _) in types if u == v) / cv * p1[w]
             for w in range(Vs)])
        np.testing.assert_allclose(lm.probabilities([v])[0], row, rtol=1e-12)


def test_trigram_beats_bigram_beats_unigram_on_markov_text():
    rng = np.random.default_rng(12)
    n = 20
    nxt = rng.integers(0, n, size=(n, n, 2))          # a second-order chain with two choices
    seqs = []
    for _ in range(60):
        s = list(rng.integers(0, n, size=2))
        for _ in range(60):
            s.append(int(nxt[s[-2], s[-1], rng.integers(2)]))
        seqs.append(np.array(s))
    tr, te = seqs[:50], seqs[50:]
    ppl = {name: evaluate_next_token(m.fit(tr, n), te).perplexity
           for name, m in (("uni", UnigramLM()), ("bi", KneserNeyLM(2)), ("tri", KneserNeyLM(3)))}
    assert ppl["tri"] < ppl["bi"] < ppl["uni"]
    assert ppl["tri"] < 3.0                                        # close to the 2 true choices


def test_unigram_model_and_prior(train):
    lm = UnigramLM(smoothing=1.0).fit(train, V)
    np.testing.assert_allclose(lm.prob_.sum(), 1.0)
    counts = np.bincount(np.concatenate(train)[np.concatenate(train) >= 0], minlength=V)
    np.testing.assert_allclose(lm.prob_, (counts + 1) / (counts.sum() + V))
    assert lm.next_token_logits(np.arange(4)).shape == (4, V)
    with pytest.raises(ValueError, match="order must be 2 or 3"):
        KneserNeyLM(order=4).fit(train, V)


def test_unigram_logits_need_one_sequence_as_kneser_ney_logits_do(train):
    """UnigramLM took the length from shape[0]: a (1, length) batch silently gave one row instead
    of one per position, and a scalar raised a bare 'IndexError: tuple index out of range'."""
    uni, kn = UnigramLM().fit(train, V), KneserNeyLM(order=2).fit(train, V)
    for lm in (uni, kn):
        assert lm.next_token_logits([1, 2, 3]).shape == (3, V)
        for bad in (np.array([[1, 2, 3]]), np.int64(3)):
            with pytest.raises(ValueError, match="token_ids must be a 1-D sequence of token ids"):
                lm.next_token_logits(bad)


def test_the_compiled_causal_scorer_refuses_what_its_kernel_would_trust():
    """causal_scores hands ids, shapes and the prior straight to a compiled kernel: an id equal to
    vocab_size once crashed the process, a short prior was read past its end."""
    from distattn.projection.causal import causal_plan, causal_scores
    from distattn.projection.torch_ops import torch_causal_scores
    S = sp.csr_array(np.array([[0.0, 2.0, 1.0], [2.0, 0.0, 3.0], [1.0, 3.0, 0.0]]))
    docs = RaggedIds.from_sequences([np.array([0, 1, 2, 1])])
    logp, rank = causal_scores(docs, S)
    assert np.isfinite(logp[:3]).all() and np.isnan(logp[3]) and rank[3] == -1
    bad_id = RaggedIds.from_sequences([np.array([0, 1, 3, 1])])
    for score in (causal_scores, torch_causal_scores):
        with pytest.raises(ValueError, match=r"ids \[3\] outside \[0, vocab_size=3\)"):
            score(bad_id, S)
        with pytest.raises(ValueError, match=r"must be square .*got shape \(3, 2\)"):
            score(docs, sp.csr_array(np.ones((3, 2))))
        with pytest.raises(ValueError, match="temperature must be a finite real number > 0; got 0"):
            score(docs, S, temperature=0)
        with pytest.raises(ValueError, match=r"prior must be a probability vector of shape \(3,\)"):
            score(docs, S, prior=np.array([0.5, 0.5]), prior_weight=0.2)
        with pytest.raises(ValueError, match=r"prior_weight must be a real number in \[0, 1\); got 5"):
            score(docs, S, prior=np.full(3, 1 / 3), prior_weight=5)
    with pytest.raises(ValueError, match="batch_positions must be an integer >= 1; got 0"):
        torch_causal_scores(docs, S, batch_positions=0)
    with pytest.raises(ValueError, match="plan was not built by causal_plan for this S"):
        causal_scores(docs, S, plan=causal_plan(sp.csr_array(np.eye(4))))
    np.testing.assert_array_equal(causal_scores([np.array([0, 1, 2, 1])], S)[1], rank)   # a list of arrays works too


def test_prediction_targets_take_lists_and_mark_every_negative_id_oov():
    """Once a list raised AttributeError and a raw -3 target passed through, uncounted as OOV."""
    from distattn.corpus import RaggedIds
    from distattn.projection import prediction_targets
    t, scored = prediction_targets([[0, -3, 2], [4, 5]])
    assert t.tolist() == [-1, 2, -2, 5, -2] and scored.tolist() == [False, True, False, True, False]
    t2, _ = prediction_targets(RaggedIds.from_sequences([[0, -3, 2], [4, 5]]))
    assert t2.tolist() == t.tolist()


def test_evaluation_options_give_clear_errors():
    """Each once failed with a bare Python error: "'int' object is not iterable", "not enough values
    to unpack", "ufunc 'isfinite' not supported for the input types"."""
    S = np.array([[0.0, 2.0, 1.0], [2.0, 0.0, 3.0], [1.0, 3.0, 0.0]])
    model = ProjectionPredictor().fit(S)
    docs = [np.array([0, 1, 2, 1])]
    with pytest.raises(ValueError, match=r"top_k must be a tuple of integers >= 1, e.g. \(1, 10\) or \(5,\); got 5"):
        evaluate_next_token(model, docs, top_k=5)
    assert evaluate_next_token(model, docs, top_k=[1, 2]).top_k_accuracy.keys() == {1, 2}
    for bounds in ((1.0,), (1.0, 2.0, 3.0), 10.0):
        with pytest.raises(ValueError, match="bounds must be \\(low, high\\) with 0 < low < high"):
            fit_temperature(model, docs, bounds=bounds)
    for smoothing in (None, "1"):
        with pytest.raises(ValueError, match="smoothing must be a finite real number >= 0"):
            unigram_prior(docs, 3, smoothing=smoothing)


def test_prediction_targets_read_a_tuple_as_ids_and_offsets():
    ids, offsets = np.array([1, 2, 3, 4]), np.array([0, 2, 4])
    targets, scored = prediction_targets((ids, offsets))      # once read as two documents of two ids each
    assert targets.tolist() == [2, -2, 4, -2] and scored.tolist() == [True, False, True, False]
    targets3, _ = prediction_targets((np.array([1, 2, 3]), np.array([0, 3])))
    assert targets3.tolist() == [2, 3, -2]                    # one document of three, not two "documents"
    with pytest.raises(TypeError, match=r"a tuple docs must be \(ids, offsets\)"):
        prediction_targets((ids, offsets, offsets))


def test_projection_predictor_checks_parameters_set_after_fit(S, docs):
    model = ProjectionPredictor().fit(S)
    for bad in (0, -1.0, float("nan")):
        model.set_params(temperature=bad)                     # 0 gave NaN, -1 an inverted distribution
        with pytest.raises(ValueError, match="temperature must be a finite real number > 0"):
            model.predict_proba(docs)
        with pytest.raises(ValueError, match="temperature must be a finite real number > 0"):
            evaluate_next_token(model, docs)
    model.set_params(temperature=1.0, normalization="rows")
    with pytest.raises(ValueError, match="normalization"):
        model.next_token_logits(docs[0])
    with pytest.raises(ValueError, match="vocabulary must be None, a vocabulary size"):
        ProjectionPredictor(vocabulary=7.0).fit(S)             # once "float has no len()"


@pytest.mark.parametrize("normalization", ["none", "row"])
def test_context_oov_id_reaches_a_fused_scorer_too(S, docs, normalization):
    # context_oov_id is the id the model sees for OOV context tokens; the fused path
    # (score_next_tokens) used to receive the raw -1s and skip them, so the same model gave
    # different perplexities depending on which path the evaluator took
    model = ProjectionPredictor(normalization=normalization).fit(S)
    fused, lp_f, rk_f = evaluate_next_token(model, docs, context_oov_id=0, return_scores=True)
    generic, lp_g, rk_g = evaluate_next_token(Generic(model), docs, context_oov_id=0, return_scores=True)
    scored = prediction_targets(docs)[1]
    np.testing.assert_allclose(lp_f[scored], lp_g[scored], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(rk_f[scored], rk_g[scored])
    assert fused.n_predictions == generic.n_predictions and fused.n_oov_targets == generic.n_oov_targets
    # and the substitution changes the result: OOV context tokens are no longer skipped
    assert not np.isclose(fused.mean_nll, evaluate_next_token(model, docs).mean_nll)


def test_fit_temperature_counts_the_models_unk_id_as_evaluate_does(S):
    # fit_temperature limited and checked the documents without the model's unk_id, which
    # evaluate_next_token then applied: predictions of <unk> counted towards max_predictions
    # (here the only document kept had no scored position, and τ came from NaN NLLs)
    model = ProjectionPredictor(unk_id=0).fit(S)
    rng = np.random.default_rng(3)
    docs = [np.array([3] + [0] * 9)] + [rng.integers(1, V, 12) for _ in range(6)]
    assert fit_temperature(model, docs, max_predictions=5) == fit_temperature(model, docs, unk_id=0,
                                                                              max_predictions=5)
    with pytest.raises(ValueError, match="no in-vocabulary prediction target"):
        fit_temperature(model, [np.array([3, 0, 0, 0])])


@pytest.mark.parametrize("make", [lambda: UnigramLM(), lambda: KneserNeyLM(order=2), lambda: KneserNeyLM(order=3)])
def test_ngram_models_fitted_with_unk_id_have_unk_targets_skipped(make):
    # fit(unk_id=...) treated <unk> as OOV, but the model did not say so, so the evaluator
    # scored every <unk> target (with the smoothing mass left for unseen words), unlike the
    # projection predictor given the same unk_id: ~290 vs ~197 predictions, perplexity x3
    rng = np.random.default_rng(1)
    train = [np.where(rng.random(30) < 0.3, 0, rng.integers(1, V, 30)) for _ in range(40)]
    test = [np.where(rng.random(30) < 0.3, 0, rng.integers(1, V, 30)) for _ in range(10)]
    model = make().fit(train, V, unk_id=0)
    default, explicit = evaluate_next_token(model, test), evaluate_next_token(model, test, unk_id=0)
    assert default.n_predictions == explicit.n_predictions < sum(len(d) - 1 for d in test)
    assert default.perplexity == pytest.approx(explicit.perplexity)


@pytest.mark.parametrize("bad", [30, -2, 1.0, True, "0"])
def test_context_oov_id_out_of_range_is_refused_up_front(S, docs, bad):
    # it reached the model unchecked: an id >= vocab_size failed deep inside the scoring
    model = ProjectionPredictor(normalization="row").fit(S)
    with pytest.raises(ValueError, match=r"context_oov_id must be None, -1 \(the default\) or an id in \[0, vocab_size="):
        evaluate_next_token(Generic(model), docs, context_oov_id=bad)
    default = evaluate_next_token(Generic(model), docs)
    assert evaluate_next_token(Generic(model), docs, context_oov_id=-1).perplexity == default.perplexity


def test_prediction_targets_name_a_0d_array():
    """prediction_targets(np.array(3)) once ended with numpy's 'iteration over a 0-d array'."""
    from distattn.projection import prediction_targets
    with pytest.raises(TypeError, match=r"docs must be a RaggedIds, an \(ids, offsets\) pair or a list of id "
                                        r"arrays; got a 0-d array"):
        prediction_targets(np.array(3))
