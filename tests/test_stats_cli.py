import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from distattn.stats.__main__ import main
from distattn.stats.pipeline import StatsConfig, build_statistics


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_paper_corpus(capsys, tmp_path):
    code, out, err = run_cli(["--corpus", "paper", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["vocab_size"] == 7 and summary["cooc_nnz"] == 24
    S = sp.load_npz(tmp_path / "cooc.npz")
    assert S[1, 2] == 6 and (abs(S - S.T)).sum() == 0            # bank-loan = 6, symmetric
    assert sp.load_npz(tmp_path / "ppmi.npz").min() >= 0


def test_text_corpus_with_embeddings(capsys, tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    lines = [" ".join(rng.choice(words, size=30)) for _ in range(60)]
    (tmp_path / "c.txt").write_text("\n".join(lines))
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--window", "3",
                              "--svd-dim", "5", "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["vocab_size"] == 42 and summary["documents"] == 60 and summary["tokens"] == 1800
    assert np.load(tmp_path / "o" / "embeddings.npy").shape == (42, 5)
    # the second run reuses the cached counts: counting again would fail
    monkeypatch.setattr("distattn.stats.pipeline.cooccurrence",
                        lambda *a, **k: pytest.fail("the cached co-occurrence counts were not reused"))
    stats = build_statistics(StatsConfig(corpus="text", path=str(tmp_path / "c.txt"), split="", window=3))
    assert (stats.cooc != sp.load_npz(tmp_path / "o" / "cooc.npz")).nnz == 0


def test_a_text_corpus_records_no_imdb_split_and_shares_the_cached_counts(capsys, tmp_path, monkeypatch):
    """StatsConfig(corpus="text") kept split="train+test+unsup": stats.json claimed an IMDB split for
    the user's own file, and the split went into the cache key, so the Python default and the
    command line (which passes "") counted the same documents twice under two keys."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c d a b\nc d e f a\nb c a d e\n")
    code, _, err = run_cli(["--corpus", "text", "--path", str(corpus), "--window", "2"], capsys)
    assert code == 0, err
    config = StatsConfig(corpus="text", path=str(corpus), window=2)
    assert config.split is None and StatsConfig(corpus="paper").split is None
    assert StatsConfig().split == StatsConfig(corpus="imdb").split == "train+test+unsup"    # IMDB as before
    monkeypatch.setattr("distattn.stats.pipeline.cooccurrence",
                        lambda *a, **k: pytest.fail("the command line's cached counts were not reused"))
    build_statistics(config, progress=False).save(tmp_path / "o")
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["config"]["split"] is None
    with pytest.raises(ValueError, match=r"split='train' is only used with corpus='imdb', not corpus='text'"):
        StatsConfig(corpus="text", path=str(corpus), split="train").validate()     # it was ignored


def test_a_run_without_embeddings_leaves_no_earlier_embeddings_in_out(capsys, tmp_path):
    # --out held the first run's embeddings.npy (8 rows) beside the second run's vocab.json (6 ids)
    (tmp_path / "a.txt").write_text("a b c d a b\nc d e f a\nb c a d e\n")
    (tmp_path / "b.txt").write_text("x y z x y\nz x y w\n")
    out = tmp_path / "o"
    for name, extra in (("a.txt", ["--svd-dim", "2"]), ("b.txt", [])):
        code, _, err = run_cli(["--corpus", "text", "--path", str(tmp_path / name), "--out", str(out), *extra],
                               capsys)
        assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["cooc.npz", "ppmi.npz", "stats.json", "vocab.json"]


@pytest.mark.parametrize("args, message", [
    (["--corpus", "imbd"], "unknown corpus 'imbd'; valid names: imdb, paper, text"),
    (["--corpus", "text"], "--corpus text needs --path"),
    (["--corpus", "text", "--path", "/no/such/file.txt"], "does not exist"),
    (["--corpus", "paper", "--window", "0"], "window=0 is invalid; allowed: an integer >= 1"),
    (["--corpus", "paper", "--weighting", "linear"], "weighting='linear' is invalid"),
    (["--corpus", "paper", "--cds", "1.5"], "cds=1.5 is invalid"),
    (["--corpus", "paper", "--path", "x.txt"], "--path is only used with --corpus text"),
    (["--corpus", "paper", "--data-dir", "/tmp"],                     # once ignored silently
     "conflicting options: --data-dir is only used with --corpus imdb, not --corpus paper"),
    (["--corpus", "paper", "--split", "test"],                       # once ignored silently
     "conflicting options: --split is only used with --corpus imdb, not --corpus paper"),
    (["--corpus", "paper", "--evaluate"], "--evaluate needs --svd-dim"),
    (["--corpus", "paper", "--jobs", "0"], "--jobs=0 is invalid; allowed: an integer >= 1"),
])
def test_bad_input_exit_2(capsys, args, message):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and message in err and out == ""


def test_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = run_cli(["--corpus", "paper", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "cannot write to --out" in err


def test_bad_values_and_unwritable_out_fail_before_any_counting(capsys, tmp_path, monkeypatch):
    import distattn.stats.__main__ as cli

    def must_not_run(*a, **k):
        raise AssertionError("build_statistics ran although the command was refused")
    monkeypatch.setattr(cli, "build_statistics", must_not_run)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), "--window", "-2",
                              "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "window=-2 is invalid" in err
    assert not (tmp_path / "o").exists()            # a refused command writes nothing
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "cannot write to --out" in err


def test_module_entry_point(tmp_path):
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-m", "distattn.stats", "--corpus", "paper"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["vocab_size"] == 7


def test_the_cooccurrence_name_is_the_function_whatever_was_imported_first():
    """With a lazy export, importing the submodule distattn.stats.cooccurrence first (as
    distattn.stats.pipeline does) left `from distattn.stats import cooccurrence` the module."""
    code = ("import distattn.stats.pipeline, distattn.stats.cooccurrence\n"
            "from distattn.stats import cooccurrence\n"
            "assert callable(cooccurrence) and cooccurrence.__name__ == 'cooccurrence', cooccurrence\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_failed_count_removes_the_out_dir_it_made_and_small_vocabularies_are_still_written(capsys, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "empty.txt"),
                              "--out", str(tmp_path / "new" / "o")], capsys)
    assert code == 2 and err.startswith("error:")
    assert not (tmp_path / "new").exists()                      # once left behind, empty
    (tmp_path / "one.txt").write_text("\n".join(f"w{i % 5}" for i in range(30)))   # one word a document
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "one.txt"), "--svd-dim", "2",
                              "--evaluate", "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err                                       # once a traceback from --evaluate, nothing written
    assert "warning: the co-occurrence matrix is empty" in err and "warning: wordsim353 not scored" in err
    summary = json.loads(out)
    assert "error" in summary["similarity"]["wordsim353"] and (tmp_path / "o" / "cooc.npz").exists()


@pytest.mark.parametrize("value", ["lots", "inf", "-5"])
def test_a_bad_max_memory_setting_is_named(capsys, tmp_path, monkeypatch, value):
    """DISTATTN_MAX_MEMORY=lots once ended with "could not convert string to float: 'LOTS'"
    (inf: an OverflowError traceback; -5: every step refused as needing more than -5 B)."""
    (tmp_path / "c.txt").write_text("a b c a b\nb c a\n")
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", value)
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--no-cache",
                              "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and out == ""
    assert err.strip() == (f"error: DISTATTN_MAX_MEMORY={value!r} is invalid; allowed: a number of bytes >= 0, "
                           "optionally with a K, M, G or T suffix (e.g. 8G)"), err
    assert not (tmp_path / "o").exists()
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", "8G")
    assert run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--no-cache"], capsys)[0] == 0


def test_a_bad_max_memory_setting_is_refused_when_the_statistics_come_from_the_cache(capsys, tmp_path, monkeypatch):
    """The setting was read only by a memory check: with the entry cached none ran, so
    DISTATTN_MAX_MEMORY=12X went unnoticed (exit code 0) and the user believed a limit was in force."""
    (tmp_path / "c.txt").write_text("a b c a b\nb c a\n")
    args = ["--corpus", "text", "--path", str(tmp_path / "c.txt")]
    assert run_cli(args, capsys)[0] == 0                    # the entry is now cached
    monkeypatch.setenv("DISTATTN_MAX_MEMORY", "12X")
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert err.strip() == ("error: DISTATTN_MAX_MEMORY='12X' is invalid; allowed: a number of bytes >= 0, "
                           "optionally with a K, M, G or T suffix (e.g. 8G)"), err


@pytest.mark.parametrize("version", ["v2", "v2-parent", "v1"])
def test_the_default_memory_limit_is_within_the_cgroup_limit(tmp_path, monkeypatch, version):
    """The default budget was 80 % of the host's MemAvailable: in a container (or a batch job) with
    a cgroup memory limit a step that fitted the host passed the check and was killed by the kernel
    at the limit, with no error. Page cache that can be dropped (inactive_file) counts as free."""
    from distattn import memory
    mib = 1 << 20
    root = tmp_path / "cgroup"
    if version == "v1":
        proc, leaf = "12:cpu,cpuacct:/job\n4:memory:/job\n", root / "memory" / "job"
        files = {"memory.limit_in_bytes": 200 * mib, "memory.usage_in_bytes": 120 * mib,
                 "memory.stat": f"cache 0\nhierarchical_memory_limit {300 * mib}\ntotal_inactive_file {20 * mib}\n"}
    else:
        proc, leaf = "0::/user.slice/job\n", root / "user.slice" / "job"
        limited = leaf.parent if version == "v2-parent" else leaf
        limited.mkdir(parents=True)
        leaf.mkdir(exist_ok=True)
        (leaf / "memory.max").write_text("max\n")
        (leaf / "memory.current").write_text(f"{mib}\n")
        files = {"memory.max": 200 * mib, "memory.current": 120 * mib, "memory.stat": f"anon 1\ninactive_file {20 * mib}\n"}
        leaf = limited
    leaf.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (leaf / name).write_text(f"{value}\n")
    (tmp_path / "proc_cgroup").write_text(proc)
    monkeypatch.delenv("DISTATTN_MAX_MEMORY", raising=False)
    monkeypatch.setattr(memory, "_CGROUP_ROOT", str(root), raising=False)
    monkeypatch.setattr(memory, "_PROC_CGROUP", str(tmp_path / "proc_cgroup"), raising=False)
    assert memory.available_memory() == int(0.8 * 100 * mib)          # 200 MiB - (120 - 20) MiB in use
    with pytest.raises(memory.MemoryBudgetError):
        memory.check_memory(90 * mib, "a step")
    if version == "v1":                                                 # v1 writes "no limit" as a huge number
        (leaf / "memory.limit_in_bytes").write_text(f"{1 << 62}\n")
        (leaf / "memory.stat").write_text(f"hierarchical_memory_limit {1 << 62}\n")
    else:
        (leaf / "memory.max").write_text("max\n")
    assert memory.available_memory() > 80 * mib                       # no limit: the host's figure


@pytest.mark.parametrize("args, message", [
    (["--neg", "nan"], "neg=nan is invalid"),
    (["--neg", "inf"], "neg=inf is invalid"),
    (["--svd-dim", "2", "--eig", "nan"], "eig=nan is invalid"),
    (["--eig", "inf"], "eig=inf is invalid"),
])
def test_non_finite_neg_and_eig_are_refused_before_any_counting(capsys, tmp_path, monkeypatch, args, message):
    import distattn.stats.__main__ as cli

    def must_not_run(*a, **k):
        raise AssertionError("build_statistics ran although the command was refused")
    monkeypatch.setattr(cli, "build_statistics", must_not_run)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    code, out, err = run_cli(["--corpus", "text", "--path", str(corpus), *args], capsys)
    assert code == 2 and message in err and out == ""


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated"])
def test_a_damaged_cached_cooccurrence_is_recounted(tmp_path, damage):
    from distattn.paths import cache_dir
    (tmp_path / "c.txt").write_text("a b c d a b\nc d e f a\nb c a d e\n")
    config = StatsConfig(corpus="text", path=str(tmp_path / "c.txt"), split="", window=2)
    before = set((cache_dir() / "stats").glob("cooc-*.npz"))
    first = build_statistics(config, progress=False)
    (entry,) = set((cache_dir() / "stats").glob("cooc-*.npz")) - before
    entry.write_bytes(damage)        # what a crash before the data reached the disk can leave
    again = build_statistics(config, progress=False)
    assert (again.cooc != first.cooc).nnz == 0
    assert (sp.load_npz(entry) != first.cooc).nnz == 0     # and the entry is written again


def test_an_svd_dim_as_large_as_the_vocabulary_is_refused_before_counting(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("distattn.stats.pipeline.cooccurrence",
                        lambda *a, **k: pytest.fail("counted although --svd-dim cannot fit the vocabulary"))
    (tmp_path / "c.txt").write_text("a b c d a b\n")          # 4 words + <pad>, <unk>: 6 ids
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--svd-dim", "6",
                              "--no-cache"], capsys)
    assert code == 2 and out == ""
    assert "svd_dim=6 is invalid for a vocabulary of 6 words" in err and "at most 5" in err
    code, out, err = run_cli(["--corpus", "paper", "--svd-dim", "7"], capsys)
    assert code == 2 and "svd_dim=7 is invalid for a vocabulary of 7 words" in err


def test_an_undefined_correlation_is_printed_as_null_not_nan(capsys, tmp_path, monkeypatch):
    """With all cosines (or all human scores) equal the Spearman correlation is NaN, and the summary
    was printed with a bare NaN, which is not JSON."""
    import distattn.stats.similarity as similarity
    from dataclasses import dataclass

    @dataclass
    class Undefined:
        spearman: float = float("nan")
        n_found: int = 3

        def as_dict(self):
            return {"spearman": self.spearman, "n_found": self.n_found}

    monkeypatch.setattr(similarity, "evaluate_similarity", lambda *a, **k: Undefined())
    (tmp_path / "c.txt").write_text("a b c a b\nb c a\nc a b c\n" * 3)
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--svd-dim", "2",
                              "--evaluate", "--no-cache"], capsys)
    assert code == 0, err
    summary = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert summary["similarity"]["wordsim353"] == {"spearman": None, "n_found": 3}


def test_evaluate_counts_no_pair_of_a_word_without_a_vector(capsys, tmp_path):
    """--evaluate scored pairs of a word whose embedding is all zero (here "love", alone in its
    documents, never co-occurs) with a cosine of 0 and counted them as found, while the
    KeyedVectors export (zero rows left out) treats such a word as out of vocabulary."""
    from distattn.corpus import Vocabulary
    from distattn.stats.embeddings import SVDEmbeddings
    from distattn.stats.similarity import evaluate_similarity
    rng = np.random.default_rng(0)
    words = ["tiger", "cat", "book", "paper", "computer", "keyboard", "sex", "money", "cash", "bank"]
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(40)] + ["love"] * 5
    (tmp_path / "c.txt").write_text("\n".join(lines))
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--window", "3",
                              "--svd-dim", "4", "--evaluate", "--no-cache", "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    got = json.loads(out)["similarity"]["wordsim353"]
    emb = np.load(tmp_path / "o" / "embeddings.npy")
    itos = Vocabulary.load(tmp_path / "o" / "vocab.json").itos
    assert not emb[itos.index("love")].any()                     # the word is in the vocabulary, without a vector
    model = SVDEmbeddings(dim=4)
    model.vectors_, model.words_ = emb, None
    kv = model.to_keyed_vectors(itos)
    assert "love" not in kv.key_to_index
    want = evaluate_similarity(kv, "wordsim353")
    assert (got["n_found"], got["spearman"]) == (want.n_found, pytest.approx(want.spearman))


def test_help_states_each_options_default_once_and_as_used(monkeypatch):
    """--help said "--split ... (default: train+test+unsup) (default: None)": the formatter appended
    the parser's placeholder None after the default the help text already named (also --jobs and
    --directional), so the help contradicted itself and the README."""
    from distattn.stats.__main__ import parser
    monkeypatch.setenv("COLUMNS", "1000")          # one line per option
    lines = [line for line in parser().format_help().splitlines() if line.lstrip().startswith("--")]
    assert lines, "no option lines found"
    for line in lines:
        assert line.count("(default:") <= 1, line
    split = next(line for line in lines if line.lstrip().startswith("--split"))
    assert "(default: train+test+unsup)" in split and "None" not in split


def test_a_save_that_breaks_off_leaves_no_stats_json_describing_a_mixed_set(tmp_path, monkeypatch):
    # Statistics.save wrote each file atomically but not the set: a save that broke off after the new
    # vocab.json and cooc.npz left the earlier run's ppmi.npz and stats.json (its config) beside them
    import hashlib
    from distattn.stats import pipeline
    out = tmp_path / "o"
    build_statistics(StatsConfig(corpus="paper", svd_dim=2)).save(out)
    meta = json.loads((out / "stats.json").read_text())
    assert sorted(meta["files"]) == ["cooc.npz", "embeddings.npy", "ppmi.npz", "vocab.json"]
    for name, f in meta["files"].items():
        data = (out / name).read_bytes()
        assert f == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    second = build_statistics(StatsConfig(corpus="paper", neg=2.0))
    save_npz = pipeline._save_npz

    def crash_on_ppmi(path, m):
        if path.name == "ppmi.npz":
            raise OSError("disk full")
        save_npz(path, m)
    monkeypatch.setattr(pipeline, "_save_npz", crash_on_ppmi)
    with pytest.raises(OSError, match="disk full"):
        second.save(out)
    assert not (out / "stats.json").exists()


@pytest.mark.parametrize("option", [["--vocab-size", "3"], ["--min-count", "2"], ["--window", "1"],
                                    ["--weighting", "none"], ["--directional"], ["--oov", "gap"]])
def test_a_counting_option_with_the_paper_corpus_is_refused_not_ignored(capsys, tmp_path, option):
    """--corpus paper takes its co-occurrence matrix as given: --window 1 --directional wrote the
    default matrix, and a stats.json whose config claimed window 1 and symmetric false."""
    code, out, err = run_cli(["--corpus", "paper", *option, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and out == "", err
    assert f"conflicting options: {option[0]} is only used with --corpus imdb or text, not --corpus paper" in err
    assert not (tmp_path / "o").exists()


def test_counting_options_keep_their_defaults_when_not_given(capsys, tmp_path):
    (tmp_path / "c.txt").write_text("a\nb\n")           # one word a document: nothing co-occurs
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--no-cache",
                              "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert "within --window 10 of each other" in err
    config = json.loads((tmp_path / "o" / "stats.json").read_text())["config"]
    d = StatsConfig()
    assert [config[k] for k in ("vocab_size", "min_count", "window", "weighting", "symmetric", "oov")] == \
        [d.vocab_size, d.min_count, d.window, d.weighting, d.symmetric, d.oov]


@pytest.mark.parametrize("returned, code", [(None, 0), (3, 3), ({"ok": 1}, 0), (True, 0), (False, 0)])
def test_run_script_exit_code_of_what_main_returns(returned, code):
    # True and False counted as the ints 1 and 0: a main() returning True (a result) exited with 1
    from distattn.cli import run_script
    assert run_script(lambda: returned) == code


def test_run_script_turns_a_user_error_into_exit_code_2(capsys):
    from distattn.cli import run_script

    def main():
        raise ValueError("window must be >= 1; got 0")
    assert run_script(main) == 2
    assert capsys.readouterr().err == "error: window must be >= 1; got 0\n"


@pytest.mark.parametrize("value, raises", [("0", False), ("false", False), ("No", False), (" off ", False),
                                           ("", False), ("1", True), ("yes", True)])
def test_traceback_variable_set_to_a_false_value_keeps_the_error_line(value, raises, monkeypatch, capsys):
    # any non-empty value counted: DISTATTN_TRACEBACK=0 printed the traceback it was meant to turn off
    from distattn.cli import run_script

    def main():
        raise ValueError("window must be >= 1; got 0")
    monkeypatch.setenv("DISTATTN_TRACEBACK", value)
    if raises:
        with pytest.raises(ValueError, match="window must be"):
            run_script(main)
    else:
        assert run_script(main) == 2
        assert capsys.readouterr().err == "error: window must be >= 1; got 0\n"


def test_counts_cached_under_another_tokenizer_are_not_served(tmp_path, monkeypatch):
    """The counts' cache key held the corpus but not its tokenizer: a text corpus counted while its
    default was the seed's ASCII tokenizer ('naïve' -> 'na', 've') had its counts served to
    unicode_tokenizer's tokens ('naïve') whenever the vocabulary came out the same (here with
    oov='gap', where the out-of-vocabulary tokens set the distances)."""
    from distattn.corpus import RegexTokenizer, TextCorpus, tokenize_corpus
    from distattn.paths import cache_dir
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat naïve on the mat\nthe cat sat on the mat\nthe mat sat on the cat\n",
                      encoding="utf-8")
    # a tokenized entry as the code before wrote it (its source without the tokenizer) keys nothing stale
    tokenize_corpus(TextCorpus(corpus))
    for meta in (cache_dir() / "tokenized").glob("text-*/meta.json"):
        info = json.loads(meta.read_text())
        info["source"].pop("tokenizer", None)
        meta.write_text(json.dumps(info))
    config = StatsConfig(corpus="text", path=str(corpus), window=3, min_count=2, oov="gap")
    with monkeypatch.context() as m:
        m.setattr(TextCorpus, "default_tokenizer", lambda self: RegexTokenizer())     # the seed's ASCII words
        ascii_counts = build_statistics(config, progress=False)
        assert "tokenizer" not in tokenize_corpus(TextCorpus(corpus)).source        # IMDB's keys stay as they were
    unicode_counts = build_statistics(config, progress=False)
    fresh = build_statistics(config, cache=False, progress=False)
    assert ascii_counts.vocab.itos == fresh.vocab.itos           # the same vocabulary, other distances
    assert (ascii_counts.cooc != fresh.cooc).nnz > 0
    assert (unicode_counts.cooc != fresh.cooc).nnz == 0


@pytest.mark.parametrize("kind", ["output_dir", "output_file"])
def test_output_paths_with_a_tilde_name_the_home_directory_they_were_checked_in(kind, tmp_path, monkeypatch):
    """--out '~/x' (quoted, or --out=~/x, which the shell leaves alone) was checked for writing
    under $HOME but returned as '~/x', so the scripts wrote into a directory named '~' under the
    working directory."""
    import distattn.cli as cli
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    got = getattr(cli, kind)("~/out/x.json")
    assert Path(got).absolute() == home / "out" / "x.json"
    assert getattr(cli, kind)(str(work / "y")) == str(work / "y")      # other paths come back as given


def test_imdb_split_order_gives_one_cache_key_and_the_default_keys_are_unchanged():
    """'unsup+train' read the same documents in the same order as 'train+unsup' (the archive's order),
    but tokenized and counted them under second cache keys. The keys now take the archive's order; the
    defaults were already in it, so their keys are those the previous code computed (hard-coded here)."""
    from distattn.corpus import ImdbCorpus, Vocabulary

    def fingerprint(split):
        corpus = ImdbCorpus(split, download=False, progress=False)
        corpus._sha = "0" * 64                       # the archive's hash, not read here
        return corpus.fingerprint()

    assert fingerprint("unsup+train") == fingerprint("train+unsup") == fingerprint(["unsup", "train", "unsup"]) \
        == {"corpus": "imdb", "splits": ["train", "unsup"], "archive_sha256": "0" * 64}
    assert fingerprint("train+test+unsup")["splits"] == fingerprint("unsup+test+train")["splits"] \
        == ["train", "test", "unsup"]
    from distattn.stats.pipeline import _counts_key
    vocab = Vocabulary.from_counts(["river", "bank", "loan"], [3, 2, 1])

    def key(split):
        source = {"fingerprint": fingerprint(split or "train+test+unsup")}
        return _counts_key(StatsConfig(split=split), source, vocab)

    assert key(None) == key("train+test+unsup") == key("unsup+test+train") == "b49b1d33d7f03fa8"
    assert key("train+unsup") == key("unsup+train") == "b3343b48d81cb033"
    assert key("train") != key("train+unsup")


def test_a_data_dir_that_is_not_a_directory_is_refused(capsys, tmp_path, monkeypatch):
    """A typo in --data-dir fell back to $DISTATTN_DATA_DIR (or a download into the cache) and counted
    that copy of IMDB without a word, as the compare once did; now refused before anything is read."""
    monkeypatch.setenv("DISTATTN_DATA_DIR", str(tmp_path))      # where the fallback would have looked
    code, out, err = run_cli(["--corpus", "imdb", "--data-dir", str(tmp_path / "no_such_dir"),
                              "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and out == ""
    assert f"--data-dir '{tmp_path / 'no_such_dir'}' does not exist" in err
    assert not (tmp_path / "o").exists()
    archive = tmp_path / "aclImdb_v1.tar.gz"
    archive.write_bytes(b"x")
    code, out, err = run_cli(["--corpus", "imdb", "--data-dir", str(archive)], capsys)
    assert code == 2 and "is a file; pass the directory that holds aclImdb_v1.tar.gz" in err
    with pytest.raises(ValueError, match="does not exist"):
        StatsConfig(corpus="imdb", data_dir=str(tmp_path / "no_such_dir")).validate()
    StatsConfig(corpus="imdb", data_dir=str(tmp_path)).validate()


def test_no_cache_neither_creates_nor_needs_the_cache_directory(capsys, tmp_path, monkeypatch):
    """--no-cache ("neither read nor write the cache") still created the cache directory for the
    counts' entry name, and so failed with "error: [Errno 17] File exists" where it cannot be made."""
    (tmp_path / "c.txt").write_text("a b c d a b\nc d e f a\nb c a d e\n")
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--no-cache"], capsys)
    assert code == 0, err
    assert not (tmp_path / "cache").exists()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "file"))     # a cache that cannot be made
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--no-cache"], capsys)
    assert code == 0, err
    assert json.loads(out)["documents"] == 3


