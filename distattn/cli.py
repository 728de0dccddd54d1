"""Shared plumbing of the command-line scripts (``analyses/``): bad input ends with one line,
``error: …`` naming the value and what is allowed, and exit code 2, not a traceback.

    if __name__ == "__main__":
        sys.exit(run_script(main))

Set ``DISTATTN_TRACEBACK=1`` to get the full traceback instead (debugging; ``0``, ``false``, ``no``,
``off`` or empty leave it off).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

__all__ = ["USER_ERRORS", "run_script", "positive_int", "non_negative_int", "output_dir", "output_file",
           "check_data_dir"]

# What a wrong argument or a missing file raises in distattn (sklearn's InvalidParameterError is a ValueError).
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, MemoryError)


def run_script(main: Callable[[], int | None]) -> int:
    """Call ``main()``; a user error prints ``error: <message>`` to stderr and gives exit code 2. A
    reader of stdout that went away (``| head``) ends it quietly with exit code 1, as Python's
    documentation recommends, not with a ``BrokenPipeError`` traceback."""
    try:
        code = main()
        # a block-buffered stdout (a pipe) writes a short output only here: its EPIPE raised in the flush
        # at interpreter exit, after this returned ("Exception ignored ... BrokenPipeError", exit code 120)
        sys.stdout.flush()
    except BrokenPipeError:
        # stdout now points at devnull, so that the flush at interpreter exit does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except USER_ERRORS as exc:
        if _flag("DISTATTN_TRACEBACK"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # a main() may return its results instead of a code; True/False are results, not exit codes 1/0
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to something other than empty, ``0``,
    ``false``, ``no`` or ``off`` (any case): ``DISTATTN_TRACEBACK=0`` once turned tracebacks on."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; allowed: {what}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"got {value}; allowed: {what}")
        return value
    parse.__name__ = f"int>={low}"
    return parse


# argparse ``type=`` for counts and seeds: the message names the option, the value and what is allowed
positive_int = _int_at_least(1, "an integer >= 1")
non_negative_int = _int_at_least(0, "an integer >= 0")


def _writable_parent(text: str, path) -> None:
    """The nearest existing directory above ``path`` must be a writable directory."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"got {text!r}, but {str(parent)!r} is a file; allowed: a path "
                                                 "whose existing parents are directories")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise argparse.ArgumentTypeError(f"got {text!r}, but {str(parent)!r} is not writable")
            return


# argparse ``type=`` for outputs: a path that cannot be written is refused before any work, not at the end; a
# leading ``~`` comes back expanded (the path checked is the one written: the scripts do not expand it)
def output_dir(text: str) -> str:
    from pathlib import Path
    path = Path(text).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"got {text!r}, which is a file; allowed: a directory (created if missing)")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"got {text!r}, which is not writable")
    else:
        _writable_parent(text, path)
    return os.path.expanduser(text)


def output_file(text: str) -> str:
    from pathlib import Path
    path = Path(text).expanduser().absolute()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"got {text!r}, which is a directory; allowed: a file name")
    _writable_parent(text, path)
    return os.path.expanduser(text)


def check_data_dir(data_dir) -> None:
    """``--data-dir`` must name a directory: the archive search goes on to ``$DISTATTN_DATA_DIR``, the
    cache and a download, so a typo ran on another copy of IMDB (or downloaded one) without a word.
    Raises ValueError (for ``parser.error``); called after the other argument checks."""
    if data_dir is None:
        return
    from pathlib import Path
    where = Path(data_dir).expanduser()
    if not where.is_dir():
        raise ValueError(f"argument --data-dir: got {str(data_dir)!r}, which "
                         + ("is a file" if where.exists() else "does not exist")
                         + "; allowed: the directory that holds aclImdb_v1.tar.gz")
