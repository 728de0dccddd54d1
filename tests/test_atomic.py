"""Atomic writes: all or nothing, and the permissions a plain write would give."""

from __future__ import annotations

import json
import os
import re
import stat
import time

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


# A child that starts an atomic write of TARGET and is killed (SIGKILL) inside it, leaving the
# temporary behind; with WAIT set it blocks on stdin instead, a live writer. A third argument
# is the host name it reports.
_KILLED_WRITER = r"""
import os, signal, socket, sys
if len(sys.argv) > 3:
    socket.gethostname = lambda: sys.argv[3]
from distattn.atomic import atomic_dir, atomic_path
kind, target = sys.argv[1], sys.argv[2]
with (atomic_dir if kind == "dir" else atomic_path)(target) as tmp:
    (tmp / "x" if kind == "dir" else tmp).write_text("half")
    print(tmp.name, flush=True)
    if os.environ.get("WAIT"):
        sys.stdin.read()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _env(**extra):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def _killed_write(kind, target, *host):
    """The name of the temporary a writer of ``target`` left when it was killed."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _KILLED_WRITER, kind, str(target), *host],
                       capture_output=True, text=True, env=_env())
    assert r.returncode == -9, r.stderr
    return r.stdout.strip()


def _age(path):
    from distattn import atomic
    old = time.time() - 2 * getattr(atomic, "STALE_TEMP_AGE", 3600)
    os.utime(path, (old, old))


def _write(kind, target):
    if kind == "dir":
        with atomic_dir(target) as tmp:
            (tmp / "x").write_text("new")
    else:
        with atomic_path(target) as tmp:
            tmp.write_text("new")


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_killed_writers_old_temporary_is_removed_by_the_next_write_of_that_target(tmp_path, kind):
    """A temporary left by a writer killed with SIGKILL (or OOM, power loss) has a random name, so
    nothing removed it: each kill/resume cycle left another checkpoint-sized file beside the target.
    The next write of the same target removes it once its writer is dead and it is old."""
    target = tmp_path / "ckpt"
    name = _killed_write(kind, target)
    assert (tmp_path / name).exists()
    _age(tmp_path / name)
    _write(kind, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert (target / "x" if kind == "dir" else target).read_text() == "new"


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_the_sweep_keeps_every_temporary_it_cannot_prove_abandoned(tmp_path, kind):
    import subprocess
    import sys
    target = tmp_path / "a"
    recent = _killed_write(kind, target)                                   # dead, but recent
    other_host = _killed_write(kind, target, "elsewhere.example")          # dead and old, other host
    download = ["a.part", "a.part.json", ".a.part", ".a.part.json", "a.b.part",  # resumable downloads
                ".a.b.part", ".a.notes-1.part"]                            # and names without a host tag
    for n in download:
        (tmp_path / n).write_text("partial")
    live = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, kind, str(target)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env(WAIT="1"))
    try:
        alive = live.stdout.readline().strip()                             # a writer still at work
        assert alive
        for n in [other_host, alive, *download]:
            _age(tmp_path / n)
        _write(kind, target)
        kept = {recent, other_host, alive, *download}
        assert {p.name for p in tmp_path.iterdir()} == kept | {"a"}
    finally:
        live.kill()
        live.wait()
    # once old, the dead writer's temporary goes too, and the live one's now that it is killed
    _age(tmp_path / recent)
    _write(kind, target)
    assert {p.name for p in tmp_path.iterdir()} == (kept - {recent, alive}) | {"a"}


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_write_sweeps_abandoned_temporaries_of_other_targets_in_its_directory(tmp_path, kind):
    """A cache entry is written once: a temporary its killed writer left would never be swept by a
    write of that same entry, which, when it ran within the hour, was already done. Any later atomic
    write into the directory takes it, whatever its target ("a.b" and "a.b.c" beside "a": names
    that extend another target's are parsed whole)."""
    longer = _killed_write(kind, tmp_path / "a.b")
    longer2 = _killed_write(kind, tmp_path / "a.b.c")
    fresh = _killed_write(kind, tmp_path / "entry-123")
    for n in (longer, longer2):
        _age(tmp_path / n)
    _write(kind, tmp_path / "a")
    assert {p.name for p in tmp_path.iterdir()} == {"a", fresh}


def test_an_error_while_sweeping_does_not_fail_the_write(tmp_path, monkeypatch):
    import shutil
    name = _killed_write("file", tmp_path / "a")
    dname = _killed_write("dir", tmp_path / "d")
    _age(tmp_path / name)
    _age(tmp_path / dname)

    def refuse(*args, **kwargs):
        raise PermissionError("read-only")
    monkeypatch.setattr(os, "unlink", refuse)
    monkeypatch.setattr(shutil, "rmtree", refuse)
    _write("file", tmp_path / "a")
    _write("dir", tmp_path / "d")
    assert (tmp_path / "a").read_text() == "new" and (tmp_path / "d" / "x").read_text() == "new"
    assert (tmp_path / name).exists() and (tmp_path / dname).exists()


