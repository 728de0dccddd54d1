"""distattn.analysis.sources and the two analysis scripts, end to end on the paper corpus."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from distattn.analysis.sources import RandomAttentionModel, corpus_statistics

ROOT = Path(__file__).resolve().parents[1]


def test_random_model_layer0_pattern_is_the_softmax_of_its_qk_circuit():
    m = RandomAttentionModel(20, d_model=12, n_heads=3, n_layers=2, causal=True, random_state=1)
    ids = np.array([4, 7, 7, 19, 0])
    P = m.patterns(ids)
    assert P.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(P.sum(-1), 1.0)
    assert np.all(np.triu(P, 1) == 0)
    qk = m.qk_circuit(0)
    for h in range(3):
        scores = m.temperature * qk[h].submatrix(ids, ids) / np.sqrt(m.d_head)
        scores = np.where(np.tril(np.ones((5, 5), dtype=bool)), scores, -np.inf)
        expected = np.exp(scores - scores.max(1, keepdims=True))
        np.testing.assert_allclose(P[0, h], expected / expected.sum(1, keepdims=True), atol=1e-12)
    assert m.ov_circuit(1).shape == (3, 20, 20)


@pytest.mark.parametrize("kind", ["lm", "classifier", "attention_only"])
def test_torch_adapter_patterns_equal_the_full_forward_capture(kind):
    """The adapter runs only a model's trunk when it has one; the patterns must be those of the
    whole forward pass (every layer and head, OOV ids mapped to oov_id)."""
    import torch

    from distattn.analysis.sources import TorchModelAdapter
    from distattn.models import (AttentionOnlyConfig, LMConfig, ProjectionMatchedLM, TransformerClassifier,
                                 TransformerLM, run_with_cache, seed_classifier_config)
    torch.manual_seed(0)
    model = {"lm": lambda: TransformerLM(LMConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_len=16)),
             "classifier": lambda: TransformerClassifier(seed_classifier_config(vocab_size=50, d_model=32, max_len=16)),
             "attention_only": lambda: ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=50, d_model=16, n_heads=2,
                                                                                max_len=16))}[kind]()
    ids = np.array([3, 7, -1, 12, 3, 40])
    got = TorchModelAdapter(model, oov_id=1).patterns(ids)
    model.eval()
    with torch.no_grad():
        _, cache = run_with_cache(model, torch.as_tensor(np.where(ids < 0, 1, ids))[None],
                                  filter=lambda n: n.endswith("hook_pattern"))
    names = sorted(cache, key=lambda n: [int(p) if p.isdigit() else p for p in n.split(".")])
    np.testing.assert_array_equal(got, np.stack([cache[n][0].float().numpy() for n in names]))
    assert got.shape[2:] == (6, 6) and got.shape[0] == len(names)


def test_paper_statistics():
    cs = corpus_statistics("paper")
    assert cs.words[1] == "bank" and cs.ppmi.shape == (7, 7) and cs.directional_ppmi is None
    assert [list(s) for s in cs.sequences] == [[0, 1, 4], [1, 2]]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,outputs", [("spectra", ["spectra.json", "spectra.png"]),
                                          ("attention_vs_ppmi", ["report.json", "heatmaps.png", "graph.png",
                                                                 "cka.png", "agreement.png", "attention.graphml"])])
def test_scripts_run_on_the_paper_corpus(name, outputs, tmp_path, capsys):
    assert _script(name).main(["--out", str(tmp_path), "--d-model", "8", "--heads", "2"]) == 0
    for f in outputs:
        assert (tmp_path / f).stat().st_size > 100
    report = json.loads((tmp_path / outputs[0]).read_text())
    assert report["corpus"] == "paper"
    if name == "attention_vs_ppmi":
        senses = report["senses"]["co-occurrence"]["communities"]
        assert sorted(map(sorted, senses)) == [["flooded", "river", "shore"], ["loan", "money", "rely"]]
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["spectra", "attention_vs_ppmi"])
@pytest.mark.parametrize("args, message", [
    (["--path", "reviews.txt"], "conflicting options: --path is only used with --corpus text, not --corpus paper"),
    (["--corpus", "text", "--path", "reviews.txt", "--data-dir", "d"],
     "conflicting options: --data-dir is only used with --corpus imdb, not --corpus text")])
def test_scripts_refuse_options_the_corpus_does_not_use(name, args, message, tmp_path, capsys):
    """--path reviews.txt without --corpus text once ran silently on the paper's 7-word toy S."""
    (tmp_path / "reviews.txt").write_text("the river bank flooded\nthe bank loan\n")
    args = [str(tmp_path / a) if a == "reviews.txt" else a for a in args]
    with pytest.raises(SystemExit) as exc:
        _script(name).main([*args, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--max-len", "1"], "argument --max-len: got 1; allowed: an integer >= 2"),
    (["--top-n", "1"], "argument --top-n: got 1; allowed: an integer >= 2")])
