#!/usr/bin/env python
"""Benchmark windowed co-occurrence counting on IMDB (all 100,000 reviews by default).

Setting: vocabulary of the 30,000 most frequent words (plus ``<pad>``/``<unk>``), window 10,
harmonic (1/d) weighting, symmetric, ``oov="drop"`` -- GloVe's ``cooccur -symmetric 1
-window-size 10 -distance-weighting 1``.

Stages, each in a fresh Python subprocess, so that (d) its peak RSS (``getrusage`` in the child;
``os.wait4`` for GloVe's ``cooccur``) is its own:

(a) count      ``cooccurrence`` on the already-encoded corpus, best of ``--repeat`` (this stage
               also fills the tokenized cache, ``$DISTATTN_CACHE_DIR``, if it was empty)
(b) warm       tokenize_corpus (tokenized cache warm) -> vocabulary -> encode -> cooccurrence
(c) cold       the same with an empty temporary ``DISTATTN_CACHE_DIR`` (the archive is read and
               tokenized); numba's compile cache (``__pycache__``) may still be warm: printed,
               and ``--cold-numba`` points ``NUMBA_CACHE_DIR`` at an empty directory too
(e) reference  a plain scipy implementation (COO -> CSR per document chunk, all offsets, summed)
               side by side with ours: times and ``max |difference|``
(f) glove      GloVe's ``cooccur`` on our vocabulary and corpus written in GloVe format
               (``--glove-bin DIR``; default ``.scratch/glove/build`` when it exists): time, RSS,
               and the differences to ours

Figures are printed, never asserted. Example::

    DISTATTN_CACHE_DIR=/tmp/dacache python benchmarks/bench_cooccurrence.py --data-dir /work/shared/data
    python benchmarks/bench_cooccurrence.py --max-docs 5000 --repeat 1      # quick
"""

from __future__ import annotations

import argparse
import itertools
import math
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GLOVE = REPO / ".scratch" / "glove" / "build"
RESULT = "BENCH-RESULT "


# --- helpers (child and parent) ---------------------------------------------------------------

def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def numba_cache_stats() -> dict:
    """Compile-cache hits/misses of the counting kernels in this process (numba Dispatcher.stats)."""
    from distattn.stats import _kernels
    hits = misses = 0
    path = None
    for name in dir(_kernels):
        stats = getattr(getattr(_kernels, name), "stats", None)
        if stats is None:
            continue
        hits += sum(stats.cache_hits.values())
        misses += sum(stats.cache_misses.values())
        path = stats.cache_path
    return {"hits": hits, "misses": misses, "path": path}


def diff_stats(X, Y) -> dict:
    """max |X - Y|, max |X - Y| / |Y| (inf where Y == 0 != X), stored non-zeros, sparsity patterns."""
    X = sp.csr_array(X, copy=True)
    Y = sp.csr_array(Y, copy=True)
    for A in (X, Y):
        A.eliminate_zeros()
        A.sum_duplicates()
    same = (X.nnz == Y.nnz and np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices))
    out = {"nnz_x": int(X.nnz), "nnz_y": int(Y.nnz), "pattern_equal": bool(same), "max_abs": 0.0, "max_rel": 0.0}
    if same:  # aligned data arrays
        ad = np.abs(X.data - Y.data)
        rel = ad / np.abs(Y.data)
        rows = np.repeat(np.arange(Y.shape[0]), np.diff(Y.indptr))
        cols, xv, yv = Y.indices, X.data, Y.data
    else:
        D = (X - Y).tocoo()
        D.eliminate_zeros()
        ad = np.abs(D.data)
        rows, cols = D.row, D.col
        xv = np.asarray(X[rows, cols]).ravel()
        yv = np.asarray(Y[rows, cols]).ravel()
        rel = np.divide(ad, np.abs(yv), out=np.full(len(ad), np.inf), where=yv != 0)
    out["n_diff"] = int(np.count_nonzero(ad))
    if out["n_diff"]:
        k = int(np.argmax(rel))
        out.update(max_abs=float(ad.max()), max_rel=float(rel[k]),
                   worst=[int(rows[k]), int(cols[k]), float(xv[k]), float(yv[k])])
    return out


