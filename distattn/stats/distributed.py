"""Co-occurrence counting on a ``dask.distributed`` cluster (optional extra ``distributed``).

The corpus is cut into consecutive document groups, scattered to the workers (not carried in the
task graph); each worker counts its groups with the
same compiled kernel as the local backend, partial matrices are summed in a tree on the
workers, and the client receives one matrix. Because the harmonic weights are integers until
the final division (see :mod:`distattn.stats.cooccurrence`), the result is bit-identical to the
local backend whatever the grouping or the order of the sums, for ``window <= 22``; a wider
window sums float weights ``1/d``, and the grouping changes the last bits.
"""

from __future__ import annotations

import numpy as np

from distattn.corpus.ragged import RaggedIds


def _check_address(address: str) -> None:
    """dask's own ValueError for an address it cannot parse (an unknown scheme, no port, a bad port)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend
    scheme, loc = parse_address(address)
    get_backend(scheme)
    if scheme in ("tcp", "tls", "ws", "wss"):
        parse_host_port(loc)


def _client(client):
    try:
        from dask.distributed import Client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("backend='dask' needs the optional extra: pip install 'distattn[distributed]'") from exc
    if client is None:
        raise ValueError("backend='dask' needs client=: a dask.distributed.Client or a scheduler address "
                         "such as 'tcp://127.0.0.1:8786'")
    if isinstance(client, str):
        try:    # checked before Client() starts its IO loop thread, which a refused address has no use for
            _check_address(client)
            return Client(client), True
        except ValueError as exc:    # dask's "invalid literal for int() with base 10: 'x'" named no option
            raise ValueError(f"client={client!r} is not a scheduler address ({exc}); pass an address such as "
                             "'tcp://127.0.0.1:8786' or a dask.distributed.Client") from exc
    if not isinstance(client, Client):
        raise TypeError(f"client must be a dask.distributed.Client or an address string, not {type(client).__name__}")
    if client.status != "running":     # a closed client failed with "'NoneType' object has no attribute 'ncores'"
        raise ValueError(f"the dask client is {client.status!r}, not running: pass a connected "
                         "dask.distributed.Client or a scheduler address such as 'tcp://127.0.0.1:8786'")
    return client, False


def _count_group(group, spec):
    from distattn.stats.cooccurrence import count_block
    ids, offsets = group
    return count_block(RaggedIds(ids, offsets), **spec)


def _sum(a, b):
    from distattn.stats.cooccurrence import _add
    return _add(a, b)


def map_reduce_counts(ragged: RaggedIds, groups, spec: dict, client, n_partitions: int | None = None,
                      worker_timeout: float = 60.0):
    """Count ``ragged`` on the cluster. ``groups`` are the local backend's document ranges;
    they are regrouped into about ``n_partitions`` (default: 2 per worker thread) tasks.
    Waits up to ``worker_timeout`` seconds for a first worker, then raises ``TimeoutError``."""
    from distattn.stats.cooccurrence import finalize, split_documents
    client, owned = _client(client)
    try:
        # With no worker, the scatter below gave up after the client's timeout ("No valid workers
        # found"). A probe task, unlike wait_for_workers, is work waiting on the scheduler, so an
        # adaptive cluster scaled to zero starts a worker for it.
        probe = client.submit(int, 0, pure=False)
        try:
            probe.result(timeout=worker_timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"no dask worker joined the scheduler at {client.scheduler.address} within "
                               f"worker_timeout={worker_timeout} s: start workers on the cluster, or pass a "
                               "larger worker_timeout= for one that is still starting") from exc
        finally:
            probe.release()
        if n_partitions is None:
            n_partitions = max(1, 2 * sum(client.nthreads().values()))
        chunk = max(1, -(-ragged.n_tokens // n_partitions))
        groups = split_documents(ragged, chunk)
        spec = dict(spec, n_jobs=1)
        parts = []
        for lo, hi in groups:
            off = ragged.offsets[lo:hi + 1]
            parts.append((np.ascontiguousarray(ragged.ids[off[0]:off[-1]]), off - off[0]))
        # the documents go straight to the workers, one object per group, and each task runs where
        # its group is: inside the task graph they passed through the scheduler, and dask warned
        # "Sending large graph of size …" on a corpus of some MiB. hash=False: equal groups (two
        # empty ones) got one key, which the release of an earlier call's could cancel ("lost dependencies")
        futures = [client.submit(_count_group, part, spec, pure=False) for part in client.scatter(parts, hash=False)]
        while len(futures) > 1:  # tree reduction on the workers
            nxt = [client.submit(_sum, futures[i], futures[i + 1], pure=False) for i in range(0, len(futures) - 1, 2)]
            if len(futures) % 2:
                nxt.append(futures[-1])
            futures = nxt
        total = futures[0].result()
    finally:
        if owned:
            client.close()
    return finalize(total, spec["window"], spec["weighting"], spec["exact"])
