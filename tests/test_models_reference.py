"""distattn.models against independent references written here from the formulas (plain loops over
heads and positions, weights read from the state_dict), not against the library's own helpers."""

import io
import math

import pytest
import torch

from distattn.models import (AttentionOnlyConfig, ClassifierConfig, LMConfig, ProjectionMatchedLM,
                             TransformerClassifier, TransformerLM, ov_circuit, qk_circuit)
from distattn.models.attention import MultiHeadSelfAttention

POSITIONS = ("learned", "sinusoidal", "relative", "rope", "none")
ATOL = 1e-5


# ---------------------------------------------------------------------------------------------- references

def ref_sinusoidal(T, d):
    """Vaswani et al.: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pe = torch.zeros(T, d, dtype=torch.float64)
    for p in range(T):
        for c in range(d):
            i = c // 2
            angle = p / 10000 ** (2 * i / d)
            pe[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


def ref_rope(x, base=10000.0):
    """Rotate-half RoPE on (T, dk): pair (m, m + dk/2) rotated by p · base^(-2m/dk)."""
    T, dk = x.shape
    half = dk // 2
    out = torch.empty_like(x)
    for p in range(T):
        for m in range(half):
            a = p * base ** (-2 * m / dk)
            c, s = math.cos(a), math.sin(a)
            out[p, m] = x[p, m] * c - x[p, m + half] * s
            out[p, m + half] = x[p, m] * s + x[p, m + half] * c
    return out


def ref_attention(sd, prefix, x, n_heads, *, causal, key_mask, positional, max_distance=None):
    """One self-attention layer on one sequence x (T, d) in float64, loops over heads and query
    positions. Returns (output (T, d), scores (H, T, T), pattern (H, T, T))."""
    T, d = x.shape
    dk = d // n_heads
    W = sd[prefix + "qkv.weight"].double()
    b = sd.get(prefix + "qkv.bias")
    qkv = x @ W.t() + (0 if b is None else b.double())
    q_all, k_all, v_all = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
    heads, scores_all, pattern_all = [], torch.zeros(n_heads, T, T, dtype=torch.float64), \
        torch.zeros(n_heads, T, T, dtype=torch.float64)
    for h in range(n_heads):
        q, k, v = (t[:, h * dk:(h + 1) * dk] for t in (q_all, k_all, v_all))
        if positional == "rope":
            q, k = ref_rope(q), ref_rope(k)
        z = torch.zeros(T, dk, dtype=torch.float64)
        for i in range(T):
            row = torch.full((T,), float("-inf"), dtype=torch.float64)
            for j in range(T):
                if causal and j > i:
                    continue
                if key_mask is not None and not causal and not key_mask[j]:
                    continue
                s = q[i] @ k[j]
                if positional == "relative":
                    R = sd[prefix + "relative.vectors"].double()
                    K = (R.shape[0] - 1) // 2
                    s = s + q[i] @ R[max(-K, min(K, i - j)) + K]
                row[j] = s / math.sqrt(dk)
            scores_all[h, i] = row
            if torch.isinf(row).all():
                continue
            a = torch.exp(row - row.max())
            a = a / a.sum()
            pattern_all[h, i] = a
            z[i] = a @ v
        heads.append(z)
    Wo = sd[prefix + "out.weight"].double()
    bo = sd.get(prefix + "out.bias")
    out = torch.cat(heads, dim=1) @ Wo.t() + (0 if bo is None else bo.double())
    return out, scores_all, pattern_all


def ref_layernorm(x, sd, key):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + 1e-5) * sd[key + ".weight"].double()
    return y + sd[key + ".bias"].double() if key + ".bias" in sd else y


def ref_trunk(trunk, ids, key_mask=None):
    """Reference forward of a Transformer trunk on one sequence ids (T,): (hidden, [(scores, pattern)])."""
    c = trunk.config
    sd = trunk.state_dict()
    T = ids.shape[0]
    x = sd["tok_emb.weight"].double()[ids]
    if c.positional == "learned":
        x = x + sd["pos.table"].double()[:T]
    elif c.positional == "sinusoidal":
        x = x + ref_sinusoidal(T, c.d_model)
    if key_mask is not None and not key_mask.any():
        key_mask = key_mask.clone()
        key_mask[0] = True
    caught = []
    for layer in range(c.n_layers):
        p = f"blocks.{layer}."

        def attn(h):
            out, s, a = ref_attention(sd, p + "attn.", h, c.n_heads, causal=c.causal, key_mask=key_mask,
                                      positional=c.positional)
            caught.append((s, a))
            return out

        def mlp(h):
            h = h @ sd[p + "mlp.0.weight"].double().t() + sd.get(p + "mlp.0.bias", torch.zeros(1)).double()
            h = torch.relu(h) if c.activation == "relu" else torch.nn.functional.gelu(h, approximate="tanh")
            return h @ sd[p + "mlp.3.weight"].double().t() + sd.get(p + "mlp.3.bias", torch.zeros(1)).double()

        ln = (lambda h, key: ref_layernorm(h, sd, p + key)) if c.norm != "none" else (lambda h, key: h)
        if c.norm == "post":
            x = ln(x + attn(x), "ln1")
            if c.mlp:
                x = ln(x + mlp(x), "ln2")
        else:
            x = x + attn(ln(x, "ln1"))
            if c.mlp:
                x = x + mlp(ln(x, "ln2"))
    if c.norm == "pre":
        x = ref_layernorm(x, sd, "ln_f")
    return x, caught


def classifier(positional, causal=False, **kw):
    torch.manual_seed(0)
    cfg = ClassifierConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, d_ff=12, max_len=10, dropout=0.1,
                           positional=positional, causal=causal, head_hidden=4, **kw)
    return TransformerClassifier(cfg).eval()


def lm(positional, **kw):
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, d_ff=12, max_len=10, positional=positional, **kw)
    return TransformerLM(cfg).eval()


# ---------------------------------------------------------------------------------------------- positions

def test_sinusoidal_table_is_vaswanis_formula():
    from distattn.models import sinusoidal_table
    for d in (8, 7, 1):
        assert torch.allclose(sinusoidal_table(12, d).double(), ref_sinusoidal(12, d), atol=1e-6)


@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_classifier_trunk_matches_a_loop_reference_with_padding(positional, norm):
    model = classifier(positional, norm=norm)
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 0, 0], [4, 6, 8, 0, 0, 0, 0, 0]])
    mask = ids != 0
    with torch.no_grad():
        fast = model.trunk(ids, mask)
        logits, cache = model(ids, mask, capture=True)
    for b in range(2):
        ref, caught = ref_trunk(model.trunk, ids[b], mask[b])
        n = int(mask[b].sum())
        # padded queries are pooled out; the real ones must match
        assert torch.allclose(fast[b, :n].double(), ref[:n], atol=ATOL), positional
        for layer in range(2):
            s, a = caught[layer]
            got_a = cache[f"trunk.blocks.{layer}.attn.hook_pattern"][b].double()
            got_s = cache[f"trunk.blocks.{layer}.attn.hook_scores"][b].double()
            assert torch.allclose(got_a[:, :n], a[:, :n], atol=ATOL)
            fin = torch.isfinite(s[:, :n])
            assert torch.equal(torch.isfinite(got_s[:, :n]), fin)
            assert torch.allclose(got_s[:, :n][fin], s[:, :n][fin], atol=ATOL)


@pytest.mark.parametrize("positional", POSITIONS)
def test_lm_matches_a_loop_reference(positional):
    model = lm(positional)
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 4]])
    with torch.no_grad():
        logits = model(ids)
        logits_c, cache = model(ids, capture=True)
    ref, caught = ref_trunk(model.trunk, ids[0])
    ref_logits = ref @ model.state_dict()["lm_head.weight"].double().t()
    assert torch.allclose(logits[0].double(), ref_logits, atol=ATOL)
    assert torch.allclose(logits_c[0].double(), ref_logits, atol=ATOL)
    for layer in range(2):
        assert torch.allclose(cache[f"trunk.blocks.{layer}.attn.hook_pattern"][0].double(), caught[layer][1],
                              atol=ATOL)


@pytest.mark.parametrize("max_distance", [0, 1, 2, None])
@pytest.mark.parametrize("causal", [False, True])
def test_relative_attention_clips_distances_as_shaw(max_distance, causal):
    torch.manual_seed(1)
    attn = MultiHeadSelfAttention(8, 2, causal=causal, positional="relative", max_len=7,
                                  rel_max_distance=max_distance).eval()
    with torch.no_grad():
        attn.relative.vectors.normal_()
        x = torch.randn(1, 6, 8)
        got = attn(x)
        from distattn.models import run_with_cache
        got_c, cache = run_with_cache(attn, x)
    ref, s, a = ref_attention(attn.state_dict(), "", x[0].double(), 2, causal=causal, key_mask=None,
                              positional="relative")
    assert torch.allclose(got[0].double(), ref, atol=ATOL)
    assert torch.allclose(got_c[0].double(), ref, atol=ATOL)
    assert torch.allclose(cache["hook_pattern"][0].double(), a, atol=ATOL)


def test_rope_scores_depend_on_the_offset_only():
    torch.manual_seed(2)
    attn = MultiHeadSelfAttention(8, 1, positional="rope", max_len=10).eval()
    q = torch.randn(1, 1, 1, 8).expand(1, 1, 10, 8)
    k = torch.randn(1, 1, 1, 8).expand(1, 1, 10, 8)
    s = (attn.rotary(q) @ attn.rotary(k).transpose(-1, -2))[0, 0]
    for off in range(-9, 10):
        diag = torch.diagonal(s, offset=off)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-5)


@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("kind", ["lm", "pm", "causal-classifier"])
def test_causal_models_do_not_leak_the_future(positional, kind):
    if kind == "lm":
        model = lm(positional)
        run = lambda ids: model(ids)
    elif kind == "pm":
        torch.manual_seed(0)
        model = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=23, d_model=8, n_heads=2, max_len=10,
                                                        positional=positional, residual=True)).eval()
        run = lambda ids: model(ids)
    else:
        model = classifier(positional, causal=True)
        run = lambda ids: model.trunk(ids, torch.ones_like(ids, dtype=torch.bool))
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 4, 6]])
    with torch.no_grad():
        base = run(ids)
        for t in range(ids.shape[1] - 1):
            changed = ids.clone()
            changed[0, t + 1:] = (changed[0, t + 1:] + 7) % 20 + 1
            out = run(changed)
            assert torch.allclose(out[0, :t + 1], base[0, :t + 1], atol=1e-6), (positional, t)
            assert not torch.allclose(out[0, t + 1:], base[0, t + 1:], atol=1e-6)
            cap = model(changed, capture=True)[0] if kind != "causal-classifier" else None
            if cap is not None:
                assert torch.allclose(cap[0, :t + 1], base[0, :t + 1], atol=1e-5)


@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("causal", [False, True])
def test_classifier_logit_is_independent_of_the_amount_of_padding(positional, causal):
    model = classifier(positional, causal=causal)
    real = torch.tensor([3, 5, 7, 9])
    outs = []
    with torch.no_grad():
        for total in (4, 5, 7, 10):
            ids = torch.zeros(1, total, dtype=torch.long)
            ids[0, :4] = real
            mask = ids != 0
            outs.append(model(ids, mask))
            outs.append(model(ids, mask, capture=True)[0])
            # padding that is not the padding id must not matter either
            junk = ids.clone()
            junk[0, 4:] = 17
            outs.append(model(junk, mask))
    for o in outs[1:]:
        assert torch.allclose(o, outs[0], atol=1e-5), positional


# ---------------------------------------------------------------------------------------------- capture

@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("causal", [False, True])
def test_captured_pattern_times_values_through_w_o_is_the_layer_output(positional, causal):
    model = classifier(positional, causal=causal, norm="pre")
    ids = torch.tensor([[3, 5, 7, 9, 11, 0, 0], [4, 6, 0, 0, 0, 0, 0]])
    mask = ids != 0
    got = {}
    attn0 = model.trunk.blocks[1].attn
    h_in = {}
    attn0.register_forward_pre_hook(lambda m, args: h_in.__setitem__("x", args[0].detach()))
    attn0.register_forward_hook(lambda m, args, out: got.__setitem__("y", out.detach()))
    with torch.no_grad():
        _, cache = model(ids, mask, capture=True)
    x, y = h_in["x"], got["y"]
    sd = model.trunk.state_dict()
    pat = cache["trunk.blocks.1.attn.hook_pattern"]
    scores = cache["trunk.blocks.1.attn.hook_scores"]
    assert torch.allclose(torch.softmax(scores, -1), pat, atol=1e-6)
    W, b = sd["blocks.1.attn.qkv.weight"], sd["blocks.1.attn.qkv.bias"]
    v = x @ W[16:].t() + b[16:]
    Wo, bo = sd["blocks.1.attn.out.weight"], sd["blocks.1.attn.out.bias"]
    for bi in range(2):
        out = bo.clone()
        for h in range(2):
            z = pat[bi, h] @ v[bi, :, h * 4:(h + 1) * 4]         # (T, dk)
            out = out + z @ Wo[:, h * 4:(h + 1) * 4].t()
        n = int(mask[bi].sum())
        assert torch.allclose(out[:n], y[bi, :n], atol=1e-5)


# ---------------------------------------------------------------------------------------------- circuits

@pytest.mark.parametrize("make", ["lm", "lm-untied", "pm", "classifier"])
def test_circuits_equal_the_dense_products_built_from_the_state_dict(make):
    if make == "lm":
        model = lm("rope")
    elif make == "lm-untied":
        model = lm("learned", tie_weights=False)
    elif make == "pm":
        torch.manual_seed(0)
        model = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=23, d_model=8, n_heads=2, max_len=10))
    else:
        model = classifier("learned")
    sd = model.state_dict()
    pre = "trunk." if make != "pm" else ""
    E = sd[pre + "tok_emb.weight"].double()
    d, H = 8, 2
    dk = d // H
    layers = model.config.n_layers if make != "pm" else 1
    for layer in range(layers):
        ap = f"{pre}blocks.{layer}.attn." if make != "pm" else "attn."
        Wqkv = sd[ap + "qkv.weight"].double()
        Wo = sd[ap + "out.weight"].double()
        qk = qk_circuit(model, layer)
        ov = ov_circuit(model, layer)
        for h in range(H):
            WQ = Wqkv[h * dk:(h + 1) * dk].t()                    # (d, dk), x @ W_Q
            WK = Wqkv[d + h * dk:d + (h + 1) * dk].t()
            WV = Wqkv[2 * d + h * dk:2 * d + (h + 1) * dk].t()
            WO = Wo[:, h * dk:(h + 1) * dk].t()                   # (dk, d)
            dense_qk = E @ WQ @ WK.t() @ E.t()
            assert torch.allclose(qk[h].to_dense().double(), dense_qk, atol=1e-4)
            if "lm_head.weight" in sd:
                dense_ov = E @ WV @ WO @ sd["lm_head.weight"].double().t()
            else:
                dense_ov = E @ WV @ WO
            assert torch.allclose(ov[h].to_dense().double(), dense_ov, atol=1e-4)
            # the documented convention: the circuit is the score before the 1/sqrt(d_k) scale
            ids = torch.tensor([[5, 9]])
            with torch.no_grad():
                if make == "pm" and layer == 0:
                    _, cache = model(ids, capture=True)
                    assert torch.allclose(cache["attn.hook_scores"][0, h, 1, 0].double(),
                                          dense_qk[9, 5] / math.sqrt(dk), atol=1e-5)


def test_projection_matched_lm_logits_are_the_documented_sum():
    """logits[t] = Σ_h Σ_{j<=t} A_h[t, j] · (W_E[x_j] W_V^h W_O^h W_U), no bias, no positions, no residual."""
    torch.manual_seed(3)
    model = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=23, d_model=8, n_heads=2, max_len=10)).eval()
    ids = torch.tensor([[3, 5, 7, 9, 11, 2]])
    with torch.no_grad():
        logits, cache = model(ids, capture=True)
    A = cache["attn.hook_pattern"][0].double()
    ov = ov_circuit(model, 0)
    for t in range(6):
        want = torch.zeros(23, dtype=torch.float64)
        for h in range(2):
            for j in range(t + 1):
                want += A[h, t, j] * ov[h].rows(int(ids[0, j])).double()
            assert torch.allclose(A[h, t, t + 1:], torch.zeros(5 - t, dtype=torch.float64))
        assert torch.allclose(logits[0, t].double(), want, atol=1e-5)


# ---------------------------------------------------------------------------------------------- persistence

@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("make", ["classifier", "lm", "pm"])
def test_state_dict_round_trip_and_max_len(positional, make):
    def build(seed):
        torch.manual_seed(seed)
        if make == "classifier":
            return TransformerClassifier(ClassifierConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, d_ff=12,
                                                          max_len=10, positional=positional)).eval()
        if make == "lm":
            return TransformerLM(LMConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, max_len=10,
                                          positional=positional)).eval()
        return ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=23, d_model=8, n_heads=2, max_len=10,
                                                       positional=positional, bias=True, residual=True)).eval()
    a, b = build(0), build(1)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 4, 6, 8, 10]])
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))
        with pytest.raises(ValueError, match="longer than max_len=10"):
            a(torch.ones(1, 11, dtype=torch.long))
        with pytest.raises(ValueError, match="longer than max_len=10"):
            a(torch.ones(1, 11, dtype=torch.long), capture=True)


def test_load_trunk_takes_a_trunk_whose_default_ffn_width_equals_the_explicit_one():
    """d_ff=None means 4·d_model: a pretrained LM with the default and a classifier that names the
    same width (seed_classifier_config always does) have identical shapes."""
    torch.manual_seed(0)
    src = TransformerLM(LMConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, max_len=10)).eval()
    for d_ff in (32, None):
        cfg = ClassifierConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, d_ff=d_ff, max_len=10, norm="pre",
                               activation="gelu", causal=True, bias=False, padding_idx=None)
        model = TransformerClassifier(cfg).eval()
        model.load_trunk(src)
        ids = torch.tensor([[3, 5, 7, 9]])
        with torch.no_grad():
            assert torch.equal(model.trunk(ids), src.trunk(ids))
    wider = TransformerClassifier(ClassifierConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, d_ff=16,
                                                   max_len=10, norm="pre", activation="gelu", causal=True,
                                                   bias=False, padding_idx=None))
    with pytest.raises(ValueError, match="d_ff"):
        wider.load_trunk(src)


def test_position_tables_refuse_a_sequence_longer_than_max_len_by_name():
    """A bare attention layer (or position table) built for max_len 5 said 'The size of tensor a (7) must
    match the size of tensor b (5)' for 7 positions."""
    from distattn.models.positional import AbsolutePositions
    attn = MultiHeadSelfAttention(8, 2, positional="rope", max_len=5)
    with pytest.raises(ValueError, match="sequence length 7 is longer than max_len=5"):
        attn(torch.randn(1, 7, 8))
    assert attn(torch.randn(1, 5, 8)).shape == (1, 5, 8)
    for kind in ("learned", "sinusoidal"):
        with pytest.raises(ValueError, match="sequence length 7 is longer than max_len=5"):
            AbsolutePositions(kind, 5, 8)(torch.randn(1, 7, 8))


