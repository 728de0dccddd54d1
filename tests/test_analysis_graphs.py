"""distattn.analysis: attention graphs, PPMI sense communities, rollout and attention flow."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from distattn.analysis import (attention_flow, attention_flow_reference, attention_graph, attention_rollout,
                               flow_network, graph_metrics, in_degree, pagerank, residual_attention, row_entropy,
                               sense_communities, spectral_gap, word_neighbourhood, write_graphml)

rng = np.random.default_rng(0)


def _attention(shape, causal=False, seed=0):
    g = np.random.default_rng(seed)
    A = g.random(shape) ** 3
    if causal:
        A = np.tril(A)
    return A / A.sum(-1, keepdims=True)


# --------------------------------------------------------------------------- sequence graphs

def test_attention_graph_edges_and_labels():
    A = _attention((4, 4), causal=True)
    G = attention_graph(A, tokens=["the", "river", "bank", "flooded"])
    assert G.number_of_nodes() == 4 and G.number_of_edges() == 10        # lower triangle incl. diagonal
    assert G.nodes[2]["token"] == "bank"
    assert G[3][1]["weight"] == pytest.approx(A[3, 1])
    assert not G.has_edge(1, 3)


def test_uniform_and_identity_closed_forms():
    R = 5
    U = np.full((R, R), 1 / R)
    np.testing.assert_allclose(pagerank(U), np.full(R, 1 / R), atol=1e-9)
    np.testing.assert_allclose(in_degree(U), np.ones(R))
    np.testing.assert_allclose(row_entropy(U), np.log(R))
    np.testing.assert_allclose(row_entropy(U, base=2), np.log2(R))
    assert spectral_gap(U) == pytest.approx(1.0)
    assert spectral_gap(np.eye(R)) == pytest.approx(0.0)
    np.testing.assert_allclose(row_entropy(np.eye(R)), 0.0)


def test_pagerank_closed_form_and_numpy_cross_check():
    R, d = 6, 0.85
    star = np.zeros((R, R))
    star[:, 0] = 1.0                                    # everyone attends to token 0
    pr = pagerank(star, damping=d)
    assert pr[0] == pytest.approx((1 - d) / R + d)
    np.testing.assert_allclose(pr[1:], (1 - d) / R)
    A = _attention((R, R), seed=2)
    p = np.full(R, 1 / R)
    for _ in range(500):                                # power iteration of the Google matrix
        p = (1 - d) / R + d * p @ A
    np.testing.assert_allclose(pagerank(A, d), p, atol=1e-9)


def test_spectral_gap_of_causal_pattern_reads_the_diagonal():
    A = _attention((5, 5), causal=True, seed=3)
    diag = np.sort(np.abs(np.diag(A)))[::-1]
    assert spectral_gap(A) == pytest.approx(max(0.0, 1 - diag[1]))
    with pytest.raises(ValueError, match="row-stochastic"):
        spectral_gap(2 * A)


def test_graph_metrics_and_graphml_round_trip(tmp_path):
    A = _attention((4, 4))
    m = graph_metrics(A, tokens=list("abcd"))
    assert set(m) == {"tokens", "pagerank", "in_degree", "row_entropy", "spectral_gap"}
    # closed-form references: PageRank solves (I - α Aᵀ) p = (1 - α)/R (A is row-stochastic, edges i -> j)
    np.testing.assert_allclose(m["pagerank"], np.linalg.solve(np.eye(4) - 0.85 * A.T, np.full(4, 0.15 / 4)),
                               rtol=1e-8)
    np.testing.assert_allclose(m["in_degree"], A.sum(axis=0))
    np.testing.assert_allclose(m["row_entropy"], -(A * np.log(A)).sum(axis=1))
    assert m["spectral_gap"] == pytest.approx(1 - np.sort(np.abs(np.linalg.eigvals(A)))[-2])
    assert m["tokens"] == list("abcd")
    write_graphml(attention_graph(A, tokens=list("abcd")), tmp_path / "att.graphml")
    H = nx.read_graphml(tmp_path / "att.graphml")
    assert H.number_of_edges() == 16
    assert H.nodes["2"]["token"] == "c"
    assert float(H["1"]["3"]["weight"]) == pytest.approx(A[1, 3])
    write_graphml(flow_network(np.stack([A, A]), tokens=list("abcd")), tmp_path / "flow.graphml")
    F = nx.read_graphml(tmp_path / "flow.graphml")
    assert F.number_of_nodes() == 12 and "0_2" in F and F.nodes["0_2"]["token"] == "c"
    assert not list(tmp_path.glob(".*part*"))



def test_graphml_keeps_the_parallel_edges_of_a_multigraph(tmp_path):
    G = nx.MultiDiGraph()
    G.add_edge((0, 1), (1, 1), weight=0.25)
    G.add_edge((0, 1), (1, 1), weight=0.75)          # a second edge between the same nodes
    write_graphml(G, tmp_path / "multi.graphml")
    H = nx.read_graphml(tmp_path / "multi.graphml")
    assert H.is_multigraph() and H.number_of_edges() == 2
    assert sorted(d["weight"] for _, _, d in H.edges(data=True)) == [0.25, 0.75]


@pytest.mark.parametrize("a, b", [((1, 2), "1_2"), (1, "1")])
def test_graphml_refuses_two_nodes_that_would_share_an_id(tmp_path, a, b):
    # both were written under one GraphML id, so reading the file back merged them into one node
    G = nx.DiGraph()
    G.add_edge(a, b, weight=0.5)
    with pytest.raises(ValueError, match=r"would both be written as GraphML id"):
        write_graphml(G, tmp_path / "clash.graphml")
    assert not (tmp_path / "clash.graphml").exists()


def test_graphml_round_trips_xml_special_and_non_ascii_labels(tmp_path):
    toks = ["<unk>", "a&b", "don't", '"q"', "über", "日本", ""]
    A = _attention((7, 7))
    G = attention_graph(A, tokens=toks)
    write_graphml(G, tmp_path / "att.graphml")
    H = nx.read_graphml(tmp_path / "att.graphml", node_type=int)
    assert [H.nodes[k]["token"] for k in range(7)] == toks
    assert {e: d["weight"] for e, d in H.edges.items()} == {e: d["weight"] for e, d in G.edges.items()}


@pytest.mark.parametrize("token", ["a\x00b", "tab\x0bstop", "\ufffe", "\ud800"])
def test_graphml_refuses_a_label_xml_cannot_hold(tmp_path, token):
    # networkx's ElementTree writer wrote it as is: a file that read_graphml (any XML parser) refuses
    G = attention_graph(np.eye(2), tokens=["ok", token])
    with pytest.raises(ValueError, match=r"node 1's 'token' .* cannot be stored in GraphML"):
        write_graphml(G, tmp_path / "bad.graphml")
    assert not (tmp_path / "bad.graphml").exists()
    H = nx.DiGraph()
    H.add_edge("ok", token)
    with pytest.raises(ValueError, match=r"node .* cannot be stored in GraphML"):
        write_graphml(H, tmp_path / "bad.graphml")

@pytest.mark.parametrize("where", ["node", "edge", "graph"])
def test_graphml_refuses_an_attribute_name_xml_cannot_hold(tmp_path, where):
    # the name goes into <key attr.name=...> as is: the file was written and read_graphml refused it
    G = nx.DiGraph()
    G.add_edge("a", "b")
    {"node": G.nodes["a"], "edge": G.edges["a", "b"], "graph": G.graph}[where]["w\x00"] = 1.0
    with pytest.raises(ValueError, match=r"attribute name 'w\\x00' holds the character .* cannot be stored"):
        write_graphml(G, tmp_path / "bad.graphml")
    assert not (tmp_path / "bad.graphml").exists()


def test_graphml_refuses_two_attribute_names_that_would_share_a_name(tmp_path):
    # 5 and "5" were both written as attr.name "5": reading the file back kept only one of the values
    G = nx.DiGraph()
    G.add_node("a", **{"5": 2.0})
    G.nodes["a"][5] = 1.0
    with pytest.raises(ValueError, match=r"attributes '5' and 5 would both be written as GraphML attribute '5'"):
        write_graphml(G, tmp_path / "clash.graphml")
    assert not (tmp_path / "clash.graphml").exists()
    G.nodes["a"][(1, 2)] = 3.0                      # a name that is not a string, but unique, is written as str()
    del G.nodes["a"][5]
    write_graphml(G, tmp_path / "ok.graphml")
    assert nx.read_graphml(tmp_path / "ok.graphml").nodes["a"] == {"5": 2.0, "(1, 2)": 3.0}


def test_graphml_refuses_multigraph_edge_keys_it_cannot_keep_apart(tmp_path):
    # a key is written as the edge's id, str(key): 1 and "1" between the same nodes were one id, and
    # read_graphml kept only one of the two edges; a key with "\x00" gave a file read_graphml refused
    G = nx.MultiDiGraph()
    G.add_edge("a", "b", key=1, weight=0.25)
    G.add_edge("a", "b", key="1", weight=0.75)
    with pytest.raises(ValueError, match=r"edges 'a' -> 'b' with keys 1 and '1' would both be written as GraphML"):
        write_graphml(G, tmp_path / "clash.graphml")
    G = nx.MultiDiGraph()
    G.add_edge("a", "b", key="k\x00", weight=0.25)
    G.add_edge("a", "b", key="j", weight=0.75)
    with pytest.raises(ValueError, match=r"key 'k\\x00' holds the character .* cannot be stored in GraphML"):
        write_graphml(G, tmp_path / "bad.graphml")
    assert not list(tmp_path.iterdir())
    G = nx.MultiDiGraph()                            # the same key on different node pairs is fine
    G.add_edge("a", "b", key=1)
    G.add_edge("a", "c", key="1")
    G.add_edge("a", "c", key=2)
    write_graphml(G, tmp_path / "ok.graphml")
    assert nx.read_graphml(tmp_path / "ok.graphml").number_of_edges() == 3


def test_graphml_keeps_a_carriage_return_in_a_string_value(tmp_path):
    # ElementTree writes "\r" in element text as is, and XML end-of-line handling reads it back as "\n"
    toks = ["a\rb", "c\r\nd", "e\nf"]
    G = attention_graph(np.eye(3), tokens=toks)
    G.graph["note"] = "x\ry"
    G.add_edge(0, 1, weight=0.5, label="p\rq")
    write_graphml(G, tmp_path / "cr.graphml")
    H = nx.read_graphml(tmp_path / "cr.graphml", node_type=int)
    assert [H.nodes[k]["token"] for k in range(3)] == toks
    assert H.graph["note"] == "x\ry" and H.edges[0, 1]["label"] == "p\rq"


# --------------------------------------------------------------------------- PPMI sense communities

WORDS = ["bank", "river", "water", "shore", "flood", "loan", "money", "deposit", "credit", "the", "of"]


def _bank_ppmi():
    n = len(WORDS)
    P = np.zeros((n, n))
    nature, finance = [1, 2, 3, 4], [5, 6, 7, 8]
    for group in (nature, finance):
        for a in group:
            for b in group:
                if a != b:
                    P[a, b] = 1.0 + 0.1 * (a + b)
    P[0, 1:9] = P[1:9, 0] = np.linspace(2.0, 1.2, 8)
    P[9, 10] = P[10, 9] = 0.5                          # unrelated words, not neighbours of "bank"
    return sp.csr_array(P)


def test_word_neighbourhood_top_k_and_mutual_edges():
    G = word_neighbourhood(_bank_ppmi(), "bank", k=5, words=WORDS)
    assert sorted(G.nodes[n]["word"] for n in G) == ["bank", "flood", "loan", "river", "shore", "water"]
    assert G.has_edge(1, 2) and not G.has_edge(4, 5)     # mutual edges only within a sense
    assert G.degree(0) == 5


def test_word_neighbourhood_of_a_ppmi_with_duplicate_entries():
    # a non-canonical CSR (each entry stored as two halves, valid scipy input) once gave each
    # neighbour half its PPMI and picked the top k among the halves: wrong neighbours and weights
    P = _bank_ppmi()
    rows = np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))
    order = np.argsort(np.concatenate([rows, rows]), kind="stable")
    D = sp.csr_array((np.concatenate([P.data, P.data])[order] / 2, np.concatenate([P.indices, P.indices])[order],
                      2 * P.indptr), shape=P.shape)
    assert not D.has_canonical_format and np.array_equal(D.toarray(), P.toarray())
    for k in (3, 5, 8):
        want = word_neighbourhood(P, "bank", k=k, words=WORDS)
        got = word_neighbourhood(D, "bank", k=k, words=WORDS)
        assert sorted(got.nodes(data="ppmi")) == sorted(want.nodes(data="ppmi"))
        assert sorted(got.edges(data="weight")) == sorted(want.edges(data="weight"))
    res = sense_communities(D, "bank", k=8, words=WORDS, seed=0)
    assert sorted(map(sorted, res.communities)) == [["credit", "deposit", "loan", "money"],
                                                    ["flood", "river", "shore", "water"]]


def test_sense_communities_separate_the_two_banks():
    res = sense_communities(_bank_ppmi(), "bank", k=8, words=WORDS, seed=0)
    assert sorted(map(sorted, res.communities)) == [["credit", "deposit", "loan", "money"],
                                                    ["flood", "river", "shore", "water"]]
    assert sum(res.share) == pytest.approx(1.0) and res.modularity > 0.4
    assert res.communities[0][0] == "river"             # the larger share first, members by PPMI
    with pytest.raises(KeyError, match="vocabulary"):
        sense_communities(_bank_ppmi(), "bnak", words=WORDS)


def test_a_vocabulary_object_serves_as_words():
    """A distattn Vocabulary (iterates its words in id order, but vocab[i] looks a word *up*)
    passed as words raised a bare KeyError: np.int32(0) when the nodes were labelled."""
    from distattn.corpus.vocabulary import Vocabulary
    vocab = Vocabulary(WORDS, specials=())
    assert list(vocab) == list(WORDS)
    want = word_neighbourhood(_bank_ppmi(), "bank", k=5, words=WORDS)
    got = word_neighbourhood(_bank_ppmi(), "bank", k=5, words=vocab)
    assert sorted(got.nodes(data="word")) == sorted(want.nodes(data="word"))
    assert sense_communities(_bank_ppmi(), 0, k=8, words=vocab, seed=0) == \
        sense_communities(_bank_ppmi(), 0, k=8, words=WORDS, seed=0)


# --------------------------------------------------------------------------- rollout and flow

def test_residual_attention_and_rollout_closed_form():
    R, L = 5, 3
    U = np.full((L, R, R), 1 / R)
    hat = residual_attention(U[0])
    np.testing.assert_allclose(hat, 0.5 / R + 0.5 * np.eye(R))
    # Â = ½J + ½I with J = 11ᵀ/R idempotent: Â^L = 2^-L I + (1 - 2^-L) J
    expected = 0.5 ** L * np.eye(R) + (1 - 0.5 ** L) / R
    np.testing.assert_allclose(attention_rollout(U), expected, atol=1e-12)
    np.testing.assert_allclose(attention_rollout(np.eye(R)[None].repeat(4, 0)), np.eye(R))
    per = attention_rollout(U, per_layer=True)
    assert per.shape == (L, R, R)
    np.testing.assert_allclose(per[0], hat)


def test_flow_of_identity_attention_is_identity():
    np.testing.assert_allclose(attention_flow(np.eye(6)[None].repeat(3, 0)), np.eye(6), atol=1e-12)


def _abnar_zuidema_flow(A_hat):
    """Independent reference: A&Z's own construction (edges from the upper layer down,
    flow from output to input), networkx Edmonds–Karp."""
    L, R, _ = A_hat.shape
    G = nx.DiGraph()
    for layer in range(1, L + 1):
        for i in range(R):
            for j in range(R):
                if A_hat[layer - 1, i, j] > 0:
                    G.add_edge((layer, i), (layer - 1, j), capacity=A_hat[layer - 1, i, j])
    out = np.zeros((R, R))
    for i in range(R):
        for j in range(R):
            out[i, j] = nx.maximum_flow_value(G, (L, i), (0, j), flow_func=nx.algorithms.flow.edmonds_karp)
    return out


@pytest.mark.parametrize("layers,length,causal", [(1, 5, False), (2, 6, False), (2, 6, True), (3, 5, False),
                                                  (3, 6, True), (4, 5, False)])
def test_attention_flow_equals_networkx_max_flow(layers, length, causal):
    A = _attention((layers, 2, length, length), causal=causal, seed=layers * 10 + length)   # two heads, averaged
    hat = residual_attention(A.mean(axis=1))
    reference = _abnar_zuidema_flow(hat)
    np.testing.assert_allclose(attention_flow(A), reference, atol=1e-10)
    np.testing.assert_allclose(attention_flow_reference(A), reference, atol=1e-10)
    if layers >= 2:
        np.testing.assert_allclose(attention_flow(A, method="dinic"), reference, atol=1e-10)


def test_attention_flow_options():
    A = _attention((2, 6, 6), seed=7)
    full = attention_flow(A)
    np.testing.assert_allclose(attention_flow(A, outputs=[5, 0]), full[[5, 0]])
    norm = attention_flow(A, normalize=True)
    np.testing.assert_allclose(norm.sum(1), 1.0)
    assert np.all(full <= 1 + 1e-12)
    with pytest.raises(ValueError, match="closed form"):
        attention_flow(_attention((3, 4, 4)), method="closed_form")
    with pytest.raises(ValueError, match="outputs"):
        attention_flow(A, outputs=[6])
    with pytest.raises(ValueError, match="shape"):
        attention_flow(np.ones((2, 3, 4)))


@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf"), True])
def test_attention_flow_refuses_an_eps_that_would_never_saturate(eps):
    U = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="eps must be a finite real number >= 0"):   # -1 used to loop forever
        attention_flow(np.stack([U, U, U]), eps=eps)


def test_graph_helpers_refuse_impossible_parameters():
    from distattn.analysis import allowed_keys, previous_token_attention
    with pytest.raises(ValueError, match=r"damping must be a number in \(0, 1\); got 1.5"):
        pagerank(np.full((3, 3), 1 / 3), damping=1.5)
    with pytest.raises(ValueError, match="length must be an integer >= 1"):
        previous_token_attention(0)                                   # once an IndexError
    with pytest.raises(ValueError, match="length must be an integer >= 1"):
        allowed_keys(-1)


def test_residual_attention_refuses_nan_and_negative_weights():
    from distattn.analysis import residual_attention
    with pytest.raises(ValueError, match="attention weights must be finite and non-negative"):
        residual_attention(np.full((3, 3), np.nan))                        # once a NaN matrix
    with pytest.raises(ValueError, match="attention weights must be finite and non-negative"):
        residual_attention(np.array([[1.5, -0.5], [0.5, 0.5]]))            # once "normalised" rows with a negative
    with pytest.raises(ValueError, match=r"residual must lie in \[0, 1\], got '0.5'"):
        residual_attention(np.eye(2), residual="0.5")                       # once a TypeError from '<='


def test_graph_and_ppmi_helpers_refuse_mismatched_labels_and_nan():
    A = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="tokens has 2 labels but the attention has 3 positions"):
        graph_metrics(A, tokens=["a", "b"])                               # once returned the short list
    P = _bank_ppmi()
    with pytest.raises(ValueError, match=f"words has 3 entries but ppmi has {P.shape[0]} rows"):
        word_neighbourhood(P, 0, words=WORDS[:3])                          # once an IndexError
    bad = P.copy()
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match="ppmi contains NaN or inf"):
        word_neighbourhood(bad, "bank", words=WORDS)                       # once silently fewer neighbours
    with pytest.raises(ValueError, match="1.0 is not an integer id"):
        word_neighbourhood(P, 1.0)                                         # once "1.0 is a string"


def test_a_0d_ppmi_is_named():
    """word_neighbourhood / sense_communities on a 0-d array once ended with scipy's 'function
    missing 1 required positional argument: 'shape''."""
    for call in (word_neighbourhood, sense_communities):
        with pytest.raises(ValueError, match=r"ppmi must be square \(vocab, vocab\), got shape \(\)"):
            call(np.array(0.5), 0)


