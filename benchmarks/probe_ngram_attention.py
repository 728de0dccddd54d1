"""Does learned attention over n-gram positions beat uniform pooling of their NB evidence? (CPU, val only)

A lever towards issue 4's better classifier that fits a 2-core CPU, where the transformer rows do
not (row B: 66 min; row F's self-pretraining: hours). Each review position t carries the unigram
ending there and the bigram ending there; its value is the sum of their naive-Bayes log-count
ratios (Wang & Manning's r, α = 1, binarized per review, counted on the training reviews only),
trainable and initialised at r. The classifier is

    logit = c · Σ_t a_t v_t + b,   a = softmax over the review's positions of a score s_t,

with s_t from (``--variants``):

* ``uniform``: s = 0, so a is uniform (mean pooling of the NB evidence; no attention);
* ``pool``: a learned query on PPMI-SVD-initialised token embeddings plus learned positions
  (attention pooling); variants freeze the values, drop positions, decay weights, or freeze the
  embeddings (so that the score is a linear read of the co-occurrence vectors);
* ``self``: the same after one 4-head self-attention layer (``F.scaled_dot_product_attention``).

Reviews keep their first quarter and last three quarters of ``--max-len`` tokens. Epochs are picked
on the 2,500 (``--n-val``) validation reviews ``bench_models.py`` holds out (``default_rng(0)``); the test reviews
are never scored here, so nothing is selected on them. Prints one line per epoch and a table.

    python benchmarks/probe_ngram_attention.py --prep .gpu/prep/imdb_prep.npz     # 4:51 on 2 cores
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy import sparse

T0 = time.perf_counter()

# name: (attention, options); every variant trains its values at 1e-2 unless it freezes them
VARIANTS = {
    "uniform": ("none", {}),
    "pool": ("pool", {"lr": 2e-3}),
    "pool_frozen_values": ("pool", {"lr": 1e-3, "train_values": False}),
    "pool_frozen_values_pdrop0.3": ("pool", {"lr": 1e-3, "train_values": False, "pdrop": 0.3}),
    "pool_pdrop0.5": ("pool", {"lr": 1e-3, "pdrop": 0.5}),
    "pool_wd0.1": ("pool", {"lr": 3e-4, "wd": 0.1}),
    "pool_frozen_emb": ("pool", {"lr": 1e-3, "freeze_emb": True}),
    "pool_frozen_emb_d256": ("pool", {"lr": 1e-3, "freeze_emb": True, "d": 256}),
    "self": ("self", {"lr": 2e-3}),
}


def log(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def bigram_codes(ids: np.ndarray, starts: np.ndarray, V: int) -> np.ndarray:
    """The code of the bigram ending at each token (-1: at a review's start, or touching <pad>/<unk>)."""
    prev = np.concatenate([[0], ids[:-1]])
    code = prev * V + ids
    ok = (prev > 1) & (ids > 1)
    ok[starts] = False
    return np.where(ok, code, -1)


def nb_ratio(doc: np.ndarray, feat: np.ndarray, n_feat: int, y: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """log((p/|p|₁) / (q/|q|₁)) over binarized per-review indicators (feat < 0: none)."""
    keep = feat >= 0
    X = sparse.csr_matrix((np.ones(keep.sum(), np.float32), (doc[keep], feat[keep])), shape=(len(y), n_feat))
    X.data[:] = 1.0                                   # duplicates were summed: binarize
    p = alpha + np.asarray(X[y == 1].sum(0)).ravel()
    q = alpha + np.asarray(X[y == 0].sum(0)).ravel()
    return np.log((p / p.sum()) / (q / q.sum())).astype(np.float32)


def load(prep: str, max_len: int, n_val: int = 2500):
    z = np.load(prep)
    V = len(str(z["words"]).split("\n"))
    ids = z["train_ids"].astype(np.int64)
    off = z["train_offsets"]
    y = z["train_labels"].astype(np.int64)
    if not 0 < n_val < len(y):
        raise ValueError(f"n_val={n_val}: expected 1 to {len(y) - 1} (the file holds {len(y)} train reviews)")
    perm = np.random.default_rng(0).permutation(len(y))          # bench_models.train_val_split(n, n_val)
    tr, va = np.sort(perm[n_val:]), np.sort(perm[:n_val])
    lengths = np.diff(off)
    doc = np.repeat(np.arange(len(y)), lengths)
    bc = bigram_codes(ids, off[:-1][lengths > 0], V)
    m = np.isin(doc, tr)                                             # tokens of the training reviews
    vocab_bi = np.unique(bc[m & (bc >= 0)])
    pos = np.minimum(np.searchsorted(vocab_bi, bc), len(vocab_bi) - 1)
    bi = np.where((bc >= 0) & (vocab_bi[pos] == bc), pos + 1, 0)      # 0: no bigram feature
    rank = np.full(len(y), -1)
    rank[tr] = np.arange(len(tr))                                    # a training review's row in the NB counts
    r_uni = nb_ratio(rank[doc[m]], np.where(ids[m] > 1, ids[m], -1), V, y[tr])
    r_uni[:2] = 0.0
    r_bi = np.concatenate([[0.0], nb_ratio(rank[doc[m]], bi[m] - 1, len(vocab_bi), y[tr])]).astype(np.float32)
    # head (a quarter) + tail of each review, as index arrays into the token stream
    h = max_len // 4
    rows = []
    for i in range(len(y)):
        a, b = off[i], off[i + 1]
        rows.append(np.arange(a, b) if b - a <= max_len else
                    np.concatenate([np.arange(a, a + h), np.arange(b - (max_len - h), b)]))
    svd = z["svd"].astype(np.float32) if "svd" in z.files else None
    log(f"{len(vocab_bi):,} training bigrams; NB ratios from {len(tr):,} reviews")
    return dict(ids=ids, bi=bi, rows=rows, y=y, tr=tr, va=va, r_uni=r_uni, r_bi=r_bi, V=V, svd=svd)


class NgramAttention(nn.Module):
    def __init__(self, D, attn, d=64, max_len=1024, freeze_emb=False):
        super().__init__()
        self.attn = attn
        # copies: from_pretrained trains the tensor it is given, and from_numpy's shares the arrays' memory
        self.r_uni = nn.Embedding.from_pretrained(torch.tensor(D["r_uni"])[:, None], freeze=False)
        self.r_bi = nn.Embedding.from_pretrained(torch.tensor(D["r_bi"])[:, None], freeze=False)
        self.scale, self.bias = nn.Parameter(torch.tensor(1.0)), nn.Parameter(torch.tensor(0.0))
        if attn == "none":
            return
        self.emb = nn.Embedding(D["V"], d, padding_idx=0)
        if D["svd"] is not None:
            if D["svd"].shape[1] < d:
                raise ValueError(f"the prepared PPMI-SVD vectors have {D['svd'].shape[1]} dims, the variant d={d}; "
                                 "run benchmarks/prepare_imdb.py --svd-dim 256 (its default)")
            sv = D["svd"][:, :d]
            n = np.linalg.norm(sv, axis=1, keepdims=True)
            self.emb.weight.data.copy_(torch.from_numpy(np.divide(sv, n, out=np.zeros_like(sv), where=n > 0)) * d ** 0.5)
        self.emb.weight.requires_grad_(not freeze_emb)
        self.pos = nn.Embedding(max_len, d)
        nn.init.normal_(self.pos.weight, std=0.02)
        if attn == "self":
            self.qkv, self.out, self.ln = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)
        self.score = nn.Linear(d, 1)
        nn.init.zeros_(self.score.weight)          # starts as uniform pooling
        nn.init.zeros_(self.score.bias)

    def forward(self, u, b, mask):
        v = (self.r_uni(u) + self.r_bi(b)).squeeze(-1)
        if self.attn == "none":
            s = torch.zeros_like(v)
        else:
            x = self.emb(u) + self.pos(torch.arange(u.shape[1]))
            if self.attn == "self":
                B, L, d = x.shape
                q, k, w = self.qkv(x).view(B, L, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
                h = F.scaled_dot_product_attention(q, k, w, attn_mask=mask[:, None, None, :])
                x = self.ln(x + self.out(h.transpose(1, 2).reshape(B, L, d)))
            s = self.score(x).squeeze(-1)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        return self.scale * (a * v).sum(-1) + self.bias


def batches(D, docs, batch, rng=None):
    """Length-sorted batches (shuffled as chunks when ``rng``)."""
    lengths = np.array([len(D["rows"][i]) for i in docs])
    order = np.argsort(lengths, kind="stable")
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    if rng is not None:
        rng.shuffle(chunks)
    for ch in chunks:
        L = max(1, lengths[ch].max())
        u = np.zeros((len(ch), L), np.int64)
        b = np.zeros((len(ch), L), np.int64)
        for j, k in enumerate(ch):
            r = D["rows"][docs[k]]
            u[j, :len(r)], b[j, :len(r)] = D["ids"][r], D["bi"][r]
        u, b = torch.from_numpy(u), torch.from_numpy(b)
        yield ch, u, b, u > 0


def accuracy(model, D, docs):
    model.eval()
    logits = np.zeros(len(docs), np.float32)
    with torch.no_grad():
        for ch, u, b, m in batches(D, docs, 256):
            logits[ch] = model(u, b, m).numpy()
    return float(((logits > 0) == D["y"][docs]).mean())


def run_variant(D, name, epochs, max_len, seed):
    attn, o = VARIANTS[name]
    torch.manual_seed(seed)
    model = NgramAttention(D, attn, d=o.get("d", 64), max_len=max_len, freeze_emb=o.get("freeze_emb", False))
    values = [model.r_uni.weight, model.r_bi.weight]
    rest = [p for n, p in model.named_parameters() if not n.startswith("r_") and p.requires_grad]
    groups = [{"params": rest, "lr": o.get("lr", 1e-2), "weight_decay": o.get("wd", 0.0)}]
    if o.get("train_values", True):
        groups.append({"params": values, "lr": 1e-2, "weight_decay": 0.0})
    else:
        for p in values:
            p.requires_grad_(False)
    opt = torch.optim.AdamW(groups)
    rng = np.random.default_rng(seed)
    curve = [accuracy(model, D, D["va"])]
    pdrop = o.get("pdrop", 0.0)
    for epoch in range(1, epochs + 1):
        model.train()
        t = time.perf_counter()
        for ch, u, b, m in batches(D, D["tr"], 64, rng):
            if pdrop:
                m = m & (torch.rand(m.shape) >= pdrop)
                m[:, 0] |= u[:, 0] > 0          # never a review with no position left
            y = torch.from_numpy(D["y"][D["tr"][ch]]).float()
            loss = F.binary_cross_entropy_with_logits(model(u, b, m), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        curve.append(accuracy(model, D, D["va"]))
        log(f"{name}: epoch {epoch} val {curve[-1]:.4f} ({time.perf_counter() - t:.1f}s)")
    best = int(np.argmax(curve))
    return {"variant": name, "val_by_epoch": curve, "best_epoch": best, "best_val": curve[best]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prep", default=".gpu/prep/imdb_prep.npz", help="benchmarks/prepare_imdb.py's arrays")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of: {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--n-val", type=int, default=2500, help="validation reviews held out of train (default 2500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        ap.error(f"--variants {args.variants!r}: unknown {unknown or 'none given'}; allowed: {', '.join(VARIANTS)}")
    if args.epochs < 1 or args.max_len < 8:
        ap.error(f"--epochs {args.epochs} / --max-len {args.max_len}: need epochs >= 1 and max-len >= 8")
    if not Path(args.prep).is_file():
        ap.error(f"--prep {args.prep}: no such file; run benchmarks/prepare_imdb.py --out {args.prep}")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    try:
        D = load(args.prep, args.max_len, args.n_val)
    except ValueError as exc:
        ap.error(str(exc))
    results = [run_variant(D, n, args.epochs, args.max_len, args.seed) for n in names]
    print(f"\n{'variant':30s} {'epoch 0':>8s} {'best val':>9s} {'at epoch':>9s}")
    for r in results:
        print(f"{r['variant']:30s} {r['val_by_epoch'][0]:8.4f} {r['best_val']:9.4f} {r['best_epoch']:9d}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
