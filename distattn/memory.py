"""Memory estimates, checked before a large allocation rather than after it fails."""

from __future__ import annotations

import numbers
import os


class MemoryBudgetError(MemoryError, ValueError):
    """Raised before allocating when a step would need more memory than allowed."""


def available_memory() -> int:
    """Bytes the process may use: ``$DISTATTN_MAX_MEMORY`` if set (bytes, or with a K/M/G
    suffix), else 80 % of MemAvailable from /proc/meminfo, else 80 % of physical memory; under a
    cgroup memory limit (a container, a batch job) 80 % of what the limit leaves, if less."""
    limit = max_memory_setting()
    if limit is not None:
        return limit
    # MemAvailable is the host's: a container's limit is not in it, and past that limit the kernel
    # kills the process instead of failing an allocation, so the check is all the warning there is
    host, headroom = _host_available(), _cgroup_headroom()
    return host if headroom is None else min(host, int(0.8 * headroom))


def max_memory_setting() -> int | None:
    """``$DISTATTN_MAX_MEMORY`` in bytes, None when unset or empty; a value that is not a number of
    bytes >= 0 raises ValueError naming it. The command-line entry points call it before any work:
    the limit is otherwise read only when a memory check runs, so with every stage cached a bad
    value went unnoticed and the user believed a limit was in force."""
    env = os.environ.get("DISTATTN_MAX_MEMORY")
    if not env:
        return None
    try:
        limit = parse_bytes(env)
    except (ValueError, OverflowError):
        limit = -1
    if limit < 0:
        raise ValueError(f"DISTATTN_MAX_MEMORY={env!r} is invalid; allowed: a number of bytes >= 0, "
                         "optionally with a K, M, G or T suffix (e.g. 8G)")
    return limit


def _host_available() -> int:
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


_CGROUP_ROOT = "/sys/fs/cgroup"
_PROC_CGROUP = "/proc/self/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def _number(text: str | None) -> int | None:
    """A file's integer, or None ("max": no limit; missing; unreadable)."""
    return int(text) if text and text.strip().isdigit() else None


def _stat(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _cgroup_headroom() -> int | None:
    """Bytes left under this process's cgroup memory limits (v2: its cgroup and every parent; v1:
    the memory controller's hierarchical limit), None where none is set or none can be read. Page
    cache the kernel can drop first (inactive_file) counts as free, as in the kubelet's working set."""
    left = []
    for line in (_read(_PROC_CGROUP) or "").splitlines():
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        v1 = "memory" in controllers.split(",")
        if controllers and not v1:
            continue
        root = os.path.normpath(os.path.join(_CGROUP_ROOT, "memory") if v1 else _CGROUP_ROOT)
        base = os.path.normpath(os.path.join(root, rel.strip().lstrip("/")))
        if not os.path.isdir(base) or os.path.commonpath([root, base]) != root:   # a host path seen from a
            base = root                                                          # container ("/../x"): its root
        while True:
            stat = _read(os.path.join(base, "memory.stat"))
            if v1:
                limits = [_number(_read(os.path.join(base, "memory.limit_in_bytes"))),
                          _stat(stat, "hierarchical_memory_limit") or None]
                used, cache = _number(_read(os.path.join(base, "memory.usage_in_bytes"))), "total_inactive_file"
            else:
                limits = [_number(_read(os.path.join(base, "memory.max")))]
                used, cache = _number(_read(os.path.join(base, "memory.current"))), "inactive_file"
            limits = [x for x in limits if x is not None]
            if limits and used is not None:
                left.append(max(min(limits) - max(used - _stat(stat, cache), 0), 0))
            if v1 or base == root:                         # v1's hierarchical limit covers the parents
                break
            base = os.path.dirname(base)
    return min(left) if left else None


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


def check_memory(nbytes: float, what: str, limit: float | None = None, limit_name: str = "limit") -> None:
    """Refuse with :class:`MemoryBudgetError` if ``nbytes`` exceeds ``limit`` (default
    :func:`available_memory`; ``inf``: no limit). ``limit_name`` is the caller's name for ``limit``,
    used in the messages."""
    if limit is None:
        limit, hint = available_memory(), "set DISTATTN_MAX_MEMORY to change the limit"
    else:   # DISTATTN_MAX_MEMORY does not apply to a limit given here; int(inf) raised OverflowError
        if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit >= 0:
            raise ValueError(f"{limit_name} must be a number of bytes >= 0 (inf: no limit); got {limit!r}")
        hint = f"raise {limit_name}"
    if nbytes > limit:
        raise MemoryBudgetError(
            f"{what} would need about {format_bytes(nbytes)}, more than the "
            f"{format_bytes(limit)} allowed ({hint}, "
            f"or reduce the vocabulary / window / dimension)."
        )
