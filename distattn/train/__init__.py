"""Stage 3b: training engine for :mod:`distattn.models`.

>>> import numpy as np
>>> from distattn.models import TransformerClassifier, seed_classifier_config
>>> from distattn.train import Trainer, TrainConfig, ClassificationData, ClassificationTask
>>> docs, labels = [np.array([2, 3, 4]), np.array([5, 6]), np.array([7, 8, 9, 2])], [1, 0, 1]
>>> model = TransformerClassifier(seed_classifier_config(vocab_size=10, d_model=16, d_ff=32))
>>> task = ClassificationTask(ClassificationData(docs, labels), {"test": ClassificationData(docs, labels)})
>>> result = Trainer(model, task, TrainConfig(epochs=2, batch_size=2, progress=False, device="cpu"),
...                  out_dir="runs/seed").fit()       # checkpoint.pt and metrics.json; run again to resume
[TransformerClassifier] ...
>>> [h["epoch"] for h in result["history"]], sorted(result["history"][-1]["eval"]["test"])
([1, 2], ['accuracy', 'loss', 'n'])

The seed's recipe is ``TrainConfig(epochs=5, batch_size=64, lr=2e-4, decay="all",
schedule="constant", grad_clip=None)`` on ``seed_classifier_config()``: ``seed_train_config()``
in :mod:`distattn.train.recipes` (TrainConfig's own defaults add a cosine schedule, clipping
and decay on matrices only).

* :class:`Trainer` / :class:`TrainConfig` — the loop (bf16, TF32, fused AdamW, compile, warm-up +
  cosine, clipping, checkpoints with exact resume, per-epoch JSON metrics, torchrun DDP);
* :class:`ClassificationData`, :class:`LMData` — batches from encoded corpora;
* :class:`ClassificationTask`, :class:`LMTask` — losses and per-epoch evaluation;
* :class:`MaskedLMData`, :class:`MaskedLMTask` — masked-LM self-pretraining (dynamic 80/10/10 masks);
* :func:`evaluate_lm`, :class:`NextTokenScorer` — LMs under the shared next-token metric;
* :mod:`distattn.train.recipes` — the seed-faithful classifier and the IMDB recipes.
"""

from distattn.train.data import TRUNCATIONS, ClassificationData, LMData, as_ragged, epoch_plan
from distattn.train.engine import (CheckpointMismatchError, TrainConfig, Trainer, load_checkpoint, load_model,
                                   lr_factor, pick_device, save_model, seed_everything, setup_distributed)
from distattn.train.lm_eval import NextTokenScorer, evaluate_lm
from distattn.train.masking import MaskedLMData, MaskedLMTask
from distattn.train.tasks import ClassificationTask, LMTask, to_device

__all__ = ["ClassificationData", "LMData", "epoch_plan", "as_ragged", "TRUNCATIONS", "TrainConfig", "Trainer",
           "CheckpointMismatchError", "load_checkpoint", "load_model", "save_model", "lr_factor", "pick_device",
           "seed_everything", "setup_distributed", "NextTokenScorer", "evaluate_lm", "ClassificationTask",
           "LMTask", "to_device", "MaskedLMData", "MaskedLMTask"]
