"""Are CPU training steps bitwise reproducible across processes? Prints one line per thread count.

Each trial is a fresh Python process that builds the seed-size classifier (d_model 256, vocabulary
30k) from seed 1 and takes ``--steps`` AdamW steps on one fixed random batch (64 x 256 tokens);
the SHA-1 of its weights is its result. The engine fixes data order and RNG per step, so any
spread here comes from the floating-point kernels, not from distattn. ``--optimizers`` compares
torch's AdamW implementations on the CPU: ``single`` (torch's CPU default, one tensor at a time)
and ``fused`` (``fused=True``, what :func:`distattn.train.engine.make_optimizer` uses). Each line
also gives the median wall time of a trial (process start included).

    python benchmarks/probe_cpu_reproducibility.py --trials 12 --threads 2,1 --optimizers single,fused
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import time

TRIAL = """
import hashlib, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from distattn.models import TransformerClassifier, seed_classifier_config
from distattn.train import seed_everything
seed_everything(1)
m = TransformerClassifier(seed_classifier_config(vocab_size=30_000))
opt = torch.optim.AdamW(m.parameters(), lr=2e-4, weight_decay=0.01, fused=sys.argv[3] == "fused")
g = torch.Generator().manual_seed(0)
ids = torch.randint(2, 30_000, (64, 256), generator=g)
mask = torch.ones(64, 256, dtype=torch.bool)
mask[:, 200:] = False
y = torch.randint(0, 2, (64,), generator=g).float()
for step in range(int(sys.argv[2])):
    torch.manual_seed(step)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(m(ids, mask), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()[:12])
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12, help="fresh processes per thread count")
    ap.add_argument("--threads", default="2,1", help="comma list of torch.set_num_threads values")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--optimizers", default="single,fused", help="comma list of single, fused")
    args = ap.parse_args()
    if args.trials < 2 or args.steps < 1:
        raise SystemExit(f"--trials {args.trials} --steps {args.steps}: need at least 2 trials and 1 step")
    optimizers = args.optimizers.split(",")
    bad = [o for o in optimizers if o not in ("single", "fused")]
    if bad:
        raise SystemExit(f"--optimizers: unknown {bad}; allowed: single, fused")
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        thread_counts = []
    if not thread_counts or min(thread_counts) < 1:
        raise SystemExit(f"--threads {args.threads!r}: expected a comma list of positive integers, e.g. 2,1")
    for threads in thread_counts:
        for opt in optimizers:
            hashes, seconds = [], []
            for _ in range(args.trials):
                t = time.perf_counter()
                hashes.append(subprocess.run([sys.executable, "-c", TRIAL, str(threads), str(args.steps), opt],
                                             check=True, capture_output=True, text=True).stdout.strip())
                seconds.append(time.perf_counter() - t)
            counts = collections.Counter(hashes).most_common()
            print(f"threads={threads} optimizer={opt} trials={args.trials} steps={args.steps} "
                  f"distinct_results={len(counts)} median_trial_s={statistics.median(seconds):.2f} "
                  + " ".join(f"{h}x{n}" for h, n in counts), flush=True)


if __name__ == "__main__":
    main()
