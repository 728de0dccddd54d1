import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distattn.atomic import read_sealed_json, seal, write_json
from distattn.compare.__main__ import main


def synthetic_jsonl(path, n_docs=90, seed=0):
    """Two 'sentiment' topics with shared function words, so there is co-occurrence structure."""
    rng = np.random.default_rng(seed)
    common = "the a of and to is was it this film movie".split()
    pos = "great wonderful loved superb fun brilliant charming".split()
    neg = "awful boring hated dull terrible waste poor".split()
    with open(path, "w") as fh:
        for i in range(n_docs):
            label = i % 2
            topic = pos if label else neg
            words = [rng.choice(topic) if rng.random() < 0.35 else rng.choice(common) for _ in range(rng.integers(20, 50))]
            fh.write(json.dumps({"text": " ".join(words), "label": int(label)}) + "\n")
    return path


def _cold_quick_run(factory, name, extra):
    """One cold quick-profile run on a 40-document corpus, in a cache of its own. The tests that damage
    a cache entry share it: each damages a copy of this cache (``_copy_of_cold_cache``), so each still
    starts from a finished cold run, and the cold run (most of such a test's time) is paid once."""
    base = factory.mktemp(name)
    corpus = synthetic_jsonl(base / "c.jsonl", n_docs=40)
    args = ["--corpus", "text", "--path", str(corpus), "--profile", "quick", "-q", "--device", "cpu", *extra]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISTATTN_CACHE_DIR", str(base / "cache"))
        assert main(args + ["--out", str(base / "a")]) == 0
    return args, base


@pytest.fixture(scope="module")
def cold_quick_run(tmp_path_factory):
    """The shared cold run with every model trained."""
    return _cold_quick_run(tmp_path_factory, "cold-quick", [])


@pytest.fixture(scope="module")
def cold_quick_run_no_models(tmp_path_factory):
    """The shared cold run with ``--no-models``."""
    return _cold_quick_run(tmp_path_factory, "cold-quick-no-models", ["--no-models"])


def _copy_of_cold_cache(cold, tmp_path, monkeypatch):
    """A copy of the shared cold run's cache as this test's cache; returns the run's CLI arguments and
    its metrics.json (the run "a" every later run is compared with)."""
    import shutil
    args, base = cold
    shutil.copytree(base / "cache", tmp_path / "cache")
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    (run,) = (base / "a").iterdir()
    return args, json.loads((run / "metrics.json").read_text())


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_paper_run(tmp_path, capsys):
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path), "-q"], capsys)
    assert code == 0, err
    assert "river bank flooded -> shore" in out and "bank loan -> money" in out
    run_dir = next(tmp_path.iterdir())
    html = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
    metrics = json.loads((run_dir / "metrics.json").read_text())
    paper = metrics["paper"]
    assert paper["river_bank_flooded"]["prediction"] == "shore" and paper["bank_loan"]["prediction"] == "money"
    assert paper["river_bank_flooded"]["e_global"] == [22.67, 20.0, 14.0, 11.67, 22.0, 40.33, 9.33]   # the paper's
    assert paper["bank_loan"]["norm_M"] == [[0.0, 1.0], [1.0, 0.0]]


def test_options_the_paper_corpus_ignores_are_named(tmp_path, capsys, caplog):
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path), "-q", "--max-docs", "50", "--seed", "3",
                              "--no-models"], capsys)
    assert code == 0, err
    assert "--max-docs, --no-models, --seed ignored: --corpus paper" in caplog.text + err
    caplog.clear()
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path), "-q"], capsys)
    assert code == 0 and "ignored" not in caplog.text + err


def test_text_corpus_run_then_warm_rerun(tmp_path, capsys, monkeypatch):
    from distattn.analysis import figures
    corpus = synthetic_jsonl(tmp_path / "c.jsonl")
    args = ["--corpus", "text", "--path", str(corpus), "--profile", "quick", "--out", str(tmp_path / "runs"), "-q",
            "--device", "cpu"]
    titles, plot_cka = [], figures.plot_cka_matrix
    monkeypatch.setattr(figures, "plot_cka_matrix", lambda *a, **k: (titles.append(k.get("title")), plot_cka(*a, **k))[1])
    # the session's cache may already hold other tests' models (another corpus): only this run's count below
    cache = Path(os.environ["DISTATTN_CACHE_DIR"])
    snapshot = lambda: {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    earlier = set(snapshot())
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert titles == ["CKA between attention kernels (one held-out document)"]      # it said "test review"
    assert "epoch" not in out and "epoch" not in err        # -q: no training lines (once one per epoch and model)
    first = next((tmp_path / "runs").iterdir())
    for name in ("config.json", "metrics.json", "report.html"):
        assert (first / name).exists()
    assert {p.name for p in (first / "checkpoints").iterdir()} == {"classifier.pt", "classifier_best.pt",
                                                                   "attention_only_lm.pt", "transformer_lm.pt"}
    assert list((first / "graphs").glob("*.graphml")) and len(list((first / "figures").glob("*.png"))) >= 8
    metrics = json.loads((first / "metrics.json").read_text())
    keys = [r["key"] for r in metrics["next_token"]]
    assert keys[:3] == ["unigram", "kn2", "kn3"] and "transformer_lm" in keys
    positions = {r["positions"] for r in metrics["next_token"]}
    assert len(positions) == 1                      # every row scored on the same test positions
    assert 0.0 <= metrics["classifier"]["test_accuracy"] <= 1.0
    assert metrics["classifier"]["epochs"] == 5               # quick profile: the seed's 5 epochs, a smaller model
    assert metrics["classifier"]["config"].endswith("; 5 epochs") and "d_model 64" in metrics["classifier"]["config"]
    best = metrics["classifier_best"]
    assert 0.0 <= best["test_accuracy"] <= 1.0 and 0.0 <= best["val_accuracy"] <= 1.0
    assert best["epochs"] == 2 and 1 <= best["best_epoch"] <= 2 and best["val_docs"] >= 2   # quick: best in 2 epochs
    assert f"epoch {best['best_epoch']} of 2 picked" in best["config"]
    assert "PPMI-SVD" in (first / "report.html").read_text()
    config = json.loads((first / "config.json").read_text())
    assert config["seed"] == 0 and config["profile"] == "quick" and "torch" in config["versions"]
    trained = config["stage_keys"]["models"]        # the entry each checkpoint came from
    assert set(trained) == {"classifier", "classifier_best", "attention_only_lm", "transformer_lm"}
    assert all((cache / "compare" / f"train-{name}-{key}" / "model.pt").is_file() for name, key in trained.items())
    # second run: every stage from the cache, so the cache directory is left exactly as it was
    before = snapshot()
    assert any(p.name == "model.pt" for p in before) and any("train-classifier_best" in str(p) for p in before)
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    second = max((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert second != first
    assert snapshot() == before                      # nothing recomputed, nothing rewritten
    m2 = json.loads((second / "metrics.json").read_text())
    assert m2["next_token"] == metrics["next_token"]
    # the LMs train the profile's steps on a small corpus too (once 2 steps, inside the warm-up)
    for lm in ("attention_only_lm", "transformer_lm"):
        done = next(cache.rglob(f"train-{lm}-*/done.json"))
        assert json.loads(done.read_text())["summary"]["steps"] == config["sizes"]["lm_steps"] == 120
    # --no-cache recomputes: every model is trained again, not resumed from its finished checkpoint
    # (nor loaded); the finished entries are not replaced (stages._train)
    models = {p: t for p, t in before.items() if p.name == "model.pt" and p not in earlier}
    assert len(models) == 4                          # the run's four models: two classifiers, two LMs
    from distattn.train import Trainer
    fits, fit = [], Trainer.fit
    monkeypatch.setattr(Trainer, "fit", lambda self: (fits.append(self.out_dir), fit(self))[1])
    code, out, err = run_cli(args + ["--no-cache"], capsys)
    assert code == 0, err
    assert len(fits) == 4 and not {p.parent for p in models} & set(fits), "a model was loaded instead of retrained"
    after = snapshot()
    assert all(after[p] == t for p, t in models.items())


@pytest.mark.parametrize("args, message", [
    (["--corpus", "imbd"], "unknown corpus 'imbd'; valid names: imdb, paper, text"),
    (["--corpus", "text", "--path", "/no/such/corpus.txt"], "does not exist"),
    (["--corpus", "text"], "--corpus text needs --path"),
    (["--corpus", "paper", "--path", "x.txt"], "conflicting options: --path is only used with --corpus text"),
    (["--corpus", "paper", "--data-dir", "/tmp"], "conflicting options: --data-dir"),
    (["--corpus", "imdb", "--profile", "full", "--device", "cpu"], "conflicting options: --profile full"),
    (["--corpus", "paper", "--seed", "-1"], "--seed must be an integer from 0 to 4294967295, got -1"),
    (["--corpus", "paper", "--seed", str(2**32)], f"got {2**32}"),
    (["--corpus", "paper", "--max-docs", "3"], "--max-docs must be at least 20 (or omitted), got 3"),
    (["--corpus", "imdb", "--data-dir", "/no/such/dir"], "--data-dir '/no/such/dir' does not exist"),
])
def test_bad_input(tmp_path, capsys, args, message):
    code, out, err = run_cli(args + ["--out", str(tmp_path), "-q"], capsys)
    assert code == 2 and message in err
    assert not any(tmp_path.iterdir())             # nothing written for a refused command


def test_a_refused_device_and_an_interrupted_run_leave_no_run_directory(tmp_path, capsys, monkeypatch):
    import torch

    import distattn.compare.run as run_mod
    if not torch.cuda.is_available():
        code, out, err = run_cli(["--corpus", "paper", "--device", "cuda", "--out", str(tmp_path), "-q"], capsys)
        assert code == 2 and "CUDA is not available" in err
        assert not any(tmp_path.iterdir())

    def interrupted(run_dir):
        (run_dir / "figures" / "half.png").write_bytes(b"x")    # something was written before the interrupt
        raise KeyboardInterrupt
    monkeypatch.setattr(run_mod, "paper_reproduction", interrupted)
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path), "-q"], capsys)
    assert code == 130 and "resumes from its last checkpoint" in err
    assert not any(tmp_path.iterdir())                          # no half-filled run directory
    monkeypatch.undo()
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path), "-q"], capsys)
    assert code == 0 and len(list(tmp_path.iterdir())) == 1     # a finished run keeps its directory


