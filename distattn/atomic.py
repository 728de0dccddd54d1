"""Atomic writes: a temporary file (or directory) beside the target, then a rename.

A reader never sees a half-written cache entry. A write that fails removes its temporary; one
whose process is killed (SIGKILL, OOM, power loss) leaves it, under a name that records its owner:
``.NAME.HOST-PID.RANDOM.part`` (plus the caller's suffix; HOST is the host name, where it has other
characters than letters, digits and ``_`` or more than 32, shortened, those made ``_``, and a hash of
it added). Each later atomic write into the same directory removes such temporaries (of any target
there) when they are provably abandoned: written on this host by a process that no longer exists
(not this one), and last modified more than ``STALE_TEMP_AGE`` seconds ago (a guard against another
PID namespace under the same host name). Another host's temporary (a shared file system, or a
container that got a new host name when it restarted), whose writer cannot be asked, is removed
when nothing in it was modified for more than ``STALE_FOREIGN_TEMP_AGE`` seconds (a day). Anything
else there stays: younger temporaries of other hosts, older names without an owner, a download's
``NAME.part``. A failure while sweeping never fails the write.

The contents are made durable before the rename (``fsync`` of the file, or of every file and
directory in a temporary directory) and the rename after it (``fsync`` of the target's
directory, where the platform allows): without that, a power loss or kernel crash soon after a
write could leave the new name pointing at empty or partial files (delayed allocation), so a
cache entry whose ``done`` marker is present would hold zero-length arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import numbers
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

_UMASK_LOCK = threading.Lock()

STALE_TEMP_AGE = 3600.0     # seconds: a dead writer's temporary younger than this is left alone
STALE_FOREIGN_TEMP_AGE = 86400.0    # seconds: another host's temporary untouched for longer is removed


def _host() -> str:
    """The host name as a file-name part: letters, digits and ``_``, at most 32 characters. A name
    that had to change (``node.1``, a long pod name) gets a hash of the real one, so two hosts do
    not share a tag."""
    host = socket.gethostname()
    tag = re.sub(r"[^A-Za-z0-9_]", "_", host)[:32]
    if tag != host or not tag:
        tag = tag[:23] + "_" + hashlib.sha256(host.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return tag


def _temp_prefix(target: Path) -> str:
    """``.NAME.HOST-PID.``: the start of this process's temporaries for ``target``."""
    return f".{target.name}.{_host()}-{os.getpid()}."


def _dead(pid: int) -> bool:
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):    # PermissionError: alive, someone else's
        return False
    return False


def _newest_mtime(entry: os.DirEntry) -> float:
    """The last modification of ``entry`` or, for a directory, of anything in it (a writer may still
    be filling it though its own mtime is old)."""
    newest = entry.stat(follow_symlinks=False).st_mtime
    if entry.is_dir(follow_symlinks=False):
        for root, dirs, files in os.walk(entry.path):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
    return newest


def _sweep(directory: Path) -> None:
    """Remove the temporaries in ``directory`` left by dead writers on this host, and other hosts'
    old ones (module docstring).

    A name matches only in full: ``.NAME.HOST-PID.RANDOM.part`` and the caller's suffix, with a
    host tag and dot-free PID and RANDOM parts, so a download's ``NAME.part`` or a user's file is
    never taken for one."""
    if os.name != "posix":                          # os.kill(pid, 0) would end the process elsewhere
        return
    pattern = re.compile(r"\..+\.([A-Za-z0-9_]{1,32})-([0-9]+)\.[A-Za-z0-9_]+\.part.*", re.DOTALL)
    host = _host()
    with contextlib.suppress(OSError):
        with os.scandir(directory) as entries:
            for entry in entries:
                m = pattern.fullmatch(entry.name)
                if not m:
                    continue
                with contextlib.suppress(OSError):
                    if m.group(1) == host:
                        if not _dead(int(m.group(2))) or (
                                time.time() - entry.stat(follow_symlinks=False).st_mtime <= STALE_TEMP_AGE):
                            continue
                    elif time.time() - _newest_mtime(entry) <= STALE_FOREIGN_TEMP_AGE:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)


def _umask() -> int:
    with _UMASK_LOCK:              # reading the umask means setting it; keep that window private
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _default_mode(path: Path, is_dir: bool) -> None:
    """Give a finished temporary file or directory the permissions a plain ``open`` or
    ``mkdir`` would have (``mkstemp``/``mkdtemp`` make them private to the owner)."""
    with contextlib.suppress(OSError):
        os.chmod(path, (0o777 if is_dir else 0o666) & ~_umask())


def _fsync_path(path: Path) -> None:
    """Flush a file's contents to disk (a directory: each file and directory in it, then itself)."""
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files:
                p = os.path.join(root, name)
                if not os.path.islink(p):
                    _fsync_file(p)
            _fsync_dir(root)
    elif path.is_file():
        _fsync_file(path)


