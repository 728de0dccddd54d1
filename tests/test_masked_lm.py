"""Masked-LM self-pretraining: the masking, the bidirectional model, training, resume, fine-tuning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from distattn.models import (LMConfig, MaskedLM, MaskedLMConfig, TransformerClassifier, TransformerLM, build_model)
from distattn.train import (CheckpointMismatchError, ClassificationData, ClassificationTask, MaskedLMData, MaskedLMTask,
                            NextTokenScorer, TrainConfig, Trainer, epoch_plan, seed_everything)
from distattn.train.masking import hashed_uniform
from distattn.train.recipes import classifier_from_lm

V = 40          # real ids 0..39 (0 = pad/bos, 1 = unk); [MASK] = 40
MASK = V


def random_docs(n=50, seed=0, lo=2):
    rng = np.random.default_rng(seed)
    return [rng.integers(lo, V, rng.integers(3, 30)) for _ in range(n)]


def tiny_mlm(**kw):
    base = dict(vocab_size=V + 1, d_model=32, n_layers=2, n_heads=4, max_len=16, dropout=0.0)
    base.update(kw)
    return MaskedLM(MaskedLMConfig(**base))


def quiet(**kw):
    base = dict(device="cpu", progress=False, log_every=1000)
    base.update(kw)
    return TrainConfig(**base)


# -- masking ----------------------------------------------------------------------------------------

def test_masks_depend_only_on_seed_epoch_and_position():
    data = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK)
    both = data.batch([3, 7], epoch=2)
    for row, i in enumerate((3, 7)):
        alone = data.batch([i], epoch=2)
        for key in ("ids", "positions", "targets"):
            assert torch.equal(both[key][row], alone[key][0]), key
    again = data.batch([3, 7], epoch=2)
    assert all(torch.equal(both[k], again[k]) for k in ("ids", "positions", "targets"))
    other = data.batch([3, 7], epoch=3)
    assert not torch.equal(both["positions"], other["positions"])          # dynamic masking
    reseeded = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK, seed=1).batch([3, 7], epoch=2)
    assert not torch.equal(both["positions"], reseeded["positions"])


def test_hashed_uniform_is_uniform_and_keyed():
    u = hashed_uniform(0, 0, 0, np.arange(200_000))
    assert 0 <= u.min() and u.max() < 1
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    assert np.abs(counts - 10_000).max() < 5 * np.sqrt(10_000)                # 5 sigma per bin
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01
    assert not np.array_equal(u[:100], hashed_uniform(0, 1, 0, np.arange(100)))
    assert not np.array_equal(u[:100], hashed_uniform(0, 0, 1, np.arange(100)))


def test_corruption_follows_the_80_10_10_rule_and_spares_bos_and_oov():
    docs = random_docs(400, seed=1)
    docs[5] = np.array([2, -1, -1, 3, -1, 4, 5, 6])                       # OOV markers
    data = MaskedLMData(docs, seq_len=32, mask_id=MASK, oov_id=1)
    clean = data.stream
    idx = np.arange(len(data))
    b = data.batch(idx, epoch=0)
    ids, pos, tgt = b["ids"].numpy(), b["positions"].numpy(), b["targets"].numpy()
    K = data.n_masked
    assert K == round(0.15 * 32) and pos.shape == (len(idx), K)
    assert (np.diff(pos, axis=1) > 0).all()                                 # K distinct positions per row
    gpos = idx[:, None] * 32 + pos
    assert (tgt >= 0).all()                                                  # every row has >= K real tokens
    assert np.array_equal(tgt, clean[gpos])                                  # targets are the original ids
    assert data.eligible[gpos].all()                                         # never bos, never OOV
    untouched = np.ones_like(ids, dtype=bool)
    untouched[np.arange(len(idx))[:, None], pos] = False
    assert np.array_equal(ids[untouched], clean[idx[:, None] * 32 + np.arange(32)][untouched])
    picked = ids[np.arange(len(idx))[:, None], pos]
    n = picked.size
    masked = (picked == MASK).mean()
    kept = (picked == tgt).mean()
    randomised = 1 - masked - kept
    sd = lambda p: 5 * np.sqrt(p * (1 - p) / n)
    assert abs(masked - 0.8) < sd(0.8)
    # a random draw equals the target with probability 1/38, so "kept" is 0.1 + 0.1/38
    assert abs(kept - (0.1 + 0.1 / 38)) < sd(0.1)
    assert abs(randomised - 0.1 * 37 / 38) < sd(0.1)
    rnd = picked[(picked != MASK) & (picked != tgt)]
    assert rnd.min() >= 2 and rnd.max() < MASK                              # from [random_low, mask_id)


def test_short_rows_mark_missing_targets():
    data = MaskedLMData([[2, 3]] * 20, seq_len=8, mask_id=MASK, mask_prob=0.75)   # 6 masks, <= 6 real tokens
    idx = np.arange(len(data))
    b = data.batch(idx)
    ids, pos, tgt = b["ids"].numpy(), b["positions"].numpy(), b["targets"].numpy()
    gpos = idx[:, None] * 8 + pos
    short = tgt < 0
    assert short.any() and (~short).any()
    n_real = data.eligible[idx[:, None] * 8 + np.arange(8)].sum(axis=1)
    assert np.array_equal((~short).sum(axis=1), np.minimum(n_real, data.n_masked))   # every real token scored
    assert not data.eligible[gpos[short]].any()                    # the fillers are bos slots...
    picked = ids[np.arange(len(idx))[:, None], pos]
    assert np.array_equal(picked[short], data.stream[gpos[short]])  # ...and are left uncorrupted


def test_masked_data_bad_input_names_the_value():
    docs = random_docs(10)
    with pytest.raises(ValueError, match="mask_prob"):
        MaskedLMData(docs, seq_len=8, mask_id=MASK, mask_prob=1.5)
    with pytest.raises(ValueError, match="replace"):
        MaskedLMData(docs, seq_len=8, mask_id=MASK, replace=(0.9, 0.2))
    with pytest.raises(ValueError, match="below mask_id"):
        MaskedLMData(docs, seq_len=8, mask_id=20)
    with pytest.raises(ValueError, match="seq_len"):
        MaskedLMData(docs, seq_len=0, mask_id=MASK)
    with pytest.raises(ValueError, match="negative"):
        MaskedLMData([[2, -1, 3, 4, 5, 6, 7, 8, 9]], seq_len=4, mask_id=MASK)
    with pytest.raises(ValueError, match="empty batch"):
        MaskedLMData(docs, seq_len=8, mask_id=MASK).batch([])
    with pytest.raises(IndexError, match="sequence indices"):
        MaskedLMData(docs, seq_len=8, mask_id=MASK).batch([10_000])


def test_resume_is_refused_on_data_that_masks_other_tokens(tmp_path):
    """OOV tokens mapped to <unk> (oov_id=1) are never masked; a real <unk> token may be. The two packed
    streams are identical, the training targets are not: one's checkpoint must not resume the other."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, V, 12) for _ in range(6)]
    for d in docs:
        d[::3] = -1
    oov = MaskedLMData(docs, seq_len=8, mask_id=MASK, oov_id=1)
    unk = MaskedLMData([np.where(d < 0, 1, d) for d in docs], seq_len=8, mask_id=MASK, oov_id=1)
    assert np.array_equal(oov.stream, unk.stream) and not np.array_equal(oov.eligible, unk.eligible)
    Trainer(tiny_mlm(), MaskedLMTask(oov), quiet(batch_size=4), out_dir=tmp_path).fit()
    with pytest.raises(CheckpointMismatchError, match="task.train.checksum"):
        Trainer(tiny_mlm(), MaskedLMTask(unk), quiet(batch_size=4), out_dir=tmp_path).fit()


