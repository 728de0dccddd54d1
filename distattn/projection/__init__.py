"""Stage 3a: the parameter-free projection predictor of ``shared/seeds/003_8065cadafb1b3474.txt``.

>>> from distattn.corpus.paper import load_paper_corpus
>>> from distattn.projection import context_matrix, row_normalize, global_evidence
>>> paper = load_paper_corpus()
>>> ids = paper.encode("river_bank_flooded")
>>> row_normalize(context_matrix(ids, paper.cooc)).round(3)[0].tolist()
[0.0, 0.444, 0.556]
>>> paper.words[int(global_evidence(ids, paper.cooc).argmax())]
'shore'

Modules: ``core`` (Q, M, Norm, QS, E, e_global, softmax), ``batch`` (many sequences, numpy),
``torch_ops`` (the same on a torch device; imported lazily), ``positional`` ((Q+P) S (Q+P)ᵀ),
``asymmetric`` (Q W_Q W_Kᵀ Qᵀ), ``multihead`` (SVD/NMF heads), ``cross`` (cross-projection),
``causal`` (prefix-only e_t and the fast scoring kernel), ``predictor`` (the estimator),
``nexttoken`` (model-agnostic evaluation), ``ngram`` (unigram and Kneser–Ney baselines),
``device_scorers`` (the variants and n-grams scored in batches on a torch device: the engine of
``python -m distattn.compare``'s next-token table; imported on use).

This stage imports only from ``distattn.corpus``, ``distattn.stats`` and the top-level
utilities.
"""

from distattn.projection.asymmetric import check_factors, directional_context_matrix, directional_factors, factored_svd
from distattn.projection.batch import context_matrices, global_evidences, masked_attention
from distattn.projection.causal import causal_scores, causal_weights
from distattn.projection.core import (NORMALIZATIONS, ZERO_ROW_POLICIES, association_profiles, attention_weights,
                                      context_matrix, global_evidence, log_softmax, next_token_distribution,
                                      row_normalize, scaled_softmax, selector, softmax_rows, vocabulary_evidence)
from distattn.projection.cross import cross_context_matrix, cross_vocabulary_evidence
from distattn.projection.multihead import (HEAD_COMBINATIONS, Head, combine_heads, multihead_context_matrices,
                                           multihead_evidence, nmf_heads, svd_heads)
from distattn.projection.nexttoken import (NextTokenReport, evaluate_next_token, fit_temperature, prediction_targets,
                                           unigram_prior)
from distattn.projection.ngram import KneserNeyLM, UnigramLM
from distattn.projection.positional import (CorpusPositional, PositionalContext, corpus_position_matrix,
                                            embedding_basis,
                                            positional_context_matrix, positional_distributions,
                                            sinusoidal_encoding, sinusoidal_position_matrix)
from distattn.projection.predictor import ProjectionPredictor

_TORCH = ("resolve_device", "torch_context_matrices", "torch_attention", "torch_vocabulary_evidence",
          "torch_global_evidence", "torch_causal_weights", "torch_causal_scores")


def __getattr__(name):
    # the torch path is imported on first use, so numpy-only users do not pay torch's import
    if name in _TORCH:
        from distattn.projection import torch_ops
        return getattr(torch_ops, name)
    raise AttributeError(f"module 'distattn.projection' has no attribute {name!r}")


__all__ = [
    # core
    "NORMALIZATIONS", "ZERO_ROW_POLICIES", "selector", "context_matrix", "row_normalize", "softmax_rows",
    "scaled_softmax", "attention_weights", "association_profiles", "vocabulary_evidence", "global_evidence",
    "log_softmax", "next_token_distribution",
    # batch (numpy) and torch
    "context_matrices", "global_evidences", "masked_attention", *_TORCH,
    # positional
    "PositionalContext", "positional_distributions", "corpus_position_matrix", "sinusoidal_encoding",
    "embedding_basis", "sinusoidal_position_matrix", "positional_context_matrix", "CorpusPositional",
    # asymmetric, multi-head, cross
    "directional_factors", "directional_context_matrix", "factored_svd", "check_factors",
    "Head", "svd_heads", "nmf_heads", "multihead_context_matrices", "combine_heads", "multihead_evidence",
    "HEAD_COMBINATIONS", "cross_context_matrix", "cross_vocabulary_evidence",
    # prediction and evaluation
    "ProjectionPredictor", "causal_weights", "causal_scores", "NextTokenReport", "evaluate_next_token",
    "fit_temperature", "unigram_prior", "prediction_targets", "UnigramLM", "KneserNeyLM",
]
