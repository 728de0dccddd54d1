"""distattn.models: the seed classifier, the LMs, attention capture, positions, circuits, bad input."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import distattn.models.attention as attention_module
from distattn.models import (AttentionOnlyConfig, ClassifierConfig, FactoredMatrix, LMConfig, ProjectionMatchedLM,
                             TransformerClassifier, TransformerLM, build_model, config_from_dict, hook_points,
                             load_embeddings, ov_circuit, qk_circuit, seed_classifier_config,
                             sinusoidal_table)
from distattn.models.positional import POSITIONAL

V = 50


def tiny_classifier(**kw):
    base = dict(vocab_size=V, d_model=16, d_ff=32, head_hidden=8, max_len=12, n_heads=4)
    base.update(kw)
    return TransformerClassifier(seed_classifier_config(**base)).eval()


def tiny_lm(**kw):
    base = dict(vocab_size=V, d_model=16, n_heads=4, n_layers=2, max_len=12)
    base.update(kw)
    return TransformerLM(LMConfig(**base)).eval()


def batch(B=3, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    if B > 1:
        mask[1, 6:] = False
    ids[~mask] = 0
    return ids, mask


# -- the seed architecture ----------------------------------------------------------------------

def test_seed_classifier_matches_the_paper():
    cfg = seed_classifier_config(vocab_size=30_000)
    m = TransformerClassifier(cfg)
    assert (cfg.d_model, cfg.max_len, cfg.n_layers, cfg.n_heads, cfg.ff_width) == (256, 256, 2, 4, 1024)
    assert cfg.norm == "post" and cfg.activation == "relu" and cfg.positional == "learned" and cfg.dropout == 0.1
    assert m.trunk.tok_emb.weight.shape == (30_000, 256) and m.trunk.tok_emb.padding_idx == 0
    assert m.trunk.pos.table.shape == (256, 256)
    drops = [mod.p for mod in m.head if isinstance(mod, torch.nn.Dropout)]
    lins = [(mod.in_features, mod.out_features) for mod in m.head if isinstance(mod, torch.nn.Linear)]
    assert drops == [0.2, 0.2] and lins == [(256, 128), (128, 1)]
    assert len(m.trunk.blocks) == 2 and m.trunk.blocks[0].attn.n_heads == 4
    # PyTorch default N(0, 1) embeddings, as nn.Embedding in the seed's code; padding row zero
    assert 0.9 < m.trunk.tok_emb.weight[1:].std().item() < 1.1
    assert torch.count_nonzero(m.trunk.tok_emb.weight[0]) == 0


def test_seed_classifier_drops_out_where_the_seeds_code_does_only():
    """The seed's block is LayerNorm(X + Drop(MHA(X))), LayerNorm(X + Drop(FFN(X))) with a dropout
    inside the FFN, and nn.MultiheadAttention's own dropout left at its default 0.0; E + P is not
    dropped. The config once dropped the embeddings and the attention pattern too (p = 0.1)."""
    cfg = seed_classifier_config(vocab_size=50, d_model=32)
    assert (cfg.dropout, cfg.attn_dropout, cfg.embed_dropout) == (0.1, 0.0, 0.0)
    m = TransformerClassifier(cfg).train()
    seen = {}
    m.trunk.blocks[0].register_forward_pre_hook(lambda mod, args: seen.setdefault("block_in", []).append(args[0]))
    m.trunk.blocks[0].attn.register_forward_hook(lambda mod, args, out: seen.setdefault("attn", []).append(out))
    ids, mask = torch.randint(2, 50, (3, 9)), torch.ones(3, 9, dtype=torch.bool)
    outs = [m(ids, mask) for _ in range(2)]
    for name in ("block_in", "attn"):                      # deterministic in training: no dropout there
        assert torch.equal(seen[name][0], seen[name][1]), name
    assert not torch.equal(outs[0], outs[1])               # the dropouts the seed has still act
    drops = sorted(mod.p for mod in m.trunk.modules() if isinstance(mod, torch.nn.Dropout))
    assert drops == [0.0] + [0.1] * 4                      # embeddings; per block: FFN inside, residuals
    plain = TransformerClassifier(seed_classifier_config(vocab_size=50, d_model=32, attn_dropout=None,
                                                         embed_dropout=None))
    assert plain.trunk.drop.p == 0.1 and plain.trunk.blocks[0].attn.dropout == 0.1    # None: dropout
    with pytest.raises(ValueError, match="embed_dropout"):
        seed_classifier_config(embed_dropout=1.5).validate()


def test_seed_classifier_widths_follow_d_model_unless_given():
    """FFN 4d and head d/2 at any d (once fixed at 1024 and 128 whatever d_model was)."""
    small = TransformerClassifier(seed_classifier_config(vocab_size=50, d_model=64))
    assert small.config.ff_width == 256
    assert [(m.in_features, m.out_features) for m in small.head if isinstance(m, torch.nn.Linear)] == [(64, 32), (32, 1)]
    given = seed_classifier_config(vocab_size=50, d_model=64, d_ff=100, head_hidden=7)
    assert (given.ff_width, given.head_hidden) == (100, 7)
    with pytest.raises(ValueError, match="d_model"):
        seed_classifier_config(d_model=0)


def test_classifier_pools_only_real_tokens():
    m = tiny_classifier()
    ids, mask = batch()
    out = m(ids, mask)
    assert out.shape == (3,)
    # changing padded positions changes nothing
    ids2 = ids.clone()
    ids2[1, 6:] = 7
    assert torch.allclose(m(ids2, mask), out, atol=1e-6)
    # an all-padding row stays finite
    mask[2] = False
    assert torch.isfinite(m(ids, mask)).all()
    p = m.predict_proba(ids, mask)
    assert ((p > 0) & (p < 1)).all()


def test_predict_proba_runs_in_evaluation_mode_and_restores_the_mode():
    """A model left in training mode (as after model.train()) gave predict_proba a fresh dropout draw
    at each call: two calls on the same batch disagreed."""
    m = tiny_classifier(dropout=0.5, head_dropout=0.5)
    ids, mask = batch()
    want = m.predict_proba(ids, mask)               # eval mode (tiny_classifier returns it in eval)
    m.train()
    torch.manual_seed(0)
    got = m.predict_proba(ids, mask)
    assert torch.equal(got, want) and m.training



def test_predict_proba_of_a_double_model_is_float64():
    """predict_proba cast the logit to float32, so a .double() classifier's probabilities were rounded (about
    1e-8 off the float64 sigmoid); a float32 / bf16 model still gets float32 probabilities as before."""
    m = tiny_classifier()
    ids, mask = batch()
    with torch.no_grad():
        logit32 = m(ids, mask)
    assert torch.equal(m.predict_proba(ids, mask), torch.sigmoid(logit32.float()))
    assert m.to(torch.bfloat16).predict_proba(ids, mask).dtype == torch.float32
    m = m.double()
    with torch.no_grad():
        logit = m(ids, mask)
    want = torch.tensor([1 / (1 + math.exp(-z)) for z in logit.tolist()], dtype=torch.float64)
    got = m.predict_proba(ids, mask)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=0, atol=1e-12)

# -- capture and the two attention paths ----------------------------------------------------------

@pytest.mark.parametrize("positional", POSITIONAL)
@pytest.mark.parametrize("causal", [False, True])
def test_capture_path_equals_fast_path(positional, causal):
    kw = dict(positional=positional, causal=causal)
    torch.manual_seed(0)
    m = tiny_classifier(**kw)
    ids, mask = batch()
    fast = m(ids, mask)
    slow, cache = m(ids, mask, capture=True)
    assert torch.allclose(fast, slow, atol=1e-5)
    for layer in range(2):
        pattern = cache[f"trunk.blocks.{layer}.attn.hook_pattern"]
        scores = cache[f"trunk.blocks.{layer}.attn.hook_scores"]
        assert pattern.shape == scores.shape == (3, 4, 10, 10)
        assert torch.allclose(pattern.sum(-1), torch.ones(3, 4, 10), atol=1e-5)
        if causal:
            assert torch.all(pattern[..., torch.ones(10, 10, dtype=torch.bool).triu(1)] == 0)
        else:
            assert torch.all(pattern[1, :, :, 6:] == 0)          # padded keys get no weight
            assert torch.all(torch.isneginf(scores[1, :, :, 6:]))


@pytest.mark.parametrize("positional", ["learned", "relative"])
def test_capture_under_bf16_autocast_is_float32(positional):
    # under autocast the captured scores and pattern were rounded to bf16 (rows summing to 1 ± 1e-2);
    # they are computed in float32 from the (bf16) queries and keys instead
    torch.manual_seed(0)
    m = tiny_classifier(positional=positional).eval()
    ids, mask = batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, cache = m(ids, mask, capture=True)
        fast = m(ids, mask)
    assert torch.allclose(out.float(), fast.float(), atol=5e-2)
    for layer in range(2):
        pattern = cache[f"trunk.blocks.{layer}.attn.hook_pattern"]
        scores = cache[f"trunk.blocks.{layer}.attn.hook_scores"]
        assert pattern.dtype == scores.dtype == torch.float32
        assert torch.allclose(pattern.sum(-1), torch.ones(3, 4, 10), atol=1e-6)
        np.testing.assert_allclose(pattern.numpy(), torch.softmax(scores, -1).numpy(), atol=1e-6)


def test_relative_term_of_the_scores_is_float32_under_bf16_autocast():
    # the q_i · r_{i-j} term was computed by a bf16 matmul (0.01 off on scores of about 4), only the
    # q_i · k_j term in float32
    torch.manual_seed(0)
    m = attention_module.MultiHeadSelfAttention(32, 2, positional="relative", max_len=16)
    torch.nn.init.normal_(m.relative.vectors, std=1.0)
    q, k = torch.randn(1, 2, 16, 16).bfloat16(), torch.randn(1, 2, 16, 16).bfloat16()   # as autocast makes them
    want = m.pair_scores(q.float(), k.float())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = m.pair_scores(q, k)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-5)


def count_fused_calls(monkeypatch) -> list:
    """A list that gets one entry per call of the fused F.scaled_dot_product_attention."""
    calls = []
    real = attention_module.F.scaled_dot_product_attention

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", counting)
    return calls


def test_unused_capture_costs_nothing(monkeypatch):
    calls = count_fused_calls(monkeypatch)
    m = tiny_lm()
    ids, _ = batch()
    m(ids)
    assert len(calls) == 2                    # the fused kernel, once per layer
    calls.clear()
    _, cache = m(ids, capture=True)
    assert calls == [] and len(cache) > 0     # materialised only when asked
    calls.clear()
    m(ids)                                    # hooks are removed afterwards
    assert len(calls) == 2
    assert not any(p.active for p in hook_points(m).values())


def test_named_hook_can_edit_pattern():
    m = tiny_lm(n_layers=1)
    ids, _ = batch()
    base = m(ids)
    point = hook_points(m)["trunk.blocks.0.attn.hook_pattern"]
    h = point.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
    try:
        edited = m(ids)
    finally:
        h.remove()
    assert not torch.allclose(base, edited)
    assert torch.allclose(m(ids), base, atol=1e-6)


@pytest.mark.parametrize("positional", ["learned", "rope", "relative"])
def test_hook_q_k_v_capture_each_heads_queries_keys_values(positional):
    # hook_q / hook_k / hook_v hold x W_Q, x W_K (rotated under RoPE) and x W_V per head, (B, H, T, d_k)
    from distattn.models import capture_hooks
    torch.manual_seed(2)
    m = tiny_lm(positional=positional, n_layers=1, bias=True)
    attn = m.trunk.blocks[0].attn
    torch.nn.init.normal_(attn.qkv.bias)
    ids, _ = batch(B=2, T=7)
    inputs = []
    h = attn.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].detach()))
    names = [f"trunk.blocks.0.attn.hook_{n}" for n in "qkv"]
    try:
        with torch.no_grad(), capture_hooks(m, names) as cache:
            m(ids)
    finally:
        h.remove()
    (x,) = inputs
    W = attn.head_weights()
    bq, bk, bv = (b.detach().view(4, 1, 4) for b in attn.qkv.bias.split(16))      # (H, 1, d_k)
    q = torch.einsum("btd,hdk->bhtk", x, W["W_Q"]) + bq
    k = torch.einsum("btd,hdk->bhtk", x, W["W_K"]) + bk
    v = torch.einsum("btd,hdk->bhtk", x, W["W_V"]) + bv
    if positional == "rope":
        q, k = attn.rotary(q), attn.rotary(k)
    for name, want in zip(names, (q, k, v)):
        assert cache[name].shape == (2, 4, 7, 4)
        torch.testing.assert_close(cache[name], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "relative"])
def test_hooking_q_k_v_keeps_the_fused_path_and_the_output(monkeypatch, positional):
    calls = count_fused_calls(monkeypatch)
    m = tiny_lm(positional=positional)
    ids, _ = batch()
    with torch.no_grad():
        base = m(ids)
        calls.clear()
        points = hook_points(m)
        seen = []
        handles = [points[f"trunk.blocks.{layer}.attn.hook_{n}"].register_forward_hook(
            lambda mod, inp, out: seen.append(out.shape)) for layer in range(2) for n in "qkv"]
        try:
            hooked = m(ids)
        finally:
            for h in handles:
                h.remove()
    assert len(calls) == 2 and len(seen) == 6      # the fused kernel, once per layer: nothing materialised
    assert torch.equal(hooked, base)


@pytest.mark.parametrize("positional", ["none", "rope", "relative"])
def test_pair_scores_are_hook_scores_where_the_causal_mask_allows(positional):
    # pair_scores(q, k) gives every pair's score; hook_scores is the same below the diagonal, -inf above it
    torch.manual_seed(3)
    m = tiny_lm(positional=positional, n_layers=1)
    attn = m.trunk.blocks[0].attn
    if attn.relative is not None:
        torch.nn.init.normal_(attn.relative.vectors, std=1.0)
    ids, _ = batch(B=2, T=6)
    with torch.no_grad():
        _, cache = m(ids, capture=True)
        pairs = attn.pair_scores(cache["trunk.blocks.0.attn.hook_q"], cache["trunk.blocks.0.attn.hook_k"])
    scores = cache["trunk.blocks.0.attn.hook_scores"]
    below = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(pairs[..., below], scores[..., below])
    assert torch.isinf(scores[..., ~below]).all() and torch.isfinite(pairs).all()


# -- positions ------------------------------------------------------------------------------------

def test_sinusoidal_table_follows_the_formula():
    t = sinusoidal_table(7, 6)
    p, i = 5, 1
    assert math.isclose(t[p, 2 * i].item(), math.sin(p / 10000 ** (2 * i / 6)), rel_tol=1e-6)
    assert math.isclose(t[p, 2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / 6)), rel_tol=1e-6)


def test_relative_scores_are_q_dot_k_plus_r():
    torch.manual_seed(1)
    m = tiny_lm(positional="relative", n_layers=1, n_heads=2)
    attn = m.trunk.blocks[0].attn
    torch.nn.init.normal_(attn.relative.vectors, std=1.0)
    ids, _ = batch(B=1, T=5)
    _, cache = m(ids, capture=True)
    x = m.trunk.blocks[0].ln1(m.trunk.tok_emb(ids))
    q, k, _ = attn.qkv(x).view(1, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    r = attn.relative.vectors
    K = attn.relative.max_distance
    i, j, h = 4, 1, 1
    expected = (q[0, h, i] @ (k[0, h, j] + r[i - j + K])).item() / math.sqrt(8)
    assert math.isclose(cache["trunk.blocks.0.attn.hook_scores"][0, h, i, j].item(), expected, rel_tol=1e-4)


def test_relative_distances_clipped_to_zero_share_one_vector():
    # rel_max_distance=0 is a valid clip (one vector r_0 for every pair); it was read as "unset" and
    # gave max_len - 1, every distance its own vector
    from distattn.models import MultiHeadSelfAttention, capture_hooks
    torch.manual_seed(4)
    clipped = MultiHeadSelfAttention(8, 2, positional="relative", max_len=10, rel_max_distance=0)
    assert clipped.relative.max_distance == 0 and clipped.relative.vectors.shape == (1, 4)
    assert MultiHeadSelfAttention(8, 2, positional="relative", max_len=10).relative.max_distance == 9
    torch.nn.init.normal_(clipped.relative.vectors, std=1.0)
    plain = MultiHeadSelfAttention(8, 2, max_len=10)
    plain.load_state_dict({k: v for k, v in clipped.state_dict().items() if not k.startswith("relative.")})
    x = torch.randn(2, 6, 8)
    with capture_hooks(clipped, "hook_pattern") as a, capture_hooks(plain, "hook_pattern") as b:
        clipped(x), plain(x)
    # q_i . r_0 is the same for every key j: the softmax removes it
    assert torch.allclose(a["hook_pattern"], b["hook_pattern"], atol=1e-6)
    with pytest.raises(ValueError, match="rel_max_distance"):
        MultiHeadSelfAttention(8, 2, positional="relative", max_len=10, rel_max_distance=-1)


def test_rope_scores_depend_on_offsets_only():
    torch.manual_seed(2)
    m = tiny_lm(positional="rope", n_layers=1)
    ids = torch.tensor([[5, 9, 5, 9, 5, 9]])
    _, cache = m(ids, capture=True)
    s = cache["trunk.blocks.0.attn.hook_scores"][0]
    # (query 9 at 3, key 5 at 2) and (query 9 at 5, key 5 at 4): same tokens, same offset
    assert torch.allclose(s[:, 3, 2], s[:, 5, 4], atol=1e-5)
    assert not torch.allclose(s[:, 3, 2], s[:, 5, 2], atol=1e-3)


@pytest.mark.parametrize("positional", ["sinusoidal", "rope"])
def test_fixed_position_tables_survive_a_dtype_round_trip(positional):
    # the tables are non-persistent buffers: .bfloat16().float() left them bf16-rounded for good, so the
    # model computed differently from a fresh one with the same (state_dict) weights
    torch.manual_seed(4)
    m = tiny_lm(positional=positional, n_layers=1).bfloat16().float()
    fresh = tiny_lm(positional=positional, n_layers=1)
    fresh.load_state_dict(m.state_dict())
    ids, _ = batch(B=2, T=7)
    assert torch.equal(m(ids), fresh(ids))


# -- the projection-matched LM and circuits ----------------------------------------------------

def test_projection_matched_logits_are_pattern_times_ov_rows():
    torch.manual_seed(3)
    m = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=V, d_model=12, n_heads=3, max_len=12)).eval()
    ids, _ = batch(B=2, T=7)
    logits, cache = m(ids, capture=True)
    pattern = cache["attn.hook_pattern"]                      # (B, H, T, T)
    ov = ov_circuit(m, 0).to_dense()                          # (H, V, V)
    # E = M (QS): logits[t] = sum_h sum_j A_h[t, j] OV_h[x_j]
    expected = torch.einsum("bhtj,bhjv->btv", pattern, ov[:, ids].permute(1, 0, 2, 3))
    assert torch.allclose(logits, expected, atol=1e-4)
    assert m(ids).shape == (2, 7, V)


def test_qk_circuit_gives_the_scores():
    torch.manual_seed(4)
    m = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=V, d_model=12, n_heads=2, max_len=12)).eval()
    ids, _ = batch(B=1, T=6)
    _, cache = m(ids, capture=True)
    qk = qk_circuit(m, 0)
    assert qk.shape == (2, V, V) and qk.inner_dim == 6
    dense = qk.to_dense() / math.sqrt(6)
    s = cache["attn.hook_scores"][0]
    t, j = 5, 2
    assert torch.allclose(s[:, t, j], dense[:, ids[0, t], ids[0, j]], atol=1e-5)


def test_factored_matrix_svd_and_eigenvalues():
    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(2, 40, 5, generator=g), torch.randn(2, 5, 40, generator=g)
    f = FactoredMatrix(A, B)
    dense = A.double() @ B.double()
    assert torch.allclose(f.singular_values, torch.linalg.svdvals(dense)[:, :5], atol=1e-8)
    u, s, vh = f.svd()
    assert torch.allclose(u @ torch.diag_embed(s) @ vh, dense, atol=1e-8)
    ev = f[0].eigenvalues()
    dense_ev = torch.linalg.eigvals(dense[0])
    top = dense_ev[dense_ev.abs().argsort(descending=True)][:5]
    assert torch.allclose(torch.sort(ev.abs()).values, torch.sort(top.abs()).values, atol=1e-6)
    assert torch.allclose(f.rows([3, 7]).double(), dense[:, [3, 7]], atol=1e-4)
    with pytest.raises(ValueError, match="matching r"):
        FactoredMatrix(A, B.transpose(-2, -1)[:, :4])


def test_factored_matrix_rows_of_one_id_or_an_id_grid_stay_per_head():
    g = torch.Generator().manual_seed(6)
    A, B = torch.randn(3, 9, 4, generator=g), torch.randn(3, 4, 7, generator=g)
    f, dense = FactoredMatrix(A, B), A @ B
    assert f.rows(5).shape == (3, 7)                      # was (3, 3, 7): head i's row with head h's B
    assert torch.allclose(f.rows(5), dense[:, 5], atol=1e-6)
    ids = torch.tensor([[1, 2, 8], [0, 5, 5]])
    assert torch.allclose(f.rows(ids), dense[:, ids], atol=1e-6)
    assert torch.allclose(f.rows(slice(2, 6)), dense[:, 2:6], atol=1e-6)
    assert torch.allclose(f[1].rows(ids), dense[1][ids], atol=1e-6)


def test_factored_matrix_times_a_vector_is_the_dense_product_per_head():
    g = torch.Generator().manual_seed(7)
    v = torch.randn(7, generator=g)
    for heads in (3, 4):                                  # 4 = the inner dim: a silent (H, m, r) result
        A, B = torch.randn(heads, 9, 4, generator=g), torch.randn(heads, 4, 7, generator=g)
        f, dense = FactoredMatrix(A, B), A @ B
        assert torch.allclose(f @ v, dense @ v, atol=1e-5)
        assert torch.allclose(f[0] @ v, dense[0] @ v, atol=1e-5)


def test_lm_circuits_and_flops():
    m = tiny_lm()
    assert ov_circuit(m, 1).shape == (4, V, V)
    assert qk_circuit(m, -1).shape == (4, V, V)
    with pytest.raises(ValueError, match="layer must be"):
        qk_circuit(m, 2)
    assert ov_circuit(tiny_classifier(), 0).shape == (4, V, 16)   # no unembedding: into the residual stream
    # counted by hand from the architecture: bias-free linears, LayerNorm weights only, tied unembedding
    d, L = 16, 2
    assert m.lm_head.weight is m.trunk.tok_emb.weight
    per_block = 4 * d * d + 2 * 4 * d * d + 2 * d                # W_Q, W_K, W_V, W_O; FFN d -> 4d -> d; 2 LayerNorms
    n = V * d + L * per_block + d                                 # + the final LayerNorm; positions excluded
    assert n == 7024 and m.n_params() == n                        # the tied matrix counted once
    assert m.n_params(non_embedding=False) == n + 12 * d          # the learned position table (max_len 12)
    assert m.flops_per_token(12) == 6 * n + 12 * L * d * 12       # PaLM: 6N + 12·L·d·T
    untied = tiny_lm(tie_weights=False)                           # the lookup table drops out, the unembedding stays
    assert untied.n_params() == n and untied.n_params(non_embedding=False) == n + V * d + 12 * d


# -- embeddings, pretrained trunks, configs ------------------------------------------------------

def test_load_embeddings_from_svd_vectors():
    m = tiny_classifier()
    vec = np.random.default_rng(0).normal(size=(V, 16))
    vec[:2] = 0                                      # specials, as SVDEmbeddings leaves them
    before = m.trunk.tok_emb.weight[1].clone()
    load_embeddings(m, vec)
    w = m.trunk.tok_emb.weight.detach()
    ratio = w[5] / torch.as_tensor(vec[5], dtype=torch.float32)
    assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4)     # same direction, rescaled
    assert torch.equal(w[1], before) and torch.count_nonzero(w[0]) == 0
    with pytest.raises(ValueError, match=r"\(50, 8\).*\(50, 16\)"):
        load_embeddings(m, vec[:, :8])


def test_classifier_takes_a_pretrained_lm_trunk():
    from distattn.train.recipes import classifier_from_lm
    lm = tiny_lm()
    clf = TransformerClassifier(classifier_from_lm(lm.config, max_len=20))
    clf.load_trunk(lm)
    assert torch.equal(clf.trunk.blocks[1].attn.qkv.weight, lm.trunk.blocks[1].attn.qkv.weight)
    assert torch.equal(clf.trunk.pos.table[:12], lm.trunk.pos.table)
    other = TransformerClassifier(classifier_from_lm(LMConfig(vocab_size=V, d_model=32, n_heads=4, n_layers=2,
                                                              max_len=12)))
    with pytest.raises(ValueError, match="d_model"):
        other.load_trunk(lm)


def test_load_trunk_ignores_the_ffn_width_of_attention_only_trunks():
    """Two attention-only trunks (mlp=False) have no FFN, so d_ff (and the activation) shape nothing: a
    pretrained one of another d_ff was refused. A trunk with an MLP still refuses one without."""
    from distattn.train.recipes import classifier_from_lm
    lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=2, max_len=12, mlp=False, d_ff=24,
                                activation="gelu"))
    clf = TransformerClassifier(classifier_from_lm(lm.config, max_len=12, d_ff=40, activation="relu"))
    clf.load_trunk(lm)
    assert torch.equal(clf.trunk.blocks[1].attn.qkv.weight, lm.trunk.blocks[1].attn.qkv.weight)
    with_mlp = TransformerClassifier(classifier_from_lm(lm.config, max_len=12, mlp=True, d_ff=24))
    with pytest.raises(ValueError, match="'mlp': \\(False, True\\)"):
        with_mlp.load_trunk(lm)
    with_wide_mlp = TransformerClassifier(classifier_from_lm(lm.config, max_len=12, mlp=True, d_ff=40))
    with pytest.raises(ValueError, match="'d_ff': \\(24, 40\\).*'mlp': \\(False, True\\)"):
        with_wide_mlp.load_trunk(lm)


def test_config_round_trip_and_build():
    cfg = seed_classifier_config(vocab_size=V, d_model=8, n_heads=2, max_len=4)
    again = config_from_dict(cfg.to_dict())
    assert again == cfg and isinstance(again, ClassifierConfig)
    assert isinstance(build_model(cfg.to_dict()), TransformerClassifier)
    assert isinstance(build_model(AttentionOnlyConfig(vocab_size=V, d_model=4)), ProjectionMatchedLM)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["classifier", "lm", "mlm", "attention_only"])
def test_save_and_load_model_give_the_same_model_in_its_dtype(kind, dtype, tmp_path):
    """load_model(path) built a float32 model from the stored config and copied a float64 model's weights into
    it: the loaded model was float32, its outputs about 1e-8 from the saved model's."""
    from distattn.models import MaskedLM, MaskedLMConfig
    from distattn.train import load_model, save_model
    torch.manual_seed(0)
    model = {"classifier": lambda: tiny_classifier(positional="relative"),
             "lm": lambda: tiny_lm(positional="rope"),
             "mlm": lambda: MaskedLM(MaskedLMConfig(vocab_size=V, d_model=16, n_heads=4, n_layers=2, max_len=12,
                                                    positional="sinusoidal")),
             "attention_only": lambda: ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=V, d_model=16, n_heads=4,
                                                                                max_len=12))}[kind]().to(dtype).eval()
    save_model(model, tmp_path / "m.pt")
    again = load_model(tmp_path / "m.pt").eval()
    assert type(again) is type(model) and all(p.dtype == dtype for p in again.parameters())
    ids, _ = batch()
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


