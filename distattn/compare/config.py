"""The configuration of a comparison run, and its profiles.

A profile fixes the sizes of every stage: ``quick`` (a subset of the data and small models, for a
2-core CPU), ``full`` (all data, the seed's classifier, a 4-layer GPT-style LM and the 1-layer attention-only
LM, for one GPU), and ``auto`` (``full`` when CUDA is available and ``device`` is ``auto`` or
``cuda``, else ``quick``).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field

PROFILES = ("quick", "full", "auto")
DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True)
class Sizes:
    """Everything a profile decides. Doc counts of ``None`` mean "all"."""

    vocab_size: int                  # regular words (<pad>, <unk> on top)
    window: int                      # co-occurrence window (harmonic, symmetric; GloVe's conventions)
    svd_dim: int                     # PPMI-SVD embedding dimension
    eval_docs: int                   # test reviews for next-token evaluation
    val_docs: int                    # train reviews held out of the statistics, to fit temperatures
    eval_len: int                    # first tokens of each evaluated review
    asym_rank: int                   # d_k of the asymmetric variant (SVD of directional PPMI)
    heads: tuple[int, int]           # multi-head projection: (heads, rank per head)
    clf_train_docs: int | None       # classifier training reviews (train split)
    clf_test_docs: int | None        # classifier test reviews (test split)
    clf_model: dict = field(default_factory=dict)   # overrides of the seed classifier config
    clf_epochs: int = 5              # the seed's
    clf_lr: float = 2e-4             # the seed's; the quick profile's tiny model needs more
    best_clf_epochs: int | None = None   # the best recipe's epochs (None: clf_epochs), the best one picked on val
    lm_docs: int | None = None       # LM training reviews (train+unsup)
    lm_model: dict = field(default_factory=dict)
    lm_steps: int | None = None      # the LMs' steps (None: one pass over lm_docs) ...
    lm_min_steps: int | None = None  # ... but at least this many (passes repeated on a small corpus)
    lm_batch: int = 64
    attn_model: dict = field(default_factory=dict)
    analysis_seqs: int = 50          # held-out sequences for attention agreement
    analysis_len: int = 64
    top_words: int = 1000            # top-N frequent words for the attention-PMI correlation
    spectrum_k: int = 100


PROFILE_SIZES = {
    "quick": Sizes(vocab_size=10_000, window=10, svd_dim=64, eval_docs=200, val_docs=40, eval_len=96,
                   asym_rank=64, heads=(4, 16), clf_train_docs=4_000, clf_test_docs=2_000,
                   clf_model=dict(d_model=64, n_heads=4, max_len=128), clf_epochs=5, clf_lr=1e-3,
                   best_clf_epochs=2,
                   lm_docs=5_000, lm_model=dict(d_model=64, n_layers=2, n_heads=4, max_len=96), lm_steps=120,
                   lm_batch=16, attn_model=dict(d_model=64, n_heads=1, max_len=96), analysis_seqs=40,
                   analysis_len=48, top_words=500, spectrum_k=64),
    "full": Sizes(vocab_size=29_998, window=10, svd_dim=256, eval_docs=2_000, val_docs=200, eval_len=256,
                  asym_rank=128, heads=(4, 32), clf_train_docs=None, clf_test_docs=None,
                  clf_model={}, clf_epochs=5, lm_docs=None,
                  lm_model=dict(d_model=512, n_layers=4, n_heads=8, max_len=256), lm_steps=None, lm_min_steps=1_000,
                  lm_batch=64, attn_model=dict(d_model=256, n_heads=1, max_len=256), analysis_seqs=200, analysis_len=128,
                  top_words=2_000, spectrum_k=200),
}


@dataclass
class CompareConfig:
    """What ``python -m distattn.compare`` was asked to do; :meth:`validate` checks it at the
    boundary and names each bad value with what is allowed."""

    corpus: str = "imdb"
    path: str | None = None
    data_dir: str | None = None
    profile: str = "auto"
    out: str = "runs"
    seed: int = 0
    device: str = "auto"
    max_docs: int | None = None     # cap every document set (smoke runs, tests)
    train_models: bool = True

    def validate(self) -> "CompareConfig":
        from distattn.corpus import available_corpora
        from distattn.corpus.registry import check_corpus_options
        names = available_corpora()
        if self.corpus not in names:
            raise ValueError(f"unknown corpus {self.corpus!r}; valid names: {', '.join(names)}")
        if self.corpus == "text" and not self.path:
            raise ValueError("--corpus text needs --path FILE_OR_DIR (a .txt file, a directory of .txt files, "
                             "or a .jsonl file)")
        if self.corpus == "text":
            from distattn.corpus import TextCorpus
            corpus = TextCorpus(self.path)  # a missing path or an unsupported format fails here, before any output
            for f in corpus.files():   # so does a file that cannot be read (its mode, its owner)
                try:
                    with open(f, "rb"):
                        pass
                except OSError as exc:
                    raise ValueError(f"--path {self.path!r}: cannot read {str(f)!r} ({exc.strerror or exc})") from None
        check_corpus_options(self.corpus, self.path, self.data_dir)
        if self.corpus == "imdb" and self.data_dir:     # else a typo fell back to $DISTATTN_DATA_DIR or a download
            from pathlib import Path
            where = Path(self.data_dir).expanduser()
            if not where.is_dir():
                raise FileNotFoundError(
                    f"--data-dir {self.data_dir!r} " + ("is a file; pass the directory that holds aclImdb_v1.tar.gz"
                                                        if where.exists() else
                                                        "does not exist; pass the directory that holds "
                                                        "aclImdb_v1.tar.gz"))
        if self.profile not in PROFILES:
            raise ValueError(f"--profile {self.profile!r} is not one of {PROFILES}")
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r} is not one of {DEVICES}")
        if self.profile == "full" and self.device == "cpu" and self.train_models and self.corpus != "paper":
            raise ValueError("conflicting options: --profile full trains seed-size models and needs a GPU; "
                             "use --profile quick with --device cpu, or add --no-models")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or not 0 <= self.seed < 2**32:
            raise ValueError(f"--seed must be an integer from 0 to {2**32 - 1}, got {self.seed!r}")
        if self.max_docs is not None and self.max_docs < 20:
            raise ValueError(f"--max-docs must be at least 20 (or omitted), got {self.max_docs}")
        return self

    def resolved_profile(self) -> str:
        if self.profile != "auto":
            return self.profile
        import torch
        use_cuda = torch.cuda.is_available() and self.device in ("auto", "cuda")
        return "full" if use_cuda else "quick"

    def sizes(self) -> Sizes:
        sizes = PROFILE_SIZES[self.resolved_profile()]
        if self.max_docs is None:
            return sizes
        cap = self.max_docs

        def c(n):
            return cap if n is None else min(n, cap)
        return dataclasses.replace(sizes, eval_docs=c(sizes.eval_docs), val_docs=c(sizes.val_docs),
                                   clf_train_docs=c(sizes.clf_train_docs), clf_test_docs=c(sizes.clf_test_docs),
                                   lm_docs=c(sizes.lm_docs), analysis_seqs=min(sizes.analysis_seqs, cap))
