"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in
Transformers").

Both read a stack of attention matrices ``A_l`` (l = 1..L, each R × R, ``A_l[i, j]`` = how
much query position i of layer l attends to key position j of layer l-1), account for the
residual stream by ``Â_l = 0.5 A_l + 0.5 I`` with rows re-normalised (:func:`residual_attention`;
heads are averaged first), and ask how much output position i of the top layer draws from
input token j.

* Rollout: ``Â_L Â_{L-1} ... Â_1`` — information mixes linearly along all paths.
* Flow: the layered DAG with nodes (l, position), l = 0..L, and an edge (l-1, j) -> (l, i) of
  capacity ``Â_l[i, j]``; ``flow[i, j]`` is the maximum flow from input node (0, j) to output
  node (L, i). (A&Z draw the edges top-down and flow from output to input; reversing every edge
  and swapping source and sink leaves a max-flow value unchanged.)

Computing the flow. In the network for one pair (j, i) no flow can enter another input node
(they have no incoming edges) or leave another output node (no outgoing edges), so only
``s = (0, j)``, the L-1 hidden layers and ``t = (L, i)`` matter:

* L = 1: ``flow[i, j] = Â_1[i, j]`` (one edge).
* L = 2: every s-t path is ``s -> (1, k) -> t`` and distinct k give edge-disjoint paths, so
  ``flow[i, j] = Σ_k min(Â_1[k, j], Â_2[i, k])`` — exact, computed for all pairs at once in
  O(R³) with numpy.
* L >= 3: no closed form (the middle layers form a transportation problem). Each pair is
  solved exactly by Dinic's algorithm on the compact (L-1)R + 2 node network (numba, pairs in
  parallel): about O(R² · (L R)²) per pair in the worst case, so restrict ``outputs`` (e.g. the
  [CLS] or last position) for long sequences.