# -- bad input ------------------------------------------------------------------------------------

def test_sequence_longer_than_max_len_is_refused():
    m = tiny_classifier()
    with pytest.raises(ValueError, match=r"length 13 is longer than max_len=12"):
        m(torch.ones(2, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=12"):
        tiny_lm()(torch.ones(1, 13, dtype=torch.long))


def test_empty_batch_is_refused():
    m = tiny_classifier()
    with pytest.raises(ValueError, match="empty batch"):
        m(torch.ones(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="empty batch"):
        tiny_lm()(torch.ones(3, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, seq_len\)"):
        m(torch.ones(5, dtype=torch.long))


def test_ids_outside_the_vocabulary_are_refused_on_the_cpu():
    """torch's own message is a bare 'IndexError: index out of range in self'."""
    for model in (tiny_classifier(), tiny_lm()):
        with pytest.raises(ValueError, match=rf"token id {V} is outside \[0, vocab_size={V}\)"):
            model(torch.tensor([[2, V]]))
        with pytest.raises(ValueError, match=rf"token id -1 is outside \[0, vocab_size={V}\)"):
            model(torch.tensor([[-1, 3]]))
        model(torch.tensor([[0, V - 1]]))                    # the edges of the range are fine


@pytest.mark.parametrize("field,value,message", [
    ("positional", "alibi", "positional must be one of"),
    ("norm", "rms", "norm must be one of"),
    ("n_heads", 5, "divisible by n_heads=5"),
    ("dropout", 1.5, r"dropout must be a number in \[0, 1\)"),
    ("d_model", 0, "d_model must be an integer >= 1"),
])
def test_bad_config_values_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        TransformerClassifier(seed_classifier_config(vocab_size=V, **{field: value}))


def test_lm_must_be_causal():
    with pytest.raises(ValueError, match="causal"):
        TransformerLM(LMConfig(vocab_size=V, d_model=8, n_heads=2, causal=False))


def test_layer_and_head_configs_refuse_sizes_that_build_broken_models():
    from distattn.models.attention import MultiHeadSelfAttention
    with pytest.raises(ValueError, match="n_heads must be an integer >= 1; got 0"):
        MultiHeadSelfAttention(8, 0)                                  # once ZeroDivisionError
    with pytest.raises(ValueError, match="positional must be one of .*got 'rotary'"):
        MultiHeadSelfAttention(8, 2, positional="rotary")             # once silently no positions
    with pytest.raises(ValueError, match="head_hidden must be an integer >= 1; got 0"):
        TransformerClassifier(seed_classifier_config(vocab_size=V, head_hidden=0))


def test_lm_loss_refuses_misshapen_targets_and_gives_zero_without_targets():
    """Targets transposed to (T, B) once passed (reshape(-1) matched the count) and gave a loss against the
    wrong tokens; a batch whose targets are all IGNORE_INDEX gave loss nan (0/0), and a masked-LM eval set
    with such a batch reported nan for the whole set."""
    from distattn.models import MaskedLM, MaskedLMConfig, lm_loss
    lm = tiny_lm()
    ids = torch.randint(2, V, (2, 6))
    with pytest.raises(ValueError, match=r"targets have shape \(6, 2\); logits \(2, 6, 50\) need targets of "
                                         r"shape \(2, 6\)"):
        lm(ids, ids.t().contiguous())
    logits, loss = lm(ids, torch.full((2, 6), -1))
    assert loss.item() == 0.0
    targets = ids.clone()
    targets[0, :3] = -1
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    torch.testing.assert_close(lm_loss(logits, targets), want)
    mlm = MaskedLM(MaskedLMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=12)).eval()
    _, loss = mlm(ids, torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3), -1))
    assert loss.item() == 0.0



def test_lm_loss_refuses_a_mask_or_out_of_range_ids_as_targets():
    """lm(ids, attention_mask), the habit of another library, once trained on the 0/1 mask as next
    tokens (a bool mask too); -100, another library's ignore index, gave torch's bare out-of-bounds error."""
    lm = tiny_lm()
    ids = torch.randint(2, V, (2, 6))
    with pytest.raises(TypeError, match="targets must be integer token ids .* got torch.bool. An attention mask"):
        lm(ids, torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="got torch.float32"):
        lm(ids, torch.ones(2, 6))
    bad = ids.clone()
    bad[0, 0] = -100
    with pytest.raises(ValueError, match=r"target -100 is outside \[0, vocab_size=50\) and is not the ignore index -1"):
        lm(ids, bad)
    bad[0, 0] = V
    with pytest.raises(ValueError, match=f"target {V} is outside"):
        lm(ids, bad)
    _, loss32 = lm(ids, ids.to(torch.int32))                   # int32 ids work like int64
    torch.testing.assert_close(loss32, lm(ids, ids)[1])



def test_lm_loss_of_float64_logits_is_float64():
    """lm_loss cast the logits to float32, so a .double() LM's loss was rounded (about 1e-7 off the float64
    cross-entropy); float32 / bf16 logits still give the float32 loss as before."""
    from distattn.models import lm_loss
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 5, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (2, 5), generator=g)
    targets[1, 3:] = -1
    terms = [torch.logsumexp(logits[b, t], 0) - logits[b, t, targets[b, t]]
             for b in range(2) for t in range(5) if targets[b, t] >= 0]
    want = sum(terms) / len(terms)
    got = lm_loss(logits, targets)
    assert got.dtype == torch.float64 and abs(got.item() - want.item()) <= 1e-12
    lm = tiny_lm().double()                                     # through the model, as training computes it
    ids = torch.randint(2, V, (2, 6), generator=g)
    out, loss = lm(ids, ids)
    assert loss.dtype == torch.float64
    ref = torch.nn.functional.cross_entropy(out.reshape(-1, V), ids.reshape(-1))
    assert abs(loss.item() - ref.item()) <= 1e-12
    for low in (torch.float32, torch.bfloat16, torch.float16):  # lower precision: float32, bit for bit as before
        x = logits.to(low)
        want = torch.nn.functional.cross_entropy(x.reshape(-1, V).float(), targets.reshape(-1), ignore_index=-1,
                                                 reduction="sum") / len(terms)
        got = lm_loss(x, targets)
        assert got.dtype == torch.float32 and torch.equal(got, want)

