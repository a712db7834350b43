"""Small fits with no cluster run their tasks inline (:mod:`dkha.engine.inline`): the same
engine, the same bits as on the in-process cluster, errors where the cluster raises them."""

from __future__ import annotations

import pickle

import dask.config
import numpy as np
import pytest
from distributed import Client

from dkha import KernelHebbianPCA, config
from dkha.data.store import held_in_memory, open_store
from dkha.engine.cluster import client_for
from dkha.engine.inline import InlineClient
from dkha.engine.tasks import accumulate
from dkha.errors import InputError
from tests.processes import local_client


def _fit(X, **kw):
    return KernelHebbianPCA(n_components=5, algorithm="krylov", sigma=4.0, **kw).fit(X)


def test_inline_fit_equals_the_cluster_fit_bit_for_bit(digits, dense_centered):
    """A krylov fit inline and on the in-process cluster (dkha.inline-samples 0) agree to the
    last bit, and both find dense eigh's eigenvalues."""
    X = np.array(digits)
    with client_for(None, samples=len(X), settings=config.settings()) as c:
        assert isinstance(c, InlineClient)
    inline = _fit(X)
    with dask.config.set({"dkha.inline-samples": 0}):
        with client_for(None, samples=len(X), settings=config.settings()) as c:
            assert isinstance(c, Client)
        cluster = _fit(X)
    assert np.array_equal(inline.alpha_, cluster.alpha_)
    assert np.array_equal(inline.eigenvalues_, cluster.eigenvalues_)
    assert np.array_equal(inline.mk_, cluster.mk_)
    assert np.array_equal(inline.transform(X[:20]), cluster.transform(X[:20]))
    assert [p["tasks"] for p in inline.timings_["passes"]] == \
        [p["tasks"] for p in cluster.timings_["passes"]]
    w = np.linalg.eigvalsh(dense_centered(X, "gaussian", sigma=4.0)[1])[::-1][:5]
    np.testing.assert_allclose(inline.eigenvalues_, w, rtol=1e-7)


def test_a_running_client_is_used_whatever_the_size():
    """A user's own client (the active one) takes every fit, small ones included."""
    settings = config.settings()
    with local_client(1, 1) as client, client_for(None, samples=10, settings=settings) as c:
        assert c is client
    with client_for(None, samples=10, settings=config.settings()) as c:     # closed: inline again
        assert isinstance(c, InlineClient)


def test_inline_client_runs_tasks_as_dask_would():
    """Futures inside lists are resolved, a task's error comes out of gather and result (not
    out of submit), and the one worker is described as the in-process cluster's."""
    c = InlineClient(threads=3)
    a = c.submit(np.ones, 3, key="a", workers=["w"], allow_other_workers=False, pure=False)
    b = c.submit(accumulate, None, [a, None], [c.submit(lambda: (np.full(3, 2.0),)), 0])
    assert np.array_equal(c.gather([b])[0], np.full(3, 3.0))
    bad = c.submit(np.reshape, np.arange(3), (2, 2))
    assert bad.done() and bad.status == "error"
    with pytest.raises(ValueError):
        c.gather([bad])
    with pytest.raises(ValueError):
        bad.result()
    (worker,) = c.scheduler_info()["workers"].values()
    assert worker["nthreads"] == 3 and worker["memory_limit"] > 0
    assert list(c.run(lambda: 7).values()) == [7]


def test_store_rows_in_memory_read_as_the_chunks(digits_store):
    """A store holding its rows reads what its chunks hold; a pickled copy reads the chunks."""
    X = digits_store.read()
    held = held_in_memory(digits_store, X)
    idx = np.array([299, 3, 64, 65, 0])
    assert np.array_equal(held.read_rows(idx), digits_store.read_rows(idx))
    assert np.array_equal(held.read(10, 100), digits_store.read(10, 100))
    assert [np.array_equal(a[2], b[2]) for a, b in
            zip(held.iter_chunks(), digits_store.iter_chunks())] == [True] * held.n_chunks
    assert held == digits_store                 # the same store
    copy = pickle.loads(pickle.dumps(held))
    assert copy.rows is None and np.array_equal(copy.read(), X)
    with pytest.raises(InputError, match="shape"):
        held_in_memory(open_store(digits_store.path), X[:10])


def test_projections_on_the_workers_inline_equal_the_cluster(digits):
    """The replicas' tasks (pinned to a worker, rebuilt, dropped) run inline too: KHA-SMD with
    its projections on the workers, inline and on the in-process cluster, to the last bit."""
    X = np.array(digits[:200])
    kw = dict(n_components=3, algorithm="kha-smd", sigma=4.0, passes=2, projections="workers")
    inline = KernelHebbianPCA(**kw).fit(X)
    with dask.config.set({"dkha.inline-samples": 0}):
        cluster = KernelHebbianPCA(**kw).fit(X)
    assert inline.timings_["projections"]["chosen"] == "workers"
    assert np.array_equal(inline.alpha_, cluster.alpha_)
