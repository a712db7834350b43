"""A model fitted on an in-memory array, on a cluster whose workers are this process: the rows
reach the tasks by reference (dkha.engine.held), not inside every task's graph."""

from __future__ import annotations

import pickle
import warnings

import dask.config
import numpy as np

from dkha import KernelHebbianPCA
from dkha.data.ingest import ingest_array
from dkha.engine.held import held


def test_held_rows_pickle_as_a_key_and_what_is_computed_from_them_as_values():
    X = np.arange(12.0).reshape(4, 3)
    h = held(X)
    assert pickle.loads(pickle.dumps(h, protocol=5)) is h
    assert len(pickle.dumps(h, protocol=5)) < 200
    part = h[1:3]                                   # not registered: its values travel
    back = pickle.loads(pickle.dumps(part, protocol=5))
    assert back is not part and np.array_equal(back, X[1:3])


def test_a_fit_on_an_array_sends_no_large_graph(client, tmp_path):
    """``KernelHebbianPCA().fit(X)`` on the in-process cluster: no "Sending large graph" warning
    (the threshold lowered below the array's 256 kB: before, every task of the MK row pass
    carried X), and the same bits as the fit of a store of X."""
    X = np.random.default_rng(0).standard_normal((500, 64))
    blockwise = {"dkha.dense-bytes": 0}         # the default path's passes, not K' held whole
    low = {"distributed.admin.large-graph-warning-threshold": "200kB"}
    with dask.config.set({**low, **blockwise}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = KernelHebbianPCA(n_components=3, sigma=10.0, client=client).fit(X)
    large = [str(w.message).splitlines()[0] for w in caught if "large graph" in str(w.message)]
    assert large == []
    with dask.config.set(blockwise):      # the same rows read from a store by the workers
        read = KernelHebbianPCA(n_components=3, sigma=10.0, client=client).fit(
            ingest_array(X, tmp_path / "x.zarr"))
    assert np.array_equal(m.alpha_, read.alpha_)
    assert np.array_equal(m.eigenvalues_, read.eigenvalues_)