def _fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path) -> None:
    """fsync a directory, so that a rename or new name in it survives a crash; not every platform
    or file system can open or sync a directory (Windows, some network mounts): best effort."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``target`` on success.

    On an exception the temporary file is removed and ``target`` is left untouched. Abandoned
    temporaries in its directory are removed first (module docstring).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".part" + suffix, dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _default_mode(tmp_path, tmp_path.is_dir())
        _fsync_path(tmp_path)           # the contents on disk before the name points at them
        os.replace(tmp_path, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; rename it onto ``target`` when the block succeeds.

    If ``target`` already exists (another process won the race) the new copy is discarded.
    Abandoned temporaries in its directory are removed first (module docstring).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(target), suffix=".part", dir=target.parent))
    try:
        yield tmp
        _default_mode(tmp, True)
        _fsync_path(tmp)                # the files on disk before the name points at them
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def temp_dir(target: str | os.PathLike) -> Path:
    """A new, empty directory beside ``target``, named as this process's temporaries for it, so that
    a later atomic write there removes it once abandoned (module docstring); the caller removes it
    when done. Abandoned temporaries in its directory are removed first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent)
    return Path(tempfile.mkdtemp(prefix=_temp_prefix(target), suffix=".part", dir=target.parent))


def jsonable(x: Any) -> Any:
    """``x`` as plain JSON values: numpy arrays and scalars become lists and Python numbers, paths
    strings, dict keys strings, and every non-finite float (NaN, inf; inside arrays too) ``None``,
    so that the JSON is strict (a bare ``NaN`` is refused by strict readers)."""
    import numpy as np
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist()) if x.dtype.kind == "f" else x.tolist()
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=True), encoding="utf-8")


SEAL_KEY = "content_sha256"


def _seal_digest(obj: dict) -> str:
    # hashed as it reads back: a round trip first makes tuples lists and keys strings, so that
    # the digest written and the one recomputed from the parsed file see the same values
    canonical = json.dumps(json.loads(json.dumps(obj)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def seal(obj: dict) -> dict:
    """``obj`` with a ``content_sha256`` of its content, which :func:`unseal` checks.

    A cache entry's JSON (its metrics, its next-token rows, the files' own digests) is the entry's
    root of trust, and a bit flipped on disk can leave it valid JSON: a digit changed in a figure
    was served to every later run as if computed.
    """
    if not isinstance(obj, dict):
        raise TypeError(f"seal() takes a dict, got {type(obj).__name__}")
    if SEAL_KEY in obj:
        raise ValueError(f"the object already has a {SEAL_KEY!r} key")
    return {**obj, SEAL_KEY: _seal_digest(obj)}


def unseal(obj: Any, path: str | os.PathLike) -> dict:
    """A JSON object read from ``path`` without its seal, after checking it: ``ValueError`` naming
    ``path`` when the content differs from the sealed digest, when there is no seal, or when it is
    no JSON object. The seal is required, not optional: a bit flipped in its key's name would
    otherwise pass a damaged file as one written before entries were sealed (the caches that seal
    their entries changed their format with it, so no entry of theirs predates it)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{path} is damaged: it holds a JSON {type(obj).__name__}, expected an object")
    obj = dict(obj)
    digest = obj.pop(SEAL_KEY, None)
    if digest is None:
        raise ValueError(f"{path} is damaged: it has no {SEAL_KEY}")
    if digest != _seal_digest(obj):
        raise ValueError(f"{path} is damaged: its content's sha256 differs from the one it records ({SEAL_KEY})")
    return obj


def read_sealed_json(path: str | os.PathLike) -> dict:
    """The JSON object at ``path``, its seal checked (:func:`unseal`)."""
    return unseal(json.loads(Path(path).read_text(encoding="utf-8")), path)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The sha256 of the file at ``path`` (hex), read ``chunk`` bytes at a time."""
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        # read(0) returns b"" at once: the hash of an empty file, whatever the file holds
        raise ValueError(f"chunk={chunk!r} is invalid; allowed: an integer >= 1 (bytes read at a time)")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_files(directory: str | os.PathLike, files: dict, recorded_in: str) -> None:
    """Check each file of a cache entry against the sha256 its sealed JSON (``recorded_in``, named in
    the error) records: ``files`` maps a path relative to ``directory`` to its digest. An .npy, PNG
    or GraphML file with a bit flipped still loads, so a changed file raises ``ValueError`` naming
    it, and a missing one ``OSError``."""
    directory = Path(directory)
    for name, digest in files.items():
        if sha256_file(directory / name) != digest:
            raise ValueError(f"{directory / name} is damaged: its sha256 differs from the one {recorded_in} records")


def config_hash(config: Any, length: int = 16) -> str:
    """A stable hash of a JSON-serialisable config, used to key cache entries."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


def missing_dirs(path: str | os.PathLike) -> list[Path]:
    """The directories of ``path`` (itself included) that do not exist yet, outermost first: what
    a command that creates ``path`` should remove again if it fails before writing anything there."""
    path = Path(path).absolute()
    out = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        out.append(p)
    return out[::-1]


def remove_empty_dirs(dirs) -> None:
    """Remove those of ``dirs`` that are empty, innermost first; anything with content stays."""
    for d in sorted(map(Path, dirs), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and its parents) and prove a file can be written there; raises ``OSError``.
    Commands call it before any work, so an unwritable output fails at once, not at the end."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):      # unnamed: two processes probing one directory cannot collide
        pass
    return path
