"""Stage 2: co-occurrence, PPMI and SVD statistics (sparse, vectorised).

Names are imported on first use, so ``from distattn.stats import ppmi`` does not pay for
scikit-learn's import. ``cooccurrence`` is the exception: it shares its name with its submodule,
and importing ``distattn.stats.cooccurrence`` anywhere would bind the package attribute to the
module, so the function is bound here, eagerly (numpy, scipy and numba only).
"""

from importlib import import_module

from distattn.stats.cooccurrence import cooccurrence  # noqa: F401  (see the docstring)

_EXPORTS = {
    "pmi": "distattn.stats.weighting",
    "ppmi": "distattn.stats.weighting",
    "PPMITransformer": "distattn.stats.weighting",
    "SVDEmbeddings": "distattn.stats.embeddings",
    "truncated_svd": "distattn.stats.embeddings",
    "SIMILARITY_DATASETS": "distattn.stats.similarity",
    "evaluate_similarity": "distattn.stats.similarity",
    "load_similarity_dataset": "distattn.stats.similarity",
}
__all__ = ["cooccurrence", *_EXPORTS]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'distattn.stats' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
