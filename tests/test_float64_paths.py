"""A .double() model stays float64 where the library reads its outputs: the classification task's
loss and probabilities, the next-token scorer's log-probabilities, and the analysis adapter's
captured patterns (each rounded them to float32, about 1e-8 off a float64 reference)."""

from __future__ import annotations

import numpy as np
import torch

from distattn.analysis.sources import TorchModelAdapter
from distattn.corpus.ragged import RaggedIds
from distattn.models import LMConfig, TransformerClassifier, TransformerLM, seed_classifier_config
from distattn.train import ClassificationData, ClassificationTask
from distattn.train.lm_eval import NextTokenScorer

V = 23


def _classifier():
    torch.manual_seed(0)
    m = TransformerClassifier(seed_classifier_config(vocab_size=V, d_model=16, d_ff=32, n_heads=2, head_hidden=8,
                                                     max_len=16))
    return m.double().eval()


def _data():
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, V, n) for n in (5, 9, 12, 7)]
    return ClassificationData(docs, np.array([0, 1, 1, 0]), max_len=16)


def test_classification_loss_and_probabilities_of_a_double_model_are_float64():
    model, data = _classifier(), _data()
    task = ClassificationTask(data, {"val": data})
    batch = data.batch(np.arange(len(data)))
    with torch.no_grad():
        logits = model(batch["ids"], batch["attention_mask"])
        loss = task.loss(model, batch)
    z, y = logits.numpy(), batch["labels"].double().numpy()
    ref = np.mean(np.logaddexp(0.0, z) - y * z)               # BCE with logits, in float64
    assert loss.dtype == torch.float64 and abs(loss.item() - ref) < 1e-13
    probs = task.predict(model, data, torch.device("cpu"))
    assert np.abs(probs - 1.0 / (1.0 + np.exp(-z))).max() < 1e-13


def test_next_token_scores_of_a_double_lm_are_float64():
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=16)).double().eval()
    doc = np.array([3, 5, 7, 2, 9, 11, 4], dtype=np.int32)
    scorer = NextTokenScorer(lm, bos_id=0, oov_id=1)
    logp, _ = scorer.score_next_tokens(RaggedIds(doc, np.array([0, len(doc)])))
    with torch.no_grad():
        ref = torch.log_softmax(lm(torch.as_tensor(np.r_[0, doc][None], dtype=torch.long)), -1)[0].numpy()
    want = ref[np.arange(1, len(doc)), doc[1:]]    # row p of [bos] + doc predicts doc[p], stored at p - 1
    assert np.abs(logp[:-1] - want).max() < 1e-12
    rows = scorer.next_token_logits(doc)
    assert rows.dtype == torch.float64


def test_captured_patterns_of_a_double_model_are_not_rounded():
    model = _classifier()
    ids = np.array([3, 5, 7, 2, 9])
    pats = TorchModelAdapter(model).patterns(ids)
    from distattn.models import run_with_cache
    with torch.no_grad():
        _, cache = run_with_cache(model, torch.as_tensor(ids[None]), filter=lambda n: n.endswith("hook_pattern"))
    names = sorted(cache)
    ref = np.stack([cache[n][0].numpy() for n in names])
    assert ref.dtype == np.float64 and np.array_equal(pats, ref)