def test_task_plan_carries_the_epoch_and_splits_over_processes():
    data = MaskedLMData(random_docs(80), seq_len=16, mask_id=MASK)
    task = MaskedLMTask(data)
    plan = task.plan(8, epoch=3, seed=0)
    reference = epoch_plan(len(data), 8, epoch=3, seed=0)
    assert len(plan) == len(reference)
    assert all(np.array_equal(p, q + 3 * len(data)) for p, q in zip(plan, reference))
    whole = task.make_batch(plan[0])
    assert torch.equal(whole["ids"], data.batch(plan[0] % len(data), epoch=3)["ids"])
    halves = [task.make_batch(task.plan(8, epoch=3, seed=0, rank=r, world=2)[0]) for r in (0, 1)]
    for key in ("ids", "positions", "targets"):                              # world size does not change masks
        assert torch.equal(torch.cat([h[key] for h in halves]), whole[key]), key


# -- the model --------------------------------------------------------------------------------------

def test_masked_positions_path_equals_the_full_forward():
    torch.manual_seed(0)
    model = tiny_mlm().eval()
    b = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK).batch([0, 1, 2])
    full = model(b["ids"])
    assert full.shape == (3, 16, V + 1)
    logits, loss = model(b["ids"], b["positions"], b["targets"])
    gathered = full[torch.arange(3)[:, None], b["positions"]]
    torch.testing.assert_close(logits, gathered, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, F.cross_entropy(gathered.reshape(-1, V + 1), b["targets"].reshape(-1)))


