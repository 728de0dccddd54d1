"""Stage 3b: torch self-attention models matched to the projections.

>>> import torch
>>> from distattn.models import TransformerClassifier, seed_classifier_config, qk_circuit
>>> model = TransformerClassifier(seed_classifier_config(vocab_size=30_000))      # the seed's sizes
>>> ids = torch.randint(2, 30_000, (2, 12))                # (B, T) token ids
>>> logits, cache = model(ids, torch.ones(2, 12, dtype=torch.bool), capture=True)
>>> cache["trunk.blocks.0.attn.hook_pattern"].shape      # (B, heads, T, T), after the softmax
torch.Size([2, 4, 12, 12])
>>> qk_circuit(model, layer=0).shape                     # W_E W_Q W_Kᵀ W_Eᵀ per head, factored
(4, 30000, 30000)

* :class:`TransformerClassifier` — the seed IMDB classifier (and its pretrained kin);
* :class:`ProjectionMatchedLM` — one attention-only layer, the learned mirror of ``E = M(QS)``;
* :class:`TransformerLM` — a small GPT-style causal stack;
* :class:`MaskedLM` — a bidirectional masked LM, for self-pretraining a classifier's trunk;
* :func:`qk_circuit`, :func:`ov_circuit` — vocabulary-space circuits as :class:`FactoredMatrix`;
* :class:`NBSVMClassifier` — the bag-of-n-grams baseline (NBSVM, scikit-learn API) the
  classifiers are measured against.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from distattn.models.attention import MultiHeadSelfAttention
from distattn.models.circuits import (FactoredMatrix, attention_layers, embedding_weight, ov_circuit, qk_circuit,
                                      unembedding_weight)
from distattn.models.classifier import ClassifierConfig, TransformerClassifier, seed_classifier_config
from distattn.models.hooks import HookPoint, capture_hooks, hook_points, run_with_cache
from distattn.models.lm import (IGNORE_INDEX, AttentionOnlyConfig, LMConfig, ProjectionMatchedLM, TransformerLM,
                                lm_loss)
from distattn.models.mlm import MaskedLM, MaskedLMConfig
from distattn.models.positional import POSITIONAL, sinusoidal_table
from distattn.models.transformer import Transformer, TransformerConfig, config_diff

CONFIG_TYPES = {"TransformerConfig": TransformerConfig, "ClassifierConfig": ClassifierConfig,
                "LMConfig": LMConfig, "AttentionOnlyConfig": AttentionOnlyConfig, "MaskedLMConfig": MaskedLMConfig}
MODEL_TYPES = {ClassifierConfig: TransformerClassifier, LMConfig: TransformerLM, MaskedLMConfig: MaskedLM,
               AttentionOnlyConfig: ProjectionMatchedLM, TransformerConfig: Transformer}

__all__ = [
    "TransformerConfig", "ClassifierConfig", "LMConfig", "AttentionOnlyConfig", "Transformer",
    "TransformerClassifier", "TransformerLM", "ProjectionMatchedLM", "MaskedLM", "MaskedLMConfig", "MultiHeadSelfAttention",
    "seed_classifier_config", "HookPoint", "hook_points", "capture_hooks", "run_with_cache", "FactoredMatrix",
    "qk_circuit", "ov_circuit", "attention_layers", "embedding_weight", "unembedding_weight", "lm_loss",
    "IGNORE_INDEX", "POSITIONAL", "sinusoidal_table", "build_model", "config_from_dict", "config_diff",
    "load_embeddings", "CONFIG_TYPES", "NBSVMClassifier",
]


def __getattr__(name: str):
    """:class:`NBSVMClassifier` is loaded on first use (scikit-learn adds 0.6 s to ``import distattn.models``)."""
    if name == "NBSVMClassifier":
        from distattn.models.nbsvm import NBSVMClassifier
        return NBSVMClassifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def config_from_dict(d: dict):
    """Rebuild a model config from ``config.to_dict()``."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in CONFIG_TYPES:
        raise ValueError(f"unknown model config kind {kind!r}; known: {sorted(CONFIG_TYPES)}")
    cls = CONFIG_TYPES[kind]
    unknown = sorted(set(d) - set(cls.__dataclass_fields__))
    if unknown:
        raise ValueError(f"fields {unknown} are not fields of {kind}")
    return cls(**d)


def build_model(config) -> nn.Module:
    """The model class for a config object or a ``to_dict()`` dict."""
    if isinstance(config, dict):
        config = config_from_dict(config)
    cls = MODEL_TYPES.get(type(config))
    if cls is None:
        raise TypeError(f"no model for config type {type(config).__name__}; known: "
                        f"{[c.__name__ for c in MODEL_TYPES]}")
    return cls(config)


@torch.no_grad()
def load_embeddings(model: nn.Module, vectors, rescale: bool = True) -> nn.Module:
    """Initialise the token embeddings from ``vectors`` (vocab × d_model), e.g. the statistics
    layer's PPMI-SVD ``SVDEmbeddings(dim=d_model).fit(ppmi).vectors_``.

    All-zero rows (the specials, OOV rows) keep their current initialisation. With ``rescale``
    the vectors are scaled so that their mean row norm equals the current one's, keeping the
    activation scale the architecture was initialised for.
    """
    weight = embedding_weight(model)
    emb = model.trunk.tok_emb if hasattr(model, "trunk") else model.tok_emb
    v = torch.as_tensor(np.asarray(vectors), dtype=torch.float32).to(weight.device)   # a GPU model too
    if v.shape != tuple(weight.shape):
        raise ValueError(f"vectors have shape {tuple(v.shape)}; the model's embedding is {tuple(weight.shape)} "
                         f"(vocab_size, d_model)")
    if not torch.isfinite(v).all():
        raise ValueError("vectors contain NaN or inf")
    rows = v.norm(dim=1) > 0
    if not rows.any():
        raise ValueError("vectors are all zero")
    if rescale:
        target = weight[rows].float().norm(dim=1).mean()
        v = v * (target / v[rows].norm(dim=1).mean())
    emb.weight[rows] = v[rows].to(emb.weight.dtype)
    if emb.padding_idx is not None:
        emb.weight[emb.padding_idx].zero_()
    return model