def test_factored_matrix_indexes_its_head_axes_only():
    """qk[0, [1, 0]] indexed the inner axis of B with the row index: with a 2-dim inner axis it silently
    returned A[0, [1, 0]] @ B[0, [1, 0]], not rows 1 and 0 of head 0 (other row indexes: 'index 3 is out of
    bounds for dimension 0 with size 2')."""
    from distattn.models import FactoredMatrix
    torch.manual_seed(0)
    A, B = torch.randn(2, 5, 2), torch.randn(2, 2, 6)
    F = FactoredMatrix(A, B)
    for index in ((0, [1, 0]), (0, [3, 1]), (0, slice(1, 3)), (Ellipsis, 0), (0, 1, 2)):
        with pytest.raises(IndexError, match="head axes"):
            F[index]
    for index in (1, -1, slice(0, 2), [1, 0], torch.tensor([True, False]), (1,)):
        assert torch.allclose(F[index].to_dense(), (A @ B)[index])
    assert torch.allclose(F[1].rows([1, 0]), (A @ B)[1, [1, 0]])
    deep = FactoredMatrix(torch.randn(3, 2, 5, 2), torch.randn(3, 2, 2, 6))
    assert torch.allclose(deep[2, 1].to_dense(), (deep.A @ deep.B)[2, 1])


