"""The projection predictor against n-gram baselines on IMDB (issue 3): causal next-token
perplexity, top-1 and top-10 accuracy.

Every position t of a held-out review predicts token t+1 from the prefix ``ids[:t+1]`` only.

Data (all choices fixed by ``--seed``):

* statistics: the train+unsup reviews minus the validation reviews. They give the vocabulary
  (the ``--vocab-size`` most frequent words, no specials), S (``--window`` tokens, harmonic
  weighting, symmetric), its PPMI (context smoothing ``--cds``), the directional counts and
  their PPMI, the positional distributions, the SVD/NMF factors and the n-gram counts;
* validation: ``--n-val`` reviews drawn from *train* and held out of the statistics; the output
  temperature τ of every projection row is fitted on them (``fit_temperature``);
* evaluation: ``--n-eval`` test reviews (a fixed-seed sample), the first ``--max-len`` tokens
  of each; validation reviews are truncated the same way.

OOV policy: a position whose target is out of vocabulary is skipped (reported as "oov
targets"); every row is scored on exactly the same positions. OOV context tokens are skipped
by the projection (its prefix holds the in-vocabulary tokens, at their original positions for
the positional row) and break n-gram contexts (Kneser-Ney backs off).

Rows (A: attention from M, values: what A mixes; e_t = (1/R) Σ_r Σ_s A[r, s] value_s over the R
in-vocabulary prefix tokens; p = softmax(e_t / τ)):

* unigram, KN bigram, KN trigram (interpolated Kneser-Ney, discounts from count-of-counts);
* raw counts, A = M: the paper's predictor (S = raw counts, M = Q S Qᵀ, E = M (QS));
* PPMI, A = M;  PPMI + Norm: A = Norm(M);  PPMI + softmax: A = softmax(M / τ_att);
* positional: M' = (Q+P) S (Q+P)ᵀ with the corpus-derived P (P[r] = λ π_r, π_r the token
  distribution at absolute position r), A = Norm(M'), values (Q+P) S, S = PPMI;
* asymmetric: M_dir = Q W_Q W_Kᵀ Qᵀ with W_Q, W_K the rank-d_k SVD factors of the directional
  PPMI (X[i, j]: j follows i), A = softmax(M_dir / τ_att); values QS (PPMI), or the factored
  "what follows" rows Q W_Q W_Kᵀ;
* multi-head: h SVD heads of the PPMI (rank r each; own attention softmax(M⁽ⁱ⁾/τ_att) and own
  values Q S⁽ⁱ⁾, summed), and h NMF heads (A = Norm(M⁽ⁱ⁾), values Q S⁽ⁱ⁾, summed);
* two products of experts (beyond the issue's list): logits e_t / τ + log p_unigram for PPMI +
  Norm and for the factored asymmetric row. PPMI evidence estimates log p(w | context) - log p(w)
  and so carries no word frequency; adding log p(w) puts it back.

The projection rows run in torch on ``--device`` (batched, exact: checked against the
library's per-sequence numpy functions and its fused causal kernel, see "checks"); the
n-gram rows use the library's models, scored on the same device.

    python analyses/projection_vs_ngrams.py --device cuda --json table.json
    python analyses/projection_vs_ngrams.py --quick          # a small smoke test on the CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import numpy as np

QUICK = dict(stat_docs=1000, n_eval=16, n_val=6, max_len=40, vocab_size=1500, d_k=12, heads=2, head_rank=6,
             nmf_heads=2, nmf_rank=3, nmf_iter=20, batch_positions=2048)


# --------------------------------------------------------------------------- data

def select_documents(splits: np.ndarray, n_val: int, n_eval: int, stat_docs: int | None, seed: int):
    """Indices (statistics, validation, evaluation) from the per-document split names."""
    rng = np.random.default_rng(seed)
    train = np.flatnonzero(splits == "train")
    test = np.flatnonzero(splits == "test")
    pool = np.flatnonzero((splits == "train") | (splits == "unsup"))
    if n_val >= train.size or n_eval > test.size:
        raise ValueError(f"asked for {n_val} validation / {n_eval} test reviews; the corpus has "
                         f"{train.size} train / {test.size} test reviews (allowed: --n-val < {train.size}, "
                         f"--n-eval <= {test.size})")
    val = np.sort(rng.choice(train, size=n_val, replace=False))
    stat = np.setdiff1d(pool, val)
    if stat_docs is not None and stat_docs < stat.size:
        stat = np.sort(rng.choice(stat, size=stat_docs, replace=False))
    evaluation = np.sort(rng.choice(test, size=n_eval, replace=False))
    return stat, val, evaluation


def load_data(args, log):
    """Tokenize IMDB (the whole corpus through the cache, or only the sampled reviews when
    ``--stat-docs`` limits the statistics), then encode the three document sets."""
    from distattn.corpus import get_corpus, tokenize_corpus

    t0 = time.perf_counter()
    if args.stat_docs is None:
        tc = tokenize_corpus(get_corpus("imdb", data_dir=args.data_dir, progress=False))
        splits = np.asarray(tc.docs.split_names, dtype=object)[tc.docs.split_codes]
        stat, val, ev = select_documents(splits, args.n_val, args.n_eval, None, args.seed)
    else:  # read the archive, tokenize only the sample (the smoke test)
        from distattn.corpus import fetch_imdb, read_imdb_archive
        documents = read_imdb_archive(fetch_imdb(args.data_dir, download_missing=False))
        splits = np.array([d.split for d in documents], dtype=object)
        stat, val, ev = select_documents(splits, args.n_val, args.n_eval, args.stat_docs, args.seed)
        keep = np.concatenate([stat, val, ev])
        tc = tokenize_corpus([documents[i] for i in keep], cache=False)
        stat, val, ev = (np.arange(stat.size), stat.size + np.arange(val.size),
                         stat.size + val.size + np.arange(ev.size))
    vocab = tc.take(stat).vocabulary(max_size=args.vocab_size, specials=())
    enc = tc.encode(vocab, oov="negative").tokens
    data = dict(vocab=vocab, stat=enc.take(stat), val=enc.take(val).truncate(args.max_len),
                test=enc.take(ev).truncate(args.max_len))
    log(f"data: {len(stat):,} statistics reviews ({data['stat'].n_tokens:,} tokens, train+unsup minus validation), "
        f"{len(val)} validation reviews (train), {len(ev)} test reviews, first {args.max_len} tokens; "
        f"vocabulary {len(vocab):,} words  [{time.perf_counter() - t0:.1f}s]")
    return data


from distattn.atomic import atomic_path, jsonable  # noqa: E402
from distattn.cli import check_data_dir, non_negative_int, output_file, positive_int, run_script  # noqa: E402
from distattn.projection.device_scorers import Asymmetric, DeviceNgram, MultiHead, Positional, Symmetric  # noqa: E402


# --------------------------------------------------------------------------- checks against the library

def check_against_library(variant, reference, prefixes) -> float:
    """max |e_variant - e_library| / max |e_library| over the last row of each prefix."""
    import torch
    worst = 0.0
    for ids in prefixes:
        with torch.no_grad():
            ids_t = torch.as_tensor(ids[None].astype(np.int64), device=variant.device)
            pos_t = torch.arange(ids.size, device=variant.device)[None]
            mine = (variant.block_sums(ids_t, pos_t)[0, -1] / ids.size).double().cpu().numpy()
        ref = reference(ids)
        worst = max(worst, float(np.abs(mine - ref).max() / max(np.abs(ref).max(), 1e-300)))
    return worst


def max_logp_gap(a, b, docs, V) -> float:
    from distattn.projection import evaluate_next_token
    _, la, _ = evaluate_next_token(a, docs, vocab_size=V, return_scores=True, top_k=())
    _, lb, _ = evaluate_next_token(b, docs, vocab_size=V, return_scores=True, top_k=())
    ok = ~np.isnan(lb)
    if not np.array_equal(ok, ~np.isnan(la)):
        return float("inf")
    return float(np.abs(la[ok] - lb[ok]).max())


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="torch device for the projection rows (auto: cuda if available)")
    p.add_argument("--n-eval", type=positive_int, default=2000, help="test reviews evaluated (fixed-seed sample)")
    p.add_argument("--n-val", type=positive_int, default=200, help="validation reviews from train (fit τ)")
    p.add_argument("--max-len", type=positive_int, default=256, help="first tokens of each evaluated review")
    p.add_argument("--window", type=positive_int, default=10, help="co-occurrence window (harmonic weighting)")
    p.add_argument("--weighting", default="harmonic", choices=["harmonic", "none"])
    p.add_argument("--cds", type=float, default=0.75, help="PPMI context-distribution smoothing")
    p.add_argument("--vocab-size", type=positive_int, default=30_000, help="vocabulary (regular words, no specials)")
    p.add_argument("--stat-docs", type=positive_int, default=None,
                   help="limit the statistics to this many train+unsup reviews (default: all)")
    p.add_argument("--d-k", type=positive_int, default=128, help="rank of the directional factors W_Q, W_K")
    p.add_argument("--heads", type=positive_int, default=4, help="SVD heads")
    p.add_argument("--head-rank", type=positive_int, default=32, help="rank of each SVD head")
    p.add_argument("--nmf-heads", type=non_negative_int, default=4, help="NMF heads (0: no NMF row)")
    p.add_argument("--nmf-rank", type=positive_int, default=8, help="components per NMF head")
    p.add_argument("--nmf-iter", type=positive_int, default=40, help="NMF iterations (scikit-learn)")
    p.add_argument("--pos-scale", type=float, default=1.0, help="λ: P[r] = λ π_r")
    p.add_argument("--attention-temperature", type=float, default=1.0, help="τ_att of the softmax rows")
    p.add_argument("--batch-positions", type=positive_int, default=8192, help="positions per device batch")
    p.add_argument("--rows", default=None, help="comma-separated row keys to run (default: all); see --list-rows")
    p.add_argument("--list-rows", action="store_true", help="print the row keys and exit")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--data-dir", default=None, help="directory holding aclImdb_v1.tar.gz (else DISTATTN_DATA_DIR)")
    p.add_argument("--json", type=output_file, default=None, help="write the table and settings to this JSON file, rewritten (atomically) after each row "
                   "so that a cut run keeps the rows it finished; \"complete\": true once every row is done")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for a smoke test, on the CPU unless --device names another: "
                   + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    return p


ROWS = [
    ("unigram", "unigram (add-1)"),
    ("kn2", "KN bigram"),
    ("kn3", "KN trigram"),
    ("raw", "raw counts, A = M (paper)"),
    ("ppmi", "PPMI, A = M"),
    ("ppmi_norm", "PPMI + Norm"),
    ("ppmi_softmax", "PPMI + softmax"),
    ("positional", "positional (Q+P)S(Q+P)ᵀ + Norm"),
    ("asym", "asymmetric M_dir, values QS"),
    ("asym_fact", "asymmetric M_dir, values QW_QW_Kᵀ"),
    ("ppmi_norm_uni", "PPMI + Norm, × unigram (PoE)"),
    ("asym_fact_uni", "asym. values QW_QW_Kᵀ, × unigram (PoE)"),
    ("mh_svd", "multi-head SVD, softmax"),
    ("mh_nmf", "multi-head NMF, Norm"),
]


def save_json(path, out: dict) -> None:
    """Write ``out`` to ``path`` atomically: a failed write (e.g. a value JSON cannot hold) leaves the
    previous file, and no ``.tmp`` file beside it."""
    with atomic_path(path) as tmp:     # jsonable: NaN/inf as null (a bare NaN is not JSON), numpy values as numbers
        tmp.write_text(json.dumps(jsonable(out), indent=1, default=float))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    bad = [(o, v, allowed) for o, v, ok, allowed in (
        ("--max-len", args.max_len, args.max_len >= 2, "an integer >= 2"),
        ("--cds", args.cds, 0 < args.cds <= 1, "a real number in (0, 1]"),
        ("--pos-scale", args.pos_scale, 0 < args.pos_scale < float("inf"), "a finite real number > 0"),
        ("--attention-temperature", args.attention_temperature, 0 < args.attention_temperature < float("inf"),
         "a finite real number > 0")) if not ok]
    if bad:                          # refused before the data is read and before --json is written
        build_parser().error(f"argument {bad[0][0]}: got {bad[0][1]}; allowed: {bad[0][2]}")
    try:
        check_data_dir(args.data_dir)
    except ValueError as exc:
        build_parser().error(str(exc))
    if args.list_rows:
        for key, name in ROWS:
            print(f"{key:14s} {name}")
        return 0
    if args.quick:                   # the quick sizes, except those given (even when equal to the default)
        unset = object()
        given = build_parser().parse_args(argv, argparse.Namespace(**dict.fromkeys(QUICK, unset)))
        for k, v in QUICK.items():
            if getattr(given, k) is unset:
                setattr(args, k, v)
        if args.device == "auto":
            args.device = "cpu"
    wanted = [k for k, _ in ROWS] if args.rows is None else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(wanted) - {k for k, _ in ROWS}
    if unknown or not wanted:
        raise ValueError(f"--rows {args.rows!r}: " + (f"unknown rows {sorted(unknown)}" if unknown else "no row")
                         + f"; allowed: a comma-separated list of {', '.join(k for k, _ in ROWS)} (see --list-rows)")
    if args.nmf_heads == 0 and "mh_nmf" in wanted:
        if args.rows is not None:                  # asked for by name: running nothing would look like success
            raise ValueError("conflicting options: --rows names mh_nmf but --nmf-heads 0 means no NMF row")
        wanted.remove("mh_nmf")

    import torch

    from distattn.projection import (KneserNeyLM, ProjectionPredictor, UnigramLM, corpus_position_matrix,
                                     directional_context_matrix, directional_factors, evaluate_next_token,
                                     fit_temperature, multihead_evidence, nmf_heads, positional_context_matrix,
                                     positional_distributions, prediction_targets, resolve_device, row_normalize,
                                     softmax_rows, svd_heads, association_profiles, global_evidence,
                                     unigram_prior)
    from distattn.stats import cooccurrence, ppmi

    t_start = time.perf_counter()
    try:
        device = resolve_device(args.device)
    except RuntimeError:             # torch's own message lists every backend torch knows
        raise ValueError(f"--device {args.device!r} is not a device; allowed: auto, cpu, cuda, cuda:N, mps") from None
    if (device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count()) or (
            device.type == "mps" and not torch.backends.mps.is_available()):
        raise ValueError(f"--device {args.device!r} was requested but {device.type} is not available here")
    if args.quick and device.type == "cpu":
        torch.set_num_threads(1)     # tiny tensors: a thread pool only adds wake-up latency
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"config": vars(args).copy(), "rows": [], "checks": {}, "timings_s": {}, "complete": False}
    out["config"]["device"] = str(device)
    if device.type == "cuda":
        out["config"]["device_name"] = torch.cuda.get_device_name(device)

    def log(msg):
        print(msg, flush=True)

    def save():
        if args.json:
            save_json(args.json, out)

    log(f"device: {device}" + (f" ({out['config']['device_name']})" if device.type == "cuda" else "")
        + f"; torch {torch.__version__}")
    data = load_data(args, log)
    V = len(data["vocab"])
    stat, val, test = data["stat"], data["val"], data["test"]

    # ---------------------------------------------------------------- statistics
    t = time.perf_counter()
    S = cooccurrence(stat, V, window=args.window, weighting=args.weighting, symmetric=True)
    P = ppmi(S, cds=args.cds)
    nnz_row = np.diff(P.indptr)
    out["timings_s"]["cooccurrence+ppmi"] = time.perf_counter() - t
    log(f"S: {V:,}^2, {S.nnz:,} nonzeros (window {args.window}, {args.weighting}); PPMI (cds {args.cds}) "
        f"{P.nnz:,} nonzeros, mean {nnz_row.mean():.0f}/row  [{time.perf_counter() - t:.1f}s]")
    targets, scored = prediction_targets(test)
    n_oov = int((targets == -1).sum())
    out["data"] = {"vocab_size": V, "stat_docs": len(stat), "stat_tokens": stat.n_tokens, "val_docs": len(val),
                   "test_docs": len(test), "test_tokens": test.n_tokens, "positions_evaluated": int(scored.sum()),
                   "oov_targets_skipped": n_oov, "cooc_nnz": int(S.nnz), "ppmi_nnz": int(P.nnz)}
    log(f"evaluation: {int(scored.sum()):,} positions with an in-vocabulary target "
        f"({n_oov:,} OOV targets skipped, {test.n_tokens:,} tokens in {len(test)} test reviews)")
    save()

    kw = dict(vocab_size=V, device=device, batch_positions=args.batch_positions)
    val_prefixes = [ids[ids >= 0][:n] for ids, n in zip(list(val)[:2], (12, 40)) if (ids >= 0).sum() >= 2]

    def fit_and_eval(key, name, build):
        """Build a model, fit τ on validation when it has one, evaluate on test; one table row."""
        t0 = time.perf_counter()
        model, has_tau, note = build()
        t_build = time.perf_counter() - t0
        tau = 1.0
        t1 = time.perf_counter()
        if has_tau:
            with model.caching():
                scale = max(model.logit_scale(val), 1e-12)
                bounds = (scale * 1e-3, scale * 1e3)
                tau = fit_temperature(model, val, vocab_size=V, bounds=bounds, max_predictions=None)
                at_bound = tau < bounds[0] * 1.05 or tau > bounds[1] / 1.05
        t_fit = time.perf_counter() - t1
        t2 = time.perf_counter()
        with torch.no_grad():
            rep = evaluate_next_token(model, test, vocab_size=V, temperature=tau)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_eval = time.perf_counter() - t2
        row = {"key": key, "model": name, "temperature": tau if has_tau else None, "perplexity": rep.perplexity,
               "mean_nll": rep.mean_nll, "top1": rep.top1_accuracy, "top10": rep.top10_accuracy,
               "positions": rep.n_predictions, "oov_targets": rep.n_oov_targets,
               "build_s": t_build, "fit_tau_s": t_fit, "eval_s": t_eval, "wall_s": time.perf_counter() - t0,
               "note": note}
        if has_tau and at_bound:
            row["note"] = (note + "; " if note else "") + "τ at a search bound"
        out["rows"].append(row)
        save()
        tau_s = f"{tau:10.4g}" if has_tau else f"{'-':>10}"
        log(f"{name:40s} {tau_s} {rep.perplexity:10.2f} {rep.top1_accuracy:7.4f} {rep.top10_accuracy:7.4f} "
            f"{rep.n_predictions:9,d} {row['wall_s']:7.1f}  "
            f"(build {t_build:.1f}, τ fit {t_fit:.1f}, eval {t_eval:.1f})")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # ---------------------------------------------------------------- row builders
    def ngram(model_cls, **mkw):
        def build():
            m = model_cls(**mkw).fit(stat, V)
            dm = DeviceNgram(m, device)
            out["checks"][f"{model_cls.__name__}{mkw.get('order', '')} max|dlogp| device vs library"] = \
                max_logp_gap(dm, m, val.take(np.arange(min(2, len(val)))), V)
            return dm, False, "add-1" if model_cls is UnigramLM else \
                "discounts " + ", ".join(f"{d:.2f}" for d in m.discounts_)
        return build

    def symmetric(S_, normalization, label):
        def build():
            m = Symmetric(S_, normalization, attention_temperature=args.attention_temperature, **kw)
            ref = ProjectionPredictor(normalization=normalization, attention_temperature=args.attention_temperature
                                      ).fit(S_)
            out["checks"][f"{label}: rel. err. vs library e_global"] = check_against_library(
                m, ref.global_evidence, val_prefixes)
            if normalization == "none" and label == "PPMI":   # layout, OOV and shift vs the fused numba kernel
                out["checks"]["PPMI causal max|dlogp| vs library fused kernel"] = max_logp_gap(
                    m, ref, val.take(np.arange(min(3, len(val)))), V)
            return m, True, ""
        return build

    def positional():
        t0 = time.perf_counter()
        pi = positional_distributions(stat, V, args.max_len)
        m = Positional(P, pi, args.pos_scale, **kw)

        def ref(ids):
            Pm = corpus_position_matrix(pi, ids.size, scale=args.pos_scale)
            c = positional_context_matrix(ids, P, Pm)
            A = row_normalize(c.content_content + c.content_position + c.position_content + c.position_position)
            values = association_profiles(ids, P).toarray() + (Pm @ P).toarray()
            return A.sum(0) / ids.size @ values
        out["checks"]["positional: rel. err. vs library"] = check_against_library(m, ref, val_prefixes)
        return m, True, f"λ = {args.pos_scale:g}, π from {len(stat):,} reviews [{time.perf_counter() - t0:.1f}s]"

    factors = {}

    def directional():
        if "dir" not in factors:
            t0 = time.perf_counter()
            D = cooccurrence(stat, V, window=args.window, weighting=args.weighting, symmetric=False)
            X = ppmi(D, cds=args.cds)
            W_Q, W_K = directional_factors(X, args.d_k, algorithm="randomized")
            factors["dir"] = (W_Q, W_K, time.perf_counter() - t0, X.nnz)
        return factors["dir"]

    def asymmetric(values):
        def build():
            W_Q, W_K, t_svd, nnz = directional()
            m = Asymmetric(W_Q, W_K, S=P if values == "ppmi" else None,
                           attention_temperature=args.attention_temperature, **kw)

            def ref(ids):
                A = softmax_rows(directional_context_matrix(ids, W_Q, W_K), temperature=args.attention_temperature)
                if values == "ppmi":
                    return global_evidence(ids, P, weights=A)
                return A.sum(0) / ids.size @ (W_Q[ids] @ W_K.T)
            out["checks"][f"asymmetric ({values}): rel. err. vs library"] = check_against_library(m, ref, val_prefixes)
            return m, True, f"d_k = {args.d_k}, directional PPMI {nnz:,} nonzeros, factors {t_svd:.1f}s"
        return build

    def multihead(kind):
        def build():
            t0 = time.perf_counter()
            if kind == "svd":
                heads, norm = svd_heads(P, args.heads, args.head_rank, algorithm="randomized"), "softmax"
                note = f"{args.heads} heads x rank {args.head_rank}"
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")   # ConvergenceWarning at a fixed iteration budget
                    heads = nmf_heads(P, args.nmf_heads, args.nmf_rank, max_iter=args.nmf_iter)
                norm = "row"
                note = f"{args.nmf_heads} heads x rank {args.nmf_rank}, {args.nmf_iter} iterations"
            note += f" [{time.perf_counter() - t0:.1f}s]"
            m = MultiHead(heads, norm, attention_temperature=args.attention_temperature, **kw)
            out["checks"][f"multi-head {kind}: rel. err. vs library"] = check_against_library(
                m, lambda ids: multihead_evidence(ids, heads, normalization=norm,
                                                  attention_temperature=args.attention_temperature).mean(0),
                val_prefixes)
            return m, True, note
        return build

    def times_unigram(build):
        def wrapped():
            m, has_tau, note = build()
            prior = unigram_prior(stat, V)
            m.offset = torch.as_tensor(np.log(prior), dtype=torch.float32, device=device)
            return m, has_tau, ((note + "; ") if note else "") + "logits e_t/τ + log p_unigram(add-1)"
        return wrapped

    builders = {
        "unigram": ngram(UnigramLM), "kn2": ngram(KneserNeyLM, order=2), "kn3": ngram(KneserNeyLM, order=3),
        "raw": symmetric(S, "none", "raw counts"), "ppmi": symmetric(P, "none", "PPMI"),
        "ppmi_norm": symmetric(P, "row", "PPMI+Norm"), "ppmi_softmax": symmetric(P, "softmax", "PPMI+softmax"),
        "positional": positional, "asym": asymmetric("ppmi"), "asym_fact": asymmetric("factored"),
        "mh_svd": multihead("svd"), "mh_nmf": multihead("nmf"),
        "ppmi_norm_uni": times_unigram(symmetric(P, "row", "PPMI+Norm")),
        "asym_fact_uni": times_unigram(asymmetric("factored")),
    }
    log(f"\n{'model':40s} {'τ':>10} {'perplexity':>10} {'top-1':>7} {'top-10':>7} {'positions':>9} {'wall s':>7}")
    for key, name in ROWS:
        if key in wanted:
            fit_and_eval(key, name, builders[key])
    out["timings_s"]["total"] = time.perf_counter() - t_start
    out["complete"] = True
    save()

    log("\nτ: output temperature fitted on the validation reviews (bounded search on log τ); τ_att = "
        f"{args.attention_temperature:g} for the softmax rows.")
    log("OOV: positions with an OOV target are skipped (same positions for every row); OOV context tokens "
        "are skipped by the projection and break n-gram contexts.")
    for k, v in out["checks"].items():
        log(f"check  {k}: {v:.2e}")
    for r in out["rows"]:
        if r["note"]:
            log(f"note   {r['model']}: {r['note']}")
    finite = [r for r in out["rows"] if r["perplexity"] is not None and np.isfinite(r["perplexity"])]
    best = min(finite, key=lambda r: r["perplexity"]) if finite else None      # a NaN first row once "won"
    if best:
        log(f"lowest perplexity: {best['model']} ({best['perplexity']:.2f}); total {out['timings_s']['total']:.1f}s")
    return 0



if __name__ == "__main__":
    sys.exit(run_script(main))
