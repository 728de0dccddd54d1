"""The compare's projection rows on the CPU: reused buffers and numba kernels against the torch
path they replaced, in one process, on the same IMDB statistics and reviews.

``python -m distattn.compare`` scores each projection row with ``distattn.projection.device_scorers``:
per batch of documents it forms the dense profile rows S[ids] (b, L, V), their causal sums, and
the evidence e_t of every prediction, then log p and the rank of each target. On the GPU the
caching allocator reuses those blocks. On the CPU the previous path allocated each one fresh,
and scattered S[ids] through index arrays of one int64 per stored entry: the kernel then spent
more time zeroing new pages (system time) than torch spent computing. The new path writes
S[ids] with a numba kernel into buffers it reuses (``Workspace``) and scores each row in one
numba pass (``_score_block``).

For each symmetric row (raw counts, PPMI + Norm, PPMI + softmax) both paths fit τ on the
validation reviews and score the test reviews, as the compare's projection stage does, and the
script prints wall, user and system seconds, the perplexities and the largest |Δ log p|. The
n-gram rows (``kn2``, ``kn3``) give a (positions, V) block of log-probabilities per review;
their reference scores CPU tensors with torch (``_score_block_torch``), the new path with the
numba kernel.

    python benchmarks/bench_device_scorers.py                  # 100 test reviews, the full profile's 30k words
    python benchmarks/bench_device_scorers.py --eval-docs 300 --rows raw
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import time

import numpy as np

ROWS = {"raw": ("S", "none"), "ppmi_norm": ("P", "row"), "ppmi_softmax": ("P", "softmax"), "kn2": 2, "kn3": 3}


def reference_class():
    """The previous CPU path, kept here as the reference."""
    import torch

    from distattn.projection.device_scorers import Symmetric, causal_layout
    from distattn.projection.torch_ops import _context, torch_causal_weights

    def scatter_rows(csr, ids):          # a fresh zero block, filled by torch's scatter
        block = torch.zeros(ids.numel(), csr.vocab_size, dtype=csr.data.dtype, device=ids.device)
        return csr.scatter_rows(ids.reshape(-1), block).reshape(*ids.shape, csr.vocab_size)

    class Reference(Symmetric):
        def block_sums(self, ids, pos):
            C = torch_causal_weights(_context(self.csr, ids), self.normalization, attention_temperature=self.tau_att)
            return torch.bmm(C, scatter_rows(self.csr, ids))

        def _blocks(self, docs, reuse=False):
            for ids, pos, d, j, flat in causal_layout(docs, self.batch_positions):
                ids_t = torch.as_tensor(ids, device=self.device)
                F = self.block_sums(ids_t, torch.as_tensor(pos, device=self.device))
                d_t = torch.as_tensor(d, device=self.device)
                src = torch.as_tensor(j - 1, device=self.device)
                x = F[d_t, src.clamp(min=0)] / (src.clamp(min=0) + 1).to(F.dtype)[:, None]
                x[src < 0] = 0.0
                del F
                tgt = ids_t[d_t, torch.as_tensor(j, device=self.device)]
                rank = ((x >= x.gather(1, tgt[:, None])).sum(1) - 1).cpu().numpy()
                yield flat, tgt, x, rank

        def score_next_tokens(self, docs, *, temperature=1.0, prior=None, prior_weight=0.0):
            logp = np.full(docs.n_tokens, np.nan)
            rank = np.full(docs.n_tokens, -1, dtype=np.int64)
            for flat, tgt, x, rk in (self.cached_blocks(docs) if self._caching else self._blocks(docs)):
                lp = torch.log_softmax(x / temperature, dim=1).gather(1, tgt[:, None])[:, 0]
                logp[flat] = lp.double().cpu().numpy()
                rank[flat] = rk
            return logp, rank

    return Reference


class TorchScoring:
    """While inside, CPU tensors are scored by torch (the reference for the n-gram rows)."""

    def __enter__(self):
        from distattn.projection import nexttoken
        self.module, self.saved = nexttoken, nexttoken._score_block

        def torch_first(block, *args):
            if hasattr(block, "detach"):
                return nexttoken._score_block_torch(block, *args)
            return self.saved(block, *args)
        nexttoken._score_block = torch_first
        return self

    def __exit__(self, *exc):
        self.module._score_block = self.saved
        return False


def run_ngram(model, data, V, reference: bool):
    import contextlib

    from distattn.projection import evaluate_next_token
    with TorchScoring() if reference else contextlib.nullcontext():
        rep, logp, _ = evaluate_next_token(model, data.test_neg, vocab_size=V, return_scores=True)
    return 1.0, rep, logp


def clocks():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([time.perf_counter(), r.ru_utime, r.ru_stime])


def run_row(model, data, V):
    """τ fitted on the validation reviews, then the test reviews scored (the projection stage)."""
    import torch

    from distattn.projection import evaluate_next_token, fit_temperature
    with model.caching():
        scale = max(model.logit_scale(data.val_neg), 1e-12)
        tau = fit_temperature(model, data.val_neg, vocab_size=V, bounds=(scale * 1e-3, scale * 1e3),
                              max_predictions=None)
    with torch.no_grad():
        rep, logp, _ = evaluate_next_token(model, data.test_neg, vocab_size=V, temperature=tau, return_scores=True)
    return tau, rep, logp


def main(argv=None) -> None:
    from distattn.cli import positive_int
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-docs", type=positive_int, default=100, help="test reviews scored (full profile: 2,000)")
    parser.add_argument("--val-docs", type=positive_int, default=40, help="validation reviews for τ (full profile: 200)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--batch-positions", type=positive_int, default=4096, help="the compare's CPU batch size")
    args = parser.parse_args(argv)
    rows = args.rows.split(",")
    if unknown := [r for r in rows if r not in ROWS]:
        parser.error(f"--rows: unknown {', '.join(unknown)}; allowed: {', '.join(ROWS)}")

    import torch

    from distattn.compare.config import CompareConfig
    from distattn.compare.stages import load_data, stage_statistics
    from distattn.projection import KneserNeyLM
    from distattn.projection.device_scorers import DeviceNgram, Symmetric

    cfg = CompareConfig(corpus="imdb", profile="full", device="cpu", train_models=False).validate()
    sizes = dataclasses.replace(cfg.sizes(), eval_docs=args.eval_docs, val_docs=args.val_docs)
    data = load_data(cfg, sizes, progress=False)
    stats = stage_statistics(data, sizes)
    V = len(data.vocab)
    print(f"IMDB, full profile's statistics: {V:,} words; {len(data.val_neg)} validation and {len(data.test_neg)} test "
          f"reviews (first {sizes.eval_len} tokens); batches of {args.batch_positions} positions; torch threads "
          f"{torch.get_num_threads()}")
    Reference = reference_class()
    total = {"reference": np.zeros(3), "new": np.zeros(3)}
    for key in rows:
        out = {}
        if isinstance(ROWS[key], int):                  # the n-gram model is fitted once, untimed
            ngram = DeviceNgram(KneserNeyLM(order=ROWS[key]).fit(data.stat_neg, V), "cpu")
        for name, cls in (("reference", Reference), ("new", Symmetric)):
            t0 = clocks()
            if isinstance(ROWS[key], int):
                tau, rep, logp = run_ngram(ngram, data, V, reference=name == "reference")
            else:
                matrix, normalization = ROWS[key]
                model = cls(getattr(stats, matrix), normalization, vocab_size=V, device=torch.device("cpu"),
                            batch_positions=args.batch_positions)
                tau, rep, logp = run_row(model, data, V)
                del model
            spent = clocks() - t0
            total[name] += spent
            out[name] = (tau, rep, logp, spent)
            print(f"{key:13s} {name:9s} wall {spent[0]:7.1f} s  user {spent[1]:7.1f} s  sys {spent[2]:7.1f} s  "
                  f"τ {tau:.6g}  ppl {rep.perplexity:.4f}  top-1 {rep.top1_accuracy:.4f}  top-10 {rep.top10_accuracy:.4f}",
                  flush=True)
        (tau_r, rep_r, lp_r, t_r), (tau_n, rep_n, lp_n, t_n) = out["reference"], out["new"]
        ok = ~np.isnan(lp_r)
        same = np.array_equal(ok, ~np.isnan(lp_n))
        gap = float(np.abs(lp_r[ok] - lp_n[ok]).max()) if same else float("inf")
        print(f"{key:13s} speed-up {t_r[0] / t_n[0]:.2f}x; τ rel. diff {abs(tau_n - tau_r) / tau_r:.2e}; "
              f"max |Δ log p| (each at its τ) {gap:.2e}; ppl rel. diff "
              f"{abs(rep_n.perplexity - rep_r.perplexity) / rep_r.perplexity:.2e}", flush=True)
    r, n = total["reference"], total["new"]
    print(f"all rows: reference {r[0]:.1f} s wall ({r[2]:.1f} s system), new {n[0]:.1f} s wall ({n[2]:.1f} s system): "
          f"{r[0] / n[0]:.2f}x")


if __name__ == "__main__":
    main()
