"""The dense profile rows S[ids] of the torch projection path, and the reused buffers behind them."""

from __future__ import annotations

import contextlib
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from distattn.corpus.ragged import RaggedIds
from distattn.projection import ProjectionPredictor, evaluate_next_token
from distattn.projection.device_scorers import Symmetric
from distattn.projection.torch_ops import Workspace, _DeviceCSR

# the CPU always; CUDA too where there is one (benchmarks/gpu_compare.sh runs this file on the GPU)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _random_csr(V=50, density=0.2, seed=0, dtype=np.float32, symmetric=False):
    """A canonical CSR with values in [0.5, 1.5) (no stored zero could hide a missed entry) and
    an empty row 7."""
    S = sp.random(V, V, density=density, random_state=seed, format="csr", dtype=dtype)
    S.data += 0.5
    if symmetric:
        S = S + S.T
    keep = np.ones(V, dtype=dtype)
    keep[7] = 0
    S = sp.diags(keep) @ S @ (sp.diags(keep) if symmetric else sp.identity(V, dtype=dtype))
    S = sp.csr_array(S, dtype=dtype)
    S.eliminate_zeros()
    S.sort_indices()
    return S


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_rows_equal_scipy_rows_with_zero_rows_for_negative_ids(dtype, device):
    S = _random_csr()
    csr = _DeviceCSR(S, torch.device(device), dtype)
    ids = torch.tensor([[3, -1, 7, 3], [49, 0, -1, -1]], device=device)
    got = csr.dense_rows(ids)
    dense = S.toarray()
    want = np.where((ids.cpu().numpy() >= 0)[..., None], dense[ids.cpu().numpy().clip(min=0)], 0.0)
    assert got.shape == (2, 4, 50) and got.dtype == dtype and got.device.type == device
    np.testing.assert_array_equal(got.cpu().numpy(), want.astype(got.cpu().numpy().dtype))
    # the accelerator's torch scatter, run here on this device too, gives the same block
    scattered = csr.scatter_rows(ids.reshape(-1), torch.zeros(8, 50, dtype=dtype, device=device))
    np.testing.assert_array_equal(scattered.reshape(2, 4, 50).cpu().numpy(), got.cpu().numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_dense_rows_overwrite_whatever_out_held(device):
    S = _random_csr(seed=1)
    csr = _DeviceCSR(S, torch.device(device), torch.float32)
    ids = torch.tensor([[5, -1, 2]], device=device)
    out = torch.full((1, 3, 50), 7.0, device=device)     # stale contents, as a reused buffer has
    got = csr.dense_rows(ids, out=out)
    assert got.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(got.cpu().numpy(), csr.dense_rows(ids).cpu().numpy())
    assert (got[0, 1] == 0).all()


@pytest.mark.parametrize("bad, message", [
    (torch.empty(1, 3, 49), r"shape \(1, 3, 50\)"),
    (torch.empty(1, 3, 50, dtype=torch.float64), "torch.float32"),
    (torch.empty(1, 50, 3).transpose(1, 2), "contiguous"),
])
def test_dense_rows_refuse_an_out_that_does_not_fit(bad, message):
    csr = _DeviceCSR(_random_csr(), torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match=message):
        csr.dense_rows(torch.tensor([[1, 2, 3]]), out=bad)


def test_workspace_reuses_a_buffer_and_grows_it_when_asked_for_more():
    work = Workspace()
    a = work.get("rows", (4, 10), torch.float32, "cpu")
    b = work.get("rows", (2, 10), torch.float32, "cpu")
    assert b.data_ptr() == a.data_ptr() and b.shape == (2, 10) and b.is_contiguous()
    assert work.get("rows", (3, 10), torch.float32, torch.device("cpu")).data_ptr() == a.data_ptr()
    c = work.get("other", (2, 10), torch.float32, "cpu")
    assert c.data_ptr() != a.data_ptr()
    d = work.get("rows", (8, 10), torch.float32, "cpu")           # larger: a new buffer
    assert d.shape == (8, 10) and d.numel() == 80
    e = work.get("rows", (8, 10), torch.float64, "cpu")           # another dtype: a new buffer
    assert e.dtype == torch.float64
    work.clear()
    assert work.get("rows", (1,), torch.float32, "cpu").numel() == 1


def _docs(V, n_docs=12, oov=False, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 30, size=n_docs)
    ids = rng.integers(-1 if oov else 0, V, size=int(lengths.sum()))
    return RaggedIds(ids, np.concatenate([[0], np.cumsum(lengths)]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalization", ["none", "row"])
def test_symmetric_scorer_matches_the_library_with_reused_buffers_across_batches(normalization, device):
    """Batches small enough that every buffer is reused several times (and shrinks and grows),
    scored with and without the temperature-fit cache: the log-probabilities and ranks of the
    library's numpy path (documents without OOV tokens, where the two layouts agree)."""
    V = 40
    S = _random_csr(V, density=0.3, seed=2, symmetric=True)
    docs = _docs(V)
    model = Symmetric(S, normalization, vocab_size=V, device=torch.device(device), batch_positions=40)
    ref = ProjectionPredictor(normalization=normalization).fit(S)
    _, want, want_rank = evaluate_next_token(ref, docs, vocab_size=V, temperature=0.7, return_scores=True)
    tf32 = torch.backends.cuda.matmul.allow_tf32        # the trainer turns TF32 on for training; not here
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _check_scores(model, docs, V, want, want_rank)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.parametrize("device", DEVICES)
def test_the_torch_scoring_branch_takes_huge_evidence_at_a_small_temperature(device):
    """The branch for an offset (or a GPU) divided the evidence by τ before log_softmax: float32
    evidence near 1e30 over τ = 1e-10 overflowed to inf and every log p was NaN. Shifted by the
    row max first, the target gets log p = 0 when it scores highest and a huge negative one (or
    -inf) otherwise."""
    V = 40
    S = _random_csr(V, density=0.3, seed=2, symmetric=True)
    S.data *= np.float32(1e30)
    docs = _docs(V)
    model = Symmetric(S, "row", vocab_size=V, device=torch.device(device), batch_positions=40)
    model.offset = torch.zeros(V, device=device)         # the torch branch, on the CPU too
    logp, rank = model.score_next_tokens(docs, temperature=1e-10)
    scored = rank >= 0
    assert scored.sum() > 100 and not np.isnan(logp[scored]).any()
    np.testing.assert_array_equal(logp[scored] == 0, rank[scored] == 0)
    assert np.all((logp[scored] == 0) | (logp[scored] < -1e30))


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_scorers_refuse_a_temperature_that_float32_cannot_hold(device):
    """The torch branch divided the float32 evidence by τ: τ = 1e-46 is 0 in float32, and every
    log p was NaN ("the model produced NaN scores"); the CPU kernel's scale 1 / 1e-310 was inf.
    A τ below float32's smallest normal is refused naming the dtype; the smallest normal works."""
    V = 40
    S = _random_csr(V, density=0.3, seed=2, symmetric=True)
    docs = _docs(V)
    tiny = torch.finfo(torch.float32).tiny
    for offset in (None, torch.zeros(V, device=device)):
        model = Symmetric(S, "row", vocab_size=V, device=torch.device(device), batch_positions=40)
        model.offset = offset
        for tau in (1e-46, 1e-310):
            with pytest.raises(ValueError, match=rf"temperature={tau!r} is too small for torch\.float32 scores.*"
                                                 rf"temperature >= {tiny!r}"):
                model.score_next_tokens(docs, temperature=tau)
        logp, rank = model.score_next_tokens(docs, temperature=tiny)
        assert not np.isnan(logp[rank >= 0]).any()


def _check_scores(model, docs, V, want, want_rank):
    for caching in (False, True):
        with model.caching() if caching else contextlib.nullcontext():
            _, got, rank = evaluate_next_token(model, docs, vocab_size=V, temperature=0.7, return_scores=True)
            _, again, _ = evaluate_next_token(model, docs, vocab_size=V, temperature=0.7, return_scores=True)
        scored = ~np.isnan(want)
        assert scored.sum() > 100 and np.array_equal(scored, ~np.isnan(got))
        np.testing.assert_allclose(got[scored], want[scored], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(again, got)
        assert np.array_equal(rank[scored], want_rank[scored])


def test_a_non_canonical_matrix_scores_as_its_canonical_form():
    """Unsorted and repeated column indices (as sums and products of sparse matrices leave them):
    the scorers' binary search over the keys needs them sorted, so they are canonicalised."""
    V = 40
    S = _random_csr(V, density=0.3, seed=3, symmetric=True)
    rng = np.random.default_rng(0)
    indices, data = [], []
    for r in range(V):                   # each row's entries twice, halved, in a shuffled order
        lo, hi = S.indptr[r], S.indptr[r + 1]
        order = rng.permutation(2 * (hi - lo))
        indices.append(np.tile(S.indices[lo:hi], 2)[order])
        data.append(np.tile(S.data[lo:hi] / 2, 2)[order])
    messy = sp.csr_array((np.concatenate(data), np.concatenate(indices), np.concatenate([[0], 2 * S.indptr[1:]])),
                         shape=S.shape)
    assert not messy.has_sorted_indices and not messy.has_canonical_format
    docs = _docs(V, oov=True, seed=1)
    scores = [evaluate_next_token(Symmetric(M, "row", vocab_size=V, device=torch.device("cpu")), docs, vocab_size=V,
                                  return_scores=True)[1] for M in (S, messy)]
    np.testing.assert_allclose(scores[1], scores[0], rtol=0, atol=1e-6)
    assert not messy.has_canonical_format                                # the caller's matrix is untouched


def test_a_scorer_is_freed_without_the_cycle_collector_after_caching():
    """Its buffers (hundreds of MB each at IMDB size) go with the last reference: the compare's
    projection stage deletes each row's model before building the next one."""
    import gc
    import weakref
    V = 30
    model = Symmetric(_random_csr(V, symmetric=True), "row", vocab_size=V, device=torch.device("cpu"))
    with model.caching():
        evaluate_next_token(model, _docs(V), vocab_size=V)
    evaluate_next_token(model, _docs(V), vocab_size=V)
    ref = weakref.ref(model)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("with_prior", [False, True])
def test_the_accelerator_scoring_branch_agrees_with_the_numba_one(with_prior):
    """CPU tensors are scored by numba now; the torch branch, kept for tensors on a GPU, is run
    here on the CPU so that it stays checked: the same log p and ranks, targets < 0 skipped."""
    from distattn.projection.nexttoken import _score_block, _score_block_torch
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 300)).astype(np.float32)
    x[5, :] = 0.0                                               # a uniform row: ties count against the target
    targets = rng.integers(0, 300, size=64)
    targets[[3, 9]] = -1
    prior = rng.dirichlet(np.ones(300)) if with_prior else None
    want = _score_block(x, targets, 0.8, prior, 0.1 if with_prior else 0.0)
    got_cpu_tensor = _score_block(torch.from_numpy(x), targets, 0.8, prior, 0.1 if with_prior else 0.0)
    got_torch = _score_block_torch(torch.from_numpy(x), targets, 0.8, prior, 0.1 if with_prior else 0.0)
    for logp, rank in (got_cpu_tensor, got_torch):
        assert np.array_equal(np.isnan(logp), targets < 0) and np.array_equal(rank[targets < 0], [-1, -1])
        ok = targets >= 0
        np.testing.assert_allclose(logp[ok], want[0][ok], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(rank, want[1])
    if not with_prior:
        assert want[1][5] == 299


@pytest.mark.parametrize("make, message", [
    (lambda S: S[:, :-1], "S must be square"),
    (lambda S: sp.csr_array(sp.random(30, 30, density=0.3, random_state=0)), "vocab_size=40"),
    (lambda S: sp.csr_array((np.array([np.nan]), (np.array([1]), np.array([2]))), shape=S.shape), "NaN or inf"),
])
def test_the_scorers_check_their_matrix_at_the_boundary(make, message):
    """As the library's functions do: a bad S is named, not scored into NaN or a wrong lookup."""
    from distattn.projection.device_scorers import Asymmetric, Positional
    V = 40
    bad = make(_random_csr(V, symmetric=True))
    pi = sp.csr_array(np.full((8, V), 1.0 / V))
    for build in (lambda: Symmetric(bad, "row", vocab_size=V, device="cpu"),
                  lambda: Positional(bad, pi, 1.0, vocab_size=V, device="cpu"),
                  lambda: Asymmetric(np.ones((V, 2)), np.ones((V, 2)), vocab_size=V, device="cpu", S=bad)):
        with pytest.raises(ValueError, match=message):
            build()


@pytest.mark.parametrize("W_Q, W_K, message", [
    (np.ones((39, 2)), np.ones((39, 2)), r"vocab_size=40, r\); got \(39, 2\)"),
    (np.ones((40, 2)), np.ones((40, 3)), r"got \(40, 2\) and \(40, 3\)"),
    (np.ones(40), np.ones(40), r"got \(40,\)"),
    (np.full((40, 2), np.nan), np.ones((40, 2)), "W_Q must be finite"),
])
def test_the_asymmetric_scorer_checks_its_factors_at_the_boundary(W_Q, W_K, message):
    """W_Q and W_K of the wrong shape surfaced later as a torch error inside the scoring (or, with
    fewer rows than the vocabulary, as an index error only for documents holding the missing ids)."""
    from distattn.projection.device_scorers import Asymmetric
    with pytest.raises(ValueError, match=message):
        Asymmetric(W_Q, W_K, vocab_size=40, device="cpu")


@pytest.mark.parametrize("vocab_size", [5, 9])
def test_the_multihead_scorer_refuses_heads_of_another_vocabulary(vocab_size):
    # the logits were as wide as the heads' vocabulary (7 words), whatever vocab_size said
    from distattn.corpus.paper import load_paper_corpus
    from distattn.projection import svd_heads
    from distattn.projection.device_scorers import MultiHead
    heads = svd_heads(load_paper_corpus().cooc, 2, 2)
    with pytest.raises(ValueError, match=rf"the heads cover a vocabulary of 7 words, not vocab_size={vocab_size}"):
        MultiHead(heads, "softmax", vocab_size=vocab_size, device="cpu")


def test_the_positional_scorer_names_a_document_longer_than_its_distributions():
    """A document reaching past the positions π covers fell over in an IndexError from inside the
    index arithmetic (a device-side assert on CUDA); it is refused with the lengths, as
    CorpusPositional refuses it, and documents within the distributions still score."""
    from distattn.projection import positional_distributions
    from distattn.projection.device_scorers import Positional
    V = 10
    pi = positional_distributions([np.arange(5), np.arange(3)], V, 5)
    model = Positional(_random_csr(V, density=0.5, seed=4, symmetric=True), pi, 1.0, vocab_size=V, device="cpu")
    report = evaluate_next_token(model, [np.arange(5), np.array([1, 2])], vocab_size=V)
    assert report.n_predictions == 5 and np.isfinite(report.mean_nll)
    with pytest.raises(ValueError, match=r"position 6 .*cover 5 positions.*max_length >= 7"):
        evaluate_next_token(model, [np.arange(3), np.arange(7)], vocab_size=V)


def test_the_positional_scorer_takes_dense_distributions_as_corpus_positional_does():
    """π as a dense array (CorpusPositional and corpus_position_matrix take "sparse or array-like")
    failed with AttributeError: 'numpy.ndarray' object has no attribute 'toarray'."""
    from distattn.projection import positional_distributions
    from distattn.projection.device_scorers import Positional
    V = 10
    S = _random_csr(V, density=0.5, seed=4, symmetric=True)
    pi = positional_distributions([np.arange(6), np.arange(3)], V, 6)
    docs = [np.arange(6), np.array([1, 2, 9])]
    want = evaluate_next_token(Positional(S, pi, 0.5, vocab_size=V, device="cpu"), docs, vocab_size=V,
                               return_scores=True)[1]
    for dense in (pi.toarray(), pi.toarray().tolist()):
        got = evaluate_next_token(Positional(S, dense, 0.5, vocab_size=V, device="cpu"), docs, vocab_size=V,
                                  return_scores=True)[1]
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"distributions must have shape \(max_length, vocab_size=10\)"):
        Positional(S, pi.toarray()[:, :9], 0.5, vocab_size=V, device="cpu")


def test_the_positional_scorer_leaves_the_callers_warning_filters_alone():
    """Building a Positional scorer added a process-wide ``ignore`` filter for every warning whose
    message mentions "sparse" (meant for torch's beta notice of its sparse CSR tensors): the user's
    program, and every later test of the session, lost such warnings of any library for good."""
    import warnings

    from distattn.projection import positional_distributions
    from distattn.projection.device_scorers import Positional
    V = 10
    pi = positional_distributions([np.arange(5), np.arange(3)], V, 5)
    before = list(warnings.filters)
    Positional(_random_csr(V, density=0.5, seed=4, symmetric=True), pi, 1.0, vocab_size=V, device="cpu")
    assert warnings.filters == before                 # once: + ('ignore', '.*[Ss]parse.*', Warning) in front