def test_full_profile_on_cpu_is_allowed_without_models():
    from distattn.compare.config import CompareConfig
    cfg = CompareConfig(corpus="imdb", profile="full", device="cpu", train_models=False).validate()
    assert cfg.resolved_profile() == "full"
    with pytest.raises(ValueError, match="or add --no-models"):
        CompareConfig(corpus="imdb", profile="full", device="cpu").validate()


def test_unwritable_output_dir(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code, out, err = run_cli(["--corpus", "paper", "--out", str(blocker / "runs"), "-q"], capsys)
    assert code == 2 and "cannot write the run directory" in err


def test_interrupted_training_resumes_to_the_same_model(tmp_path, monkeypatch):
    """A training stage stopped mid-way (Ctrl-C) resumes from its checkpoint on the next run and
    ends with the same weights as an uninterrupted run."""
    import torch

    from distattn.compare import stages
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import LMData, LMTask, seed_everything
    from distattn.train.recipes import lm_train_config

    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 50, size=40) for _ in range(60)]
    from distattn.corpus import RaggedIds
    data = LMData(RaggedIds.from_sequences(docs), seq_len=16)
    cfg = LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=16)

    def train(cache_dir, interrupt_at=None):
        monkeypatch.setenv("DISTATTN_CACHE_DIR", str(cache_dir))
        seed_everything(0)
        tcfg = lm_train_config(epochs=1, batch_size=8, device="cpu", progress=False, checkpoint_every=2, warmup_steps=2)
        model = TransformerLM(cfg)
        if interrupt_at is not None:
            from distattn.train import Trainer
            orig = Trainer.__init__

            def init(self, *a, **kw):
                orig(self, *a, **kw)

                def stop(trainer, step, loss):
                    if step == interrupt_at:
                        raise KeyboardInterrupt
                self.callbacks.append(stop)
            monkeypatch.setattr(Trainer, "__init__", init)
        try:
            return stages._train("lm", model, LMTask(data, {}), tcfg, {"test": 1}, cache=True)
        finally:
            monkeypatch.undo()

    whole = train(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "b", interrupt_at=5)
    stage = next((tmp_path / "b" / "compare").iterdir())
    assert (stage / "checkpoint.pt").exists() and not (stage / "done.json").exists()
    resumed = train(tmp_path / "b")
    for (k, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), k


def test_module_help():
    res = subprocess.run([sys.executable, "-m", "distattn.compare", "--help"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ))
    assert res.returncode == 0 and "--profile" in res.stdout and "--corpus" in res.stdout


def test_lm_targets_are_never_unk(tmp_path):
    """The LMs are compared with projections that never predict <unk>: OOV tokens are inputs
    (as <unk>) but never training targets."""
    import dataclasses

    from distattn.compare.config import CompareConfig
    from distattn.compare.stages import load_data
    from distattn.train import LMData
    corpus = synthetic_jsonl(tmp_path / "c.jsonl")
    cfg = CompareConfig(corpus="text", path=str(corpus), profile="quick")
    sizes = dataclasses.replace(cfg.sizes(), vocab_size=8)          # a tiny vocabulary: many OOV tokens
    data = load_data(cfg, sizes, progress=False)
    lm = LMData(data.lm_neg, seq_len=16, oov_id=data.vocab.unk_id)
    batch = lm.batch(np.arange(len(lm)))
    assert (batch["targets"] == data.vocab.unk_id).sum() == 0 and (batch["targets"] == -1).sum() > 0
    assert (batch["ids"] == data.vocab.unk_id).sum() > 0


def test_text_documents_without_tokens_are_left_out_of_every_set(tmp_path):
    """A .txt of blank-line-separated paragraphs: the blank lines (documents without tokens) were
    drawn into the splits, so 8 of the 12 evaluation documents and 2 of the 6 validation ones were
    empty. Now the splits draw the same paragraphs as from the file without its blank lines."""
    import dataclasses

    from distattn.compare.config import CompareConfig
    from distattn.compare.stages import load_data
    rng = np.random.default_rng(0)
    words = "the a of and to is was it this film movie great awful boring fun".split()
    paragraphs = [" ".join(rng.choice(words, 20)) for _ in range(60)]
    (tmp_path / "compact.txt").write_text("".join(p + "\n" for p in paragraphs))
    (tmp_path / "paragraphs.txt").write_text("".join(p + "\n\n" for p in paragraphs))
    # labelled empty texts trained and tested the classifier on no tokens
    _jsonl(tmp_path / "labelled.jsonl", [{"text": p, "label": i % 2} for i, p in enumerate(paragraphs)])
    _jsonl(tmp_path / "labelled_empty.jsonl", [r for i, p in enumerate(paragraphs)
                                               for r in ({"text": p, "label": i % 2}, {"text": "", "label": 1})])
    loaded = {}
    for name in ("compact.txt", "paragraphs.txt", "labelled.jsonl", "labelled_empty.jsonl"):
        cfg = CompareConfig(corpus="text", path=str(tmp_path / name), profile="quick")
        loaded[name] = load_data(cfg, dataclasses.replace(cfg.sizes(), lm_docs=None), progress=False)
    compact, para = loaded["compact.txt"], loaded["paragraphs.txt"]
    labelled, labelled_empty = loaded["labelled.jsonl"], loaded["labelled_empty.jsonl"]
    for part in ("clf_train", "clf_test"):
        got, want = getattr(labelled_empty, part).tokens, getattr(labelled, part).tokens
        assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.ids, want.ids), part
    for part in ("stat_neg", "val_neg", "test_neg", "test_unk", "lm_neg"):
        got, want = getattr(para, part), getattr(compact, part)
        assert (got.lengths > 0).all(), part
        assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.ids, want.ids), part
    assert para.describe["documents"] == 120 and para.describe["documents_without_tokens"] == 60
    assert para.describe["eval_docs"] == compact.describe["eval_docs"] == 6
    assert "documents_without_tokens" not in compact.describe


def test_text_corpus_with_fewer_than_20_documents_with_tokens_is_refused(tmp_path, capsys):
    """20 lines of which 15 were blank passed the 20-document check, and the run then failed in the
    projection stage with "torch.cat(): expected a non-empty list of Tensors" (its one validation
    document was empty)."""
    lines = ["the cat sat on the mat and the dog ran" if i % 4 == 0 else "" for i in range(20)]
    path = tmp_path / "blank.txt"
    path.write_text("".join(line + "\n" for line in lines))
    code, out, err = run_cli(["--corpus", "text", "--path", str(path), "--out", str(tmp_path / "runs"), "-q",
                              "--device", "cpu", "--no-models"], capsys)
    assert code == 2 and ("the corpus has 20 documents, 5 of them with tokens; a comparison needs at least 20 "
                          "with tokens") in err, err


def test_one_stored_svd_serves_every_rank_the_stages_ask_for():
    import scipy.sparse as sp

    from distattn.compare.config import PROFILE_SIZES
    from distattn.compare.stages import svd_ranks, top_svd
    rng = np.random.default_rng(1)
    G = np.linalg.qr(rng.normal(size=(200, 40)))[0]
    dense = (G * 0.8 ** np.arange(40)) @ G.T                       # a decaying spectrum, as PPMI's
    X = sp.csr_array(np.where(np.abs(dense) > 1e-3, dense, 0.0))
    svd = top_svd(X, 12)
    exact = np.linalg.svd(X.toarray(), compute_uv=False)[:12]
    np.testing.assert_allclose(svd.s, exact, rtol=1e-4)
    np.testing.assert_allclose(svd.frobenius_sq, (X.toarray() ** 2).sum(), rtol=1e-12)
    assert svd.u.shape == (200, 12) and svd.vt.shape == (12, 200) and np.all(np.diff(svd.s) <= 0)
    np.testing.assert_allclose(svd.u.T @ svd.u, np.eye(12), atol=1e-4)
    assert svd_ranks(PROFILE_SIZES["full"], 30_000) == (256, 200)     # embeddings 256; spectrum 200 >= d_k 128
    assert svd_ranks(PROFILE_SIZES["quick"], 9) == (6, 6)      # a tiny vocabulary clamps every rank


def test_ppmi_svd_init_takes_leading_components_or_pads():
    from distattn.compare.stages import ppmi_svd_init
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(ppmi_svd_init(emb, 2), emb[:, :2])
    wide = ppmi_svd_init(emb, 6)
    assert wide.shape == (3, 6) and np.array_equal(wide[:, :4], emb) and not wide[:, 4:].any()