def reference_cooccurrence(ids, offsets, vocab_size, window, harmonic=True, symmetric=True, chunk_tokens=1 << 21):
    """Plain scipy reference: drop OOV (< 0), then per chunk of whole documents stack the pairs
    (ids[p], ids[p + d]) within a document for d = 1..window as one COO with weights 1/d (or 1),
    convert to CSR (which sums duplicates) and add up; symmetric = D + D.T."""
    lengths = np.diff(offsets)
    doc = np.repeat(np.arange(len(lengths)), lengths)
    keep = ids >= 0
    ids, doc = ids[keep].astype(np.int64), doc[keep]
    new_offsets = np.concatenate(([0], np.cumsum(np.bincount(doc, minlength=len(lengths)))))
    total = sp.csr_array((vocab_size, vocab_size), dtype=np.float64)
    bounds = np.unique(np.concatenate((
        [0], new_offsets[np.searchsorted(new_offsets, np.arange(chunk_tokens, len(ids), chunk_tokens))], [len(ids)])))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a, dd = ids[lo:hi], doc[lo:hi]
        rows, cols, vals = [], [], []
        for d in range(1, window + 1):
            same = dd[:-d] == dd[d:]
            rows.append(a[:-d][same])
            cols.append(a[d:][same])
            vals.append(np.full(int(same.sum()), 1.0 / d if harmonic else 1.0))
        part = sp.coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                            shape=(vocab_size, vocab_size)).tocsr()
        total = total + part
    if symmetric:
        total = sp.csr_array(total + total.T)
    total.sum_duplicates()
    return total


def load_encoded(cfg, *, cold=False):
    """tokenize -> vocabulary -> encode, timed. Returns (encoded corpus, timings dict)."""
    from distattn.corpus import get_corpus, tokenize_corpus
    t = {}
    t0 = time.perf_counter()
    corpus = get_corpus("imdb", data_dir=cfg["data_dir"], progress=False)
    if cfg["max_docs"] and cold:
        tc = tokenize_corpus(itertools.islice(iter(corpus), cfg["max_docs"]))  # no fingerprint: no cache write
    else:
        tc = tokenize_corpus(corpus)
        if cfg["max_docs"]:
            tc = tc.take(np.arange(min(cfg["max_docs"], len(tc))))
    t1 = time.perf_counter()
    vocab = tc.vocabulary(max_size=cfg["vocab_size"])
    t2 = time.perf_counter()
    enc = tc.encode(vocab, oov="negative")
    t3 = time.perf_counter()
    t.update(tokenize=t1 - t0, vocabulary=t2 - t1, encode=t3 - t2)
    return enc, t


def count(enc, cfg):
    from distattn.stats import cooccurrence
    return cooccurrence(enc, window=cfg["window"], weighting="harmonic", symmetric=True, oov="drop",
                        n_jobs=cfg["n_jobs"])


def corpus_info(enc) -> dict:
    return {"n_docs": len(enc), "n_tokens": int(enc.tokens.n_tokens), "n_oov": int((enc.tokens.ids < 0).sum()),
            "vocab_size": len(enc.vocab)}


# --- child stages -------------------------------------------------------------------------------