def test_the_model_attends_both_ways():
    torch.manual_seed(0)
    model = tiny_mlm().eval()
    ids = torch.randint(2, V, (1, 12))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - 2) % (V - 2) + 2
    a, b = model(ids), model(changed)
    assert not torch.allclose(a[0, 0], b[0, 0])                               # position 0 sees the last token
    causal = TransformerLM(LMConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_len=16)).eval()
    torch.testing.assert_close(causal(ids)[0, 0], causal(changed)[0, 0])      # the contrast


def test_masked_lm_config_errors_and_rebuild():
    with pytest.raises(ValueError, match="causal=True"):
        MaskedLMConfig(vocab_size=V + 1, causal=True).validate()
    with pytest.raises(ValueError, match="mask_id=41"):
        MaskedLMConfig(vocab_size=V + 1, mask_id=41).validate()
    with pytest.raises(TypeError, match="MaskedLMConfig"):
        MaskedLM(LMConfig(vocab_size=V))
    assert MaskedLMConfig(vocab_size=V + 1).mask_token == V
    model = tiny_mlm()
    again = build_model(model.config.to_dict())
    assert type(again) is MaskedLM and again.config == model.config
    ids = torch.randint(2, V, (2, 8))
    with pytest.raises(ValueError, match="both positions and targets"):
        model(ids, positions=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(batch, K\)"):
        model(ids, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))


def test_next_token_scorer_refuses_a_bidirectional_model():
    with pytest.raises(ValueError, match="causal"):
        NextTokenScorer(tiny_mlm())


def test_flops_count_the_unembedding_only_where_scored():
    model = tiny_mlm()
    full = model.flops_per_token(16)
    assert model.flops_per_token(16, mask_fraction=1.0) == full
    assert full - model.flops_per_token(16, mask_fraction=0.15) == pytest.approx(6 * 32 * (V + 1) * 0.85)


# -- training ---------------------------------------------------------------------------------------

