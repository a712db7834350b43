"""Many models, one kernel stream: k models fitted together against the same k fitted apart.

On ``--samples`` 11×11 patches of bundled photographs (n = 121), gaussian kernel (sigma = the
median distance), r = ``--components``, ``--passes`` passes, seed 0, the in-process cluster (one
client for every fit, so cluster start-up counts for neither side): KHA/t, KHA/et and KHA-SMD

* fitted apart (three ``KernelHebbianPCA.fit``), and
* fitted together (one :func:`dkha.fit_together`: every block of centered kernel rows computed
  once and applied by the three solvers),

each ``--repeat`` times, interleaved (together, apart, together, apart, ...) so that load on the
shared machine hits both alike; the fastest of each counts. Wall time of the whole fit (MK row,
stream, final projections; with ``--evaluate-every 0`` also the final evaluation, whose kernel
passes the models share too). Prints the ratio together / apart (the goal: ≤ 0.6), whether each
model's ``alpha_`` equals its separate fit bit for bit (max |Δ| otherwise), the peak RSS and the
load average before and after.

    python benchmarks/many_models.py [--samples 12000] [--passes 3] [--components 8]
                                     [--evaluate-every -1] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _data import patch_store, peak_rss_mb

import dkha
from dkha import KernelHebbianPCA, config, fit_together
from dkha.engine.cluster import client_for

ALGORITHMS = {"kha-t": {"eta0": 0.5}, "kha-et": {"eta0": 0.2}, "kha-smd": {"eta0": 0.2, "mu": 0.2}}


def models(args, client):
    return [KernelHebbianPCA(args.components, algorithm=alg, passes=args.passes, seed=0,
                             evaluate_every=args.evaluate_every, client=client, **gains)
            for alg, gains in ALGORITHMS.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=12000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--components", type=int, default=8)
    ap.add_argument("--evaluate-every", type=int, default=-1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--store", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                    "dkha-bench-patches"))
    args = ap.parse_args()
    print(f"dkha from {dkha.__file__}")
    store = patch_store(f"{args.store}-{args.samples}.zarr", args.samples)
    print(f"l = {store.n_samples} patches × {store.n_features} pixels, r = {args.components}, "
          f"{args.passes} passes, evaluate_every = {args.evaluate_every}, "
          f"models: {', '.join(ALGORITHMS)}")
    load0 = os.getloadavg()
    times = {"together": [], "apart": []}
    alphas = {}
    with client_for(settings=config.settings()) as client:
        KernelHebbianPCA(2, algorithm="kha-smd", steps=64, evaluate_every=-1,
                         client=client).fit(store)          # warm up: numba, chunk cache
        for rep in range(args.repeat):
            t0 = time.perf_counter()
            together = fit_together(models(args, client), store)
            times["together"].append(time.perf_counter() - t0)
            apart = models(args, client)
            t0 = time.perf_counter()
            for m in apart:
                m.fit(store)
            times["apart"].append(time.perf_counter() - t0)
            print(f"round {rep + 1}: together {times['together'][-1]:.1f} s, apart "
                  f"{times['apart'][-1]:.1f} s", flush=True)
            alphas = {m.algorithm: (m.alpha_, a.alpha_) for m, a in zip(together, apart)}
    load1 = os.getloadavg()
    t, a = min(times["together"]), min(times["apart"])
    print(f"\nfastest of {args.repeat}: together {t:.1f} s, apart {a:.1f} s "
          f"(3 fits), ratio together/apart = {t / a:.3f}  (goal ≤ 0.6: "
          f"{'met' if t / a <= 0.6 else 'NOT met'})")
    for alg, (x, y) in alphas.items():
        same = np.array_equal(x, y)
        print(f"  {alg:8s} alpha together == apart: {'bit for bit' if same else 'NO'}"
              + ("" if same else f" (max |Δ| = {np.abs(x - y).max():.3e})"))
    print(f"peak RSS {peak_rss_mb():.0f} MiB; load average {load0[0]:.2f} before, "
          f"{load1[0]:.2f} after (2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
