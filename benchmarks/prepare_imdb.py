"""Prepare the IMDB arrays the model benchmarks need, once, on the CPU.

Writes one ``.npz`` (atomically) holding, on the toolkit's tokenizer and the statistics layer's
30k vocabulary, that of train+unsup (``<pad>`` = 0, ``<unk>`` = 1; the models use "the same
tokenizer, vocabulary and data splits as the statistics layer"; test is never seen):

* ``{train,test,unsup}_ids`` (uint16), ``*_offsets`` (int64), ``{train,test}_labels`` (int8);
* ``svd`` (float16, 30 000 × dim): PPMI-SVD vectors from train+unsup only (never test):
  ``cooccurrence(window=2, weighting="none")`` → ``ppmi(cds=0.75)`` → ``SVDEmbeddings(dim, eig=0.5)``;
* ``words``: the vocabulary, one word per line; ``vocab_from``: the splits it was counted on.
* ``{train,test}_movies`` (int32): each labelled review's movie (its IMDB title, one code per title
  across both splits), for ``bench_models.py``'s movie-disjoint split.

``--vocab-from train+test`` counts the vocabulary on the 50k labelled reviews instead (test text,
never its labels), as the seed's repository most likely did on its own split of them. It exists to
measure how much that difference moves the seed classifier on the official split; it is not the
toolkit's recipe, and the file records it in ``vocab_from``. The PPMI-SVD vectors stay counted on
train+unsup whatever the vocabulary.

``--tokenizer seed-literal`` tokenizes with the seed's ``simple_tokenize`` exactly as printed
(:class:`~distattn.corpus.SeedLiteralTokenizer`: punctuation stays attached, ``"great!"``) instead of
the toolkit's tokenizer, its evident intent; likewise a measurement of the seed classifier, not the
toolkit's recipe, recorded in ``tokenizer``.

The file lets a GPU machine skip tokenization and the SVD (about two minutes on two cores);
``bench_models.py`` rebuilds the same arrays from the corpus when the default file is absent (a
``--prep`` naming no file is refused).

    python benchmarks/prepare_imdb.py --out .gpu/prep/imdb_prep.npz
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from distattn.atomic import atomic_path

VOCAB_SIZE = 30_000
VOCAB_FROM = "train+unsup"      # the statistics layer's IMDB documents
VOCAB_CHOICES = (VOCAB_FROM, "train+test")
TOKENIZER = "regex"             # the toolkit's IMDB tokenizer (default_tokenizer)
TOKENIZER_CHOICES = (TOKENIZER, "seed-literal")


def build_arrays(svd_dim: int = 256, with_svd: bool = True, log=print, vocab_from: str = VOCAB_FROM,
                 tokenizer: str = TOKENIZER) -> dict:
    from distattn.corpus import SeedLiteralTokenizer, default_tokenizer, get_corpus, tokenize_corpus

    if vocab_from not in VOCAB_CHOICES:
        raise ValueError(f"vocab_from={vocab_from!r}: expected one of {', '.join(VOCAB_CHOICES)}")
    if tokenizer not in TOKENIZER_CHOICES:
        raise ValueError(f"tokenizer={tokenizer!r}: expected one of {', '.join(TOKENIZER_CHOICES)}")
    t = time.perf_counter()
    tok = SeedLiteralTokenizer() if tokenizer == "seed-literal" else default_tokenizer()
    tc = tokenize_corpus(get_corpus("imdb"), tokenizer=tok)
    vocab = tc.split(vocab_from).vocabulary(max_size=VOCAB_SIZE - 2)
    assert len(vocab) == VOCAB_SIZE and vocab.pad_id == 0 and vocab.unk_id == 1
    out = {"words": np.array("\n".join(vocab.itos)), "vocab_from": np.array(vocab_from),
           "tokenizer": np.array(tokenizer)}
    for split in ("train", "test", "unsup"):
        enc = tc.split(split).encode(vocab)
        out[f"{split}_ids"] = enc.tokens.ids.astype(np.uint16)
        out[f"{split}_offsets"] = np.asarray(enc.tokens.offsets, dtype=np.int64)
        if split != "unsup":
            out[f"{split}_labels"] = np.asarray(enc.labels, dtype=np.int8)
    log(f"tokenized and encoded in {time.perf_counter() - t:.1f}s")
    # each labelled review's movie, coded as one int32 per distinct IMDB title across train and
    # test (Maas et al. keep a movie on one side), for bench_models' movie-disjoint split
    titles = np.asarray(get_corpus("imdb", split="train+test").movie_ids())
    n_train = len(out["train_labels"])
    if len(titles) != n_train + len(out["test_labels"]):
        raise RuntimeError(f"{len(titles)} movie ids for {n_train} + {len(out['test_labels'])} labelled reviews")
    codes = np.unique(titles, return_inverse=True)[1].reshape(-1).astype(np.int32)
    out["train_movies"], out["test_movies"] = codes[:n_train], codes[n_train:]
    if with_svd:
        from distattn.stats import SVDEmbeddings, cooccurrence, ppmi

        t = time.perf_counter()
        neg = tc.split("train+unsup").encode(vocab, oov="negative")
        counts = cooccurrence(neg.tokens, len(vocab), window=2, weighting="none")
        emb = SVDEmbeddings(dim=svd_dim, eig=0.5).fit(ppmi(counts, cds=0.75))
        out["svd"] = np.asarray(emb.vectors_, dtype=np.float16)
        log(f"PPMI-SVD ({svd_dim} dims) in {time.perf_counter() - t:.1f}s")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".gpu/prep/imdb_prep.npz")
    ap.add_argument("--svd-dim", type=int, default=256)
    ap.add_argument("--vocab-from", default=VOCAB_FROM, choices=VOCAB_CHOICES,
                    help="splits the 30k vocabulary is counted on (default %(default)s; train+test only "
                         "to measure the seed repository's choice, see the module docstring)")
    ap.add_argument("--tokenizer", default=TOKENIZER, choices=TOKENIZER_CHOICES,
                    help="the toolkit's tokenizer (default %(default)s), or the seed's simple_tokenize to the "
                         "letter (seed-literal, punctuation attached; to measure the seed classifier, see above)")
    ap.add_argument("--no-svd", action="store_true", help="skip the PPMI-SVD vectors (the seed recipe needs none)")
    args = ap.parse_args()
    arrays = build_arrays(args.svd_dim, with_svd=not args.no_svd, vocab_from=args.vocab_from,
                          tokenizer=args.tokenizer)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, suffix=".npz") as tmp:
        np.savez_compressed(tmp, **arrays)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
