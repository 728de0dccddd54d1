"""Where distattn looks for data and writes its caches.

* data: ``$DISTATTN_DATA_DIR`` (CI sets it to ``../shared/data``), then the cache directory.
* cache: ``$DISTATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/distattn`` (an absolute path, as the XDG
  spec asks; a relative one is ignored), else ``~/.cache/distattn``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(create: bool = True) -> Path:
    """The user cache directory (XDG), created on demand."""
    env = os.environ.get("DISTATTN_CACHE_DIR")
    if env:
        path = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or ""
        if not os.path.isabs(base):        # the XDG spec: a relative path is invalid and ignored (the cache
            base = os.path.join(os.path.expanduser("~"), ".cache")   # moved with the working directory)
        path = Path(base) / "distattn"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def data_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Directories searched for data files, in order: the argument, ``$DISTATTN_DATA_DIR``,
    then the cache directory."""
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get("DISTATTN_DATA_DIR")
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(cache_dir(create=False))
    seen, out = set(), []
    for d in dirs:
        key = str(d.resolve()) if d.exists() else str(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def corpora_dir() -> Path:
    """The ``corpora/`` directory: the source tree's (a checkout or an editable install), else
    the copy a wheel installs under ``<prefix>/share/distattn/corpora``."""
    import sys

    candidates = [Path(__file__).resolve().parents[1] / "corpora",
                  Path(sys.prefix) / "share" / "distattn" / "corpora"]
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(f"distattn's corpora/ directory is missing; looked in {[str(c) for c in candidates]}")
