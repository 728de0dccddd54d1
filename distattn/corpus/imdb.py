"""The Large Movie Review Dataset (Maas et al., 2011), read straight from ``aclImdb_v1.tar.gz``.

Where the archive is looked for, in order: ``data_dir`` (``--data-dir``), ``$DISTATTN_DATA_DIR``,
the user cache directory. If it is in none of them and ``download=True``, the official archive
is downloaded into the cache (atomic, size and checksum checked).

Two archives are accepted by checksum: the official one and the re-packed copy shipped in
``../shared/data`` (same reviews, without the bag-of-words feature files). Any other archive is
accepted only if its contents check out: 12,500 reviews in each of train/pos, train/neg,
test/pos, test/neg and 50,000 in train/unsup.
"""

from __future__ import annotations

import os
import re
import tarfile
import warnings
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from distattn.atomic import sha256_file
from distattn.corpus.documents import NO_LABEL, Corpus, Document
from distattn.corpus.tar_index import index_regular_files
from distattn.corpus.download import DownloadError, download
from distattn.corpus.tokenized import parse_splits
from distattn.paths import cache_dir, data_dirs

ARCHIVE_NAME = "aclImdb_v1.tar.gz"
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
KNOWN_ARCHIVES = {  # sha256 -> size in bytes
    "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe": 84_125_825,  # official
    "a3bb2208bdc4154c984c771622ac18e34a5d931fa63c77ce38c6b1a3d5dd6456": 56_744_565,  # shared/data copy
}
SPLITS = ("train", "test", "unsup")
EXPECTED_COUNTS = {("train", "pos"): 12_500, ("train", "neg"): 12_500, ("test", "pos"): 12_500,
                   ("test", "neg"): 12_500, ("train", "unsup"): 50_000}
_MEMBER = re.compile(r"^aclImdb/(train|test)/(pos|neg|unsup)/(\d+)_(\d+)\.txt$")
_LABELS = {"pos": 1, "neg": 0, "unsup": NO_LABEL}


class ArchiveNotFoundError(FileNotFoundError):
    """No archive where we looked, and no download possible."""


class CorruptArchiveError(ValueError):
    """The archive is truncated, not a gzip/tar file, or holds the wrong reviews."""


def _corrupt(path, reason: str, advice: str = "") -> CorruptArchiveError:
    """``path reason advice``; ``reason`` is kept as an attribute, to be told of another source."""
    err = CorruptArchiveError(f"{path} {reason}{advice}")
    err.reason = reason
    return err


