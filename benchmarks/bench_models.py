"""GPU figures for distattn.models / distattn.train, each beside a plain-PyTorch baseline.

Parts (``--part``, default all):

* ``seed`` — the seed-faithful IMDB classifier (train 25k → test 25k, 5 epochs): accuracy and
  wall time with the engine (bf16 autocast, TF32, fused AdamW) and with a plain loop (fp32, no
  TF32, unfused AdamW, no compile).
* ``lm`` — the 4-layer d=512 causal LM at sequence length 256 on train+unsup: tokens/s and MFU
  with the engine (bf16, torch.compile, fused AdamW) and with the plain loop; then test
  perplexity / top-1 / top-10 with the shared next-token metric, for it and for the
  one-layer projection-matched attention-only LM.
* ``mfu`` — the same LM's throughput under a few batch sizes (256, 512, 768; ``torch.compile``
  default mode). ``max-autotune-no-cudagraphs`` was dropped in session 82: on the H100 (torch
  2.11) its autotuning ran over 400 s without finishing; ``--set mfu_variants=...`` still takes it.
* ``best`` — the ablation towards a better classifier (train+unsup only; model selection on a
  held-out 2 500-review slice of train; test is only reported). Rows A–D: the seed architecture
  with PPMI-SVD embeddings and/or 512 tokens; E/F/G: causal-LM self-pretraining on train+unsup,
  then fine-tuning; H: masked-LM self-pretraining (bidirectional), then fine-tuning; I: F's
  recipe right to left (every review reversed: a backward LM), and with F (or G) in the same
  run, ULMFiT's forward + backward ensemble (mean probability). Every row writes
  ``probs_<row>.npz``, which ``ensemble_rows.py`` averages across separate runs.
* ``seedvar`` — the seed recipe with other seeds; ``seedsplit`` — the seed recipe on random
  splits of the 50k labelled reviews (how the seed's Kaggle copy is usually split), and on a
  movie-disjoint 40k/10k one (whole movies held out, as in the official split).

MFU = tokens/s × (6·N + 12·n_layers·d_model·seq_len) / 989e12, N = parameters doing matmul work
(all but the embedding lookup tables; the tied unembedding counts once), 989 TFLOP/s = H100
SXM bf16 dense peak. The fp32 baseline's MFU is quoted against the same peak.

    python benchmarks/bench_models.py --part seed --out /tmp/bench        # on a GPU
    python benchmarks/bench_models.py --smoke --out /tmp/bench            # CPU check of every code path
    python benchmarks/bench_models.py --part best --rows F --set pre_epochs=12   # one size changed
    python benchmarks/bench_models.py --part seedsplit --set 'seedsplit_splits=["random_25k_25k"]'   # one split
    python benchmarks/bench_models.py --part seedsplit --set 'seedsplit_seeds=[1, 2]'   # other model seeds

``--set KEY=JSON`` overrides one entry of ``SIZES`` (checked against its default's kind; the
overrides are recorded in every result's ``info``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from distattn.atomic import atomic_path, write_json
from distattn.corpus import movie_disjoint_split
from distattn.corpus.ragged import RaggedIds
from distattn.models import (AttentionOnlyConfig, LMConfig, MaskedLM, MaskedLMConfig, ProjectionMatchedLM,
                             TransformerClassifier, TransformerLM, load_embeddings, seed_classifier_config)
from distattn.train import (ClassificationData, ClassificationTask, LMData, LMTask, MaskedLMData, MaskedLMTask, Trainer,
                            epoch_plan, evaluate_lm, load_model, pick_device, seed_everything)
from distattn.train.recipes import classifier_from_lm, finetune_config, lm_train_config, seed_train_config

H100_BF16_PEAK = 989e12
DEFAULT_PREP = ".gpu/prep/imdb_prep.npz"
T0 = time.perf_counter()


def log(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


# -- data -----------------------------------------------------------------------------------------

def load_data(prep: str | None, smoke: bool, with_svd: bool = True) -> dict:
    """The prepared arrays at ``prep``, else built from the IMDB corpus; built, the PPMI-SVD vectors only
    ``with_svd`` (the ``best`` part's rows; about a minute of the build, which a one-call GPU session
    running ``seed,lm,mfu`` from the carried archive does not have to spare)."""
    if prep and Path(prep).exists():
        z = np.load(prep)
        arrays = {k: z[k] for k in z.files}
        log(f"loaded prepared arrays from {prep}")
    else:
        log(f"no prepared arrays at {prep}: building them from the IMDB corpus"
            + ("" if with_svd else " (no PPMI-SVD vectors: no part here uses them)"))
        sys.path.insert(0, str(Path(__file__).parent))
        from prepare_imdb import build_arrays
        arrays = build_arrays(256, with_svd=with_svd, log=log)
    data = {}
    for split in ("train", "test", "unsup"):
        ids = arrays[f"{split}_ids"].astype(np.int32)
        data[split] = RaggedIds(ids, arrays[f"{split}_offsets"])
        if split != "unsup":
            data[f"{split}_labels"] = arrays[f"{split}_labels"].astype(np.int64)
            # files made before the movie-disjoint split lack them: seedsplit refuses that split then
            data[f"{split}_movies"] = arrays[f"{split}_movies"] if f"{split}_movies" in arrays else None
    data["svd"] = arrays["svd"].astype(np.float32) if "svd" in arrays else None
    # files made before the vocabulary moved to the statistics layer's (train+unsup) lack the key
    data["vocab_from"] = str(arrays["vocab_from"]) if "vocab_from" in arrays else "train"
    data["tokenizer"] = str(arrays["tokenizer"]) if "tokenizer" in arrays else "regex"  # older files: the default
    log(f"vocabulary counted on {data['vocab_from']}, tokenizer {data['tokenizer']}")
    if smoke:   # a few hundred documents, balanced
        rng = np.random.default_rng(0)
        for split, n in (("train", 300), ("test", 120)):
            y = data[f"{split}_labels"]
            idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), n // 2, replace=False) for c in (0, 1)]))
            data[split], data[f"{split}_labels"] = data[split].take(idx), y[idx]
            if data[f"{split}_movies"] is not None:
                data[f"{split}_movies"] = data[f"{split}_movies"][idx]
        data["unsup"] = data["unsup"].take(np.arange(300))
    return data


def svd_vectors(data, d_model, smoke):
    v = data["svd"]
    if v is None:
        raise ValueError("the prepared data hold no PPMI-SVD vectors; run benchmarks/prepare_imdb.py")
    if v.shape[1] < d_model and not smoke:
        raise ValueError(f"PPMI-SVD vectors have {v.shape[1]} dims but the model has d_model={d_model}")
    # components come sorted by singular value: the leading d of a wider SVD are the rank-d SVD's
    # U Σ^0.5, but prepare_imdb's rows were L2-normalised at the full width: normalised again here
    # (all-zero rows stay zero), as SVDEmbeddings(dim=d_model) would give them
    if v.shape[1] > d_model:
        v = v[:, :d_model]
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        v = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    return v


def concat(*parts: RaggedIds) -> RaggedIds:
    ids = np.concatenate([p.ids for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    return RaggedIds(ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def save_probs(path: Path, probs: dict, val_labels, test_labels, val_idx) -> None:
    """A row's val/test probabilities with their labels and the val reviews' indices, so that
    rows from separate runs can be ensembled later (``benchmarks/ensemble_rows.py``)."""
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, val=probs["val"], test=probs["test"], val_labels=np.asarray(val_labels),
                 test_labels=np.asarray(test_labels), val_idx=np.asarray(val_idx))


def train_val_split(n: int, n_val: int, seed: int = 0):
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


# -- plain-PyTorch baselines ---------------------------------------------------------------------

def plain_mode(device):
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def plain_classifier(model, train: ClassificationData, test: ClassificationData, *, epochs, batch_size, lr, wd, seed,
                     device):
    """The seed's loop as one would write it by hand: fp32, AdamW(model.parameters()), BCE."""
    plain_mode(device)
    torch.manual_seed(seed)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, foreach=False)
    accs = []
    t = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        for idx in epoch_plan(len(train), batch_size, epoch=epoch, seed=seed):
            b = train.batch(idx)
            logits = model(b["ids"].to(device), b["attention_mask"].to(device))
            loss = F.binary_cross_entropy_with_logits(logits, b["labels"].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, len(test), 256):
                b = test.batch(np.arange(s, min(len(test), s + 256)))
                p = model(b["ids"].to(device), b["attention_mask"].to(device)) > 0
                correct += int((p.cpu() == (b["labels"] > 0.5)).sum())
        accs.append(correct / len(test))
        log(f"  plain epoch {epoch + 1}: test accuracy {accs[-1]:.4f}")
    sync(device)
    return {"test_accuracy_per_epoch": accs, "test_accuracy": accs[-1], "wall_seconds": time.perf_counter() - t}


