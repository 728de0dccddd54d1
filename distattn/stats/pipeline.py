"""The statistics pipeline, from a corpus name to cached matrices:

corpus -> tokenized (cached) -> vocabulary -> co-occurrence (cached) -> PPMI -> SVD embeddings

(PPMI and the SVD embeddings are recomputed from the cached counts on each run.)

Every cached artifact is keyed by a hash of everything that made it and written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from distattn.atomic import atomic_path, config_hash
from distattn.corpus import Vocabulary, get_corpus, sha256_file, tokenize_corpus
from distattn.corpus.imdb import canonical_split
from distattn.corpus.registry import check_corpus_options
from distattn.paths import cache_dir
from distattn.stats.cooccurrence import OOV_MODES, WEIGHTINGS, cooccurrence
from distattn.stats.weighting import ppmi

log = logging.getLogger(__name__)

IMDB_SPLIT = "train+test+unsup"      # StatsConfig's split when the corpus is IMDB and none is given


@dataclass
class StatsConfig:
    """Everything that determines the statistics. Validated by :meth:`validate`."""

    corpus: str = "imdb"
    path: str | None = None            # --corpus text
    split: str | None = None           # --corpus imdb only: IMDB_SPLIT when not given; None for the others
    data_dir: str | None = None
    vocab_size: int = 30_000           # regular words, specials not counted
    min_count: int = 1
    window: int = 10
    weighting: str = "harmonic"
    symmetric: bool = True
    oov: str = "drop"
    cds: float = 0.75
    neg: float = 1.0
    svd_dim: int = 0                   # 0: no embeddings
    eig: float = 0.5

    def __post_init__(self):
        # the IMDB default was kept for a text or paper corpus too: stats.json recorded an IMDB split
        # for a user's own file, and its cache key differed from the command line's ("") for nothing
        if self.split is None and self.corpus == "imdb":
            self.split = IMDB_SPLIT
        elif self.split == "" and self.corpus != "imdb":    # the command line's "not given"
            self.split = None

    def validate(self) -> "StatsConfig":
        def bad(name, allowed):
            raise ValueError(f"{name}={getattr(self, name)!r} is invalid; allowed: {allowed}")
        if self.corpus == "text" and not self.path:
            raise ValueError("--corpus text needs --path FILE_OR_DIR")
        check_corpus_options(self.corpus, self.path, self.data_dir)
        if self.corpus == "imdb" and self.data_dir:     # else a typo fell back to $DISTATTN_DATA_DIR or a download
            where = Path(self.data_dir).expanduser()
            if not where.is_dir():
                raise ValueError(f"--data-dir {self.data_dir!r} "
                                 + ("is a file; pass the directory that holds aclImdb_v1.tar.gz" if where.exists()
                                    else "does not exist; pass the directory that holds aclImdb_v1.tar.gz"))
        if self.split is not None and self.corpus != "imdb":     # it was silently ignored
            raise ValueError(f"split={self.split!r} is only used with corpus='imdb', not corpus={self.corpus!r}; "
                             "allowed: None")
        for name in ("vocab_size", "min_count", "window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "an integer >= 1")
        if self.weighting not in WEIGHTINGS:
            bad("weighting", WEIGHTINGS)
        if self.oov not in OOV_MODES:
            bad("oov", OOV_MODES)
        if not 0 < self.cds <= 1:
            bad("cds", "a number in (0, 1]")
        if not (math.isfinite(self.neg) and self.neg >= 1):    # nan and inf were refused only after counting
            bad("neg", "a finite number >= 1")
        if self.svd_dim < 0:
            bad("svd_dim", "0 (none) or a positive integer")
        if not (math.isfinite(self.eig) and self.eig >= 0):
            bad("eig", "a finite number >= 0")
        return self


@dataclass
class Statistics:
    """The pipeline's products. ``cooc`` is S (raw counts), ``ppmi`` its PPMI weighting,
    ``embeddings`` the SVD word vectors (vocab × svd_dim) or None."""

    config: StatsConfig
    vocab: Vocabulary
    cooc: sp.csr_array
    ppmi: sp.csr_array
    embeddings: np.ndarray | None = None
    singular_values: np.ndarray | None = None
    n_docs: int = 0
    n_tokens: int = 0
    timings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"corpus": self.config.corpus, "documents": self.n_docs, "tokens": self.n_tokens,
                "vocab_size": len(self.vocab), "cooc_nnz": int(self.cooc.nnz), "ppmi_nnz": int(self.ppmi.nnz),
                "embedding_dim": 0 if self.embeddings is None else int(self.embeddings.shape[1]),
                "timings_s": {k: round(v, 3) for k, v in self.timings.items()}}

    def save(self, out: str | Path) -> list[Path]:
        """Write vocab.json, cooc.npz, ppmi.npz, (embeddings.npy), stats.json into ``out``.

        Each file is written atomically, and so is the set: an earlier run's stats.json is
        removed first and the new one is written last, with the name, size and sha256 of every
        file of the set (``"files"``). A folder without stats.json holds an unfinished set (a
        save that crashed midway may have left a mix of two runs' files); one with it holds
        the files it lists (an earlier run's embeddings.npy, which this run has none of, is gone).
        """
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        # the old stats.json would otherwise describe a mix of this run's and an earlier run's files
        (out / "stats.json").unlink(missing_ok=True)
        written = [out / "vocab.json", out / "cooc.npz", out / "ppmi.npz"]
        self.vocab.save(written[0])
        _save_npz(written[1], self.cooc)
        _save_npz(written[2], self.ppmi)
        if self.embeddings is not None:
            with atomic_path(out / "embeddings.npy", suffix=".npy") as tmp:
                np.save(tmp, self.embeddings)
            written.append(out / "embeddings.npy")
        else:       # an earlier run's vectors would sit beside this run's vocab.json as if they were its own
            (out / "embeddings.npy").unlink(missing_ok=True)
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in written}
        with atomic_path(out / "stats.json") as tmp:
            tmp.write_text(json.dumps({"config": dataclasses.asdict(self.config), **self.summary(),
                                       "files": files}, indent=1))
        written.append(out / "stats.json")
        return written


def _save_npz(path: Path, m) -> None:
    with atomic_path(path, suffix=".npz") as tmp:
        sp.save_npz(tmp, sp.csr_matrix(m), compressed=False)


def _load_npz(path: Path) -> sp.csr_array:
    return sp.csr_array(sp.load_npz(path))


def _check_svd_dim(svd_dim: int, n_words: int) -> None:
    if svd_dim >= n_words:
        raise ValueError(f"svd_dim={svd_dim} is invalid for a vocabulary of {n_words} words; allowed: 0 (none) "
                         f"or fewer dimensions than words (at most {n_words - 1})")


def _counts_key(config: StatsConfig, source: dict, vocab: Vocabulary) -> str:
    """The co-occurrence cache key of ``config`` on the tokens from ``source``."""
    split = config.split or ""   # a text corpus has no split: "" as the command line gave it, which keeps its counts
    if config.corpus == "imdb" and split:
        # the same documents in the same order however the splits are listed: "unsup+train" was a second
        # key for "train+unsup"'s counts (the defaults are in this form already, their keys unchanged)
        split = canonical_split(split)
    return config_hash({"tokens": source, "split": split, "vocab": vocab.fingerprint(),
                        "window": config.window, "weighting": config.weighting, "symmetric": config.symmetric,
                        "oov": config.oov, "format": 1})


def build_statistics(config: StatsConfig, cache: bool = True, progress: bool = True,
                     n_jobs: int | None = None) -> Statistics:
    """Run the pipeline for ``config``, reusing cached artifacts."""
    config.validate()
    timings: dict = {}
    t0 = time.perf_counter()
    if config.corpus == "paper":
        paper = get_corpus("paper")
        vocab = Vocabulary(paper.words, specials=())
        S = sp.csr_array(paper.cooc, dtype=np.float64)
        n_docs = n_tokens = 0
        timings["load"] = time.perf_counter() - t0
        _check_svd_dim(config.svd_dim, len(vocab))
    else:
        kwargs = {"path": config.path} if config.corpus == "text" else \
            {"split": config.split, "data_dir": config.data_dir, "progress": progress}
        corpus = get_corpus(config.corpus, **kwargs)
        tc = tokenize_corpus(corpus, cache=cache, progress=progress)
        if config.corpus == "imdb" and config.split:
            tc = tc.split(config.split)
        timings["tokenize"] = time.perf_counter() - t0
        t = time.perf_counter()
        vocab = tc.vocabulary(min_count=config.min_count, max_size=config.vocab_size)
        enc = tc.encode(vocab, oov="negative")
        timings["vocabulary"] = time.perf_counter() - t
        _check_svd_dim(config.svd_dim, len(vocab))     # it failed in the SVD, after the counting
        n_docs, n_tokens = len(tc), tc.n_tokens
        key = _counts_key(config, tc.source, vocab)
        entry = cache_dir(create=cache) / "stats" / f"cooc-{key}.npz"    # --no-cache: not even created
        t = time.perf_counter()
        S = None
        if cache and entry.exists():
            try:
                S = _load_npz(entry)
            # a damaged entry is recounted, never trusted (a zero-byte file raised EOFError, every run)
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                log.warning("ignoring damaged co-occurrence cache %s: %s", entry, exc)
        if S is None:
            S = cooccurrence(enc, window=config.window, weighting=config.weighting, symmetric=config.symmetric,
                             oov=config.oov, n_jobs=n_jobs)
            if cache:
                _save_npz(entry, S)
        timings["cooccurrence"] = time.perf_counter() - t
    t = time.perf_counter()
    P = ppmi(S, neg=config.neg, cds=config.cds)
    timings["ppmi"] = time.perf_counter() - t
    emb = sv = None
    if config.svd_dim:
        from distattn.stats.embeddings import SVDEmbeddings
        t = time.perf_counter()
        model = SVDEmbeddings(dim=config.svd_dim, eig=config.eig, dtype=np.float32).fit(P)
        emb, sv = model.vectors_, model.singular_values_
        timings["svd"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    return Statistics(config, vocab, S, P, emb, sv, n_docs, n_tokens, timings)
