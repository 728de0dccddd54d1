"""Entropy, cross-entropy and perplexity (seed 001, sections VI and VIII), and the
high-dimensional dot-product fact of seed 002, section 11.

Units. ``base=e`` (default) gives nats, ``base=2`` bits: ``H_2 = H_e / ln 2``. Perplexity is
the same number in either unit, ``PPL = e^{H_e} = 2^{H_2}``; seed 001 writes it as
``e^{H(P)}`` with natural logarithms. ``0 log 0 = 0`` throughout.
"""

from __future__ import annotations

import numbers

import numpy as np
from scipy.special import xlogy

from distattn.analysis.factored import to_numpy

__all__ = ["entropy", "cross_entropy", "kl_divergence", "perplexity", "perplexity_from_nll",
           "dot_product_variance"]


def _log_base(base) -> float:
    if base is None or base == "e":
        return 1.0
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not np.isfinite(base) or base <= 0 \
            or base == 1:
        raise ValueError(f"base must be 'e', 2 or another finite positive number != 1, got {base!r}")
    return float(np.log(base))


def _distribution(p, name: str, axis: int, atol: float = 1e-6) -> np.ndarray:
    p = to_numpy(p)
    if p.ndim == 0:
        raise ValueError(f"{name} must be a probability vector (or an array of them along axis), got a scalar")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} must be finite; it holds NaN or inf")
    if np.any(p < 0):
        raise ValueError(f"{name} must be non-negative; min is {float(p.min())!r}")
    total = p.sum(axis=axis)
    if not np.allclose(total, 1.0, atol=atol):
        bad = total.ravel()[np.argmax(np.abs(total.ravel() - 1))]
        raise ValueError(f"{name} must sum to 1 along axis {axis} (within {atol}); found a sum of {float(bad)!r}")
    return p


def _distribution_pair(p, q, axis: int, names=("p", "q")) -> tuple[np.ndarray, np.ndarray]:
    """Two distributions over the same outcomes: the sizes along ``axis`` must match (the other
    axes broadcast, e.g. many rows of p against one q)."""
    p, q = _distribution(p, names[0], axis), _distribution(q, names[1], axis)
    if p.shape[axis] != q.shape[axis]:
        raise ValueError(f"{names[0]} has shape {p.shape} and {names[1]} has shape {q.shape}: their sizes along "
                         f"axis {axis} (the outcomes) must match")
    return p, q


def entropy(p, base="e", axis: int = -1) -> np.ndarray:
    """Shannon entropy ``H(p) = -Σ_i p_i log p_i`` along ``axis``.

    ``p``: (..., n) probabilities summing to 1. Returns (...,) in nats (``base='e'``) or bits
    (``base=2``). For each row of an attention matrix this is its row entropy.
    """
    p = _distribution(p, "p", axis)
    return -xlogy(p, p).sum(axis=axis) / _log_base(base)


def cross_entropy(p, q, base="e", axis: int = -1) -> np.ndarray:
    """``H(p, q) = -Σ_i p_i log q_i``: the expected code length of ``p`` under a code built for
    ``q`` (the language-model loss when ``p`` is one-hot on the true token). ``inf`` where
    ``q_i = 0 < p_i``. Shapes as :func:`entropy`."""
    p, q = _distribution_pair(p, q, axis)
    with np.errstate(divide="ignore"):
        out = -xlogy(p, q).sum(axis=axis)
    return out / _log_base(base)


def kl_divergence(p, q, base="e", axis: int = -1) -> np.ndarray:
    """``KL(p ‖ q) = H(p, q) - H(p) >= 0``."""
    return np.maximum(cross_entropy(p, q, base, axis) - entropy(p, base, axis), 0.0)


def perplexity(p, q=None, axis: int = -1) -> np.ndarray:
    """``e^{H(p)}`` (or ``e^{H(p, q)}`` given ``q``): the effective number of equally likely
    outcomes. Independent of the logarithm's base (``2^{H_2} = e^{H_e}``). A uniform
    distribution over n outcomes has perplexity n."""
    h = entropy(p, axis=axis) if q is None else cross_entropy(p, q, axis=axis)
    return np.exp(h)


def perplexity_from_nll(nll, base="e") -> float:
    """A language model's perplexity from per-token negative log-likelihoods
    ``-log P(x_t | x_<t)``: ``base ** mean(nll)`` (``base`` is the unit of ``nll``:
    ``'e'`` for nats, as ``torch.nn.functional.cross_entropy`` returns, or 2 for bits)."""
    nll = np.asarray(nll, dtype=np.float64).ravel()
    if nll.size == 0:
        raise ValueError("nll is empty")
    if not np.all(np.isfinite(nll)) or np.any(nll < 0):
        raise ValueError("nll must be finite and non-negative")
    return float(np.exp(nll.mean() * _log_base(base)))


def dot_product_variance(dim: int, n_samples: int = 20_000, *, scaled: bool = False, random_state=0) -> dict:
    """Monte-Carlo estimate of ``Var(⟨x, y⟩)`` for independent ``x, y ~ N(0, I_dim)``.

    Theory (seed 002, section 11): ``⟨x, y⟩ = Σ_i x_i y_i`` is a sum of ``dim`` independent
    terms of mean 0 and variance 1, so ``E⟨x, y⟩ = 0`` and ``Var⟨x, y⟩ = dim``; the scaled
    score ``⟨x, y⟩ / sqrt(dim)`` (``scaled=True``) has variance 1, the reason for attention's
    ``1/sqrt(d_k)``. Since ``E⟨x, y⟩⁴ = 3 dim² + 6 dim``, the sample variance has standard
    error about ``sqrt((2 dim² + 6 dim) / n_samples)`` (divided by ``dim`` when scaled).

    Returns
    -------
    dict with ``mean``, ``variance`` (sample, ddof=1), ``expected`` (``dim``, or 1 when
    scaled), ``std_error`` and ``n_samples``.
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, numbers.Integral) or n_samples < 2:
        raise ValueError(f"n_samples must be an integer >= 2, got {n_samples!r}")
    rng = np.random.default_rng(random_state)
    check_bytes = 16 * n_samples * dim
    from distattn.memory import check_memory
    check_memory(check_bytes, f"dot_product_variance(dim={dim}, n_samples={n_samples})")
    x = rng.standard_normal((n_samples, dim))
    y = rng.standard_normal((n_samples, dim))
    dots = np.einsum("ij,ij->i", x, y)
    scale = np.sqrt(dim) if scaled else 1.0
    dots = dots / scale
    se = np.sqrt((2.0 * dim**2 + 6.0 * dim) / n_samples) / (dim if scaled else 1.0)
    return {"mean": float(dots.mean()), "variance": float(dots.var(ddof=1)),
            "expected": 1.0 if scaled else float(dim), "std_error": float(se), "n_samples": int(n_samples)}