def test_attention_vs_ppmi_refuses_sizes_it_cannot_use(args, message, tmp_path, capsys):
    """--max-len 1 once ended with 'error: head_patterns is empty', --top-n 1 with 'word_ids must be a
    1-D integer array of at least 2 ids', after the statistics were built."""
    with pytest.raises(SystemExit) as exc:
        _script("attention_vs_ppmi").main([*args, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_attention_vs_ppmi_names_a_corpus_of_one_token_documents(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("river\nbank\nloan\n")
    with pytest.raises(ValueError, match="none of the first 3 documents has 2 or more tokens"):
        _script("attention_vs_ppmi").main(["--corpus", "text", "--path", str(tmp_path / "one.txt"),
                                           "--out", str(tmp_path / "out")])
    assert capsys.readouterr().out == "" and not (tmp_path / "out").exists()


def test_attention_vs_ppmi_names_a_corpus_of_one_distinct_word(tmp_path, capsys):
    """A corpus whose documents repeat one word once ended with 'word_ids must be a 1-D integer array of
    at least 2 ids, got array([2])' (an argument the command does not have), after the statistics."""
    (tmp_path / "one.txt").write_text("hello hello hello\nhello hello\n")
    with pytest.raises(ValueError, match=r"the corpus has 1 distinct word \('hello'\) in its vocabulary; the QK-PMI "
                                         r"correlation and the kernels need at least 2"):
        _script("attention_vs_ppmi").main(["--corpus", "text", "--path", str(tmp_path / "one.txt"),
                                           "--out", str(tmp_path / "out")])
    assert capsys.readouterr().out == "" and not (tmp_path / "out").exists()


def test_attention_vs_ppmi_skips_a_document_with_no_in_vocabulary_token(tmp_path, capsys):
    """A first line of two rare words (both outside --vocab-size) once ended the run with 'error: token_ids
    has no in-vocabulary token', after section 1 was printed; such a document has nothing to project."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    lines = ["zebra quokka", *(" ".join(rng.choice(words, size=25)) for _ in range(20))]
    (tmp_path / "rare.txt").write_text("\n".join(lines) + "\n")
    assert _script("attention_vs_ppmi").main(["--corpus", "text", "--path", str(tmp_path / "rare.txt"),
                                              "--vocab-size", "30", "--d-model", "8", "--heads", "2",
                                              "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["vocab_size"] == 32 and len(report["cka"]["names"]) == 6
    assert "over 7 sequences" in capsys.readouterr().out          # the 8 first documents less the rare one


@pytest.mark.parametrize("name", ["spectra", "attention_vs_ppmi"])
def test_scripts_refuse_heads_that_do_not_divide_d_model_before_any_work(name, tmp_path, capsys, monkeypatch):
    """--d-model 30 --heads 4 once ended with the model's 'd_model=30 must be divisible by n_heads=4', after the
    corpus statistics (IMDB: the tokenized reviews) and the PPMI-SVD were built."""
    module = _script(name)
    monkeypatch.setattr(module, "corpus_statistics", lambda *a, **k: pytest.fail("statistics built first"))
    with pytest.raises(SystemExit) as exc:
        module.main(["--d-model", "30", "--heads", "4", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "argument --heads: got 4; allowed: a divisor of --d-model 30" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_attention_vs_ppmi_writes_strict_json(tmp_path, capsys):
    """report.json was written with json.dumps' default allow_nan: the uniform baseline's Spearman
    (undefined, NaN) came out as a bare NaN in every default run, which is not JSON (JSON.parse and
    other strict readers refuse the file); compare's metrics.json writes such numbers as null."""
    assert _script("attention_vs_ppmi").main(["--out", str(tmp_path), "--d-model", "8", "--heads", "2"]) == 0
    capsys.readouterr()

    def refuse(constant):
        raise ValueError(f"{constant} in report.json")
    report = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)
    uniform = [r for r in report["agreement"] if r["predictor"] == "uniform"]
    assert uniform and all(r["spearman_mean"] is None for r in uniform)


def test_torch_adapter_patterns_restore_the_models_training_mode():
    """patterns() switched the model to eval mode for good: a model being trained (dropout on) that was
    looked at mid-run trained on without dropout. The patterns are still the eval-mode ones."""
    import torch

    from distattn.analysis.sources import TorchModelAdapter
    from distattn.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_heads=4, n_layers=1, max_len=8, dropout=0.5))
    ids = np.array([3, 7, 12, 3])
    adapter = TorchModelAdapter(model)
    model.train()
    got = adapter.patterns(ids)
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    np.testing.assert_array_equal(got, adapter.patterns(ids))
    assert not model.training


