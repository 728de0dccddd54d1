"""Cross-attention as cross-projection (section 6.3).

Queries come from a target sequence, keys and values from a source sequence::

    M_cross = Q_tgt S Q_srcᵀ          (target_length, source_length), M_cross[r, s] = S[tgt_r, src_s]
    E_cross = A_cross (Q_src S)       (target_length, vocab_size)

with ``A_cross`` = M_cross, Norm(M_cross) or softmax(M_cross / τ), normalised over the source
positions. For a non-symmetric operator pass the factors' product through
:func:`~distattn.projection.asymmetric.directional_context_matrix` instead.
"""

from __future__ import annotations

import numpy as np

from distattn.memory import check_memory
from distattn.projection import _checks
from distattn.projection.core import NORMALIZATIONS, ZERO_ROW_POLICIES, _gather, _profiles, row_normalize, softmax_rows

__all__ = ["cross_context_matrix", "cross_vocabulary_evidence"]


def cross_context_matrix(target_ids, source_ids, cooc, *, unk_id: int | None = None) -> np.ndarray:
    """M_cross = Q_tgt S Q_srcᵀ, a gather ``S[tgt][:, src]``.

    Returns
    -------
    ndarray of float64, shape (target_length, source_length); OOV rows/columns are zero.
    """
    S = _checks.cooc_matrix(cooc)
    tgt = _checks.token_ids(target_ids, S.shape[0], unk_id=unk_id, name="target_ids")
    src = _checks.token_ids(source_ids, S.shape[0], unk_id=unk_id, name="source_ids")
    return _gather(S, tgt, src)


def cross_vocabulary_evidence(target_ids, source_ids, cooc, *, normalization: str = "none",
                              zero_rows: str = "uniform", attention_temperature: float = 1.0,
                              unk_id: int | None = None) -> np.ndarray:
    """E_cross = A_cross (Q_src S): the source's association profiles mixed by the target's
    cross-attention.

    ``zero_rows="self"`` is not available (the matrix is not square); a zero row under
    ``"uniform"`` spreads evenly over the in-vocabulary source positions.

    Returns
    -------
    ndarray of float64, shape (target_length, vocab_size); OOV target rows are zero.
    """
    _checks.choice(normalization, "normalization", NORMALIZATIONS)
    if zero_rows == "self":
        raise ValueError("zero_rows='self' needs a square matrix; cross-attention allows 'uniform' or 'zero'")
    _checks.choice(zero_rows, "zero_rows", ZERO_ROW_POLICIES)
    S = _checks.cooc_matrix(cooc)
    tgt = _checks.token_ids(target_ids, S.shape[0], unk_id=unk_id, name="target_ids")
    src = _checks.token_ids(source_ids, S.shape[0], unk_id=unk_id, name="source_ids")
    check_memory(8.0 * tgt.size * S.shape[0], f"the dense cross evidence ({tgt.size} x {S.shape[0]})")
    M = _gather(S, tgt, src)
    rows, cols = np.flatnonzero(tgt >= 0), np.flatnonzero(src >= 0)
    A = np.zeros_like(M)
    sub = M[np.ix_(rows, cols)]
    if normalization == "none":
        A[np.ix_(rows, cols)] = sub
    elif normalization == "row":
        _checks.non_negative(sub)     # row_normalize's own hint, softmax_rows, is no option of this caller
        A[np.ix_(rows, cols)] = row_normalize(sub, zero_rows=zero_rows)
    else:
        tau = _checks.positive_float(attention_temperature, "attention_temperature")
        A[np.ix_(rows, cols)] = softmax_rows(sub, temperature=tau)
    return np.asarray(A @ _profiles(S, src))