def child(stage: str, cfg: dict) -> dict:
    t_start = time.perf_counter()
    res: dict = {"stage": stage}
    if stage == "count":
        enc, _ = load_encoded(cfg)
        res["corpus"] = corpus_info(enc)
        res["rss_before_mb"] = maxrss_mb()
        times = []
        for _ in range(cfg["repeat"]):
            t0 = time.perf_counter()
            M = count(enc, cfg)
            times.append(time.perf_counter() - t0)
            del M
        res.update(times=times, best=min(times))
    elif stage in ("warm", "cold"):
        t0 = time.perf_counter()
        enc, t = load_encoded(cfg, cold=stage == "cold")
        t1 = time.perf_counter()
        M = count(enc, cfg)
        t2 = time.perf_counter()
        res.update(pipeline=t2 - t0, count=t2 - t1, nnz=int(M.nnz), corpus=corpus_info(enc), **t)
    elif stage == "reference":
        enc, _ = load_encoded(cfg)
        ids, offsets = np.asarray(enc.tokens.ids), enc.tokens.offsets
        res["rss_before_mb"] = maxrss_mb()
        t0 = time.perf_counter()
        R = reference_cooccurrence(ids, offsets, len(enc.vocab), cfg["window"])
        res["reference"] = time.perf_counter() - t0
        res["rss_reference_mb"] = maxrss_mb()
        t0 = time.perf_counter()
        M = count(enc, cfg)
        res["ours"] = time.perf_counter() - t0
        res["diff"] = diff_stats(M, R)
    elif stage == "glove":
        from distattn.stats.glove import read_glove_cooccurrence, write_glove_corpus, write_glove_vocab
        enc, _ = load_encoded(cfg)
        t0 = time.perf_counter()
        M = count(enc, cfg)
        res["ours"] = time.perf_counter() - t0
        work = Path(cfg["workdir"])
        t0 = time.perf_counter()
        write_glove_vocab(enc.vocab, work / "vocab.txt")
        info = write_glove_corpus(enc, None, work / "corpus.txt")
        res["write"] = time.perf_counter() - t0
        res["corpus_bytes"] = (work / "corpus.txt").stat().st_size
        res["written"] = info
        cmd = [str(Path(cfg["glove_bin"]) / "cooccur"), "-verbose", "0", "-symmetric", "1",
               "-window-size", str(cfg["window"]), "-distance-weighting", "1", "-memory", str(cfg["glove_memory"]),
               "-vocab-file", str(work / "vocab.txt"), "-overflow-file", str(work / "overflow")]
        res["cmd"] = " ".join(cmd[:1] + [c for c in cmd[1:]]) + " < corpus.txt > cooccurrence.bin"
        with open(work / "corpus.txt", "rb") as fin, open(work / "cooccurrence.bin", "wb") as fout:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=subprocess.PIPE)
            err = proc.stderr.read()
            _, status, ru = os.wait4(proc.pid, 0)
            res["glove"] = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        res["glove_rc"] = proc.returncode
        res["glove_rss_mb"] = ru.ru_maxrss / 1024.0
        res["glove_stderr_tail"] = err.decode(errors="replace").strip().splitlines()[-3:]
        if proc.returncode == 0:
            res["out_bytes"] = (work / "cooccurrence.bin").stat().st_size
            t0 = time.perf_counter()
            X = read_glove_cooccurrence(work / "cooccurrence.bin", len(enc.vocab), enc.vocab.n_specials)
            res["read"] = time.perf_counter() - t0
            res["diff"] = diff_stats(X, M)
            first = np.fromfile(work / "cooccurrence.bin", dtype=[("w1", "<i4"), ("w2", "<i4"), ("v", "<f8")],
                                count=1)
            if len(first):
                i, j = int(first["w1"][0]) + 1, int(first["w2"][0]) + 1
                res["first_record"] = [i, j, float(X[i, j]), float(M[i, j])]
    else:
        raise SystemExit(f"unknown stage {stage}")
    res["numba_cache"] = numba_cache_stats()
    res["child_wall"] = time.perf_counter() - t_start
    res["rss_mb"] = maxrss_mb()
    return res


# --- parent -------------------------------------------------------------------------------------

