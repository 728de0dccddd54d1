import numpy as np
import pytest

from distattn.stats import cooccurrence

from conftest import require

distributed = require("dask.distributed")


@pytest.fixture(scope="module")
def client():
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        yield c


def test_dask_backend_identical(client):
    rng = np.random.default_rng(3)
    docs = [rng.integers(-1, 300, size=rng.integers(0, 400)) for _ in range(400)]
    for kw in ({"window": 10, "weighting": "harmonic"}, {"window": 3, "symmetric": False},
               {"window": 4, "per_offset": True, "oov": "gap"}):
        local = cooccurrence(docs, 300, **kw)
        remote = cooccurrence(docs, 300, backend="dask", client=client, n_partitions=7, **kw)
        pairs = zip(local, remote) if isinstance(local, list) else [(local, remote)]
        for a, b in pairs:
            assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            assert np.array_equal(a.data, b.data)


def test_dask_backend_address(client):
    addr = client.scheduler.address
    S = cooccurrence([[0, 1, 2]], 3, window=1, backend="dask", client=addr)
    assert S.sum() == 4


def test_dask_backend_needs_client():
    with pytest.raises(ValueError, match="backend='dask' needs client="):
        cooccurrence([[0, 1]], 2, window=1, backend="dask")


@pytest.mark.parametrize("n_partitions", [0, -3, 2.5, True])
def test_dask_backend_refuses_a_bad_n_partitions_by_name(client, n_partitions):
    with pytest.raises(ValueError, match="n_partitions must be None or a positive integer"):
        cooccurrence([[0, 1]], 2, window=1, backend="dask", client=client, n_partitions=n_partitions)


@pytest.mark.parametrize("n_partitions", [1, 2, 5, 6, 40])     # 6 documents: more partitions than documents
def test_dask_backend_identical_with_empty_and_surplus_partitions(client, n_partitions):
    docs = [[], [0, -1, 1, 2], [], [], [3], [2, 2, 0, -1, -1, 1]]
    for kw in ({"window": 7, "weighting": "harmonic"}, {"window": 2, "symmetric": False, "oov": "gap"},
               {"window": 3, "per_offset": True, "weighting": "harmonic"}):
        local = cooccurrence(docs, 4, **kw)
        remote = cooccurrence(docs, 4, backend="dask", client=client, n_partitions=n_partitions, **kw)
        for a, b in zip(local, remote) if isinstance(local, list) else [(local, remote)]:
            assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            assert np.array_equal(a.data, b.data)


@pytest.mark.parametrize("n_partitions", [None, 2])
def test_dask_backend_refuses_a_closed_client_by_name(client, n_partitions):
    from dask.distributed import Client
    closed = Client(client.scheduler.address)
    closed.close()
    # it raised AttributeError: 'NoneType' object has no attribute 'ncores' (with n_partitions: ClosedClientError)
    with pytest.raises(ValueError, match=r"client is 'closed', not running"):
        cooccurrence([[0, 1]], 2, window=1, backend="dask", client=closed, n_partitions=n_partitions)


@pytest.mark.parametrize("kw", [{"client": "tcp://127.0.0.1:8786"}, {"n_partitions": 4}, {"worker_timeout": 5},
                                {"worker_timeout": 60.0}])
def test_dask_options_without_backend_dask_are_refused(kw):
    # they were ignored: the corpus was counted locally, on a machine the caller meant to spare
    with pytest.raises(ValueError, match=r"only used with backend='dask'.*backend='numpy'"):
        cooccurrence([[0, 1]], 2, window=1, **kw)


