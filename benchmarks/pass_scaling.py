"""How a blockwise pass scales with the number of Dask worker processes.

On ``--samples`` 11×11 patches (gaussian sigma = 3), for each worker count N a local cluster of N
single-threaded worker processes (one BLAS thread each) computes the MK row (a pass over the
tiles I ≤ J), a product ``K' V`` with 30 columns (the Krylov solver's and evaluation's pass), and
streams the centered kernel rows of one KHA pass to this process (``--block`` rows a block; the
coordinator only receives them here, so this is the workers' side of a pass and the transfer).
After one warm-up MK pass (imports, chunk reads). Prints seconds and the speed-up over the first
worker count.

    python benchmarks/pass_scaling.py --samples 20000 --workers 1 2 4 8 16
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"   # inherited by the worker processes: one BLAS thread per worker

import numpy as np


def main():
    from _data import patch_store
    from distributed import Client, LocalCluster

    from dkha import config
    from dkha.engine.rows import RowEngine
    from dkha.kernels import make_kernel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    l = args.samples
    store = patch_store(os.path.join(args.workdir, f"patches-{l}.zarr"), l)
    kernel = make_kernel("gaussian", sigma=3.0)
    V = np.random.default_rng(0).standard_normal((l, 30))
    perm = np.random.default_rng(1).permutation(l)
    blocks = [(k, perm[k:k + args.block]) for k in range(0, l, args.block)]
    print(f"l = {l}, n = {store.n_features}, {os.cpu_count()} cores; seconds (speed-up over "
          f"{args.workers[0]} worker(s))")
    print(f"{'workers':>8s} {'MK row':>14s} {'K′V (30 cols)':>16s} {'row pass':>14s}")
    base = None
    for n in args.workers:
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=":0", silence_logs=logging.WARNING) as cluster, \
                Client(cluster) as client:
            engine = RowEngine(store, kernel, client, config.settings(column_groups=n))
            engine.compute_mk()   # warm-up: imports and chunk reads on every worker
            t0 = time.perf_counter()
            engine.compute_mk()
            t_mk = time.perf_counter() - t0
            t0 = time.perf_counter()
            engine.matmat(V)
            t_mm = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in engine.stream(blocks):
                pass
            t_rows = time.perf_counter() - t0
        times = (t_mk, t_mm, t_rows)
        base = base or times
        print(f"{n:8d} " + " ".join(f"{t:7.2f} ({b / t:4.1f}×)" for t, b in zip(times, base)),
              flush=True)


if __name__ == "__main__":
    main()
