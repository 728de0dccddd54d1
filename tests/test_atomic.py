"""Atomic writes: all or nothing, and the permissions a plain write would give."""

from __future__ import annotations

import json
import os
import stat

import pytest

from distattn.atomic import atomic_dir, atomic_path, write_json


@pytest.fixture
def umask():
    old = os.umask(0o022)
    try:
        yield lambda m: os.umask(m)
    finally:
        os.umask(old)


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_finished_files_and_dirs_get_the_umask_permissions(tmp_path, umask, mask):
    umask(mask)
    with atomic_path(tmp_path / "a.txt") as tmp:
        tmp.write_text("x")
    write_json(tmp_path / "m.json", {"k": 1})
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "inner.txt").write_text("y")
    assert mode(tmp_path / "a.txt") == 0o666 & ~mask
    assert mode(tmp_path / "m.json") == 0o666 & ~mask
    assert mode(tmp_path / "d") == 0o777 & ~mask
    assert json.loads((tmp_path / "m.json").read_text()) == {"k": 1}
    assert (tmp_path / "d" / "inner.txt").read_text() == "y"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "x").write_text("half")
            raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_atomic_dir_keeps_the_first_finished_copy(tmp_path):
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "x").write_text("first")
    with atomic_dir(tmp_path / "d") as tmp:       # another writer finishes second: its copy is dropped
        (tmp / "x").write_text("second")
    assert (tmp_path / "d" / "x").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """The XDG spec: a relative $XDG_CACHE_HOME is invalid and ignored. It was used as given, so the
    cache moved with the working directory."""
    from distattn.paths import cache_dir
    monkeypatch.delenv("DISTATTN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "rel/cache")
    assert cache_dir(create=False) == tmp_path / "home" / ".cache" / "distattn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir(create=False) == tmp_path / "xdg" / "distattn"