def test_dask_backend_sends_the_documents_to_the_workers_not_through_the_graph(client):
    """Each group's ids travelled inside the task graph, through the scheduler: on a corpus of a
    few MiB dask warned "Sending large graph of size …". They are scattered to the workers now."""
    import warnings
    from distattn.corpus.ragged import RaggedIds
    rng = np.random.default_rng(0)
    n = 4_000_000           # 16 MB of int32 ids in one task, over dask's 10 MiB threshold per submitted graph
    docs = RaggedIds(rng.integers(0, 500, n).astype(np.int32), np.arange(0, n + 1, 1000, dtype=np.int64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        remote = cooccurrence(docs, 500, window=1, backend="dask", client=client, n_partitions=1)
    assert not [w for w in caught if "large graph" in str(w.message)], [str(w.message)[:80] for w in caught]
    local = cooccurrence(docs, 500, window=1)
    assert np.array_equal(local.indptr, remote.indptr) and np.array_equal(local.indices, remote.indices)
    assert np.array_equal(local.data, remote.data)


@pytest.mark.parametrize("address", ["127.0.0.1:notaport", "http://127.0.0.1:8786", "scheduler"])
def test_dask_backend_refuses_a_malformed_address_by_name(address):
    # dask's own message named neither client= nor the allowed form ("invalid literal for int() with base 10")
    import re
    with pytest.raises(ValueError, match=re.escape(f"client={address!r} is not a scheduler address")):
        cooccurrence([[0, 1]], 2, window=1, backend="dask", client=address)


@pytest.fixture
def workerless_client():
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def test_dask_backend_without_workers_times_out_naming_the_wait_and_the_scheduler(workerless_client):
    # the scatter gave up after the client's own 30 s with "No valid workers found"; the wait had no setting
    import re
    address = workerless_client.scheduler.address
    with pytest.raises(TimeoutError, match=rf"no dask worker joined the scheduler at {re.escape(address)} "
                                           r"within worker_timeout=0.5 s"):
        cooccurrence([[0, 1]], 2, window=1, backend="dask", client=workerless_client, worker_timeout=0.5)


def test_dask_backend_waits_for_a_worker_that_is_still_starting(workerless_client):
    workerless_client.cluster.scale(1)      # the worker joins while the count waits for it
    S = cooccurrence([[0, 1, 2]], 3, window=1, backend="dask", client=workerless_client, worker_timeout=30)
    assert S.sum() == 4


def test_dask_backend_starts_an_adaptive_cluster_scaled_to_zero(workerless_client):
    # an adaptive cluster adds workers only for waiting tasks: wait_for_workers (and the scatter before it)
    # left it at zero workers until worker_timeout ran out
    workerless_client.cluster.adapt(minimum=0, maximum=1, interval="100ms")
    S = cooccurrence([[0, 1, 2]], 3, window=1, backend="dask", client=workerless_client, worker_timeout=30)
    assert S.sum() == 4


@pytest.mark.parametrize("worker_timeout", [0, -1, float("nan"), float("inf"), "60", True])
def test_dask_backend_refuses_a_bad_worker_timeout_by_name(worker_timeout):
    with pytest.raises(ValueError, match="worker_timeout must be a positive finite number of seconds"):
        cooccurrence([[0, 1]], 2, window=1, backend="dask", client="tcp://127.0.0.1:8786",
                     worker_timeout=worker_timeout)


@pytest.mark.parametrize("kw", [{"n_jobs": 4}, {"n_jobs": 1}, {"chunk_tokens": 1000}, {"chunk_tokens": 1 << 27}])
def test_local_options_with_backend_dask_are_refused(client, kw):
    # they were ignored: each task ran with n_jobs=1 and n_partitions= alone set the groups
    name = next(iter(kw))
    with pytest.raises(ValueError, match=rf"{name}= is not used with backend='dask'; got {name}={kw[name]}"):
        cooccurrence([[0, 1]], 2, window=1, backend="dask", client=client, **kw)


def test_dask_memory_check_does_not_charge_the_client_cpus_threads(client, monkeypatch):
    """The memory check ran with the client machine's os.cpu_count() counting threads (24 bytes
    a vocabulary entry each), though no thread counts on the client and each task counts on one
    worker thread: a count that fits was refused on a many-core client."""
    import os

    from distattn.memory import MemoryBudgetError
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    docs = [[0, 1, 2, 1, 0]]
    S = cooccurrence(docs, 100_000, window=2, backend="dask", client=client, max_memory=32 << 20)
    assert (S != cooccurrence(docs, 100_000, window=2, n_jobs=1)).nnz == 0
    with pytest.raises(MemoryBudgetError, match="would need about"):     # a budget it does not fit is still refused
        cooccurrence(docs, 100_000, window=2, backend="dask", client=client, max_memory=1 << 20)
