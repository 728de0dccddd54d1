"""Attention matrices and PPMI neighbourhoods as networkx graphs (seed 001, "Graph-Theoretic
Interpretation": tokens are nodes, attention weights directed edges).

Sequence level. :func:`attention_graph` turns an R × R attention matrix ``A`` (rows = queries,
summing to 1) into a ``networkx.DiGraph`` with nodes ``0..R-1`` (attributes ``position``,
``token``) and an edge ``i -> j`` of ``weight`` ``A[i, j]`` ("query i attends to key j"; the
information moves the other way, from j into i). With this orientation ``A`` is the transition
matrix of a random walk on the graph, so

* PageRank (:func:`pagerank`) is the stationary attention mass of each token (with the usual
  teleport ``1 - damping``);
* weighted in-degree (:func:`in_degree`) ``Σ_i A[i, j]`` is the total attention token j receives;
* row entropy (:func:`row_entropy`) is how spread each query's attention is;
* the spectral gap ``1 - |λ_2|`` of the row-stochastic ``A`` (:func:`spectral_gap`) is how fast
  repeated attention mixes tokens (1 for uniform attention or any rank-one pattern; 0 for the
  identity or any pattern with two or more closed sets of tokens, or a periodic one. A reducible
  pattern need not give 0: a causal one, whose row 0 attends only to itself, has its diagonal
  as eigenvalues).

Corpus level. :func:`word_neighbourhood` takes a word's top-k PPMI neighbours and the PPMI
edges among them; :func:`sense_communities` splits the neighbours (without the word itself,
which touches all of them) into Louvain communities, so that a polysemous word such as "bank"
shows one community per sense.
"""

from __future__ import annotations

import io
import numbers
import os
import re
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from distattn.analysis.factored import finite_real, to_numpy
from distattn.analysis.information import entropy
from distattn.atomic import atomic_path

__all__ = ["attention_graph", "pagerank", "in_degree", "row_entropy", "spectral_gap", "graph_metrics",
           "write_graphml", "word_neighbourhood", "SenseCommunities", "sense_communities"]