@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("causal", [False, True])
def test_a_double_model_matches_the_float64_reference_to_double_precision(positional, causal):
    """A .double() model's captured scores and pattern were computed in float32 (about 5e-10 off), and its
    sinusoidal / RoPE tables were float32-rounded (about 1e-8 off): a float64 model is float64 throughout."""
    model = classifier(positional, causal=causal).double()
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 0, 0], [4, 6, 8, 0, 0, 0, 0, 0]])
    mask = ids != 0 if not causal else None      # a causal trunk reads no padding mask
    with torch.no_grad():
        fast = model.trunk(ids, mask)
        _, cache = model(ids, mask, capture=True)
    for b in range(2):
        n = int(ids[b].ne(0).sum())
        ref, caught = ref_trunk(model.trunk, ids[b], None if mask is None else mask[b])
        assert torch.allclose(fast[b, :n], ref[:n], rtol=0, atol=1e-12), positional
        for layer in range(2):
            s, a = caught[layer]
            got_a = cache[f"trunk.blocks.{layer}.attn.hook_pattern"][b]
            got_s = cache[f"trunk.blocks.{layer}.attn.hook_scores"][b]
            assert got_a.dtype == got_s.dtype == torch.float64
            assert torch.allclose(got_a[:, :n], a[:, :n], rtol=0, atol=1e-12)
            fin = torch.isfinite(s[:, :n])
            assert torch.equal(torch.isfinite(got_s[:, :n]), fin)
            assert torch.allclose(got_s[:, :n][fin], s[:, :n][fin], rtol=0, atol=1e-12)


