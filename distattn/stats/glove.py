"""Interoperation with Stanford GloVe's ``cooccur`` tool (files only; GloVe is not a dependency).

GloVe counts co-occurrences with three files, whose formats are these:

``vocab.txt`` (read by ``cooccur``; normally written by ``vocab_count``)
    One ``word count`` per line. ``cooccur`` reads it with ``fscanf("%1000s %lld")`` and gives the
    word on line ``r`` (1-based) the *rank* ``r``; the count is not used. :func:`write_glove_vocab`
    writes our regular words (no specials) in our id order, so

        GloVe rank ``r``  <->  our id ``r - 1 + id_offset``,  ``id_offset = vocab.n_specials``

    (``<pad>`` = 0, ``<unk>`` = 1, the first regular word = id 2 = rank 1 with the default
    specials). Write it with this function rather than ``vocab_count -max-vocab N``: that sorts
    ties at the cut-off count without a tie-break (hash-table order) before truncating, so it keeps
    a different subset of the words tied at the boundary than ``Vocabulary.from_counts``
    (alphabetical); on IMDB at 30,000 words, 161 of the words with count 18 differ.

corpus text (``cooccur``'s standard input)
    Words separated by spaces (or tabs); **a newline ends a document** (no window crosses it).
    ``cooccur`` *skips* a word that is not in ``vocab.txt`` without advancing its position, so
    distances count in-vocabulary words only: exactly ``cooccurrence(..., oov="drop")``.
    :func:`write_glove_corpus` therefore drops out-of-vocabulary tokens by default (a smaller file,
    and it does not depend on any placeholder being absent from the vocabulary); with
    ``oov_token="..."`` it writes that placeholder instead, which ``cooccur`` skips in the same
    way, giving the same counts. GloVe has no equivalent of ``oov="gap"``.

``cooccurrence.bin`` (``cooccur``'s standard output)
    Packed native-endian records ``struct {int word1; int word2; double val;}`` (16 bytes, no
    padding; :data:`GLOVE_RECORD`), ranks 1-based. ``X[word1, word2]`` is the (weighted) count of
    ``word2`` occurring ``d`` in-vocabulary positions *after* ``word1`` (``1 <= d <= window``),
    plus, with ``-symmetric 1``, the transposed count: the same convention as
    ``cooccurrence(..., symmetric=...)`` (``directional[i, j]``: ``j`` after ``i``).
    ``-distance-weighting 1`` weights by ``1/d`` (``weighting="harmonic"``), ``0`` counts 1.
    ``cooccur`` writes the records sorted by ``(word1, word2)`` and merges equal pairs, but
    :func:`read_glove_cooccurrence` sums repeated pairs anyway (the file format allows them, and
    ``shuffle``'s output is a permutation of the records).

Known ``cooccur`` artefacts (found by reading and running ``src/cooccur.c``): when its final
overflow file is empty (every pair fitted in the dense table; typical for small vocabularies),
``merge_files`` re-uses the previous file's first record, so the *first* pair of the output is
counted twice; when the dense table is empty (``-max-product 1``) it emits one record from
uninitialised memory (seen as ``(0, 0, 0.0)`` and ``(0, 0, 6.9e-310)``). :func:`read_glove_cooccurrence`
drops records with a rank 0 (never a word) and rejects other out-of-range ranks; the doubled
first record cannot be detected from the file alone. With ``-symmetric 1`` a token adds up to
``2 * window`` overflow records but the buffer is flushed only ``window`` records before it is
full, so a small ``-overflow-length`` writes past the buffer (AddressSanitizer: heap-buffer-overflow;
``double free or corruption`` aborts); the ``-memory``-derived default is large enough not to fill
on IMDB-sized corpora.

The writers (and :func:`run_glove_cooccur`) write each file atomically: a temporary file beside
it, renamed onto the final name only when complete, so an interrupted write (a full disk, a
crash) leaves the earlier file, if any, in place rather than a truncated one.

Example::

    write_glove_vocab(enc.vocab, "vocab.txt")
    write_glove_corpus(enc, None, "corpus.txt")
    # cooccur -symmetric 1 -window-size 10 -distance-weighting 1 -vocab-file vocab.txt \\
    #         < corpus.txt > cooccurrence.bin
    X = read_glove_cooccurrence("cooccurrence.bin", len(enc.vocab), enc.vocab.n_specials)
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from distattn.atomic import atomic_path
from distattn.corpus.tokenized import EncodedCorpus
from distattn.corpus.vocabulary import Vocabulary

__all__ = ["GLOVE_RECORD", "MAX_WORD_BYTES", "glove_words", "write_glove_vocab", "write_glove_corpus",
           "read_glove_cooccurrence", "write_glove_cooccurrence", "run_glove_cooccur", "glove_cooccurrence"]

#: ``CREC`` of ``cooccur.c``: ``int word1; int word2; double val``, in the machine's own byte order
#: (``cooccur`` ``fwrite``s the struct as it is in memory), like the module docstring says.
GLOVE_RECORD = np.dtype([("word1", "=i4"), ("word2", "=i4"), ("val", "=f8")])
#: ``cooccur``'s ``get_word`` keeps ``MAX_STRING_LENGTH - 1 = 999`` bytes of a corpus word and
#: truncates the rest, while it reads vocabulary words with ``%1000s``: longer words would not match.
MAX_WORD_BYTES = 999
_GLOVE_SPACE = frozenset(" \t\n\v\f\r\x00")  # fscanf's %s splits at isspace(); NUL ends a C string
_WRITE_CHUNK_TOKENS = 1 << 22


def glove_words(vocab: Vocabulary) -> list[str]:
    """The words GloVe's ``vocab.txt`` holds: ``vocab``'s regular words, in id order, after
    checking that ``cooccur`` reads each back as the same single token."""
    words = vocab.words
    for w in words:
        if not w or any(c in _GLOVE_SPACE for c in w):
            raise ValueError(f"word {w!r} is empty or contains whitespace/NUL; GloVe's files cannot hold it")
        if len(w.encode("utf-8")) > MAX_WORD_BYTES:
            raise ValueError(f"word {w[:20]!r}... is longer than {MAX_WORD_BYTES} UTF-8 bytes; "
                             "cooccur would truncate it in the corpus")
    return words


def _vocab_of(docs, vocab):
    if vocab is None:
        if not isinstance(docs, EncodedCorpus):
            raise TypeError("vocab is required unless docs is an EncodedCorpus")
        vocab = docs.vocab
    if not isinstance(vocab, Vocabulary):
        raise TypeError(f"vocab must be a distattn Vocabulary, got {type(vocab).__name__}")
    return vocab


def write_glove_vocab(vocab: Vocabulary, path: str | os.PathLike) -> int:
    """Write GloVe's ``vocab.txt``: ``"word count\\n"`` per regular word, in our id order
    (specials such as ``<pad>``/``<unk>`` are not written), UTF-8. Line ``r`` (1-based) is our
    id ``r - 1 + vocab.n_specials``. Counts are ``vocab.counts`` (0 where unknown; ``cooccur``
    ignores them). Returns the number of words written."""
    words = glove_words(vocab)
    counts = vocab.counts[vocab.n_specials:]
    text = "".join(f"{w} {int(c)}\n" for w, c in zip(words, counts))
    with atomic_path(path) as tmp:
        tmp.write_bytes(text.encode("utf-8"))
    return len(words)


def write_glove_corpus(docs, vocab: Vocabulary | None, path: str | os.PathLike, *,
                       oov_token: str | None = None) -> dict:
    """Write documents as GloVe corpus text: one document per line, words separated by single
    spaces, UTF-8, every line ``\\n``-terminated (an empty document is an empty line).

    Parameters
    ----------
    docs : EncodedCorpus, RaggedIds or sequence of int arrays
        Token ids of ``vocab``. Negative ids, ``<unk>`` and every other special id (``<pad>``) are
        out of vocabulary: GloVe's vocabulary holds regular words only.
    vocab : Vocabulary, optional
        Defaults to ``docs.vocab`` for an :class:`EncodedCorpus`.
    oov_token : str, optional
        ``None`` (default): out-of-vocabulary tokens are dropped. A string: each one is written as
        this placeholder, which must not be a vocabulary word (nor ``<unk>``: ``vocab_count``
        refuses corpora containing it). Both give ``cooccur`` the same counts, since it skips
        words missing from ``vocab.txt`` without advancing its window position.

    Returns
    -------
    dict with ``n_docs``, ``n_tokens`` (words written, placeholders included) and ``n_oov``.

    Compare ``cooccur``'s counts with ``cooccurrence(docs, oov="drop")`` on an
    :class:`EncodedCorpus` (whose ``<unk>`` is out of vocabulary) or on ids whose specials are
    mapped to -1: on a plain list of arrays ``cooccurrence`` counts ids 0 and 1 as words.
    """
    from distattn.stats.cooccurrence import as_ragged

    vocab = _vocab_of(docs, vocab)
    words = glove_words(vocab)
    if oov_token is not None:
        if (not oov_token or any(c in _GLOVE_SPACE for c in oov_token) or oov_token in vocab.words
                or oov_token == "<unk>"):
            raise ValueError(f"oov_token={oov_token!r} must be a non-empty word without whitespace that is "
                             "not in the vocabulary and is not '<unk>'")
    ragged, _, _ = as_ragged(docs, len(vocab))
    n_spec = vocab.n_specials
    table = [oov_token] + words  # index 0: OOV placeholder, then word id - n_spec + 1
    ids = np.asarray(ragged.ids)
    if vocab.unk_id is not None:
        ids = np.where(ids == vocab.unk_id, -1, ids)
    offsets = ragged.offsets
    n_docs = len(ragged)
    n_oov = 0
    n_written = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        lo = 0
        while lo < n_docs:
            hi = int(np.searchsorted(offsets, offsets[lo] + _WRITE_CHUNK_TOKENS, side="right")) - 1
            hi = min(max(hi, lo + 1), n_docs)
            off = offsets[lo:hi + 1]
            chunk = ids[off[0]:off[-1]].astype(np.int64) - (n_spec - 1)  # regular word -> >= 1
            bad = chunk < 1
            n_oov += int(bad.sum())
            if oov_token is None:
                kept_before = np.concatenate(([0], np.cumsum(~bad)))  # kept tokens before each position
                starts = kept_before[off - off[0]]
                chunk = chunk[~bad]
            else:
                chunk[bad] = 0
                starts = off - off[0]
            toks = [table[i] for i in chunk.tolist()]
            n_written += len(toks)
            lines = [" ".join(toks[a:b]) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
            fh.write(("\n".join(lines) + "\n").encode("utf-8"))
            lo = hi
    return {"n_docs": n_docs, "n_tokens": n_written, "n_oov": n_oov}


def read_glove_cooccurrence(path: str | os.PathLike, vocab_size: int, id_offset: int = 2) -> sp.csr_array:
    """Read ``cooccur``'s ``cooccurrence.bin`` (or ``shuffle``'s output) into our id space.

    Parameters
    ----------
    path : file of packed :data:`GLOVE_RECORD` records (``int word1, int word2, double val``,
        1-based GloVe ranks).
    vocab_size : n, the result is n × n (``len(vocab)``, specials included).
    id_offset : our id of GloVe rank 1 (``vocab.n_specials``): id = rank - 1 + id_offset.

    Returns
    -------
    scipy.sparse.csr_array of float64, canonical (sorted indices, repeated pairs summed; explicit
    zeros kept only if the file holds them).
    """
    if id_offset < 0 or vocab_size < id_offset:
        raise ValueError(f"need 0 <= id_offset <= vocab_size, got id_offset={id_offset}, vocab_size={vocab_size}")
    nbytes = os.path.getsize(path)
    if nbytes % GLOVE_RECORD.itemsize:
        raise ValueError(f"{path}: size {nbytes} is not a multiple of the {GLOVE_RECORD.itemsize}-byte record")
    rec = np.fromfile(path, dtype=GLOVE_RECORD)
    w1, w2, val = rec["word1"], rec["word2"], rec["val"]
    junk = (w1 == 0) | (w2 == 0)  # rank 0 is never a word: cooccur's record from uninitialised memory
    if junk.any():
        keep = ~junk
        w1, w2, val = w1[keep], w2[keep], val[keep]
    n_words = vocab_size - id_offset
    if len(w1) and (min(w1.min(), w2.min()) < 1 or max(w1.max(), w2.max()) > n_words):
        raise ValueError(f"{path}: ranks span [{min(w1.min(), w2.min())}, {max(w1.max(), w2.max())}], "
                         f"outside [1, {n_words}] (vocab_size={vocab_size}, id_offset={id_offset})")
    shift = id_offset - 1
    rows = w1.astype(np.int64) + shift
    cols = w2.astype(np.int64) + shift
    out = sp.coo_array((val, (rows, cols)), shape=(vocab_size, vocab_size)).tocsr()
    out.sum_duplicates()
    return out


def write_glove_cooccurrence(matrix, path: str | os.PathLike, id_offset: int = 2) -> int:
    """Write a sparse matrix in our id space as GloVe records, sorted by (row, column). Rows and
    columns below ``id_offset`` (specials) must be empty; explicit zeros are not written.
    Readable by GloVe's ``shuffle`` and ``glove``, and by :func:`read_glove_cooccurrence`.
    Returns the number of records."""
    coo = sp.coo_array(matrix, copy=True)
    coo.sum_duplicates()  # also sorts by (row, col)
    coo.eliminate_zeros()
    if coo.nnz and min(coo.row.min(), coo.col.min()) < id_offset:
        raise ValueError(f"the matrix has entries in rows/columns below id_offset={id_offset} (specials)")
    int_max = np.iinfo(np.int32).max  # GloVe's ranks are C ints; a larger one would be written wrapped around
    if coo.nnz and max(coo.row.max(), coo.col.max()) - (id_offset - 1) > int_max:
        raise ValueError(f"the matrix has entries in rows/columns above {int_max + id_offset - 1}: their GloVe "
                         f"ranks would not fit the records' int32 (largest {int_max})")
    rec = np.empty(coo.nnz, dtype=GLOVE_RECORD)
    rec["word1"] = coo.row - (id_offset - 1)
    rec["word2"] = coo.col - (id_offset - 1)
    rec["val"] = coo.data
    with atomic_path(path) as tmp:
        rec.tofile(tmp)
    return coo.nnz


def run_glove_cooccur(cooccur: str | os.PathLike, corpus_path, vocab_path, out_path, *, window: int,
                      symmetric: bool = True, weighting: str = "harmonic", memory: float = 4.0,
                      max_product: int | None = None, overflow_length: int | None = None,
                      overflow_file: str | os.PathLike | None = None) -> float:
    """Run GloVe's ``cooccur`` executable on files; returns its wall time in seconds. Raises
    ``subprocess.CalledProcessError`` (with its stderr) if it fails. Its output goes to a temporary
    file beside ``out_path``, renamed onto ``out_path`` only when ``cooccur`` succeeds."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or not 1 <= window <= 2**31 - 1:
        # cooccur parses it with atoi (2.5 -> 2) and divides by it (0: SIGFPE)
        raise ValueError(f"window must be a positive integer (a C int), got {window!r}")
    if weighting not in ("none", "harmonic"):
        raise ValueError(f"weighting={weighting!r} is not one of ('none', 'harmonic')")
    cmd = [str(cooccur), "-verbose", "0", "-symmetric", "1" if symmetric else "0", "-window-size", str(window),
           "-distance-weighting", "1" if weighting == "harmonic" else "0", "-memory", str(memory),
           "-vocab-file", str(vocab_path)]
    if max_product is not None:
        cmd += ["-max-product", str(max_product)]
    if overflow_length is not None:
        cmd += ["-overflow-length", str(overflow_length)]
    with tempfile.TemporaryDirectory(prefix="glove-overflow-") as tmp:
        cmd += ["-overflow-file", str(overflow_file or Path(tmp) / "overflow")]
        with atomic_path(out_path) as tmp_out:  # a failed run leaves out_path as it was
            with open(corpus_path, "rb") as fin, open(tmp_out, "wb") as fout:
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, stdin=fin, stdout=fout, stderr=subprocess.PIPE)
                elapsed = time.perf_counter() - t0
            if proc.returncode:
                raise subprocess.CalledProcessError(proc.returncode, cmd, stderr=proc.stderr)
    return elapsed


def glove_cooccurrence(docs, vocab: Vocabulary | None = None, *, cooccur: str | os.PathLike, window: int = 5,
                       weighting: str = "none", symmetric: bool = True, workdir: str | os.PathLike | None = None,
                       **run_kwargs) -> sp.csr_array:
    """Counts from GloVe's ``cooccur`` for ``docs`` in our id space (the files are written in
    ``workdir``, default a temporary directory). Compare with
    ``cooccurrence(docs, len(vocab), window=..., weighting=..., symmetric=..., oov="drop")``."""
    vocab = _vocab_of(docs, vocab)
    with tempfile.TemporaryDirectory(prefix="glove-") as tmp:
        d = Path(workdir) if workdir is not None else Path(tmp)
        write_glove_vocab(vocab, d / "vocab.txt")
        write_glove_corpus(docs, vocab, d / "corpus.txt")
        run_glove_cooccur(cooccur, d / "corpus.txt", d / "vocab.txt", d / "cooccurrence.bin", window=window,
                          symmetric=symmetric, weighting=weighting, **run_kwargs)
        return read_glove_cooccurrence(d / "cooccurrence.bin", len(vocab), vocab.n_specials)
