"""The stages of a comparison run, each cached under ``<cache>/compare`` by a hash of everything
that determines it (its own sizes and its inputs' keys), each written atomically.

corpus -> data splits -> statistics -> projection table
                                    -> models (classifier, LMs; resumable) -> analysis (in run.py)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from distattn.atomic import atomic_dir, check_files, config_hash, read_sealed_json, seal, sha256_file, temp_dir, write_json
from distattn.corpus import EncodedCorpus, RaggedIds, Vocabulary, get_corpus, tokenize_corpus
from distattn.paths import cache_dir

try:
    import fcntl
except ImportError:             # not POSIX: the models-stage entries go unlocked (_entry_lock)
    fcntl = None

log = logging.getLogger("distattn.compare")
FORMAT = 3  # 2: LMs never trained to predict <unk>; 3: every entry's JSON sealed (atomic.seal)


def clamp_rank(rank: int, vocab_size: int) -> int:
    """A factorisation rank that fits the vocabulary (small corpora have small vocabularies)."""
    return max(1, min(rank, vocab_size - 3))


def stage_dir(name: str, key_material: dict) -> tuple[Path, str]:
    key = config_hash({"stage": name, "format": FORMAT, **key_material})
    return cache_dir() / "compare" / f"{name}-{key}", key


_DAMAGED = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)    # what reading a damaged file raises


def load_entry(d: Path, load, errors: tuple = ()):
    """``load()``, reading the stage entry ``d``; or None when the entry is damaged (a file cut short
    or garbled on disk), after removing it so that the recomputed stage can take its place. A
    damaged entry once failed every later run with a bare numpy/zipfile/JSON error. ``errors``: more
    exception types that mean a damaged file (torch.load: UnpicklingError)."""
    try:
        return load()
    except PermissionError:         # not readable by this user (a shared cache): no sign of damage, kept
        raise
    except (*_DAMAGED, *errors) as exc:
        log.warning("ignoring damaged cache entry %s (%s: %s); recomputing it", d, type(exc).__name__, exc)
        shutil.rmtree(d, ignore_errors=True)
        return None


# --------------------------------------------------------------------------- data

@dataclass
class Data:
    """The document sets of a run. Token ids use ``vocab`` (``<pad>`` = 0, ``<unk>`` = 1).
    ``*_neg`` sets mark out-of-vocabulary tokens with -1 (the statistics and projection
    convention); the others with ``<unk>`` (the models' convention)."""

    vocab: Vocabulary
    stat_neg: RaggedIds                      # statistics and n-gram counts (never the evaluation docs)
    val_neg: RaggedIds                       # temperature fitting (held out of the statistics)
    test_neg: RaggedIds                      # next-token evaluation, truncated
    test_unk: RaggedIds
    lm_neg: RaggedIds                        # LM training docs (OOV = -1: <unk> in inputs, never a target)
    clf_train: EncodedCorpus | None          # classifier (labelled) sets, <unk> encoding
    clf_test: EncodedCorpus | None
    key: str = ""
    describe: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)   # what the tokens came from: the corpus's fingerprint() (config.json)
    archive: str | None = None      # IMDB: the archive read, wherever it was found (config.json's resolved_paths)


