"""GloVe interop file formats (distattn.stats.glove). No GloVe binaries needed: ``cooccur``'s
windowing is emulated in Python (``emulate_cooccur``) on the text files we write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

from distattn.corpus import DocumentTable, EncodedCorpus, RaggedIds, Vocabulary
from distattn.stats import cooccurrence
from distattn.stats.glove import (GLOVE_RECORD, read_glove_cooccurrence, write_glove_cooccurrence,
                                  write_glove_corpus, write_glove_vocab)

WORDS = ["the", "cat", "sat", "on", "mat"]


def vocab5():
    return Vocabulary(WORDS, [50, 40, 30, 20, 10])  # ids: <pad>=0 <unk>=1 the=2 ... mat=6


def records(triples):
    rec = np.zeros(len(triples), dtype=GLOVE_RECORD)
    for k, (a, b, v) in enumerate(triples):
        rec[k] = (a, b, v)
    return rec


def emulate_cooccur(corpus_path, vocab_path, window, symmetric=True, harmonic=True):
    """GloVe ``cooccur``'s loop in Python: ranks = vocab.txt line numbers; per line (document) a
    history of in-vocabulary ranks; an unknown word is skipped without advancing the position."""
    ranks = {}
    for line in Path(vocab_path).read_text(encoding="utf-8").splitlines():
        ranks[line.split()[0]] = len(ranks) + 1
    out = []
    for line in Path(corpus_path).read_text(encoding="utf-8").split("\n"):
        history = []
        for word in line.replace("\t", " ").split(" "):
            if not word or word not in ranks:
                continue
            w2 = ranks[word]
            for d in range(1, min(window, len(history)) + 1):
                w1 = history[-d]
                val = 1.0 / d if harmonic else 1.0
                out.append((w1, w2, val))
                if symmetric:
                    out.append((w2, w1, val))
            history.append(w2)
    return records(out)


# --- cooccurrence.bin ------------------------------------------------------------------------

def test_record_layout_is_crec():
    assert GLOVE_RECORD.itemsize == 16  # struct {int; int; double;} without padding
    raw = records([(3, 7, 0.5)]).tobytes()
    assert raw == np.int32(3).tobytes() + np.int32(7).tobytes() + np.float64(0.5).tobytes()


def test_read_maps_ranks_and_sums_duplicates(tmp_path):
    p = tmp_path / "cooccurrence.bin"
    records([(2, 1, 1.5), (1, 1, 2.0), (2, 1, 0.25), (5, 3, 1.0)]).tofile(p)
    X = read_glove_cooccurrence(p, vocab_size=7, id_offset=2)
    assert isinstance(X, sp.csr_array) and X.shape == (7, 7) and X.dtype == np.float64
    assert X.has_canonical_format
    expected = np.zeros((7, 7))
    expected[3, 2] = 1.75  # rank 2 -> id 3, rank 1 -> id 2; the repeated pair is summed
    expected[2, 2] = 2.0
    expected[6, 4] = 1.0
    assert_array_equal(X.toarray(), expected)
    Y = read_glove_cooccurrence(p, vocab_size=5, id_offset=0)  # a vocabulary without specials
    assert Y[1, 0] == 1.75 and Y[4, 2] == 1.0


def test_read_empty_file_and_junk_record(tmp_path):
    p = tmp_path / "empty.bin"
    p.write_bytes(b"")
    assert read_glove_cooccurrence(p, 4).nnz == 0
    records([(0, 0, 6.9e-310), (1, 2, 1.0)]).tofile(p)  # cooccur's record from uninitialised memory
    X = read_glove_cooccurrence(p, 4)
    assert X.nnz == 1 and X[2, 3] == 1.0


@pytest.mark.parametrize("triples", [[(1, 4, 1.0)], [(-1, 1, 1.0)], [(4, 1, 1.0)]])
def test_read_rejects_out_of_range_ranks(tmp_path, triples):
    p = tmp_path / "bad.bin"
    records(triples).tofile(p)
    with pytest.raises(ValueError, match="outside"):
        read_glove_cooccurrence(p, vocab_size=5, id_offset=2)  # ranks 1..3


def test_read_rejects_truncated_file(tmp_path):
    p = tmp_path / "bad.bin"
    p.write_bytes(records([(1, 1, 1.0)]).tobytes()[:-3])
    with pytest.raises(ValueError, match="multiple"):
        read_glove_cooccurrence(p, 5)


def test_write_read_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    M = sp.random_array((9, 9), density=0.4, random_state=rng, format="csr")
    M = sp.csr_array(M.multiply((np.arange(9) >= 2)[:, None] & (np.arange(9) >= 2)[None, :]))
    M.eliminate_zeros()
    p = tmp_path / "x.bin"
    n = write_glove_cooccurrence(M, p, id_offset=2)
    rec = np.fromfile(p, dtype=GLOVE_RECORD)
    assert n == len(rec) == M.nnz
    order = np.lexsort((rec["word2"], rec["word1"]))
    assert_array_equal(order, np.arange(len(rec)))  # sorted by (word1, word2), like cooccur's output
    assert rec["word1"].min() >= 1
    X = read_glove_cooccurrence(p, 9, 2)
    assert_array_equal(X.toarray(), M.toarray())
    with pytest.raises(ValueError, match="specials"):
        write_glove_cooccurrence(sp.csr_array(np.eye(3)), tmp_path / "y.bin", id_offset=2)


# --- vocab.txt and corpus text ---------------------------------------------------------------

def test_vocab_file_in_id_order(tmp_path):
    p = tmp_path / "vocab.txt"
    assert write_glove_vocab(vocab5(), p) == 5
    lines = p.read_bytes().decode("utf-8").split("\n")
    assert lines == ["the 50", "cat 40", "sat 30", "on 20", "mat 10", ""]
    v = vocab5()
    for r, line in enumerate(lines[:-1], start=1):  # rank r <-> id r - 1 + n_specials
        assert v.itos[r - 1 + v.n_specials] == line.split()[0]


def test_vocab_rejects_words_glove_cannot_read(tmp_path):
    for bad in ["two words", "tab\there", "cr\rword", "x" * 1000, "é" * 500]:
        with pytest.raises(ValueError):
            write_glove_vocab(Vocabulary(["ok", bad]), tmp_path / "v.txt")
    write_glove_vocab(Vocabulary(["é" * 499]), tmp_path / "v.txt")  # 998 bytes is fine


def test_corpus_text_drops_oov_and_specials(tmp_path):
    docs = [np.array([2, 3, -1, 4]), np.array([], dtype=np.int32), np.array([1, 0, 5, 6]), np.array([-1, -1])]
    p = tmp_path / "corpus.txt"
    info = write_glove_corpus(docs, vocab5(), p)
    assert p.read_text(encoding="utf-8") == "the cat sat\n\non mat\n\n"
    assert info == {"n_docs": 4, "n_tokens": 5, "n_oov": 5}
    info = write_glove_corpus(docs, vocab5(), p, oov_token="<oov>")
    assert p.read_text(encoding="utf-8") == "the cat <oov> sat\n\n<oov> <oov> on mat\n<oov> <oov>\n"
    assert info == {"n_docs": 4, "n_tokens": 10, "n_oov": 5}
    for bad in ["cat", "<unk>", "a b", ""]:
        with pytest.raises(ValueError, match="oov_token"):
            write_glove_corpus(docs, vocab5(), p, oov_token=bad)


def test_corpus_from_encoded_corpus(tmp_path):
    v = vocab5()
    tokens = RaggedIds.from_sequences([[2, 1, 3], [6]])  # <unk> (1) is out of vocabulary
    enc = EncodedCorpus(tokens, v, DocumentTable([0, 1], [0, 0], [0, 0], ["train"]))
    write_glove_corpus(enc, None, tmp_path / "c.txt")
    assert (tmp_path / "c.txt").read_text() == "the cat\nmat\n"
    with pytest.raises(TypeError):
        write_glove_corpus(tokens, None, tmp_path / "c.txt")


def test_corpus_chunking_keeps_document_lines(tmp_path, monkeypatch):
    import distattn.stats.glove as glove
    monkeypatch.setattr(glove, "_WRITE_CHUNK_TOKENS", 3)
    rng = np.random.default_rng(1)
    docs = [rng.integers(-1, 7, size=rng.integers(0, 8)) for _ in range(40)]
    write_glove_corpus(docs, vocab5(), tmp_path / "c.txt")
    lines = (tmp_path / "c.txt").read_text().split("\n")
    assert len(lines) == 41 and lines[-1] == ""
    itos = vocab5().itos
    for line, d in zip(lines, docs):
        assert line.split() == [itos[i] for i in d if i >= 2]


# --- the files as cooccur would count them ---------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(docs=st.lists(st.lists(st.integers(-1, 6), max_size=15), min_size=1, max_size=6),
       window=st.integers(1, 6), symmetric=st.booleans(), harmonic=st.booleans(), placeholder=st.booleans())
def test_files_count_like_cooccurrence(tmp_path_factory, docs, window, symmetric, harmonic, placeholder):
    tmp = tmp_path_factory.mktemp("glove")
    v = vocab5()
    docs = [np.array(d, dtype=np.int32) for d in docs]
    write_glove_vocab(v, tmp / "vocab.txt")
    write_glove_corpus(docs, v, tmp / "corpus.txt", oov_token="<oov>" if placeholder else None)
    emulate_cooccur(tmp / "corpus.txt", tmp / "vocab.txt", window, symmetric, harmonic).tofile(tmp / "c.bin")
    X = read_glove_cooccurrence(tmp / "c.bin", len(v), v.n_specials)
    # GloVe's vocabulary has no specials: <pad>/<unk> ids are out of vocabulary there
    ours = [np.where(d < v.n_specials, -1, d) for d in docs]
    if not any((d >= 0).any() for d in ours):
        assert X.nnz == 0
        return
    Y = cooccurrence(ours, len(v), window=window, weighting="harmonic" if harmonic else "none",
                     symmetric=symmetric, oov="drop")
    assert_allclose(X.toarray(), Y.toarray(), rtol=1e-12, atol=0)


def test_write_refuses_ids_beyond_int32_instead_of_wrapping(tmp_path):
    n = 2**31 + 4  # GloVe's ranks are C ints: rank 2**31 would be written as -2**31
    M = sp.coo_array((np.array([1.0, 2.0]), (np.array([2, 2**31 + 2]), np.array([3, 2]))), shape=(n, n))
    p = tmp_path / "big.bin"
    with pytest.raises(ValueError, match="int32|2147483647"):
        write_glove_cooccurrence(M, p, id_offset=2)
    assert not p.exists()
    M = sp.coo_array((np.array([1.0]), (np.array([2**31]), np.array([2]))), shape=(n, n))
    assert write_glove_cooccurrence(M, p, id_offset=2) == 1  # rank 2**31 - 1 is the largest C int
    assert np.fromfile(p, dtype=GLOVE_RECORD).tolist() == [(2**31 - 1, 1, 1.0)]


def test_failed_cooccur_run_leaves_the_output_file_alone(tmp_path):
    import subprocess

    from distattn.stats.glove import run_glove_cooccur
    fake = tmp_path / "cooccur"  # writes half a record, then fails (as cooccur does when it aborts)
    fake.write_text("#!/bin/sh\nprintf 'abcdefgh'\necho boom >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "corpus.txt").write_text("the cat\n")
    write_glove_vocab(vocab5(), tmp_path / "vocab.txt")
    out = tmp_path / "cooccurrence.bin"
    good = records([(1, 2, 1.0)]).tobytes()
    out.write_bytes(good)  # an earlier run's result
    with pytest.raises(subprocess.CalledProcessError):
        run_glove_cooccur(fake, tmp_path / "corpus.txt", tmp_path / "vocab.txt", out, window=2)
    assert out.read_bytes() == good
    out.unlink()
    with pytest.raises(subprocess.CalledProcessError):
        run_glove_cooccur(fake, tmp_path / "corpus.txt", tmp_path / "vocab.txt", out, window=2)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cooccur", "corpus.txt", "vocab.txt"]


_FULL_DISK = r"""
import json, resource, signal, sys
import numpy as np, scipy.sparse as sp
from pathlib import Path
from distattn.corpus import Vocabulary
from distattn.stats.glove import write_glove_cooccurrence, write_glove_corpus, write_glove_vocab
d = Path(sys.argv[1])
v = Vocabulary([f"word{i:05d}" for i in range(3000)])
M = sp.coo_array((np.ones(3000), (np.arange(2, 3002), np.arange(2, 3002))), shape=(3002, 3002))
calls = {"vocab.txt": lambda p: write_glove_vocab(v, p),
         "corpus.txt": lambda p: write_glove_corpus([np.arange(2, 3002)] * 3, v, p),
         "cooccurrence.bin": lambda p: write_glove_cooccurrence(M, p)}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
