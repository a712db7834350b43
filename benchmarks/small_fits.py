"""Small in-memory fits, as scikit-learn's users make them by the hundred (grid searches,
pipelines, cross-validation): seconds per fit and per transform, and a grid search.

Measured in this one run (a busy machine moves every figure; compare the ratios):

1. per fit of ``l × 5`` Gaussian data (``n_components=4``): ``KernelHebbianPCA`` with
   ``algorithm="krylov"`` inline (the default for at most ``dkha.inline-samples`` samples and no
   cluster) and on the in-process Dask cluster (``dkha.inline-samples`` 0: every fit starts one,
   as every small fit did before), the ratio; the default algorithm; ``OnlineKernelPCA``;
   ``transform`` of the training rows;
2. scikit-learn's ``GridSearchCV`` of test_kernel_pca.py's ``test_gridsearch_pipeline`` (400
   circles, 4 gammas × 3 folds + the refit) with krylov, inline and on the cluster.

The code before the inline path ran every small fit as the cluster line does; run this script
with ``PYTHONPATH`` at an older checkout (``--before``: only the lines that checkout has) for its
own figures.

    python benchmarks/small_fits.py [--samples 300 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

if "--before" not in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dask.config
from sklearn.datasets import make_circles
from sklearn.linear_model import Perceptron
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

from dkha import KernelHebbianPCA, OnlineKernelPCA

ON_THE_CLUSTER = {"dkha.inline-samples": 0}


def best_of(repeat: int, func) -> float:
    """The shortest of ``repeat`` timings of ``func()`` (after one untimed call: compiles)."""
    func()
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - t0)
    return best


def per_fit(l: int, repeat: int) -> None:
    X = np.random.default_rng(0).normal(size=(l, 5))
    krylov = lambda: KernelHebbianPCA(4, algorithm="krylov").fit(X)
    inline = best_of(repeat, krylov)
    with dask.config.set(ON_THE_CLUSTER):
        cluster = best_of(repeat, krylov)
    default = best_of(repeat, lambda: KernelHebbianPCA(4).fit(X))
    online = best_of(repeat, lambda: OnlineKernelPCA(4).fit(X))
    model = krylov()
    transform = best_of(repeat, lambda: model.transform(X))
    print(f"l = {l}: krylov fit inline {inline:.3f} s, on the in-process cluster {cluster:.3f} s "
          f"(ratio {cluster / inline:.1f}); default fit {default:.3f} s; online fit "
          f"{online:.3f} s; transform of {l} rows {transform * 1e3:.1f} ms", flush=True)


def grid_search(cluster: bool) -> float:
    X, y = make_circles(n_samples=400, factor=0.3, noise=0.05, random_state=0)
    pipeline = Pipeline([("kernel_pca", KernelHebbianPCA(2, kernel="rbf", algorithm="krylov")),
                         ("Perceptron", Perceptron(max_iter=5))])
    search = GridSearchCV(pipeline, cv=3, param_grid={"kernel_pca__gamma": 2.0 ** np.arange(-2, 2)})
    t0 = time.perf_counter()
    with dask.config.set(ON_THE_CLUSTER if cluster else {}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X, y)
    seconds = time.perf_counter() - t0
    assert search.best_score_ == 1
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", action="store_true",
                    help="import dkha from PYTHONPATH (an older checkout), not this one")
    args = ap.parse_args()
    for l in args.samples:
        per_fit(l, args.repeat)
    inline, cluster = grid_search(False), grid_search(True)
    print(f"GridSearchCV (13 krylov fits of 267-400 circles): inline {inline:.2f} s, on the "
          f"in-process cluster {cluster:.2f} s (ratio {cluster / inline:.1f})")


if __name__ == "__main__":
    main()