@pytest.mark.parametrize("threshold", [float("nan"), "0.02"])
def test_attention_graph_refuses_a_threshold_that_is_not_a_number(threshold):
    # NaN compared false with every weight: a graph without edges and no error
    with pytest.raises(ValueError, match="threshold must be a finite real number"):
        attention_graph(np.full((3, 3), 1 / 3), threshold=threshold)


def test_sense_communities_refuses_a_resolution_that_is_not_a_number():
    # NaN gave each neighbour its own "community" (a negative modularity) without an error
    with pytest.raises(ValueError, match="resolution must be a finite real number"):
        sense_communities(_bank_ppmi(), "bank", k=5, words=WORDS, resolution=float("nan"))


def test_graphml_refuses_an_id_attribute_it_would_lose(tmp_path):
    # the graph's "id" was written as the <graph> element's id, which read_graphml does not read; a
    # multigraph edge's "id" was read back as the edge's key (its GraphML id) when no two edges are
    # parallel (read_graphml then returns a Graph and sets "id" from the file's edge ids)
    G = nx.DiGraph(id="run 7")
    G.add_edge("a", "b")
    with pytest.raises(ValueError, match=r"the graph's attribute 'id' would be lost"):
        write_graphml(G, tmp_path / "g.graphml")
    for cls in (nx.MultiGraph, nx.MultiDiGraph):
        M = cls()
        M.add_edge("a", "b", key=0, id="e7", weight=0.5)
        with pytest.raises(ValueError, match=r"edge 'a' -> 'b''s attribute 'id' would be lost"):
            write_graphml(M, tmp_path / "m.graphml")
    assert not list(tmp_path.iterdir())
    M.add_edge("a", "b", key=1, id="e8")            # parallel edges: read back as a multigraph, ids kept
    write_graphml(M, tmp_path / "m.graphml")
    assert sorted(d["id"] for *_, d in nx.read_graphml(tmp_path / "m.graphml").edges(data=True)) == ["e7", "e8"]
    # node and edge attributes named after GraphML's own attributes are data like any other: kept
    G = nx.DiGraph(name="g")
    G.add_node("a", id="n", key="k", source="s", target="t")
    G.add_edge("a", "b", id="e", key="k", source="s", target="t")
    write_graphml(G, tmp_path / "g.graphml")
    H = nx.read_graphml(tmp_path / "g.graphml")
    assert H.nodes["a"] == G.nodes["a"] and H.edges["a", "b"] == G.edges["a", "b"] and H.graph["name"] == "g"


