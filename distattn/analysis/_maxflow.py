"""Numba kernels for :mod:`distattn.analysis.flow`: Dinic's maximum flow on the compact
layered attention network, one (output, input) pair per task, pairs in parallel.

Node layout (N = (L-1) R + 2): 0 is the source, ``1 + (l-1) R + k`` is position k of hidden
layer l (1..L-1), N-1 is the sink. Residual edges only join consecutive layers, so a node's
neighbours are scanned in two contiguous ranges (the layer below and the layer above), not
over all N nodes.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["dinic", "layered_flows"]


@numba.njit(cache=True, nogil=True, inline="always")
def _neighbour_ranges(u, N, R):
    if u == 0:
        return 1, 1 + R, 0, 0
    if u == N - 1:
        return N - 1 - R, N - 1, 0, 0
    layer = (u - 1) // R + 1
    last = (N - 2) // R
    if layer == 1:
        lo1, hi1 = 0, 1
    else:
        lo1, hi1 = 1 + (layer - 2) * R, 1 + (layer - 1) * R
    if layer == last:
        lo2, hi2 = N - 1, N
    else:
        lo2, hi2 = 1 + layer * R, 1 + (layer + 1) * R
    return lo1, hi1, lo2, hi2


@numba.njit(cache=True, nogil=True)
def dinic(cap, R, eps, level, it, queue, path):
    """Max flow from node 0 to node N-1 of the layered residual-capacity matrix ``cap``
    (modified in place).

    Dinic: a BFS level graph, then a blocking flow found by depth-first search with
    current-arc pointers (``it``); dead ends are pruned by setting their level to -1.
    """
    N = cap.shape[0]
    s = 0
    t = N - 1
    total = 0.0
    while True:
        for v in range(N):
            level[v] = -1
        level[s] = 0
        head = 0
        tail = 1
        queue[0] = s
        while head < tail:
            u = queue[head]
            head += 1
            lo1, hi1, lo2, hi2 = _neighbour_ranges(u, N, R)
            for v in range(lo1, hi1):
                if level[v] < 0 and cap[u, v] > eps:
                    level[v] = level[u] + 1
                    queue[tail] = v
                    tail += 1
            for v in range(lo2, hi2):
                if level[v] < 0 and cap[u, v] > eps:
                    level[v] = level[u] + 1
                    queue[tail] = v
                    tail += 1
        if level[t] < 0:
            return total
        for v in range(N):
            it[v] = 0
        depth = 0
        path[0] = s
        while True:
            u = path[depth]
            if u == t:
                f = np.inf
                for d in range(depth):
                    c = cap[path[d], path[d + 1]]
                    if c < f:
                        f = c
                for d in range(depth):
                    a = path[d]
                    b = path[d + 1]
                    cap[a, b] -= f
                    cap[b, a] += f
                total += f
                depth = 0
                continue
            lo1, hi1, lo2, hi2 = _neighbour_ranges(u, N, R)
            n1 = hi1 - lo1
            n_all = n1 + hi2 - lo2
            advanced = False
            while it[u] < n_all:
                pos = it[u]
                v = lo1 + pos if pos < n1 else lo2 + pos - n1
                if level[v] == level[u] + 1 and cap[u, v] > eps:
                    depth += 1
                    path[depth] = v
                    advanced = True
                    break
                it[u] += 1
            if not advanced:
                if depth == 0:
                    break
                level[u] = -1
                depth -= 1
                it[path[depth]] += 1


@numba.njit(cache=True, parallel=True)
def layered_flows(base, first, last_rows, R, eps):
    """``out[o, j]`` = max flow from a source joined to the first hidden layer by capacities
    ``first[:, j]`` to a sink fed from the last hidden layer by ``last_rows[o, :]``, through
    the hidden-layer network ``base`` (node 0 = source slot, N-1 = sink slot)."""
    N = base.shape[0]
    n_out = last_rows.shape[0]
    n_in = first.shape[1]
    out = np.zeros((n_out, n_in))
    last_lo = N - 1 - R
    for task in numba.prange(n_out * n_in):
        o = task // n_in
        j = task % n_in
        cap = base.copy()
        for k in range(R):
            cap[0, 1 + k] = first[k, j]
            cap[last_lo + k, N - 1] = last_rows[o, k]
        level = np.empty(N, np.int64)
        it = np.empty(N, np.int64)
        queue = np.empty(N, np.int64)
        path = np.empty(N, np.int64)
        out[o, j] = dinic(cap, R, eps, level, it, queue, path)
    return out
