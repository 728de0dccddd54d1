"""Downloads that are atomic and checked: a temporary file, size and checksum verified, then
a rename. A failed or interrupted download leaves nothing under the final name."""

from __future__ import annotations

import hashlib
import http.client
import numbers
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from distattn.atomic import atomic_path


class DownloadError(OSError):
    """A download failed, or its content did not match the expected size/checksum."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        # read(0) returns b"" at once: the hash of an empty file, whatever the file holds
        raise ValueError(f"chunk={chunk!r} is invalid; allowed: an integer >= 1 (bytes read at a time)")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: str | os.PathLike, sha256: Iterable[str] | None = None,
             size: Iterable[int] | None = None, progress: bool = True, timeout: float = 60.0,
             verify: Callable[[Path, str], None] | None = None) -> Path:
    """Download ``url`` to ``dest`` atomically.

    ``sha256`` / ``size``: accepted checksums / sizes (any one may match; a single one may be
    given alone); ``None`` skips the check. ``verify(tmp_path, sha256_hex)`` runs on the complete temporary file before the
    rename and may raise to reject it. Raises :class:`DownloadError` naming the URL and the
    mismatch; on any failure nothing is left at ``dest`` or beside it.
    """
    dest = Path(dest)
    if isinstance(sha256, str):          # one checksum, not 64 one-character ones
        sha256 = [sha256]
    if isinstance(size, numbers.Integral):
        size = [size]
    sha_ok = {s.lower() for s in sha256} if sha256 is not None else None
    size_ok = set(size) if size is not None else None
    with atomic_path(dest) as tmp:
        h = hashlib.sha256()
        n = 0
        try:
            resp = urllib.request.urlopen(url, timeout=timeout)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise DownloadError(f"could not download {url}: {getattr(exc, 'reason', exc)}") from exc
        with resp, open(tmp, "wb") as out:
            total = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
            bar = None
            if progress:
                from tqdm.auto import tqdm
                bar = tqdm(total=int(total) if total else None, unit="B", unit_scale=True,
                           desc=f"download {dest.name}")
            try:
                while block := resp.read(1 << 20):
                    out.write(block)
                    h.update(block)
                    n += len(block)
                    if bar is not None:
                        bar.update(len(block))
            except (OSError, http.client.HTTPException) as exc:   # IncompleteRead: a cut chunked body
                raise DownloadError(f"download of {url} broke off after {n} bytes: {exc}") from exc
            finally:
                if bar is not None:
                    bar.close()
        digest = h.hexdigest()
        # read(amt) does not raise when the server closes before Content-Length bytes: a body
        # cut short was kept when no size or checksum was given
        if total is not None and total.strip().isdigit() and n != int(total):
            raise DownloadError(f"download of {url} broke off after {n} of the {int(total)} bytes the server "
                                "announced; nothing was kept")
        if size_ok is not None and n not in size_ok:
            raise DownloadError(f"download of {url} has {n} bytes; expected one of {sorted(size_ok)} "
                                "(truncated or wrong file); nothing was kept")
        if sha_ok is not None and digest not in sha_ok:
            raise DownloadError(f"download of {url} has sha256 {digest}; expected one of {sorted(sha_ok)}; "
                                "nothing was kept")
        if verify is not None:
            verify(tmp, digest)
    return dest