def load_data(cfg, sizes, progress: bool = True) -> Data:
    """Split the corpus. IMDB: statistics and LMs from train+unsup (minus the validation reviews),
    evaluation on test, the classifier on train -> test. A text corpus: a seeded split into
    statistics (85 %), validation (5 %) and test (10 %) documents; a classifier only if the
    documents carry at least two labels. A text corpus's documents without tokens (a blank line of
    a ``.txt`` file, an empty file, ``"text": ""``) have nothing to count, predict or classify:
    they are left out of every set, and the minimum of 20 documents counts only the others."""
    kwargs = {"path": cfg.path} if cfg.corpus == "text" else \
        {"data_dir": cfg.data_dir, "progress": progress, "split": "train+test+unsup"}
    corpus = get_corpus(cfg.corpus, **kwargs)
    tc = tokenize_corpus(corpus, progress=progress)
    rng = np.random.default_rng(cfg.seed)
    n = len(tc)
    clf_skipped = None          # why a text corpus trains no classifier, for the report
    n_empty = 0                 # a text corpus's documents without tokens, left out of every set
    if cfg.corpus == "imdb":
        train_idx = np.flatnonzero(tc.docs.split_mask("train"))
        unsup_idx = np.flatnonzero(tc.docs.split_mask("unsup"))
        test_idx = np.flatnonzero(tc.docs.split_mask("test"))
        val_idx = np.sort(rng.choice(train_idx, size=sizes.val_docs, replace=False))
        stat_idx = np.setdiff1d(np.concatenate([train_idx, unsup_idx]), val_idx)
        eval_idx = np.sort(rng.choice(test_idx, size=min(sizes.eval_docs, len(test_idx)), replace=False))
        clf_train_idx, clf_test_idx = train_idx, test_idx
    else:
        # documents without tokens (once counted here, and drawn into the evaluation and validation
        # sets: a .txt of blank-line-separated paragraphs had them about half empty)
        with_tokens = np.flatnonzero(tc.tokens.lengths > 0)
        m = len(with_tokens)
        if m < 20:
            raise ValueError(f"the corpus has {n} documents" + (f", {m} of them with tokens" if m < n else "")
                             + "; a comparison needs at least 20" + (" with tokens" if m < n else ""))
        n_empty = n - m
        if n_empty:
            log.info("%d of the %d documents have no tokens (blank lines, empty files or texts); they are left "
                     "out of every set", n_empty, n)
        perm = with_tokens[rng.permutation(m)]          # = rng.permutation(n) when every document has tokens
        n_test, n_val = max(2, m // 10), max(1, m // 20)
        eval_idx = np.sort(perm[:min(n_test, sizes.eval_docs)])
        val_idx = np.sort(perm[n_test:n_test + min(n_val, sizes.val_docs)])
        stat_idx = np.sort(perm[n_test + n_val:])
        other = np.flatnonzero(tc.labels > 1)
        if other.size:
            raise ValueError(f"{other.size} document(s) have a label other than 0 or 1, the first document "
                             f"{other[0]} (0-based, in corpus order) label {int(tc.labels[other[0]])}; the classifier "
                             f"is binary: labels 0 and 1, or -1 / none for unlabelled documents")
        labelled = (tc.labels >= 0) & (tc.tokens.lengths > 0)
        clf_train_idx = np.setdiff1d(np.flatnonzero(labelled), perm[:n_test])
        clf_test_idx = np.intersect1d(np.flatnonzero(labelled), perm[:n_test])
        skip = None
        if labelled.any() and len(np.unique(tc.labels[clf_train_idx])) < 2:
            skip = (f"the {len(clf_train_idx)} labelled training documents all have label "
                    f"{int(tc.labels[clf_train_idx][0])}" if len(clf_train_idx) else "no labelled training documents")
        elif labelled.any() and len(clf_test_idx) == 0:
            skip = "no labelled document fell into the test split"
        if skip:
            log.warning("classifier skipped: %s (it needs both labels, 0 and 1)", skip)
        if skip or not labelled.any():
            clf_train_idx = clf_test_idx = np.zeros(0, dtype=np.int64)
            clf_skipped = skip or "the documents carry no labels"
    if cfg.max_docs is not None and cfg.max_docs < len(stat_idx):     # a cap above them draws nothing
        stat_idx = np.sort(rng.choice(stat_idx, size=cfg.max_docs, replace=False))
    vocab = tc.take(stat_idx).vocabulary(max_size=sizes.vocab_size)
    neg = tc.encode(vocab, oov="negative")
    unk = tc.encode(vocab, oov="unk")
    lm_idx = stat_idx if sizes.lm_docs is None or sizes.lm_docs >= len(stat_idx) else \
        np.sort(rng.choice(stat_idx, size=sizes.lm_docs, replace=False))

    def subset(idx, n_max):
        if n_max is None or n_max >= len(idx):
            return idx
        return np.sort(rng.choice(idx, size=n_max, replace=False))
    clf_train = clf_test = None
    if len(clf_train_idx):
        clf_train = unk.take(subset(clf_train_idx, sizes.clf_train_docs))
        clf_test = unk.take(subset(clf_test_idx, sizes.clf_test_docs))
    data = Data(vocab=vocab, stat_neg=neg.tokens.take(stat_idx), val_neg=neg.tokens.take(val_idx).truncate(sizes.eval_len),
                test_neg=neg.tokens.take(eval_idx).truncate(sizes.eval_len),
                test_unk=unk.tokens.take(eval_idx).truncate(sizes.eval_len), lm_neg=neg.tokens.take(lm_idx),
                clf_train=clf_train, clf_test=clf_test, source=tc.source,
                # found by its fingerprint() above (--data-dir, $DISTATTN_DATA_DIR or the cache): not read again
                archive=str(corpus.path.resolve()) if cfg.corpus == "imdb" else None)
    data.key = config_hash({"tokens": tc.source, "seed": cfg.seed, "vocab": vocab.fingerprint(),
                            "stat": _ids_hash(stat_idx), "val": _ids_hash(val_idx), "eval": _ids_hash(eval_idx),
                            "lm": _ids_hash(lm_idx), "eval_len": sizes.eval_len,
                            "clf": [len(clf_train_idx), sizes.clf_train_docs, sizes.clf_test_docs]})
    data.describe = {"corpus": cfg.corpus, "documents": n, "tokens": tc.n_tokens, "vocab_size": len(vocab),
                     "statistics_docs": len(stat_idx), "statistics_tokens": data.stat_neg.n_tokens,
                     "validation_docs": len(val_idx), "eval_docs": len(eval_idx), "eval_len": sizes.eval_len,
                     "lm_docs": len(lm_idx), "classifier_train_docs": 0 if clf_train is None else len(clf_train),
                     "classifier_test_docs": 0 if clf_test is None else len(clf_test)}
    if n_empty:
        data.describe["documents_without_tokens"] = n_empty
    if clf_skipped:
        data.describe["classifier_skipped"] = clf_skipped
    return data


def _ids_hash(idx) -> str:
    return config_hash(np.asarray(idx, dtype=np.int64).tobytes().hex(), length=12)


# --------------------------------------------------------------------------- statistics

@dataclass
class TopSVD:
    """A stored truncated SVD of one statistics matrix X: ``u`` (m, r), ``s`` (r,) descending,
    ``vt`` (r, n), float32, and ``frobenius_sq`` = ‖X‖_F² of the whole matrix. The stages
    take prefixes of it rather than factorising X again."""
    u: np.ndarray
    s: np.ndarray
    vt: np.ndarray
    frobenius_sq: float

    @property
    def rank(self) -> int:
        return len(self.s)

    def triple(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.u, self.s, self.vt


def top_svd(X, rank: int) -> TopSVD:
    """The leading ``rank`` singular triplets of sparse ``X``, computed as
    :func:`distattn.analysis.spectrum` does (randomized, ``rank + max(10, rank // 4)`` vectors cut
    to ``rank``), kept in float32. Where the spectrum stays flat past ``rank`` the last values are
    a little low (the quick profile's PPMI at 64: σ_64 1.6 %);
    ``distattn.analysis.max_rel_residual(X, *svd.triple())`` says how far."""
    from distattn.analysis import spectrum
    spec, u, vt = spectrum(X, max(1, min(rank, min(X.shape) - 1)), return_vectors=True)
    return TopSVD(u.astype(np.float32), spec.singular_values, vt.astype(np.float32), spec.frobenius_sq)


def svd_ranks(sizes, V: int) -> tuple[int, int]:
    """How many triplets the statistics stage keeps: of PPMI, enough for the embeddings, the
    multi-head projection and the spectrum; of directional PPMI, for the asymmetric factors and
    the spectrum."""
    n_heads = min(sizes.heads[0], clamp_rank(sizes.heads[0], V))
    heads = n_heads * clamp_rank(sizes.heads[1], V // n_heads)
    spectrum = clamp_rank(sizes.spectrum_k, V)
    return (max(clamp_rank(sizes.svd_dim, V), heads, spectrum),
            max(clamp_rank(sizes.asym_rank, V), spectrum))


@dataclass
class Stats:
    S: sp.csr_array          # symmetric counts (window, harmonic)
    P: sp.csr_array          # PPMI (cds 0.75)
    P_dir: sp.csr_array      # directional PPMI ("j after i")
    embeddings: np.ndarray   # PPMI-SVD word vectors (U Σ^½ of PPMI, rows L2-normalised)
    counts: np.ndarray       # unigram counts over the statistics docs
    key: str
    svd_P: TopSVD            # one SVD per matrix, shared by the embeddings, projections and spectra
    svd_D: TopSVD
    seconds: float = 0.0


_SVD_FILES = ("u", "s", "vt")


def stage_statistics(data: Data, sizes, cache: bool = True) -> Stats:
    from distattn.stats import cooccurrence, ppmi
    V = len(data.vocab)
    rank_P, rank_D = svd_ranks(sizes, V)
    d, key = stage_dir("stats", {"data": data.key, "window": sizes.window, "svd_dim": sizes.svd_dim,
                                 "svd_ranks": [rank_P, rank_D], "svd": "randomized-f32-shared"})
    def load():
        meta = read_sealed_json(d / "done.json")
        check_files(d, meta["files"], "done.json")
        svds = {name: TopSVD(*(np.load(d / f"svd_{name}_{f}.npy") for f in _SVD_FILES), meta["frobenius_sq"][name])
                for name in ("P", "D")}
        return Stats(*(sp.csr_array(sp.load_npz(d / f"{n}.npz")) for n in ("S", "P", "P_dir")),
                     np.load(d / "embeddings.npy"), np.load(d / "counts.npy"), key, svds["P"], svds["D"])
    if cache and (d / "done.json").exists() and (stats := load_entry(d, load)) is not None:
        return stats
    t = time.perf_counter()
    S = cooccurrence(data.stat_neg, V, window=sizes.window, weighting="harmonic")
    if S.nnz == 0:          # else a NaN deep inside the projection's temperature fit
        raise ValueError(f"the statistics documents give no co-occurrence within {sizes.window} tokens: each has "
                         f"fewer than two in-vocabulary tokens ({data.stat_neg.n_tokens} tokens in "
                         f"{len(data.stat_neg)} documents); the comparison needs documents of several words")
    P = ppmi(S, cds=0.75)
    P_dir = ppmi(cooccurrence(data.stat_neg, V, window=sizes.window, weighting="harmonic", symmetric=False), cds=0.75)
    svd_P, svd_D = top_svd(P, rank_P), top_svd(P_dir, rank_D)
    dim = clamp_rank(sizes.svd_dim, V)
    emb = normalize(svd_P.u[:, :dim] * np.sqrt(svd_P.s[:dim]).astype(np.float32))   # SVDEmbeddings(eig=0.5)
    ids = data.stat_neg.ids
    counts = np.bincount(ids[ids >= 0], minlength=V)
    stats = Stats(S, P, P_dir, emb, counts, key, svd_P, svd_D, time.perf_counter() - t)
    if cache:
        with atomic_dir(d) as tmp:
            for name in ("S", "P", "P_dir"):
                sp.save_npz(tmp / f"{name}.npz", sp.csr_matrix(getattr(stats, name)), compressed=False)
            np.save(tmp / "embeddings.npy", emb)
            np.save(tmp / "counts.npy", counts)
            for name, svd in (("P", svd_P), ("D", svd_D)):
                for f in _SVD_FILES:
                    np.save(tmp / f"svd_{name}_{f}.npy", getattr(svd, f))
            # each file's sha256, checked on load: an .npy with a bit flipped on disk still loads
            files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
            (tmp / "done.json").write_text(json.dumps(seal({"seconds": stats.seconds, "frobenius_sq": {
                "P": svd_P.frobenius_sq, "D": svd_D.frobenius_sq}, "files": files})))
    return stats


# --------------------------------------------------------------------------- projection table

PROJECTION_ROWS = [
    ("unigram", "unigram (add-1)", "ngram"), ("kn2", "KN bigram", "ngram"), ("kn3", "KN trigram", "ngram"),
    ("raw", "raw counts, A = M (paper)", "projection"), ("ppmi_norm", "PPMI + Norm", "projection"),
    ("ppmi_softmax", "PPMI + softmax", "projection"), ("positional", "positional (Q+P)S(Q+P)ᵀ + Norm", "projection"),
    ("asym", "asymmetric M_dir, values QS", "projection"), ("mh_svd", "multi-head SVD, softmax", "projection"),
]


def projection_dir(data: Data, stats: Stats, sizes, device) -> tuple[Path, str]:
    """The projection stage's entry and key."""
    # the device is in the key, as in the model stages: a GPU scores in other batches and precision
    return stage_dir("projection", {"data": data.key, "stats": stats.key, "asym_rank": sizes.asym_rank,
                                    "heads": list(sizes.heads), "device": device.type})


def stage_projection(data: Data, stats: Stats, sizes, device, cache: bool = True, progress=None) -> list[dict]:
    """Next-token rows for the n-gram baselines and the projection variants (τ fitted on the
    validation docs, evaluated on the test docs)."""
    d, _ = projection_dir(data, stats, sizes, device)
    if cache and (d / "rows.json").exists() and \
            (rows := load_entry(d, lambda: read_sealed_json(d / "rows.json")["rows"])) is not None:
        return rows
    import torch

    from distattn.projection import (KneserNeyLM, UnigramLM, directional_factors, evaluate_next_token,
                                     fit_temperature, positional_distributions, prediction_targets, svd_heads)
    from distattn.projection.device_scorers import Asymmetric, DeviceNgram, MultiHead, Positional, Symmetric
    V = len(data.vocab)
    for name, docs in (("validation", data.val_neg), ("evaluation", data.test_neg)):
        # a validation set without one failed below ("torch.cat(): expected a
        # non-empty list of Tensors", or "bounds entry ... got nan"); an evaluation set without one
        # gave next-token rows of no positions, shown as blanks
        if not prediction_targets(docs)[1].any():
            raise ValueError(f"the {len(docs)} {name} document(s) hold no next-token position with an in-vocabulary "
                             f"target (each has a single token, or the tokens after its first are out of the "
                             f"vocabulary); the comparison needs documents of several words")
    kw = dict(vocab_size=V, device=device, batch_positions=4096 if device.type == "cpu" else 8192)

    def build(key):
        if key == "unigram":
            return DeviceNgram(UnigramLM().fit(data.stat_neg, V), device), False
        if key in ("kn2", "kn3"):
            return DeviceNgram(KneserNeyLM(order=int(key[-1])).fit(data.stat_neg, V), device), False
        if key == "raw":
            return Symmetric(stats.S, "none", **kw), True
        if key == "ppmi_norm":
            return Symmetric(stats.P, "row", **kw), True
        if key == "ppmi_softmax":
            return Symmetric(stats.P, "softmax", **kw), True
        if key == "positional":
            pi = positional_distributions(data.stat_neg, V, sizes.eval_len)
            return Positional(stats.P, pi, 1.0, **kw), True
        if key == "asym":
            # W_Q W_Kᵀ ≈ P_dir, so M_dir[t, s] ≈ P_dir[id_t, id_s] ("s follows t") for a key s before t.
            # Factors of P_dirᵀ (the "key precedes query" reading the QK-PMI correlation uses) predict
            # worse: quick profile, session 19, ppl 1210.12 against 1127.12, top-1 0.0611 against 0.0633
            W_Q, W_K = directional_factors(stats.P_dir, clamp_rank(sizes.asym_rank, V), svd=stats.svd_D.triple())
            return Asymmetric(W_Q, W_K, S=stats.P, **kw), True
        if key == "mh_svd":
            n_heads = min(sizes.heads[0], clamp_rank(sizes.heads[0], V))
            heads = svd_heads(stats.P, n_heads, clamp_rank(sizes.heads[1], V // n_heads), svd=stats.svd_P.triple())
            return MultiHead(heads, "softmax", **kw), True
        raise KeyError(key)

    rows = []
    for key, name, family in (progress(PROJECTION_ROWS, "projection rows") if progress else PROJECTION_ROWS):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, has_tau = build(key)
            tau = 1.0
            if has_tau:
                with model.caching():
                    scale = max(model.logit_scale(data.val_neg), 1e-12)
                    tau = fit_temperature(model, data.val_neg, vocab_size=V, bounds=(scale * 1e-3, scale * 1e3),
                                          max_predictions=None)
            with torch.no_grad():
                rep = evaluate_next_token(model, data.test_neg, vocab_size=V, temperature=tau)
        rows.append({"key": key, "model": name, "family": family, "temperature": tau if has_tau else None,
                     "perplexity": rep.perplexity, "top1": rep.top1_accuracy, "top10": rep.top10_accuracy,
                     "positions": rep.n_predictions, "oov_targets": rep.n_oov_targets,
                     "seconds": time.perf_counter() - t0})
        log.info("%-36s ppl %10.2f  top-1 %.4f  top-10 %.4f  (%.1fs)", name, rep.perplexity, rep.top1_accuracy,
                 rep.top10_accuracy, rows[-1]["seconds"])
        del model
    if cache:
        with atomic_dir(d) as tmp:
            (tmp / "rows.json").write_text(json.dumps(seal({"rows": rows}), indent=1))
    return rows


# --------------------------------------------------------------------------- models

@dataclass
class Trained:
    name: str
    model: object
    metrics: dict
    checkpoint: Path        # the stage entry's model.pt (under --no-cache possibly another run's weights: link_checkpoint)
    key: str = ""           # the stage entry's (config.json's stage_keys)
    weights_sha256: str = ""    # of ``model``'s weights (_weights_sha256): in the analysis stage's key


def _weights_sha256(model) -> str:
    """A sha256 of ``model``'s state dict (names, dtypes, shapes and bytes). Of the weights, not of the
    file: two saves of the same weights differ (torch writes a random serialization id)."""
    import hashlib

    import torch
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        if hasattr(v, "detach"):
            t = v.detach().cpu().contiguous().reshape(-1)
            h.update(f"{k}:{t.dtype}:{tuple(v.shape)}\n".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def _entry_lock(d: Path, shared: bool = False):
    """Hold a lock on the models-stage entry ``d`` (``fcntl.flock`` on ``d/.lock``, created with ``d``):
    exclusive while a run stores its ``model.pt`` and ``done.json``, shared while one reads them, so
    that no reader sees one run's model beside another's ``done.json``. Not reentrant: a process
    holding it must not take it again. A lock file removed while waiting for it (``load_entry``
    removing a damaged entry) is opened afresh. Where there is no ``fcntl`` (not POSIX), or a reader
    cannot create the lock file (an entry of another user's, written before there were locks), no lock
    is taken."""
    if fcntl is None:
        yield
        return
    path = d / ".lock"
    while True:
        try:
            d.mkdir(parents=True, exist_ok=True)
            # opened for writing to lock it exclusively: NFS emulates flock by fcntl locks, which need it
            fd = os.open(path, (os.O_RDONLY if shared else os.O_RDWR) | os.O_CREAT, 0o666)
        except OSError:
            if not shared:
                raise
            log.debug("reading %s unlocked: cannot open %s", d, path, exc_info=True)
            fd = None
        if fd is None:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                now, held = os.stat(path), os.fstat(fd)
                current = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)            # releases the lock


def _train(name: str, model, task, train_cfg, key_material: dict, cache: bool, evaluate=None) -> Trained:
    """Train (or load) one model. The stage directory holds the trainer's resumable
    ``checkpoint.pt`` while training, then ``model.pt`` and ``done.json`` (with the weights'
    sha256, checked on load: the run directory's hard link to model.pt lets an edit there, or a bit
    flipped on disk, change the weights, and torch.load checks no CRC).

    An entry with its ``done.json`` is never replaced (except a damaged one): the first run of a
    config to finish stores its pair, under an exclusive :func:`_entry_lock`, and a cached run that
    finishes after it takes that model and those metrics, as if it had loaded the entry, discarding
    its own. (Each file was written atomically but the pair was not: two runs finishing together, or a
    ``--no-cache`` run storing its model while a cached one finished, could leave one's ``model.pt``
    beside the other's ``done.json``, where their weights differ (a GPU's kernels), and the next run
    removed the entry as damaged and trained again; a run that had stored its model could find the
    other's in its run directory.) Readers hold the lock shared; one that finds the entry damaged removes
    it under the exclusive lock, if it is still finished and still damaged by then.

    ``cache=False`` (``--no-cache``) trains from scratch in a directory of its own beside the entry,
    never reading, resuming from or removing the entry: a cached run of the same config may be
    training in it or loading it, or have yet to link its ``model.pt`` into its run directory. Its
    ``model.pt`` and ``done.json`` are then stored in the entry as a cached run finishing stores
    them, so that the same command without ``--no-cache`` reuses the model; where the entry is
    already finished it is left as it is, and the run keeps its own model and metrics: its
    ``checkpoint`` then holds other weights, and :func:`link_checkpoint` puts the run's own in its run
    directory."""
    from distattn.train import Trainer, load_model, save_model
    key_material = dict(key_material, train=train_cfg.fingerprint())
    d, key = stage_dir(f"train-{name}", key_material)
    damaged = (pickle.UnpicklingError,)

    def load_trained():         # under _entry_lock
        metrics = read_sealed_json(d / "done.json")
        digest = metrics.pop("weights_sha256")
        try:
            model = load_model(d / "model.pt")
        except RuntimeError as exc:
            # torch's reader on a file cut short or garbled; any other RuntimeError (memory running out,
            # a state dict the model's code no longer fits) says nothing of the file: the entry is kept
            if "PytorchStreamReader" not in str(exc) and "corrupt file" not in str(exc):
                raise
            raise ValueError(f"{d / 'model.pt'} is damaged: {exc}") from None
        if _weights_sha256(model) != digest:
            raise ValueError(f"{d / 'model.pt'} is damaged: its weights' sha256 differs from the one done.json "
                             f"records")
        return Trained(name, model, metrics, d / "model.pt", key, digest)
    if cache and (d / "done.json").exists():
        found_damaged = False
        with _entry_lock(d, shared=True):
            try:
                trained = load_trained() if (d / "done.json").exists() else None
            except PermissionError:
                raise
            except (*_DAMAGED, *damaged):
                trained, found_damaged = None, True
        if found_damaged:
            # removed under the exclusive lock, and only if still finished and still damaged: under the
            # shared one, another reader's files went from under it, and a run that had removed the entry
            # meanwhile and started training there lost its checkpoint
            with _entry_lock(d):
                trained = load_entry(d, load_trained, damaged) if (d / "done.json").exists() else None
        if trained is not None:
            return trained
    d.mkdir(parents=True, exist_ok=True)
    # recompute: neither the finished model nor a checkpoint to resume from, in a directory named as
    # atomic.py names its temporaries (one a killed run leaves is swept). It once removed the entry
    # and trained there, pulling the files from under a cached run of the same config
    own = None if cache else temp_dir(d)
    out = d if own is None else own
    try:
        t = time.perf_counter()
        trainer = Trainer(model, task, train_cfg, out_dir=out)
        result = trainer.fit()
        # keep the weights the metrics were selected on: the trainer's own, not best.pt, which another
        # cached run training in the entry may have replaced with those of its own (earlier) best epoch
        if train_cfg.save_best and trainer.best_state_dict is not None:
            model.load_state_dict(trainer.best_state_dict)
        metrics = {"train_seconds": time.perf_counter() - t, "summary": result.get("summary", {}),
                   "history": result.get("history", []), "best": result.get("best")}
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
    if evaluate is not None:
        metrics.update(evaluate(model))
    digest = _weights_sha256(model)
    stored = None
    with _entry_lock(d):
        if (d / "done.json").exists():          # another run of this config finished first
            try:
                stored = load_trained()
            except PermissionError:
                raise
            except (*_DAMAGED, *damaged) as exc:
                log.warning("replacing damaged cache entry %s (%s: %s) with this run's model", d,
                            type(exc).__name__, exc)
        if stored is None:
            save_model(model, d / "model.pt")
            write_json(d / "done.json", seal({**metrics, "weights_sha256": digest}))
    if stored is not None and cache:
        log.info("%s: another run of the same config stored its model in %s first; this run uses it", name, d)
        return stored
    return Trained(name, model, metrics, d / "model.pt", key, digest)


def link_checkpoint(trained: Trained, dst: Path) -> Path:
    """Put the weights ``trained`` holds at ``dst`` (a run directory's ``checkpoints/<name>.pt``): a
    hard link to (or, across file systems, a copy of) its entry's ``model.pt`` where that file holds
    them, else ``trained.model`` saved there. The entry can hold other weights: a ``--no-cache`` run
    whose entry another run had finished first (:func:`_train`), or an entry removed and trained
    again since. Run directories once linked whatever the entry held by then, beside metrics and
    analyses of other weights."""
    from distattn.train import load_model, save_model
    try:
        os.link(trained.checkpoint, dst)
    except OSError:
        with contextlib.suppress(OSError):
            shutil.copy2(trained.checkpoint, dst)
    try:
        same = _weights_sha256(load_model(dst)) == (trained.weights_sha256 or _weights_sha256(trained.model))
    except (*_DAMAGED, pickle.UnpicklingError, RuntimeError):       # no file, another model, damaged
        same = False
    if not same:
        save_model(trained.model, dst)          # atomically: replaces the link, never the entry's file
    return dst


def _lm_steps(sizes, steps_per_epoch: int) -> int | None:
    """The LMs' step budget: the profile's ``lm_steps``; or, when the profile trains one full pass
    (``None``), at least ``lm_min_steps``, so that a small corpus (e.g. one's own under the full
    profile) is not trained for a couple of steps, inside its learning-rate warm-up."""
    if sizes.lm_steps is None and sizes.lm_min_steps and steps_per_epoch < sizes.lm_min_steps:
        return sizes.lm_min_steps
    return sizes.lm_steps


def _lm_epochs(steps: int | None, steps_per_epoch: int) -> int:
    """Epochs that give the LMs ``steps`` (the cap of one epoch on a large corpus): a small corpus
    is passed over several times. One epoch when the profile trains a full pass (``None``)."""
    if steps is None:
        return 1
    return max(1, -(-steps // max(1, steps_per_epoch)))


def _batch(wanted: int, n_items: int) -> int:
    """The profile's batch size, shrunk for small corpora so an epoch has at least two batches."""
    return max(1, min(wanted, n_items // 2))


def ppmi_svd_init(embeddings: np.ndarray, d_model: int) -> np.ndarray:
    """The statistics stage's PPMI-SVD vectors as a (vocab, d_model) embedding init: the leading
    ``d_model`` components, or all of them followed by zero columns when there are fewer."""
    v = np.zeros((embeddings.shape[0], d_model), dtype=np.float32)
    k = min(d_model, embeddings.shape[1])
    v[:, :k] = embeddings[:, :k]
    return v


def _best_classifier(data: Data, stats: Stats, sizes, mcfg, device, seed: int, common: dict, cache: bool,
                     progress: bool) -> Trained:
    """The best recipe that fits a profile's time: the seed architecture with its token embeddings
    initialised from this run's PPMI-SVD vectors (statistics of train+unsup, never test), the epoch
    picked on reviews held out of the classifier's training set. (Self-pretraining as a causal or
    masked LM does better but takes minutes on a GPU: see ``benchmarks/bench_models.py``.)"""
    from distattn.models import TransformerClassifier, load_embeddings
    from distattn.train import ClassificationData, ClassificationTask, seed_everything
    from distattn.train.recipes import seed_train_config
    n = len(data.clf_train)
    n_val = min(2_500, n // 10)
    perm = np.random.default_rng([seed, 7]).permutation(n)
    tr, va = np.sort(perm[n_val:]), np.sort(perm[:n_val])
    enc, labels = data.clf_train.tokens, data.clf_train.labels
    train = ClassificationData(enc.take(tr), labels[tr], max_len=mcfg.max_len)
    evals = {"val": ClassificationData(enc.take(va), labels[va], max_len=mcfg.max_len),
             "test": ClassificationData(data.clf_test.tokens, data.clf_test.labels, max_len=mcfg.max_len)}
    seed_everything(seed)
    model = load_embeddings(TransformerClassifier(mcfg), ppmi_svd_init(stats.embeddings, mcfg.d_model))
    epochs = sizes.best_clf_epochs or sizes.clf_epochs
    tcfg = seed_train_config(epochs=epochs, progress=progress, quiet=not progress, device=device.type, seed=seed,
                             checkpoint_every=50, batch_size=_batch(64, len(train)), lr=sizes.clf_lr,
                             select_on="val/accuracy", save_best=True)
    trained = _train("classifier_best", model, ClassificationTask(train, evals), tcfg,
                     {**common, "model": mcfg.to_dict(), "init": "ppmi-svd", "stats": stats.key, "n_val": n_val}, cache)
    best = trained.metrics.get("best") or {}
    trained.metrics.update(test_accuracy=best.get("eval", {}).get("test", {}).get("accuracy"),
                           val_accuracy=best.get("value"), best_epoch=best.get("epoch"), val_docs=n_val,
                           train_docs=len(tr), batch_size=tcfg.batch_size, epochs=epochs)
    return trained


def stage_models(data: Data, stats: Stats, sizes, device, seed: int, cache: bool = True,
                 progress: bool = True) -> dict[str, Trained]:
    """The seed-architecture classifier and the best recipe that fits the profile (when there are
    labels), the projection-matched attention-only LM and a small GPT-style LM, the LMs evaluated
    with the shared metric."""
    from distattn.models import (AttentionOnlyConfig, LMConfig, ProjectionMatchedLM, TransformerClassifier,
                                 TransformerLM, seed_classifier_config)
    from distattn.train import ClassificationData, ClassificationTask, LMData, LMTask, evaluate_lm, seed_everything
    from distattn.train.recipes import lm_train_config, seed_train_config
    V = len(data.vocab)
    out: dict[str, Trained] = {}
    common = {"data": data.key, "seed": seed, "device": device.type}

    def lm_eval(model):
        rep = evaluate_lm(model, data.test_unk, unk_id=data.vocab.unk_id, device=device)
        return {"next_token": rep.as_dict()}

    if data.clf_train is not None:
        mcfg = seed_classifier_config(vocab_size=V, **sizes.clf_model)
        train = ClassificationData(data.clf_train.tokens, data.clf_train.labels, max_len=mcfg.max_len)
        test = ClassificationData(data.clf_test.tokens, data.clf_test.labels, max_len=mcfg.max_len)
        seed_everything(seed)
        tcfg = seed_train_config(epochs=sizes.clf_epochs, progress=progress, quiet=not progress, device=device.type, seed=seed,
                                 checkpoint_every=50, batch_size=_batch(64, len(train)), lr=sizes.clf_lr)
        out["classifier"] = _train("classifier", TransformerClassifier(mcfg), ClassificationTask(train, {"test": test}),
                                   tcfg, {**common, "model": mcfg.to_dict()}, cache)
        hist = out["classifier"].metrics["history"]
        out["classifier"].metrics["test_accuracy"] = hist[-1]["eval"]["test"]["accuracy"] if hist else None
        out["classifier"].metrics["batch_size"] = tcfg.batch_size
        out["classifier"].metrics["epochs"] = tcfg.epochs
        if len(train) >= 20:          # enough labelled reviews to hold some out for picking the epoch
            out["classifier_best"] = _best_classifier(data, stats, sizes, mcfg, device, seed, common, cache, progress)
        else:
            log.info("best classifier skipped: %d labelled training documents (needs >= 20)", len(train))

    for name, model_cls, mcfg, lr in (
            ("attention_only_lm", ProjectionMatchedLM, AttentionOnlyConfig(vocab_size=V, **sizes.attn_model), 3e-3),
            ("transformer_lm", TransformerLM, LMConfig(vocab_size=V, **sizes.lm_model), 1e-3)):
        seed_everything(seed)
        train = LMData(data.lm_neg, seq_len=mcfg.max_len, oov_id=data.vocab.unk_id)
        batch, task = _batch(sizes.lm_batch, len(train)), LMTask(train, {})
        steps_per_epoch = len(task.plan(batch, 0, seed, 0, 1))
        steps = _lm_steps(sizes, steps_per_epoch)
        tcfg = lm_train_config(epochs=_lm_epochs(steps, steps_per_epoch), batch_size=batch, lr=lr,
                               max_steps=steps,
                               warmup_steps=min(100, (steps or 1000) // 10), progress=progress, quiet=not progress,
                               device=device.type, seed=seed, checkpoint_every=50)
        out[name] = _train(name, model_cls(mcfg), task, tcfg,
                           {**common, "model": mcfg.to_dict()}, cache, lm_eval)
    return out