def find_imdb_archive(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The first ``aclImdb_v1.tar.gz`` in the search path, or None."""
    for d in data_dirs(data_dir):
        p = Path(d) / ARCHIVE_NAME
        if p.is_file():
            return p
    return None


def fetch_imdb(data_dir: str | os.PathLike | None = None, download_missing: bool = True,
               url: str | None = None, progress: bool = True) -> Path:
    """Path to the IMDB archive, downloading it into the cache if it is nowhere else.

    ``url`` defaults to ``$DISTATTN_IMDB_URL`` or the official address.
    """
    found = find_imdb_archive(data_dir)
    if found is not None:
        return found
    searched = [str(Path(d) / ARCHIVE_NAME) for d in data_dirs(data_dir)]
    target = cache_dir() / ARCHIVE_NAME
    how = (f"Put {ARCHIVE_NAME} (from {IMDB_URL}) in one of those places, pass --data-dir DIR, "
           "or set DISTATTN_DATA_DIR=DIR.")
    if not download_missing:
        raise ArchiveNotFoundError(f"IMDB archive not found; looked for {searched}. {how}")
    url = url or os.environ.get("DISTATTN_IMDB_URL") or IMDB_URL
    env = os.environ.get("DISTATTN_DATA_DIR")
    if env and not Path(env).expanduser().is_dir() and os.environ.get("RANK", "0") == "0":
        # a typo there once sent the run to download the whole archive without a word; under torchrun
        # (RANK set) the first process says so, not every one of them
        warnings.warn(f"DISTATTN_DATA_DIR={env!r} is not a directory, so the IMDB archive could not be "
                      f"found there; downloading it from {url} into {target.parent}", stacklevel=2)

    def verify(tmp: Path, sha256: str) -> None:
        # the checks name the file they read: here a temporary one, removed when they fail
        try:
            verify_imdb_archive(tmp, sha256)
        except CorruptArchiveError as exc:
            raise CorruptArchiveError(f"the file downloaded from {url} {exc.reason}; nothing was kept") from None

    try:
        download(url, target, progress=progress, verify=verify)
    except DownloadError as exc:
        raise ArchiveNotFoundError(f"IMDB archive not found (looked for {searched}) and the download "
                                   f"failed: {exc}. {how}") from exc
    return target


def verify_imdb_archive(path: str | os.PathLike, sha256: str | None = None) -> None:
    """Accept an archive whose sha256 is one of :data:`KNOWN_ARCHIVES`; otherwise read it and
    check its contents (review counts per folder). Raises :class:`CorruptArchiveError`."""
    sha256 = sha256 or sha256_file(path)
    if sha256 in KNOWN_ARCHIVES:
        return
    read_imdb_archive(path, splits=())


def _gunzip(raw: bytes) -> bytes:
    """Every member of a gzip file: ``zlib.decompress`` stops after the first (bgzip, or ``cat a.gz
    b.gz``, write several; gzip and tar read them all). Raises ``zlib.error`` if one is cut short."""
    parts = []
    while True:
        d = zlib.decompressobj(47)  # 47: gzip or zlib header, max window
        parts.append(d.decompress(raw))
        if not d.eof:
            raise zlib.error("incomplete or truncated stream")
        raw = d.unused_data
        if not raw.startswith(b"\x1f\x8b"):    # anything after the last member is ignored, as before
            return b"".join(parts)


def _archive_members(path: Path) -> tuple[bytes, list[tuple[str, int, int]]]:
    """The decompressed tar image and its (name, offset, size) regular files."""
    try:
        raw = path.read_bytes()
        data = _gunzip(raw)
        return data, index_regular_files(data)
    except (zlib.error, tarfile.TarError, EOFError) as exc:
        raise _corrupt(path, f"is not a readable gzip'd tar archive ({exc}); it is probably truncated or damaged",
                       f". Delete it and fetch {IMDB_URL} again.") from None


def _check_splits(splits: Sequence[str]) -> set[str]:
    wanted = set(splits)
    bad = wanted - set(SPLITS)
    if bad:
        raise ValueError(f"unknown IMDB split {sorted(bad)[0]!r}; valid splits: {list(SPLITS)}")
    return wanted


def _review_order(top: str, sub: str, rid: str) -> tuple[str, tuple[int, int, int]]:
    """A review member's split and its sort key, (split, label, review id): the one order of
    :func:`read_imdb_archive` and :func:`read_imdb_movie_ids`."""
    split = "unsup" if sub == "unsup" else top
    return split, (SPLITS.index(split), -_LABELS[sub], int(rid))


def read_imdb_archive(path: str | os.PathLike, splits: Sequence[str] = SPLITS) -> list[Document]:
    """All reviews of the given splits, sorted by (split, label, review id) so the order does
    not depend on how the archive was packed. Checks the per-folder review counts."""
    path = Path(path)
    wanted = _check_splits(splits)
    data, members = _archive_members(path)
    view = memoryview(data)
    counts = dict.fromkeys(EXPECTED_COUNTS, 0)
    rows = []
    for name, offset, size in members:
        match = _MEMBER.match(name)
        if not match:
            continue
        top, sub, rid, rating = match.groups()
        split, key = _review_order(top, sub, rid)
        if (top, sub) in counts:
            counts[(top, sub)] += 1
        if split not in wanted:
            continue
        if offset + size > len(data):
            raise _corrupt(path, f"has a member {name} that runs past the end of the archive (truncated)")
        rows.append((key,
                     Document(bytes(view[offset:offset + size]), _LABELS[sub], int(rating), split, name)))
    wrong = {f"{a}/{b}": (n, EXPECTED_COUNTS[(a, b)]) for (a, b), n in counts.items() if n != EXPECTED_COUNTS[(a, b)]}
    if wrong:
        detail = ", ".join(f"{k}: {n} reviews (expected {e})" for k, (n, e) in wrong.items())
        raise _corrupt(path, f"does not hold the IMDB reviews: {detail}")
    rows.sort(key=lambda r: r[0])
    return [d for _, d in rows]


_URLS = re.compile(r"^aclImdb/(train|test)/urls_(pos|neg|unsup)\.txt$")
_TITLE = re.compile(rb"/title/(tt\d+)/")


def read_imdb_movie_ids(path: str | os.PathLike, splits: Sequence[str] = SPLITS) -> list[str]:
    """The IMDB title id (``"tt0453418"``) of the movie each review is about, in the order of
    :func:`read_imdb_archive` for the same ``splits``.

    The archive's ``urls_{pos,neg,unsup}.txt`` give, at line *i*, the movie of review *i* of that
    folder. Maas et al. keep each movie on one side of the official split (train, test and unsup
    share no movie, but for one), so a validation set drawn at random from train shares its
    movies with the rest of train (97 % of 2,500 such reviews); hold out whole movies
    (``GroupKFold`` with these ids as groups) for a validation set that is, like test, about
    unseen movies. ``analyses/movie_overlap.py`` measures how well either kind ranks settings
    the way test does.
    """
    path = Path(path)
    wanted = _check_splits(splits)
    data, members = _archive_members(path)
    view = memoryview(data)
    urls, keys = {}, []
    for name, offset, size in members:
        if match := _URLS.match(name):
            urls[match.groups()] = bytes(view[offset:offset + size]).split()
        elif match := _MEMBER.match(name):
            top, sub, rid, _ = match.groups()
            split, key = _review_order(top, sub, rid)
            if split in wanted:
                keys.append((key, top, sub))
    keys.sort()
    out = []
    for (*_, rid), top, sub in keys:
        lines = urls.get((top, sub))
        if lines is None:
            raise CorruptArchiveError(f"{path} has no aclImdb/{top}/urls_{sub}.txt, which gives the movie of "
                                      f"each review; the official archive ({IMDB_URL}) has it")
        found = _TITLE.search(lines[rid]) if rid < len(lines) else None
        if found is None:
            raise CorruptArchiveError(f"{path}: aclImdb/{top}/urls_{sub}.txt gives no IMDB title for review "
                                      f"{rid} (line {rid + 1})")
        out.append(found.group(1).decode("ascii"))
    return out


def movie_disjoint_split(movies: Sequence, n_held_out: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held_out) indices of ``movies`` (one movie id per review, e.g. from
    :func:`read_imdb_movie_ids`) with no movie on both sides, each sorted.

    Whole movies, in the order of ``numpy.random.default_rng(seed).permutation`` over the distinct
    ids (sorted first, so the split depends on the ids, not on the reviews' order), go to the
    held-out side until it holds at least ``n_held_out`` reviews; it overshoots by less than the
    last movie's review count. The official IMDB split is movie-disjoint like this; a split drawn
    review by review is not (a random 2,500 of train: 97 % of them about a movie the rest covers).
    """
    ids = np.asarray(movies)
    if ids.ndim != 1:
        raise ValueError(f"movies must be one id per review (1-d); got shape {ids.shape}")
    if isinstance(n_held_out, bool) or not isinstance(n_held_out, (int, np.integer)) or n_held_out < 1:
        raise ValueError(f"n_held_out={n_held_out!r}: expected a positive integer")
    names, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    order = np.random.default_rng(seed).permutation(len(names))
    cum = np.cumsum(counts[order])
    n_movies = int(np.searchsorted(cum, n_held_out)) + 1       # the first prefix of movies reaching n_held_out
    if n_movies >= len(names):
        allowed = f"at most {int(cum[-2])} with seed {seed}" if len(names) > 1 else "none: one movie cannot be split"
        raise ValueError(f"n_held_out={n_held_out}: holding out that many reviews in whole movies leaves none "
                         f"to keep ({len(ids)} reviews of {len(names)} movies); allowed: {allowed}")
    held = np.isin(inverse.reshape(-1), order[:n_movies])
    return np.flatnonzero(~held), np.flatnonzero(held)


def canonical_split(split: str | Sequence[str]) -> str:
    """``"unsup+train"`` -> ``"train+unsup"``: the splits in the archive's order (:data:`SPLITS`),
    each once. :func:`read_imdb_archive` returns the same documents in the same order however the
    splits are listed, so the cache keys use this form (``"train+unsup"`` and
    ``"train+test+unsup"`` are already in it)."""
    wanted = parse_splits(split)
    return "+".join(s for s in SPLITS if s in wanted)


class ImdbCorpus(Corpus):
    """IMDB reviews of one or more splits (``"train"``, ``"test"``, ``"unsup"``; combine with
    ``+``). Labels: 1 positive, 0 negative, -1 unlabelled; ratings from the file names."""

    name = "imdb"

    def __init__(self, split: str | Sequence[str] = "train+test+unsup", data_dir: str | os.PathLike | None = None,
                 download: bool = True, progress: bool = True):
        self.splits = parse_splits(split)
        bad = [s for s in self.splits if s not in SPLITS]
        if bad:
            raise ValueError(f"unknown IMDB split {bad[0]!r}; valid splits: {list(SPLITS)}")
        self.data_dir = data_dir
        self.download = download
        self.progress = progress
        self._path: Path | None = None
        self._sha: str | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = fetch_imdb(self.data_dir, self.download, progress=self.progress)
        return self._path

    def default_tokenizer(self):
        """The seed's tokenizer (ASCII words, :func:`~distattn.corpus.tokenize.default_tokenizer`),
        as every IMDB figure of this toolkit was measured with."""
        from distattn.corpus.tokenize import default_tokenizer
        return default_tokenizer()

    def fingerprint(self) -> dict:
        if self._sha is None:
            self._sha = sha256_file(self.path)
        # the archive's order: "unsup+train" tokenized the same documents under a second cache key
        return {"corpus": "imdb", "splits": canonical_split(self.splits).split("+"), "archive_sha256": self._sha}

    def __iter__(self) -> Iterator[Document]:
        yield from read_imdb_archive(self.path, self.splits)

    def movie_ids(self) -> list[str]:
        """The IMDB title id of each review's movie, in iteration order
        (:func:`read_imdb_movie_ids`): groups for a movie-disjoint validation split."""
        return read_imdb_movie_ids(self.path, self.splits)

    def __repr__(self) -> str:
        return f"ImdbCorpus(split={'+'.join(self.splits)!r})"