def run_child(stage: str, cfg: dict, env: dict | None = None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", stage, "--child-config", json.dumps(cfg)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(REPO))
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    # the child's own peak RSS is in its result (getrusage(RUSAGE_SELF)); the process wall time here
    # includes interpreter start-up and imports
    lines = [ln for ln in out.decode().splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        sys.stdout.write(f"  !! stage {stage} failed (rc={proc.returncode}):\n{err.decode()[-3000:]}\n")
        return {"stage": stage, "failed": True, "process_wall": wall}
    res = json.loads(lines[-1][len(RESULT):])
    res["process_wall"] = wall
    return res


def fmt_rel(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def main(argv=None) -> None:
    head, rest = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("DISTATTN_DATA_DIR", "/work/shared/data"),
                   help="directory holding aclImdb_v1.tar.gz (default: $DISTATTN_DATA_DIR or /work/shared/data)")
    p.add_argument("--max-docs", type=int, default=None, help="use only the first N reviews (quick run)")
    p.add_argument("--vocab-size", type=int, default=30_000, help="regular words kept (default 30000)")
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3, help="N for 'best of N' of the counting stage (default 3)")
    p.add_argument("--n-jobs", type=int, default=None, help="threads for cooccurrence (default: all CPUs)")
    p.add_argument("--glove-bin", default=None,
                   help=f"directory with GloVe's cooccur (default: {DEFAULT_GLOVE.relative_to(REPO)} if it exists)")
    p.add_argument("--no-glove", action="store_true", help="skip the GloVe comparison")
    p.add_argument("--glove-memory", type=float, default=4.0, help="cooccur -memory in GB (default 4.0)")
    p.add_argument("--skip-cold", action="store_true", help="skip the cold-cache pipeline")
    p.add_argument("--skip-reference", action="store_true", help="skip the scipy reference implementation")
    p.add_argument("--cold-numba", action="store_true",
                   help="cold stage also with an empty NUMBA_CACHE_DIR (kernels compiled from scratch)")
    p.add_argument("--workdir", default=None, help="where GloVe's files go (default: a temporary directory)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        res = child(args.child, json.loads(args.child_config))
        sys.stdout.write(RESULT + json.dumps(res) + "\n")
        return

    glove_bin = None
    if not args.no_glove:
        glove_bin = Path(args.glove_bin) if args.glove_bin else (DEFAULT_GLOVE if DEFAULT_GLOVE.is_dir() else None)
        if glove_bin is not None and not (glove_bin / "cooccur").exists():
            print(f"note: {glove_bin}/cooccur not found; skipping GloVe")
            glove_bin = None
    cfg = {"data_dir": args.data_dir, "max_docs": args.max_docs, "vocab_size": args.vocab_size,
           "window": args.window, "repeat": args.repeat, "n_jobs": args.n_jobs,
           "glove_bin": str(glove_bin) if glove_bin else None, "glove_memory": args.glove_memory}

    import numba
    import scipy
    from distattn.paths import cache_dir
    print("bench_cooccurrence: IMDB, vocab %d regular words, window %d, harmonic, symmetric, oov=drop"
          % (args.vocab_size, args.window))
    print(f"host: {platform.node()}  cpus: {os.cpu_count()}  load average (1/5/15 min): "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"python {platform.python_version()}  numpy {np.__version__}  scipy {scipy.__version__}  "
          f"numba {numba.__version__}  n_jobs={args.n_jobs or os.cpu_count()}")
    print(f"tokenized cache (warm stages): {cache_dir()}")
    rows = []  # (stage, wall, rss, note)

    print("\n(a) counting alone (already-encoded corpus)")
    a = run_child("count", cfg)
    if not a.get("failed"):
        c = a["corpus"]
        print(f"  corpus: {c['n_docs']:,} docs, {c['n_tokens']:,} tokens ({c['n_oov']:,} OOV), "
              f"vocab_size {c['vocab_size']:,} (with specials)")
        print(f"  cooccurrence: best of {len(a['times'])}: {a['best']:.2f} s  (all: "
              + ", ".join(f"{t:.2f}" for t in a["times"]) + ")")
        print(f"  peak RSS: {a['rss_mb']:.0f} MB process ({a['rss_before_mb']:.0f} MB before counting)")
        rows.append(("(a) count, best of %d" % len(a["times"]), a["best"], a["rss_mb"], "encoded corpus in memory"))

    print("\n(b) pipeline, tokenized cache warm (tokenize_corpus from cache -> vocabulary -> encode -> count)")
    b = run_child("warm", cfg)
    if not b.get("failed"):
        print(f"  pipeline {b['pipeline']:.2f} s = tokenize(load cache) {b['tokenize']:.2f} + vocabulary "
              f"{b['vocabulary']:.2f} + encode {b['encode']:.2f} + count {b['count']:.2f}; "
              f"process incl. start-up/imports {b['process_wall']:.2f} s")
        print(f"  peak RSS: {b['rss_mb']:.0f} MB; nnz {b['nnz']:,}")
        rows.append(("(b) pipeline, cache warm", b["pipeline"], b["rss_mb"], f"process {b['process_wall']:.1f} s"))

    if not args.skip_cold:
        print("\n(c) pipeline cold (fresh process, empty temporary DISTATTN_CACHE_DIR: archive read + tokenized)")
        with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp:
            env = dict(os.environ, DISTATTN_CACHE_DIR=str(Path(tmp) / "cache"))
            if args.cold_numba:
                env["NUMBA_CACHE_DIR"] = str(Path(tmp) / "numba")
            c = run_child("cold", cfg, env)
        if not c.get("failed"):
            nc = c["numba_cache"]
            warm_numba = nc["hits"] > 0 and nc["misses"] == 0
            print(f"  pipeline {c['pipeline']:.2f} s = read+tokenize {c['tokenize']:.2f} + vocabulary "
                  f"{c['vocabulary']:.2f} + encode {c['encode']:.2f} + count {c['count']:.2f}; "
                  f"process {c['process_wall']:.2f} s")
            if args.max_docs:
                print(f"  (--max-docs: only the first {args.max_docs} reviews were tokenized; no cache write)")
            print(f"  numba compile cache: {'WARM' if warm_numba else 'COLD'} "
                  f"({nc['hits']} hits, {nc['misses']} misses, {nc['path']})")
            print(f"  peak RSS: {c['rss_mb']:.0f} MB")
            rows.append(("(c) pipeline, cold", c["pipeline"], c["rss_mb"],
                         f"numba cache {'warm' if warm_numba else 'cold'}"))

    if not args.skip_reference:
        print("\n(e) reference implementation (scipy COO->CSR per document chunk, offsets stacked, summed)")
        r = run_child("reference", cfg)
        if not r.get("failed"):
            d = r["diff"]
            print(f"  reference {r['reference']:.2f} s (peak RSS {r['rss_reference_mb']:.0f} MB, "
                  f"{r['rss_before_mb']:.0f} MB before);  ours {r['ours']:.2f} s in the same process")
            print(f"  max |ours - reference| = {d['max_abs']:.3g}, max relative {fmt_rel(d['max_rel'])}, "
                  f"nnz {d['nnz_x']:,} vs {d['nnz_y']:,}, same pattern: {d['pattern_equal']}")
            rows.append(("(e) reference (scipy)", r["reference"], r["rss_reference_mb"],
                         f"max|diff| {d['max_abs']:.2g}"))

    if glove_bin is not None:
        print(f"\n(f) GloVe cooccur ({glove_bin})")
        with tempfile.TemporaryDirectory(prefix="bench-glove-", dir=args.workdir) as tmp:
            g = run_child("glove", dict(cfg, workdir=tmp))
        if not g.get("failed"):
            print(f"  {g['cmd']}")
            print(f"  write vocab.txt + corpus.txt: {g['write']:.2f} s ({g['corpus_bytes'] / 2**20:.0f} MiB, "
                  f"{g['written']['n_tokens']:,} words, {g['written']['n_oov']:,} OOV dropped)")
            if g["glove_rc"]:
                print(f"  cooccur FAILED rc={g['glove_rc']}: {g['glove_stderr_tail']}")
            else:
                d = g["diff"]
                print(f"  cooccur: {g['glove']:.2f} s, peak RSS {g['glove_rss_mb']:.0f} MB, output "
                      f"{g['out_bytes'] / 2**20:.0f} MiB; read_glove_cooccurrence {g['read']:.2f} s; "
                      f"ours {g['ours']:.2f} s")
                print(f"  GloVe vs ours: max |diff| {d['max_abs']:.3g}, max relative {fmt_rel(d['max_rel'])}, "
                      f"{d['n_diff']:,} entries differ; nnz {d['nnz_x']:,} vs {d['nnz_y']:,} "
                      f"({'match' if d['nnz_x'] == d['nnz_y'] else 'DIFFER'}), same pattern: {d['pattern_equal']}")
                if "worst" in d:
                    print(f"  largest relative difference at ids {d['worst'][:2]}: GloVe {d['worst'][2]!r} "
                          f"vs ours {d['worst'][3]!r}")
                fr = g.get("first_record")
                if fr:
                    doubled = fr[3] != 0 and abs(fr[2] - 2 * fr[3]) <= 1e-9 * abs(fr[3])
                    print(f"  first output record ids ({fr[0]}, {fr[1]}): GloVe {fr[2]!r} vs ours {fr[3]!r}"
                          + ("  <- doubled (cooccur merge_files artefact)" if doubled else ""))
                rows.append(("(f) GloVe cooccur", g["glove"], g["glove_rss_mb"],
                             f"max rel diff {fmt_rel(d['max_rel'])}"))
                rows.append(("    + write GloVe files", g["write"], float("nan"), "python"))

    print("\nsummary")
    print(f"  {'stage':28s} {'wall s':>8s} {'peak RSS MB':>12s}  note")
    for name, wall, rss, note in rows:
        rss_s = "-" if math.isnan(rss) else f"{rss:.0f}"
        print(f"  {name:28s} {wall:8.2f} {rss_s:>12s}  {note}")
    print("  load average now: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
