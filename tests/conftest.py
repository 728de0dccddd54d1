"""Shared fixtures. Tests that need the IMDB archive use ``imdb_archive``: it is found through
``DISTATTN_DATA_DIR``; when it is missing the test is skipped locally but FAILS under
``CI=true`` (missing data must never pass silently in CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist workers (the README runs two) share the cores: an OpenMP thread of torch or numba
    # that has finished its share sleeps instead of spinning on a core another worker needs. Read
    # when OpenMP loads, after this import; how long threads wait does not change any result.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session writes caches into a private directory, never the user's."""
    cache = tmp_path_factory.getbasetemp() / "distattn-cache"
    monkeypatch.setenv("DISTATTN_CACHE_DIR", str(cache))
    yield


def _find_archive() -> Path | None:
    env = os.environ.get("DISTATTN_DATA_DIR")
    if env:
        p = Path(env) / "aclImdb_v1.tar.gz"
        if p.is_file():
            return p
    return None


@pytest.fixture(scope="session")
def imdb_archive() -> Path:
    path = _find_archive()
    if path is None:
        msg = ("IMDB archive not found: set DISTATTN_DATA_DIR to the directory holding aclImdb_v1.tar.gz "
               f"(DISTATTN_DATA_DIR={os.environ.get('DISTATTN_DATA_DIR')!r})")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def imdb_tokenized(imdb_archive, tmp_path_factory):
    """The whole IMDB corpus, tokenized once per test session (cached in a session directory)."""
    from distattn.corpus import ImdbCorpus, tokenize_corpus
    cache = tmp_path_factory.mktemp("imdb-tokens")
    return tokenize_corpus(ImdbCorpus(data_dir=imdb_archive.parent, download=False, progress=False), cache=cache)


def require(module: str):
    """Import an optional dependency for a test module: skipped locally when missing, a
    failure under CI=true (CI installs every extra)."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{module} is required under CI: {exc}", pytrace=False)
        pytest.skip(f"{module} is not installed", allow_module_level=True)
