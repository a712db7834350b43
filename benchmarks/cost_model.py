"""The default fit's cost model against the fit it plans: the Krylov path's estimated seconds
(``path_estimates["krylov"]``) beside the seconds the fit took and the K'V products it used.

The dense path is ruled out (``dkha.dense-bytes`` 0) so every size runs the blockwise Krylov path
the model prices; r = 20 components of 11×11 patches of scikit-image's photographs (the README's
setting), each fit starting its own local cluster of this machine's cores, as `dkha fit` does.
Prints, per size, the estimate, the fit's wall seconds (the run's last ``wall_time`` and the
whole call), the products, and the ratio estimate / taken (target: within 2× either way).

    python benchmarks/cost_model.py [--sizes 5000 20000] [--components 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import dask
from _data import load_average, patch_store

from dkha import KernelHebbianPCA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    ap.add_argument("--components", type=int, default=20)
    args = ap.parse_args()
    print(f"load average before: {load_average()}")
    print(f"{'l':>7} {'estimate s':>10} {'fit s':>7} {'call s':>7} {'products':>8} "
          f"{'est/fit':>7}")
    with tempfile.TemporaryDirectory(prefix="dkha-cost-") as tmp, \
            dask.config.set({"dkha.dense-bytes": 0, "dkha.evaluation": "tracked"}):
        for l in args.sizes:
            store = patch_store(os.path.join(tmp, f"p{l}.zarr"), l)
            t0 = time.perf_counter()
            model = KernelHebbianPCA(args.components, seed=0).fit(store.path)
            call = time.perf_counter() - t0
            a = model.attrs_
            est = a["path_estimates"]["krylov"]
            fit = model.history_[-1]["wall_time"]
            print(f"{l:>7} {est:>10.1f} {fit:>7.1f} {call:>7.1f} "
                  f"{model.history_[-1]['pass']:>8} {est / call:>7.2f}   ({a['path_reason']})",
                  flush=True)
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