@pytest.mark.parametrize("make", ["lm", "classifier"])
def test_a_double_models_circuits_are_float64(make):
    """qk_circuit / ov_circuit cast every weight to float32, so a .double() model's circuits were rounded
    (about 1e-7 off the float64 product); a float32 model's stay float32."""
    model = lm("rope") if make == "lm" else classifier("learned")
    for dtype in (torch.float32, torch.float64):
        m = model.to(dtype)
        sd = m.state_dict()
        E = sd["trunk.tok_emb.weight"]
        for layer in range(2):
            Wqkv = sd[f"trunk.blocks.{layer}.attn.qkv.weight"]
            Wo = sd[f"trunk.blocks.{layer}.attn.out.weight"]
            qk, ov = qk_circuit(m, layer), ov_circuit(m, layer)
            assert qk.A.dtype == qk.B.dtype == ov.A.dtype == ov.B.dtype == dtype
            for h in range(2):
                WQ, WK, WV = (Wqkv[i * 8 + h * 4:i * 8 + (h + 1) * 4].t() for i in range(3))
                WO = Wo[:, h * 4:(h + 1) * 4].t()
                right = WO if "lm_head.weight" not in sd else WO @ sd["lm_head.weight"].t()
                if dtype == torch.float64:      # to 1e-12 of the largest entry (the LM's init is small)
                    for got, want in ((qk[h].to_dense(), (E @ WQ) @ (E @ WK).t()), (ov[h].to_dense(), (E @ WV) @ right)):
                        assert (got - want).abs().max() <= 1e-12 * want.abs().max()
                else:       # the float32 products, to float32 rounding: not bit for bit, since the circuits
                    # multiply every head at once (a batched matmul), whose kernel may round otherwise than
                    # one head's plain matmul (1 ulp apart on an AVX-512 host, equal on others)
                    for got, want in ((qk[h].A, E @ WQ), (qk[h].B, (E @ WK).t()), (ov[h].A, E @ WV), (ov[h].B, right)):
                        assert (got - want).abs().max() <= 1e-6 * want.abs().max()
    half = model.to(torch.bfloat16)                     # lower precision weights: float32 circuits, as before
    assert qk_circuit(half, 0).A.dtype == ov_circuit(half, 0).B.dtype == torch.float32


