"""``benchmarks/bench_models.py --set KEY=JSON``: the sizes a GPU session may change without
editing the script, checked before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_models  # noqa: E402

FULL = bench_models.SIZES["full"]


def test_overrides_parse_to_the_defaults_kinds():
    got = bench_models.parse_overrides(["pre_epochs=12", "pre_lr=1e-3", "ft_lrs=[0.0001, 0.0003]",
                                        'compile="max-autotune"', "mfu_variants=[[512, true]]"], FULL)
    assert got == {"pre_epochs": 12, "pre_lr": 1e-3, "ft_lrs": (0.0001, 0.0003), "compile": "max-autotune",
                   "mfu_variants": ((512, True),)}
    assert bench_models.parse_overrides(['seedsplit_splits=["random_25k_25k"]'], FULL) == {
        "seedsplit_splits": ("random_25k_25k",)}
    assert bench_models.parse_overrides([], FULL) == {}


@pytest.mark.parametrize("item, message", [
    ("epochs=3", "KEY one of"),                         # not a size of the profile
    ("pre_epochs", "expected KEY=VALUE"),
    ("pre_epochs=six", "must be JSON"),
    ("pre_epochs=2.5", "takes a int like 6"),
    ("pre_epochs=true", "takes a int like 6"),
    ("ft_truncation=3", "takes a str like 'head'"),
    ('seedsplit_splits=["random_1k"]', r"unknown split\(s\) \['random_1k'\]; known: \['movie_disjoint_40k_10k', 'random_25k_25k'"),
    ("seedsplit_seeds=[0, 3, 0]", r"seedsplit_seeds: \[0, 3, 0\] must be distinct non-negative integers"),
    ("seedsplit_seeds=[-1]", r"seedsplit_seeds: \[-1\] must be distinct"),
    ("seedsplit_seeds=[1.5]", r"seedsplit_seeds: \[1.5\] must be distinct"),
    # seedvar's seeds too: a repeated one resumed the first's finished run (the same accuracy, ~0 s),
    # a negative one failed in TrainConfig after the warm-up, a float in the run directory's name
    ("extra_seeds=[1, 1]", r"extra_seeds: \[1, 1\] must be distinct non-negative integers"),
    ("extra_seeds=[-1]", r"extra_seeds: \[-1\] must be distinct"),
])
def test_bad_overrides_name_the_value_and_what_is_allowed(item, message):
    with pytest.raises(SystemExit, match=message):
        bench_models.parse_overrides([item], FULL)


def _labelled(n_train: int, n_test: int, seed: int = 0) -> dict:
    """Tiny random prepared arrays in the shape ``part_seedsplit`` reads (alternating labels)."""
    import numpy as np

    from distattn.corpus.ragged import RaggedIds

    rng = np.random.default_rng(seed)

    def docs(n):
        lengths = rng.integers(3, 12, n)
        return RaggedIds(rng.integers(2, 50, lengths.sum()).astype(np.int32),
                         np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    return {"train": docs(n_train), "test": docs(n_test), "train_labels": np.arange(n_train) % 2,
            "test_labels": np.arange(n_test) % 2, "vocab_from": "train+unsup", "tokenizer": "regex"}


def _seedsplit(data, runs, *overrides):
    from types import SimpleNamespace

    smoke = bench_models.SIZES["smoke"]
    sizes = {**smoke, **bench_models.parse_overrides(list(overrides), smoke)}
    return sizes, bench_models.part_seedsplit(data, SimpleNamespace(sizes=sizes, runs=runs, out=runs),
                                              bench_models.torch.device("cpu"))


def test_seedsplit_runs_only_the_chosen_splits(tmp_path):
    """``seedsplit_splits`` picks which random splits of train+test the seed recipe runs (tiny sizes)."""
    sizes, out = _seedsplit(_labelled(40, 40), tmp_path, 'seedsplit_splits=["random_40k_10k"]')
    assert [(r["split"], r["seed"], r["n_train"], r["n_test"]) for r in out["runs"]] == [("random_40k_10k", 0, 64, 16)]
    assert len(out["runs"][0]["test_accuracy_per_epoch"]) == sizes["seed_epochs"]


def test_seedsplit_seeds_train_one_model_per_seed_on_the_same_split(tmp_path):
    """``seedsplit_seeds`` trains one model per seed on one fixed split, each in its own run directory:
    another seed trains another model; the same seed in a fresh directory trains the same one again."""
    import json

    data = _labelled(80, 80, seed=1)
    split = 'seedsplit_splits=["random_25k_25k"]'
    _, out = _seedsplit(data, tmp_path / "a", split, "seedsplit_seeds=[0, 3]")
    assert [(r["split"], r["seed"], r["n_train"]) for r in out["runs"]] == [("random_25k_25k", s, 80) for s in (0, 3)]

    def losses(run_dir):
        return [h["train_loss"] for h in json.loads((run_dir / "metrics.json").read_text())["history"]]
    first, other = tmp_path / "a" / "seedsplit_random_25k_25k", tmp_path / "a" / "seedsplit_random_25k_25k_s3"
    assert losses(first) != losses(other)
    _, again = _seedsplit(data, tmp_path / "b", split, "seedsplit_seeds=[0]")
    assert losses(tmp_path / "b" / "seedsplit_random_25k_25k") == losses(first)
    assert again["runs"][0]["test_accuracy_per_epoch"] == out["runs"][0]["test_accuracy_per_epoch"]


def test_the_movie_disjoint_split_holds_out_whole_movies_and_reports_the_shared_share(tmp_path):
    """``movie_disjoint_40k_10k`` keeps the 40k/10k sizes but tests on movies no training review is
    about (as the official split does); every run records the share of test reviews whose movie
    the training reviews cover, which a random split of reviews leaves high."""
    from distattn.corpus import movie_disjoint_split

    data = _labelled(120, 80, seed=2)
    rng = np.random.default_rng(3)
    data["train_movies"], data["test_movies"] = rng.integers(0, 40, 120), rng.integers(0, 40, 80)
    split = 'seedsplit_splits=["movie_disjoint_40k_10k", "random_40k_10k"]'
    _, out = _seedsplit(data, tmp_path, split)
    disjoint, rand = out["runs"]
    movies = np.concatenate([data["train_movies"], data["test_movies"]])
    tr, te = movie_disjoint_split(movies, 200 // 5, seed=42)
    assert (disjoint["split"], disjoint["n_train"], disjoint["n_test"]) == ("movie_disjoint_40k_10k", len(tr), len(te))
    assert disjoint["n_test"] >= 40 and disjoint["n_train"] + disjoint["n_test"] == 200
    assert disjoint["test_reviews_whose_movie_is_in_train"] == 0.0
    assert (rand["n_train"], rand["n_test"]) == (160, 40) and rand["test_reviews_whose_movie_is_in_train"] > 0.5


def test_the_movie_disjoint_split_is_refused_on_arrays_without_movies(tmp_path):
    with pytest.raises(ValueError, match=r"split 'movie_disjoint_40k_10k' needs each review's movie.*rebuild them "
                                         r"with benchmarks/prepare_imdb.py"):
        _seedsplit(_labelled(40, 40), tmp_path, 'seedsplit_splits=["movie_disjoint_40k_10k"]')
    assert not (tmp_path / "seedsplit_movie_disjoint_40k_10k").exists()      # refused before training


def test_a_call_with_the_movie_disjoint_split_is_refused_before_any_part_trains(tmp_path, monkeypatch):
    """On arrays without movies, ``seedvar,seedsplit`` must fail before seedvar's runs, not after them."""
    with pytest.raises(ValueError, match="rebuild them with benchmarks/prepare_imdb.py"):
        _main(monkeypatch, "--part", "seedvar,seedsplit", "--smoke", "--prep",
              str(_tiny_prep(tmp_path / "old.npz", movies=False)), "--out", str(tmp_path / "out"))
    assert not list((tmp_path / "out").rglob("metrics.json"))
    _main(monkeypatch, "--part", "seedsplit", "--smoke", "--set", 'seedsplit_splits=["random_40k_10k"]', "--prep",
          str(_tiny_prep(tmp_path / "old.npz", movies=False)), "--out", str(tmp_path / "out2"))   # the others still run


