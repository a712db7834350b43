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

    python benchmarks/memory_budget.py [--cases tabular-200000 patches-113270] [--no-before]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import numpy as np
from _data import peak_rss_watch

GiB = 2**30


def make_store(case: str, workdir: str):
    from _data import patch_store

    from dkha.data.ingest import ingest_array
    from dkha.data.store import open_store

    kind, _, n = case.partition("-")
    l = int(n)
    path = os.path.join(workdir, f"{case}.zarr")
    if kind == "patches":
        return patch_store(path, l), 20
    if kind != "tabular":
        raise SystemExit(f"unknown case {case!r}")
    if os.path.exists(path):
        st = open_store(path)
        if st.n_samples == l:
            return st, 16
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((10, 16)) * 3
    X = centres[rng.integers(0, 10, l)] + rng.standard_normal((l, 16))
    return ingest_array(X, path, chunk_rows=8192, overwrite=True), 16


def run_fit(store, r: int, out: str, env_extra: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, **env_extra)
    cmd = [sys.executable, "-m", "dkha.cli", "fit", store.path, "-o", out, "--components", str(r),
           "--algorithm", "kha-smd", "--evaluate-every", "-1", "--steps", "4000", "--overwrite"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    peak: list = []
    watch = peak_rss_watch(proc.pid, peak)
    text, _ = proc.communicate()
    watch.join()
    secs = time.perf_counter() - t0
    if proc.returncode:
        return {"error": text[-1500:]}
    timings = {}
    for root, _, files in os.walk(out):
        if "timings.json" in files:
            with open(os.path.join(root, "timings.json")) as f:
                timings = json.load(f)
    return {"peak": peak[0] if peak else 0, "seconds": secs, "memory": timings.get("memory")}


def main() -> int:
    from _data import load_average

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["tabular-200000"])
    ap.add_argument("--no-before", action="store_true")
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"load {load_average()}; peak RSS of all processes of `dkha fit ... --algorithm kha-smd "
          "--evaluate-every -1 --steps 4000` (target < 2 GiB)")
    for case in args.cases:
        store, r = make_store(case, args.workdir)
        print(f"\n{case}: l = {store.n_samples}, n = {store.n_features}, r = {r}", flush=True)
        runs = [("default", {})] + ([] if args.no_before else
                                    [("before", {"DASK_DKHA__MEMORY_BUDGET": "1TiB"})])
        for name, env in runs:
            res = run_fit(store, r, os.path.join(args.workdir, f"run-{case}-{name}"), env)
            if "error" in res:
                print(f"  {name:8s} failed:\n{res['error']}")
                continue
            m = res["memory"] or {}
            print(f"  {name:8s} peak RSS {res['peak'] / GiB:5.2f} GiB  {res['seconds']:7.1f} s  "
                  f"block rows {m.get('block_rows')}, prefetch {m.get('prefetch')}, tile side "
                  f"{m.get('tile_rows')} ({m.get('reason')})"
                  + ("  < 2 GiB: met" if name == "default" and res["peak"] < 2 * GiB else ""),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