def copy_docs(n=120, seed=0):
    """Each document repeats one short motif: a masked token is predictable from its context."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        motif = rng.integers(2, V, 3)
        docs.append(np.tile(motif, 6))
    return docs


def test_masked_lm_learns_from_context():
    seed_everything(0)
    data = MaskedLMData(copy_docs(), seq_len=16, mask_id=MASK, seed=0)
    val = MaskedLMData(copy_docs(60, seed=9), seq_len=16, mask_id=MASK, seed=5)
    model = tiny_mlm()
    res = Trainer(model, MaskedLMTask(data, {"val": val}), quiet(epochs=25, batch_size=16, lr=1e-2,
                                                                  warmup_steps=5)).fit()
    first, last = res["history"][0]["eval"]["val"], res["history"][-1]["eval"]["val"]
    assert last["n_tokens"] > 100
    assert last["loss"] < 0.6 * first["loss"]
    assert last["accuracy"] > 0.5                      # chance is 1/38; unigram statistics give ~1/38 too


class _Crash(Exception):
    pass


def test_interrupted_pretraining_resumes_to_the_same_weights(tmp_path):
    def run(out, crash_at=None):
        seed_everything(0)
        model = tiny_mlm(dropout=0.1)
        data = MaskedLMData(copy_docs(64), seq_len=16, mask_id=MASK)

        def cb(trainer, step, loss):
            if crash_at is not None and step == crash_at:
                raise _Crash
        cfg = quiet(epochs=3, batch_size=8, lr=3e-3, warmup_steps=2, checkpoint_every=3)
        Trainer(model, MaskedLMTask(data), cfg, out_dir=out, callbacks=[cb]).fit()
        return model

    whole = run(tmp_path / "a")
    with pytest.raises(_Crash):
        run(tmp_path / "b", crash_at=13)
    resumed = run(tmp_path / "b")
    for k, v in whole.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k


def test_classifier_fine_tunes_from_the_masked_lm_trunk():
    seed_everything(0)
    mlm = tiny_mlm()
    cfg = classifier_from_lm(mlm.config, dropout=0.0)
    assert cfg.causal is False and cfg.vocab_size == V + 1
    clf = TransformerClassifier(cfg)
    clf.load_trunk(mlm)
    for k, v in mlm.trunk.state_dict().items():
        assert torch.equal(v, clf.trunk.state_dict()[k]), k
    causal_clf = TransformerClassifier(classifier_from_lm(LMConfig(vocab_size=V + 1, d_model=32, n_layers=2,
                                                                   n_heads=4, max_len=16)))
    with pytest.raises(ValueError, match="causal"):
        causal_clf.load_trunk(mlm)
    rng = np.random.default_rng(0)
    docs = [rng.integers(5, V, 10) for _ in range(64)]
    y = np.arange(64) % 2
    for d, t in zip(docs, y):
        d[rng.random(10) < 0.5] = 3 if t else 4
    task = ClassificationTask(ClassificationData(docs, y, max_len=16), {"train": ClassificationData(docs, y, max_len=16)})
    res = Trainer(clf, task, quiet(epochs=15, batch_size=16, lr=3e-3)).fit()
    assert res["history"][-1]["eval"]["train"]["accuracy"] > 0.9


def test_masked_forward_traces_to_one_graph_for_torch_compile():
    torch._dynamo.reset()
    model = tiny_mlm()
    b = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK).batch([0, 1])
    explain = torch._dynamo.explain(model)(b["ids"], b["positions"], b["targets"])
    assert explain.graph_count == 1 and explain.graph_break_count == 0


def test_capture_keeps_the_masked_positions_and_bad_positions_are_named():
    """model(ids, positions, targets, capture=True) once dropped positions and targets: it returned the full
    (B, T, V) logits and no loss. Positions outside the sequence raised torch's bare 'index 8 is out of
    bounds for dimension 1 with size 8'; float positions 'gather(): Expected dtype int32/int64 for index'."""
    torch.manual_seed(0)
    model = tiny_mlm().eval()
    b = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK).batch([0, 1])
    (logits, loss), cache = model(b["ids"], b["positions"], b["targets"], capture=True)
    want_logits, want_loss = model(b["ids"], b["positions"], b["targets"])
    torch.testing.assert_close(logits, want_logits)
    torch.testing.assert_close(loss, want_loss)
    assert "trunk.blocks.0.attn.hook_pattern" in cache
    ids = b["ids"][:, :8]
    targets = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"position 8 is outside \[0, seq_len=8\)"):
        model(ids, torch.full((2, 2), 8), targets)
    with pytest.raises(ValueError, match=r"position -1 is outside \[0, seq_len=8\)"):
        model(ids, torch.full((2, 2), -1), targets)
    with pytest.raises(TypeError, match="positions must be int64 or int32; got torch.float32"):
        model(ids, torch.zeros(2, 2), targets)