def test_too_few_labelled_documents_skip_only_the_best_classifier(tmp_path, capsys):
    path = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=30)
    lines = path.read_text().splitlines()
    lines = [ln if i < 14 else json.dumps({"text": json.loads(ln)["text"]}) for i, ln in enumerate(lines)]
    path.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(["--corpus", "text", "--path", str(path), "--profile", "quick", "--out",
                              str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    run_dir = next((tmp_path / "runs").iterdir())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert "classifier" in metrics and "classifier_best" not in metrics
    assert not (run_dir / "checkpoints" / "classifier_best.pt").exists()


def test_command_line_is_pasteable():
    from distattn.compare.run import command_line
    assert command_line(["/site/distattn/compare/__main__.py", "--corpus", "text", "--path", "my reviews.txt"]) == \
        "python -m distattn.compare --corpus text --path 'my reviews.txt'"
    assert command_line(["tool.py", "-q"]) == "tool.py -q"


@pytest.mark.slow
def test_imdb_run_without_models(imdb_archive, tmp_path, capsys):
    """The main command's corpus, at smoke size: the IMDB splits, the seed's five example reviews in
    the heatmaps, and the report's wording for reviews."""
    code, out, err = run_cli(["--corpus", "imdb", "--data-dir", str(imdb_archive.parent), "--max-docs", "40",
                              "--no-models", "--out", str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    run_dir = next((tmp_path / "runs").iterdir())
    assert run_dir.name.startswith("imdb-")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    data = metrics["data"]
    assert data["corpus"] == "imdb" and data["documents"] == 100_000 and data["eval_docs"] == 40
    heat = metrics["analysis"]["heatmaps"]
    assert [h["example"] for h in heat] == ["long positive", "long negative", "mixed", "positive with minor negation",
                                            "subtle negative", "held-out review 1", "held-out review 2"]
    assert all(h["expected"] for h in heat[:5]) and "p_positive" not in heat[0]     # no classifier trained
    report = (run_dir / "report.html").read_text()
    assert "The five example reviews of 000_48942d33924f2728.txt §IV.B" in report
    config = json.loads((run_dir / "config.json").read_text())
    assert config["resolved_paths"]["data_dir"] == str(imdb_archive.parent.resolve())


def test_full_profile_on_a_small_corpus_trains_the_lms_at_least_lm_min_steps(tmp_path, monkeypatch):
    """The full profile's structure (every document, seed-size classifier, one LM pass) end to end at
    smoke size on the CPU; its LMs once trained 2 steps on a small corpus (one pass), inside a
    100-step warm-up. The LMs are shrunk and lm_min_steps lowered so that it runs in seconds."""
    import dataclasses

    import torch

    from distattn.compare.config import CompareConfig
    from distattn.compare.run import _study, make_run_dir
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))      # only this run's stages in it
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=60)
    cfg = CompareConfig(corpus="text", path=str(corpus), profile="full", out=str(tmp_path / "runs"))
    full = cfg.sizes()
    assert full.lm_steps is None and full.lm_min_steps == 1_000 and full.clf_train_docs is None
    sizes = dataclasses.replace(full, lm_model=dict(d_model=32, n_layers=1, n_heads=2, max_len=64),
                                attn_model=dict(d_model=32, n_heads=1, max_len=64), lm_min_steps=24, eval_len=64,
                                analysis_len=64)          # the documents have 20 to 50 words
    run_dir = make_run_dir(cfg.out, cfg.corpus)
    _study(cfg, run_dir, "full", sizes, torch.device("cpu"), cache=True, progress=False)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for lm in ("attention_only_lm", "transformer_lm"):
        (done,) = (tmp_path / "cache").rglob(f"train-{lm}-*/done.json")
        assert json.loads(done.read_text())["summary"]["steps"] == 24          # several passes, not one
    assert metrics["classifier"]["config"] == "seed architecture (000_48942d33924f2728.txt); 5 epochs"  # not scaled
    assert (run_dir / "report.html").exists() and "transformer_lm" in [r["key"] for r in metrics["next_token"]]


def test_full_profile_without_a_gpu_is_refused_before_anything_is_written(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device auto resolves to it")
    corpus = synthetic_jsonl(tmp_path / "c.jsonl")
    code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), "--profile", "full", "--out",
                              str(tmp_path / "runs")], capsys)
    assert code == 2 and "--profile full trains seed-size models and needs a GPU, and none was found" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_the_paper_corpus_runs_under_any_profile_since_it_trains_nothing(tmp_path, capsys, caplog, device):
    """--corpus paper --profile full was refused on a machine without a GPU as if it trained seed-size
    models; it trains nothing, so --profile is one more option it ignores, and says so."""
    code, out, err = run_cli(["--corpus", "paper", "--profile", "full", "--device", device, "--out",
                              str(tmp_path / "runs"), "-q"], capsys)
    assert code == 0, err
    assert "--profile ignored: --corpus paper" in caplog.text + err
    assert "river bank flooded -> shore" in out


def test_config_json_records_the_paths_it_read_as_absolute(tmp_path, monkeypatch):
    from distattn.compare.config import CompareConfig
    from distattn.compare.run import environment
    corpus = synthetic_jsonl(tmp_path / "c.jsonl")
    monkeypatch.chdir(tmp_path)
    cfg = CompareConfig(corpus="text", path="c.jsonl", out="runs", profile="quick").validate()
    env = environment(cfg, "quick", cfg.sizes(), "cpu")
    assert env["config"]["path"] == "c.jsonl"                   # as given on the command line
    assert env["resolved_paths"] == {"path": str(corpus.resolve()), "out": str((tmp_path / "runs").resolve())}
    json.dumps(env)                                            # what config.json holds


def test_sense_communities_render_as_a_table():
    from distattn.compare.report import _senses
    html = _senses({"word": "bank", "communities": [["river", "shore"], ["money", "loan", "<b>"]],
                    "share": [0.25, 0.75], "modularity": 0.3})
    assert "modularity 0.300" in html and "&lt;b&gt;" in html and "<b>" not in html.replace("<b>bank</b>", "")
    assert html.index("money, loan") < html.index("river, shore")          # largest share first


def test_run_directories_are_claimed_atomically(tmp_path):
    """Runs started in the same second once shared one directory, so a failing run's cleanup
    could delete a live twin's output."""
    from concurrent.futures import ThreadPoolExecutor

    from distattn.compare.run import make_run_dir
    with ThreadPoolExecutor(8) as pool:
        dirs = list(pool.map(lambda _: make_run_dir(str(tmp_path), "paper"), range(16)))
    assert len(set(dirs)) == 16 and all((d / "figures").is_dir() for d in dirs)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name, rows, message", [
    ("label2", [{"text": "a b c d e f", "label": 2 if i == 10 else i % 2} for i in range(40)],
     "1 document(s) have a label other than 0 or 1, the first document 10 (0-based, in corpus order) label 2"),
    ("oneword", [{"text": f"w{i % 7}"} for i in range(40)],
     "the statistics documents give no co-occurrence within 10 tokens: each has fewer than two in-vocabulary"),
    # seed 0 draws documents 19 and 4 for evaluation and 10 for validation out of 25
    ("oneword_val", [{"text": "alpha" if i == 10 else "alpha beta gamma delta"} for i in range(25)],
     "the 1 validation document(s) hold no next-token position with an in-vocabulary target"),
    ("oneword_eval", [{"text": "alpha" if i in (4, 19) else "alpha beta gamma delta"} for i in range(25)],
     "the 2 evaluation document(s) hold no next-token position with an in-vocabulary target"),
])
def test_corpora_the_study_cannot_use_fail_clearly_and_leave_no_output_dir(tmp_path, capsys, name, rows, message):
    """A label 2 once failed inside the classifier as "document 8 has label np.int8(2)" (an index of a
    subset); one-word documents as "bounds entry must be a finite real number > 0; got nan"; a one-word
    validation document likewise, and one-word evaluation documents gave next-token rows of no positions."""
    out_dir = tmp_path / "new" / "out"
    code, out, err = run_cli(["--corpus", "text", "--path", str(_jsonl(tmp_path / f"{name}.jsonl", rows)),
                              "--out", str(out_dir), "-q", "--device", "cpu"], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "new").exists()          # the --out it made for the run went with it


def test_one_label_skips_the_classifier_and_says_why(tmp_path, capsys, caplog):
    """Once skipped with no word; and the seed's IMDB examples, none of whose words are in this
    vocabulary, made the heatmaps fail."""
    rows = [{"text": "alpha beta gamma delta epsilon zeta eta theta", "label": 1} for _ in range(40)]
    code, out, err = run_cli(["--corpus", "text", "--path", str(_jsonl(tmp_path / "one.jsonl", rows)),
                              "--out", str(tmp_path / "runs"), "-q", "--device", "cpu", "--no-cache"], capsys)
    assert code == 0, err
    assert "classifier skipped: the 36 labelled training documents all have label 1" in caplog.text + err
    metrics = json.loads(next((tmp_path / "runs").glob("*/metrics.json")).read_text())
    assert metrics["data"]["classifier_skipped"].startswith("the 36 labelled training documents all have label 1")
    heat = metrics["analysis"]["heatmaps"]
    assert "classifier" not in metrics and [h["example"] for h in heat] == [f"held-out document {i}" for i in (1, 2, 3, 4)]
    report = next((tmp_path / "runs").glob("*/report.html")).read_text()
    assert "Held-out test documents." in report and "§IV.B" not in report   # the seed's IMDB reviews: IMDB only