def test_graphml_writes_a_graph_read_from_graphml_with_its_attribute_defaults(tmp_path):
    # read_graphml sets the graph's node_default and edge_default (dicts, {} without defaults) and
    # networkx's writer takes them as the defaults of its GraphML attributes; made strings, they failed
    # it with "AttributeError: 'str' object has no attribute 'get'": no graph read back could be written
    write_graphml(attention_graph(_attention((4, 4)), tokens=list("abcd")), tmp_path / "a.graphml")
    H = nx.read_graphml(tmp_path / "a.graphml")
    assert H.graph == {"node_default": {}, "edge_default": {}}
    write_graphml(H, tmp_path / "b.graphml")
    B = nx.read_graphml(tmp_path / "b.graphml")
    assert dict(B.nodes(data=True)) == dict(H.nodes(data=True)) and list(B.edges(data=True)) == list(H.edges(data=True))
    G = nx.DiGraph(node_default={"color": "red"}, edge_default={"weight": np.float32(0.5)})
    G.add_node("a", color="blue")
    G.add_edge("a", "b", weight=0.25)
    write_graphml(G, tmp_path / "c.graphml")
    C = nx.read_graphml(tmp_path / "c.graphml")
    assert C.graph == {"node_default": {"color": "red"}, "edge_default": {"weight": 0.5}}
    G.graph["node_default"]["size"] = 3             # no node has a "size": its default had nowhere to go
    with pytest.raises(ValueError, match=r"the graph's node_default 'size' would be lost"):
        write_graphml(G, tmp_path / "d.graphml")
    G.graph["node_default"] = "red"
    with pytest.raises(ValueError, match=r"the graph's attribute 'node_default' would be lost"):
        write_graphml(G, tmp_path / "d.graphml")
    assert not (tmp_path / "d.graphml").exists()
