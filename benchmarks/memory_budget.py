"""Memory bounded by default: peak RSS of every process of a `dkha fit` under the default
``dkha.memory-budget``, beside the fixed block sizes dkha used before (256 rows, 4 ahead).

For each case, `dkha fit` runs as a child process (this checkout's dkha, the default in-process
cluster) and the RSS of it and all its children is sampled every 0.1 s; the peak of the sum is
printed with the plan the run recorded (``timings.json``: budget, block rows, prefetch, tile
side) and the wall seconds. "before" is the same command with the budget set out of the way
(``DASK_DKHA__MEMORY_BUDGET=1TiB``: blocks of 256 rows, 4 ahead, whatever l).

Cases (``--cases``):

* ``tabular-200000``: 200 000 × 16 seeded gaussian clusters, KHA-SMD, ``--evaluate-every -1
  --steps 4000`` (the issue's case; default start: Nyström);
* ``patches-N``: ``N`` 11×11 patches of the bundled photographs (n = 121), the same command
  with ``--components 20`` (e.g. ``patches-113270``).
* ``online-N``: an online fit streaming from ``N`` samples × 16 (a smooth 3-d latent manifold
  plus noise), ``--algorithm on-kha --steps 200000 --components 8 --max-members 1000``: the
  store is read in prefetched blocks, never whole (target < 1 GiB at ``online-1000000``; this
  case was ``benchmarks/online_memory.py``, issue 5). There is no "before" for it.

    python benchmarks/memory_budget.py [--cases tabular-200000 patches-113270 online-1000000]
                                       [--no-before]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from _data import checkout_env, load_average, patch_store, run_watched

from dkha.data.ingest import ingest_array
from dkha.data.store import open_store
from dkha.data.writer import StoreWriter

GiB = 2**30


def manifold_store(path: str, n_samples: int, seed: int = 0, piece: int = 50_000):
    """``n_samples`` × 16 rows near a 3-d latent manifold, written ``piece`` rows at a time."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(3, 16))
    writer = StoreWriter(path, 16, overwrite=True)
    try:
        for a in range(0, n_samples, piece):
            z = rng.normal(size=(min(piece, n_samples - a), 3))
            writer.append(np.tanh(z @ W) + 0.05 * rng.normal(size=(len(z), 16)))
        writer.commit({"source": {"kind": "generated", "latent_dims": 3, "noise": 0.05}})
    except BaseException:
        writer.abort()
        raise
    return open_store(path)


def make_store(case: str, workdir: str):
    kind, _, n = case.partition("-")
    l = int(n)
    path = os.path.join(workdir, f"{case}.zarr")
    if kind == "patches":
        return patch_store(path, l), 20
    if kind not in ("tabular", "online"):
        raise SystemExit(f"unknown case {case!r}")
    if os.path.exists(path):
        st = open_store(path)
        if st.n_samples == l:
            return st, 8 if kind == "online" else 16
    if kind == "online":
        return manifold_store(path, l), 8
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((10, 16)) * 3
    X = centres[rng.integers(0, 10, l)] + rng.standard_normal((l, 16))
    return ingest_array(X, path, chunk_rows=8192, overwrite=True), 16


ONLINE = ["--algorithm", "on-kha", "--steps", "200000", "--eta0", "0.05", "--gain-decay",
          "0.99999", "--nu", "1e-3", "--max-members", "1000"]
BATCH = ["--algorithm", "kha-smd", "--evaluate-every", "-1", "--steps", "4000"]


def run_fit(store, r: int, out: str, env_extra: dict, online: bool = False) -> dict:
    cmd = [sys.executable, "-m", "dkha.cli", "fit", store.path, "-o", out, "--components", str(r),
           *(ONLINE if online else BATCH), "--overwrite"]
    res = run_watched(cmd, env=checkout_env(**env_extra), stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True)
    if res["returncode"]:
        return {"error": res["stdout"][-1500:]}
    timings = {}
    for root, _, files in os.walk(out):
        if "timings.json" in files:
            with open(os.path.join(root, "timings.json")) as f:
                timings = json.load(f)
    return {"peak": res["peak_mb"] * 2**20, "seconds": res["seconds"],
            "memory": timings.get("memory")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["tabular-200000"])
    ap.add_argument("--no-before", action="store_true")
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"load {load_average()}; peak RSS of all processes of `dkha fit STORE -o RUN "
          f"--components R {' '.join(BATCH)}` (target < 1.5 GiB, issue 41; online cases: "
          f"`{' '.join(ONLINE)}`, target < 1 GiB)")
    for case in args.cases:
        store, r = make_store(case, args.workdir)
        print(f"\n{case}: l = {store.n_samples}, n = {store.n_features}, r = {r}", flush=True)
        online = case.startswith("online")
        runs = [("default", {})] + ([] if args.no_before or online else
                                    [("before", {"DASK_DKHA__MEMORY_BUDGET": "1TiB"})])
        for name, env in runs:
            res = run_fit(store, r, os.path.join(args.workdir, f"run-{case}-{name}"), env, online)
            if "error" in res:
                print(f"  {name:8s} failed:\n{res['error']}")
                continue
            m, limit = res["memory"] or {}, 1 if online else 1.5
            plan = (f"block rows {m.get('block_rows')}, prefetch {m.get('prefetch')}, tile side "
                    f"{m.get('tile_rows')} ({m.get('reason')})" if m else "streamed in blocks")
            print(f"  {name:8s} peak RSS {res['peak'] / GiB:5.2f} GiB  {res['seconds']:7.1f} s  "
                  f"{plan}"
                  + (f"  < {limit} GiB: met" if name == "default" and res["peak"] < limit * GiB
                     else ""),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
