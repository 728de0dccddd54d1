"""Stage 1: corpora, tokenization and the vocabulary.

>>> from distattn.corpus import get_corpus, tokenize_corpus
>>> tc = tokenize_corpus(get_corpus("imdb", split="train+unsup"))
>>> vocab = tc.vocabulary(max_size=30_000)
>>> enc = tc.encode(vocab, oov="negative")
"""

from distattn.atomic import sha256_file
from distattn.corpus.documents import NO_LABEL, Corpus, Document
from distattn.corpus.download import DownloadError, download
from distattn.corpus.imdb import (ArchiveNotFoundError, CorruptArchiveError, ImdbCorpus, fetch_imdb,
                                  find_imdb_archive, movie_disjoint_split, read_imdb_archive,
                                  read_imdb_movie_ids)
from distattn.corpus.ragged import RaggedIds
from distattn.corpus.registry import UnknownCorpusError, available_corpora, get_corpus, register_corpus
from distattn.corpus.text import TextCorpus
from distattn.corpus.tokenize import (RegexTokenizer, SeedLiteralTokenizer, WhitespaceTokenizer, default_tokenizer,
                                      unicode_tokenizer)
from distattn.corpus.tokenized import (DocumentTable, EmptyCorpusError, EncodedCorpus, TokenizedCorpus,
                                       tokenize_corpus)
from distattn.corpus.vocabulary import PAD, UNK, Vocabulary

__all__ = [
    "NO_LABEL", "Corpus", "Document", "DownloadError", "download", "sha256_file", "ArchiveNotFoundError",
    "CorruptArchiveError", "ImdbCorpus", "fetch_imdb", "find_imdb_archive", "read_imdb_archive", "read_imdb_movie_ids",
    "movie_disjoint_split", "RaggedIds",
    "UnknownCorpusError", "available_corpora", "get_corpus", "register_corpus", "TextCorpus", "RegexTokenizer",
    "WhitespaceTokenizer", "SeedLiteralTokenizer", "default_tokenizer", "unicode_tokenizer", "DocumentTable", "EmptyCorpusError", "EncodedCorpus",
    "TokenizedCorpus", "tokenize_corpus", "PAD", "UNK", "Vocabulary",
]