errors = {}
for name, call in calls.items():
    try:
        call(d / name)
    except OSError as exc:
        errors[name] = str(exc)
print(json.dumps(errors))
"""


def test_writers_leave_no_half_written_file_when_the_disk_fills(tmp_path):
    import json
    import os
    import subprocess
    import sys

    names = ["vocab.txt", "corpus.txt", "cooccurrence.bin"]
    for name in names:  # an earlier, complete file of each
        (tmp_path / name).write_bytes(b"old\n")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path)], env=env, capture_output=True,
                          text=True, check=True)
    assert sorted(json.loads(proc.stdout)) == sorted(names)  # each write hit the limit: OSError
    for name in names:
        assert (tmp_path / name).read_bytes() == b"old\n", name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no temporary file left over


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_cooccur_window_must_be_a_positive_integer(tmp_path, window):
    # cooccur reads -window-size with atoi: 2.5 counted as 2, True as 1; 0 dies of SIGFPE (j % 0)
    from distattn.stats.glove import run_glove_cooccur
    fake = tmp_path / "cooccur"
    fake.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\n")
    fake.chmod(0o755)
    (tmp_path / "corpus.txt").write_text("the cat\n")
    write_glove_vocab(vocab5(), tmp_path / "vocab.txt")
    with pytest.raises(ValueError, match="window"):
        run_glove_cooccur(fake, tmp_path / "corpus.txt", tmp_path / "vocab.txt", tmp_path / "c.bin", window=window)
    assert not (tmp_path / "ran").exists()
