"""End-to-end pass speed of `dkha fit` against the floor, the per-step form, and at l = 200 000.

On ``--samples`` 11×11 patches of bundled photographs (n = 121), r = 20, gaussian kernel
(sigma = median distance), KHA-SMD, embedded default, ``--evaluate-every -1``, in one run:

* seconds per pass: (3-pass fit − 1-pass fit) / 2, so start-up, compilation, the MK row and the
  final projections do not count;
* the floor: one pass of centered kernel rows in plain NumPy (blocks of 512), each block
  multiplied by a 2r×l matrix — the work no exact method can skip — and the ratio dkha / floor;
* the per-step form (coordinator-math §2) timed on a few dozen steps, extrapolated to a pass;
* the coordinator's wait for blocks per pass, bytes received from the workers per pass (against
  shipping whole kernel rows, b·l numbers a block), and the peak RSS of the process;
* each of that for both places of the block projections (``--projections``, default both):
  ``coordinator`` (kernel rows shipped, b·l numbers a block) and ``workers`` (coordinator-math §4:
  partial projections and the window, (2r·groups + prefetch·b)·b numbers a block, plus C̃ home
  once a pass, r·l numbers), with the expected figures;
* the load average (the machine may be shared) before and after; each fit is run ``--repeat``
  times (modes interleaved) and the fastest counts, which keeps bursts of load out of the
  differences;
* with ``--large``: steps × l per second at l = 200 000 (n = 16, a few thousand steps after the
  MK row) against the same rate at ``--samples``.

    python benchmarks/pass_speed.py [--samples 20000] [--large] [--workers N]
                                    [--projections both|coordinator|workers] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import load_average, patch_store, peak_rss_mb

from dkha import KernelHebbianPCA
from dkha.data.writer import StoreWriter
from dkha.engine.tasks import center_block
from dkha.solvers.updates import smd


def fit_seconds(store, r, *, passes=None, steps=None, workers=None, sigma=None, block=None,
                projections=None):
    m = KernelHebbianPCA(r, algorithm="kha-smd", sigma=sigma, passes=passes, steps=steps,
                         evaluate_every=-1, seed=0, client=workers, block_rows=block,
                         eta0=0.05, mu=0.05, projections=projections)
    t0 = time.perf_counter()
    m.fit(store)
    return time.perf_counter() - t0, m


def floor_pass(X, kernel, mk, mkm, r, block=512, seed=0):
    """Centered kernel rows in plain NumPy, blocks of ``block`` in a random order, times 2r×l."""
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((2 * r, len(X)))
    perm = rng.permutation(len(X))
    t0 = time.perf_counter()
    for a in range(0, len(X), block):
        P = perm[a:a + block]
        K = center_block(kernel.block(X[P], X), mk[P], mk, mkm)
        _ = S @ K.T
    return time.perf_counter() - t0


def per_step_pass(X, kernel, mk, mkm, r, n_steps=40, seed=0):
    """The straightforward SMD step (O(r² l)) timed on ``n_steps`` steps, extrapolated to a pass."""
    l = len(X)
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((r, l)) / np.sqrt(r * l)
    B = np.zeros_like(A)
    C = rng.standard_normal((r, l))
    rho = np.zeros(r)
    P = rng.permutation(l)[:n_steps]
    rows = center_block(kernel.block(X[P], X), mk[P], mk, mkm)
    eta = np.full(r, 1e-3)
    t0 = time.perf_counter()
    for j, p in enumerate(P):
        smd.per_step(A, B, C, rho, int(p), rows[j], eta, 0.01, 0.99)
    return (time.perf_counter() - t0) / n_steps * l


def large_rate(workdir, l=200_000, n=16, r=20, steps=4096, workers=None):
    path = os.path.join(workdir, f"gauss-{l}x{n}.zarr")
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        w = StoreWriter(path, n, chunk_rows=8192, overwrite=True)
        centres = rng.standard_normal((20, n)) * 2
        for a in range(0, l, 8192):
            k = min(8192, l - a)
            w.append(centres[rng.integers(0, 20, k)] + rng.standard_normal((k, n)))
        w.commit({"source": {"kind": "generated", "what": "20 gaussian blobs"}})
    t_small, _ = fit_seconds(path, r, steps=1024, workers=workers)
    t_big, m = fit_seconds(path, r, steps=1024 + steps, workers=workers)
    return steps * l / (t_big - t_small), m


def expected_bytes(mode, l, r, b, groups, prefetch):
    """Bytes a pass should move from the workers to the coordinator (KHA-SMD: m = 2r)."""
    if mode == "coordinator":
        return l * l * 8
    n_blocks = -(-l // b)
    return (n_blocks * (groups * 2 * r + prefetch * b) * b + r * l) * 8


def main():
    from dkha import config

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--block", type=int, default=None)
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--projections", choices=("both", "coordinator", "workers"), default="both")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each fit; the fastest counts")
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"load average before: {load_average()}", flush=True)
    r, l = args.components, args.samples
    store = patch_store(os.path.join(args.workdir, f"patches-{l}.zarr"), l)
    modes = ("coordinator", "workers") if args.projections == "both" else (args.projections,)
    b = int(config.settings(block_rows=args.block).block_rows)
    prefetch = int(config.settings().prefetch)
    ncores = os.cpu_count() or 1       # the threads dkha.engine.cluster.client_for starts
    threads = args.workers * max(1, ncores // args.workers) if args.workers else ncores
    groups = min(int(config.settings().column_groups or threads), store.n_chunks)
    runs = {}
    for _ in range(max(1, args.repeat)):
        for passes in (1, 3):          # modes interleaved: a change of load hits both alike
            for mode in modes:
                t, m = fit_seconds(store.path, r, passes=passes, workers=args.workers,
                                   block=args.block, projections=mode)
                print(f"  {mode}: {passes} pass(es) {t:.1f} s", flush=True)
                if (mode, passes) not in runs or t < runs[mode, passes][0]:
                    runs[mode, passes] = (t, m)
    figures = {}
    for mode in modes:
        (t1, m1), (t3, m3) = runs[mode, 1], runs[mode, 3]
        s1, s3 = m1.stream_stats_, m3.stream_stats_
        figures[mode] = {"t1": t1, "t3": t3, "per_pass": (t3 - t1) / 2,
                         "wait": (s3["wait_seconds"] - s1["wait_seconds"]) / 2,
                         "bytes": (s3["bytes_received"] - s1["bytes_received"]) / 2}
    X = store.read()
    kernel = m3.kernel_
    floor = floor_pass(X, kernel, m3.mk_, m3.mkm_, r)
    step_form = per_step_pass(X, kernel, m3.mk_, m3.mkm_, r)
    print(f"l = {l}, n = {X.shape[1]}, r = {r}, {kernel.describe()}, KHA-SMD, "
          f"{'embedded default' if not args.workers else f'{args.workers} worker processes'}, "
          f"b = {b}, prefetch = {prefetch}, {groups} column groups")
    print(f"floor (NumPy rows × 2r×l)      {floor:8.2f} s")
    print(f"per-step form, extrapolated    {step_form:8.1f} s")
    for mode, f in figures.items():
        per_pass, wait, nbytes = f["per_pass"], f["wait"], f["bytes"]
        want = expected_bytes(mode, l, r, b, groups, prefetch)
        print(f"projections on the {mode}:")
        print(f"  dkha seconds per pass        {per_pass:8.2f}   "
              f"(3 passes {f['t3']:.1f} s − 1 pass {f['t1']:.1f} s, / 2; fastest of "
              f"{max(1, args.repeat)})")
        print(f"  dkha / floor                 {per_pass / floor:8.2f}   (target ≤ 1.25)")
        print(f"  per-step / dkha              {step_form / per_pass:8.1f}×  (target ≥ 10)")
        print(f"  coordinator wait per pass    {wait:8.2f}   "
              f"({100 * wait / per_pass:.0f}% of the pass)")
        print(f"  bytes to coordinator per pass {nbytes / 1e6:7.1f} MB "
              f"(expected {want / 1e6:.1f} MB; whole kernel rows: {l * l * 8 / 1e6:.0f} MB)")
    if len(figures) == 2:
        c, w = figures["coordinator"], figures["workers"]
        print(f"workers / coordinator: seconds per pass {w['per_pass'] / c['per_pass']:.2f}, "
              f"bytes per pass {w['bytes'] / c['bytes']:.3f}")
    print(f"peak RSS of this process       {peak_rss_mb():8.0f} MiB")
    if args.large:
        rate_small = l * l / figures[modes[0]]["per_pass"]
        rate, m = large_rate(args.workdir, workers=args.workers)
        print(f"steps × l per second: l = {l}: {rate_small:.3g};  l = 200000 (n = 16): {rate:.3g}  "
              f"(ratio {rate / rate_small:.2f}, target ≥ 0.5)")
        print(f"peak RSS of this process       {peak_rss_mb():8.0f} MiB")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
