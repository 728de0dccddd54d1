"""Stage 2: co-occurrence, PPMI and SVD statistics (sparse, vectorised)."""

from distattn.stats.cooccurrence import cooccurrence
from distattn.stats.embeddings import SVDEmbeddings, truncated_svd
from distattn.stats.similarity import SIMILARITY_DATASETS, evaluate_similarity, load_similarity_dataset
from distattn.stats.weighting import PPMITransformer, pmi, ppmi

__all__ = ["cooccurrence", "pmi", "ppmi", "PPMITransformer", "SVDEmbeddings", "truncated_svd",
           "SIMILARITY_DATASETS", "evaluate_similarity", "load_similarity_dataset"]
