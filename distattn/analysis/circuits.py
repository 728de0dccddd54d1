"""Vocabulary-space circuits against corpus statistics.

A head's QK circuit ``W_E W_Q (W_E W_K)ᵀ`` (vocab × vocab, factored) gives the pre-softmax
score a query word assigns a key word; PPMI gives the corpus's association of the two words.
:func:`qk_pmi_correlation` asks whether they rank word pairs alike, :func:`circuit_spectra`
and :func:`circuit_alignment` compare their spectra and dominant subspaces head by head.

Pairs and matching (:func:`qk_pmi_correlation`), for the top-N word ids ``w_1..w_N``:

* the pairs are the ordered pairs ``(a, b)``, ``a != b`` (query ``a``, key ``b``): N(N-1) of
  them. The diagonal is left out because a word's PPMI with itself mostly measures repetition
  and a head's self-score is dominated by ``‖W_E[a]‖``;
* ``orientation="query_key"`` pairs ``QK[a, b]`` with ``PPMI[a, b]``; ``"key_query"`` with
  ``PPMI[b, a]``. For a symmetric PPMI the two are the same. For a directional PPMI built from
  ``D[i, j] = #(j within the window after i)`` (``cooccurrence(..., symmetric=False)``) and a
  causal model, the key ``b`` precedes the query ``a``, so "key_query" (``D[b, a]``: "a after
  b") is the matching statistic; "query_key" asks whether a head attends to words that tend to
  *follow* the query;
* two values are reported: over **all** pairs (zero-PPMI pairs included, where they form one
  large tie) and over the pairs with **PPMI > 0** only;
* Spearman's ρ is that of ``scipy.stats.spearmanr`` (computed by :mod:`distattn.analysis._ranks`):
  Pearson correlation of average ranks (ties get the mean of the ranks they span). ``n_pairs``
  is returned with each value; ρ is NaN when one side is constant or fewer than 3 pairs remain.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from distattn.analysis._ranks import average_ranks, spearman
from distattn.analysis.factored import FactoredMatrix, _looks_factored, as_factored, to_numpy
from distattn.analysis.spectra import (Spectrum, SubspaceAlignment, principal_angles, spectrum,
                                      top_singular_vectors)
from distattn.memory import check_memory

__all__ = ["ORIENTATIONS", "PMICorrelation", "qk_pmi_correlation", "qk_pmi_correlations", "circuit_spectra",
           "circuit_alignment", "top_frequent_ids"]

ORIENTATIONS = ("query_key", "key_query")


@dataclass
class PMICorrelation:
    """Spearman ρ between QK scores and PPMI over ordered pairs of distinct top-N words."""

    rho_all: float
    pvalue_all: float
    n_pairs_all: int
    rho_positive: float
    pvalue_positive: float
    n_pairs_positive: int
    n_words: int
    orientation: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def top_frequent_ids(counts, n: int, exclude=()) -> np.ndarray:
    """Ids of the ``n`` most frequent words given per-id counts (e.g. row sums of the
    co-occurrence matrix or the vocabulary's counts), ties broken by the smaller id; ids in
    ``exclude`` (specials) are skipped."""
    shape = np.shape(counts) if not sp.issparse(counts) else None
    if shape is None or not shape or sum(k > 1 for k in shape) > 1:   # (n,), (n, 1) or (1, n): one count per id
        kind = "a scipy.sparse matrix" if shape is None else f"shape {shape}"
        raise ValueError(f"counts must be a 1-D array of per-id counts (e.g. S.sum(axis=1) of a co-occurrence "
                         f"matrix S); got {kind}")
    counts = np.asarray(counts, dtype=np.float64).ravel().copy()
    if not np.all(np.isfinite(counts)):
        bad = np.flatnonzero(~np.isfinite(counts))
        raise ValueError(f"counts must be finite; ids {bad[:10].tolist()} hold NaN or inf")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    skip = np.asarray(list(exclude))
    if skip.size and (skip.dtype.kind not in "iu" or skip.min() < 0 or skip.max() >= counts.size):
        raise ValueError(f"exclude must hold ids in [0, {counts.size}); got {skip.tolist()[:10]}")
    counts[skip.astype(np.int64)] = -np.inf
    order = np.lexsort((np.arange(counts.size), -counts))
    order = order[np.isfinite(counts[order])]
    return order[:n]


def qk_pmi_correlation(qk, ppmi, word_ids, *, orientation: str = "query_key") -> PMICorrelation:
    """Spearman correlation between a head's vocabulary-space QK scores and PPMI.

    Parameters
    ----------
    qk : factored (vocab, vocab) matrix (:class:`FactoredMatrix`, object with left/right or
        A/B, ``(left, right)`` tuple: ``(W_E W_Q, (W_E W_K)ᵀ)``) or a dense (vocab, vocab) array.
        Only the N × N block ``(E_N W_Q)(E_N W_K)ᵀ`` is formed.
    ppmi : scipy.sparse or dense (vocab, vocab), rows and columns indexed like the model's
        vocabulary.
    word_ids : int array (N,), distinct
        The words compared, e.g. :func:`top_frequent_ids` (N up to a few thousand: the two
        N × N blocks are dense).
    orientation : {"query_key", "key_query"}
        See the module docstring.

    Returns
    -------
    PMICorrelation
    """
    qk = _one_head(qk)
    return qk_pmi_correlations([qk], ppmi, word_ids, orientation=orientation)[0]


def _one_head(qk):
    if isinstance(qk, (FactoredMatrix, tuple)) or _looks_factored(qk):
        F = as_factored(qk)
        if F.ndim != 2:
            raise ValueError(f"qk has shape {F.shape}: pass one head (e.g. qk[h])")
        return F
    Q = to_numpy(qk)
    if Q.ndim != 2:
        raise ValueError(f"a dense qk must be 2-D (vocab, vocab), got shape {Q.shape}")
    return Q


def qk_pmi_correlations(heads, ppmi, word_ids, *, orientation: str = "query_key") -> list[PMICorrelation]:
    """:func:`qk_pmi_correlation` for several heads against one PPMI: ``heads`` is a list of
    one-head QK circuits, or a factored circuit of shape (n_heads, vocab, vocab). The PPMI
    block and its ranks are computed once for all of them."""
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    ids = np.asarray(word_ids)
    if ids.ndim != 1 or ids.size < 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"word_ids must be a 1-D integer array of at least 2 ids, got {ids!r:.80}")
    if np.unique(ids).size != ids.size:
        raise ValueError("word_ids must be distinct")
    if not isinstance(heads, list):               # one circuit, factored, with or without a head axis
        F = as_factored(heads)
        heads = [F] if F.ndim == 2 else [F[h] for h in range(F.shape[0])]
    heads = [_one_head(h) for h in heads]
    N = ids.size
    check_memory(8 * 4 * N * N, f"qk_pmi_correlation over {N} words (dense {N} x {N} blocks)")
    P = sp.csr_array(ppmi) if sp.issparse(ppmi) else to_numpy(ppmi)
    vocab = P.shape
    if len(vocab) != 2 or vocab[0] != vocab[1]:
        raise ValueError(f"ppmi must be square (vocab, vocab); got shape {vocab}")
    for h, head in enumerate(heads):              # one vocabulary on both sides, or the pairs compare different words
        if head.shape != vocab:
            raise ValueError(f"head {h}'s qk circuit has shape {tuple(head.shape)} but ppmi has shape {vocab}; "
                             f"they must index the same vocabulary")
    if ids.min() < 0 or ids.max() >= vocab[0]:
        raise ValueError(f"word_ids must lie in [0, {vocab[0]}) for a ppmi of shape {vocab}")
    pblock = P[ids][:, ids].toarray() if sp.issparse(P) else P[np.ix_(ids, ids)]
    pblock = np.asarray(pblock, dtype=np.float64)
    if not np.all(np.isfinite(pblock)):          # NaN would be ranked as a value and give a wrong rho
        raise ValueError("ppmi holds NaN or inf among the entries of word_ids")
    if orientation == "key_query":
        pblock = pblock.T
    off = ~np.eye(N, dtype=bool)
    y = pblock[off]
    pos = y > 0
    y_pos = y[pos]
    ranks_all, ranks_pos = average_ranks(y), average_ranks(y_pos)   # the PPMI side, shared by every head
    out = []
    for head in heads:
        block = head.submatrix(ids, ids) if isinstance(head, FactoredMatrix) else head[np.ix_(ids, ids)]
        x = np.asarray(block, dtype=np.float64)[off]
        if not np.all(np.isfinite(x)):
            raise ValueError(f"head {len(out)}'s qk circuit holds NaN or inf among the entries of word_ids")
        rho_a, p_a = spearman(x, y, ranks_y=ranks_all)
        rho_p, p_p = spearman(x[pos], y_pos, ranks_y=ranks_pos)
        out.append(PMICorrelation(rho_all=rho_a, pvalue_all=p_a, n_pairs_all=int(x.size), rho_positive=rho_p,
                                  pvalue_positive=p_p, n_pairs_positive=int(pos.sum()), n_words=int(N),
                                  orientation=orientation))
    return out


def circuit_spectra(circuit, name: str = "circuit") -> list[Spectrum]:
    """One :class:`Spectrum` per head of a factored circuit of shape (n_heads, m, n) (or a
    single (m, n) one), from the small core only; names are ``f"{name}[h]"``."""
    F = as_factored(circuit)
    if F.ndim == 2:
        return [spectrum(F, name=name)]
    if F.ndim != 3:
        raise ValueError(f"expected a (n_heads, m, n) or (m, n) factored circuit, got shape {F.shape}")
    return [spectrum(F[h], name=f"{name}[{h}]") for h in range(F.shape[0])]


def circuit_alignment(statistic, circuit, k: int, side: str = "left", *, basis=None,
                      **kwargs) -> list[SubspaceAlignment]:
    """:func:`subspace_alignment` of ``statistic`` (e.g. sparse PPMI) with each head of a
    factored circuit (n_heads, vocab, vocab). ``k`` must not exceed the head dimension. The
    statistic's top-k vectors are computed once, or passed as ``basis`` (vocab, k) =
    ``top_singular_vectors(statistic, k, side)`` to reuse them across circuits."""
    F = as_factored(circuit)
    heads = [F] if F.ndim == 2 else [F[h] for h in range(F.shape[0])]
    if basis is None:
        U = top_singular_vectors(statistic, k, side, **kwargs)
    else:
        U = np.asarray(basis, dtype=np.float64)
        if U.ndim != 2 or U.shape[1] != k:
            raise ValueError(f"basis must be (n, k={k}), the statistic's top-k singular vectors; got {U.shape}")
    out = []
    for head in heads:
        V = top_singular_vectors(head, k, side)
        if V.shape[0] != U.shape[0]:
            raise ValueError(f"the statistic has {U.shape[0]} {side} dimensions, the circuit {V.shape[0]}")
        theta = principal_angles(U, V)
        cos = np.cos(theta)
        out.append(SubspaceAlignment(cosines=cos, angles_deg=np.degrees(theta), mean_cos2=float(np.mean(cos ** 2)),
                                     chance=float(k / U.shape[0]), k=int(k), side=side))
    return out
