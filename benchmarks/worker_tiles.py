"""Kernel tiles in a Dask worker's process: panel buffers reused per thread against fresh ones.

Every worker started by a nanny (``dask worker``, ``LocalCluster(processes=True)``, dask-jobqueue)
gets the environment of ``distributed.nanny.pre-spawn-environ``, which sets
``MALLOC_TRIM_THRESHOLD_=65536``: glibc then returns large freed blocks to the system at once, so
each newly allocated panel of a tile is page-faulted in again, 4 KiB at a time. dkha's tile
functions keep their panel buffers per thread (:func:`dkha.tiles.scratch`). For an MK tile and a
``K'V`` tile (``--rows`` × ``--rows`` of 11×11 patches, gaussian σ = 3), each in a fresh
process with and without the nanny's environment, and with the buffers reused or fresh (a new
array for every panel of about ``PANEL_BYTES``, as the tile functions did before), this prints
the seconds a tile, the minor page faults a tile, and the ratio fresh / reused.

    python benchmarks/worker_tiles.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, {here!r}); sys.path.insert(0, os.path.dirname({here!r}))
import numpy as np
from _data import patch_store
from dkha import tiles
from dkha.engine.tasks import mk_tile, product_pair
from dkha.kernels import make_kernel
if not {reuse}:      # a new array for every panel, as before the buffers were kept
    tiles.cpu.SCRATCH_BYTES = 0
    panel = tiles.cpu.cpu_panel
    tiles.cpu.cpu_panel = lambda *a, out=None: panel(*a)
rows, repeat = {rows}, {repeat}
store = patch_store({path!r}, 2 * rows)
k = make_kernel("gaussian", sigma=3.0)
gi, gj = ((0, rows),), ((rows, 2 * rows),)
V = np.random.default_rng(0).standard_normal((2 * rows, 30))
mk = np.zeros(2 * rows)
out = {{}}
for name, f in (("MK tile", lambda: mk_tile(store.path, k, gi, gj)),
                ("K'V tile", lambda: product_pair(store.path, k, mk, 0.0, gi, gj, V))):
    f()
    best = None
    for _ in range(3):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        for _ in range(repeat):
            f()
        s = (time.perf_counter() - t0) / repeat
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / repeat
        if best is None or s < best[0]:
            best = (s, faults)
    out[name] = best
print(json.dumps(out))
"""


def run(rows, repeat, path, reuse, nanny_env):
    import dask
    import distributed  # noqa: F401 - registers distributed's configuration

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    if nanny_env:
        env.update({k: str(v) for k, v in
                    dask.config.get("distributed.nanny.pre-spawn-environ").items()})
    code = CHILD.format(here=HERE, rows=rows, repeat=repeat, path=path, reuse=reuse)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    path = os.path.join(args.workdir, f"patches-{2 * args.rows}.zarr")
    print(f"{args.rows} × {args.rows} tiles of 11×11 patches, best of 3 × {args.repeat}, one "
          "process each")
    print(f"{'environment':34s} {'tile':9s} {'fresh s':>8s} {'faults':>7s} {'reused s':>9s} "
          f"{'faults':>7s} {'fresh/reused':>12s}")
    for nanny_env in (True, False):
        fresh = run(args.rows, args.repeat, path, False, nanny_env)
        reused = run(args.rows, args.repeat, path, True, nanny_env)
        label = "nanny's (MALLOC_TRIM_THRESHOLD_)" if nanny_env else "plain process"
        for name in fresh:
            (fs, ff), (rs, rf) = fresh[name], reused[name]
            print(f"{label:34s} {name:9s} {fs:8.4f} {ff:7.0f} {rs:9.4f} {rf:7.0f} "
                  f"{fs / rs:11.2f}×")


if __name__ == "__main__":
    main()