def _attention(A, name: str = "attention", stochastic: bool = True, atol: float = 1e-6) -> np.ndarray:
    A = to_numpy(A)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise ValueError(f"{name} must be a square (R, R) matrix, got shape {A.shape}")
    if not np.all(np.isfinite(A)) or np.any(A < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    if stochastic:
        sums = A.sum(axis=1)
        if not np.allclose(sums, 1.0, atol=atol):
            raise ValueError(f"{name} must be row-stochastic (rows summing to 1 within {atol}); row sums range "
                             f"{sums.min():.6g}..{sums.max():.6g} — normalise rows first")
    return A


def attention_graph(attention, tokens=None, threshold: float = 0.0):
    """``networkx.DiGraph`` of one attention matrix (R, R): edge ``i -> j`` with ``weight``
    ``A[i, j]`` for every entry above ``threshold``; nodes carry ``position`` and ``token``
    (``tokens[i]`` or ``""``)."""
    import networkx as nx

    A = _attention(attention, stochastic=False)
    R = A.shape[0]
    threshold = finite_real(threshold, "threshold")     # NaN: no edge at all
    if tokens is not None and len(tokens) != R:
        raise ValueError(f"tokens has {len(tokens)} labels but the attention has {R} positions")
    G = nx.DiGraph()
    G.add_nodes_from((k, {"position": k, "token": "" if tokens is None else str(tokens[k])}) for k in range(R))
    i, j = np.nonzero(A > threshold)
    G.add_weighted_edges_from(zip(i.tolist(), j.tolist(), A[i, j].tolist()))
    return G


def pagerank(attention, damping: float = 0.85) -> np.ndarray:
    """PageRank (R,) of the attention graph, ``networkx.pagerank`` with edge weights; sums to 1.
    Uniform attention gives ``1/R`` everywhere."""
    import networkx as nx

    if isinstance(damping, bool) or not isinstance(damping, numbers.Real) or not 0.0 < damping < 1.0:
        raise ValueError(f"damping must be a number in (0, 1); got {damping!r}")
    A = _attention(attention)
    G = attention_graph(A)
    pr = nx.pagerank(G, alpha=damping, weight="weight", tol=1e-12, max_iter=1000)
    return np.array([pr[k] for k in range(A.shape[0])])


def in_degree(attention) -> np.ndarray:
    """Weighted in-degree (R,): ``Σ_i A[i, j]``, the attention each token receives (sums to R
    for a row-stochastic A)."""
    return _attention(attention, stochastic=False).sum(axis=0)


def row_entropy(attention, base="e") -> np.ndarray:
    """Entropy of each row (R,), nats by default (``base=2`` for bits); ``log R`` for uniform
    attention, 0 for one-hot rows."""
    return entropy(_attention(attention), base=base, axis=1)


def spectral_gap(attention) -> float:
    """``1 - |λ_2|`` of the row-stochastic A, eigenvalues sorted by modulus (``|λ_1| = 1``).

    1 for uniform attention (rank one: λ_2 = 0), 0 for the identity. A causal (lower-triangular)
    pattern has its diagonal as eigenvalues.
    """
    A = _attention(attention)
    if A.shape[0] == 1:
        return 1.0
    mod = np.sort(np.abs(np.linalg.eigvals(A)))[::-1]
    return float(max(0.0, 1.0 - mod[1]))


def graph_metrics(attention, tokens=None, damping: float = 0.85) -> dict:
    """All four sequence-level metrics: ``pagerank``, ``in_degree``, ``row_entropy`` (arrays of
    length R), ``spectral_gap`` (float), plus ``tokens``."""
    rank = pagerank(attention, damping)
    if tokens is not None and len(tokens) != rank.size:   # as attention_graph: one label per position
        raise ValueError(f"tokens has {len(tokens)} labels but the attention has {rank.size} positions")
    return {"tokens": None if tokens is None else [str(t) for t in tokens],
            "pagerank": rank, "in_degree": in_degree(attention),
            "row_entropy": row_entropy(attention), "spectral_gap": spectral_gap(attention)}


# characters XML 1.0 has no way to write (not even as &#n;): networkx's ElementTree writer put them in
# as they are, and every XML parser, read_graphml's included, refuses the file
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(s: str, what: str) -> str:
    bad = _NOT_XML.search(s)
    if bad:
        raise ValueError(f"{what} {s!r} holds the character {bad.group()!r}, which cannot be stored in GraphML "
                         "(XML 1.0); replace it first")
    return s


def _graphml_safe(G):
    """Copy with plain Python attribute values (GraphML cannot store numpy scalars, tuples or None)."""
    import networkx as nx

    def clean(d, where, lost=None):
        """``lost``: attribute names that read_graphml would not give back there, with why."""
        out, owner = {}, {}
        for k, v in d.items():
            if v is None:
                continue
            name = _xml_text(str(k), f"{where}'s attribute name")   # written as str(k), read back as a string
            if lost and name in lost:
                raise ValueError(f"{where}'s attribute {k!r} would be lost ({lost[name]}); rename it")
            if name in owner:
                raise ValueError(f"{where}'s attributes {owner[name]!r} and {k!r} would both be written as GraphML "
                                 f"attribute {name!r}; rename one of them")
            owner[name] = k
            if isinstance(v, np.generic):
                v = v.item()
            if not isinstance(v, (str, int, float, bool)):
                v = str(v)
            if isinstance(v, str):
                _xml_text(v, f"{where}'s {k!r}")
            out[name] = v
        return out

    if G.is_multigraph():        # a DiGraph/Graph copy would merge parallel edges, keeping the last one's data
        H = nx.MultiDiGraph() if G.is_directed() else nx.MultiGraph()
    else:
        H = nx.DiGraph() if G.is_directed() else nx.Graph()
    defaults = ("node_default", "edge_default")     # not data: handled once the nodes and edges are in
    H.graph.update(clean({k: v for k, v in G.graph.items() if k not in defaults}, "the graph",
                         {"id": "networkx writes it as the <graph> element's id, which read_graphml does not read"}))
    names = {n: (n if isinstance(n, (str, int)) else "_".join(map(str, n)) if isinstance(n, tuple) else str(n))
             for n in G.nodes}
    seen = {}
    for n, name in names.items():      # GraphML ids are strings: (1, 2) and "1_2", or 1 and "1", were merged
        if str(name) in seen:
            raise ValueError(f"nodes {seen[str(name)]!r} and {n!r} would both be written as GraphML id "
                             f"{str(name)!r}; rename one of them")
        seen[str(name)] = n
        _xml_text(str(name), "node")
    H.add_nodes_from((names[n], clean(d, f"node {n!r}")) for n, d in G.nodes(data=True))
    if G.is_multigraph():
        ids, pairs = {}, set()
        for a, b, k in G.edges(keys=True):     # the key is written as the edge's id, str(k)
            _xml_text(str(k), f"edge {a!r} -> {b!r}'s key")
            pair = (str(names[a]), str(names[b])) if G.is_directed() else frozenset((str(names[a]), str(names[b])))
            if (pair, str(k)) in ids:          # read_graphml keeps one of the parallel edges with one id
                raise ValueError(f"edges {a!r} -> {b!r} with keys {ids[pair, str(k)]!r} and {k!r} would both be "
                                 f"written as GraphML edge id {str(k)!r}; rename one of the keys")
            ids[pair, str(k)] = k
            pairs.add(pair)
        # without parallel edges read_graphml returns a Graph and sets each edge's "id" to its GraphML id
        lost = None if len(pairs) < len(ids) else {
            "id": "a multigraph edge's GraphML id is its key, and read_graphml, finding no parallel edges, reads "
                  "a Graph whose edges' 'id' is that key"}
        H.add_edges_from((names[a], names[b], k, clean(d, f"edge {a!r} -> {b!r}", lost))
                         for a, b, k, d in G.edges(keys=True, data=True))
    else:
        H.add_edges_from((names[a], names[b], clean(d, f"edge {a!r} -> {b!r}")) for a, b, d in G.edges(data=True))
    # networkx writes these as the <default> of the nodes' (edges') GraphML attribute of each name, and
    # read_graphml sets both ({} without defaults); made strings above, they failed networkx's writer
    for kind, data in zip(defaults, (H.nodes.values(), [d for *_, d in H.edges(data=True)])):
        value = G.graph.get(kind)
        if value is None or isinstance(value, dict) and not value:
            continue
        what = kind.split("_")[0]
        if not isinstance(value, dict):
            raise ValueError(f"the graph's attribute {kind!r} would be lost (networkx takes it as the {what}s' "
                             f"default attribute values, a dict, not a {type(value).__name__}); rename it")
        default = clean(value, f"the graph's {kind}")
        missing = sorted(set(default) - set().union(*map(set, data)))
        if missing:
            raise ValueError(f"the graph's {kind} {missing[0]!r} would be lost (networkx writes it as the default "
                             f"of the {what}s' attribute of that name, and no {what} has one); remove it")
        H.graph[kind] = default
    return H


def write_graphml(G, path: str | os.PathLike) -> None:
    """Write ``G`` as GraphML atomically (temporary file, then rename). Tuple node names such as
    ``(layer, position)`` become ``"layer_position"``; numpy scalars become Python numbers; attribute
    names become strings. A name, attribute name, multigraph edge key or string value with a character
    XML 1.0 cannot hold (a control character such as ``"\\x00"``), or two attribute names, or two keys
    of parallel edges, with one string form (``5`` and ``"5"``), is refused with ``ValueError``; so is an
    attribute ``read_graphml`` would not give back: the graph's ``"id"`` (written as the ``<graph>``
    element's id), and a multigraph edge's ``"id"`` when no edges are parallel (read back as a Graph
    whose edges' ``"id"`` is their key). Node and edge attributes named ``id``, ``key``, ``source`` or
    ``target`` are otherwise data like any other, and kept. The graph's ``node_default`` and
    ``edge_default`` (dicts, as ``read_graphml`` sets them) are written as the defaults of the node
    and edge attributes of those names; one for a name no node (edge) has is refused. A
    ``"\\r"`` in a string value is kept (written as ``&#13;``; as is, it would read back as ``"\\n"``)."""
    import networkx as nx

    buf = io.BytesIO()
    nx.write_graphml(_graphml_safe(G), buf)
    # ElementTree writes a "\r" in element text as is, and XML end-of-line handling reads it back as
    # "\n"; a raw CR can only come from text (attributes have it as &#13; already), so write it as &#13;
    with atomic_path(path, suffix=".graphml") as tmp:
        tmp.write_bytes(buf.getvalue().replace(b"\r", b"&#13;"))


# --------------------------------------------------------------------------- PPMI graphs

def _word_index(word, words) -> int:
    if isinstance(word, (numbers.Integral, np.integer)) and not isinstance(word, bool):
        return int(word)
    if words is None:
        raise ValueError(f"word {word!r} is not an integer id, so words (the id -> word list) is needed")
    try:
        return list(words).index(word)
    except ValueError:
        raise KeyError(f"{word!r} is not in the vocabulary ({len(words)} words)") from None


def word_neighbourhood(ppmi, word, k: int = 30, words=None, *, include_word: bool = True):
    """Undirected graph of a word's top-``k`` PPMI neighbours and the PPMI edges among them.

    Neighbours: the k largest positive entries of row ``word`` (itself excluded), ties broken
    by the smaller id. Edge weights: ``(P[a, b] + P[b, a]) / 2`` (equal to ``P[a, b]`` for a
    symmetric PPMI) where positive. With ``include_word`` the word is a node too, joined to each
    neighbour by ``P[word, n]``, the row the neighbours were chosen by. Nodes are ids with attributes ``word`` (if ``words``, the id -> word list or a
    ``Vocabulary``, is given) and ``ppmi`` (to the centre word).
    """
    import networkx as nx

    if not sp.issparse(ppmi) and np.ndim(ppmi) != 2:      # a 0-d array: scipy's "missing argument 'shape'"
        raise ValueError(f"ppmi must be square (vocab, vocab), got shape {np.shape(ppmi)}")
    P = sp.csr_array(ppmi, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"ppmi must be square (vocab, vocab), got shape {P.shape}")
    if not np.all(np.isfinite(P.data)):          # NaN is not > 0, so it silently dropped neighbours
        raise ValueError("ppmi contains NaN or inf")
    if words is not None:
        words = list(words)      # a Vocabulary iterates its words in id order, but vocab[i] looks a word up
        if len(words) != P.shape[0]:
            raise ValueError(f"words has {len(words)} entries but ppmi has {P.shape[0]} rows (one word per id)")
    c = _word_index(word, words)
    if not 0 <= c < P.shape[0]:
        raise ValueError(f"word id {c} is out of range for a vocabulary of {P.shape[0]}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    row = P[[c]]                                 # a copy of the row
    row.sum_duplicates()                         # a non-canonical CSR stores a neighbour's PPMI in parts
    cols, vals = row.indices, row.data
    keep = (cols != c) & (vals > 0)
    cols, vals = cols[keep], vals[keep]
    order = np.lexsort((cols, -vals))[:k]
    nbrs, weights = cols[order], vals[order]
    sub = P[nbrs][:, nbrs].toarray()
    sub = (sub + sub.T) / 2
    G = nx.Graph()
    label = (lambda i: str(words[i])) if words is not None else (lambda i: str(i))
    G.add_nodes_from((int(n), {"word": label(n), "ppmi": float(w)}) for n, w in zip(nbrs, weights))
    a, b = np.nonzero(np.triu(sub, 1) > 0)
    G.add_weighted_edges_from(zip(nbrs[a].tolist(), nbrs[b].tolist(), sub[a, b].tolist()))
    if include_word:
        G.add_node(c, word=label(c), ppmi=0.0, centre=True)
        G.add_weighted_edges_from((c, int(n), float(w)) for n, w in zip(nbrs, weights))
    return G


@dataclass
class SenseCommunities:
    """Louvain communities of a word's PPMI neighbours, largest share first.

    ``communities``: lists of neighbour words (or ids), each sorted by PPMI with the word;
    ``share``: each community's fraction of the word's total PPMI to its neighbours;
    ``modularity``: of the partition on the neighbour graph.
    """

    word: str
    communities: list
    share: list
    modularity: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def sense_communities(ppmi, word, k: int = 30, words=None, *, seed: int = 0,
                      resolution: float = 1.0) -> SenseCommunities:
    """Split ``word``'s top-k PPMI neighbours into communities
    (``networkx.community.louvain_communities`` with ``seed``, on the neighbour graph *without*
    the word). For a polysemous word each sense should form its own community ("bank": river,
    shore, water... vs loan, money, deposit...). Isolated neighbours form singleton
    communities."""
    import networkx as nx

    resolution = finite_real(resolution, "resolution")     # NaN: every neighbour its own community
    words = None if words is None else list(words)      # as word_neighbourhood: a Vocabulary works too
    G = word_neighbourhood(ppmi, word, k, words, include_word=False)
    if G.number_of_nodes() == 0:
        raise ValueError(f"{word!r} has no positive PPMI neighbours")
    parts = nx.community.louvain_communities(G, weight="weight", resolution=resolution, seed=seed)
    modularity = nx.community.modularity(G, parts, weight="weight") if G.number_of_edges() else 0.0
    ppmi_to = nx.get_node_attributes(G, "ppmi")
    total = sum(ppmi_to.values())
    ranked = []
    for part in parts:
        members = sorted(part, key=lambda n: (-ppmi_to[n], n))
        ranked.append((sum(ppmi_to[n] for n in members) / total, members))
    ranked.sort(key=lambda x: (-x[0], x[1][0]))
    label = (lambda i: str(words[i])) if words is not None else (lambda i: int(i))
    return SenseCommunities(word=str(word) if words is None or isinstance(word, str) else str(words[int(word)]),
                            communities=[[label(n) for n in members] for _, members in ranked],
                            share=[float(s) for s, _ in ranked], modularity=float(modularity))