def test_a_cache_directory_that_cannot_be_made_is_named(capsys, tmp_path, monkeypatch):
    """It failed with "error: [Errno 17] File exists: '...'", naming neither the cache nor the way out."""
    (tmp_path / "c.txt").write_text("a b c d a b\nc d e f a\nb c a d e\n")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "file"))
    code, out, err = run_cli(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--out", str(tmp_path / "o")],
                             capsys)
    assert code == 2 and out == ""
    assert f"error: cannot write the cache directory '{tmp_path / 'file'}'" in err and "--no-cache" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cmd", [["-m", "distattn.stats", "--corpus", "paper"], ["analyses/paper_examples.py"]])
def test_a_reader_of_stdout_that_went_away_ends_the_command_quietly(cmd):
    """`python -m distattn.stats … | head` (or an analyses script's) ended in a BrokenPipeError traceback
    when head exited first; the command now stops with exit code 1 and nothing on stderr."""
    read, write = os.pipe()
    os.close(read)                  # the reader is gone before the first write: every write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, *cmd], stdout=write, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1], timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("cmd", [["-m", "distattn.stats", "--corpus", "paper"], ["analyses/paper_examples.py"]])
def test_a_reader_of_stdout_that_went_away_ends_the_command_quietly_with_buffered_stdout(cmd):
    """Without PYTHONUNBUFFERED (a pipe's stdout is block-buffered) a short output is written only at
    the flush at interpreter exit, after run_script returned: that flush's BrokenPipeError was printed
    ('Exception ignored ... BrokenPipeError') and the command exited with 120."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, *cmd], stdout=write, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=Path(__file__).resolve().parents[1], timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 1, proc.stderr
    assert "BrokenPipeError" not in proc.stderr, proc.stderr