def plain_lm_throughput(model, data: LMData, *, batch_size, steps, warmup, lr, device):
    plain_mode(device)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, foreach=False)
    plan, epoch = [], 0    # warmup + steps batches, over as many epochs as that takes (each timed step is counted)
    while len(plan) < warmup + steps:
        more = epoch_plan(len(data), batch_size, epoch=epoch, seed=0)
        if not more:
            raise ValueError(f"{len(data)} sequences make no batch of {batch_size}")
        plan, epoch = plan + more, epoch + 1
    t = None
    for i, idx in enumerate(plan[: warmup + steps]):
        if i == warmup:
            sync(device)
            t = time.perf_counter()
        b = data.batch(idx)
        _, loss = model(b["ids"].to(device), b["targets"].to(device))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sync(device)
    dt = time.perf_counter() - t
    return {"tokens_per_s": steps * batch_size * data.seq_len / dt, "steps": steps, "seconds": dt,
            "final_loss": loss.item()}


def warm_up_classifier(mcfg, train, test, device):
    """One-off CUDA costs (context, cuBLAS handles, kernels for each padded length) paid before
    any timed run, so the engine and the plain loop are timed alike."""
    if device.type != "cuda":
        return
    t = time.perf_counter()
    model = TransformerClassifier(mcfg).to(device)
    task = ClassificationTask(train, {"test": test})
    for autocast in (contextlib.nullcontext, lambda: torch.autocast("cuda", dtype=torch.bfloat16)):
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for idx in epoch_plan(len(train), 64, epoch=99)[:20]:
                b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in train.batch(idx).items()}
                with autocast():
                    loss = task.loss(model, b)
                loss.backward()
            task.predict(model, test, device, autocast)
    sync(device)
    log(f"warm-up {time.perf_counter() - t:.1f}s")


# -- parts ----------------------------------------------------------------------------------------