def test_a_vocabulary_of_fewer_than_13_words_runs_the_subspace_alignment(tmp_path, capsys):
    """The alignment of the LMs' QK circuits with PPMI took 10 singular vectors of PPMI whatever its
    size: four words (a vocabulary of 6 with the specials) failed with "k must be an integer in
    [1, 6], got 10"."""
    rows = [{"text": "alpha beta gamma delta"} for _ in range(25)]
    code, out, err = run_cli(["--corpus", "text", "--path", str(_jsonl(tmp_path / "tiny.jsonl", rows)),
                              "--out", str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    metrics = json.loads(next((tmp_path / "runs").glob("*/metrics.json")).read_text())
    align = metrics["analysis"]["subspace_alignment"]
    assert metrics["data"]["vocab_size"] == 6 and align and {a["k"] for a in align} == {3}


def test_a_data_dir_that_is_not_a_directory_is_refused(tmp_path, monkeypatch):
    """A typo in --data-dir once fell back to $DISTATTN_DATA_DIR (or a download) without a word."""
    from distattn.compare.config import CompareConfig
    with pytest.raises(FileNotFoundError, match="--data-dir '/no/such/dir' does not exist"):
        CompareConfig(corpus="imdb", data_dir="/no/such/dir").validate()
    archive = tmp_path / "aclImdb_v1.tar.gz"
    archive.write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="is a file; pass the directory that holds aclImdb_v1.tar.gz"):
        CompareConfig(corpus="imdb", data_dir=str(archive)).validate()
    CompareConfig(corpus="imdb", data_dir=str(tmp_path)).validate()


def test_an_unavailable_mps_device_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """--device mps without MPS once failed with a RuntimeError traceback in the projection stage."""
    import torch
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    code, out, err = run_cli(["--corpus", "paper", "--device", "mps", "--out", str(tmp_path / "runs"), "-q"], capsys)
    assert code == 2 and "device='mps' was requested but MPS is not available" in err, err
    assert not (tmp_path / "runs").exists()


def test_an_unwritable_cache_directory_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """It once failed with a NotADirectoryError traceback in the middle of the run."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(blocker / "cache"))
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=30)
    code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), "--no-models", "--out",
                              str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 2 and f"cannot write the cache directory {str(blocker / 'cache')!r}" in err, err
    assert not (tmp_path / "runs").exists()


def test_an_unreadable_path_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """A --path the user may not read (mode 000, another user's file) once failed with a
    PermissionError traceback from inside the data stage. (open is refused here for that file, as
    root reads any file whatever its mode.)"""
    import builtins
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=30)
    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == str(corpus):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", refusing_open)
    code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), "--no-models", "--out",
                              str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 2 and f"cannot read {str(corpus)!r} (Permission denied)" in err, err
    assert not (tmp_path / "runs").exists()


def test_an_out_that_is_a_file_is_named(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub" / "runs"):
        code, _, err = run_cli(["--corpus", "paper", "--out", str(out), "-q"], capsys)
        assert code == 2 and f"{str(blocker)!r} is a file, not a directory" in err, err
    assert blocker.read_text() == "x"


def test_no_cache_uses_this_runs_analysis_not_a_cached_one(tmp_path, monkeypatch):
    """--no-cache recomputed the analysis, then discarded it for the entry already in the cache."""
    from types import SimpleNamespace

    import distattn.compare.run as run_mod
    from distattn.compare.config import CompareConfig
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    sizes = CompareConfig(corpus="paper", profile="quick").sizes()
    data, stats = SimpleNamespace(key="d"), SimpleNamespace(key="s")
    for value, cache in ((1, True), (2, False)):
        run_dir = tmp_path / f"run{value}"
        for sub in ("figures", "graphs"):
            (run_dir / sub).mkdir(parents=True)

        def analyse(out_dir, *args, value=value):
            (out_dir / "figures" / "spectra.png").write_text(str(value))
            return {"value": value}
        monkeypatch.setattr(run_mod, "analyse", analyse)
        assert run_mod.cached_analysis(run_dir, data, stats, {}, sizes, "cpu", cache=cache) == {"value": value}
        assert (run_dir / "figures" / "spectra.png").read_text() == str(value)


def test_a_run_interrupted_while_writing_its_report_leaves_no_run_directory(tmp_path, capsys, monkeypatch):
    import distattn.compare.report as report_mod

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(report_mod, "write_report", interrupted)
    (tmp_path / "runs" / "an-earlier-run").mkdir(parents=True)
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path / "runs"), "-q"], capsys)
    assert code == 130
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["an-earlier-run"]    # no run without its report


def test_an_interrupt_under_no_cache_does_not_promise_a_resume(tmp_path, capsys, monkeypatch):
    import distattn.compare.run as run_mod

    def interrupted(run_dir):
        raise KeyboardInterrupt
    monkeypatch.setattr(run_mod, "paper_reproduction", interrupted)
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path), "-q", "--no-cache"], capsys)
    assert code == 130 and "resumes from its last checkpoint" not in err and "--no-cache" in err


def test_projection_rows_cached_on_one_device_are_not_served_to_another(tmp_path):
    # the projection stage's key held no device, so rows scored on the CPU were reported for a GPU run
    import json
    from types import SimpleNamespace

    import torch

    from distattn.compare.stages import stage_dir, stage_projection
    data, stats = SimpleNamespace(key="d0"), SimpleNamespace(key="s0")
    sizes = SimpleNamespace(asym_rank=4, heads=(2, 2))
    material = {"data": "d0", "stats": "s0", "asym_rank": 4, "heads": [2, 2]}
    cpu_dir, _ = stage_dir("projection", {**material, "device": "cpu"})
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "rows.json").write_text(json.dumps(seal({"rows": [{"key": "raw", "perplexity": 1.0}]})))
    assert stage_projection(data, stats, sizes, torch.device("cpu")) == [{"key": "raw", "perplexity": 1.0}]
    # another device misses the cache and computes its own rows (here it gets as far as the
    # placeholder data, which has no vocabulary)
    with pytest.raises(AttributeError, match="vocab"):
        stage_projection(data, stats, sizes, torch.device("meta"))


def test_a_bank_without_ppmi_neighbours_skips_its_senses_not_the_run(tmp_path, capsys, caplog):
    """"bank" only in one-word documents is in the vocabulary but has no positive PPMI neighbour:
    the sense communities raised, and the whole run failed at the analysis ("error: 'bank' has no
    positive PPMI neighbours") after every other stage had finished."""
    import logging
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=40)
    with open(corpus, "a") as fh:
        for _ in range(3):
            fh.write(json.dumps({"text": "bank"}) + "\n")
    with caplog.at_level(logging.INFO, logger="distattn.compare"):
        code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), "--no-models", "--out",
                                  str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    metrics = json.loads(next((tmp_path / "runs").glob("*/metrics.json")).read_text())
    assert "bank_senses" not in metrics["analysis"] and "heatmaps" in metrics["analysis"]
    assert "'bank' has no positive PPMI neighbours" in caplog.text


def test_test_documents_shorter_than_eight_tokens_skip_the_agreement_not_the_run(tmp_path, capsys, caplog):
    """The agreement, graph and kernel views read held-out documents of at least 8 tokens; with
    none (a corpus of short sentences) the run failed after training with "error: head_patterns
    is empty"."""
    import logging
    rows = [{"text": " ".join(np.random.default_rng(i).choice("the cat sat on a mat dog ran".split(), 6))}
            for i in range(40)]
    with caplog.at_level(logging.INFO, logger="distattn.compare"):
        code, out, err = run_cli(["--corpus", "text", "--path", str(_jsonl(tmp_path / "short.jsonl", rows)),
                                  "--out", str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    analysis = json.loads(next((tmp_path / "runs").glob("*/metrics.json")).read_text())["analysis"]
    assert "agreement_summary" not in analysis and "graph" not in analysis and "cka" not in analysis
    assert analysis["spectra"] and analysis["attention_pmi_correlation"]
    assert "no held-out document has 8 tokens" in caplog.text
    # the randomized SVDs' accuracy is recorded beside their spectra (the embeddings' SVD is dense)
    for name in ("S (counts)", "PPMI", "directional PPMI"):
        assert 0 <= analysis["spectra"][name]["max_rel_residual"] < 1, name
    assert "max_rel_residual" not in analysis["spectra"]["PPMI-SVD embeddings"]


@pytest.mark.parametrize("positional", ["learned", "relative"])
def test_learned_kernel_is_exp_qk_over_root_d_for_every_pair_the_causal_mask_hides_too(positional):
    # the CKA's "learned exp(qkᵀ/√d)" came from a causal LM's hook_scores, whose pairs j > i are -inf:
    # they were filled with the smallest score, so the upper triangle was one constant, not exp(q·k/√d)
    import torch

    from distattn.compare.run import learned_kernel
    from distattn.models import LMConfig, TransformerLM, capture_hooks
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, max_len=12,
                                   positional=positional)).eval()
    attn = model.trunk.blocks[0].attn
    if attn.relative is not None:
        torch.nn.init.normal_(attn.relative.vectors, std=1.0)
    ids = torch.randint(2, 30, (1, 9), generator=torch.Generator().manual_seed(1))
    K = learned_kernel(model, ids, layer=0, head=0)
    with torch.no_grad(), capture_hooks(model, ["trunk.blocks.0.attn.hook_q", "trunk.blocks.0.attn.hook_k"]) as c:
        model(ids)
    q = c["trunk.blocks.0.attn.hook_q"][0, 0].double().numpy()
    k = c["trunk.blocks.0.attn.hook_k"][0, 0].double().numpy()
    s = q @ k.T
    if attn.relative is not None:               # Shaw et al.: + q_i · r_{clip(i - j)}
        r, D = attn.relative.vectors.detach().double().numpy(), attn.relative.max_distance
        i, j = np.indices((9, 9))
        s = s + np.einsum("id,ijd->ij", q, r[np.clip(i - j, -D, D) + D])
    s = s / np.sqrt(8)
    expected = np.exp(s - s.max())
    assert K.shape == (9, 9)
    np.testing.assert_allclose(K, expected, rtol=1e-4, atol=1e-7)
    upper = K[np.triu_indices(9, 1)]
    assert np.ptp(upper) > 1e-3 * upper.max()   # not one fill value


def test_models_train_on_the_thread_count_the_run_started_with(tmp_path):
    """numba's OpenMP pool, started by the first stage that runs a parallel kernel, set torch's CPU
    thread count to NUMBA_NUM_THREADS: the models trained on other threads (other rounding) when a
    stage before them was computed in the process than when it came from the cache, as in a run
    interrupted and run again."""
    script = tmp_path / "threads.py"
    script.write_text(
        "import importlib, sys, numba, torch\n"
        "R = importlib.import_module('distattn.compare.run')\n"
        "from distattn.compare.config import CompareConfig\n"
        "def study(*a, **kw):\n"
        "    numba.get_num_threads()       # what a stage's first parallel kernel does\n"
        "    print('THREADS', torch.get_num_threads(), flush=True)\n"
        "    raise SystemExit(0)\n"
        "R._study = study\n"
        "R.run(CompareConfig(corpus='text', path=sys.argv[1], out=sys.argv[2], device='cpu'), progress=False)\n")
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n" * 30)
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="2", DISTATTN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(script), str(corpus), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "THREADS 1" in res.stdout, res.stdout + res.stderr[-2000:]


def test_max_docs_above_every_set_is_the_same_run_as_none(tmp_path):
    """--max-docs is a cap: one above every document set changes nothing. It shrank the
    validation set fivefold (quick: 40 -> 8, whatever the cap) and redrew the statistics documents,
    moving the LM documents drawn after them."""
    import dataclasses

    from distattn.compare.config import PROFILE_SIZES, CompareConfig
    from distattn.compare.stages import load_data
    assert CompareConfig(profile="quick", max_docs=10**6).sizes() == PROFILE_SIZES["quick"]
    assert CompareConfig(profile="quick", max_docs=30).sizes().val_docs == 30
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=300)
    loaded = {}
    for cap in (None, 10**6):
        cfg = CompareConfig(corpus="text", path=str(corpus), profile="quick", max_docs=cap)
        loaded[cap] = load_data(cfg, dataclasses.replace(cfg.sizes(), lm_docs=200), progress=False)
    capped, uncapped = loaded[10**6], loaded[None]
    assert capped.describe == uncapped.describe and capped.describe["validation_docs"] == 15
    for part in ("stat_neg", "val_neg", "test_neg", "lm_neg"):
        got, want = getattr(capped, part), getattr(uncapped, part)
        assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.ids, want.ids), part
    assert capped.key == uncapped.key


