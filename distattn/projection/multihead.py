"""Multi-head projection (section 6.2): S split into h low-rank relational components.

Each head i owns a factored operator ``S⁽ⁱ⁾ = A_i B_iᵀ`` (A_i, B_i of shape
(vocab_size, r)), projects it into the sequence (``M⁽ⁱ⁾ = Q S⁽ⁱ⁾ Qᵀ``), mixes its own values
(``E⁽ⁱ⁾ = Attn⁽ⁱ⁾ (Q S⁽ⁱ⁾)``), and the heads are recombined.

Two splits:

* :func:`svd_heads` — the top ``h·r`` singular triplets of S, in blocks of r consecutive
  triplets: ``S⁽ⁱ⁾ = U_i Σ_i V_iᵀ``, so ``Σ_i S⁽ⁱ⁾`` is the best rank-h·r approximation of S
  and the heads are orthogonal components ordered by strength.
* :func:`nmf_heads` — a non-negative factorisation ``S ≈ W H`` (scikit-learn ``NMF``, needs
  S ≥ 0, e.g. PPMI) with ``h·r`` components sorted by strength ``‖W_k‖·‖H_k‖`` and grouped r
  per head: parts-based, non-negative heads, so ``Norm`` applies to each.

Recombination (:func:`combine_heads`):

* ``"sum"`` — ``Σ_i M⁽ⁱ⁾``, which by linearity equals ``Q (Σ_i S⁽ⁱ⁾) Qᵀ``: the projection of
  the recombined low-rank operator (W_O = stacked identities);
* ``"mean_row"`` — ``(1/h) Σ_i Norm(M⁽ⁱ⁾)`` (non-negative heads only);
* ``"mean_softmax"`` — ``(1/h) Σ_i softmax(M⁽ⁱ⁾ / τ)``: each head normalised on its own, as in
  a Transformer, then averaged.

The evidence (:func:`multihead_evidence`) uses each head's own attention *and* values and
sums the heads: ``E = Σ_i Attn⁽ⁱ⁾ (Q S⁽ⁱ⁾)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import NMF

from distattn.memory import check_memory
from distattn.projection import _checks
from distattn.projection.asymmetric import check_factors, directional_context_matrix, precomputed_svd
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES, attention_weights, row_normalize, softmax_rows
from distattn.stats.embeddings import truncated_svd

__all__ = ["Head", "svd_heads", "nmf_heads", "multihead_context_matrices", "combine_heads", "multihead_evidence",
           "HEAD_COMBINATIONS"]

HEAD_COMBINATIONS = ("sum", "mean_row", "mean_softmax")


@dataclass(frozen=True)
class Head:
    """One head's factored operator ``S⁽ⁱ⁾ = query @ key.T``.

    Attributes
    ----------
    query, key : ndarray of float64, shape (vocab_size, rank)
    """

    query: np.ndarray
    key: np.ndarray

    def __post_init__(self):
        query, key = check_factors(self.query, self.key)
        object.__setattr__(self, "query", query)   # lists, ints or torch tensors kept raw failed later, at use
        object.__setattr__(self, "key", key)

    @property
    def rank(self) -> int:
        return self.query.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.query.shape[0]

    def context_matrix(self, token_ids, *, unk_id: int | None = None) -> np.ndarray:
        """``M⁽ⁱ⁾ = Q S⁽ⁱ⁾ Qᵀ``, shape (length, length)."""
        return directional_context_matrix(token_ids, self.query, self.key, unk_id=unk_id)

    def profiles(self, ids) -> np.ndarray:
        """``Q S⁽ⁱ⁾ = query[ids] @ key.T``, shape (length, vocab_size); zero rows at OOV (negative ids)."""
        ids = _checks.token_ids(ids, self.vocab_size, require_known=False)
        check_memory(8.0 * ids.size * self.vocab_size, f"the dense head profiles ({ids.size} x {self.vocab_size})")
        q = np.where((ids >= 0)[:, None], self.query[np.maximum(ids, 0)], 0.0)
        return q @ self.key.T


def svd_heads(cooc, n_heads: int, head_rank: int, *, algorithm: str = "arpack", random_state=0,
              svd=None) -> list[Head]:
    """Split S into ``n_heads`` blocks of ``head_rank`` consecutive singular triplets.

    Head i gets ``U_i Σ_i^{1/2}`` and ``V_i Σ_i^{1/2}`` for triplets ``i·r … (i+1)·r - 1``.
    Needs ``n_heads · head_rank < vocab_size``. ``svd=(u, s, vt)``: a truncated SVD of S already
    at hand with at least ``n_heads · head_rank`` triplets (values descending); nothing is then
    factorised.
    """
    S = _checks.cooc_matrix(cooc)
    n_heads = _checks.positive_int(n_heads, "n_heads")
    head_rank = _checks.positive_int(head_rank, "head_rank")
    if svd is not None:
        u, s, vt = precomputed_svd(svd, n_heads * head_rank, S.shape)
    else:
        u, s, vt = truncated_svd(S, n_heads * head_rank, algorithm=algorithm, random_state=random_state,
                                 name="n_heads * head_rank")
    root = np.sqrt(s)
    A, B = u * root, vt.T * root
    return [Head(A[:, i * head_rank:(i + 1) * head_rank].copy(), B[:, i * head_rank:(i + 1) * head_rank].copy())
            for i in range(n_heads)]


def nmf_heads(cooc, n_heads: int, head_rank: int, *, random_state=0, max_iter: int = 400,
              init: str = "nndsvda", tol: float = 1e-4) -> list[Head]:
    """Split a non-negative S into ``n_heads`` groups of ``head_rank`` NMF components.

    ``S ≈ W H`` with ``W`` (vocab_size, h·r), ``H`` (h·r, vocab_size), both ≥ 0; components
    are sorted by ``‖W[:, k]‖ ‖H[k]‖`` (descending) and assigned r at a time.

    Raises
    ------
    ValueError
        If S has negative entries (NMF needs S ≥ 0; use PPMI rather than PMI).
    """
    S = _checks.cooc_matrix(cooc)
    n_heads = _checks.positive_int(n_heads, "n_heads")
    head_rank = _checks.positive_int(head_rank, "head_rank")
    if S.data.size and S.data.min() < 0:
        raise ValueError(f"nmf_heads needs a non-negative S (e.g. PPMI); the minimum entry is {float(S.data.min())}")
    k = n_heads * head_rank
    if k > S.shape[0]:
        raise ValueError(f"n_heads * head_rank = {k} exceeds vocab_size = {S.shape[0]}")
    model = NMF(n_components=k, init=init, random_state=random_state, max_iter=max_iter, tol=tol)
    W = model.fit_transform(S)
    H = model.components_
    order = np.argsort(-(np.linalg.norm(W, axis=0) * np.linalg.norm(H, axis=1)), kind="stable")
    W, H = W[:, order], H[order]
    return [Head(np.ascontiguousarray(W[:, i * head_rank:(i + 1) * head_rank]),
                 np.ascontiguousarray(H[i * head_rank:(i + 1) * head_rank].T)) for i in range(n_heads)]


def _check_heads(heads) -> list[Head]:
    if isinstance(heads, Head) or not isinstance(heads, Iterable):    # else "'Head' object is not iterable"
        raise TypeError(f"heads must be a list of Head objects (see svd_heads / nmf_heads); got "
                        f"{'a single Head: pass [head]' if isinstance(heads, Head) else type(heads).__name__}")
    heads = list(heads)
    if not heads or not all(isinstance(h, Head) for h in heads):
        raise ValueError("heads must be a non-empty sequence of Head objects (see svd_heads / nmf_heads)")
    sizes = {h.vocab_size for h in heads}
    if len(sizes) != 1:
        raise ValueError(f"all heads must share one vocab_size; got {sorted(sizes)}")
    return heads


def multihead_context_matrices(token_ids, heads, *, unk_id: int | None = None) -> np.ndarray:
    """``M⁽ⁱ⁾ = Q S⁽ⁱ⁾ Qᵀ`` for every head, shape (n_heads, length, length)."""
    heads = _check_heads(heads)
    ids = _checks.token_ids(token_ids, heads[0].vocab_size, unk_id=unk_id)
    return np.stack([h.context_matrix(ids) for h in heads])


def combine_heads(head_matrices, method: str = "sum", *, zero_rows: str = "uniform",
                  attention_temperature: float = 1.0, known=None) -> np.ndarray:
    """Recombine per-head matrices (n_heads, length, length) into one (length, length).

    See the module docstring for ``method`` ∈ {"sum", "mean_row", "mean_softmax"}.

    known : bool array of shape (length,), optional
        The in-vocabulary positions (``token_ids != unk_id`` for the ids given to
        :func:`multihead_context_matrices`, whose rows and columns are zero at the others).
        Rows and columns outside it are zero in the result, and the row normalisations run over
        the known columns only, as :func:`multihead_evidence` does; without it an out-of-vocabulary
        position is a key like any other (its zero score gets softmax weight).
    """
    _checks.choice(method, "method", HEAD_COMBINATIONS)
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    Ms = _checks.float_array(head_matrices, "head_matrices")
    if Ms.ndim != 3 or Ms.shape[0] == 0 or Ms.shape[1] != Ms.shape[2]:
        raise ValueError(f"head_matrices must have shape (n_heads, length, length) with n_heads >= 1; got {Ms.shape}")
    _checks.finite(Ms, "head_matrices")
    known = _checks.known_mask(known, Ms.shape[1])
    if method == "sum":
        total = Ms.sum(axis=0)
        return total if known is None else total * (known[:, None] & known[None, :])
    if method == "mean_row":
        if Ms.min() < -1e-12 * max(1.0, np.abs(Ms).max()):
            raise ValueError(f"method='mean_row' needs non-negative heads (e.g. nmf_heads); the minimum is "
                             f"{float(Ms.min())}. Use 'mean_softmax' or 'sum'")
        if known is None:
            return row_normalize(np.maximum(Ms, 0.0), zero_rows=zero_rows).mean(axis=0)
        return np.mean([attention_weights(np.maximum(M, 0.0), "row", zero_rows=zero_rows, known=known)
                        for M in Ms], axis=0)
    attention_temperature = _checks.positive_float(attention_temperature, "attention_temperature")
    if known is None:
        return softmax_rows(Ms, temperature=attention_temperature).mean(axis=0)
    return np.mean([attention_weights(M, "softmax", attention_temperature=attention_temperature, known=known)
                    for M in Ms], axis=0)


def multihead_evidence(token_ids, heads, *, normalization: str = "none", zero_rows: str = "uniform",
                       attention_temperature: float = 1.0, unk_id: int | None = None) -> np.ndarray:
    """``E = Σ_i Attn⁽ⁱ⁾ (Q S⁽ⁱ⁾)``: each head's own attention over its own values, summed.

    ``Attn⁽ⁱ⁾`` is M⁽ⁱ⁾, Norm(M⁽ⁱ⁾) or softmax(M⁽ⁱ⁾/τ) by ``normalization``. With
    ``"none"`` and SVD heads this is *not* the projection of the summed operator: the cross
    terms ``M⁽ⁱ⁾ Q S⁽ʲ⁾`` (i ≠ j) are absent, as in a Transformer where each head mixes only
    its own values.

    Returns
    -------
    ndarray of float64, shape (length, vocab_size)
    """
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    heads = _check_heads(heads)
    ids = _checks.token_ids(token_ids, heads[0].vocab_size, unk_id=unk_id)
    known = ids >= 0
    E = np.zeros((ids.size, heads[0].vocab_size))
    for i, head in enumerate(heads):  # a loop over heads, not tokens
        M = head.context_matrix(ids)
        if normalization == "row" and M.min() < 0:
            raise ValueError(f"normalization='row' needs non-negative heads (e.g. nmf_heads); head {i}'s scores "
                             f"reach {float(M.min())}. Use normalization='softmax' or 'none' for signed heads (svd_heads)")
        A = attention_weights(M, normalization, zero_rows=zero_rows,
                              attention_temperature=attention_temperature, known=known)
        E += A @ head.profiles(ids)
    return E