A&Z normalise each output's flows to sum to 1 before comparing them with other attributions;
``normalize=True`` does the same (the default returns the raw max-flow values, which equal
``networkx.maximum_flow_value``; :func:`attention_flow_reference` is that networkx
computation, for checks).
"""

from __future__ import annotations

import numbers

import numpy as np

from distattn.analysis.factored import finite_real, to_numpy
from distattn.memory import check_memory
from distattn.threads import start_numba_threads

__all__ = ["HEAD_REDUCTIONS", "FLOW_METHODS", "residual_attention", "layer_attentions", "attention_rollout",
           "attention_flow", "flow_network", "attention_flow_reference"]

HEAD_REDUCTIONS = ("mean", "max", "min")
FLOW_METHODS = ("auto", "closed_form", "dinic")


def residual_attention(attention, residual: float = 0.5) -> np.ndarray:
    """``Â = (1 - residual) A + residual I``, rows re-normalised to sum to 1. (..., R, R)."""
    A = to_numpy(attention)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"attention must have shape (..., R, R), got {A.shape}")
    if isinstance(residual, bool) or not isinstance(residual, numbers.Real) or not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must lie in [0, 1], got {residual!r}")
    if not np.all(np.isfinite(A)) or np.any(A < 0):
        raise ValueError("attention weights must be finite and non-negative")
    out = (1.0 - residual) * A + residual * np.eye(A.shape[-1])
    sums = out.sum(axis=-1, keepdims=True)
    if np.any(sums <= 0):
        raise ValueError("a row of the residual attention sums to 0; attention rows must be non-negative with a "
                         "positive sum (or use residual > 0)")
    return out / sums


def layer_attentions(attentions, head_reduction: str = "mean", residual: float | None = 0.5) -> np.ndarray:
    """Normalise a stack of attention patterns to (L, R, R), one per layer.

    ``attentions``: (L, H, R, R), (L, R, R), (R, R) (one layer), or a list of per-layer (H, R, R)
    or (R, R) arrays / torch tensors. Heads are combined by ``head_reduction`` ("mean", as A&Z;
    "max"/"min" rows are re-normalised); then :func:`residual_attention` is applied unless
    ``residual`` is None.
    """
    if head_reduction not in HEAD_REDUCTIONS:
        raise ValueError(f"head_reduction must be one of {HEAD_REDUCTIONS}, got {head_reduction!r}")
    if isinstance(attentions, (list, tuple)):
        if not attentions:
            raise ValueError("attentions is empty; pass at least one layer's (H, R, R) or (R, R) pattern")
        A = np.stack([to_numpy(a) for a in attentions])
    else:
        A = to_numpy(attentions)
    if A.ndim == 2:
        A = A[None]
    if A.ndim == 4:
        A = {"mean": A.mean, "max": A.max, "min": A.min}[head_reduction](axis=1)
        if head_reduction != "mean":
            A = A / np.maximum(A.sum(axis=-1, keepdims=True), np.finfo(float).tiny)
    if A.ndim != 3 or A.shape[-1] != A.shape[-2] or 0 in A.shape:
        raise ValueError(f"attentions must have shape (layers, heads, R, R), (layers, R, R) or (R, R) with at least "
                         f"one layer and one token; got {A.shape}")
    if not np.all(np.isfinite(A)) or np.any(A < 0):
        raise ValueError("attention weights must be finite and non-negative")
    return A if residual is None else residual_attention(A, residual)


def attention_rollout(attentions, head_reduction: str = "mean", residual: float | None = 0.5,
                      per_layer: bool = False) -> np.ndarray:
    """Attention rollout ``Â_L ··· Â_1`` (R, R): row i is output position i's mixture over input
    tokens (rows sum to 1). ``per_layer=True`` returns all L partial products (L, R, R), the
    l-th being ``Â_l ··· Â_1`` (A&Z's ``compute_joint_attention``)."""
    A = layer_attentions(attentions, head_reduction, residual)
    out = np.empty_like(A)
    out[0] = A[0]
    for layer in range(1, A.shape[0]):
        out[layer] = A[layer] @ out[layer - 1]
    return out if per_layer else out[-1]


def _outputs(outputs, R: int) -> np.ndarray:
    if outputs is None:
        return np.arange(R)
    idx = np.atleast_1d(np.asarray(outputs))
    if not np.issubdtype(idx.dtype, np.integer) or idx.ndim != 1 or idx.size == 0 \
            or idx.min() < -R or idx.max() >= R:
        raise ValueError(f"outputs must be a non-empty 1-D list of positions in [-{R}, {R}), got {outputs!r}")
    return idx % R


def _two_layer_flow(A1: np.ndarray, A2: np.ndarray) -> np.ndarray:
    """``flow[i, j] = Σ_k min(A2[i, k], A1[k, j])`` for all i (rows of A2) and j, in blocks."""
    n_out, R = A2.shape
    out = np.empty((n_out, A1.shape[1]))
    block = max(1, (1 << 23) // (R * A1.shape[1]))
    for lo in range(0, n_out, block):
        out[lo:lo + block] = np.minimum(A2[lo:lo + block, :, None], A1[None, :, :]).sum(axis=1)
    return out


def attention_flow(attentions, head_reduction: str = "mean", residual: float | None = 0.5, *, outputs=None,
                   normalize: bool = False, method: str = "auto", eps: float = 1e-12) -> np.ndarray:
    """Attention flow: ``flow[o, j]`` = max flow from input token j to top-layer position
    ``outputs[o]`` (all positions by default) through the layered attention graph.

    Parameters
    ----------
    attentions : see :func:`layer_attentions` — L layers of (H,) R × R attention.
    head_reduction, residual : see :func:`layer_attentions`.
    outputs : int array, optional
        Top-layer positions to compute (rows of the result).
    normalize : bool
        Divide each row by its sum (A&Z); rows with zero flow stay zero.
    method : {"auto", "closed_form", "dinic"}
        "auto" uses the exact closed form for L <= 2 and Dinic's algorithm for L >= 3;
        "dinic" forces the general solver for L >= 2 (for checks).
    eps : float
        Residual capacities below ``eps`` count as saturated in Dinic's algorithm.

    Returns
    -------
    ndarray (len(outputs), R), float64. Each value is at most ``min(Σ_k Â_1[k, j], 1)``.
    """
    if method not in FLOW_METHODS:
        raise ValueError(f"method must be one of {FLOW_METHODS}, got {method!r}")
    # a negative eps never counts an edge as saturated: Dinic's algorithm would loop forever
    eps = finite_real(eps, "eps", minimum=0)
    A = layer_attentions(attentions, head_reduction, residual)
    L, R, _ = A.shape
    outs = _outputs(outputs, R)
    if method == "closed_form" and L > 2:
        raise ValueError(f"the closed form exists only for 1 or 2 layers; this stack has {L} (use method='auto')")
    if L == 1:                                        # a single edge per pair, whatever the method
        flow = A[0][outs].copy()
    elif L == 2 and method != "dinic":
        check_memory(8 * min(len(outs), max(1, (1 << 23) // (R * R))) * R * R + 8 * len(outs) * R,
                     "two-layer attention flow")
        flow = _two_layer_flow(A[0], A[1][outs])
    else:
        flow = _dinic_all_pairs(A, outs, float(eps))
    if normalize:
        sums = flow.sum(axis=1, keepdims=True)
        flow = np.divide(flow, sums, out=np.zeros_like(flow), where=sums > 0)
    return flow


# --------------------------------------------------------------------------- general L: Dinic

def _compact_network(A: np.ndarray) -> np.ndarray:
    """Dense capacity matrix of the hidden layers: node ``1 + (l-1) R + k`` is (l, k) for
    l = 1..L-1; node 0 is the source slot, node N-1 the sink slot (filled per pair)."""
    L, R, _ = A.shape
    N = (L - 1) * R + 2
    check_memory(8 * N * N * 3, f"attention flow network with {N} nodes")
    cap = np.zeros((N, N))
    for layer in range(2, L):                          # edges (layer-1, a) -> (layer, b), capacity A_layer[b, a]
        lo_from = 1 + (layer - 2) * R
        lo_to = 1 + (layer - 1) * R
        cap[lo_from:lo_from + R, lo_to:lo_to + R] = A[layer - 1].T
    return cap


def _dinic_all_pairs(A: np.ndarray, outs: np.ndarray, eps: float) -> np.ndarray:
    from distattn.analysis._maxflow import layered_flows
    L, R, _ = A.shape
    start_numba_threads()
    base = _compact_network(A)
    return layered_flows(base, np.ascontiguousarray(A[0]), np.ascontiguousarray(A[-1][outs]), R, eps)


# --------------------------------------------------------------------------- networkx

def flow_network(attentions, tokens=None, head_reduction: str = "mean", residual: float | None = 0.5):
    """The full layered attention graph as a ``networkx.DiGraph``: nodes ``(layer, position)``
    for layer 0..L with attributes ``layer``, ``position`` and ``token`` (layer-0 label, if
    ``tokens`` is given), edges ``(l-1, j) -> (l, i)`` with ``capacity`` (and ``weight``)
    ``Â_l[i, j]`` for every positive entry."""
    import networkx as nx

    A = layer_attentions(attentions, head_reduction, residual)
    L, R, _ = A.shape
    if tokens is not None and len(tokens) != R:
        raise ValueError(f"tokens has {len(tokens)} labels but the attention has {R} positions")
    G = nx.DiGraph()
    for layer in range(L + 1):
        G.add_nodes_from(((layer, k), {"layer": layer, "position": k,
                                       "token": "" if tokens is None else str(tokens[k])}) for k in range(R))
    for layer in range(1, L + 1):
        i, j = np.nonzero(A[layer - 1] > 0)
        w = A[layer - 1][i, j]
        G.add_edges_from(((layer - 1, int(b)), (layer, int(a)), {"capacity": float(c), "weight": float(c)})
                         for a, b, c in zip(i, j, w))
    return G


def attention_flow_reference(attentions, head_reduction: str = "mean", residual: float | None = 0.5, *,
                             outputs=None, flow_func=None) -> np.ndarray:
    """The same quantity as :func:`attention_flow` (unnormalised) computed the way A&Z do, one
    ``networkx.maximum_flow_value`` per (output, input) pair on the full layered graph. Slow:
    for tests and benchmarks."""
    import networkx as nx

    A = layer_attentions(attentions, head_reduction, residual)
    L, R, _ = A.shape
    outs = _outputs(outputs, R)
    G = flow_network(A, residual=None)
    kwargs = {} if flow_func is None else {"flow_func": flow_func}
    out = np.zeros((len(outs), R))
    for row, i in enumerate(outs):
        for j in range(R):
            out[row, j] = nx.maximum_flow_value(G, (0, j), (L, int(i)), capacity="capacity", **kwargs)
    return out