def part_seed(data, args, device):
    S = args.sizes
    out = {}
    train = ClassificationData(data["train"], data["train_labels"], max_len=S["seed_len"])
    test = ClassificationData(data["test"], data["test_labels"], max_len=S["seed_len"])
    mcfg = seed_classifier_config(vocab_size=30_000, **S["seed_model"])

    warm_up_classifier(mcfg, train, test, device)
    seed_everything(0)
    model = TransformerClassifier(mcfg)
    t = time.perf_counter()
    res = Trainer(model, ClassificationTask(train, {"test": test}),
                  seed_train_config(epochs=S["seed_epochs"], progress=False, precision="auto", compile=False),
                  out_dir=args.runs / "seed_engine").fit()
    wall = time.perf_counter() - t
    accs = [h["eval"]["test"]["accuracy"] for h in res["history"]]
    out["engine"] = {"test_accuracy": accs[-1], "test_accuracy_per_epoch": accs, "wall_seconds": wall,
                     "steady_tokens_per_s": res["summary"]["steady_tokens_per_s"], "bf16": res["summary"]["bf16"]}
    log(f"seed classifier, engine: test accuracy {accs[-1]:.4f} in {wall:.1f}s")

    seed_everything(0)
    model = TransformerClassifier(mcfg)
    out["plain_fp32"] = plain_classifier(model, train, test, epochs=S["seed_epochs"], batch_size=64, lr=2e-4, wd=0.01,
                                         seed=0, device=device)
    log(f"seed classifier, plain fp32: test accuracy {out['plain_fp32']['test_accuracy']:.4f} in "
        f"{out['plain_fp32']['wall_seconds']:.1f}s")
    out["seed_paper_accuracy"] = 0.8618
    return out


def fit_compile_or_eager(build, cfg, out_dir: Path, what: str):
    """Train ``build()``'s fresh ``(model, task)`` under ``cfg``. If that fails with ``cfg.compile``
    on (e.g. no compiler for torch.compile on this machine), log it and train a fresh ``build()``
    without compile in ``<out_dir>_nocompile``: the row pays a retry, not the whole part.
    Returns ``(model, result, seconds)``, the seconds of the fit that finished (building the model
    not included); ``cfg.compile`` then says which ran."""
    model, task = build()
    t = time.perf_counter()
    try:
        res = Trainer(model, task, cfg, out_dir=out_dir).fit()
    except Exception:
        if not cfg.compile:
            raise
        traceback.print_exc()
        log(f"{what} with compile failed; retrying without compile")
        cfg.compile = False
        model, task = build()
        t = time.perf_counter()
        res = Trainer(model, task, cfg, out_dir=out_dir.with_name(out_dir.name + "_nocompile")).fit()
    return model, res, time.perf_counter() - t


def part_lm(data, args, device):
    S = args.sizes
    out = {}
    stream_docs = concat(data["train"], data["unsup"])
    lm_cfg = LMConfig(vocab_size=30_000, **S["lm_model"])
    train = LMData(stream_docs, seq_len=lm_cfg.max_len)
    test_stream = LMData(data["test"], seq_len=lm_cfg.max_len)
    B = S["lm_batch"]

    # engine: bf16 + compile + fused AdamW, full epoch(s)
    def build():
        seed_everything(0)
        return TransformerLM(lm_cfg), LMTask(train, {"test": test_stream}, max_eval_sequences=512)

    cfg = lm_train_config(epochs=S["lm_epochs"], batch_size=B, compile=S["compile"], progress=False,
                          warmup_steps=S["lm_warmup"], max_steps=S["max_steps"])
    lm, res, wall = fit_compile_or_eager(build, cfg, args.runs / "lm4", "engine run")
    fpt = lm.flops_per_token(lm_cfg.max_len)
    tps = res["summary"]["steady_tokens_per_s"]
    out["engine"] = {"tokens_per_s": tps, "mfu": tps * fpt / H100_BF16_PEAK, "compile": cfg.compile,
                     "batch_size": B, "seq_len": lm_cfg.max_len, "flops_per_token": fpt, "n_params_matmul": lm.n_params(),
                     "train_wall_seconds": wall, "epochs": S["lm_epochs"], "tokens": res["summary"]["tokens"],
                     "history": res["history"]}
    log(f"LM engine: {tps:,.0f} tokens/s, MFU {out['engine']['mfu']:.3f} (N={lm.n_params():,}, "
        f"{fpt / 1e6:.1f} MFLOP/token), trained {wall:.1f}s")

    t = time.perf_counter()
    rep = evaluate_lm(lm, data["test"], unk_id=1, batch_size=S["eval_batch"], max_predictions=S["max_predictions"])
    out["engine"]["test_next_token"] = rep.as_dict()
    out["engine"]["eval_seconds"] = time.perf_counter() - t
    log(f"LM test (shared metric): ppl {rep.perplexity:.2f} top1 {rep.top1_accuracy:.4f} top10 "
        f"{rep.top10_accuracy:.4f} over {rep.n_predictions:,} predictions ({out['engine']['eval_seconds']:.1f}s)")
    del lm
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # plain fp32 baseline, same model and batch
    seed_everything(0)
    lm = TransformerLM(lm_cfg)
    out["plain_fp32"] = plain_lm_throughput(lm, train, batch_size=B, steps=S["plain_steps"], warmup=3, lr=1e-3,
                                            device=device)
    out["plain_fp32"]["mfu"] = out["plain_fp32"]["tokens_per_s"] * fpt / H100_BF16_PEAK
    log(f"LM plain fp32: {out['plain_fp32']['tokens_per_s']:,.0f} tokens/s, MFU {out['plain_fp32']['mfu']:.3f}")
    del lm
    torch.backends.cuda.matmul.allow_tf32 = True

    # the projection-matched one-layer attention-only LM
    seed_everything(0)
    acfg = AttentionOnlyConfig(vocab_size=30_000, **S["attn_only"])
    am = ProjectionMatchedLM(acfg)
    t = time.perf_counter()
    res = Trainer(am, LMTask(LMData(stream_docs, seq_len=acfg.max_len),
                             {"test": LMData(data["test"], seq_len=acfg.max_len)}, max_eval_sequences=512),
                  lm_train_config(epochs=1, batch_size=B, lr=3e-3, progress=False, warmup_steps=S["lm_warmup"],
                                  max_steps=S["max_steps"]),
                  out_dir=args.runs / "attn_only").fit()
    wall = time.perf_counter() - t
    rep = evaluate_lm(am, data["test"], unk_id=1, batch_size=S["eval_batch"], max_predictions=S["max_predictions"])
    out["attention_only"] = {"config": acfg.to_dict(), "train_wall_seconds": wall, "test_next_token": rep.as_dict(),
                             "tokens_per_s": res["summary"]["steady_tokens_per_s"]}
    log(f"attention-only LM test: ppl {rep.perplexity:.2f} top1 {rep.top1_accuracy:.4f} top10 "
        f"{rep.top10_accuracy:.4f} (trained {wall:.1f}s)")
    return out


