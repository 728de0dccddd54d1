
import warnings

import numpy as np
import pytest

from distattn.corpus import (ArchiveNotFoundError, CorruptArchiveError, ImdbCorpus, fetch_imdb, get_corpus,
                             tokenize_corpus)
from distattn.corpus.imdb import ARCHIVE_NAME, KNOWN_ARCHIVES

pytestmark = pytest.mark.imdb


def test_splits_labels_ratings(imdb_tokenized):
    tc = imdb_tokenized
    assert len(tc) == 100_000
    train, test, unsup = tc.split("train"), tc.split("test"), tc.split("unsup")
    assert (len(train), len(test), len(unsup)) == (25_000, 25_000, 50_000)
    for part in (train, test):
        assert np.count_nonzero(part.labels == 1) == 12_500 and np.count_nonzero(part.labels == 0) == 12_500
        r = part.docs.ratings
        assert r[part.labels == 1].min() >= 7 and r[part.labels == 0].max() <= 4   # Maas et al.'s thresholds
    assert (unsup.labels == -1).all() and (unsup.docs.ratings == 0).all()
    assert len(tc.split("train+unsup")) == 75_000
    assert 23_000_000 < tc.n_tokens < 24_000_000


def test_archive_checksum_is_known(imdb_archive):
    from distattn.corpus import sha256_file
    assert sha256_file(imdb_archive) in KNOWN_ARCHIVES


def test_truncated_archive_is_a_clear_error_and_caches_nothing(imdb_archive, tmp_path):
    bad = tmp_path / "data" / ARCHIVE_NAME
    bad.parent.mkdir()
    with open(imdb_archive, "rb") as src, open(bad, "wb") as dst:
        dst.write(src.read(3_000_000))
    cache = tmp_path / "cache"
    with pytest.raises(CorruptArchiveError, match="truncated or damaged"):
        tokenize_corpus(ImdbCorpus(split="train", data_dir=bad.parent, download=False), cache=cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_missing_archive_offline_message(tmp_path, monkeypatch):
    monkeypatch.delenv("DISTATTN_DATA_DIR", raising=False)
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ArchiveNotFoundError, match=r"looked for .*aclImdb_v1.tar.gz.*DISTATTN_DATA_DIR"):
        fetch_imdb(tmp_path / "nowhere", download_missing=False)
    # the download fails (no network: an unreachable local URL) -> same clear message, nothing cached
    monkeypatch.setenv("DISTATTN_IMDB_URL", "http://127.0.0.1:9/aclImdb_v1.tar.gz")
    with pytest.raises(ArchiveNotFoundError, match="download failed"):
        fetch_imdb(tmp_path / "nowhere", progress=False)
    assert not any((tmp_path / "cache").glob("*"))


def test_data_dir_variable_naming_no_directory_is_warned_before_a_download(tmp_path, monkeypatch):
    # a typo in DISTATTN_DATA_DIR once made the search go on to the cache and download silently
    monkeypatch.setenv("DISTATTN_DATA_DIR", str(tmp_path / "typo"))
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DISTATTN_IMDB_URL", "http://127.0.0.1:9/aclImdb_v1.tar.gz")
    with pytest.warns(UserWarning, match=r"DISTATTN_DATA_DIR='.*typo' is not a directory"):
        with pytest.raises(ArchiveNotFoundError, match="download failed"):
            fetch_imdb(progress=False)
    # under torchrun the first process warns, not every one of them (they all look for the archive)
    for rank, warned in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ArchiveNotFoundError, match="download failed"):
                fetch_imdb(progress=False)
        assert any("is not a directory" in str(w.message) for w in caught) is warned, rank
    monkeypatch.delenv("RANK")
    (tmp_path / "typo").mkdir()               # an existing directory without the archive: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ArchiveNotFoundError, match="download failed"):
            fetch_imdb(progress=False)


def test_download_into_cache_from_file_url(imdb_archive, tmp_path, monkeypatch):
    monkeypatch.delenv("DISTATTN_DATA_DIR", raising=False)
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DISTATTN_IMDB_URL", imdb_archive.resolve().as_uri())
    path = fetch_imdb(tmp_path / "nowhere", progress=False)
    assert path == tmp_path / "cache" / ARCHIVE_NAME and path.stat().st_size == imdb_archive.stat().st_size
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [ARCHIVE_NAME]
    assert fetch_imdb(tmp_path / "nowhere") == path   # found in the cache the second time