def test_attention_masks_mean_what_they_say():
    """MultiHeadSelfAttention(x, key_mask.float()) once passed the 0/1 floats to the fused kernel as an
    *additive* bias (no key masked at all) and a (B, T') mask failed with torch's 'The size of tensor a (5)
    must match the size of tensor b (3)'; the trunk forced key 0 on every row, so a left-padded row attended
    to a padding token."""
    from distattn.models import MultiHeadSelfAttention
    torch.manual_seed(0)
    att = MultiHeadSelfAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    key_mask = torch.ones(2, 5, dtype=torch.bool)
    key_mask[0, 3:] = False
    with pytest.raises(TypeError, match="key_mask must be a bool tensor .*got torch.float32"):
        att(x, key_mask.float())
    with pytest.raises(ValueError, match=r"key_mask has shape \(2, 3\); it must be \(batch, seq_len\) = \(2, 5\)"):
        att(x, key_mask[:, :3])
    # left padding: the padded keys get no attention, and an all-padding row still gives finite values
    model = tiny_classifier(positional="none")
    ids = torch.randint(2, V, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, :2] = False
    mask[2] = False
    logits, cache = model(ids, mask, capture=True)
    pattern = cache["trunk.blocks.0.attn.hook_pattern"]
    assert pattern[1, :, :, :2].abs().max() == 0                            # padding keys, left
    assert torch.isfinite(logits).all() and torch.isfinite(pattern).all()
    assert torch.allclose(pattern[2, :, :, 0], torch.ones(()))              # empty row: key 0 only
    torch.testing.assert_close(model(ids, mask), logits)                    # fast path agrees


