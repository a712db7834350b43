"""
==========================================
A run on a Dask cluster, with lazy transforms
==========================================

dkha uses the ``distributed.Client`` you make (here a local cluster of worker processes; on
a real cluster, ``Client("tcp://scheduler:8786")``): the workers compute kernel rows from the
zarr store, one coordinator applies the updates. A dask array (or an xarray DataArray)
is transformed lazily, blockwise on the workers.
"""

# %%
import os
import tempfile

import dask
import dask.array as da
import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits

import dkha

small = os.environ.get("DKHA_EXAMPLE_SMALL") == "1"

# Everything runs under the ``__main__`` guard: the worker processes import this script again
# (multiprocessing's spawn), and would otherwise each make a store of their own.
if __name__ == "__main__":
    X, _ = load_digits(return_X_y=True)
    X = X[:300] if small else X
    with tempfile.TemporaryDirectory(prefix="dkha-example-") as work, \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster):
        store = dkha.ingest_array(X / 16.0, os.path.join(work, "digits.zarr"), chunk_rows=100)
        # %%
        # KHA-SMD from a random start on the cluster (the active client is used), measured by
        # the exact excess
        # error E/E_min − 1 at each pass (eq. 22; cheap on digits: the default only tracks
        # the components' span, and has no excess to print).
        with dask.config.set({"dkha.evaluation": "exact"}):
            model = dkha.KernelHebbianPCA(8, algorithm="kha-smd", sigma=2.0, init="random",
                                          passes=2 if small else 10).fit(store.path)
        print(f"excess error after {model.history_[-1]['pass']} passes: "
              f"{model.history_[-1]['excess']:.3e}")

        # %%
        # A lazy transform of a larger dask array: nothing runs until compute.
        big = da.concatenate([da.from_array(X / 16.0, chunks=(len(X), 64))] * 10)
        Y = model.transform(big)
        print(type(Y).__name__, Y.shape, Y.npartitions, "blocks")
        print("spread of each component:", np.round(Y.std(axis=0).compute(), 4))
