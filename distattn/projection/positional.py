"""Order sensitivity via an augmented selector Q' = Q + P (section 4).

``M' = (Q + P) S (Q + P)ᵀ = QSQᵀ + QSPᵀ + PSQᵀ + PSPᵀ``, with P (length, vocab_size) a
position matrix in the same vocabulary space as Q. Without P, M is permutation-equivariant
(reordering the tokens permutes M's rows and columns); the cross blocks QSPᵀ and PSQᵀ break
that.

Two constructions of P:

(a) **corpus-derived**: ``P[r] = λ · π_r``, where ``π_r`` is the empirical distribution of
    the tokens found at absolute position ``r`` of the corpus documents
    (:func:`positional_distributions`, :func:`corpus_position_matrix`). ``P[r] S`` is then
    the association profile of "whatever usually stands at position r".
(b) **sinusoidal** (Vaswani et al. 2017): ``PE[r, 2i] = sin(r / base^{2i/d})``,
    ``PE[r, 2i+1] = cos(r / base^{2i/d})``, mapped into vocabulary space through an embedding
    basis U (vocab_size, d), e.g. the top-d left singular vectors of S:
    ``P = λ · PE Uᵀ`` (:func:`sinusoidal_encoding`, :func:`sinusoidal_position_matrix`,
    :func:`embedding_basis`). This P is dense, so its size is checked before allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from distattn.memory import check_memory
from distattn.projection import _checks
from distattn.projection.core import _gather, _profiles
from distattn.stats._kernels import csr_dense_matmul
from distattn.stats.embeddings import truncated_svd

__all__ = [
    "PositionalContext", "positional_distributions", "corpus_position_matrix", "sinusoidal_encoding",
    "embedding_basis", "sinusoidal_position_matrix", "positional_context_matrix", "CorpusPositional",
]


def positional_distributions(documents, vocab_size: int, max_length: int, *,
                             unk_id: int | None = None) -> sp.csr_array:
    """Empirical distribution of the tokens at each absolute position.

    ``π[r, v] = #{documents whose token at position r is v} / #{documents with an
    in-vocabulary token at position r}``, for r < ``max_length``. OOV tokens are not counted;
    a position that no document reaches has a zero row.

    Parameters
    ----------
    documents : RaggedIds, (ids, offsets) or list of int arrays
        A flat int32 id array plus int64 offsets is the fast form.
    vocab_size, max_length : int

    Returns
    -------
    scipy.sparse.csr_array of float64, shape (max_length, vocab_size)
    """
    vocab_size = _checks.positive_int(vocab_size, "vocab_size")
    max_length = _checks.positive_int(max_length, "max_length")
    docs = _checks.documents(documents, vocab_size, unk_id=unk_id)
    position = np.arange(docs.n_tokens, dtype=np.int64) - np.repeat(docs.offsets[:-1], docs.lengths)
    keep = (position < max_length) & (docs.ids >= 0)
    counts = sp.csr_array((np.ones(int(keep.sum())), (position[keep], docs.ids[keep].astype(np.int64))),
                          shape=(max_length, vocab_size))
    counts.sum_duplicates()
    totals = np.asarray(counts.sum(axis=1)).ravel()
    return sp.csr_array(sp.diags_array(1.0 / np.where(totals == 0, 1.0, totals)) @ counts)


def corpus_position_matrix(distributions, length: int, *, scale: float = 1.0) -> sp.csr_array:
    """P for a sequence of ``length`` tokens: ``P[r] = scale · π_r`` (construction (a)).

    Parameters
    ----------
    distributions : sparse or array-like, shape (max_length, vocab_size)
        From :func:`positional_distributions`.
    length : int
        Must not exceed ``max_length``.
    scale : float > 0
        λ, the weight of position relative to identity (Q's rows have mass 1, π_r's too).

    Returns
    -------
    scipy.sparse.csr_array of float64, shape (length, vocab_size)
    """
    length = _checks.positive_int(length, "length")
    scale = _checks.positive_float(scale, "scale")
    if not sp.issparse(distributions) and np.ndim(distributions) != 2:   # 0-d: scipy's "missing argument 'shape'"
        raise ValueError(f"distributions must be 2-D (max_length, vocab_size); got shape {np.shape(distributions)}")
    _checks.real(distributions, "distributions")
    pi = sp.csr_array(distributions, dtype=np.float64)
    if pi.ndim != 2:
        raise ValueError(f"distributions must be 2-D (max_length, vocab_size); got shape {pi.shape}")
    _checks.finite(pi, "distributions")
    if length > pi.shape[0]:
        raise ValueError(f"length={length} exceeds the {pi.shape[0]} positions the distributions cover; "
                         f"recompute positional_distributions with max_length >= {length}")
    return sp.csr_array(pi[:length] * scale)


def sinusoidal_encoding(length: int, dim: int, *, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al.'s fixed encodings: ``PE[r, 2i] = sin(r ω_i)``, ``PE[r, 2i+1] = cos(r ω_i)``
    with ``ω_i = base^{-2i/dim}``.

    Returns
    -------
    ndarray of float64, shape (length, dim)
    """
    length = _checks.positive_int(length, "length")
    dim = _checks.positive_int(dim, "dim")
    base = _checks.positive_float(base, "base")
    pos = np.arange(length, dtype=np.float64)[:, None]
    omega = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    pe = np.empty((length, dim))
    pe[:, 0::2] = np.sin(pos * omega)
    pe[:, 1::2] = np.cos(pos * omega[: dim // 2])
    return pe


def embedding_basis(cooc, dim: int, *, algorithm: str = "arpack", random_state=0) -> np.ndarray:
    """U (vocab_size, dim): the top-``dim`` left singular vectors of S, an orthonormal basis
    that maps d-dimensional encodings into vocabulary space."""
    S = _checks.cooc_matrix(cooc)
    u, _, _ = truncated_svd(S, dim, algorithm=algorithm, random_state=random_state)
    return u


def sinusoidal_position_matrix(length: int, basis, *, scale: float = 1.0, base: float = 10000.0) -> np.ndarray:
    """P = scale · PE Uᵀ (construction (b)): sinusoidal encodings of dimension d = basis.shape[1]
    expressed in vocabulary coordinates.

    Parameters
    ----------
    length : int
    basis : array-like or sparse, shape (vocab_size, d)
        E.g. :func:`embedding_basis`.

    Returns
    -------
    ndarray of float64, shape (length, vocab_size) (dense; size checked first)
    """
    U = _checks.float_array(basis, "basis")
    if U.ndim != 2:
        raise ValueError(f"basis must be 2-D (vocab_size, dim); got shape {U.shape}")
    if U.shape[1] == 0:     # else sinusoidal_encoding's "dim must be an integer >= 1", an argument not passed here
        raise ValueError(f"basis must have at least one column (its dim); got shape {U.shape}")
    _checks.finite(U, "basis")
    length = _checks.positive_int(length, "length")
    scale = _checks.positive_float(scale, "scale")
    check_memory(8.0 * length * U.shape[0], f"the dense sinusoidal position matrix ({length} x {U.shape[0]})")
    return scale * (sinusoidal_encoding(length, U.shape[1], base=base) @ U.T)


@dataclass(frozen=True)
class PositionalContext:
    """The four blocks of ``(Q + P) S (Q + P)ᵀ``, each (length, length).

    Attributes
    ----------
    content_content : QSQᵀ, the order-blind projection M.
    content_position : QSPᵀ, ``[r, s] = S-association of token r with what usually stands at s``.
    position_content : PSQᵀ, ``[r, s] = S-association of what usually stands at r with token s``.
    position_position : PSPᵀ, position-position bias.
    """

    content_content: np.ndarray
    content_position: np.ndarray
    position_content: np.ndarray
    position_position: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """M' = QSQᵀ + QSPᵀ + PSQᵀ + PSPᵀ."""
        return self.content_content + self.content_position + self.position_content + self.position_position

    def block_matrix(self) -> np.ndarray:
        """The paper's 2×2 block view ``[[QSQᵀ, QSPᵀ], [PSQᵀ, PSPᵀ]]``, shape (2·length, 2·length)."""
        return np.block([[self.content_content, self.content_position],
                         [self.position_content, self.position_position]])


def _dense(x) -> np.ndarray:
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def positional_context_matrix(token_ids, cooc, position_matrix, *, unk_id: int | None = None) -> PositionalContext:
    """The blocks of ``M' = (Q + P) S (Q + P)ᵀ`` for one sequence.

    Parameters
    ----------
    token_ids : array-like of int, shape (length,)
    cooc : sparse or array-like, shape (vocab_size, vocab_size)
    position_matrix : sparse or array-like, shape (length, vocab_size)
        P, from :func:`corpus_position_matrix` or :func:`sinusoidal_position_matrix`. An OOV
        token keeps its row of P (its position exists) but has a zero row of Q.

    Returns
    -------
    PositionalContext
    """
    S = _checks.cooc_matrix(cooc)
    ids = _checks.token_ids(token_ids, S.shape[0], unk_id=unk_id)
    _checks.real(position_matrix, "position_matrix")
    P = position_matrix if sp.issparse(position_matrix) else np.asarray(position_matrix, dtype=np.float64)
    if P.ndim != 2 or P.shape != (ids.size, S.shape[0]):
        raise ValueError(f"position_matrix must have shape (length, vocab_size) = {(ids.size, S.shape[0])}; "
                         f"got {P.shape}")
    P = sp.csr_array(P, dtype=np.float64) if sp.issparse(P) else P
    _checks.finite(P, "position_matrix")
    QS = _profiles(S, ids)
    PS = (P @ S) if sp.issparse(P) else np.asarray((S.T @ P.T).T)     # (length, vocab_size)
    PS_cols = _dense(PS[:, np.maximum(ids, 0)]) * (ids >= 0)            # PSQᵀ, OOV columns zero
    return PositionalContext(
        content_content=_gather(S, ids),
        content_position=_dense(QS @ P.T),
        position_content=PS_cols,
        position_position=_dense(PS @ P.T),
    )


class CorpusPositional:
    """``(Q + P) S (Q + P)ᵀ`` for many sequences with the corpus-derived P (construction (a)).

    The position-only products do not depend on the sequence, so they are computed once here:
    ``Π S`` (max_length, vocab_size), ``S Πᵀ`` (vocab_size, max_length) and ``Π S Πᵀ``
    (max_length, max_length), where Π holds the distributions. A sequence's blocks are then
    gathers, ``QSPᵀ[r, s] = (S Πᵀ)[id_r, s]`` and ``PSQᵀ[r, s] = (Π S)[r, id_s]`` (times λ,
    λ²), equal to :func:`positional_context_matrix` with
    ``corpus_position_matrix(distributions, length, scale=scale)``.

    Parameters
    ----------
    cooc : sparse or array-like, shape (vocab_size, vocab_size)
    distributions : sparse or array-like, shape (max_length, vocab_size)
        From :func:`positional_distributions`.
    scale : float > 0
        λ.
    """

    def __init__(self, cooc, distributions, *, scale: float = 1.0):
        S = _checks.cooc_matrix(cooc)
        _checks.real(distributions, "distributions")
        pi = sp.csr_array(distributions, dtype=np.float64)
        if pi.ndim != 2 or pi.shape[1] != S.shape[0]:
            raise ValueError(f"distributions must have shape (max_length, vocab_size={S.shape[0]}); got {pi.shape}")
        _checks.finite(pi, "distributions")
        self.scale = _checks.positive_float(scale, "scale")
        check_memory(16.0 * pi.shape[0] * S.shape[0], f"the position profiles ({pi.shape[0]} x {S.shape[0]}, twice)")
        self.cooc = S
        self.max_length = pi.shape[0]
        pi_t = np.ascontiguousarray(pi.T.toarray())                               # (vocab_size, max_length)
        St = sp.csr_array(S.T)
        # sparse x dense on all CPU threads (scipy's product is single-threaded)
        self.profile_positions_ = self.scale * csr_dense_matmul(S.indptr, S.indices, S.data, pi_t)       # S Πᵀ
        self.position_profiles_ = self.scale * csr_dense_matmul(St.indptr, St.indices, St.data, pi_t).T  # Π S
        self.position_position_ = self.scale * np.asarray(pi @ self.profile_positions_)   # λ² Π S Πᵀ

    def __call__(self, token_ids, *, unk_id: int | None = None) -> PositionalContext:
        """The four blocks for one sequence (at most ``max_length`` tokens)."""
        ids = _checks.token_ids(token_ids, self.cooc.shape[0], unk_id=unk_id)
        n = ids.size
        if n > self.max_length:
            raise ValueError(f"the sequence has {n} tokens; the distributions cover {self.max_length} positions "
                             f"(recompute positional_distributions with max_length >= {n})")
        known = ids >= 0
        safe = np.where(known, ids, 0)
        return PositionalContext(
            content_content=_gather(self.cooc, ids),
            content_position=self.profile_positions_[safe, :n] * known[:, None],
            position_content=self.position_profiles_[:n, safe] * known[None, :],
            position_position=self.position_position_[:n, :n].copy(),
        )
