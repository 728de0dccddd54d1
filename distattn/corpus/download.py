"""Downloads that are checked and resumable: the bytes go to ``dest + ".part"``, the size and
checksum are verified over the whole file, then it is renamed onto ``dest``. A failed download
leaves nothing under the final name; an interrupted one leaves its ``.part`` file (and a small
``.part.json`` naming the URL), which the next call for the same URL and ``dest`` resumes with
an HTTP ``Range`` request."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import numbers
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Iterator

from distattn.atomic import sha256_file, write_json  # noqa: F401  (sha256_file: re-exported, its former home)

try:
    import fcntl
except ImportError:     # Windows: no lock; two concurrent downloads to one dest must be avoided by the caller
    fcntl = None


class DownloadError(OSError):
    """A download failed, or its content did not match the expected size/checksum."""


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_UNSATISFIED = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.IGNORECASE)    # a 416's Content-Range


@contextlib.contextmanager
def _locked(part: Path, finished: Callable | None = None) -> Iterator:
    """``part`` opened for reading and writing (created if missing), under an exclusive lock: two
    processes downloading to one ``dest`` (e.g. DDP ranks) take turns instead of writing into one
    partial file together. Where the holder we waited for renamed the partial file away meanwhile,
    ``finished(fh)`` (``fh``: that file, still open) may accept it; then None is yielded."""
    while True:
        try:
            fh = open(part, "a+b")
        except OSError as exc:      # a read-only folder, or a directory in the way
            raise DownloadError(f"cannot write the download's partial file {part}: {exc.strerror or exc}") from exc
        try:
            locked = False
            if fcntl is not None:
                with contextlib.suppress(OSError):      # a file system without locks: go on unlocked
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                    locked = True
            if locked:
                try:    # the holder we waited for may have renamed or removed the file meanwhile
                    same = os.stat(part).st_ino == os.fstat(fh.fileno()).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    if finished is not None and finished(fh):
                        yield None
                        return
                    continue
            yield fh
            return
        finally:
            fh.close()


def _read_state(meta: Path) -> dict:
    try:
        state = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _discard(part: Path, meta: Path) -> None:
    for p in (part, meta):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def download(url: str, dest: str | os.PathLike, sha256: Iterable[str] | None = None,
             size: Iterable[int] | None = None, progress: bool = True, timeout: float = 60.0,
             verify: Callable[[Path, str], None] | None = None) -> Path:
    """Download ``url`` to ``dest``, atomically and resumably.

    ``sha256`` / ``size``: accepted checksums / sizes (any one may match; a single one may be
    given alone); ``None`` skips the check. ``verify(part_path, sha256_hex)`` runs on the complete
    file before the rename and may raise to reject it. Raises :class:`DownloadError` naming the
    URL and the mismatch.

    The bytes are written to ``dest + ".part"`` (fsynced), never to ``dest`` until the whole file
    has passed the checks. A download that breaks off keeps its ``.part`` file and a
    ``.part.json`` (the URL, the server's ``ETag``/``Last-Modified`` and length); the next call
    with the same URL and ``dest`` asks for the rest (``Range: bytes=N-``, with ``If-Range``) and
    appends it if the server answers 206 with a matching ``Content-Range``. It starts again from
    byte 0 without asking for the rest if the server sent neither ``ETag`` nor ``Last-Modified`` and
    no ``sha256`` is given (nothing would tell a changed file of the same length); from
    byte 0 if the server answers 200 (no range support, or the file changed), a 206 whose
    ``ETag`` (or ``Last-Modified``) differs from the first response's, 416, or a
    ``Content-Range`` that does not match, and if the partial file came from another URL; a 416
    saying the file is exactly as long as the partial file means the partial file is whole (a
    crash came before the rename) and it goes on to the checks.
    A complete file that fails a check (size, sha256, ``verify``), and a request that fails
    before any byte arrived, leave nothing at ``dest`` or beside it.

    A call that waited for another process downloading to the same ``dest`` returns the file that
    process completed (the partial file it waited on, now renamed onto ``dest``) without
    downloading it again if it passes this call's checks. A call with no check at all (no
    ``sha256``, ``size`` or ``verify``) downloads it again: nothing tells that the other process
    fetched the same URL.
    """
    dest = Path(dest)
    if isinstance(sha256, str):          # one checksum, not 64 one-character ones
        sha256 = [sha256]
    if isinstance(size, numbers.Integral):
        size = [size]
    sha_ok = {s.lower() for s in sha256} if sha256 is not None else None
    size_ok = set(size) if size is not None else None
    part = dest.with_name(dest.name + ".part")
    meta = dest.with_name(dest.name + ".part.json")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:          # e.g. a file where a folder of the path should be
        raise DownloadError(f"cannot create the folder {dest.parent} for {url}: {exc.strerror or exc}") from exc

    def check(path: Path, n: int, digest: str) -> None:
        if size_ok is not None and n not in size_ok:
            raise DownloadError(f"download of {url} has {n} bytes; expected one of {sorted(size_ok)} "
                                "(truncated or wrong file); nothing was kept")
        if sha_ok is not None and digest not in sha_ok:
            raise DownloadError(f"download of {url} has sha256 {digest}; expected one of {sorted(sha_ok)}; "
                                "nothing was kept")
        if verify is not None:
            verify(path, digest)

    def finished(fh) -> bool:
        """Whether the partial file ``fh`` we waited on is now ``dest`` and passes the checks."""
        if size_ok is None and sha_ok is None and verify is None:
            return False
        try:
            if not os.path.samestat(os.fstat(fh.fileno()), os.stat(dest)):
                return False            # removed (it failed), or dest was replaced since
            n = os.fstat(fh.fileno()).st_size
            check(dest, n, _hash_prefix(fh, n).hexdigest())
        except Exception:               # not the file this call wants: download it
            return False
        return True

    with _locked(part, finished) as out:
        if out is None:                 # completed by the process we waited for
            return dest
        try:
            h, n = _fetch(url, out, meta, dest.name, progress, timeout, checked=sha_ok is not None)
        except BaseException:
            if os.fstat(out.fileno()).st_size == 0:     # nothing arrived: nothing to resume
                _discard(part, meta)
            raise
        digest = h.hexdigest()
        try:
            check(part, n, digest)
        except BaseException:
            _discard(part, meta)      # a complete but wrong file: resuming it would fail forever
            raise
        os.replace(part, dest)
        with contextlib.suppress(FileNotFoundError):
            meta.unlink()
    return dest


def _fetch(url: str, out, meta: Path, name: str, progress: bool, timeout: float, checked: bool = False):
    """Fill the locked partial file ``out`` with the whole body of ``url``, resuming what it holds
    where the server gave a validator (``ETag``, ``Last-Modified``) or ``checked`` (a sha256 will be
    compared). Returns (sha256 object over the whole file, its length)."""
    offset = out.seek(0, os.SEEK_END)
    state = _read_state(meta) if offset else {}
    if offset and state.get("url") != url:
        offset = 0                      # a partial from another URL (or of unknown origin)
    elif offset and not (state.get("etag") or state.get("last_modified") or checked):
        offset = 0                      # nothing would tell a changed file of the same length: no splice
    while True:
        headers = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = state.get("etag") or state.get("last_modified")
            if validator:
                headers["If-Range"] = validator
        try:
            resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as exc:
            if offset and exc.code == 416:  # range not satisfiable: the partial is no prefix of this file...
                m = _UNSATISFIED.match((exc.headers or {}).get("Content-Range") or "")
                exc.close()
                if m is not None and int(m[1]) == offset and state.get("length") in (None, offset):
                    # ...or it is the whole file already (a crash came between the last byte and the rename)
                    return _hash_prefix(out, offset), offset
                offset = 0
                continue
            raise DownloadError(f"could not download {url}: {getattr(exc, 'reason', exc)}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise DownloadError(f"could not download {url}: {getattr(exc, 'reason', exc)}") from exc
        hdrs = resp.headers if hasattr(resp, "headers") else {}
        length = hdrs.get("Content-Length")
        length = int(length) if length is not None and length.strip().isdigit() else None
        whole = None                    # the full file's length, where the server says
        if offset:
            m = _CONTENT_RANGE.match(hdrs.get("Content-Range") or "")
            if getattr(resp, "status", None) != 206:
                offset = 0              # 200: the server ignores Range, or the file changed (If-Range)
            elif _changed(state, hdrs):
                resp.close()            # a server that ignores If-Range sent part of a changed file
                offset = 0
                continue
            elif (m is None or int(m[1]) != offset or (m[3] != "*" and (
                    int(m[2]) + 1 != int(m[3]) or state.get("length") not in (None, int(m[3]))))
                    or (length is not None and length != int(m[2]) + 1 - offset)):
                resp.close()            # not the rest of the file we have the start of (or not all of it)
                offset = 0
                continue
            else:
                whole = int(m[3]) if m[3] != "*" else None
        if not offset:
            out.seek(0)
            out.truncate()
            whole = length
            if getattr(resp, "status", None) == 206:    # a part, though no Range was sent: its start is
                m = _CONTENT_RANGE.match(hdrs.get("Content-Range") or "")      # kept if it is the file's
                if m is None or int(m[1]) != 0 or (length is not None and length != int(m[2]) + 1):
                    resp.close()
                    raise DownloadError(f"could not download {url}: the server answered 206 (partial content) "
                                        f"with Content-Range {hdrs.get('Content-Range')!r} to a request for the "
                                        "whole file; nothing was kept")
                whole = int(m[3]) if m[3] != "*" else None
            etag = hdrs.get("ETag")
            state = {"url": url, "etag": etag if etag and not etag.startswith("W/") else None,
                     "last_modified": hdrs.get("Last-Modified"), "length": whole}
            write_json(meta, state)
        break
    h = _hash_prefix(out, offset)
    n = got = offset
    resumable = bool(state.get("etag") or state.get("last_modified") or checked)
    with resp:
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=whole, initial=offset, unit="B", unit_scale=True, desc=f"download {name}")
        try:
            while block := resp.read(1 << 20):
                out.write(block)
                h.update(block)
                n += len(block)
                if bar is not None:
                    bar.update(len(block))
        except (OSError, http.client.HTTPException) as exc:   # IncompleteRead: a cut chunked body
            raise DownloadError(f"download of {url} broke off after {n} bytes: {exc}; "
                                f"{_kept(out, n, resumable)}") from exc
        finally:
            if bar is not None:
                bar.close()
            out.flush()
            os.fsync(out.fileno())
    # read(amt) does not raise when the server closes before Content-Length bytes: a body
    # cut short was kept when no size or checksum was given
    # a 206 holding the start of the file only (to a request without Range): whole is the file's length
    expected = whole if whole is not None else got + length if length is not None else None
    if expected is not None and n != expected:
        raise DownloadError(f"download of {url} broke off after {n} of the {expected} bytes the server "
                            f"announced; {_kept(out, n, resumable)}")
    return h, n


def _hash_prefix(out, n: int):
    """sha256 object over the first ``n`` bytes of ``out``, left positioned at its end."""
    h = hashlib.sha256()
    out.seek(0)
    while n and (block := out.read(min(1 << 20, n - out.tell()))):
        h.update(block)
    out.seek(0, os.SEEK_END)
    return h


def _changed(state: dict, hdrs) -> bool:
    """Whether a 206's validators say the file is not the one the partial came from (a server that
    honours If-Range answers 200 instead; one that ignores it is caught here)."""
    etag = hdrs.get("ETag")
    if state.get("etag") and etag and not etag.startswith("W/"):
        return etag != state["etag"]
    modified = hdrs.get("Last-Modified")
    return bool(state.get("last_modified") and modified and modified != state["last_modified"])


def _kept(out, n: int, resumable: bool) -> str:
    if not n:
        return "nothing was kept"
    if not resumable:       # nothing would tell a changed file of the same length (see _fetch)
        return (f"the {n} bytes received are kept in {out.name}, but the server sent neither ETag nor "
                "Last-Modified: without sha256= the next call downloads the file again from the start")
    return f"the {n} bytes received are kept in {out.name} and the next call resumes from there"
