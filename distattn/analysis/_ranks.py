"""Average ranks and Spearman's ρ without a Python loop per row.

``scipy.stats.rankdata(..., axis=1)`` ranks row by row; the analysis ranks tens of thousands
of short rows (attention rows) and a few long vectors (word-pair scores), where a single
vectorised sort per call is several times faster. The ranks are those of
``rankdata(method="average")`` (1-based; ties get the mean of the ranks they span), and
:func:`spearman` matches ``scipy.stats.spearmanr`` (ρ and its two-sided t-test p-value).
"""

from __future__ import annotations

import numpy as np


def average_ranks(X, axis: int = -1) -> np.ndarray:
    """Average ranks of ``X`` along ``axis`` (float64, same shape). X must not hold NaN."""
    X = np.asarray(X)
    if X.size == 0:
        return np.zeros(X.shape)
    moved = np.moveaxis(X, axis, -1)
    shape = moved.shape
    n = shape[-1] if shape else 1
    A = moved.reshape(-1, n)
    order = np.argsort(A, axis=1)              # any sort: tied values get one shared rank anyway
    S = np.take_along_axis(A, order, axis=1)
    idx = np.arange(n)
    starts = np.ones(S.shape, dtype=bool)      # a tie group starts here
    starts[:, 1:] = S[:, 1:] != S[:, :-1]
    ends = np.ones(S.shape, dtype=bool)        # ... and ends here
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, idx, n)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty(A.shape)
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=1)
    return np.moveaxis(ranks.reshape(shape), -1, axis)


def pearson_of_ranks(rx: np.ndarray, ry: np.ndarray) -> float:
    """Pearson correlation of two rank vectors (NaN when either is constant)."""
    dx = rx - rx.mean()
    dy = ry - ry.mean()
    den = np.sqrt(np.dot(dx, dx) * np.dot(dy, dy))
    return float(np.clip(np.dot(dx, dy) / den, -1.0, 1.0)) if den > 0 else float("nan")


def spearman_pvalue(rho: float, n: int) -> float:
    """Two-sided p-value of Spearman's ρ over n pairs (the t-test of ``scipy.stats.spearmanr``)."""
    if not np.isfinite(rho) or n < 3:
        return float("nan")
    from scipy.stats import t as t_dist
    if abs(rho) >= 1.0:
        return 0.0
    t = rho * np.sqrt((n - 2) / ((1.0 + rho) * (1.0 - rho)))
    return float(2.0 * t_dist.sf(abs(t), n - 2))


def spearman(x, y, *, ranks_y: np.ndarray | None = None) -> tuple[float, float]:
    """(ρ, p-value) of two 1-D samples; ``ranks_y`` reuses ``average_ranks(y)``. NaN, NaN when
    fewer than 3 pairs or one side is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan"), float("nan")
    rho = pearson_of_ranks(average_ranks(x), average_ranks(y) if ranks_y is None else ranks_y)
    return rho, spearman_pvalue(rho, x.size)