def test_capture_takes_one_name_and_load_trunk_names_a_model_without_a_trunk():
    """names='...pattern' was read character by character ("unknown hook point(s) ['t', 'r', 'u', ...]");
    load_trunk(ProjectionMatchedLM) raised AttributeError: 'AttentionOnlyConfig' object has no attribute 'n_layers'."""
    from distattn.models import run_with_cache
    model = tiny_classifier()
    ids, mask = batch()
    name = "trunk.blocks.0.attn.hook_pattern"
    _, cache = run_with_cache(model, ids, mask, names=name)
    assert list(cache) == [name] and cache[name].shape == (3, 4, 10, 10)
    with pytest.raises(KeyError, match=r"unknown hook point\(s\) \['nope'\]"):
        run_with_cache(model, ids, mask, names="nope")
    other = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=V, d_model=16, n_heads=4, max_len=12))
    with pytest.raises(TypeError, match="load_trunk takes a model with a transformer trunk .*ProjectionMatchedLM has none"):
        model.load_trunk(other)


@pytest.mark.parametrize("make, field, value, message", [
    (lambda **kw: seed_classifier_config(vocab_size=V, **kw), "causal", "false", "causal must be True or False; got 'false'"),
    (lambda **kw: seed_classifier_config(vocab_size=V, **kw), "mlp", "no", "mlp must be True or False; got 'no'"),
    (lambda **kw: seed_classifier_config(vocab_size=V, **kw), "padding_idx", 1.5,
     r"padding_idx must be None or in \[0, vocab_size=50\); got 1.5"),
    (lambda **kw: LMConfig(vocab_size=V, d_model=16, n_heads=2, **kw), "tie_weights", "False",
     "tie_weights must be True or False; got 'False'"),
    (lambda **kw: AttentionOnlyConfig(vocab_size=V, d_model=16, **kw), "residual", "yes",
     "residual must be True or False; got 'yes'"),
])
def test_config_flags_must_be_booleans(make, field, value, message):
    """A string flag (from a CLI or YAML) was truthy: causal='false' built a causal trunk, silently; a float
    padding_idx passed validation."""
    with pytest.raises(ValueError, match=message):
        make(**{field: value}).validate()
    from distattn.models import MaskedLMConfig
    with pytest.raises(ValueError, match="tie_weights must be True or False"):
        MaskedLMConfig(vocab_size=V, d_model=16, n_heads=2, tie_weights="no").validate()
    make(**{field: np.bool_(True) if field != "padding_idx" else np.int64(1)}).validate()


