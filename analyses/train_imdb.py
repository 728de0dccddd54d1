"""Train the toolkit's torch models on IMDB, the way a user would.

    python analyses/train_imdb.py seed --out runs/seed            # the seed-faithful classifier (train → test)
    python analyses/train_imdb.py lm --out runs/lm --positional rope --layers 2
    python analyses/train_imdb.py mlm --out runs/mlm --max-len 512  # masked-LM self-pretraining on train+unsup,
                                                                    # then a classifier fine-tuned on train → test
    torchrun --nproc_per_node 2 analyses/train_imdb.py lm --out runs/lm_ddp     # DDP (nccl / gloo)

Data: ``--data-dir`` (default ``DISTATTN_DATA_DIR``) holding ``aclImdb_v1.tar.gz``; the vocabulary is the 30k most frequent
words of train+unsup, the statistics layer's (``<pad>`` 0, ``<unk>`` 1; test is never counted). Metrics go to ``OUT/metrics.json`` at each epoch
(``lm`` also writes ``OUT/test_next_token.json``: perplexity and top-k on test, the projection's metric);
re-running the same command resumes from ``OUT/checkpoint.pt`` (``mlm``: ``OUT/pretrain/`` and
``OUT/finetune/``), written at each epoch's end and, with ``--checkpoint-every N``, every N steps.
"""

from __future__ import annotations

import argparse
import json
import sys

from distattn.atomic import write_json
from distattn.cli import check_data_dir, non_negative_int, output_dir, positive_int, run_script
from distattn.corpus import get_corpus, tokenize_corpus
from distattn.models import (POSITIONAL, LMConfig, MaskedLM, MaskedLMConfig, TransformerClassifier, TransformerLM,
                             seed_classifier_config)
from distattn.train import (ClassificationData, ClassificationTask, LMData, LMTask, MaskedLMData, MaskedLMTask, Trainer,
                            evaluate_lm, seed_everything, setup_distributed)
