"""Attention flow (Abnar & Zuidema 2020): distattn vs networkx, side by side in one process.

    python benchmarks/bench_flow.py [--length 128] [--sample-pairs 12] [--seed 0]

For each case: distattn's ``attention_flow`` (exact closed form for 2 layers, Dinic in numba for
more), and ``networkx.maximum_flow_value`` on the full layered graph (A&Z's method), either on
every (output, input) pair or, where that would take too long, on a random sample of pairs
(the per-pair time is then extrapolated to all pairs). The largest absolute difference between
the two on the pairs both computed is printed beside the timings.
"""

from __future__ import annotations

import argparse
import os
import time

import networkx as nx
import numpy as np

from distattn.analysis.flow import attention_flow, attention_rollout, flow_network, layer_attentions


def random_attention(layers: int, heads: int, length: int, rng, causal: bool = False) -> np.ndarray:
    """Softmax attention with peaked rows, like trained heads."""
    scores = rng.standard_normal((layers, heads, length, length)) * 2.0
    if causal:
        scores = np.where(np.tril(np.ones((length, length), dtype=bool)), scores, -np.inf)
    A = np.exp(scores - scores.max(-1, keepdims=True))
    return A / A.sum(-1, keepdims=True)


def timed(fn, repeat: int = 3):
    best, out = np.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def networkx_pairs(A, pairs):
    """Max flow for each (output i, input j) pair with networkx (preflow-push, its default)."""
    L, R, _ = A.shape
    G = flow_network(A, residual=None)
    return np.array([nx.maximum_flow_value(G, (0, j), (L, i), capacity="capacity") for i, j in pairs])


def case(label, A_raw, rng, sample_pairs: int | None, outputs=None):
    A = layer_attentions(A_raw)
    L, R, _ = A.shape
    outs = np.arange(R) if outputs is None else np.asarray(outputs)
    t_ours, flow = timed(lambda: attention_flow(A_raw, outputs=outputs), repeat=3 if L <= 2 else 1)
    all_pairs = [(int(i), j) for i in outs for j in range(R)]
    if sample_pairs is None or sample_pairs >= len(all_pairs):
        pairs, note = all_pairs, "all pairs"
    else:
        pick = rng.choice(len(all_pairs), size=sample_pairs, replace=False)
        pairs, note = [all_pairs[k] for k in pick], f"{sample_pairs} sampled pairs"
    t0 = time.perf_counter()
    ref = networkx_pairs(A, pairs)
    t_nx = time.perf_counter() - t0
    row_of = {int(i): r for r, i in enumerate(outs)}
    ours = np.array([flow[row_of[i], j] for i, j in pairs])
    t_nx_all = t_nx / len(pairs) * len(all_pairs)
    print(f"{label:<34} {len(all_pairs):>7} pairs | distattn {t_ours:9.4f} s | networkx {t_nx:8.2f} s on {note:<18}"
          f" (~{t_nx_all:9.1f} s for all, x{t_nx_all / t_ours:,.0f}) | max |diff| {np.abs(ours - ref).max():.1e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--length", type=int, default=128, help="tokens in the main case (default 128)")
    p.add_argument("--sample-pairs", type=int, default=12, help="networkx pairs sampled on the large cases")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    R = args.length
    print(f"CPU threads: {os.cpu_count()}; networkx {nx.__version__}; numpy {np.__version__}")
    t = time.perf_counter()
    attention_flow(random_attention(3, 1, 4, rng))          # numba kernel: compile or load from cache
    print(f"numba Dinic kernel first call (compile or cache load): {time.perf_counter() - t:.2f} s")
    print("case (layers x heads x tokens)       output-input      time (best of 3 for 2 layers)")
    case("2 x 4 x 16", random_attention(2, 4, 16, rng), rng, None)
    case("2 x 4 x 32 causal", random_attention(2, 4, 32, rng, causal=True), rng, None)
    case(f"2 x 4 x {R}", random_attention(2, 4, R, rng), rng, args.sample_pairs)
    case(f"2 x 4 x {R} causal", random_attention(2, 4, R, rng, causal=True), rng, args.sample_pairs)
    case("3 x 4 x 24 (Dinic)", random_attention(3, 4, 24, rng), rng, None)
    case("4 x 4 x 24 (Dinic)", random_attention(4, 4, 24, rng), rng, None)
    case(f"3 x 4 x {R}, output 0 only (Dinic)", random_attention(3, 4, R, rng), rng, args.sample_pairs, outputs=[0])
    case(f"3 x 4 x {R} (Dinic)", random_attention(3, 4, R, rng), rng, args.sample_pairs)
    case(f"4 x 4 x {R // 2} (Dinic)", random_attention(4, 4, R // 2, rng), rng, args.sample_pairs)
    A = random_attention(2, 4, R, rng)
    t_roll, _ = timed(lambda: attention_rollout(A))
    print(f"rollout 2 x 4 x {R}: {t_roll * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