def test_a_relative_position_trunk_loads_into_a_longer_or_shorter_classifier():
    """classifier_from_lm(lm.config, max_len=16).load_trunk(lm) with positional='relative' once failed with
    torch's 'size mismatch for blocks.0.attn.relative.vectors' (the learned table was handled, these not); a
    learned-position state_dict into a RoPE trunk raised AttributeError: 'NoneType' object has no attribute 'table'."""
    from distattn.train.recipes import classifier_from_lm
    torch.manual_seed(0)
    lm = tiny_lm(positional="relative", max_len=8)
    ids = torch.randint(2, V, (2, 8))
    for max_len in (16, 6):
        clf = TransformerClassifier(classifier_from_lm(lm.config, max_len=max_len)).eval()
        clf.load_trunk(lm)
        T = min(8, max_len)
        torch.testing.assert_close(clf.trunk(ids[:, :T]), lm.trunk(ids[:, :T]))    # the same function
    long = TransformerClassifier(classifier_from_lm(lm.config, max_len=16)).eval()
    long.load_trunk(lm)
    vectors = long.trunk.blocks[0].attn.relative.vectors
    assert torch.equal(vectors[:8], lm.trunk.blocks[0].attn.relative.vectors[:1].expand(8, -1))   # clipped, as before
    rope = TransformerClassifier(classifier_from_lm(tiny_lm().config, positional="rope"))
    with pytest.raises(RuntimeError, match='Unexpected key.*"pos.table"'):
        rope.load_trunk(tiny_lm().trunk.state_dict())


