"""Shared fixtures: a seed, a small digits array, a data store made from it, a Dask client.

The run has one in-process cluster (1 worker, 2 threads), started when a module first asks for
a ``client``; each module gets a client of its own on it (the default client while the
module's tests run), closed after them, and the workers' chunk cache is cleared then.
"""

from __future__ import annotations

import os

import dask.config
import numpy as np
import pytest

# The suite's oracle tests compare the recorded excess error E/E_min − 1 with dense eigh: they
# ask for the exact evaluation (dkha's default tracks KHA fits without E_min, dkha.fit.track),
# here and in the dkha commands they start. tests/test_track.py tests the tracked default.
os.environ["DASK_DKHA__EVALUATION"] = "exact"
dask.config.set({"dkha.evaluation": "exact"})

from dkha.data.ingest import ingest_array
from tests.processes import local_cluster

#: modules whose tests hang on timing (signals sent as a phase starts, heartbeats, workers
#: killed between passes): under pytest-xdist (``--dist loadgroup``) one group, run one test
#: after the other on one worker; every other module is a group of its own (its module
#: fixtures made once)
SERIAL = frozenset({"test_stop_phases", "test_resume", "test_cli", "test_progress",
                    "test_churn", "test_worker_loss", "test_checkpoint"})


#: what a test marked ``slow`` or ``cluster`` (a minute's work: processes started, a real
#: server) counts for beside an ordinary test (about a second) when the groups are ordered
LONG_TEST = 40


def pytest_configure(config):
    # xdist hands the groups out in the order the workers collected them (below), longest first,
    # not by its own reorder (by their number of tests): that sent the one-test modules of a
    # minute (the device check's dry run, TLS) last, one worker running them as the other idled
    if getattr(config.option, "dist", None) == "loadgroup":
        config.option.loadscopereorder = False


def _group(item) -> str:
    """The item's xdist group, as pytest-xdist names it."""
    return "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")}))


@pytest.hookimpl(tryfirst=True)     # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.module.__name__.rpartition(".")[2]
            item.add_marker(pytest.mark.xdist_group("serial" if module in SERIAL else module))
    if os.environ.get("PYTEST_XDIST_WORKER"):      # each worker collects: the same order in all
        cost: dict[str, int] = {}
        for item in items:
            long = item.get_closest_marker("slow") or item.get_closest_marker("cluster")
            cost[_group(item)] = cost.get(_group(item), 0) + (LONG_TEST if long else 1)
        items.sort(key=lambda item: -cost[_group(item)])     # stable: a group's own order kept


DIGITS_PER_CLASS = 30
DIGITS_CHUNK_ROWS = 64  # 300 digits -> 5 chunks, the last one short


def digits_subset(per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``per_class`` samples of each digit of load_digits, pixels ``x/8 - 1``.

    Samples are sorted by class (all zeros, then all ones, ...), labels alongside.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    idx = np.concatenate([np.flatnonzero(d.target == k)[:per_class] for k in range(10)])
    return d.data[idx] / 8.0 - 1.0, d.target[idx].astype(np.int64)


@pytest.fixture(scope="session", name="digits_subset")
def digits_subset_fixture():
    """:func:`digits_subset` itself, for tests that need another number per class."""
    return digits_subset


@pytest.fixture(scope="session")
def seed() -> int:
    """The seed tests draw their random numbers from."""
    return 20240607


@pytest.fixture(scope="session")
def digits_with_labels() -> tuple[np.ndarray, np.ndarray]:
    X, y = digits_subset(DIGITS_PER_CLASS)
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


@pytest.fixture(scope="session")
def digits(digits_with_labels) -> np.ndarray:
    """``(300, 64)`` float64: 30 samples of each digit, pixels in [-1, 1]."""
    return digits_with_labels[0]


@pytest.fixture(scope="session")
def digits_store(tmp_path_factory, digits_with_labels):
    """A data store of :func:`digits` (with labels) in chunks of 64 rows (5 chunks).

    Read-only for the tests: do not write into it.
    """
    X, y = digits_with_labels
    path = tmp_path_factory.mktemp("stores") / "digits.zarr"
    return ingest_array(np.array(X), path, labels=np.array(y), chunk_rows=DIGITS_CHUNK_ROWS)


@pytest.fixture(scope="session")
def in_process_cluster():
    """The run's in-process ``LocalCluster`` (1 worker, 2 threads)."""
    with local_cluster(1, 2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(in_process_cluster):
    """A ``distributed.Client`` of :func:`in_process_cluster` per test module (the default client
    while the module's tests run); after them the workers' chunk cache is cleared."""
    from distributed import Client

    from dkha.engine.tasks import clear_cache

    with Client(in_process_cluster) as c:
        yield c
        c.run(clear_cache)


@pytest.fixture(scope="session")
def dense_centered():
    """The dense oracle: ``K' = K − 1K/l − K1/l + 1K1/l²`` with a directly computed ``K``.

    Returns a function ``(X, kernel_name, **params) -> (K, K')``; ``K`` by ``scipy.spatial``
    distances or plain products (not by dkha's kernels), centered with explicit ones-matrices.
    """
    return centered_kernel_oracle


def kernel_matrix_oracle(X: np.ndarray, Y: np.ndarray, name: str, **p) -> np.ndarray:
    from scipy.spatial.distance import cdist

    if name == "gaussian":
        return np.exp(-cdist(X, Y, "sqeuclidean") / (2.0 * p["sigma"] ** 2))
    if name == "laplacian":
        return np.exp(-cdist(X, Y, "euclidean") / p["sigma"])
    if name == "polynomial":
        return (X @ Y.T + p.get("offset", 0.0)) ** p.get("degree", 1)
    if name == "sigmoid":
        return np.tanh(p.get("gamma", 1.0) * (X @ Y.T) + p.get("offset", 0.0))
    raise AssertionError(name)


def centered_kernel_oracle(X: np.ndarray, name: str = "gaussian", **p):
    K = kernel_matrix_oracle(X, X, name, **p)
    l = len(K)
    one = np.ones((l, l))
    Kc = K - one @ K / l - K @ one / l + one @ K @ one / l**2
    return K, Kc
