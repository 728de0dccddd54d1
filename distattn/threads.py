"""numba's thread pool, started without changing the caller's OpenMP (torch's CPU) thread count.

numba's OpenMP layer, when its pool starts (the first parallel kernel, or ``numba.get_num_threads``,
in the process), calls ``omp_set_num_threads(NUMBA_NUM_THREADS)`` in the thread that starts it.
torch's CPU ops in that thread use the same OpenMP setting, so a script that built statistics,
fitted a projection or computed attention flow before training ran its torch ops on
NUMBA_NUM_THREADS threads (every CPU by default), whatever ``OMP_NUM_THREADS`` or the user's
``torch.set_num_threads`` said, and rounded otherwise than when those came from a cache. OpenMP's
thread count is a per-thread setting, so the pool is started from a short-lived thread of its own:
numba's kernels still run on NUMBA_NUM_THREADS threads, and no caller's setting changes.

Every parallel kernel of the library calls :func:`start_numba_threads` before its first launch.
"""

from __future__ import annotations

import threading

__all__ = ["start_numba_threads"]

_started = False


def start_numba_threads() -> None:
    """Start numba's thread pool, if not yet started, without changing this thread's OpenMP thread
    count (torch's ``get_num_threads``); cheap once it has run. Call it before launching a
    ``parallel=True`` kernel: a pool started by the kernel itself would set the count of the
    calling thread to NUMBA_NUM_THREADS."""
    global _started
    if _started:
        return
    import numba

    errors = []

    def start():
        try:
            numba.get_num_threads()                  # starts the pool, once per process
        except BaseException as exc:                 # no threading layer: raised in the caller
            errors.append(exc)

    worker = threading.Thread(target=start, name="distattn-numba-pool")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    _started = True