def test_config_json_records_the_command_main_was_given_not_the_processs(tmp_path, capsys):
    """main(argv) parses argv, but config.json's "command" (and the report's "Command:") was built
    from sys.argv: called from Python (a notebook, a script, this test) it named the host process's
    command (here pytest's), not the compare run's options."""
    args = ["--corpus", "paper", "--out", str(tmp_path / "my runs"), "-q"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    run_dir = next((tmp_path / "my runs").iterdir())
    command = f"python -m distattn.compare --corpus paper --out '{tmp_path / 'my runs'}' -q"
    assert json.loads((run_dir / "config.json").read_text())["command"] == command
    assert f"Command: <code>{command.replace(chr(39), '&#x27;')}</code>" in (run_dir / "report.html").read_text()


def test_git_hash_is_recorded_only_for_a_distattn_checkout(tmp_path, monkeypatch):
    """config.json's git_hash came from `git rev-parse HEAD` run in the package's directory: distattn
    installed (not editable) into a virtual environment inside another project's repository got that
    project's HEAD recorded (and shown in the report) as the code the run used."""
    import distattn
    from distattn.compare.config import CompareConfig
    from distattn.compare.run import environment
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    project = tmp_path / "project"
    site = project / ".venv" / "lib" / "python3" / "site-packages" / "distattn"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (project / ".gitignore").write_text(".venv/\n")
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", ".gitignore"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "a project"], cwd=project, check=True)
    cfg = CompareConfig(corpus="paper").validate()
    monkeypatch.setattr(distattn, "__file__", str(site / "__init__.py"))
    assert environment(cfg, "quick", cfg.sizes(), "cpu")["git_hash"] is None
    # a checkout whose distattn/ is tracked: its HEAD
    subprocess.run([*git, "add", "-f", ".venv"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "vendored"], cwd=project, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True).stdout.strip()
    assert environment(cfg, "quick", cfg.sizes(), "cpu")["git_hash"] == head


@pytest.mark.parametrize("damaged", ["stats-*/S.npz", "stats-*/embeddings.npy", "stats-*/done.json",
                                     "projection-*/rows.json", "analysis-*/analysis.json"])
def test_a_damaged_stage_cache_entry_is_recomputed(tmp_path, capsys, caplog, monkeypatch, damaged,
                                                   cold_quick_run_no_models):
    """A stage entry cut short on disk (a crash before its data reached the disk, under an older version
    without fsync) failed every later run: a zipfile.BadZipFile traceback, or "error: Unterminated
    string starting at: line 1 column 94", naming no file."""
    args, first = _copy_of_cold_cache(cold_quick_run_no_models, tmp_path, monkeypatch)
    (entry,) = (tmp_path / "cache" / "compare").glob(damaged)
    entry.write_bytes(entry.read_bytes()[:len(entry.read_bytes()) // 2])
    code, out, err = run_cli(args + ["--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert f"ignoring damaged cache entry {entry.parent}" in caplog.text
    second = json.loads((next((tmp_path / "b").iterdir()) / "metrics.json").read_text())
    rows = lambda m: [{k: v for k, v in r.items() if k != "seconds"} for r in m["next_token"]]
    assert rows(second) == rows(first) and second["analysis"]["spectra"] == first["analysis"]["spectra"]
    caplog.clear()
    code, out, err = run_cli(args + ["--out", str(tmp_path / "c")], capsys)      # the entry was written again
    assert code == 0 and "damaged" not in caplog.text


def test_a_changed_analysis_figure_or_graph_file_is_recomputed_not_copied_into_runs(tmp_path, caplog, monkeypatch):
    """The analysis entry's PNG figures and GraphML files were copied into every later run unchecked: a
    bit flipped in one still opens, and a wrong heatmap or graph was served as computed. Each file is
    checked against the sha256 the sealed analysis.json records, and a missing one fails the entry too.
    (``analyse`` is replaced by one writing a figure and a graph whose bytes count its calls: the
    real one takes seconds, and its files are checked the same way.)"""
    import importlib
    R = importlib.import_module("distattn.compare.run")     # the package's name `run` is the function
    calls = []

    def analyse(run_dir, *args):
        calls.append(run_dir)
        (run_dir / "figures" / "heatmap.png").write_bytes(b"\x89PNG figure")
        (run_dir / "graphs" / "attention_example.graphml").write_bytes(b"<graphml>an attention graph</graphml>")
        return {"top1": 0.25}
    entry = tmp_path / "cache" / "analysis-x"
    monkeypatch.setattr(R, "analyse", analyse)
    monkeypatch.setattr(R, "analysis_dir", lambda *args: (entry, "x"))
    figure, graph = entry / "figures" / "heatmap.png", entry / "graphs" / "attention_example.graphml"

    def run(name):
        run_dir = tmp_path / name
        for sub in ("figures", "graphs"):
            (run_dir / sub).mkdir(parents=True)
        caplog.clear()
        assert R.cached_analysis(run_dir, None, None, {}, None, "cpu") == {"top1": 0.25}
        assert (run_dir / "figures" / figure.name).read_bytes() == b"\x89PNG figure", name
        assert (run_dir / "graphs" / graph.name).read_bytes() == b"<graphml>an attention graph</graphml>", name
    run("a")
    run("b")
    assert len(calls) == 1 and "damaged" not in caplog.text      # served from the entry, unchanged
    for name, damaged, damage in (
            ("c", figure, lambda: figure.write_bytes(bytes([figure.read_bytes()[0] ^ 1]) + figure.read_bytes()[1:])),
            ("d", graph, lambda: graph.write_bytes(graph.read_bytes().replace(b"an", b"no"))),
            ("e", graph, graph.unlink)):
        damage()
        run(name)
        assert f"ignoring damaged cache entry {entry}" in caplog.text and str(damaged) in caplog.text, name
    assert len(calls) == 4


def _change_a_figure(path: Path, key: str) -> None:
    """Change the first digit of the first number under ``key`` in a JSON file (to another digit, never
    a leading zero), as a bit flipped on disk can: the file stays valid JSON."""
    text = path.read_text()
    m = re.search(rf'"{key}": \[?-?(\d)', text)
    assert m, f"no number under {key!r} in {path}"
    i, digit = m.start(1), int(m.group(1))
    changed = text[:i] + str(digit % 9 + 1) + text[i + 1:]
    json.loads(changed)
    path.unlink()                  # a new file: the run directory may hold a hard link to it
    path.write_text(changed)


def test_a_stage_json_changed_into_other_valid_json_is_recomputed_not_served(tmp_path, capsys, caplog, monkeypatch,
                                                                           cold_quick_run):
    """A cache entry's JSON is the root of its checks (the statistics' file digests, the model's weights
    digest), and a bit flipped in one of its figures left it valid JSON: a next-token row's perplexity,
    a model's metrics or the statistics' Frobenius norms were served as computed. Its seal refuses it.
    One figure is changed in each of the four stages' JSON at once (each entry is keyed by its config,
    not by the content of the ones before it, so each is read, refused and recomputed on its own)."""
    args, first = _copy_of_cold_cache(cold_quick_run, tmp_path, monkeypatch)
    changed = []
    for damaged, key in (("stats-*/done.json", "P"), ("projection-*/rows.json", "perplexity"),
                         ("analysis-*/analysis.json", "top1"), ("train-transformer_lm-*/done.json", "train_seconds")):
        (entry,) = (tmp_path / "cache" / "compare").glob(damaged)
        _change_a_figure(entry, key)
        changed.append(entry)
    code, out, err = run_cli(args + ["--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    for entry in changed:
        assert f"ignoring damaged cache entry {entry.parent} (ValueError: {entry} is damaged: its content's sha256" \
            in caplog.text, entry
    second = json.loads((next((tmp_path / "b").iterdir()) / "metrics.json").read_text())

    def timeless(x):                # every figure but the timings
        if isinstance(x, dict):
            return {k: timeless(v) for k, v in x.items() if not k.endswith("seconds")}
        return [timeless(v) for v in x] if isinstance(x, list) else x
    assert timeless(second["next_token"]) == timeless(first["next_token"])
    assert timeless(second["analysis"]) == timeless(first["analysis"])


@pytest.mark.parametrize("damaged", ["model.pt", "done.json"])
def test_a_damaged_trained_model_entry_is_retrained(tmp_path, capsys, caplog, monkeypatch, damaged, cold_quick_run):
    """A model stage's model.pt cut short failed every later run with a RuntimeError traceback
    ("PytorchStreamReader failed reading zip archive"), its done.json with "error: Expecting ',' delimiter"."""
    args, first = _copy_of_cold_cache(cold_quick_run, tmp_path, monkeypatch)
    (entry,) = (tmp_path / "cache" / "compare").glob(f"train-transformer_lm-*/{damaged}")
    data = entry.read_bytes()
    entry.unlink()                  # a new file: a run directory may hold a hard link to model.pt
    entry.write_bytes(data[:len(data) // 2])
    code, out, err = run_cli(args + ["--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert f"ignoring damaged cache entry {entry.parent}" in caplog.text
    second = json.loads((next((tmp_path / "b").iterdir()) / "metrics.json").read_text())
    rows = lambda m: [{k: v for k, v in r.items() if k != "seconds"} for r in m["next_token"]]
    assert rows(second) == rows(first)


@pytest.mark.parametrize("name", ["embeddings.npy", "counts.npy", "svd_P_s.npy"])
def test_a_bit_flipped_in_a_statistics_stage_array_is_recomputed_not_used(tmp_path, capsys, caplog, monkeypatch,
                                                                          name):
    """An .npy of the statistics stage with a bit flipped on disk still loads (unlike an .npz, it has
    no CRC): the wrong vectors, counts or singular values were served to every later run."""
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    from distattn.compare.config import CompareConfig
    from distattn.compare.stages import load_data, stage_statistics
    cfg = CompareConfig(corpus="text", path=str(synthetic_jsonl(tmp_path / "c.jsonl", n_docs=40)), profile="quick")
    data = load_data(cfg, cfg.sizes(), progress=False)
    first = stage_statistics(data, cfg.sizes())
    (entry,) = (tmp_path / "cache" / "compare").glob(f"stats-*/{name}")
    flipped = bytearray(entry.read_bytes())
    flipped[-1] ^= 0x40
    entry.write_bytes(bytes(flipped))
    again = stage_statistics(data, cfg.sizes())
    assert f"ignoring damaged cache entry {entry.parent}" in caplog.text and name in caplog.text
    assert np.array_equal(again.embeddings, first.embeddings) and np.array_equal(again.counts, first.counts)
    assert np.array_equal(again.svd_P.s, first.svd_P.s)


def _trained_entry(tmp_path, monkeypatch):
    """A finished model stage entry (model.pt, done.json, a checkpoint) and a Trainer that fails the test."""
    import distattn.train
    from distattn.compare.stages import _weights_sha256, stage_dir
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import TrainConfig, save_model
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    cfg = TrainConfig()
    d, _ = stage_dir("train-lm", {"k": 1, "train": cfg.fingerprint()})
    d.mkdir(parents=True)
    model = TransformerLM(LMConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, max_len=8))
    save_model(model, d / "model.pt")
    write_json(d / "done.json", seal({"weights_sha256": _weights_sha256(model)}))
    (d / "checkpoint.pt").write_bytes(b"hours of training")
    monkeypatch.setattr(distattn.train, "Trainer", lambda *a, **k: pytest.fail("a whole trained model was retrained"))
    return d, cfg


@pytest.mark.parametrize("error", [RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't "
                                                "allocate memory: you tried to allocate 4194304 bytes"),
                                   RuntimeError("Error(s) in loading state_dict for TransformerLM: Missing key(s)")])
def test_a_trained_model_that_fails_to_load_for_want_of_memory_or_a_code_change_is_kept(tmp_path, monkeypatch,
                                                                                        error):
    """Every RuntimeError of load_model was taken for a damaged model.pt: one torch raises when memory
    runs out (or a state dict the model's code no longer fits) removed the finished model and its
    checkpoints, and the model was trained again. Only torch's reader failing on the file is damage."""
    import distattn.train
    from distattn.compare.stages import _train
    d, cfg = _trained_entry(tmp_path, monkeypatch)

    def load_model(path, model=None):
        raise error
    monkeypatch.setattr(distattn.train, "load_model", load_model)
    with pytest.raises(RuntimeError, match=re.escape(str(error))):
        _train("lm", None, None, cfg, {"k": 1}, cache=True)
    assert sorted(p.name for p in d.iterdir()) == [".lock", "checkpoint.pt", "done.json", "model.pt"]


def test_a_stage_entry_that_cannot_be_read_for_want_of_permission_is_kept(tmp_path, monkeypatch):
    """A PermissionError reading a stage entry (a shared cache written by another user) was taken for
    damage: the entry, here a finished model with its checkpoints, was removed and recomputed."""
    import distattn.train
    from distattn.compare.stages import _train
    d, cfg = _trained_entry(tmp_path, monkeypatch)

    def load_model(path, model=None):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(distattn.train, "load_model", load_model)
    with pytest.raises(PermissionError, match="Permission denied"):
        _train("lm", None, None, cfg, {"k": 1}, cache=True)
    assert sorted(p.name for p in d.iterdir()) == [".lock", "checkpoint.pt", "done.json", "model.pt"]


def test_git_dirty_says_whether_the_packages_tracked_files_differ_from_the_recorded_hash(tmp_path, monkeypatch):
    """config.json's git_hash was recorded even when distattn's tracked files had uncommitted changes,
    so the hash did not identify the code that ran; git_dirty says so (None without a hash). Untracked
    files and changes outside the package leave it False: the code the hash names is what ran."""
    import distattn
    from distattn.compare.config import CompareConfig
    from distattn.compare.run import environment
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    repo = tmp_path / "repo"
    pkg = repo / "distattn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (repo / "README.md").write_text("a checkout\n")
    cfg = CompareConfig(corpus="paper").validate()
    monkeypatch.setattr(distattn, "__file__", str(pkg / "__init__.py"))
    env = environment(cfg, "quick", cfg.sizes(), "cpu")
    assert env["git_hash"] is None and env["git_dirty"] is None          # not a checkout
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=repo, check=True)
    dirty = lambda: environment(cfg, "quick", cfg.sizes(), "cpu")["git_dirty"]
    assert dirty() is False
    (pkg / "notes.txt").write_text("untracked")
    (repo / "README.md").write_text("edited outside the package\n")
    assert dirty() is False
    (pkg / "__init__.py").write_text("x = 1\n")
    assert dirty() is True
    subprocess.run([*git, "add", "distattn/__init__.py"], cwd=repo, check=True)     # staged, not committed
    assert dirty() is True


def test_a_paper_run_records_no_profile_sizes_since_it_uses_none(tmp_path, capsys):
    """--corpus paper reproduces fixed toy examples: no data, no training. Its config.json recorded the
    quick (or full) profile's sizes, and config.json, metrics.json and the report its profile, as if
    they had applied (the run warns that --profile is ignored)."""
    code, out, err = run_cli(["--corpus", "paper", "--profile", "full", "--device", "cpu", "--out",
                              str(tmp_path / "runs"), "-q"], capsys)
    assert code == 0, err
    run_dir = next((tmp_path / "runs").iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["sizes"] is None and config["profile"] is None
    assert config["config"]["profile"] == "full"                    # the option as given
    assert json.loads((run_dir / "metrics.json").read_text())["profile"] is None
    assert "profile <b>" not in (run_dir / "report.html").read_text()


def test_a_paper_run_records_no_seed_since_it_ignores_it(tmp_path, capsys):
    """--corpus paper ignores --seed (and warns so), yet its config.json recorded the seed and the
    report header showed "seed 3", as if it had applied; null there now, left out of the header."""
    code, out, err = run_cli(["--corpus", "paper", "--seed", "3", "--out", str(tmp_path / "runs"), "-q"], capsys)
    assert code == 0, err
    run_dir = next((tmp_path / "runs").iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["seed"] is None
    assert config["config"]["seed"] == 3                            # the option as given
    header = (run_dir / "report.html").read_text().split("<h1>")[1].split("</p>")[0]
    assert "corpus <b>paper</b>" in header and "seed" not in header          # it said "· seed 3 ·"


def test_config_json_records_which_data_was_read_and_the_stage_keys(tmp_path, capsys, monkeypatch):
    """config.json recorded the options, versions, seed and git hash but not which data was read: two
    runs of one --path whose file was edited between them wrote the same config.json. It now records
    the corpus's fingerprint (as the tokenized cache keys it) and the key of each stage the run used."""
    from distattn.corpus import TextCorpus
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=40)
    args = ["--corpus", "text", "--path", str(corpus), "--profile", "quick", "--no-models", "-q", "--device", "cpu"]
    configs = []
    for i, seed in enumerate((0, 1)):
        if i:
            synthetic_jsonl(corpus, n_docs=40, seed=seed)           # the same path, other documents
        code, out, err = run_cli(args + ["--out", str(tmp_path / f"r{i}")], capsys)
        assert code == 0, err
        config = json.loads((next((tmp_path / f"r{i}").iterdir()) / "config.json").read_text())
        assert config["corpus_fingerprint"] == json.loads(json.dumps(TextCorpus(corpus).fingerprint()))
        keys = config["stage_keys"]
        assert set(keys) == {"data", "statistics", "projection", "models", "analysis"} and keys["models"] == {}
        for stage, entry in (("statistics", "stats"), ("projection", "projection"), ("analysis", "analysis")):
            assert (tmp_path / "cache" / "compare" / f"{entry}-{keys[stage]}").is_dir()     # the entry it used
        configs.append(config)
    assert configs[0]["corpus_fingerprint"] != configs[1]["corpus_fingerprint"]
    assert all(configs[0]["stage_keys"][s] != configs[1]["stage_keys"][s] for s in ("data", "statistics", "analysis"))
    # a paper run reads the paper's files and caches no stage
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path / "p"), "-q"], capsys)
    assert code == 0, err
    config = json.loads((next((tmp_path / "p").iterdir()) / "config.json").read_text())
    assert config["corpus_fingerprint"]["corpus"] == "paper" and config["stage_keys"] == {}


def test_a_trained_model_edited_in_place_through_the_run_directory_is_retrained_not_served(tmp_path, monkeypatch,
                                                                                          caplog):
    """A run directory's checkpoints/NAME.pt is a hard link to the cache's model.pt: a weight changed in
    that file in place (a user's edit, a bit flipped on disk) changed the cached model too, and torch.load
    checks no CRC, so every later run loaded the damaged weights without a word."""
    import torch

    from distattn.compare import stages
    from distattn.corpus import RaggedIds
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import LMData, LMTask, seed_everything
    from distattn.train.recipes import lm_train_config
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    data = LMData(RaggedIds.from_sequences([rng.integers(2, 50, size=40) for _ in range(20)]), seq_len=16)

    def train():
        seed_everything(0)
        model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=16))
        tcfg = lm_train_config(epochs=1, batch_size=8, device="cpu", progress=False, warmup_steps=2)
        return stages._train("lm", model, LMTask(data, {}), tcfg, {"test": 1}, cache=True)

    first = train()
    weights = {k: v.clone() for k, v in first.model.state_dict().items()}
    run_copy = tmp_path / "run" / "checkpoints" / "lm.pt"
    run_copy.parent.mkdir(parents=True)
    os.link(first.checkpoint, run_copy)
    blob = bytearray(run_copy.read_bytes())
    at = blob.find(weights["lm_head.weight"].numpy().tobytes()[:64])
    assert at > 0
    blob[at + 2] ^= 0x01                            # one weight's mantissa: still a valid file
    with open(run_copy, "r+b") as fh:              # in place: the cache's model.pt is the same file
        fh.write(blob)
    again = train()
    assert f"ignoring damaged cache entry {first.checkpoint.parent}" in caplog.text
    assert all(torch.equal(again.model.state_dict()[k], weights[k]) for k in weights)
    caplog.clear()
    cached = train()                                # the recomputed entry loads, its metrics as written
    assert "damaged" not in caplog.text and cached.metrics == again.metrics


def _small_imdb_archive(path, per_folder=30, seed=0):
    """An aclImdb_v1.tar.gz of ``per_folder`` reviews in each of the five folders (read with
    EXPECTED_COUNTS patched to match): the synthetic two-topic documents of synthetic_jsonl."""
    import io
    import tarfile
    rng = np.random.default_rng(seed)
    common = "the a of and to is was it this film movie".split()
    topics = {"pos": "great wonderful loved superb fun brilliant charming".split(),
              "neg": "awful boring hated dull terrible waste poor".split()}
    topics["unsup"] = topics["pos"] + topics["neg"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tf:
        for top, sub in (("train", "pos"), ("train", "neg"), ("train", "unsup"), ("test", "pos"), ("test", "neg")):
            for i in range(per_folder):
                words = [rng.choice(topics[sub]) if rng.random() < 0.35 else rng.choice(common)
                         for _ in range(rng.integers(20, 50))]
                blob = " ".join(words).encode()
                info = tarfile.TarInfo(f"aclImdb/{top}/{sub}/{i}_{0 if sub == 'unsup' else 8}.txt")
                info.size = len(blob)
                tf.addfile(info, io.BytesIO(blob))
    return path


def test_config_json_records_which_imdb_archive_was_read_when_no_data_dir_was_given(tmp_path, capsys, monkeypatch):
    """resolved_paths recorded --data-dir when given; an archive found through $DISTATTN_DATA_DIR (or
    in the cache) was named nowhere in config.json, only by its sha256. It now records the archive read."""
    from distattn.corpus import imdb
    monkeypatch.setattr(imdb, "EXPECTED_COUNTS", dict.fromkeys(imdb.EXPECTED_COUNTS, 30))
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    archive = _small_imdb_archive(tmp_path / "data" / "aclImdb_v1.tar.gz")
    monkeypatch.setenv("DISTATTN_DATA_DIR", str(tmp_path / "data"))
    code, out, err = run_cli(["--corpus", "imdb", "--max-docs", "20", "--no-models", "--profile", "quick",
                              "--out", str(tmp_path / "runs"), "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    config = json.loads((next((tmp_path / "runs").iterdir()) / "config.json").read_text())
    assert "data_dir" not in config["resolved_paths"]                  # not given
    assert config["resolved_paths"]["archive"] == str(archive.resolve())


def test_a_no_cache_run_leaves_the_cache_entry_another_run_uses_alone(tmp_path, monkeypatch):
    """--no-cache removed the models-stage entry (shutil.rmtree) and trained in it: a cached run of the
    same config that had finished the model and was yet to link its model.pt into its run directory
    (run.py does it after the last model) found no file, and one training in the entry lost its
    checkpoint and best.pt. The no-cache run now trains in a directory of its own, then stores its
    model in the entry as a cached run finishing would (the same command without --no-cache reuses it),
    unless, as here, the entry is already finished: then the entry stays as it is."""
    import torch

    from distattn.compare import stages
    from distattn.corpus import RaggedIds
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import LMData, LMTask, Trainer, seed_everything
    from distattn.train.recipes import lm_train_config
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    data = LMData(RaggedIds.from_sequences([rng.integers(2, 50, size=40) for _ in range(20)]), seq_len=16)

    def train(cache):
        seed_everything(0)
        model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=16))
        tcfg = lm_train_config(epochs=1, batch_size=8, device="cpu", progress=False, warmup_steps=2)
        return stages._train("lm", model, LMTask(data, {}), tcfg, {"test": 1}, cache=cache)

    first = train(cache=True)                       # the other run's model, not yet linked into its run directory
    entry = first.checkpoint.parent
    before = {p.name: p.read_bytes() for p in entry.iterdir()}
    seen, fit = [], Trainer.fit

    def fit_and_look(self):
        # while the no-cache run trains, the other run links its model.pt (run.py's os.link)
        dst = tmp_path / "run" / "checkpoints" / "lm.pt"
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.link(first.checkpoint, dst)
        seen.append((self.out_dir != entry, {p.name: p.read_bytes() for p in entry.iterdir()} == before))
        return fit(self)
    monkeypatch.setattr(Trainer, "fit", fit_and_look)
    again = train(cache=False)
    assert seen == [(True, True)]                   # its own directory; the entry untouched meanwhile
    assert again.checkpoint == first.checkpoint and again.key == first.key
    weights = first.model.state_dict()
    assert all(torch.equal(again.model.state_dict()[k], weights[k]) for k in weights)     # trained from scratch
    assert not [p for p in entry.parent.iterdir() if p.name.endswith(".part")]             # its directory removed
    monkeypatch.setattr(Trainer, "fit", fit)
    cached = train(cache=True)                      # the entry loads: the first run's model, not replaced
    assert cached.metrics == first.metrics
    assert all(torch.equal(cached.model.state_dict()[k], weights[k]) for k in weights)


def _tiny_lm_run(data, cache, evaluate=None):
    """One models-stage entry of a tiny LM (the same config, so the same entry, for every call)."""
    from distattn.compare import stages
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import LMTask, seed_everything
    from distattn.train.recipes import lm_train_config
    seed_everything(0)
    model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=16))
    tcfg = lm_train_config(epochs=1, batch_size=8, device="cpu", progress=False, warmup_steps=2)
    return stages._train("lm", model, LMTask(data, {}), tcfg, {"test": 1}, cache=cache, evaluate=evaluate)


def _shifted(delta):
    """An ``evaluate`` for _train that shifts the model's weights by ``delta``: two runs of one config
    ending with other weights, as on a GPU (non-deterministic kernels)."""
    import torch

    def evaluate(model):
        with torch.no_grad():
            next(model.parameters()).add_(delta)
        return {"shift": delta}
    return evaluate


def _lm_data():
    from distattn.corpus import RaggedIds
    from distattn.train import LMData
    rng = np.random.default_rng(0)
    return LMData(RaggedIds.from_sequences([rng.integers(2, 50, size=40) for _ in range(20)]), seq_len=16)


@pytest.mark.parametrize("cache_a, cache_b", [(True, True), (False, True), (True, False)])
def test_two_runs_finishing_one_model_entry_together_leave_a_matching_pair(tmp_path, monkeypatch, caplog,
                                                                           cache_a, cache_b):
    """_train stored model.pt, then done.json (with the weights' sha256), each atomically but not the
    pair: run A saving its model.pt, then run B (another cached run, or a --no-cache run storing its
    result) saving its model.pt and done.json, then A its done.json left B's weights beside A's sha256
    and metrics. The next run reported the entry as damaged, removed it and trained again. Now the
    first run to finish stores the pair and the other leaves the entry as it is: a cached run takes
    the entry's model and metrics, a --no-cache run keeps its own. B is made to finish between A's two
    writes, or (the fix) to wait on the entry's lock while A writes them."""
    import logging
    import threading

    import torch

    import distattn.train
    from distattn.compare import stages
    from distattn.train import Trainer, load_model
    fcntl = pytest.importorskip("fcntl")            # the entry's lock (POSIX)
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    data = _lm_data()
    b_ready, a_saved, b_done_or_waiting = threading.Event(), threading.Event(), threading.Event()
    save_model, write_json, flock = distattn.train.save_model, stages.write_json, fcntl.flock
    runs, errors = {}, []

    def is_b():
        return threading.current_thread().name == "run-b"

    def save_hook(model, path):
        save_model(model, path)
        if not is_b() and Path(path).name == "model.pt" and not a_saved.is_set():
            a_saved.set()                   # A has stored its model.pt; B finishes now, or waits for A
            assert b_done_or_waiting.wait(120), "run B neither finished nor waited on the entry's lock"

    def write_hook(path, obj):
        write_json(path, obj)
        if is_b() and Path(path).name == "done.json":
            b_done_or_waiting.set()

    def flock_hook(fd, op):
        if is_b() and not op & fcntl.LOCK_UN:
            try:
                return flock(fd, op | fcntl.LOCK_NB)
            except BlockingIOError:
                b_done_or_waiting.set()     # held by A: B waits until A has written both files
        return flock(fd, op)
    monkeypatch.setattr(distattn.train, "save_model", save_hook)
    monkeypatch.setattr(stages, "write_json", write_hook)
    monkeypatch.setattr(fcntl, "flock", flock_hook)

    def b_evaluate(model):
        out = _shifted(1.0)(model)          # B's weights differ from A's
        b_ready.set()
        assert a_saved.wait(120), "run A never stored its model"
        return out

    def run_b():
        try:
            runs["b"] = _tiny_lm_run(data, cache_b, b_evaluate)
        except BaseException as exc:        # noqa: BLE001 (re-raised in the main thread)
            errors.append(exc)
            b_ready.set()
            b_done_or_waiting.set()
    thread = threading.Thread(target=run_b, name="run-b")
    thread.start()
    try:
        assert b_ready.wait(120) and not errors, errors        # B trained, about to store its result
        runs["a"] = _tiny_lm_run(data, cache_a)
    finally:
        a_saved.set()
        thread.join(120)
    assert not thread.is_alive() and not errors, errors
    entry = runs["a"].checkpoint.parent
    done = read_sealed_json(entry / "done.json")      # its seal checked and dropped
    stored = stages._weights_sha256(load_model(entry / "model.pt"))
    assert stored == done["weights_sha256"]                 # the pair matches
    for r, cached in (("a", cache_a), ("b", cache_b)):
        if cached:      # a cached run uses the entry's model and metrics, whichever run stored them
            assert stages._weights_sha256(runs[r].model) == stored, r
            assert runs[r].metrics == {k: v for k, v in done.items() if k != "weights_sha256"}, r
    if not cache_b:     # a --no-cache run keeps the model it trained, though the entry holds A's
        assert runs["b"].metrics["shift"] == 1.0 and stages._weights_sha256(runs["b"].model) != stored
    # the next cached run loads the entry: no warning, no training
    monkeypatch.setattr(Trainer, "fit", lambda self: pytest.fail("the entry was trained again"))
    with caplog.at_level(logging.WARNING, logger="distattn.compare"):
        again = _tiny_lm_run(data, True)
    assert "damaged" not in caplog.text
    weights = load_model(entry / "model.pt").state_dict()
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in weights.items())


def test_a_cached_run_stores_its_own_best_epoch_though_another_run_replaced_best_pt(tmp_path, monkeypatch):
    """Two cached runs of one config train in the same entry, so they share its best.pt. _train took the
    weights it stores from best.pt once fit() returned; a run behind the other writes best.pt at each
    of its own improvements, so the leader stored the lagging run's earlier best epoch beside a history
    naming its own later one, and the entry kept that mismatch for good. Here run B is held before its
    epoch-2 selection while run A trains to the end; B then writes its epoch-2 best.pt after A's epoch 3
    and before A takes its best weights. A must store the weights of the epoch its metrics name: those
    of a run alone."""
    import threading

    import torch

    import distattn.train
    from distattn.compare import stages
    from distattn.models import LMConfig, TransformerLM
    from distattn.train import LMTask, Trainer, load_model, seed_everything
    from distattn.train.recipes import lm_train_config
    data = _lm_data()
    at_epoch_2, release_b, b_wrote_epoch_2, a_done = (threading.Event() for _ in range(4))
    errors, runs = [], {}

    class HeldTask(LMTask):             # run B's: holds B before its epoch-2 selection and after it
        calls = 0

        def evaluate(self, model, device, autocast=None):
            out = super().evaluate(model, device, autocast)
            HeldTask.calls += 1
            if HeldTask.calls == 2:     # epoch 2 evaluated, best.pt not yet written
                at_epoch_2.set()
                assert release_b.wait(120), "run A never finished training"
            elif HeldTask.calls == 3:   # epoch 2's best.pt written (its selection came before epoch 3)
                b_wrote_epoch_2.set()
                assert a_done.wait(120), "run A never stored its model"
            return out

    def run(cache_dir, task_cls=LMTask):
        monkeypatch.setenv("DISTATTN_CACHE_DIR", str(cache_dir))
        seed_everything(0)
        model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=16))
        tcfg = lm_train_config(epochs=3, batch_size=8, lr=3e-3, device="cpu", progress=False, quiet=True,
                               warmup_steps=2, select_on="val/loss", save_best=True)
        return stages._train("lm", model, task_cls(data, {"val": data}), tcfg, {"test": "best"}, cache=True)

    alone = run(tmp_path / "alone")
    losses = [e["eval"]["val"]["loss"] for e in alone.metrics["history"]]
    assert losses[0] > losses[1] > losses[2] and alone.metrics["best"]["epoch"] == 3     # each epoch a new best

    class Hooked(Trainer):              # run A: once fit() is done, B writes its epoch-2 best.pt
        def fit(self):
            result = super().fit()
            if threading.current_thread().name != "run-b":
                release_b.set()
                assert b_wrote_epoch_2.wait(120), "run B never wrote its epoch-2 best.pt"
            return result
    monkeypatch.setattr(distattn.train, "Trainer", Hooked)

    def run_b():
        try:
            runs["b"] = stages._train("lm", *b_args, cache=True)
        except BaseException as exc:    # noqa: BLE001 (re-raised in the main thread)
            errors.append(exc)
            at_epoch_2.set()
            b_wrote_epoch_2.set()
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "shared"))
    seed_everything(0)
    b_model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_len=16))
    b_args = (b_model, HeldTask(data, {"val": data}),
              lm_train_config(epochs=3, batch_size=8, lr=3e-3, device="cpu", progress=False, quiet=True,
                              warmup_steps=2, select_on="val/loss", save_best=True), {"test": "best"})
    thread = threading.Thread(target=run_b, name="run-b")
    thread.start()
    try:
        assert at_epoch_2.wait(120) and not errors, errors
        runs["a"] = run(tmp_path / "shared")
    finally:
        a_done.set()
        release_b.set()
        thread.join(120)
    assert not thread.is_alive() and not errors, errors
    expected = alone.model.state_dict()
    entry = runs["a"].checkpoint.parent
    assert runs["a"].metrics["best"]["epoch"] == 3
    for name, model in (("A", runs["a"].model), ("the entry", load_model(entry / "model.pt")),
                        ("B", runs["b"].model)):
        got = model.state_dict()
        assert all(torch.equal(got[k], expected[k]) for k in expected), f"{name} holds other weights than epoch 3's"
    assert json.loads((entry / "done.json").read_text())["weights_sha256"] == alone.weights_sha256