def test_wrong_download_is_rejected_and_removed(tmp_path, monkeypatch):
    import io
    import tarfile
    fake = tmp_path / "fake.tar.gz"
    with tarfile.open(fake, "w:gz") as tf:
        data = b"a tiny review"
        info = tarfile.TarInfo("aclImdb/train/pos/0_9.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    monkeypatch.delenv("DISTATTN_DATA_DIR", raising=False)
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DISTATTN_IMDB_URL", fake.as_uri())
    with pytest.raises(CorruptArchiveError, match="does not hold the IMDB reviews: train/pos: 1 reviews"):
        fetch_imdb(tmp_path / "nowhere", progress=False)
    assert not any((tmp_path / "cache").iterdir())


def test_unknown_split():
    with pytest.raises(ValueError, match="unknown IMDB split 'dev'; valid splits"):
        get_corpus("imdb", split="train+dev")


def test_movie_ids_follow_the_reviews_and_the_official_split_keeps_movies_apart(imdb_archive):
    import re
    import tarfile

    from distattn.corpus import read_imdb_archive, read_imdb_movie_ids

    ids = read_imdb_movie_ids(imdb_archive, splits=("train", "test", "unsup"))
    docs = read_imdb_archive(imdb_archive)
    assert len(ids) == len(docs) == 100_000 and all(re.fullmatch(r"tt\d+", m) for m in ids)
    # read independently with tarfile: line i of urls_<label>.txt is the movie of review i
    with tarfile.open(imdb_archive) as tf:
        urls = {(top, sub): tf.extractfile(f"aclImdb/{top}/urls_{sub}.txt").read().decode().split()
                for top, sub in (("train", "pos"), ("train", "neg"), ("test", "pos"), ("test", "neg"),
                                 ("train", "unsup"))}
    for i in (0, 1, 12_499, 12_500, 24_999, 25_000, 37_777, 49_999, 50_000, 99_999):
        top, sub, rid = re.match(r"aclImdb/(\w+)/(\w+)/(\d+)_", docs[i].name).groups()
        assert f"/title/{ids[i]}/" in urls[(top, sub)][int(rid)]
    assert read_imdb_movie_ids(imdb_archive, splits=("test",)) == ids[25_000:50_000]
    train, test, unsup = set(ids[:25_000]), set(ids[25_000:50_000]), set(ids[50_000:])
    assert 3_000 < len(train) < 4_000 and 3_000 < len(test) < 4_000
    assert len(train & test) <= 1 and not unsup & (train | test)      # Maas et al.: movies kept apart
    assert ImdbCorpus(split="test", data_dir=imdb_archive.parent, download=False).movie_ids() == ids[25_000:50_000]


def _tiny_archive(path, urls_pos: bytes | None):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tf:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        add("aclImdb/train/pos/0_9.txt", b"great film")
        add("aclImdb/train/pos/1_8.txt", b"fine film")
        if urls_pos is not None:
            add("aclImdb/train/urls_pos.txt", urls_pos)
    return path


def test_movie_ids_need_the_url_lists(tmp_path):
    from distattn.corpus import read_imdb_movie_ids

    ok = _tiny_archive(tmp_path / "a.tar.gz", b"http://www.imdb.com/title/tt0000007/usercomments\n"
                                              b"http://www.imdb.com/title/tt0000042/usercomments\n")
    assert read_imdb_movie_ids(ok, splits=("train",)) == ["tt0000007", "tt0000042"]
    assert read_imdb_movie_ids(ok, splits=("test",)) == []
    with pytest.raises(CorruptArchiveError, match="no aclImdb/train/urls_pos.txt"):
        read_imdb_movie_ids(_tiny_archive(tmp_path / "b.tar.gz", None), splits=("train",))
    with pytest.raises(CorruptArchiveError, match=r"no IMDB title for review 1 \(line 2\)"):
        read_imdb_movie_ids(_tiny_archive(tmp_path / "c.tar.gz", b"http://www.imdb.com/title/tt0000007/x\n"),
                            splits=("train",))
    with pytest.raises(ValueError, match="unknown IMDB split 'dev'"):
        read_imdb_movie_ids(ok, splits=("dev",))


def test_a_bad_download_is_reported_by_its_url_not_by_the_removed_temporary_file(tmp_path, monkeypatch):
    # the archive checks named the temporary .part file (already removed) and advised deleting it and
    # fetching the official URL again, even when the bad file came from DISTATTN_IMDB_URL
    page = tmp_path / "mirror.tar.gz"
    page.write_bytes(b"<html>404 Not Found</html>")
    monkeypatch.delenv("DISTATTN_DATA_DIR", raising=False)
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DISTATTN_IMDB_URL", page.as_uri())
    with pytest.raises(CorruptArchiveError) as info:
        fetch_imdb(tmp_path / "nowhere", progress=False)
    msg = str(info.value)
    assert page.as_uri() in msg and "not a readable gzip'd tar archive" in msg and "nothing was kept" in msg
    assert ".part" not in msg and "Delete it" not in msg
    assert not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("cut", [1024, 1124])     # at a tar member boundary; inside the second tar member
def test_an_archive_of_several_gzip_members_is_read_whole(tmp_path, cut):
    # zlib.decompress stops after the first gzip member (bgzip, or `cat a.gz b.gz`, write several; gzip,
    # tar and tarfile read them all): the rest of the archive was silently left out, or the valid
    # archive called truncated
    import gzip

    from distattn.corpus import read_imdb_movie_ids

    one = _tiny_archive(tmp_path / "one.tar.gz", b"http://www.imdb.com/title/tt0000007/usercomments\n"
                                                 b"http://www.imdb.com/title/tt0000042/usercomments\n")
    image = gzip.decompress(one.read_bytes())
    two = tmp_path / "two.tar.gz"
    two.write_bytes(gzip.compress(image[:cut]) + gzip.compress(image[cut:]))
    assert gzip.decompress(two.read_bytes()) == image
    assert read_imdb_movie_ids(two, splits=("train",)) == ["tt0000007", "tt0000042"]


def test_split_order_does_not_change_the_documents_or_their_order(imdb_archive):
    """The premise of the statistics' cache keys taking the splits in the archive's order: 'unsup+train'
    reads exactly the documents of 'train+unsup', in the same order."""
    from distattn.corpus.imdb import read_imdb_archive
    docs = read_imdb_archive(imdb_archive, ["train", "unsup"])
    assert len(docs) == 75_000 and docs == read_imdb_archive(imdb_archive, ["unsup", "train"])
