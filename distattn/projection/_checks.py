"""Validation at the boundary of :mod:`distattn.projection`.

Every public function passes its inputs through one of these, so errors read the same
everywhere: they name the argument, the bad value and what is allowed.
"""

from __future__ import annotations

import numbers
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from distattn.corpus.ragged import RaggedIds

OOV = -1
"""Id that marks an out-of-vocabulary token after :func:`token_ids` / :func:`documents`."""


def real(values, name: str) -> None:
    """Refuse complex values (numpy, scipy sparse, torch or nested lists): the float64 conversion
    would drop their imaginary part with only numpy's ComplexWarning."""
    dtype = getattr(values, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(values).dtype
        except (TypeError, ValueError):
            return                      # not an array of numbers: the conversion that follows says so
    if getattr(dtype, "is_complex", False) or (isinstance(dtype, np.dtype) and dtype.kind == "c"):
        raise ValueError(f"{name} must be real; got complex values (dtype {dtype}), whose imaginary part "
                         f"would be dropped")


def cooc_matrix(cooc, vocab_size: int | None = None, name: str = "cooc") -> sp.csr_array:
    """``cooc`` as a square float64 ``csr_array`` with summed duplicates and sorted indices.

    Accepts any scipy sparse matrix/array or array-like. Never modifies the input; a
    ``csr_array`` that is already float64, canonical and int32-indexed is returned as is.
    """
    real(cooc, name)
    if (isinstance(cooc, sp.csr_array) and cooc.dtype == np.float64 and cooc.has_canonical_format
            and cooc.indices.dtype == np.int32 and cooc.ndim == 2):
        S = cooc  # already canonical: no copy, the hot path calls this for every sequence
    elif sp.issparse(cooc):
        S = sp.csr_array(cooc, dtype=np.float64, copy=True)
    else:
        try:
            dense = np.asarray(cooc, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a scipy sparse matrix or a 2-D array of numbers; "
                            f"got {type(cooc).__name__}") from exc
        if dense.ndim != 2:
            raise ValueError(f"{name} must be 2-D (vocab_size, vocab_size); got shape {dense.shape}")
        S = sp.csr_array(dense)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"{name} must be square (vocab_size, vocab_size); got shape {S.shape}")
    if S.shape[0] == 0:
        raise ValueError(f"{name} must have at least one row; got shape {S.shape}")
    if vocab_size is not None and S.shape[0] != vocab_size:
        raise ValueError(f"{name} has shape {S.shape} but the vocabulary has vocab_size={vocab_size}; "
                         f"they must match")
    if S is not cooc:
        S.sum_duplicates()
    if S.data.size and not np.all(np.isfinite(S.data)):
        raise ValueError(f"{name} contains NaN or inf")
    if S.indices.dtype != np.int32 and S.nnz < np.iinfo(np.int32).max:
        S.indices = S.indices.astype(np.int32)
        S.indptr = S.indptr.astype(np.int32)
    return S


def finite(values, name: str) -> None:
    """Refuse NaN and inf in an array (dense, or the stored entries of a sparse one): they would
    come out as NaN attention or evidence, or as LAPACK's opaque errors."""
    data = values.data if sp.issparse(values) else values
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{name} must be finite; it holds NaN or inf")


def non_negative(weights, what: str = "normalization='row'",
                 hint: str = "Use normalization='softmax' for signed scores") -> None:
    """Refuse negative weights (a numpy array or torch tensor) before a row-sum normalisation:
    signed scores have none. ``what`` names the option or function, ``hint`` the way out."""
    size = weights.numel() if hasattr(weights, "numel") else weights.size
    if size and weights.min() < 0:
        raise ValueError(f"{what} needs non-negative weights; the minimum is {float(weights.min())}. {hint}")


def float_array(values, name: str = "values") -> np.ndarray:
    """``values`` as a float64 ndarray; a scipy sparse matrix or array is densified (``np.asarray``
    would wrap it in a 0-d object array: numpy's 'setting an array element with a sequence').
    Complex values are refused by ``name``."""
    real(values, name)
    if sp.issparse(values):
        return values.toarray().astype(np.float64, copy=False)
    return np.asarray(values, dtype=np.float64)


def known_mask(known, length: int) -> np.ndarray | None:
    """A boolean in-vocabulary mask of shape (length,), or None when it is absent or all True."""
    if known is None:
        return None
    known = np.asarray(known)
    if known.dtype != bool or known.shape != (length,):
        raise ValueError(f"known must be a boolean mask of shape ({length},); got dtype {known.dtype}, "
                         f"shape {known.shape}")
    return None if known.all() else known


def positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def positive_float(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite real number > 0; got {value!r}")
    return float(value)


def choice(value, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}; got {value!r}")
    return value


def _integer_array(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise TypeError(f"{name} must hold integer token ids; got dtype {arr.dtype}")
    return arr


def _check_unk_id(unk_id, vocab_size: int) -> None:
    if unk_id is not None and (isinstance(unk_id, bool) or not isinstance(unk_id, numbers.Integral)
                               or not 0 <= unk_id < vocab_size):
        raise ValueError(f"unk_id must be None or a token id in [0, vocab_size={vocab_size}); got {unk_id!r}")


def token_ids(values, vocab_size: int, *, unk_id: int | None = None, name: str = "token_ids",
              require_known: bool = True) -> np.ndarray:
    """A 1-D int64 array of ids in ``[0, vocab_size)``, with out-of-vocabulary tokens as ``-1``.

    Negative ids and ``unk_id`` mark out-of-vocabulary (OOV) tokens. Raises ``ValueError`` for
    an empty sequence, for ids ``>= vocab_size`` and, when ``require_known``, for a sequence
    whose tokens are all OOV.
    """
    _check_unk_id(unk_id, vocab_size)
    arr = _integer_array(values, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids; got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; a sequence needs at least one token")
    too_big = arr >= vocab_size          # before the cast: uint64 ids >= 2**63 would wrap to negative (OOV)
    if too_big.any():
        bad = np.unique(arr[too_big])[:5].tolist()
        raise ValueError(f"{name} contains ids {bad} outside [0, vocab_size={vocab_size}); "
                         f"negative ids (or unk_id) mark out-of-vocabulary tokens")
    arr = arr.astype(np.int64)
    arr[arr < 0] = OOV
    if unk_id is not None:
        arr[arr == unk_id] = OOV
    if require_known and np.all(arr == OOV):
        raise ValueError(f"{name} has no in-vocabulary token (all {arr.size} are OOV: negative ids"
                         f"{'' if unk_id is None else f' or unk_id={unk_id}'}); there is no evidence to project")
    return arr


def documents(docs, vocab_size: int, *, unk_id: int | None = None, name: str = "documents") -> RaggedIds:
    """Documents as :class:`~distattn.corpus.ragged.RaggedIds` (int32 ids, OOV as ``-1``).

    Accepts a ``RaggedIds`` (or any object with ``ids`` and ``offsets``), a tuple
    ``(ids, offsets)`` of a flat id array and int64 document offsets, or a list (any
    iterable but a tuple) of 1-D id arrays. Documents may be empty or all-OOV here (they simply yield no prediction).
    """
    _check_unk_id(unk_id, vocab_size)
    if hasattr(docs, "ids") and hasattr(docs, "offsets"):
        ids, offsets = docs.ids, docs.offsets
    elif isinstance(docs, tuple):
        if len(docs) != 2:
            raise TypeError(f"a tuple {name} must be (ids, offsets); got a tuple of length {len(docs)} "
                            f"(pass several documents as a list)")
        ids, offsets = docs
    elif isinstance(docs, Iterable) and not isinstance(docs, (np.ndarray, str, bytes)):
        arrays = [_integer_array(d, f"{name}[{i}]") for i, d in enumerate(docs)]
        for i, a in enumerate(arrays):
            if a.ndim != 1:
                raise ValueError(f"{name}[{i}] must be 1-D; got shape {a.shape}")
        return documents(RaggedIds.from_sequences(arrays), vocab_size, unk_id=unk_id, name=name)
    else:
        raise TypeError(f"{name} must be a RaggedIds, an (ids, offsets) pair or a list of id arrays; "
                        f"got {type(docs).__name__}")
    ids = _integer_array(ids, f"{name} ids")
    if ids.size and ids.max() >= vocab_size:
        bad = np.unique(ids[ids >= vocab_size])[:5].tolist()
        raise ValueError(f"{name} contains ids {bad} outside [0, vocab_size={vocab_size}); "
                         f"negative ids (or unk_id) mark out-of-vocabulary tokens")
    ragged = RaggedIds(ids, offsets)  # validates the offsets (integers, 0 .. n_tokens, non-decreasing)
    flat = ragged.ids.copy()
    flat[flat < 0] = OOV
    if unk_id is not None:
        flat[flat == unk_id] = OOV
    return RaggedIds(flat, ragged.offsets)


def prior(prior, prior_weight, vocab_size: int):
    """The mixture prior as a float64 probability vector, or None when ``prior_weight`` is 0."""
    if (isinstance(prior_weight, bool) or not isinstance(prior_weight, numbers.Real) or not np.isfinite(prior_weight)
            or not 0.0 <= prior_weight < 1.0):
        raise ValueError(f"prior_weight must be a real number in [0, 1); got {prior_weight!r}")
    if prior_weight == 0.0:
        return None
    if prior is None:
        raise ValueError("prior_weight > 0 needs a prior (e.g. unigram_prior(train_documents, vocab_size))")
    given = np.asarray(prior)
    p = given.astype(np.float64)
    # a float32 vector normalised in float32 sums to 1 only within its own round-off (a few 1e-6
    # over 30k words): allow that, then renormalise in float64
    eps = np.finfo(given.dtype).eps if np.issubdtype(given.dtype, np.floating) else 0.0
    tol = max(1e-6, min(1e-3, vocab_size * eps))
    if p.shape != (vocab_size,) or not np.all(np.isfinite(p)) or p.min() < 0 or abs(p.sum() - 1) > tol:
        raise ValueError(f"prior must be a probability vector of shape ({vocab_size},); got shape {p.shape}, "
                         f"sum {p.sum() if p.size else 0:.10g} (allowed: 1 within {tol:.3g})")
    return p / p.sum()