def test_smoke_subsampling_keeps_each_reviews_movie(tmp_path):
    """``--smoke`` takes a few hundred reviews; their movies must be taken with them."""
    path = _tiny_prep(tmp_path / "p.npz", movies=False)
    arrays = dict(np.load(path))
    arrays["train_movies"], arrays["test_movies"] = np.arange(300, dtype=np.int32), np.arange(300, 420, dtype=np.int32)
    np.savez(path, **arrays)
    full = bench_models.load_data(str(path), smoke=False)
    smoke = bench_models.load_data(str(path), smoke=True)
    for split in ("train", "test"):
        idx = smoke[f"{split}_movies"] - (0 if split == "train" else 300)     # each movie code is its review's index
        assert np.array_equal(smoke[f"{split}_labels"], full[f"{split}_labels"][idx])
        assert np.array_equal(smoke[split].take(np.arange(3)).ids, full[split].take(idx[:3]).ids)
    assert bench_models.load_data(str(_tiny_prep(tmp_path / "old.npz", movies=False)), smoke=True)["train_movies"] is None


def _tiny_prep(path: Path, movies: bool = True) -> Path:
    """A prepared-arrays file in ``prepare_imdb.py``'s layout, big enough for ``--smoke``."""
    import numpy as np

    rng = np.random.default_rng(0)
    # the classifiers' vocabulary is 30k; rows B, D-I load these as PPMI-SVD vectors
    arrays = {"vocab_from": np.array("train+unsup"), "svd": rng.standard_normal((30_000, 32)).astype(np.float32)}
    for split, n in (("train", 300), ("test", 120), ("unsup", 300)):
        lengths = rng.integers(3, 12, n)
        arrays[f"{split}_ids"] = rng.integers(2, 50, lengths.sum()).astype(np.int32)
        arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if split != "unsup":
            arrays[f"{split}_labels"] = np.arange(n) % 2
            arrays[f"{split}_movies"] = rng.integers(0, 60, n).astype(np.int32)     # as prepare_imdb.py writes
    if not movies:                  # a file made before prepare_imdb.py wrote each review's movie
        arrays = {k: v for k, v in arrays.items() if not k.endswith("_movies")}
    np.savez(path, **arrays)
    return path