def test_torch_adapter_names_a_batch_of_sequences_as_such():
    """patterns() takes one sequence; a (B, T) batch was wrapped to (1, B, T) and refused with "token ids must
    have shape (batch, seq_len); got shape (1, 2, 3)", a shape the caller never passed, and one that suggests
    a batch is what it wants."""
    import torch

    from distattn.analysis.sources import TorchModelAdapter
    from distattn.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    adapter = TorchModelAdapter(TransformerLM(LMConfig(vocab_size=50, d_model=16, n_heads=4, n_layers=1, max_len=8)))
    with pytest.raises(ValueError, match=r"one sequence: a 1-D array of token ids; got shape \(2, 3\)"):
        adapter.patterns(np.array([[3, 7, 12], [4, 5, 6]]))
    with pytest.raises(ValueError, match=r"got shape \(1, 3\)"):
        adapter.patterns(np.array([[3, 7, 12]]))
    assert adapter.patterns([3, 7, 12]).shape == (1, 4, 3, 3)


def test_torch_adapter_refuses_fractional_token_ids():
    """np.asarray(token_ids, dtype=np.int64) truncated 3.7 to 3: the patterns of another sequence, silently.
    Whole numbers in a float array are still taken."""
    import torch

    from distattn.analysis.sources import TorchModelAdapter
    from distattn.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    adapter = TorchModelAdapter(TransformerLM(LMConfig(vocab_size=50, d_model=16, n_heads=4, n_layers=1, max_len=8)))
    with pytest.raises(ValueError, match=r"token ids must be whole numbers; got 3\.7"):
        adapter.patterns([3.7, 7.0, 12.0])
    adapter.oov_id = 1
    np.testing.assert_array_equal(adapter.patterns(np.array([3.0, -1.0, 12.0])), adapter.patterns([3, -1, 12]))


@pytest.mark.parametrize("oov_id", [-1, 50, 1.5])
def test_torch_adapter_names_a_bad_oov_id(oov_id):
    """An oov_id outside the vocabulary surfaced, at the first OOV word, as "token id 50 is outside [0,
    vocab_size=50); encode out-of-vocabulary words as <unk>": it blamed the caller's token ids (all valid) and
    pointed to the encoding that oov_id is there to replace. (None, the default, is tested below.)"""
    import torch

    from distattn.analysis.sources import TorchModelAdapter
    from distattn.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_heads=4, n_layers=1, max_len=8))
    with pytest.raises(ValueError, match=rf"oov_id must be an integer in \[0, vocab_size=50\) .*; got {oov_id}"):
        TorchModelAdapter(model, oov_id=oov_id).patterns([3, -1, 12])
    assert TorchModelAdapter(model, oov_id=np.int64(49)).patterns([3, -1, 12]).shape == (1, 4, 3, 3)


def test_torch_adapter_without_oov_id_refuses_oov_ids_instead_of_reading_them_as_pad():
    """The default oov_id=0 read every out-of-vocabulary word as <pad> (id 0; <unk> is 1 in the toolkit's
    vocabularies), silently: build_model("lm") and so attention_vs_ppmi --model lm on a text corpus did. The
    model does not know its vocabulary, so without an oov_id an OOV id is refused with a clear message."""
    import torch

    from distattn.analysis.sources import TorchModelAdapter, build_model
    from distattn.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=50, d_model=16, n_heads=4, n_layers=1, max_len=8))
    adapter = TorchModelAdapter(model)
    assert adapter.patterns([3, 7, 12]).shape == (1, 4, 3, 3)          # no OOV id: no oov_id needed
    with pytest.raises(ValueError, match=r"out-of-vocabulary marker -1 .* no oov_id; pass .*oov_id=vocab\.unk_id"):
        adapter.patterns([3, -1, 12])
    np.testing.assert_array_equal(TorchModelAdapter(model, oov_id=1).patterns([3, -1, 12]),
                                  adapter.patterns([3, 1, 12]))
    assert build_model("lm", 50, d_model=16, n_heads=4, n_layers=1, max_len=8, oov_id=1).oov_id == 1
    assert build_model("lm", 50, d_model=16, n_heads=4, n_layers=1, max_len=8).oov_id is None


def test_attention_vs_ppmi_lm_reads_oov_words_of_a_text_corpus_as_unk(tmp_path, capsys, monkeypatch):
    """The script passes the corpus vocabulary's <unk> to the LM adapter (OOV words were read as <pad>)."""
    from distattn.analysis import sources
    seen = []
    build = sources.build_model
    module = _script("attention_vs_ppmi")
    monkeypatch.setattr(module, "build_model", lambda *a, **k: seen.append(build(*a, **k)) or seen[-1])
    (tmp_path / "c.txt").write_text("the river bank flooded zebra\nthe bank loan quokka money\nthe river shore\n")
    assert module.main(["--corpus", "text", "--path", str(tmp_path / "c.txt"), "--vocab-size", "4", "--model", "lm",
                        "--d-model", "8", "--heads", "2", "--out", str(tmp_path / "out")]) == 0
    stats = sources.corpus_statistics("text", path=str(tmp_path / "c.txt"), vocab_size=4)
    assert stats.words[1] == "<unk>" and any((s < 0).any() for s in stats.sequences)
    assert seen[0].oov_id == 1