# ---------------------------------------------------------------------------------------------- other models

@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_projection_matched_lm_matches_a_loop_reference(positional, residual, bias):
    """Every positional option (added to W_E[x] or acting in the attention), the residual path and the
    biases, on the fused and the capture path, against the float64 loop reference."""
    torch.manual_seed(5)
    model = ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=23, d_model=8, n_heads=2, max_len=10,
                                                    positional=positional, bias=bias, residual=residual)).eval()
    with torch.no_grad():                 # non-zero biases and relative vectors of unit scale: each term counts
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_()
        if model.attn.relative is not None:
            model.attn.relative.vectors.normal_()
    sd = model.state_dict()
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 4]])
    x = sd["tok_emb.weight"].double()[ids[0]]
    if positional == "learned":
        x = x + sd["pos.table"].double()[:7]
    elif positional == "sinusoidal":
        x = x + ref_sinusoidal(7, 8)
    out, scores, pattern = ref_attention(sd, "attn.", x, 2, causal=True, key_mask=None, positional=positional)
    want = ((out + x) if residual else out) @ sd["lm_head.weight"].double().t()
    with torch.no_grad():
        fast = model(ids)
        slow, cache = model(ids, capture=True)
    assert torch.allclose(fast[0].double(), want, atol=ATOL), positional
    assert torch.allclose(slow[0].double(), want, atol=ATOL), positional
    assert torch.allclose(cache["attn.hook_pattern"][0].double(), pattern, atol=ATOL)
    assert torch.equal(torch.isneginf(cache["attn.hook_scores"][0]), torch.isneginf(scores))


