"""Training recipes: the seed's, and the ones the benchmarks use for IMDB.

* :func:`seed_train_config` — 000_48942d33924f2728.txt's run: lr 2e-4, weight decay 0.01, batch
  64, 5 epochs. The paper's text gives none of these; they are the ``models/imdb_config.json`` of
  the repository it names, which names no optimizer either: AdamW is assumed (its default weight
  decay is that 0.01), on every parameter, as ``AdamW(model.parameters())`` does. Neither states a
  schedule, warm-up or clipping, so there are none.
* :func:`lm_train_config` — GPT-style: AdamW (0.9, 0.95), weight decay 0.1 on matrices, warm-up
  then cosine to 10 %, clipping at 1.
* :func:`finetune_config` — a pretrained trunk with a fresh classification head.
* :func:`classifier_from_lm` — a :class:`ClassifierConfig` whose trunk equals a language model's.
"""

from __future__ import annotations

from distattn.models import ClassifierConfig, LMConfig, TransformerConfig
from distattn.train.engine import TrainConfig

__all__ = ["seed_train_config", "lm_train_config", "finetune_config", "classifier_from_lm"]


def seed_train_config(**overrides) -> TrainConfig:
    base = dict(epochs=5, batch_size=64, lr=2e-4, weight_decay=0.01, decay="all", betas=(0.9, 0.999), eps=1e-8,
                schedule="constant", warmup_steps=0, grad_clip=None)
    base.update(overrides)
    return TrainConfig(**base)


def lm_train_config(**overrides) -> TrainConfig:
    base = dict(epochs=1, batch_size=128, lr=1e-3, weight_decay=0.1, decay="matrices", betas=(0.9, 0.95),
                schedule="cosine", warmup_steps=200, min_lr_ratio=0.1, grad_clip=1.0)
    base.update(overrides)
    return TrainConfig(**base)


def finetune_config(**overrides) -> TrainConfig:
    base = dict(epochs=4, batch_size=32, lr=2e-4, weight_decay=0.01, decay="matrices", betas=(0.9, 0.98),
                schedule="cosine", warmup_steps=100, min_lr_ratio=0.0, grad_clip=1.0)
    base.update(overrides)
    return TrainConfig(**base)


def classifier_from_lm(lm_config: LMConfig, **overrides) -> ClassifierConfig:
    """A classifier config with ``lm_config``'s trunk (load the weights with ``load_trunk``)."""
    trunk = {f: getattr(lm_config, f) for f in TransformerConfig.__dataclass_fields__}
    trunk.update(head_hidden=lm_config.d_model // 2, head_dropout=0.2, pooling="mean")
    trunk.update(overrides)
    return ClassifierConfig(**trunk)
