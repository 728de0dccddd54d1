"""One comparison run: every stage in order, then the analysis views, the figures, metrics.json,
config.json and report.html in ``<out>/<corpus>-<timestamp>/``."""

from __future__ import annotations

import json
import logging
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from distattn.atomic import (check_files, ensure_writable_dir, jsonable, missing_dirs, read_sealed_json, remove_empty_dirs,
                             seal, sha256_file, write_json)
from distattn.compare.config import CompareConfig
from distattn.compare.stages import (Data, clamp_rank, link_checkpoint, load_data, projection_dir, stage_models,
                                     stage_projection, stage_statistics)
from distattn.threads import start_numba_threads

log = logging.getLogger("distattn.compare")


class OutputDirError(OSError):
    """The output directory cannot be created or written."""


def make_run_dir(out: str, corpus: str) -> Path:
    """``<out>/<corpus>-<timestamp>``, created now so an unwritable ``--out`` fails before any work."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(out) / f"{corpus}-{stamp}"
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        i = 0
        while True:                 # claimed atomically: two runs started in the same second never share one
            try:
                run_dir.mkdir()
                break
            except FileExistsError:
                i += 1
                run_dir = Path(out) / f"{corpus}-{stamp}-{i}"
        for sub in ("figures", "graphs", "checkpoints"):
            ensure_writable_dir(run_dir / sub)
    except OSError as exc:
        # "File exists" / "Not a directory" read as if the run directory were the trouble: name the file in the way
        blocker = next((p for p in (Path(out), *Path(out).parents) if p.exists() and not p.is_dir()), None)
        why = f"{str(blocker)!r} is a file, not a directory" if blocker is not None else exc.strerror or exc
        raise OutputDirError(f"cannot write the run directory {str(run_dir)!r} under --out {out!r}: {why}") from None
    return run_dir


def environment(cfg: CompareConfig, profile: str, sizes, device, command: str | None = None) -> dict:
    """What config.json records; ``command``: the command line of the run (default: this process's).
    ``profile`` and ``sizes``: None for ``--corpus paper``, which uses neither; so is ``seed`` there
    (``--seed`` is ignored; ``config`` keeps the option as given)."""
    import dataclasses

    import networkx
    import scipy
    import sklearn
    import torch

    import distattn
    versions = {"python": platform.python_version(), "distattn": distattn.__version__, "numpy": np.__version__,
                "scipy": scipy.__version__, "scikit-learn": sklearn.__version__, "torch": torch.__version__,
                "networkx": networkx.__version__}
    try:
        pkg = Path(distattn.__file__).parent
        git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pkg, capture_output=True, text=True, timeout=5)
        # only when this package is tracked there: an installed copy inside another project's repository
        # (its .venv) is not that project's HEAD
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", Path(distattn.__file__).name], cwd=pkg,
                                 capture_output=True, text=True, timeout=5)
        git_hash = git.stdout.strip() if git.returncode == 0 and tracked.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        git_hash = None
    git_dirty = None
    if git_hash is not None:
        # whether the package's tracked files differ from that commit (staged or not): then the hash
        # does not name the code that ran. Untracked files are left out: tracked code runs one only
        # after a tracked change imports it, and stray files (notes, editor backups) would mark every run
        try:
            status = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no",
                                     "--", "."], cwd=pkg, capture_output=True, text=True, timeout=5)
            git_dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            pass
    # the options as given, and the paths they name made absolute, so that config.json still says
    # which files were read after the run directory is moved or the shell's directory changes
    paths = {k: str(Path(v).expanduser().resolve()) for k in ("path", "data_dir", "out")
             if (v := getattr(cfg, k)) is not None}
    return {"config": dataclasses.asdict(cfg), "resolved_paths": paths, "profile": profile,
            "sizes": None if sizes is None else dataclasses.asdict(sizes), "device": str(device),
            "seed": None if cfg.corpus == "paper" else cfg.seed, "versions": versions, "git_hash": git_hash,
            "git_dirty": git_dirty,
            # which data was read and the stage entries built on it: filled in once the stages ran
            "corpus_fingerprint": None, "stage_keys": None,
            "command": command_line(sys.argv) if command is None else command, "started": datetime.now().isoformat(timespec="seconds")}


def command_line(argv: list[str]) -> str:
    """``argv`` as a command to paste into a shell: ``python -m distattn.compare …`` when run as a module."""
    import shlex
    head = argv[0] if argv else ""
    if Path(head).parts[-3:] == ("distattn", "compare", "__main__.py"):
        head = "python -m distattn.compare"
    return " ".join([head, *map(shlex.quote, argv[1:])]).strip()


def _stage(name, timings, fn, *args, **kwargs):
    t = time.perf_counter()
    log.info("stage %s ...", name)
    out = fn(*args, **kwargs)
    timings[name] = round(time.perf_counter() - t, 3)
    log.info("stage %s done in %.1fs", name, timings[name])
    return out


def run(cfg: CompareConfig, cache: bool = True, progress: bool = True, command: str | None = None) -> Path:
    """Run the whole study; returns the run directory. ``command``: the command line config.json and
    the report name (default: this process's, ``sys.argv``)."""
    from distattn.memory import max_memory_setting
    from distattn.train import pick_device
    cfg.validate()
    max_memory_setting()                 # read otherwise only by a memory check, which a cached stage skips
    paper = cfg.corpus == "paper"         # the paper's fixed toy examples: no profile, no sizes apply
    profile = None if paper else cfg.resolved_profile()
    sizes = None if paper else cfg.sizes()
    device = pick_device(cfg.device)                 # an unavailable device is refused before anything is written
    start_numba_threads()                            # keeping torch's CPU thread count: distattn.threads
    if profile == "full" and device.type == "cpu" and cfg.train_models and cfg.corpus != "paper":   # --device auto, no GPU
        raise ValueError("--profile full trains seed-size models and needs a GPU, and none was found (device "
                         f"{cfg.device!r} resolved to cpu); use --profile quick, or add --no-models")
    if cfg.corpus != "paper":                        # the stages are kept there (even with --no-cache: the
        from distattn.paths import cache_dir          # tokenized corpus and the trained models)
        cache_root = cache_dir(create=False)
        try:
            ensure_writable_dir(cache_root / "compare")
        except OSError as exc:
            raise OutputDirError(f"cannot write the cache directory {str(cache_root)!r} (set DISTATTN_CACHE_DIR to "
                                 f"a writable directory): {exc.strerror or exc}") from None
    fresh = missing_dirs(cfg.out)
    try:
        run_dir = make_run_dir(cfg.out, cfg.corpus)
    except OutputDirError:
        remove_empty_dirs(fresh)
        raise
    try:
        return _study(cfg, run_dir, profile, sizes, device, cache, progress, command)
    except BaseException:
        # a run that fails or is interrupted leaves no half-filled run directory behind (nor an --out
        # it created for it); the stages it finished stay in the cache and training resumes from its
        # checkpoint when the command is run again
        if not (run_dir / "report.html").exists():      # the last file a finished run writes
            shutil.rmtree(run_dir, ignore_errors=True)
            remove_empty_dirs(fresh)
        raise


def _study(cfg: CompareConfig, run_dir: Path, profile: str, sizes, device, cache: bool, progress: bool,
           command: str | None = None) -> Path:
    env = environment(cfg, profile, sizes, device, command)
    if cfg.corpus == "paper":           # its few files, read at once; no stage is cached
        from distattn.corpus import get_corpus
        env.update(corpus_fingerprint=get_corpus("paper").fingerprint(), stage_keys={})
    write_json(run_dir / "config.json", env)
    timings: dict = {}
    t0 = time.perf_counter()
    metrics: dict = {"profile": profile, "timings_s": timings}
    if cfg.corpus == "paper":
        ignored = [opt for opt, given in (("--max-docs", cfg.max_docs is not None), ("--no-models", not cfg.train_models),
                                          ("--seed", cfg.seed != 0), ("--profile", cfg.profile != "auto")) if given]
        if ignored:             # accepted (they are valid options) but they change nothing here: say so
            log.warning("%s ignored: --corpus paper reproduces the paper's fixed toy examples (no data, no "
                        "training)", ", ".join(ignored))
        metrics["paper"] = _stage("paper", timings, paper_reproduction, run_dir)
    else:
        data = _stage("data", timings, load_data, cfg, sizes, progress)
        metrics["data"] = data.describe
        stats = _stage("statistics", timings, stage_statistics, data, sizes, cache)
        rows = _stage("projection", timings, stage_projection, data, stats, sizes, device, cache,
                      _bar if progress else None)
        models = {}
        if cfg.train_models:
            models = _stage("models", timings, stage_models, data, stats, sizes, device, cfg.seed, cache, progress)
        metrics["next_token"] = rows + [_lm_row(name, m) for name, m in models.items() if "next_token" in m.metrics]
        kind = "reviews" if cfg.corpus == "imdb" else "documents"
        if "classifier" in models:
            seed_clf = models["classifier"]
            scaled = ("" if profile == "full" else
                      f", scaled down for the quick profile ({_scaled(sizes, seed_clf.model, len(data.clf_train), kind)})")
            metrics["classifier"] = {
                "test_accuracy": seed_clf.metrics.get("test_accuracy"),
                "train_seconds": seed_clf.metrics.get("train_seconds"), "epochs": seed_clf.metrics.get("epochs"),
                "config": (f"seed architecture (000_48942d33924f2728.txt){scaled}; "
                           f"{seed_clf.metrics.get('epochs')} epochs")}
        if "classifier_best" in models:
            m = models["classifier_best"].metrics
            metrics["classifier_best"] = {
                k: m.get(k) for k in ("test_accuracy", "val_accuracy", "best_epoch", "train_seconds", "val_docs",
                                      "train_docs", "epochs")}
            metrics["classifier_best"]["config"] = (
                "seed architecture, token embeddings initialised from this run's PPMI-SVD vectors; epoch "
                f"{m.get('best_epoch')} of {m.get('epochs')} picked on {m.get('val_docs')} held-out train {kind}")
        for name, m in models.items():           # the weights this run used, which its entry may not hold
            link_checkpoint(m, run_dir / "checkpoints" / f"{name}.pt")
        metrics["analysis"] = _stage("analysis", timings, cached_analysis, run_dir, data, stats, models, sizes,
                                     device, cache)
        metrics["paper"] = paper_reproduction(run_dir)
        # config.json again, with what the stages computed: the corpus's fingerprint (as the tokenized
        # cache keys it) and each stage's key, so that it says which data (and which cache entries) the
        # run used; before, runs of an edited --path (or of another IMDB archive) wrote the same one
        env.update(corpus_fingerprint=data.source.get("fingerprint"), stage_keys={
            "data": data.key, "statistics": stats.key, "projection": projection_dir(data, stats, sizes, device)[1],
            "models": {name: m.key for name, m in models.items()},
            "analysis": analysis_dir(data, stats, models, sizes)[1]})
        if data.archive is not None:    # where --data-dir, $DISTATTN_DATA_DIR or the cache led (or the download)
            env["resolved_paths"]["archive"] = data.archive
        write_json(run_dir / "config.json", jsonable(env))
    timings["total"] = round(time.perf_counter() - t0, 3)
    write_json(run_dir / "metrics.json", jsonable(metrics))
    from distattn.compare.report import write_report
    write_report(run_dir, env, metrics)
    return run_dir


def _scaled(sizes, model, n_train: int, kind: str) -> str:
    """How the quick profile's classifier differs from the seed's, for the report: the number of
    training documents is the one used (a small corpus has fewer than the profile's cap)."""
    return (f"d_model {model.config.d_model}, max_len {model.config.max_len}, {n_train:,} train {kind}, "
            f"lr {sizes.clf_lr:g}")


def _bar(items, desc):
    from tqdm.auto import tqdm
    return tqdm(items, desc=desc, unit="row", file=sys.stderr)


def _lm_row(name: str, trained) -> dict:
    nt = trained.metrics["next_token"]
    label = {"attention_only_lm": "LM: projection-matched attention-only (1 layer)",
             "transformer_lm": "LM: GPT-style transformer"}.get(name, name)
    return {"key": name, "model": label, "family": "learned", "temperature": None, "perplexity": nt["perplexity"],
            "top1": nt["top_k_accuracy"]["1"], "top10": nt["top_k_accuracy"]["10"],
            "positions": nt.get("n_predictions"), "oov_targets": nt.get("n_oov_targets"),
            "seconds": trained.metrics.get("train_seconds")}


# --------------------------------------------------------------------------- the paper

def paper_reproduction(run_dir: Path) -> dict:
    """Sections 2.5 and 3.2 of 003_8065cadafb1b3474.txt through the public API."""
    from distattn.analysis.figures import plot_attention_comparison
    from distattn.corpus import get_corpus
    from distattn.projection import context_matrix, global_evidence, row_normalize, vocabulary_evidence
    paper = get_corpus("paper")
    out = {}
    mats = {}
    for name, words in paper.examples.items():
        ids = np.array([paper.words.index(w) for w in words])
        M = context_matrix(ids, paper.cooc)
        A = row_normalize(M)
        E = vocabulary_evidence(ids, paper.cooc)
        e = global_evidence(ids, paper.cooc)
        out[name] = {"sequence": words, "M": M, "norm_M": np.round(A, 3), "E": E, "e_global": np.round(e, 2),
                     "prediction": paper.words[int(np.argmax(e))], "vocabulary": paper.words}
        mats[" ".join(words)] = (A, words)
    for label, (A, words) in mats.items():
        plot_attention_comparison({"Norm(M)": A}, run_dir / "figures" / f"paper_{label.replace(' ', '_')}.png",
                                  tokens=words, title=f"Norm(QSQᵀ) for “{label}”")
    return out


# --------------------------------------------------------------------------- analysis views

def _seed_examples(data: Data):
    from distattn.corpus import RegexTokenizer
    from distattn.paths import corpora_dir
    spec = json.loads((corpora_dir() / "seed000_examples.json").read_text())["examples"]
    tok = RegexTokenizer()
    out = []
    for ex in spec:
        words = tok(ex["text"])
        out.append((ex["name"], words, data.vocab.encode(words, oov="negative"), ex["expected"]))
    return out


def analysis_dir(data: Data, stats, models: dict, sizes) -> tuple[Path, str]:
    """The analysis stage's entry and key."""
    import dataclasses

    from distattn.compare.stages import stage_dir
    # "version" 2: the directional factors and the alignment basis come from the spectra's SVDs;
    # 3: the PPMI and directional-PPMI spectra come from the statistics stage's SVDs; 4: the seed's
    # IMDB example reviews are drawn for IMDB only; 5: the CKA figure's title names a text corpus's documents;
    # 6: the learned kernel is exp(q·k/√d) for every pair (it took the causal mask's pairs as the smallest score);
    # 7: a heatmap without learned heads (--no-models) is titled as the projection's alone, with "learned_heads";
    # 8: the spectra of the randomized SVDs record max_rel_residual; 9: each model by its entry and the
    # sha256 of the weights the run used (a model entry removed as damaged and trained again, or a
    # --no-cache run's own model beside a finished entry, once met the analysis of other weights);
    # 10: analysis.json is {"result", "files"}, each figure's and GraphML file's sha256 checked on load
    return stage_dir("analysis", {"version": 10, "data": data.key, "stats": stats.key,
                                  "sizes": dataclasses.asdict(sizes),
                                  "models": {n: [m.checkpoint.parent.name, m.weights_sha256]
                                             for n, m in models.items()}})


def cached_analysis(run_dir: Path, data: Data, stats, models: dict, sizes, device, cache: bool = True) -> dict:
    """:func:`analyse`, cached like every other stage: its numbers, figures and GraphML files are
    kept in the stage directory and copied into the run directory. The entry's sealed
    ``analysis.json`` holds the numbers and each figure's and GraphML file's sha256, checked on
    load: a file changed on disk makes the entry damaged (recomputed), never a figure copied into
    a run as computed."""
    from distattn.atomic import atomic_dir
    from distattn.compare.stages import load_entry
    d, _ = analysis_dir(data, stats, models, sizes)
    if not cache:               # recompute: this run's analysis, never an entry a cached run left there
        return json.loads(json.dumps(jsonable(analyse(run_dir, data, stats, models, sizes, device))))
    entry = None
    if (d / "analysis.json").exists():
        entry = load_entry(d, lambda: _read_analysis_entry(d))
    if entry is None:
        with atomic_dir(d) as tmp:
            for sub in ("figures", "graphs"):
                (tmp / sub).mkdir()
            result = jsonable(analyse(tmp, data, stats, models, sizes, device))
            files = {f"{sub}/{f.name}": sha256_file(f) for sub in ("figures", "graphs")
                     for f in sorted((tmp / sub).iterdir())}
            (tmp / "analysis.json").write_text(json.dumps(seal({"result": result, "files": files})))
        entry = _read_analysis_entry(d)
    for name in entry["files"]:
        shutil.copy2(d / name, run_dir / name)
    return entry["result"]


def _read_analysis_entry(d: Path) -> dict:
    """The analysis entry ``d``'s sealed JSON, its figures and GraphML files checked (:func:`check_files`)."""
    entry = read_sealed_json(d / "analysis.json")
    check_files(d, entry["files"], "analysis.json")
    return entry


def learned_kernel(model, ids, layer: int = 0, head: int = 0) -> np.ndarray:
    """One head's learned attention kernel on one sequence: ``K_ij = exp(s_ij - max s)`` (T, T), ``s_ij``
    the scaled score of *every* (query, key) pair, ``q_i · k_j / sqrt(d_k)`` (plus ``q_i · r_{i-j} / sqrt(d_k)``
    under ``positional="relative"``), from the layer's ``hook_q`` / ``hook_k`` and
    :meth:`~distattn.models.attention.MultiHeadSelfAttention.pair_scores`. A causal layer's
    ``hook_scores`` would give ``-inf`` for the pairs ``j > i`` the mask hides: not this kernel.
    ``ids``: (1, T) long tensor; subtracting the largest score keeps ``exp`` finite."""
    import torch

    from distattn.models import capture_hooks
    from distattn.models.circuits import attention_layers
    attn = attention_layers(model)[layer]
    where = next(n for n, m in model.named_modules() if m is attn)
    with torch.no_grad(), capture_hooks(model, names=[f"{where}.hook_q", f"{where}.hook_k"]) as cache:
        model(ids)
    with torch.no_grad():
        scores = attn.pair_scores(cache[f"{where}.hook_q"], cache[f"{where}.hook_k"])[0, head].numpy()
    return np.exp(scores - scores.max())


class _Sections:
    """Wall time of each analysis section, logged and kept in ``out["section_seconds"]``."""

    def __init__(self, out: dict):
        self.seconds = out.setdefault("section_seconds", {})
        self.name, self.t = None, time.perf_counter()

    def __call__(self, name: str | None):
        now = time.perf_counter()
        if self.name is not None:
            self.seconds[self.name] = round(now - self.t, 3)
            log.info("  analysis %-26s %.1fs", self.name, self.seconds[self.name])
        self.name, self.t = name, now


def _stored_spectrum(svd, X, k: int, name: str):
    """The top-``k`` spectrum of X and its singular vectors, from the statistics stage's SVD
    (:func:`~distattn.compare.stages.svd_ranks` sizes it for the spectrum)."""
    from distattn import analysis as A
    if k > svd.rank:
        raise ValueError(f"the stored SVD of {name} holds {svd.rank} triplets; the spectrum needs {k}")
    spec = A.Spectrum(np.asarray(svd.s[:k], dtype=np.float64), svd.frobenius_sq, X.shape, k < min(X.shape), name)
    u, vt = np.asarray(svd.u[:, :k], dtype=np.float64), np.asarray(svd.vt[:k], dtype=np.float64)
    # the randomized SVD's accuracy, as spectrum() records it (metrics.json's spectra)
    spec.extra["max_rel_residual"] = A.max_rel_residual(X, u, spec.singular_values, vt)
    return spec, u, vt


def analyse(run_dir: Path, data: Data, stats, models: dict, sizes, device) -> dict:
    """Spectra, attention-PMI correlation, agreement with baselines, graphs, kernels/CKA,
    heatmaps. Every number goes to metrics.json, every figure to figures/."""
    from distattn import analysis as A
    from distattn.analysis import figures
    from distattn.analysis.circuits import circuit_alignment, circuit_spectra
    from distattn.analysis.sources import TorchModelAdapter
    from distattn.projection import (CorpusPositional, context_matrix, directional_context_matrix,
                                     directional_factors, positional_distributions, row_normalize, softmax_rows)
    fig_dir, graph_dir = run_dir / "figures", run_dir / "graphs"
    unk = data.vocab.unk_id
    words = data.vocab.itos
    out: dict = {}
    rng = np.random.default_rng(0)
    section = _Sections(out)

    # ---- spectra
    section("spectra")
    k = clamp_rank(sizes.spectrum_k, len(words))
    # one SVD per matrix: PPMI's also gives the subspace for the circuit alignment, the
    # directional PPMI's the factors of the asymmetric prediction
    spec_P, u_P, _ = _stored_spectrum(stats.svd_P, stats.P, k, "PPMI")
    spec_D, u_D, vt_D = _stored_spectrum(stats.svd_D, stats.P_dir, k, "directional PPMI")
    specs = {"S (counts)": A.spectrum(stats.S, k, name="S"), "PPMI": spec_P, "directional PPMI": spec_D,
             "PPMI-SVD embeddings": A.spectrum(stats.embeddings, min(k, stats.embeddings.shape[1]), algorithm="dense",
                                               name="embeddings")}
    from distattn.models import ov_circuit, qk_circuit
    lms = {n: models[n].model.cpu().eval() for n in ("transformer_lm", "attention_only_lm") if n in models}
    circuit_specs = {}
    for name, model in lms.items():
        for cname, fn in (("QK", qk_circuit), ("OV", ov_circuit)):
            for s in circuit_spectra(fn(model, 0), f"{name} L0 {cname}"):
                circuit_specs[s.name] = s
    out["spectra"] = {n: A.spectrum_summary(s, (1, 10, 50)) for n, s in {**specs, **circuit_specs}.items()}
    figures.plot_spectra({n: s.singular_values for n, s in specs.items()}, fig_dir / "spectra_statistics.png",
                         title="Spectra: corpus statistics", normalize=True)
    if circuit_specs:
        pick = {n: s for n, s in circuit_specs.items() if n.endswith("[0]")}
        figures.plot_spectra({n: s.singular_values for n, s in {"PPMI": specs["PPMI"], **pick}.items()},
                             fig_dir / "spectra_circuits.png",
                             title="Spectra: PPMI vs learned QK/OV circuits (head 0)", normalize=True)

    # ---- attention-PMI correlation and subspace alignment
    section("attention-PMI correlation")
    word_ids = A.top_frequent_ids(stats.counts, min(sizes.top_words, len(words) - 2), exclude=(0, 1))
    corr, align = [], []
    circuits = {name: A.as_factored(qk_circuit(model, 0)) for name, model in lms.items()}   # layer 0
    heads = [(name, h, qk[h]) for name, qk in circuits.items() for h in range(qk.shape[0])]  # (n_heads, V, V)
    statistics = (("PPMI", stats.P, "query_key"), ("directional PPMI", stats.P_dir, "key_query"))
    # every head against one statistic in one call: the statistic's ranks are computed once
    per_stat = {stat_name: A.qk_pmi_correlations([qk for _, _, qk in heads], X, word_ids, orientation=orient)
                for stat_name, X, orient in statistics} if heads else {}
    for i, (name, h, _) in enumerate(heads):
        for stat_name, _, _ in statistics:
            corr.append({"model": name, "layer": 0, "head": h, "statistic": stat_name,
                         **per_stat[stat_name][i].to_dict()})
    # clamped to the vocabulary: one of fewer than 13 words asked PPMI (V, V) for 10 singular
    # vectors ("k must be an integer in [1, V - 3], got 10")
    kk = min([clamp_rank(10, len(words))] + [qk.left.shape[-1] for _, _, qk in heads])
    basis = u_P[:, :kk] if kk <= u_P.shape[1] else A.top_singular_vectors(stats.P, kk)   # PPMI's top-k subspace
    for name, qk in circuits.items():
        for h, a in enumerate(circuit_alignment(stats.P, qk, kk, basis=basis)):
            align.append({"model": name, "head": h, "k": kk, **(a.to_dict() if hasattr(a, "to_dict") else vars(a))})
    out["attention_pmi_correlation"] = corr
    out["subspace_alignment"] = align

    # ---- agreement over held-out sequences (causal LMs), with baselines
    section("agreement")
    test = data.test_neg
    lens = test.lengths
    cand = np.flatnonzero(lens >= 8)
    chosen = rng.choice(cand, size=min(sizes.analysis_seqs, len(cand)), replace=False) if len(cand) else []
    seqs = [test[i][:sizes.analysis_len] for i in chosen]
    positional = CorpusPositional(stats.P, positional_distributions(data.stat_neg, len(words), sizes.analysis_len))
    d_k = clamp_rank(sizes.asym_rank, len(words))
    if d_k <= spec_D.singular_values.size:         # W_Q W_Kᵀ: the rank-d_k truncation, from the spectrum's SVD
        root = np.sqrt(spec_D.singular_values[:d_k])
        W_Q, W_K = u_D[:, :d_k] * root, vt_D[:d_k].T * root
    else:
        W_Q, W_K = directional_factors(stats.P_dir, d_k, algorithm="randomized")

    def projections(ids):
        M = context_matrix(ids, stats.P)
        c = positional(ids)
        return {"Norm(QSQᵀ)": row_normalize(M),
                "positional": row_normalize(c.content_content + c.content_position + c.position_content
                                            + c.position_position),
                "asymmetric": softmax_rows(directional_context_matrix(ids, W_Q, W_K))}
    preds = [projections(s) for s in seqs]
    predictions = {name: [p[name] for p in preds] for name in (preds[0] if preds else {})}
    agreement = {}
    if lms and not seqs:            # the agreement, graph and kernel views need one such document
        log.info("agreement, graph and kernel views skipped: no held-out document has 8 tokens")
    for name, model in (lms if seqs else {}).items():
        adapter = TorchModelAdapter(model, oov_id=unk)
        patterns = [adapter.patterns(s) for s in seqs]
        records = A.head_agreement(patterns, predictions, causal=True)
        agreement[name] = records
    out["agreement"] = agreement
    if agreement:
        name = "transformer_lm" if "transformer_lm" in agreement else next(iter(agreement))
        summary = {}
        for r in agreement[name]:
            summary.setdefault(r["predictor"], []).append(r)
        def mean(values):
            v = np.array([np.nan if x is None else x for x in values], dtype=float)
            return float(np.mean(v[np.isfinite(v)])) if np.isfinite(v).any() else float("nan")
        scores = {p: {"js_mean": mean(r["js_mean"] for r in rs), "top1": mean(r["top1"] for r in rs),
                      "spearman_mean": mean(r["spearman_mean"] for r in rs), "n_rows": rs[0]["n_rows"],
                      "n_heads": len(rs)}
                  for p, rs in summary.items()}
        out["agreement_summary"] = {"model": name, "mean_over_heads": scores}
        figures.plot_agreement({p: v for p, v in scores.items()}, fig_dir / "agreement.png",
                               title=f"Agreement with {name}'s heads (mean over heads, {len(seqs)} test sequences)")

    # ---- heatmaps: IMDB: the five examples of 000 §IV.B and two held-out reviews; another corpus:
    # four of its own held-out documents (the seed's movie reviews say nothing about it)
    section("heatmaps")
    imdb = data.describe.get("corpus") == "imdb"
    kind = "review" if imdb else "document"
    examples = (_seed_examples(data) if imdb else []) + [
        (f"held-out {kind} {i + 1}", data.vocab.decode(np.where(s < 0, unk, s)), s, "")
        for i, s in enumerate(seqs[:2 if imdb else 4])]
    clf = models.get("classifier")
    heat = []
    for j, (ex_name, toks, ids, expected) in enumerate(examples):
        ids = ids[:min(len(ids), 40)]
        toks = toks[:len(ids)]
        if np.count_nonzero(ids >= 0) < 2:      # a text too short, or made of out-of-vocabulary words
            log.info("heatmap of %r skipped: fewer than two of its words are in the vocabulary", ex_name)
            continue
        mats = {"projection Norm(QSQᵀ)": row_normalize(context_matrix(ids, stats.P))}
        for name, model in list(lms.items())[:1] + ([("classifier", clf.model.cpu().eval())] if clf else []):
            pat = TorchModelAdapter(model, oov_id=unk).patterns(ids)
            for h in range(min(pat.shape[1], 4)):
                mats[f"{name} L0 H{h}"] = pat[0, h]
        path = fig_dir / f"heatmap_{j + 1}.png"
        learned = len(mats) - 1         # none under --no-models: the title said "vs learned heads" all the same
        figures.plot_attention_comparison(mats, path, tokens=toks, max_cols=3,
                                          title=f"{ex_name}: " + ("projection vs learned heads" if learned
                                                                  else "the projection (no model trained)"))
        entry = {"example": ex_name, "expected": expected, "figure": path.name, "tokens": len(ids),
                 "learned_heads": learned}
        if clf is not None:
            import torch
            with torch.no_grad():
                x = torch.as_tensor(np.where(ids < 0, unk, ids)[None], dtype=torch.long)
                logit = clf.model(x)
                logit = logit[0] if isinstance(logit, tuple) else logit
                entry["p_positive"] = float(torch.sigmoid(logit.reshape(-1)[0]))
        heat.append(entry)
    out["heatmaps"] = heat

    # ---- graphs: one held-out sequence's attention graph, rollout/flow, and bank's PPMI senses
    section("graphs")
    if lms and seqs:
        name, model = next(iter(lms.items()))
        s = seqs[0][:24]
        toks = data.vocab.decode(np.where(s < 0, unk, s))
        pat = TorchModelAdapter(model, oov_id=unk).patterns(s)
        mean_att = pat[0].mean(0)
        G = A.attention_graph(mean_att, toks, threshold=0.02)
        A.write_graphml(G, graph_dir / "attention_example.graphml")
        gm = A.graph_metrics(mean_att, toks)
        figures.plot_attention_graph(mean_att, fig_dir / "attention_graph.png", tokens=toks,
                                     title=f"{name}, layer 0 (mean over heads)")
        rollout = A.attention_rollout(pat)
        flow = A.attention_flow(pat, outputs=[len(s) - 1])
        out["graph"] = {"model": name, "tokens": toks, "spectral_gap": gm["spectral_gap"],
                        "pagerank_top": [toks[i] for i in np.argsort(gm["pagerank"])[::-1][:5]],
                        "rollout_last_row_top": [toks[i] for i in np.argsort(rollout[-1])[::-1][:5]],
                        "flow_to_last_top": [toks[i] for i in np.argsort(np.asarray(flow).reshape(-1))[::-1][:5]]}
        P_proj = projections(s)["Norm(QSQᵀ)"]
        A.write_graphml(A.attention_graph(P_proj, toks, threshold=0.02), graph_dir / "projection_example.graphml")
    if "bank" in data.vocab:
        try:
            out["bank_senses"] = A.sense_communities(stats.P, "bank", k=30, words=words, seed=0).to_dict()
        except ValueError as exc:       # e.g. "bank" only in one-word documents: no senses to show
            log.info("bank's sense communities skipped: %s", exc)

    # ---- kernels and CKA on one held-out sequence
    section("kernels and CKA")
    if lms and seqs:
        import torch
        s = seqs[0]
        ids_t = torch.as_tensor(np.where(s < 0, unk, s)[None], dtype=torch.long)
        name, model = next(iter(lms.items()))
        X = stats.embeddings[np.where(s < 0, 0, s)]
        kernels = {"projection M": A.projection_kernel(context_matrix(s, stats.P)),
                   "learned exp(qkᵀ/√d)": learned_kernel(model, ids_t, layer=0, head=0),   # every pair, unmasked
                   "RBF": A.rbf_kernel(X, gamma="median"), "linear": A.linear_kernel(X),
                   "polynomial": A.polynomial_kernel(X)}
        names, C = A.cka_matrix(kernels)
        figures.plot_cka_matrix(names, C, fig_dir / "cka.png", title=f"CKA between attention kernels (one held-out {kind})")
        out["cka"] = {"names": names, "matrix": C, "psd": {n: A.psd_check(K) for n, K in kernels.items()}}
    section(None)
    return out
