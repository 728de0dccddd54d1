"""Stage 4: analysis — is learned attention projected co-occurrence? Numbers and pictures.

Plain inputs throughout: attention as numpy arrays ((layers, heads, R, R) or (R, R)),
statistics as ``scipy.sparse`` matrices, circuits as factored matrices (any object with
``left``/``right`` or ``A``/``B``, or a ``(left, right)`` tuple).

Modules:

* ``factored`` — :class:`FactoredMatrix` (SVD from the small core, cheap entries);
* ``spectra`` — singular values, effective/stable rank, energy, WeightWatcher α, subspace angles;
* ``circuits`` — QK circuit vs PPMI: Spearman over word pairs, per-head spectra and alignment;
* ``graphs`` — attention as a networkx graph (PageRank, in-degree, entropy, spectral gap,
  GraphML), PPMI neighbourhoods and Louvain sense communities;
* ``flow`` — attention rollout and attention flow (Abnar & Zuidema 2020);
* ``kernels`` — projection / exponential / linear / polynomial / RBF kernels, CKA, PSD check;
* ``agreement`` — JS, Spearman and top-1 agreement with uniform and previous-token baselines;
* ``information`` — entropy, cross-entropy, perplexity, Var⟨x, y⟩ = d;
* ``figures`` — matplotlib figures (imported on demand: ``from distattn.analysis import figures``);
* ``sources`` — corpus statistics by name and a seeded random attention-only model, so the
  analyses run before trained models exist (``distattn.analysis.sources``).

This stage imports from ``distattn.corpus``, ``distattn.stats``, ``distattn.projection``,
``distattn.models`` and the top-level utilities only.
"""

from distattn.analysis.agreement import (AgreementScores, agreement_scores, allowed_keys, attention_agreement,
                                         head_agreement, js_divergence, previous_token_attention, row_agreement,
                                         uniform_attention)
from distattn.analysis.circuits import (PMICorrelation, circuit_alignment, circuit_spectra, qk_pmi_correlation,
                                        qk_pmi_correlations, top_frequent_ids)
from distattn.analysis.factored import FactoredMatrix, as_factored
from distattn.analysis.flow import (attention_flow, attention_flow_reference, attention_rollout, flow_network,
                                    layer_attentions, residual_attention)
from distattn.analysis.graphs import (SenseCommunities, attention_graph, graph_metrics, in_degree, pagerank,
                                      row_entropy, sense_communities, spectral_gap, word_neighbourhood,
                                      write_graphml)
from distattn.analysis.information import (cross_entropy, dot_product_variance, entropy, kl_divergence, perplexity,
                                           perplexity_from_nll)
from distattn.analysis.kernels import (center_gram, cka, cka_matrix, exponential_kernel, hsic, linear_cka,
                                       linear_kernel, polynomial_kernel, projection_kernel, psd_check, rbf_cka,
                                       rbf_kernel, symmetrize)
from distattn.analysis.spectra import (PowerLawFit, Spectrum, SubspaceAlignment, effective_rank, energy_fraction,
                                       max_rel_residual, power_law_fit, principal_angles, spectrum, spectrum_summary, stable_rank,
                                       subspace_alignment, top_singular_vectors)

__all__ = [
    "FactoredMatrix", "as_factored",
    "Spectrum", "spectrum", "max_rel_residual", "effective_rank", "stable_rank", "energy_fraction", "PowerLawFit", "power_law_fit",
    "spectrum_summary", "top_singular_vectors", "principal_angles", "SubspaceAlignment", "subspace_alignment",
    "PMICorrelation", "qk_pmi_correlation", "qk_pmi_correlations", "circuit_spectra", "circuit_alignment", "top_frequent_ids",
    "attention_graph", "pagerank", "in_degree", "row_entropy", "spectral_gap", "graph_metrics", "write_graphml",
    "word_neighbourhood", "SenseCommunities", "sense_communities",
    "residual_attention", "layer_attentions", "attention_rollout", "attention_flow", "flow_network",
    "attention_flow_reference",
    "projection_kernel", "exponential_kernel", "linear_kernel", "polynomial_kernel", "rbf_kernel", "symmetrize",
    "center_gram", "hsic", "cka", "linear_cka", "rbf_cka", "cka_matrix", "psd_check",
    "allowed_keys", "uniform_attention", "previous_token_attention", "js_divergence", "row_agreement",
    "AgreementScores", "agreement_scores", "attention_agreement", "head_agreement",
    "entropy", "cross_entropy", "kl_divergence", "perplexity", "perplexity_from_nll", "dot_product_variance",
]
