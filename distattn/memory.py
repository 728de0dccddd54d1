"""Memory estimates, checked before a large allocation rather than after it fails."""

from __future__ import annotations

import os


class MemoryBudgetError(MemoryError, ValueError):
    """Raised before allocating when a step would need more memory than allowed."""


def available_memory() -> int:
    """Bytes the process may use: ``$DISTATTN_MAX_MEMORY`` if set (bytes, or with a K/M/G
    suffix), else 80 % of MemAvailable from /proc/meminfo, else 80 % of physical memory."""
    env = os.environ.get("DISTATTN_MAX_MEMORY")
    if env:
        try:
            limit = parse_bytes(env)
        except (ValueError, OverflowError):
            limit = -1
        if limit < 0:
            raise ValueError(f"DISTATTN_MAX_MEMORY={env!r} is invalid; allowed: a number of bytes >= 0, "
                             "optionally with a K, M, G or T suffix (e.g. 8G)")
        return limit
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(0.8 * int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def parse_bytes(text: str) -> int:
    """'2G' -> 2147483648; plain integers are bytes."""
    text = str(text).strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in scale:
        return int(float(text[:-1]) * scale[text[-1]])
    return int(float(text))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def check_memory(nbytes: float, what: str, limit: int | None = None) -> None:
    """Refuse with :class:`MemoryBudgetError` if ``nbytes`` exceeds ``limit``
    (default :func:`available_memory`)."""
    limit = available_memory() if limit is None else int(limit)
    if nbytes > limit:
        raise MemoryBudgetError(
            f"{what} would need about {format_bytes(nbytes)}, more than the "
            f"{format_bytes(limit)} allowed (set DISTATTN_MAX_MEMORY to change the limit, "
            f"or reduce the vocabulary / window / dimension)."
        )