def _main(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["bench_models.py", *argv])
    bench_models.main()


def test_resume_keeps_the_runs_and_says_so_while_a_plain_run_starts_fresh(tmp_path, monkeypatch):
    """Without ``--resume`` the runs directory is emptied, so every figure comes from a fresh run;
    ``--resume`` keeps its checkpoints (a long CPU run cut short goes on) and names them in info."""
    import json

    prep, out = _tiny_prep(tmp_path / "prep.npz"), tmp_path / "out"
    common = ["--part", "seedvar", "--smoke", "--prep", str(prep), "--out", str(out)]
    _main(monkeypatch, *common)
    first = json.loads((out / "seedvar.json").read_text())
    ckpt = out / "runs" / "seed_engine_s1" / "checkpoint.pt"
    assert first["info"]["resumed_from"] == [] and ckpt.exists()

    stamp = (ckpt.stat().st_mtime_ns, ckpt.read_bytes())
    stray = out / "runs" / "stray" / "checkpoint.pt"
    stray.parent.mkdir()
    stray.write_bytes(b"left by an older run")
    _main(monkeypatch, *common, "--resume")
    resumed = json.loads((out / "seedvar.json").read_text())
    assert resumed["info"]["resumed_from"] == ["seed_engine_s1", "stray"] and stray.exists()
    # the finished run was resumed, not retrained: its checkpoint untouched, the same accuracy
    assert (ckpt.stat().st_mtime_ns, ckpt.read_bytes()) == stamp
    assert resumed["runs"][0]["test_accuracy"] == first["runs"][0]["test_accuracy"]

    _main(monkeypatch, *common)
    assert not stray.exists() and ckpt.stat().st_mtime_ns != stamp[0]     # trained again from scratch
    assert json.loads((out / "seedvar.json").read_text())["info"]["resumed_from"] == []