def part_seedvar(data, args, device):
    """The seed recipe again with other seeds (engine only): the spread of the faithful figure."""
    S = args.sizes
    train = ClassificationData(data["train"], data["train_labels"], max_len=S["seed_len"])
    test = ClassificationData(data["test"], data["test_labels"], max_len=S["seed_len"])
    mcfg = seed_classifier_config(vocab_size=30_000, **S["seed_model"])
    warm_up_classifier(mcfg, train, test, device)
    out = {"runs": []}
    for seed in S["extra_seeds"]:
        seed_everything(seed)
        model = TransformerClassifier(mcfg)
        t = time.perf_counter()
        res = Trainer(model, ClassificationTask(train, {"test": test}),
                      seed_train_config(epochs=S["seed_epochs"], seed=seed, progress=False),
                      out_dir=args.runs / f"seed_engine_s{seed}").fit()
        acc = res["history"][-1]["eval"]["test"]["accuracy"]
        out["runs"].append({"seed": seed, "test_accuracy": acc, "wall_seconds": time.perf_counter() - t})
        log(f"seed classifier, engine, seed {seed}: test accuracy {acc:.4f}")
        write_json(args.out / "seedvar_partial.json", out)     # a call cut at its time limit keeps these runs
    return out


def seed_splits(n: int) -> dict:
    """The splits ``seedsplit`` can run, as (n_train, n_test) of ``n`` labelled reviews; the
    movie-disjoint one's test side is whole movies, so it holds at least n_test reviews."""
    return {"random_25k_25k": (n // 2, n // 2), "random_40k_10k": (n * 4 // 5, n // 5),
            "movie_disjoint_40k_10k": (n * 4 // 5, n // 5)}


def check_movies(data, splits):
    """Refuse a movie-disjoint split on prepared arrays that lack each review's movie."""
    for name in splits:
        if name.startswith("movie_disjoint") and (data.get("train_movies") is None or data.get("test_movies") is None):
            raise ValueError(f"split {name!r} needs each review's movie, which these prepared arrays lack "
                             f"(made before train_movies/test_movies); rebuild them with benchmarks/prepare_imdb.py")


def part_seedsplit(data, args, device):
    """The seed recipe on random splits of the 50k labelled reviews, as the seed's Kaggle copy of
    IMDB is usually split (reviews of one movie on both sides), beside the official split: how
    much of the gap to 86.18 % the split itself explains. Not a substitute for the official figure.
    ``movie_disjoint_40k_10k`` keeps the 40k/10k sizes but holds out whole movies, as the official
    split does: it tells the training set's size from the movies both sides share."""
    S = args.sizes
    docs = concat(data["train"], data["test"])
    y = np.concatenate([data["train_labels"], data["test_labels"]])
    perm = np.random.default_rng(42).permutation(len(y))
    mcfg = seed_classifier_config(vocab_size=30_000, **S["seed_model"])
    out = {"runs": [], "vocab_from": data["vocab_from"], "tokenizer": data["tokenizer"]}
    splits = seed_splits(len(y))
    movies = None if data.get("train_movies") is None or data.get("test_movies") is None else \
        np.concatenate([data["train_movies"], data["test_movies"]])
    for name in S["seedsplit_splits"]:
        n_train, n_test = splits[name]
        if name.startswith("movie_disjoint"):        # whole movies at random (seed 42) until n_test reviews
            check_movies(data, [name])
            tr, te = movie_disjoint_split(movies, n_test, seed=42)
            n_train, n_test = len(tr), len(te)
        else:
            tr, te = np.sort(perm[:n_train]), np.sort(perm[len(y) - n_test:])
        # how many test reviews are about a movie some training review covers (official split: 0.1 %)
        shared = None if movies is None else float(np.isin(movies[te], movies[tr]).mean())
        if shared is not None:
            log(f"{name}: {n_train:,} train, {n_test:,} test reviews; {shared:.1%} of the test reviews are about "
                f"a movie the training reviews cover")
        train = ClassificationData(docs.take(tr), y[tr], max_len=S["seed_len"])
        test = ClassificationData(docs.take(te), y[te], max_len=S["seed_len"])
        if not out["runs"]:
            warm_up_classifier(mcfg, train, test, device)
        for seed in S["seedsplit_seeds"]:       # the model's seed; the split stays the seed-42 shuffle
            seed_everything(seed)
            t = time.perf_counter()
            res = Trainer(TransformerClassifier(mcfg), ClassificationTask(train, {"test": test}),
                          seed_train_config(epochs=S["seed_epochs"], seed=seed, progress=False),
                          out_dir=args.runs / (f"seedsplit_{name}" + (f"_s{seed}" if seed else ""))).fit()
            accs = [h["eval"]["test"]["accuracy"] for h in res["history"]]
            out["runs"].append({"split": name, "seed": int(seed), "n_train": int(n_train), "n_test": int(n_test),
                                "test_reviews_whose_movie_is_in_train": shared, "test_accuracy": accs[-1], "test_accuracy_per_epoch": accs,
                                "wall_seconds": time.perf_counter() - t})
            log(f"seed classifier on a {name} split, seed {seed}: test accuracy {accs[-1]:.4f}")
            write_json(args.out / "seedsplit_partial.json", out)     # a call cut at its time limit keeps these runs
    return out


def part_mfu(data, args, device):
    """Throughput of the 4-layer d=512 LM at seq 256 under a few engine settings (short runs)."""
    S = args.sizes
    lm_cfg = LMConfig(vocab_size=30_000, **S["lm_model"])
    train = LMData(concat(data["train"], data["unsup"]), seq_len=lm_cfg.max_len)
    out = {"runs": []}
    for batch, mode in S["mfu_variants"]:
        seed_everything(0)
        lm = TransformerLM(lm_cfg)
        fpt = lm.flops_per_token(lm_cfg.max_len)
        cfg = lm_train_config(batch_size=batch, compile=mode, progress=False, warmup_steps=20,
                              max_steps=S["mfu_steps"])
        try:
            res = Trainer(lm, LMTask(train, {}), cfg).fit()
        except Exception as exc:
            traceback.print_exc()
            out["runs"].append({"batch_size": batch, "compile": mode, "error": repr(exc)[:300]})
            continue
        tps = res["summary"]["steady_tokens_per_s"] or float("nan")
        out["runs"].append({"batch_size": batch, "compile": mode, "tokens_per_s": tps,
                            "mfu": tps * fpt / H100_BF16_PEAK, "steps": res["summary"]["steps"]})
        log(f"LM engine batch {batch} compile={mode}: {tps:,.0f} tokens/s, MFU {tps * fpt / H100_BF16_PEAK:.3f}")
        del lm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def part_best(data, args, device):
    S = args.sizes
    out = {"rows": []}
    tr_idx, va_idx = train_val_split(len(data["train"]), S["n_val"])
    y = data["train_labels"]
    rows = out["rows"]

    def cls_data(max_len, truncation="head", pad_multiple=1, reverse=False):
        kw = dict(max_len=max_len, truncation=truncation, pad_multiple=pad_multiple)
        flip = (lambda r: r.reverse()) if reverse else (lambda r: r)    # a backward model reads right to left
        return (ClassificationData(flip(data["train"].take(tr_idx)), y[tr_idx], **kw),
                {"val": ClassificationData(flip(data["train"].take(va_idx)), y[va_idx], **kw),
                 "test": ClassificationData(flip(data["test"]), data["test_labels"], **kw)})

    picked_probs = {}      # row -> {"val", "test"}: the val-picked fine-tune's probabilities, for ensembles

    def finish(name, res, wall, extra=None):
        best = res["best"]
        row = {"name": name, "best_epoch": best["epoch"], "val_accuracy": best["eval"]["val"]["accuracy"],
               "test_accuracy_at_best_val": best["eval"]["test"]["accuracy"], "wall_seconds": wall,
               "test_accuracy_last_epoch": res["history"][-1]["eval"]["test"]["accuracy"]}
        row.update(extra or {})
        rows.append(row)
        log(f"[best] {name}: val {row['val_accuracy']:.4f} (epoch {row['best_epoch']}) → test "
            f"{row['test_accuracy_at_best_val']:.4f} ({wall:.1f}s)")
        write_json(args.out / "best_partial.json", out)

    def seed_arch_row(name, max_len, svd):
        seed_everything(0)
        model = TransformerClassifier(seed_classifier_config(vocab_size=30_000, **{**S["seed_model"], "max_len": max_len}))
        if svd:
            load_embeddings(model, svd_vectors(data, model.config.d_model, args.smoke))
        train, evals = cls_data(max_len, pad_multiple=S["pad_multiple"] if max_len > S["seed_len"] else 1)
        t = time.perf_counter()
        task = ClassificationTask(train, evals, length_grouping=S["grouping"] if max_len > 256 else 0)
        run_dir = args.runs / f"best_{name}"
        res = Trainer(model, task, seed_train_config(epochs=S["seed_epochs"], progress=False, select_on="val/accuracy",
                                                     save_best=True), out_dir=run_dir).fit()
        wall = time.perf_counter() - t
        picked_probs[name] = best_probs(model, run_dir, task, evals)      # for ensembles across calls
        save_probs(args.out / f"probs_{name}.npz", picked_probs[name], y[va_idx], data["test_labels"], va_idx)
        finish(name, res, wall)

    def best_probs(clf, run_dir, task, evals):
        """Val and test probabilities of a fine-tune's val-best weights (its ``best.pt``)."""
        load_model(run_dir / "best.pt", clf)
        clf.to(device)          # predict() runs it in eval mode
        auto = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        return {k: task.predict(clf, evals[k], device, auto) for k in ("val", "test")}

    def pretrained_row(name, svd, objective="causal", reverse=False):
        docs = concat(data["train"], data["unsup"])
        if reverse:                 # a right-to-left LM: every review's tokens in reverse order
            docs = docs.reverse()

        if objective == "mlm":      # one extra id, the [MASK] token; the classifier inherits it unused
            lm_cfg, epochs = MaskedLMConfig(vocab_size=30_001, **S["pre_model"]), S["mlm_epochs"]
        else:
            lm_cfg, epochs = LMConfig(vocab_size=30_000, **S["pre_model"]), S["pre_epochs"]

        def build():
            seed_everything(0)
            if objective == "mlm":
                lm = MaskedLM(lm_cfg)
                task = MaskedLMTask(MaskedLMData(docs, seq_len=lm_cfg.max_len, mask_id=lm_cfg.mask_token))
            else:
                lm = TransformerLM(lm_cfg)
                task = LMTask(LMData(docs, seq_len=lm_cfg.max_len), {})
            if svd:
                v = svd_vectors(data, lm_cfg.d_model, args.smoke)
                v = np.vstack([v, np.zeros((lm_cfg.vocab_size - len(v), v.shape[1]), v.dtype)])  # [MASK]: own init
                load_embeddings(lm, v)
            return lm, task

        pre_cfg = lm_train_config(epochs=epochs, batch_size=S["pre_batch"], lr=S["pre_lr"],
                                  warmup_steps=S["lm_warmup"], progress=False, max_steps=S["max_steps"],
                                  compile=S["compile"])
        lm, pre, t_pre = fit_compile_or_eager(build, pre_cfg, args.runs / f"pre_{name}", f"[best] pretraining {name}")
        log(f"[best] pretraining {name}: {t_pre:.1f}s, final train loss {pre['history'][-1]['train_loss']:.3f}, "
            f"{pre['summary']['steady_tokens_per_s']:,.0f} tokens/s")
        variants = S["ft_variants"] if args.variants else [dict(lr=lr) for lr in S["ft_lrs"]]
        if name.startswith("G"):
            variants, args.variants = S["ft_variants"], True
        tries, probs = [], []
        for i, v in enumerate(variants):  # fine-tuning settings chosen on val, never test
            v = {"lr": 1e-4, "epochs": S["ft_epochs"], "dropout": 0.1, "truncation": S["ft_truncation"], "seed": 0, **v}
            seed_everything(1 + v["seed"])
            clf = TransformerClassifier(classifier_from_lm(lm_cfg, dropout=v["dropout"]))
            clf.load_trunk(lm)
            train, evals = cls_data(lm_cfg.max_len, v["truncation"], S["pad_multiple"], reverse)
            task = ClassificationTask(train, evals, length_grouping=S["grouping"])
            t = time.perf_counter()
            run_dir = args.runs / f"ft_{name}_{i}"
            res = Trainer(clf, task, finetune_config(epochs=v["epochs"], lr=v["lr"], seed=v["seed"], progress=False,
                                                     select_on="val/accuracy", save_best=True),
                          out_dir=run_dir).fit()
            tries.append({"variant": v, "val": res["best"]["value"], "best_epoch": res["best"]["epoch"],
                          "test": res["best"]["eval"]["test"]["accuracy"], "res": res,
                          "seconds": time.perf_counter() - t, "run_dir": run_dir})
            log(f"[best] {name} fine-tune {v}: val {res['best']['value']:.4f} at epoch {res['best']['epoch']} "
                f"(test at that epoch {res['best']['eval']['test']['accuracy']:.4f})")
            if args.variants:            # the val-best weights, for the ensemble
                probs.append(best_probs(clf, run_dir, task, evals))
        pick = max(tries, key=lambda x: x["val"])
        pick_i = tries.index(pick)
        if probs:
            picked_probs[name] = probs[pick_i]
        else:
            _, evals = cls_data(lm_cfg.max_len, pick["variant"]["truncation"], S["pad_multiple"], reverse)
            clf = TransformerClassifier(classifier_from_lm(lm_cfg, dropout=pick["variant"]["dropout"]))
            picked_probs[name] = best_probs(clf, pick["run_dir"], ClassificationTask(evals["val"], evals), evals)
        save_probs(args.out / f"probs_{name}.npz", picked_probs[name], y[va_idx], data["test_labels"], va_idx)
        # the saved weights must give the accuracy the pick was made on (a check on best.pt)
        recomputed = float(((picked_probs[name]["val"] >= 0.5) == (y[va_idx] == 1)).mean())
        if abs(recomputed - pick["val"]) > 1e-9:
            log(f"[best] WARNING {name}: best.pt gives val {recomputed:.4f}, the run recorded {pick['val']:.4f}")
        t_ft = sum(x["seconds"] for x in tries)
        finish(name, pick["res"], t_pre + pick["seconds"],
               {"pretrain_seconds": t_pre, "finetune_seconds": pick["seconds"], "finetune_variant": pick["variant"],
                "finetune_tried": [{k: x[k] for k in ("variant", "val", "best_epoch", "test", "seconds")} for x in tries],
                "pretrain_final_loss": pre["history"][-1]["train_loss"],
                "pretrain_tokens_per_s": pre["summary"]["steady_tokens_per_s"], "pretrain_compile": pre_cfg.compile})
        args.variants = False
        if len(probs) > 1:
            _, evals = cls_data(lm_cfg.max_len, "head")
            acc = {k: float(((np.mean([p[k] for p in probs], axis=0) >= 0.5) == (evals[k].labels == 1)).mean())
                   for k in ("val", "test")}
            rows.append({"name": name + "_ensemble_of_all_variants", "val_accuracy": acc["val"],
                         "test_accuracy_at_best_val": acc["test"], "wall_seconds": t_pre + t_ft,
                         "members": len(probs)})
            log(f"[best] {name} ensemble of {len(probs)}: val {acc['val']:.4f} → test {acc['test']:.4f} "
                f"(pretrain + all fine-tunes {t_pre + t_ft:.1f}s)")
            write_json(args.out / "best_partial.json", out)

    plan = [("A_seed_recipe_256", lambda n: seed_arch_row(n, S["seed_len"], False)),
            ("B_ppmi_svd_init_256", lambda n: seed_arch_row(n, S["seed_len"], True)),
            ("C_context_512", lambda n: seed_arch_row(n, S["long_len"], False)),
            ("D_ppmi_svd_init_512", lambda n: seed_arch_row(n, S["long_len"], True)),
            ("F_causal_pretrain_svd_init_512", lambda n: pretrained_row(n, True)),
            ("G_causal_pretrain_svd_init_512_finetune_variants", lambda n: pretrained_row(n, True)),
            ("E_causal_pretrain_random_init_512", lambda n: pretrained_row(n, False)),
            ("H_mlm_pretrain_svd_init_512", lambda n: pretrained_row(n, True, "mlm")),
            ("I_backward_causal_pretrain_svd_init_512", lambda n: pretrained_row(n, True, reverse=True))]
    only = set(args.rows.split(",")) if args.rows else None
    warm_train, warm_evals = cls_data(S["seed_len"])
    warm_up_classifier(seed_classifier_config(vocab_size=30_000, **S["seed_model"]), warm_train, warm_evals["val"], device)
    for name, fn in plan:
        if only and name.split("_")[0] not in only:
            continue
        if time.perf_counter() - T0 > args.budget_s:
            rows.append({"name": name, "skipped": f"time budget {args.budget_s}s reached"})
            log(f"[best] {name}: skipped (budget)")
            continue
        fn(name)
    fwd = next((k for k in picked_probs if k[0] in "FG"), None)
    bwd = next((k for k in picked_probs if k.startswith("I_")), None)
    if fwd and bwd:                  # ULMFiT's forward + backward ensemble: mean probability, a fixed recipe
        labels = {"val": y[va_idx], "test": data["test_labels"]}
        acc = {k: float(((np.mean([picked_probs[fwd][k], picked_probs[bwd][k]], axis=0) >= 0.5)
                         == (labels[k] == 1)).mean()) for k in ("val", "test")}
        members = [r for r in rows if r["name"] in (fwd, bwd)]
        rows.append({"name": "FI_bidirectional_ensemble", "members": [fwd, bwd], "val_accuracy": acc["val"],
                     "test_accuracy_at_best_val": acc["test"],
                     "wall_seconds": sum(r["wall_seconds"] for r in members)})
        log(f"[best] forward + backward ensemble ({fwd} + {bwd}): val {acc['val']:.4f} → test {acc['test']:.4f}")
        write_json(args.out / "best_partial.json", out)
    done = [r for r in rows if "val_accuracy" in r]
    if done:
        pick = max(done, key=lambda r: r["val_accuracy"])
        out["selected_by_val"] = pick
    return out


SIZES = {
    "full": dict(seed_len=256, long_len=512, seed_epochs=5, seed_model={}, n_val=2500, grouping=20,
                 lm_model=dict(d_model=512, n_layers=4, n_heads=8, max_len=256), lm_batch=128, lm_epochs=2, lm_warmup=200,
                 plain_steps=30, compile=True, eval_batch=64,
                 attn_only=dict(d_model=256, n_heads=1, max_len=256, positional="none"),
                 pre_model=dict(d_model=512, n_layers=4, n_heads=8, max_len=512, dropout=0.1),
                 pre_batch=64, pre_epochs=6, mlm_epochs=10, pre_lr=1e-3, ft_epochs=4, ft_lrs=(1e-4, 3e-4), ft_truncation="head",
                 max_steps=None, max_predictions=None, extra_seeds=(1, 2), mfu_steps=150, pad_multiple=32,
                 seedsplit_splits=("random_25k_25k", "random_40k_10k", "movie_disjoint_40k_10k"), seedsplit_seeds=(0,),
                 ft_variants=(dict(lr=5e-5, epochs=3, truncation="head+tail"),
                              dict(lr=1e-4, epochs=2, dropout=0.2, truncation="head+tail", seed=1),
                              dict(lr=1e-4, epochs=3, seed=2)),
                 mfu_variants=((256, True), (512, True), (768, True))),
    "smoke": dict(seed_len=32, long_len=48, seed_epochs=2, seed_model=dict(d_model=32, d_ff=64, head_hidden=16),
                  n_val=60, grouping=4,
                  lm_model=dict(d_model=32, n_layers=2, n_heads=4, max_len=32), lm_batch=16, lm_epochs=1, lm_warmup=5,
                  plain_steps=3, compile=False, eval_batch=16,
                  attn_only=dict(d_model=16, n_heads=1, max_len=32, positional="none"),
                  pre_model=dict(d_model=32, n_layers=1, n_heads=4, d_ff=64, max_len=48, dropout=0.1),
                  pre_batch=16, pre_epochs=1, mlm_epochs=1, pre_lr=1e-3, ft_epochs=1, ft_lrs=(1e-4, 3e-4), ft_truncation="head",
                  max_steps=12, max_predictions=2000, extra_seeds=(1,), mfu_steps=6, mfu_variants=((16, False),),
                  seedsplit_splits=("random_25k_25k", "random_40k_10k", "movie_disjoint_40k_10k"), seedsplit_seeds=(0,),
                  pad_multiple=8, ft_variants=(dict(lr=5e-5, epochs=1, truncation="head+tail"), dict(lr=1e-4, epochs=1))),
}


PARTS = {"seed": part_seed, "lm": part_lm, "mfu": part_mfu, "best": part_best, "seedvar": part_seedvar,
         "seedsplit": part_seedsplit}           # in the order --part all runs them
ROW_LETTERS = tuple("ABCDEFGHI")               # part_best's rows, by the letter their names start with


def parse_overrides(items: list[str], sizes: dict) -> dict:
    """``["pre_epochs=12", ...]`` → ``{"pre_epochs": 12}``: known keys only, JSON values of the
    same kind as the default (lists stand for tuples)."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in sizes:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(sizes))}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise SystemExit(f"--set {item!r}: the value must be JSON (e.g. 12, 1e-3, true, [256, true])") from None
        default = sizes[key]
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        kinds = (int, float) if isinstance(default, float) else type(default)
        if key == "compile":            # True/False or a torch.compile mode
            kinds = (bool, str)
        if default is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and kinds is int)):
            raise SystemExit(f"--set {item!r}: {key} takes a {type(default).__name__} like {default!r}")
        out[key] = value
    unknown = [n for n in out.get("seedsplit_splits", ()) if n not in seed_splits(2)]
    if unknown:
        raise SystemExit(f"--set seedsplit_splits: unknown split(s) {unknown}; known: {sorted(seed_splits(2))}")
    for key in ("seedsplit_seeds", "extra_seeds"):
        seeds = out.get(key, ())
        if any(type(v) is not int or v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
            # each seed has its own run directory, which resumes: a repeated seed would not train again
            raise SystemExit(f"--set {key}: {list(seeds)} must be distinct non-negative integers, e.g. [0, 1, 2]")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", help="seed, lm, best, mfu, seedvar, seedsplit, or a comma list; "
                                                  "default all")
    ap.add_argument("--out", default="runs/bench_models")
    ap.add_argument("--runs", default="", help="checkpoints and per-run metrics (default OUT/runs)")
    ap.add_argument("--prep", default=None, help=f"prepared arrays (benchmarks/prepare_imdb.py); default {DEFAULT_PREP}, "
                                                 "built from the IMDB corpus when that file is absent")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check the code paths on a CPU")
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip remaining 'best' rows after this many seconds")
    ap.add_argument("--variants", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default="", help="only these ablation rows (letters, e.g. A,B,F)")
    ap.add_argument("--resume", action="store_true",
                    help="keep RUNS and resume its checkpoints (a long CPU run cut short); by default RUNS is "
                         "emptied so that every figure, wall times included, comes from a fresh run. With "
                         "--resume a part's wall time counts only this invocation, and info says so")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override one size of the profile, e.g. --set pre_epochs=12 (repeatable; recorded in info)")
    args = ap.parse_args()
    parts = list(PARTS) if args.part == "all" else args.part.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:             # refused now: a KeyError once came only after the parts before it had run
        raise SystemExit(f"--part: unknown part(s) {unknown}; known: {', '.join(PARTS)} (a comma list) or all")
    if args.prep is not None and not Path(args.prep).is_file():
        # it fell back to building the arrays from the corpus: no archive there gave "IMDB archive not
        # found" without naming this path; with one, minutes spent on 256-d vectors
        raise SystemExit(f"--prep {args.prep}: no such file; make it with `python benchmarks/prepare_imdb.py --out "
                         f"{args.prep}` (carry its folder to the device machine), or leave --prep out")
    args.prep = args.prep or DEFAULT_PREP
    unknown = [r for r in args.rows.split(",") if r not in ROW_LETTERS] if args.rows else []
    if unknown:             # an unknown letter ran no row, silently
        raise SystemExit(f"--rows: unknown row(s) {unknown}; rows are letters A-I, comma-separated (e.g. F,I)")
    args.out = Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs = Path(args.runs) if args.runs else args.out / "runs"
    if not args.resume:
        shutil.rmtree(args.runs, ignore_errors=True)  # figures come from fresh runs, never resumed ones
    args.sizes = SIZES["smoke" if args.smoke else "full"]
    overrides = parse_overrides(args.set, args.sizes)
    args.sizes = {**args.sizes, **overrides}
    device = pick_device()
    info = {"device": str(device), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None, "smoke": args.smoke,
            "overrides": overrides,
            "resumed_from": sorted(c.parent.name for c in args.runs.glob("*/checkpoint.pt")) if args.resume else []}
    log(json.dumps(info))
    data = load_data(args.prep, args.smoke, with_svd="best" in parts)
    info["vocab_from"], info["tokenizer"] = data["vocab_from"], data["tokenizer"]
    if "seedsplit" in parts:            # refused now, not after the parts before it have trained
        check_movies(data, args.sizes["seedsplit_splits"])
    for part in parts:
        fn = PARTS[part]
        t = time.perf_counter()
        result = fn(data, args, device)
        result["part_wall_seconds"] = time.perf_counter() - t
        result["info"] = info
        write_json(args.out / f"{part}.json", result)
        for m in args.runs.glob("*/metrics.json"):       # per-run histories beside the figures
            shutil.copy(m, args.out / f"metrics_{m.parent.name}.json")
        log(f"part {part} done in {result['part_wall_seconds']:.1f}s -> {args.out / (part + '.json')}")


if __name__ == "__main__":
    main()