def test_circuits_take_numpy_layer_indices_and_the_sinusoidal_table_checks_its_sizes():
    """qk_circuit(model, layer=np.int64(0)) (a loop over np.arange(n_layers)) was refused as 'layer must be an
    integer ... got np.int64(0)'; sinusoidal_table(-1, 4) raised torch's 'upper bound and lower bound
    inconsistent with step sign'."""
    model = tiny_classifier()
    for layer in np.arange(2):
        torch.testing.assert_close(qk_circuit(model, layer).A, qk_circuit(model, int(layer)).A)
        torch.testing.assert_close(ov_circuit(model, layer).B, ov_circuit(model, int(layer)).B)
    # the value as numpy writes it: np.int64(2) from numpy 2 on, 2 before
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 2\) .*got " + re.escape(repr(np.int64(2)))):
        qk_circuit(model, np.int64(2))
    with pytest.raises(ValueError, match="max_len must be an integer >= 1; got -1"):
        sinusoidal_table(-1, 4)
    with pytest.raises(ValueError, match="d_model must be an integer >= 1; got 0"):
        sinusoidal_table(4, 0)


@pytest.mark.parametrize("positional", ["none", "relative"])
def test_a_query_with_no_key_gives_the_same_output_on_the_capture_path(positional):
    """A row whose key mask is all False: the fused kernel gives zeros, the explicit (capture) path
    once gave NaN, so capturing changed the output."""
    from distattn.models.attention import MultiHeadSelfAttention
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(16, 2, positional=positional, max_len=8).eval()
    x, key_mask = torch.randn(2, 4, 16), torch.tensor([[True, True, False, False], [False] * 4])
    fast = attn(x, key_mask)
    seen = []
    handle = attn.hook_pattern.register_forward_hook(lambda mod, inp, out: seen.append(out))
    try:
        explicit = attn(x, key_mask)
    finally:
        handle.remove()
    torch.testing.assert_close(explicit, fast)
    assert not seen[0][1].any() and torch.allclose(seen[0][0].sum(-1), torch.ones(2, 4))