def test_every_part_of_the_gpu_benchmark_runs_at_smoke_size(tmp_path, monkeypatch):
    """The owed GPU calls (``gpu_check.sh``) run these parts; a code path broken since the last GPU
    session would only show on the lent machine, at the cost of its minutes. At smoke size each part
    writes its JSON, every ablation row trains (or is named as skipped), and nothing records an error."""
    import json

    prep, out = _tiny_prep(tmp_path / "prep.npz"), tmp_path / "out"
    _main(monkeypatch, "--part", "all", "--smoke", "--prep", str(prep), "--out", str(out))
    parts = {p: json.loads((out / f"{p}.json").read_text())
             for p in ("seed", "lm", "mfu", "best", "seedvar", "seedsplit")}
    assert "error" not in json.dumps(parts)
    rows = {r["name"].split("_")[0]: r for r in parts["best"]["rows"]}
    assert set("ABCDEFGHI") <= set(rows) and "FI" in rows
    for letter in "ABCDEFGHI":
        assert 0.0 <= rows[letter]["test_accuracy_at_best_val"] <= 1.0, rows[letter]
    assert parts["best"]["selected_by_val"]["val_accuracy"] == max(
        r["val_accuracy"] for r in parts["best"]["rows"] if "val_accuracy" in r)
    assert [r["tokens_per_s"] > 0 for r in parts["mfu"]["runs"]] == [True]
    assert [r["split"] for r in parts["seedsplit"]["runs"]] == ["random_25k_25k", "random_40k_10k",
                                                                "movie_disjoint_40k_10k"]
    assert parts["seedsplit"]["runs"][-1]["test_reviews_whose_movie_is_in_train"] == 0.0
    assert len(parts["seedvar"]["runs"]) == 1
    assert sorted(p.name for p in out.glob("probs_*.npz")) == sorted(
        f"probs_{r['name']}.npz" for r in parts["best"]["rows"] if "members" not in r)    # every row, A-D too
    with np.load(out / "probs_B_ppmi_svd_init_256.npz") as z:      # the val-best weights give the val accuracy
        assert ((z["val"] >= 0.5) == (z["val_labels"] == 1)).mean() == pytest.approx(rows["B"]["val_accuracy"])


def test_a_pretraining_that_fails_to_compile_is_retried_without_compile(tmp_path, monkeypatch, capsys):
    """torch.compile failing on the lent machine costs the row a retry, not the whole ``best`` part
    (as in the ``lm`` part); the row records that it ran without compile."""
    import json

    class NoCompiler(bench_models.Trainer):
        def fit(self):
            if self.config.compile:
                raise RuntimeError("stand-in for a torch.compile backend failure")
            return super().fit()

    monkeypatch.setattr(bench_models, "Trainer", NoCompiler)
    prep, out = _tiny_prep(tmp_path / "prep.npz"), tmp_path / "out"
    _main(monkeypatch, "--part", "best", "--rows", "F", "--smoke", "--set", "compile=true", "--prep", str(prep),
          "--out", str(out))
    row = next(r for r in json.loads((out / "best.json").read_text())["rows"] if r["name"].startswith("F"))
    assert row["pretrain_compile"] is False and 0.0 <= row["test_accuracy_at_best_val"] <= 1.0
    assert "retrying without compile" in capsys.readouterr().out
    assert any(p.name.endswith("_nocompile") for p in (out / "runs").iterdir())
    # the lm part's engine run goes through the same retry
    _main(monkeypatch, "--part", "lm", "--smoke", "--set", "compile=true", "--prep", str(prep), "--out", str(out))
    engine = json.loads((out / "lm.json").read_text())["engine"]
    assert engine["compile"] is False and engine["tokens_per_s"] > 0 and (out / "runs" / "lm4_nocompile").is_dir()


@pytest.mark.parametrize("argv, message", [
    (["--part", "seed,seedspilt"], r"--part: unknown part\(s\) \['seedspilt'\]; known: .*seedsplit"),
    (["--part", "best", "--rows", "FI"], r"--rows: unknown row\(s\) \['FI'\]; rows are letters A-I"),
    (["--part", "best", "--rows", "F, I"], r"--rows: unknown row\(s\) \[' I'\]"),
])
def test_a_misspelt_part_or_row_is_refused_before_anything_runs(tmp_path, monkeypatch, argv, message):
    """A typo in ``--part`` failed with a KeyError only after the parts before it had run (on the lent
    machine, their minutes); one in ``--rows`` ran no row at all and still wrote a best.json."""
    prep, out = _tiny_prep(tmp_path / "prep.npz"), tmp_path / "out"
    ran = []
    monkeypatch.setattr(bench_models, "load_data", lambda *a: ran.append(a))
    with pytest.raises(SystemExit, match=message):
        _main(monkeypatch, *argv, "--smoke", "--prep", str(prep), "--out", str(out))
    assert ran == [] and not out.exists()          # nor was the runs directory emptied


def test_a_prepared_arrays_file_named_but_missing_is_refused_by_name(tmp_path, monkeypatch):
    """``--prep PATH`` naming no file (not carried to the device, a typo) fell back to building the
    arrays from the corpus: without the archive there the call failed with "IMDB archive not found"
    after a download attempt, never naming PATH; with it, it spent minutes building 256-d vectors
    where PATH held 512-d ones."""
    import prepare_imdb

    built = []
    monkeypatch.setattr(prepare_imdb, "build_arrays", lambda *a, **k: built.append(a) or {})
    missing, out = tmp_path / "prep512" / "imdb_prep.npz", tmp_path / "out"
    with pytest.raises(SystemExit, match=rf"--prep {missing}: no such file"):
        _main(monkeypatch, "--part", "best", "--rows", "F", "--smoke", "--prep", str(missing), "--out", str(out))
    assert built == [] and not out.exists()