def _age_tree(path, seconds):
    """``path`` and, for a directory, everything in it last modified ``seconds`` ago."""
    old = time.time() - seconds
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.utime(os.path.join(root, n), (old, old))
    os.utime(path, (old, old))


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_another_hosts_temporary_is_removed_once_it_is_over_a_day_old(tmp_path, kind):
    """A container gets a new host name each time it starts, so the temporaries a writer killed in
    the previous one left carry a host tag that is no longer this host's: they were kept forever
    (each one checkpoint- or cache-entry-sized). Their writer's pid cannot be asked, so their age
    decides: untouched for over STALE_FOREIGN_TEMP_AGE (a day), they go; younger ones stay."""
    from distattn import atomic
    day = getattr(atomic, "STALE_FOREIGN_TEMP_AGE", 86400.0)
    old = _killed_write(kind, tmp_path / "a", "old-container")
    young = _killed_write(kind, tmp_path / "b", "old-container")
    kept = {young}
    if kind == "dir":       # a directory still being filled: its own mtime is old, a file in it is not
        busy = _killed_write(kind, tmp_path / "c", "old-container")
        _age_tree(tmp_path / busy, 2 * day)
        os.utime(tmp_path / busy / "x")
        kept.add(busy)
    _age_tree(tmp_path / old, 2 * day)
    _age_tree(tmp_path / young, day / 2)
    _write(kind, tmp_path / "a")
    assert {p.name for p in tmp_path.iterdir()} == kept | {"a"}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names the fsynced files through /proc (Linux)")
def test_contents_are_flushed_before_the_rename_and_the_rename_after(tmp_path, monkeypatch):
    """The rename alone once made the write atomic but not durable: after a power loss the new name
    could point at zero-length files (delayed allocation), e.g. a cache entry whose done marker is
    there but whose arrays are empty. Every file (and a directory's files and subdirectories) is
    fsynced before the rename, and the parent directory after it."""
    import distattn.atomic as atomic
    events = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append(("rename", str(b))), real_replace(a, b)))
    monkeypatch.setattr(atomic.os, "rename", lambda a, b: (events.append(("rename", str(b))), real_rename(a, b)))
    with atomic_path(tmp_path / "a.txt") as tmp:
        tmp.write_text("x")
    names = [(kind, os.path.basename(p) if kind == "fsync" else p) for kind, p in events]
    assert names[0][0] == "fsync" and names[0][1].startswith(".a.txt.") and names[0][1].endswith(".part")
    assert names[1] == ("rename", str(tmp_path / "a.txt")) and events[2] == ("fsync", str(tmp_path))
    events.clear()
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.npy").write_bytes(b"1")
        (tmp / "done.json").write_text("{}")
    rename = events.index(("rename", str(tmp_path / "d")))
    synced = {os.path.basename(p) for kind, p in events[:rename]}
    assert {"x.npy", "done.json", "sub"} <= synced
    assert any(p.endswith(".part") for kind, p in events[:rename])        # the temporary directory itself
    assert events[rename + 1:] == [("fsync", str(tmp_path))]


def test_a_sealed_json_object_reads_back_and_a_changed_value_is_refused(tmp_path):
    """A cache entry's JSON with one digit changed on disk is still valid JSON: the changed figure was
    served as if computed. The seal (its content's sha256) refuses it, naming the file."""
    from distattn.atomic import SEAL_KEY, read_sealed_json, seal, write_json
    obj = {"perplexity": 825.44, "rows": [1, 2.5, None], "nested": {"b": [0.1, 1e-300]}, "name": "ü", "t": (1, 2)}
    path = tmp_path / "done.json"
    write_json(path, seal(obj))
    assert read_sealed_json(path) == {**obj, "t": [1, 2]}
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("825.44", "825.45"), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is damaged: .*{SEAL_KEY}"):
        read_sealed_json(path)
    path.write_text(text.replace('"b"', '"c"'), encoding="utf-8")       # a key, not a value
    with pytest.raises(ValueError, match="is damaged"):
        read_sealed_json(path)
    # no seal (or a bit flipped in its key's name) is damage too, not an entry to trust as it is
    path.write_text(json.dumps({"perplexity": 825.45}))
    with pytest.raises(ValueError, match="is damaged: it has no content_sha256"):
        read_sealed_json(path)
    path.write_text(text.replace(SEAL_KEY, "content_sha257"), encoding="utf-8")
    with pytest.raises(ValueError, match="is damaged: it has no content_sha256"):
        read_sealed_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list, expected an object"):
        read_sealed_json(path)


def test_seal_refuses_what_it_cannot_seal():
    from distattn.atomic import seal
    with pytest.raises(TypeError, match="takes a dict, got list"):
        seal([1])
    with pytest.raises(ValueError, match="already has a 'content_sha256' key"):
        seal(seal({"a": 1}))


def test_check_files_names_a_changed_or_missing_file_and_the_json_recording_it(tmp_path):
    from distattn.atomic import check_files, sha256_file
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_bytes(b"\x89PNG a")
    (tmp_path / "b.npy").write_bytes(b"b")
    files = {"figures/a.png": sha256_file(tmp_path / "figures" / "a.png"), "b.npy": sha256_file(tmp_path / "b.npy")}
    check_files(tmp_path, files, "done.json")
    (tmp_path / "b.npy").write_bytes(b"c")
    with pytest.raises(ValueError, match=r"b\.npy is damaged: its sha256 differs from the one done\.json records"):
        check_files(tmp_path, files, "done.json")
    (tmp_path / "b.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"b\.npy"):
        check_files(tmp_path, files, "done.json")