@pytest.mark.parametrize("positional", POSITIONS)
def test_masked_lm_matches_a_bidirectional_loop_reference(positional):
    """The masked LM's trunk attends both ways (no causal mask, no padding mask: its batches are packed);
    the full logits and the logits at the masked positions are the reference's rows."""
    from distattn.models import MaskedLM, MaskedLMConfig
    torch.manual_seed(6)
    model = MaskedLM(MaskedLMConfig(vocab_size=23, d_model=8, n_layers=2, n_heads=2, d_ff=12, max_len=10,
                                    positional=positional)).eval()
    ids = torch.tensor([[3, 5, 22, 9, 11, 2, 22]])                    # 22: the [MASK] id
    ref, caught = ref_trunk(model.trunk, ids[0])
    want = ref @ model.state_dict()["lm_head.weight"].double().t()
    positions, targets = torch.tensor([[2, 6]]), torch.tensor([[7, 4]])
    with torch.no_grad():
        full = model(ids)
        picked, loss = model(ids, positions, targets)
        _, cache = model(ids, capture=True)
    assert torch.allclose(full[0].double(), want, atol=ATOL), positional
    assert torch.allclose(picked[0].double(), want[[2, 6]], atol=ATOL)
    ce = -torch.log_softmax(want[[2, 6]], -1)[[0, 1], [7, 4]].mean()
    assert math.isclose(loss.item(), ce.item(), rel_tol=1e-5)
    for layer in range(2):
        pattern = cache[f"trunk.blocks.{layer}.attn.hook_pattern"][0].double()
        assert torch.allclose(pattern, caught[layer][1], atol=ATOL)
        assert (pattern.triu(1) > 0).any()                            # later keys are attended