def _owed_gpu_calls() -> list[tuple[list[str], str]]:
    """``(arguments after gpu_check.sh, carry)`` of each call in the results README's table of owed GPU
    calls; a row reading "the same with `--rows H`" (", then `--rows E`") is the row above with those rows."""
    import re
    import shlex

    text = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "README.md").read_text()
    table = text[text.index("| figure | command | carry |"):].split("\n\n")[0].splitlines()[2:]
    calls, last = [], None
    for line in table:
        _, command, carry = [c.strip() for c in line.strip("|").split("|")]
        carry = carry.strip("`")
        full = re.findall(r"`bash benchmarks/gpu_check\.sh ([^`]*)`", command)
        if full:
            last = shlex.split(full[0])
            calls.append((last, carry))
        elif command.startswith("the same with"):
            for rows in re.findall(r"`--rows ([^`]*)`", command):
                args = list(last)
                args[args.index("--rows") + 1] = rows
                calls.append((args, carry))
    return calls


def test_the_readme_lists_the_owed_gpu_calls():
    calls = _owed_gpu_calls()
    assert [args[0] for args, _ in calls] == ["best", "best", "best", "best", "seedvar,seedsplit"]
    assert [args[args.index("--rows") + 1] for args, _ in calls if "--rows" in args] == ["F,I", "H", "G", "E"]
    # the one-call session (compare, seed, lm, mfu) ran in session 82: no longer owed, and the
    # first call is now rows F and I with the 512-d arrays; the script stays, named in the README
    text = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "README.md").read_text()
    table = text[text.index("| figure | command | carry |"):].split("\n\n")[0]
    assert "gpu_session.sh" not in table
    assert calls[0] == (["best", "--rows", "F,I", "--prep", ".gpu/prep512/imdb_prep.npz"], ".gpu/prep512")
    assert "`bash benchmarks/gpu_session.sh`" in text
    assert (Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_session.sh").is_file()


@pytest.mark.parametrize("args, carry", _owed_gpu_calls(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_each_owed_gpu_call_runs_at_smoke_size_from_what_it_carries(tmp_path, monkeypatch, args, carry):
    """Each call of the results README's table, as ``gpu_check.sh`` hands it to ``bench_models.py``
    (``--part PART`` and the rest), at smoke size: its flags parse, its parts and rows run and write
    their files, and its prepared arrays come from the folder the table says to carry."""
    import json

    part, rest = args[0], args[1:]
    prep = rest[rest.index("--prep") + 1] if "--prep" in rest else bench_models.DEFAULT_PREP
    assert Path(prep).parent.as_posix() == carry, f"{args}: --prep {prep} is not in the carried {carry}"
    if "--prep" in rest:
        rest = rest[:rest.index("--prep")] + rest[rest.index("--prep") + 2:]
    out = tmp_path / "out"
    _main(monkeypatch, "--part", part, *rest, "--smoke", "--prep", str(_tiny_prep(tmp_path / "prep.npz")),
          "--out", str(out))
    for p in part.split(","):
        result = json.loads((out / f"{p}.json").read_text())
        assert "error" not in json.dumps(result), result
    if "--rows" in rest:
        letters = set(rest[rest.index("--rows") + 1].split(","))
        rows = json.loads((out / "best.json").read_text())["rows"]
        assert {r["name"].split("_")[0] for r in rows if "members" not in r} == letters
        assert {p.name.split("_")[1] for p in out.glob("probs_*.npz")} == letters
    if "seedsplit" in part:
        runs = json.loads((out / "seedsplit.json").read_text())["runs"]
        overrides = bench_models.parse_overrides([rest[i + 1] for i, a in enumerate(rest) if a == "--set"],
                                                 bench_models.SIZES["full"])
        splits = overrides.get("seedsplit_splits", bench_models.SIZES["full"]["seedsplit_splits"])
        assert [(r["split"], r["seed"]) for r in runs] == [(n, s) for n in splits for s in overrides["seedsplit_seeds"]]


@pytest.mark.parametrize("part, overrides", [("seedsplit", ["--set", "seedsplit_seeds=[0, 1]"]),
                                             ("seedvar", ["--set", "extra_seeds=[1, 2, 3]"])])
def test_a_part_cut_short_keeps_its_finished_runs(tmp_path, monkeypatch, part, overrides):
    """A device call is killed at its time limit; ``gpu_check.sh`` brings back what ``--out`` holds by
    then. ``seedvar`` and ``seedsplit`` wrote their JSON only when every run had finished, so a call cut
    during the splits' six runs kept none of the finished ones there (``best`` writes best_partial.json)."""
    import json

    class CutAtThirdRun(bench_models.Trainer):
        fits = 0

        def fit(self):
            CutAtThirdRun.fits += 1
            if CutAtThirdRun.fits == 3:
                raise KeyboardInterrupt("stand-in for the device's time limit")
            return super().fit()

    monkeypatch.setattr(bench_models, "Trainer", CutAtThirdRun)
    prep, out = _tiny_prep(tmp_path / "prep.npz"), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _main(monkeypatch, "--part", part, *overrides, "--smoke", "--prep", str(prep), "--out", str(out))
    assert not (out / f"{part}.json").exists()
    runs = json.loads((out / f"{part}_partial.json").read_text())["runs"]
    assert len(runs) == 2 and all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs)
    assert [r["seed"] for r in runs] == ([0, 1] if part == "seedsplit" else [1, 2])


def test_prepare_imdb_refuses_an_unknown_vocabulary_source_before_reading_the_corpus(monkeypatch):
    """``vocab_from`` names the splits the 30k vocabulary is counted on; a typo must not cost the
    tokenization of 100k reviews before failing somewhere inside the corpus's split parser."""
    import distattn.corpus
    import prepare_imdb

    def corpus_read(*a, **k):
        raise AssertionError("the corpus was read before vocab_from was checked")

    monkeypatch.setattr(distattn.corpus, "get_corpus", corpus_read)
    with pytest.raises(ValueError, match=r"vocab_from='train\+tset': expected one of train\+unsup, train\+test"):
        prepare_imdb.build_arrays(with_svd=False, vocab_from="train+tset")
    monkeypatch.setattr(sys, "argv", ["prepare_imdb.py", "--vocab-from", "test"])
    with pytest.raises(SystemExit):
        prepare_imdb.main()


@pytest.mark.parametrize("tokenizer, kind", [("regex", "RegexTokenizer"), ("seed-literal", "SeedLiteralTokenizer")])
def test_prepare_imdb_tokenizes_with_the_tokenizer_named_and_refuses_others_before_reading(monkeypatch, tokenizer,
                                                                                         kind):
    """``--tokenizer seed-literal`` measures the seed's ``simple_tokenize`` as printed (punctuation
    attached) against the toolkit's tokenizer; the corpus must be tokenized with the one named."""
    import distattn.corpus
    import prepare_imdb
    used = []

    def tokenize(corpus, tokenizer=None, **kw):
        used.append(type(tokenizer).__name__)
        raise KeyboardInterrupt("stop once the tokenizer is chosen")

    monkeypatch.setattr(distattn.corpus, "get_corpus", lambda name: name)
    monkeypatch.setattr(distattn.corpus, "tokenize_corpus", tokenize)
    with pytest.raises(KeyboardInterrupt):
        prepare_imdb.build_arrays(with_svd=False, tokenizer=tokenizer)
    assert used == [kind]
    with pytest.raises(ValueError, match=r"tokenizer='seed': expected one of regex, seed-literal"):
        prepare_imdb.build_arrays(with_svd=False, tokenizer="seed")
    assert used == [kind]


@pytest.mark.parametrize("part, svd", [("seed,lm,mfu", False), ("seed,best", True)])
def test_arrays_built_from_the_corpus_get_ppmi_svd_vectors_only_for_the_best_part(tmp_path, monkeypatch, part, svd):
    """With no prepared file (the one-call GPU session carries the archive, not the arrays), the
    arrays are built from the corpus; the PPMI-SVD vectors took part of that build for every part,
    though only ``best``'s rows use them."""
    import prepare_imdb

    asked = []

    def build(dim, with_svd=True, log=print, **kw):
        asked.append(with_svd)
        raise KeyboardInterrupt("stop after the build was asked for")

    monkeypatch.setattr(prepare_imdb, "build_arrays", build)
    monkeypatch.setattr(bench_models, "DEFAULT_PREP", str(tmp_path / "absent" / "imdb_prep.npz"))
    with pytest.raises(KeyboardInterrupt):
        _main(monkeypatch, "--part", part, "--smoke", "--out", str(tmp_path / "out"))
    assert asked == [svd]
