"""Row-by-row agreement between predicted attention (the projection's ``Norm(Q S Qᵀ)``, its
positional and asymmetric variants) and learned attention heads, always beside two baselines.

Every comparison is between a **target** row (a learned head's attention of query i) and a
**prediction** row over the same key positions, and uses only the *allowed* keys of the row:

* ``causal=True``: keys ``j <= i`` (a causal model's prefix); otherwise all keys;
* ``diagonal="keep"``: the query's own position counts like any other key;
  ``diagonal="drop"``: it is removed (the projection's diagonal is ``S[w, w]``, a statistic of
  a word with itself that is often an artefact; a causal row 0 then has no key and is skipped).

Both rows are restricted to the allowed keys and re-normalised to sum to 1. A target row with
no mass there is skipped (``n_skipped``); a prediction row with no mass there (e.g. the
projection at an out-of-vocabulary token) is read as uniform over the allowed keys
(``n_fallback``), i.e. "no preference".

Metrics per row, then averaged over all compared rows of all sequences (every row counts once):

* ``js``: Jensen–Shannon divergence ``JS(P, Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M)``, ``M = (P+Q)/2``,
  base 2, so in [0, 1] (0 = identical);
* ``spearman``: Spearman ρ of the two rows (average ranks for ties, as ``scipy.stats.spearmanr``);
  undefined (NaN, left out of the mean, counted in ``n_spearman``) when a row has fewer than 2
  allowed keys or either side is constant — so it is always NaN for the uniform baseline;
* ``top1``: agreement of the argmax. Ties are explicit: the argmax set of a row is every key
  within ``tie_atol`` of its maximum, and a row scores ``|S_P ∩ S_Q| / (|S_P| |S_Q|)``, the
  probability that argmaxes broken uniformly at random coincide (1 for equal unique argmaxes;
  ``1/n`` for the uniform baseline over n keys).

Baselines, built on the same allowed keys: **uniform** attention, and **previous-token**
attention (all mass on key i-1; row 0 on itself, or uniform when the diagonal is dropped).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from scipy.special import xlogy

from distattn.analysis._ranks import average_ranks
from distattn.analysis.factored import finite_real, to_numpy
from distattn.analysis.information import _distribution_pair

__all__ = ["DIAGONAL_POLICIES", "allowed_keys", "uniform_attention", "previous_token_attention",
           "js_divergence", "row_agreement", "AgreementScores", "agreement_scores", "attention_agreement",
           "head_agreement"]

DIAGONAL_POLICIES = ("keep", "drop")
BASELINES = ("uniform", "previous_token")


def _check_length(length) -> None:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"length must be an integer >= 1 (tokens in the sequence); got {length!r}")


def allowed_keys(length: int, causal: bool = False, diagonal: str = "keep") -> np.ndarray:
    """Boolean (R, R) mask of the keys each query row is compared on."""
    _check_length(length)
    if diagonal not in DIAGONAL_POLICIES:
        raise ValueError(f"diagonal must be one of {DIAGONAL_POLICIES}, got {diagonal!r}")
    mask = np.tril(np.ones((length, length), dtype=bool)) if causal else np.ones((length, length), dtype=bool)
    if diagonal == "drop":
        np.fill_diagonal(mask, False)
    return mask


def uniform_attention(length: int, causal: bool = False, diagonal: str = "keep") -> np.ndarray:
    """Uniform rows over the allowed keys (R, R); rows without keys are zero."""
    mask = allowed_keys(length, causal, diagonal).astype(np.float64)
    sums = mask.sum(axis=1, keepdims=True)
    return np.divide(mask, sums, out=np.zeros_like(mask), where=sums > 0)


def previous_token_attention(length: int) -> np.ndarray:
    """Row i puts all its mass on key i-1; row 0 on itself (R, R)."""
    _check_length(length)
    A = np.zeros((length, length))
    A[0, 0] = 1.0
    A[np.arange(1, length), np.arange(length - 1)] = 1.0
    return A


def js_divergence(P, Q, axis: int = -1) -> np.ndarray:
    """Jensen–Shannon divergence in bits, in [0, 1], between distributions along ``axis``
    (inputs must be non-negative and sum to 1)."""
    P, Q = _distribution_pair(to_numpy(P), to_numpy(Q), axis, names=("P", "Q"))
    return _js(P, Q, axis)


def _js(P: np.ndarray, Q: np.ndarray, axis: int = -1) -> np.ndarray:
    """:func:`js_divergence` without the checks (callers pass validated rows)."""
    M = (P + Q) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_p = xlogy(P, P) - xlogy(P, M)
        kl_q = xlogy(Q, Q) - xlogy(Q, M)
    js = 0.5 * (kl_p.sum(axis=axis) + kl_q.sum(axis=axis)) / np.log(2.0)
    return np.clip(js, 0.0, 1.0)


def _restrict(A, mask):
    A = np.where(mask, A, 0.0)
    sums = A.sum(axis=1, keepdims=True)
    return A, sums[:, 0]


@dataclass
class _Rows:
    """One (R, R) attention matrix made ready for comparison on the allowed keys ``mask``:
    rows restricted and re-normalised (rows without mass stay zero), and the average ranks of
    the restricted rows (disallowed keys ranked last, at +inf). Ranks do not change under the
    re-normalisation, nor when a prediction row without mass is read as uniform (one tie
    either way), so each matrix is ranked once however many others it is compared with."""

    normalized: np.ndarray
    has_mass: np.ndarray
    ranks: np.ndarray


def _prepare(A, mask, name: str) -> _Rows:
    A = to_numpy(A)
    if not np.all(np.isfinite(A)) or np.any(A < 0):
        raise ValueError(f"{name} attention must be finite and non-negative")
    A, sums = _restrict(A, mask)
    has_mass = sums > 0
    return _Rows(A / np.where(has_mass, sums, 1.0)[:, None], has_mass,
                 average_ranks(np.where(mask, A, np.inf), axis=1))


def _masked_spearman(rp, rq, mask) -> np.ndarray:
    """Row-wise Pearson correlation of the rank rows ``rp``, ``rq`` over the allowed keys."""
    n = mask.sum(axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.where(mask, rp, 0.0).sum(1) / n
        mq = np.where(mask, rq, 0.0).sum(1) / n
        dp = np.where(mask, rp - mp[:, None], 0.0)
        dq = np.where(mask, rq - mq[:, None], 0.0)
        num = (dp * dq).sum(1)
        den = np.sqrt((dp ** 2).sum(1) * (dq ** 2).sum(1))
        rho = num / den
    rho[(n < 2) | ~(den > 1e-9)] = np.nan          # ranks are multiples of 1/2: a non-constant row has den >= 1/4
    return np.clip(rho, -1.0, 1.0)


def _top1(P, Q, mask, atol) -> np.ndarray:
    Pm, Qm = np.where(mask, P, -np.inf), np.where(mask, Q, -np.inf)
    sp = Pm >= Pm.max(axis=1, keepdims=True) - atol
    sq = Qm >= Qm.max(axis=1, keepdims=True) - atol
    sp &= mask
    sq &= mask
    return (sp & sq).sum(1) / np.maximum(sp.sum(1) * sq.sum(1), 1)


def _compare(target: _Rows, prediction: _Rows, mask, tie_atol: float) -> dict:
    tie_atol = finite_real(tie_atol, "tie_atol", minimum=0)   # a negative or NaN tolerance made every top-1 score 0
    R = mask.shape[0]
    compared = target.has_mass & mask.any(axis=1)
    fallback = compared & ~prediction.has_mass
    rows = np.flatnonzero(compared)
    nan = np.full(R, np.nan)
    js, rho, top = nan.copy(), nan.copy(), nan.copy()
    if rows.size:
        T = target.normalized[rows]
        P = prediction.normalized[rows]
        fb = fallback[rows]
        if fb.any():
            P = np.where(fb[:, None], mask[rows] / mask[rows].sum(1, keepdims=True), P)
        js[rows] = _js(T, P)
        rho[rows] = _masked_spearman(target.ranks[rows], prediction.ranks[rows], mask[rows])
        top[rows] = _top1(T, P, mask[rows], tie_atol)
    return {"js": js, "spearman": rho, "top1": top, "compared": compared, "fallback": fallback}


def row_agreement(target, prediction, *, causal: bool = False, diagonal: str = "keep",
                  tie_atol: float = 1e-12) -> dict:
    """Per-row metrics of one sequence: ``js``, ``spearman``, ``top1`` (arrays of length R, NaN
    for skipped rows), and boolean ``compared`` / ``fallback`` (R,)."""
    T, P = to_numpy(target), to_numpy(prediction)
    if T.ndim != 2 or T.shape[0] != T.shape[1] or T.shape != P.shape:
        raise ValueError(f"target and prediction must be (R, R) arrays of the same shape; got {T.shape} and "
                         f"{P.shape}")
    mask = allowed_keys(T.shape[0], causal, diagonal)
    return _compare(_prepare(T, mask, "target"), _prepare(P, mask, "prediction"), mask, tie_atol)


@dataclass
class AgreementScores:
    """Row metrics averaged over all compared rows of all sequences.

    ``js_mean``/``js_std`` (bits), ``spearman_mean`` over the ``n_spearman`` rows where it is
    defined, ``top1`` (mean tie-aware argmax agreement), ``n_rows`` compared, ``n_skipped``
    (target rows without mass on allowed keys or without allowed keys), ``n_fallback``
    (prediction rows read as uniform).
    """

    js_mean: float
    js_std: float
    spearman_mean: float
    n_spearman: int
    top1: float
    n_rows: int
    n_skipped: int
    n_fallback: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _sequences(x, name):
    if hasattr(x, "dim") and hasattr(x, "detach"):
        x = to_numpy(x)
    if isinstance(x, (np.ndarray, numbers.Number)):     # a 0-d array once ended with "iteration over a 0-d array"
        x = np.asarray(x)
        if x.ndim == 2:
            return [x]
        if x.ndim == 3:
            return list(x)
        raise ValueError(f"{name} must be one (R, R) array, an (n_seq, R, R) array or a list of (R_s, R_s) "
                         f"arrays; got an array of shape {x.shape}")
    seqs = [to_numpy(s) for s in x]
    if not seqs:
        raise ValueError(f"{name} is empty")
    if all(s.ndim == 1 for s in seqs):      # one matrix as a nested list was read as R sequences of 1-D rows
        raise ValueError(f"{name} is a nested list of {len(seqs)} 1-D rows, not a list of (R, R) matrices; "
                         "pass np.asarray(...) for one matrix, or a list of (R, R) arrays")
    return seqs


def agreement_scores(targets, predictions, *, causal: bool = False, diagonal: str = "keep",
                     tie_atol: float = 1e-12) -> AgreementScores:
    """Aggregate :func:`row_agreement` over sequences. ``targets``/``predictions``: one (R, R)
    array, an (n_seq, R, R) array, or a list of (R_s, R_s) arrays (lengths may differ)."""
    T, P = _sequences(targets, "targets"), _sequences(predictions, "predictions")
    if len(T) != len(P):
        raise ValueError(f"{len(T)} target sequences but {len(P)} prediction sequences")
    return _aggregate(row_agreement(t, p, causal=causal, diagonal=diagonal, tie_atol=tie_atol) for t, p in zip(T, P))


def _aggregate(results) -> AgreementScores:
    """Mean row metrics over the :func:`row_agreement` results of several sequences."""
    js, rho, top, skipped, fallback = [], [], [], 0, 0
    for r in results:
        c = r["compared"]
        js.append(r["js"][c])
        rho.append(r["spearman"][c])
        top.append(r["top1"][c])
        skipped += int((~c).sum())
        fallback += int(r["fallback"].sum())
    js, rho, top = np.concatenate(js), np.concatenate(rho), np.concatenate(top)
    defined = ~np.isnan(rho)
    n = int(js.size)
    return AgreementScores(js_mean=float(js.mean()) if n else float("nan"),
                           js_std=float(js.std()) if n else float("nan"),
                           spearman_mean=float(rho[defined].mean()) if defined.any() else float("nan"),
                           n_spearman=int(defined.sum()), top1=float(top.mean()) if n else float("nan"),
                           n_rows=n, n_skipped=skipped, n_fallback=fallback)


def _baseline(name: str, R: int, causal: bool, diagonal: str) -> np.ndarray:
    if name == "uniform":
        return uniform_attention(R, causal, diagonal)
    return previous_token_attention(R)


def _prepare_all(targets, predictions: dict, causal: bool, diagonal: str):
    """Targets (list of (R_s, R_s)) and every prediction list plus the baselines, each matrix
    prepared once: ``(masks, target_rows, {name: prediction_rows})``."""
    taken = [name for name in predictions if name in BASELINES]
    if taken:                              # the baseline would silently replace the caller's predictor
        raise ValueError(f"predictor names {taken} are reserved for the baselines {BASELINES}; rename them")
    masks, T_rows = [], []
    for t in targets:
        t = to_numpy(t)
        if t.ndim != 2 or t.shape[0] != t.shape[1]:
            raise ValueError(f"each target must be a square (R, R) attention matrix; got shape {t.shape}")
        masks.append(allowed_keys(t.shape[0], causal, diagonal))
        T_rows.append(_prepare(t, masks[-1], "target"))
    P_rows = {}
    for name, seqs in predictions.items():
        if len(seqs) != len(masks):
            raise ValueError(f"{len(masks)} target sequences but {len(seqs)} prediction sequences")
        rows = []
        for p, m in zip(seqs, masks):
            p = to_numpy(p)
            if p.shape != m.shape:
                raise ValueError(f"target and prediction must be (R, R) arrays of the same shape; got {m.shape} "
                                 f"and {p.shape}")
            rows.append(_prepare(p, m, "prediction"))
        P_rows[name] = rows
    for name in BASELINES:
        P_rows[name] = [_prepare(_baseline(name, m.shape[0], causal, diagonal), m, "prediction") for m in masks]
    return masks, T_rows, P_rows


def _scores(masks, T_rows, P_rows: dict, tie_atol: float) -> dict[str, AgreementScores]:
    return {name: _aggregate(_compare(t, p, m, tie_atol) for t, p, m in zip(T_rows, rows, masks))
            for name, rows in P_rows.items()}


def attention_agreement(targets, predictions, *, causal: bool = False, diagonal: str = "keep",
                        tie_atol: float = 1e-12) -> dict[str, AgreementScores]:
    """:func:`agreement_scores` of ``predictions`` against ``targets`` and of the two baselines
    against the same targets: ``{"prediction": ..., "uniform": ..., "previous_token": ...}``.
    ``predictions`` may also be a dict ``{name: sequences}`` for several predictors at once."""
    T = _sequences(targets, "targets")
    preds = predictions if isinstance(predictions, dict) else {"prediction": predictions}
    preds = {name: _sequences(p, name) for name, p in preds.items()}
    return _scores(*_prepare_all(T, preds, causal, diagonal), tie_atol)


def head_agreement(head_patterns, predictions, *, causal: bool = False, diagonal: str = "keep",
                   tie_atol: float = 1e-12) -> list[dict]:
    """Agreement of every learned head with each predictor and the baselines.

    Parameters
    ----------
    head_patterns : list over sequences of arrays (layers, heads, R_s, R_s) (or one
        (n_seq, layers, heads, R, R) array) — e.g. the models' ``hook_pattern`` captures.
    predictions : dict ``{name: list over sequences of (R_s, R_s)}`` (e.g. ``"projection"``,
        ``"positional"``, ``"asymmetric"``), or a single such list (named "projection").

    Returns
    -------
    list of dicts ``{"layer", "head", "predictor", **AgreementScores.to_dict()}``, predictors
    first, then ``"uniform"`` and ``"previous_token"``, for every (layer, head).
    """
    if isinstance(head_patterns, (np.ndarray, numbers.Number)) and np.ndim(head_patterns) == 0:
        raise ValueError("head_patterns must be a list over sequences of (layers, heads, R, R) arrays or one "
                         "(n_seq, layers, heads, R, R) array; got an array of shape ()")   # once "iteration over a 0-d array"
    H = [to_numpy(h) for h in head_patterns]
    if not H:
        raise ValueError("head_patterns is empty")
    if any(h.ndim != 4 for h in H):
        raise ValueError(f"each sequence's head patterns must be (layers, heads, R, R); got shapes "
                         f"{sorted({h.shape for h in H})[:3]}")
    n_layers, n_heads = H[0].shape[:2]
    other = next((s for s, h in enumerate(H) if h.shape[:2] != (n_layers, n_heads)), None)
    if other is not None:              # once an IndexError from deep inside the loop
        raise ValueError(f"every sequence needs the same (layers, heads); sequence 0 has {(n_layers, n_heads)}, "
                         f"sequence {other} has {H[other].shape[:2]}")
    preds = predictions if isinstance(predictions, dict) else {"projection": predictions}
    preds = {k: _sequences(v, k) for k, v in preds.items()}
    rows = []
    P_rows = None  # the predictions and baselines, prepared once for every head
    for layer in range(n_layers):
        for head in range(n_heads):
            targets = [h[layer, head] for h in H]
            if P_rows is None:
                masks, T_rows, P_rows = _prepare_all(targets, preds, causal, diagonal)
            else:
                T_rows = [_prepare(t, m, "target") for t, m in zip(targets, masks)]
            scores = _scores(masks, T_rows, P_rows, tie_atol)
            for name, s in scores.items():
                rows.append({"layer": layer, "head": head, "predictor": name, **s.to_dict()})
    return rows