def _damaged_lm_entry(tmp_path, monkeypatch):
    """A finished tiny-LM models-stage entry whose model.pt is cut short."""
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    first = _tiny_lm_run(_lm_data(), True)
    entry = first.checkpoint.parent
    blob = first.checkpoint.read_bytes()
    first.checkpoint.write_bytes(blob[: len(blob) // 2])
    return entry


def test_a_damaged_model_entry_is_removed_under_the_exclusive_lock(tmp_path, monkeypatch, caplog):
    """A run finding a finished entry damaged removed it holding the entry's lock only shared: beside
    another reader, whose files went from under it."""
    import shutil

    from distattn.compare import stages
    fcntl = pytest.importorskip("fcntl")
    entry = _damaged_lm_entry(tmp_path, monkeypatch)
    seen, rmtree = [], shutil.rmtree

    def probing_rmtree(path, *a, **k):
        if Path(path) == entry:
            probe = os.open(entry / ".lock", os.O_RDONLY)
            try:
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)      # a reader could come in: not exclusive
                seen.append("another reader could read")
            except BlockingIOError:
                seen.append("exclusive")
            finally:
                os.close(probe)
        return rmtree(path, *a, **k)
    monkeypatch.setattr(stages.shutil, "rmtree", probing_rmtree)
    again = _tiny_lm_run(_lm_data(), True)
    assert f"ignoring damaged cache entry {entry}" in caplog.text
    assert seen == ["exclusive"] and (entry / "done.json").exists() and again.checkpoint == entry / "model.pt"


def test_a_damaged_model_entry_another_run_removed_and_trains_in_is_left_to_it(tmp_path, monkeypatch):
    """Run A finds the entry damaged; before A removes it, run B (which found the same) removes it and
    starts training there. A removed the entry again, B's checkpoint with it; it now removes it only if
    it still holds a finished, damaged model, and otherwise trains beside B in the entry."""
    import shutil

    import distattn.train
    entry = _damaged_lm_entry(tmp_path, monkeypatch)
    load_model, calls = distattn.train.load_model, []

    def load_then_b_takes_over(path, *a, **k):
        calls.append(path)
        try:
            return load_model(path, *a, **k)
        finally:
            if len(calls) == 1:         # B: the damaged entry removed, its own training begun
                shutil.rmtree(entry)
                entry.mkdir()
                (entry / "checkpoint.pt").write_bytes(b"run B's checkpoint")

    class Stop(Exception):
        pass

    class NoTraining:
        def __init__(self, *a, **k):
            raise Stop
    monkeypatch.setattr(distattn.train, "load_model", load_then_b_takes_over)
    monkeypatch.setattr(distattn.train, "Trainer", NoTraining)
    with pytest.raises(Stop):               # A reached its own training, in the entry B trains in
        _tiny_lm_run(_lm_data(), True)
    assert len(calls) == 1 and (entry / "checkpoint.pt").read_bytes() == b"run B's checkpoint"


def test_a_model_entry_lock_removed_while_waited_for_is_taken_afresh(tmp_path, monkeypatch):
    """A run that waits for an entry's lock while another removes the entry (load_entry, finding it
    damaged) must not go on holding the lock of a file no longer there, beside a run that locks the
    new one."""
    import shutil

    from distattn.compare import stages
    fcntl = pytest.importorskip("fcntl")
    d = tmp_path / "train-lm-0"
    calls, flock = [], fcntl.flock

    def removed_while_waiting(fd, op):
        calls.append(op)
        if len(calls) == 1:
            shutil.rmtree(d)            # meanwhile another run removes the entry
        return flock(fd, op)
    monkeypatch.setattr(fcntl, "flock", removed_while_waiting)
    with stages._entry_lock(d):
        held = os.stat(d / ".lock")
        monkeypatch.setattr(fcntl, "flock", flock)
        probe = os.open(d / ".lock", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):            # the file there now is the one locked
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(probe)
    assert len(calls) == 2 and held.st_ino == os.stat(d / ".lock").st_ino


@pytest.mark.parametrize("order", ["ours-cached-first", "ours-no-cache-first", "ours-no-cache-second"])
def test_a_run_directory_holds_the_weights_its_run_used(tmp_path, monkeypatch, order):
    """run.py hard-linked each model's entry model.pt into the run directory's checkpoints/ after the
    last model had finished; a --no-cache run of the same config that stored its model in between
    replaced the entry's file, so the run directory held another run's weights beside this run's
    metrics and analyses. The entry is no longer replaced once finished, and a run whose entry holds
    other weights (a --no-cache run that found it finished: "ours-no-cache-second", which passed
    before too) saves its own model there."""
    from types import SimpleNamespace

    import torch

    import distattn.compare.run as run_mod
    from distattn.compare.config import CompareConfig
    from distattn.compare.stages import _weights_sha256
    from distattn.train import load_model
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    data = _lm_data()
    ours = {}

    def stage_models(*args, **kwargs):
        if order == "ours-no-cache-second":     # another run's model already in the entry
            _tiny_lm_run(data, True, _shifted(2.0))
        ours["lm"] = _tiny_lm_run(data, order == "ours-cached-first", _shifted(1.0))
        if order != "ours-no-cache-second":     # another (--no-cache) run finishes before this one links
            _tiny_lm_run(data, False, _shifted(2.0))
        return dict(ours)

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop
    monkeypatch.setattr(run_mod, "load_data", lambda *a, **k: SimpleNamespace(describe={}, clf_train=None))
    monkeypatch.setattr(run_mod, "stage_statistics", lambda *a, **k: SimpleNamespace(key="s"))
    monkeypatch.setattr(run_mod, "stage_projection", lambda *a, **k: [])
    monkeypatch.setattr(run_mod, "stage_models", stage_models)
    monkeypatch.setattr(run_mod, "cached_analysis", stop)          # the checkpoints are linked before it
    corpus = synthetic_jsonl(tmp_path / "c.jsonl", n_docs=20)
    cfg = CompareConfig(corpus="text", path=str(corpus), out=str(tmp_path / "runs"), profile="quick").validate()
    run_dir = tmp_path / "runs" / "run"
    for sub in ("figures", "graphs", "checkpoints"):
        (run_dir / sub).mkdir(parents=True)
    with pytest.raises(Stop):
        run_mod._study(cfg, run_dir, "quick", cfg.sizes(), torch.device("cpu"), order == "ours-cached-first",
                       False)
    kept = load_model(run_dir / "checkpoints" / "lm.pt")
    assert _weights_sha256(kept) == _weights_sha256(ours["lm"].model)
    assert ours["lm"].metrics["shift"] == 1.0


def test_the_analysis_entry_is_keyed_by_the_weights_the_run_used(tmp_path, monkeypatch):
    """The analysis stage's key named each model by its entry only. A --no-cache run that found the
    entry finished by another run keeps its own weights (and a damaged entry is trained again), so a
    cached run could reuse an analysis of other weights than its models hold: the key now has their
    sha256 too. Here the two runs' weights differ (as on a GPU)."""
    from types import SimpleNamespace

    from distattn.compare.config import CompareConfig
    from distattn.compare.run import analysis_dir
    from distattn.compare.stages import _weights_sha256
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    data = _lm_data()
    stored = _tiny_lm_run(data, True, _shifted(1.0))
    own = _tiny_lm_run(data, False, _shifted(2.0))        # --no-cache: the entry is finished, keeps its own
    again = _tiny_lm_run(data, True)                      # a later cached run: the stored entry
    assert own.checkpoint == stored.checkpoint == again.checkpoint
    assert _weights_sha256(own.model) != _weights_sha256(stored.model) == _weights_sha256(again.model)
    sizes = CompareConfig(corpus="paper").validate().sizes()
    data_key, stats = SimpleNamespace(key="d"), SimpleNamespace(key="s")
    key = {n: analysis_dir(data_key, stats, {"lm": m}, sizes)[1] for n, m in
           (("stored", stored), ("own", own), ("again", again))}
    assert key["own"] != key["stored"] == key["again"]


def test_a_bad_max_memory_setting_fails_the_compare_before_any_stage(tmp_path, capsys, monkeypatch):
    """The setting was read only by a memory check; a warm run met the first one in the paper
    reproduction, after the data and every cached stage had been loaded. It is now refused at once."""
    import distattn.compare.run as run_module

    def no_stage(*args, **kwargs):
        raise AssertionError("a stage ran before the bad DISTATTN_MAX_MEMORY was refused")

    monkeypatch.setattr(run_module, "load_data", no_stage)
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", "-5")
    code, out, err = run_cli(["--corpus", "text", "--path", str(synthetic_jsonl(tmp_path / "c.jsonl")),
                              "--no-models", "--out", str(tmp_path / "runs"), "-q"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == ("error: DISTATTN_MAX_MEMORY='-5' is invalid; allowed: a number of bytes >= 0, "
                           "optionally with a K, M, G or T suffix (e.g. 8G)"), err
    assert not (tmp_path / "runs").exists()
