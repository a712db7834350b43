"""The scikit-learn contract and lazy Dask transforms, as figures.

1. ``sklearn.utils.estimator_checks.check_estimator`` on KernelHebbianPCA and OnlineKernelPCA
   (small settings): how many checks pass, fail, are skipped (and why).
2. ``transform`` of a 200 000-row dask array: the tasks run while building it (a dask callback
   counts them: must be 0), the largest difference from the eager transform of the same rows,
   and the seconds of the lazy compute and of the eager transform, measured in this one run.

    python benchmarks/sklearn_contract.py [--rows 200000]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
import dask
import dask.array as da
from sklearn.datasets import load_digits
from sklearn.utils.estimator_checks import check_estimator

from dkha import KernelHebbianPCA, OnlineKernelPCA, config
from dkha.engine.cluster import client_for


class TaskCounter(dask.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.tasks = 0

    def _pretask(self, key, dsk, state):
        self.tasks += 1


def checks() -> None:
    for model in (KernelHebbianPCA(2, algorithm="kha-et", passes=2, sigma=1.0),
                  OnlineKernelPCA(2, sigma=1.0, max_members=20)):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = check_estimator(model, on_fail=None)
        counts = collections.Counter(r["status"] for r in results)
        print(f"{type(model).__name__}: {len(results)} checks: {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['skipped']} skipped "
              f"({time.perf_counter() - t0:.1f} s)")
        for r in results:
            if r["status"] != "passed":
                print(f"  {r['status']}: {r['check_name']}: {str(r['exception'])[:120]}")


def lazy_transform(rows: int) -> None:
    X, _ = load_digits(return_X_y=True)
    X = X[:600] / 16.0
    model = KernelHebbianPCA(8, algorithm="kha-et", passes=2, sigma=2.0).fit(X)
    rng = np.random.default_rng(0)
    base = X[rng.integers(0, len(X), 2000)] + 0.01 * rng.standard_normal((2000, X.shape[1]))
    big = da.concatenate([da.from_array(base, chunks=base.shape)] * (rows // 2000))
    with dask.config.set(scheduler="threads"), TaskCounter() as counter:
        Y = model.transform(big)
        built = counter.tasks
        t0 = time.perf_counter()
        lazy = Y.compute()
        t_lazy = time.perf_counter() - t0
    dense = big.compute(scheduler="threads")
    t0 = time.perf_counter()
    eager = model.transform(dense)
    t_eager = time.perf_counter() - t0
    print(f"transform of a {big.shape[0]}-row dask array: {type(Y).__module__}.{type(Y).__name__} "
          f"{Y.shape} in {Y.npartitions} blocks; tasks run while building it: {built}; "
          f"tasks at compute: {counter.tasks - built}")
    print(f"max |lazy - eager| = {np.max(np.abs(lazy - eager)):.2e}; lazy compute {t_lazy:.2f} s, "
          f"eager {t_eager:.2f} s (ratio {t_lazy / t_eager:.2f}, threads scheduler, one run)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args()
    # one in-process cluster, used by every fit (the active client)
    with client_for(settings=config.settings()):
        checks()
        lazy_transform(args.rows)


if __name__ == "__main__":
    main()
