"""Inputs for the analyses: corpus statistics by name, and a seeded random attention-only
model in numpy, so that every analysis runs end to end before trained models exist.

:func:`corpus_statistics` returns the vocabulary, symmetric and directional PPMI, word counts
and a few sequences; :class:`RandomAttentionModel` returns attention patterns (layers, heads,
R, R) and vocabulary-space QK circuits as :class:`FactoredMatrix` — the same plain inputs a
trained ``distattn.models`` model provides through its hooks and ``qk_circuit``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from distattn.analysis.factored import FactoredMatrix

__all__ = ["CorpusStatistics", "corpus_statistics", "RandomAttentionModel", "TorchModelAdapter", "build_model"]


@dataclass
class CorpusStatistics:
    """``words[i]`` is id i's string; ``cooc`` symmetric counts, ``ppmi`` its PPMI,
    ``directional_ppmi`` the PPMI of ``D[i, j] = #(j within the window after i)`` (None for the
    paper's symmetric toy matrix); ``counts`` per-id frequencies (row sums of ``cooc`` when the
    corpus has no token counts); ``sequences`` a few token-id arrays (-1 = out of vocabulary)."""

    name: str
    words: list
    cooc: sp.csr_array
    ppmi: sp.csr_array
    directional_ppmi: sp.csr_array | None
    counts: np.ndarray
    sequences: list
    n_specials: int = 0


def corpus_statistics(corpus: str = "paper", *, path: str | None = None, vocab_size: int = 5000,
                      window: int = 5, weighting: str = "harmonic", cds: float = 0.75, n_sequences: int = 8,
                      max_len: int = 64, data_dir: str | None = None, split: str = "test") -> CorpusStatistics:
    """Statistics of ``corpus``: ``"paper"`` (the projection paper's 7-word S and its two
    example sequences), ``"text"`` (``path``: a .txt file, a directory or .jsonl) or ``"imdb"``
    (``split``). Text corpora are tokenized (cached), cut to the ``vocab_size`` most frequent
    words and counted with ``window`` / ``weighting``; ``n_sequences`` documents (first
    ``max_len`` tokens) are returned as sequences."""
    from distattn.stats import cooccurrence, ppmi

    if corpus == "paper":
        from distattn.corpus.paper import load_paper_corpus
        paper = load_paper_corpus()
        S = sp.csr_array(paper.cooc, dtype=np.float64)
        seqs = [paper.encode(name) for name in paper.examples]
        return CorpusStatistics("paper", list(paper.words), S, sp.csr_array(ppmi(S, cds=cds)), None,
                                np.asarray(S.sum(axis=1)).ravel(), seqs)
    if corpus not in ("text", "imdb"):
        raise ValueError(f"corpus must be 'paper', 'text' or 'imdb', got {corpus!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    from distattn.corpus import get_corpus, tokenize_corpus
    if corpus == "text":
        if not path:
            raise ValueError("corpus='text' needs path (a .txt file, a directory of .txt files, or .jsonl)")
        source = get_corpus("text", path=path)
    else:
        source = get_corpus("imdb", split=split, data_dir=data_dir, progress=False)
    tc = tokenize_corpus(source, cache=True)
    vocab = tc.vocabulary(max_size=vocab_size)
    enc = tc.encode(vocab, oov="negative")
    S = cooccurrence(enc, window=window, weighting=weighting, symmetric=True)
    D = cooccurrence(enc, window=window, weighting=weighting, symmetric=False)
    counts = np.asarray(vocab.counts, dtype=np.float64)          # one per id, specials 0
    seqs = [np.asarray(enc[i][:max_len]) for i in range(min(n_sequences, len(enc.tokens)))]
    return CorpusStatistics(corpus, list(vocab.itos), sp.csr_array(S), sp.csr_array(ppmi(S, cds=cds)),
                            sp.csr_array(ppmi(D, cds=cds)), counts, seqs, vocab.n_specials)


class RandomAttentionModel:
    """A seeded random attention-only transformer (numpy): embeddings W_E (vocab, d_model),
    N(0, 1), per layer and head W_Q, W_K, W_V (d_model, d_head) and W_O (d_head, d_model), all
    N(0, 1/d_model); ``x_0 = W_E[ids]``, ``x_l = x_{l-1} + Σ_h A_h x_{l-1} W_V^h W_O^h`` with
    ``A_h = softmax(x W_Q^h (x W_K^h)ᵀ / sqrt(d_head))`` (causal if asked). No positions, no
    LayerNorm: the simplest model whose heads have well-defined vocabulary-space circuits.

    Parameters are stored as given; ``temperature`` multiplies the scores (> 1 sharpens).
    """

    def __init__(self, vocab_size: int, d_model: int = 32, n_heads: int = 4, n_layers: int = 2,
                 causal: bool = True, temperature: float = 4.0, random_state: int = 0):
        for name, v in (("vocab_size", vocab_size), ("d_model", d_model), ("n_heads", n_heads),
                        ("n_layers", n_layers)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.vocab_size, self.d_model, self.n_heads, self.n_layers = vocab_size, d_model, n_heads, n_layers
        self.causal, self.temperature, self.random_state = causal, temperature, random_state
        g = np.random.default_rng(random_state)
        d_head = d_model // n_heads
        s = 1.0 / np.sqrt(d_model)
        self.W_E = g.normal(0, 1.0, (vocab_size, d_model))
        self.W_Q = g.normal(0, s, (n_layers, n_heads, d_model, d_head))
        self.W_K = g.normal(0, s, (n_layers, n_heads, d_model, d_head))
        self.W_V = g.normal(0, s, (n_layers, n_heads, d_model, d_head))
        self.W_O = g.normal(0, s, (n_layers, n_heads, d_head, d_model))

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def patterns(self, token_ids) -> np.ndarray:
        """Attention patterns (n_layers, n_heads, R, R) of one sequence. OOV ids (< 0) use a
        zero embedding."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"token_ids must be a non-empty 1-D array of ids < {self.vocab_size}")
        x = np.where((ids >= 0)[:, None], self.W_E[np.maximum(ids, 0)], 0.0)
        R = ids.size
        mask = np.tril(np.ones((R, R), dtype=bool)) if self.causal else np.ones((R, R), dtype=bool)
        out = np.empty((self.n_layers, self.n_heads, R, R))
        for layer in range(self.n_layers):
            q = np.einsum("rd,hde->hre", x, self.W_Q[layer])
            k = np.einsum("rd,hde->hre", x, self.W_K[layer])
            scores = self.temperature * q @ k.transpose(0, 2, 1) / np.sqrt(self.d_head)
            scores = np.where(mask, scores, -np.inf)
            A = np.exp(scores - scores.max(-1, keepdims=True))
            A /= A.sum(-1, keepdims=True)
            out[layer] = A
            v = np.einsum("rd,hde->hre", x, self.W_V[layer])
            x = x + np.einsum("hrs,hse,hed->rd", A, v, self.W_O[layer])
        return out

    def qk_circuit(self, layer: int = 0) -> FactoredMatrix:
        """(n_heads, vocab, vocab) factored ``(W_E W_Q^h)(W_E W_K^h)ᵀ`` of the direct path."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer!r}")
        left = np.einsum("vd,hde->hve", self.W_E, self.W_Q[layer])
        right = np.einsum("vd,hde->hev", self.W_E, self.W_K[layer])
        return FactoredMatrix(left, right)

    def ov_circuit(self, layer: int = 0) -> FactoredMatrix:
        """(n_heads, vocab, vocab) factored ``(W_E W_V^h)(W_O^h W_Eᵀ)`` (unembedding tied to W_E)."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer!r}")
        left = np.einsum("vd,hde->hve", self.W_E, self.W_V[layer])
        right = np.einsum("hed,vd->hev", self.W_O[layer], self.W_E)
        return FactoredMatrix(left, right)