@pytest.mark.parametrize("capture", [False, True], ids=["fused", "capture"])
@pytest.mark.parametrize("positional", ["none", "relative"])
def test_a_batch_row_with_no_key_trains_on_the_fused_path_with_finite_gradients(positional, capture):
    """torch 2.4's fused kernel gave NaN for a row with no key (zeros only from torch 2.5 on): the
    output, and so the loss and every gradient, came out NaN. Its attention output is zero now (the
    layer gives its output projection's bias there), and the other row is as it was alone. The
    capture path (a hook on the pattern) must train such a row as the fused path does."""
    from distattn.models.attention import MultiHeadSelfAttention
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(16, 2, positional=positional, max_len=8).train()
    attn.dropout = 0.0
    seen = []
    if capture:
        attn.hook_pattern.register_forward_hook(lambda mod, inp, out: seen.append(out))
    x = torch.randn(2, 4, 16, requires_grad=True)
    key_mask = torch.tensor([[True, True, False, False], [False] * 4])
    y = attn(x, key_mask)
    assert len(seen) == capture
    torch.testing.assert_close(y[1], attn.out.bias.detach().expand(4, 16))
    torch.testing.assert_close(y[0], attn(x[:1], key_mask[:1])[0])
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all() and not x.grad[1].any()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def test_configs_take_numpy_scalars_and_store_python_types():
    """vocab_size=ids.max() + 1 (a numpy integer) was refused by every model config ("must be an
    integer >= 1; got np.int64(50)"), and a float32 dropout as not a number; both are accepted now and
    stored as Python types, so the config is JSON and matches one built from Python numbers."""
    import json
    from distattn.models import MaskedLM, MaskedLMConfig
    kw = dict(vocab_size=np.int64(V), d_model=np.int32(16), n_heads=np.int64(4), n_layers=np.int64(2),
              max_len=np.int64(12), dropout=np.float32(0.25), tie_weights=np.bool_(True))
    plain = {k: v.item() for k, v in kw.items()}
    for cls, cfg_cls, extra in [(TransformerLM, LMConfig, {}), (MaskedLM, MaskedLMConfig, {"mask_id": np.int64(V - 1)})]:
        model = cls(cfg_cls(**kw, **extra))
        d = model.config.to_dict()
        assert json.loads(json.dumps(d)) == d
        assert d == cls(cfg_cls(**plain, **{k: v.item() for k, v in extra.items()})).config.to_dict()
        assert type(model.config.vocab_size) is int and type(model.config.dropout) is float
    clf = TransformerClassifier(seed_classifier_config(vocab_size=np.int64(V), d_model=np.int64(16), max_len=12,
                                                       head_hidden=np.int64(8), head_dropout=np.float32(0.5)))
    assert clf.config.ff_width == 64 and type(clf.config.head_hidden) is int
    assert json.dumps(clf.config.to_dict())
    att = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=np.int64(V), d_model=np.int64(16), max_len=12,
                                                  bias=np.bool_(False)))
    assert json.dumps(att.config.to_dict())