def test_int32_positions_give_what_int64_positions_give():
    """forward accepts int32 positions, but gathered with them as they were: torch before 2.8 (2.4.1
    seen here) refused them ('gather(): Expected dtype int64 for index'); 778624b casts them."""
    torch.manual_seed(0)
    model = tiny_mlm().eval()
    b = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK).batch([0, 1])
    assert b["positions"].dtype == torch.int64
    want_logits, want_loss = model(b["ids"], b["positions"], b["targets"])
    logits, loss = model(b["ids"], b["positions"].to(torch.int32), b["targets"])
    torch.testing.assert_close(logits, want_logits)
    torch.testing.assert_close(loss, want_loss)


def test_data_with_another_mask_id_than_the_model_is_refused():
    """MaskedLMData's [MASK] id was never compared with the model's: data built with another id (a
    valid word of the model's vocabulary) trained without a word of warning."""
    model = tiny_mlm()                                    # mask token V
    docs = [np.tile([2, 3, 4, 5], 6) for _ in range(40)]
    data = MaskedLMData(docs, seq_len=16, mask_id=V - 1)
    with pytest.raises(ValueError, match=f"the train data's mask_id={V - 1} is not the model's mask token {V}"):
        Trainer(model, MaskedLMTask(data), quiet(epochs=1, batch_size=16)).fit()
    good = MaskedLMData(docs, seq_len=16, mask_id=V)
    bad_val = MaskedLMData(docs[:20], seq_len=16, mask_id=V - 1)
    with pytest.raises(ValueError, match=f"the val data's mask_id={V - 1}"):
        MaskedLMTask(good, {"val": bad_val}).evaluate(model, torch.device("cpu"))


def test_masked_lm_declared_eval_metrics_are_the_ones_evaluate_gives():
    """MaskedLMTask.eval_metrics (checked against select_on before training) names exactly the keys its
    evaluate returns; it adds 'accuracy' to LMTask's."""
    data = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK)
    task = MaskedLMTask(data, {"val": data}, max_eval_sequences=4)
    assert sorted(task.evaluate(tiny_mlm(), torch.device("cpu"))["val"]) == sorted(task.eval_metrics)


def test_masking_options_are_checked_by_type_and_value():
    # np.float32(0.15) was refused as "not a number"; random_low=2.5 or True and a NaN replace
    # probability were accepted (with NaN nothing was ever masked: the targets stayed in the input)
    data = MaskedLMData(random_docs(), seq_len=16, mask_id=MASK, mask_prob=np.float32(0.15))
    assert data.mask_prob == pytest.approx(0.15)
    for kw, message in (({"random_low": 2.5}, "random_low must be in"), ({"random_low": True}, "random_low must be in"),
                        ({"replace": (float("nan"), 0.1)}, r"replace=\(p_mask, p_random\) must be >= 0")):
        with pytest.raises(ValueError, match=message):
            MaskedLMData(random_docs(), seq_len=16, mask_id=MASK, **kw)


@pytest.mark.parametrize("kw, bad", [({"bos_id": -1, "oov_id": 1}, "bos_id=-1"), ({"bos_id": -3}, "bos_id=-3"),
                                     ({"bos_id": MASK}, f"bos_id={MASK}"), ({"bos_id": 2.5}, "bos_id=2.5"),
                                     ({"oov_id": MASK + 2}, f"oov_id={MASK + 2}"), ({"oov_id": -2}, "oov_id=-2")])
def test_masked_data_checks_bos_and_oov_ids_against_mask_id(kw, bad):
    """bos_id and oov_id were not checked: bos_id=-1 with oov_id=1 turned every document separator into the
    OOV id silently, bos_id=2.5 became 2 in the stream, an oov_id outside [0, mask_id) was taken, and a bad
    bos_id was blamed on the documents ('documents ... hold negative token id -3')."""
    with pytest.raises(ValueError, match=rf"{bad} is invalid; allowed: a token id in \[0, mask_id={MASK}\)"):
        MaskedLMData([np.array([2, 3, 4, 5]), np.array([6, 7, 8])], seq_len=3, mask_id=MASK, **kw)