from distattn.train.recipes import classifier_from_lm, finetune_config, lm_train_config, seed_train_config


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("seed", "lm", "mlm"))
    ap.add_argument("--out", type=output_dir, required=True)
    ap.add_argument("--epochs", type=positive_int, default=None)
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--d-model", type=positive_int, default=512)
    ap.add_argument("--heads", type=positive_int, default=None,
                    help="attention heads of the LMs (default: d_model // 64, at least 1); must divide --d-model")
    ap.add_argument("--positional", default="learned", choices=POSITIONAL)
    ap.add_argument("--max-len", type=positive_int, default=256,
                    help="context of the LMs (lm, mlm) and of the fine-tuned classifier (mlm)")
    ap.add_argument("--batch-size", type=positive_int, default=None,
                    help="default: the recipe's (seed 64, lm 128, mlm 64 pretraining, 32 fine-tuning)")
    ap.add_argument("--finetune-epochs", type=positive_int, default=4, help="mlm: classifier epochs after pretraining")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--checkpoint-every", type=non_negative_int, default=0,
                    help="also checkpoint every N steps (default 0: at each epoch's end); a rerun resumes from it")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--data-dir", default=None,
                    help="the directory holding aclImdb_v1.tar.gz (default: $DISTATTN_DATA_DIR, then the cache)")
    ap.add_argument("--max-steps", type=positive_int, default=None)
    ap.add_argument("--limit-docs", type=positive_int, default=None,
                    help="use a random subset of at most this many documents of each set: train, test, and for "
                         "lm and mlm the train+unsup training set taken as one (quick checks)")
    args = ap.parse_args()                  # the int types refuse bad counts before the corpus is tokenized
    unused = {"seed": ("layers", "d_model", "heads", "positional", "max_len", "finetune_epochs"),
              "lm": ("finetune_epochs",), "mlm": ()}[args.what]
    given = ["--" + name.replace("_", "-") for name in unused if getattr(args, name) != ap.get_default(name)]
    if given:                               # once ignored: seed --d-model 32 trained the seed's d=256 model
        ap.error(f"conflicting options: {', '.join(given)} {'is' if len(given) == 1 else 'are'} not used by the "
                 f"{args.what} recipe (seed trains the seed's fixed classifier; --finetune-epochs is for mlm)")
    heads = args.heads or max(1, args.d_model // 64)
    if args.d_model % heads:                # once "d_model=129 must be divisible by n_heads=2", a count never asked for
        ap.error(f"--d-model {args.d_model} is not divisible by {heads} heads "
                 f"({'--heads' if args.heads else 'the default d_model // 64'}); choose --heads to divide it")
    try:
        check_data_dir(args.data_dir)
    except ValueError as exc:
        ap.error(str(exc))
    epochs = {} if args.epochs is None else {"epochs": args.epochs}

    tc = tokenize_corpus(get_corpus("imdb", data_dir=args.data_dir))
    vocab = tc.split("train+unsup").vocabulary(max_size=29_998)     # the statistics layer's (never test)
    def part(name):
        split = tc.split(name)
        return split.sample(min(args.limit_docs, len(split)), seed=0) if args.limit_docs else split

    train, test = part("train").encode(vocab), part("test").encode(vocab)
    batch = {"batch_size": args.batch_size} if args.batch_size else {}
    ckpt = {"checkpoint_every": args.checkpoint_every}
    seed_everything(args.seed)
    if args.what == "seed":
        model = TransformerClassifier(seed_classifier_config(vocab_size=len(vocab)))
        task = ClassificationTask(ClassificationData(train, max_len=256), {"test": ClassificationData(test, max_len=256)})
        cfg = seed_train_config(seed=args.seed, compile=args.compile, max_steps=args.max_steps, **ckpt,
                                **epochs, **batch)
        result = Trainer(model, task, cfg, out_dir=args.out).fit()
        print(json.dumps(result["history"][-1]["eval"], indent=1))
        return
    shape = dict(d_model=args.d_model, n_layers=args.layers, positional=args.positional,
                 n_heads=heads, max_len=args.max_len)
    if args.what == "mlm":
        mlm_cfg = MaskedLMConfig(vocab_size=len(vocab) + 1, **shape)          # + [MASK], the last id
        model = MaskedLM(mlm_cfg)
        data = MaskedLMData(part("train+unsup").encode(vocab), seq_len=args.max_len, mask_id=mlm_cfg.mask_token)
        cfg = lm_train_config(seed=args.seed, compile=args.compile, max_steps=args.max_steps, **ckpt,
                              **epochs, **(batch or {"batch_size": 64}))
        Trainer(model, MaskedLMTask(data), cfg, out_dir=f"{args.out}/pretrain").fit()
        clf = TransformerClassifier(classifier_from_lm(mlm_cfg))
        clf.load_trunk(model)
        task = ClassificationTask(ClassificationData(train, max_len=args.max_len),
                                  {"test": ClassificationData(test, max_len=args.max_len)}, length_grouping=20)
        cfg = finetune_config(seed=args.seed, compile=args.compile, max_steps=args.max_steps, **ckpt,
                              epochs=args.finetune_epochs, **batch)
        result = Trainer(clf, task, cfg, out_dir=f"{args.out}/finetune").fit()
        print(json.dumps(result["history"][-1]["eval"], indent=1))
        return
    lm_cfg = LMConfig(vocab_size=len(vocab), **shape)
    model = TransformerLM(lm_cfg)
    stream = LMData(part("train+unsup").encode(vocab), seq_len=lm_cfg.max_len)
    task = LMTask(stream, {"test": LMData(test, seq_len=lm_cfg.max_len)}, max_eval_sequences=512)
    cfg = lm_train_config(seed=args.seed, compile=args.compile, max_steps=args.max_steps, **ckpt,
                          **epochs, **batch)
    Trainer(model, task, cfg, out_dir=args.out).fit()
    rank, _, _ = setup_distributed()
    if rank == 0:
        report = evaluate_lm(model, test.tokens, unk_id=vocab.unk_id)
        write_json(f"{args.out}/test_next_token.json", report.as_dict())
        print(report)


if __name__ == "__main__":
    sys.exit(run_script(main))