class TorchModelAdapter:
    """The same three questions asked of a ``distattn.models`` torch model (trained or freshly
    initialised): ``patterns(ids)`` from its ``hook_pattern`` hook points (layers, heads, R, R),
    ``qk_circuit(layer)`` and ``ov_circuit(layer)`` from ``distattn.models.qk_circuit`` /
    ``ov_circuit`` (factored, read through their ``A``/``B`` factors). Negative (OOV) ids are
    replaced by ``oov_id``, the vocabulary's ``<unk>`` (``Vocabulary.unk_id``, 1 in the toolkit's
    vocabularies); with the default ``None`` a sequence with a negative id is refused (the
    model does not know its vocabulary; the former default 0 read OOV words as ``<pad>``).
    Patterns are read in evaluation mode (no dropout); the model's mode is restored after."""

    def __init__(self, model, oov_id: int | None = None):
        vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
        if oov_id is not None and (isinstance(oov_id, bool) or not isinstance(oov_id, numbers.Integral)
                                   or oov_id < 0 or (vocab_size is not None and oov_id >= vocab_size)):
            # it surfaced at the first OOV word as "token id ... is outside", blaming the caller's ids
            raise ValueError(f"oov_id must be an integer in [0, vocab_size={vocab_size}) (the id that negative, "
                             f"out-of-vocabulary ids are read as, e.g. <unk>); got {oov_id!r}")
        self.model = model
        self.oov_id = None if oov_id is None else int(oov_id)

    @property
    def n_layers(self) -> int:
        from distattn.models import attention_layers
        return len(attention_layers(self.model))

    def patterns(self, token_ids) -> np.ndarray:
        import torch

        from distattn.models.hooks import capture_hooks
        given = np.asarray(token_ids)
        ids = given.astype(np.int64)
        if given.dtype.kind == "f" and given.size and (given != ids).any():     # astype truncated 3.7 to 3
            raise ValueError(f"token ids must be whole numbers; got {float(given[given != ids].flat[0])!r}")
        if ids.ndim != 1:            # wrapped to (1, B, T), it was refused under a shape the caller never passed
            raise ValueError(f"patterns takes one sequence: a 1-D array of token ids; got shape {ids.shape}")
        if self.oov_id is None and (ids < 0).any():     # once read as id 0, <pad>, not <unk>
            raise ValueError(f"the token ids hold the out-of-vocabulary marker {int(ids.min())} and the adapter has "
                             "no oov_id; pass TorchModelAdapter(model, oov_id=vocab.unk_id) to read them as <unk>")
        param = next(self.model.parameters(), None)         # the ids go where the model is (a GPU model too)
        if self.oov_id is not None:
            ids = np.where(ids < 0, self.oov_id, ids)
        ids = torch.as_tensor(ids)[None].to(param.device if param is not None else "cpu")
        # the library's LM and classifier run every attention layer inside ``trunk``: stopping
        # there skips the unembedding (vocab x d per token), most of an LM's forward cost
        trunk = getattr(self.model, "trunk", None)
        body = trunk if isinstance(trunk, torch.nn.Module) else self.model
        modes = [(m, m.training) for m in self.model.modules()]    # restored after: a model in training stays so
        self.model.eval()
        try:
            with torch.no_grad(), capture_hooks(self.model, filter=lambda name: name.endswith("hook_pattern")) as cache:
                body(ids)
        finally:
            for m, training in modes:
                m.train(training)
        names = sorted(cache, key=lambda n: [int(p) if p.isdigit() else p for p in n.split(".")])
        # .double(): exact from float32/bf16 captures, and a float64 model's are not rounded to float32
        return np.stack([cache[n][0].double().cpu().numpy() for n in names])

    def qk_circuit(self, layer: int = 0):
        from distattn.models import qk_circuit
        return qk_circuit(self.model, layer)

    def ov_circuit(self, layer: int = 0):
        from distattn.models import ov_circuit
        return ov_circuit(self.model, layer)


def build_model(kind: str, vocab_size: int, *, d_model: int = 32, n_heads: int = 4, n_layers: int = 2,
                max_len: int = 256, random_state: int = 0, oov_id: int | None = None):
    """``"random"``: :class:`RandomAttentionModel` (OOV ids get a zero embedding); ``"lm"``: a
    freshly initialised ``distattn.models.TransformerLM`` (seeded) behind
    :class:`TorchModelAdapter`, which reads OOV ids as ``oov_id`` (the vocabulary's ``<unk>``)."""
    if kind == "random":
        return RandomAttentionModel(vocab_size, d_model, n_heads, n_layers, causal=True, random_state=random_state)
    if kind == "lm":
        import torch

        from distattn.models import LMConfig, TransformerLM
        torch.manual_seed(random_state)
        model = TransformerLM(LMConfig(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                                       max_len=max_len))
        return TorchModelAdapter(model, oov_id=oov_id)
    raise ValueError(f"model kind must be 'random' or 'lm', got {kind!r}")
