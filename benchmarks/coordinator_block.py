"""The coordinator's CPU a KHA-SMD block, with the projections on worker processes, against l.

Issue 41: the coordinator's work per block must not grow with l or with the workers (coordinator-
math §4: with the projections on the workers it sums r×b partials, replays the updates since
their version on the window ``K'[P, W ∪ P]`` and applies the block: nothing of length l). For
each ``--samples`` value, on 11×11 patches (gaussian σ = 3) and one LocalCluster of ``--workers``
single-threaded worker processes shared by all of them: a KHA-SMD stream of ``--steps`` steps
(blocks of ``--block`` rows, ``--prefetch`` ahead, ``projections=workers``, centered by an MK
row sampled from 2 000 columns as ``scaling.py --kha-only`` does), after a warm-up of 4 blocks,
``--repeat`` times, once of ``--steps`` steps and once of twice as many. Printed: the
coordinator thread's CPU seconds a block, the difference of the two streams' CPU seconds in
their steps (the pass record, ``busy_cpu_seconds``) over the blocks the longer one adds — what a
block costs, without the work a pass does once at its start (SMD's Grams from ``C̃``, the base
kept for rebuilding lost replicas: ``O(r² l)`` a pass, ``O(r² b)`` a block over a whole pass,
but not over a subset of its blocks) —, the median of the repeats with their range, the
whole shorter stream's CPU over its blocks beside it, and each l's figure against the first l's
(target: within ±20 % between l = 20 000 and l = 80 000).

    python benchmarks/coordinator_block.py [--samples 20000 80000] [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics

from scaling import cluster, kha_pass


def stream_cpu(engine, l: int, r: int, steps: int) -> float:
    """The coordinator thread's CPU seconds in the steps of a KHA-SMD stream of ``steps``."""
    engine.stats.passes.clear()
    kha_pass(engine, l, r, n_steps=steps)
    return sum(p["busy_cpu_seconds"] for p in engine.stats.passes if p.get("kind") == "kha")


def main():
    from _data import load_average, patch_store

    from dkha import config
    from dkha.engine.mkrow import sampled_mk_row
    from dkha.engine.rows import RowEngine
    from dkha.kernels import make_kernel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[20000, 80000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5120)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"load average before: {load_average()}", flush=True)
    kernel = make_kernel("gaussian", sigma=3.0)
    figures = {}
    with cluster(args.workers, None) as client:
        for l in args.samples:
            store = patch_store(os.path.join(args.workdir, f"patches-{l}.zarr"), l)
            engine = RowEngine(store, kernel, client, config.settings(projections="workers"),
                               block_rows=args.block, prefetch=args.prefetch)
            mk = sampled_mk_row(engine, min(l, 2000), seed=0)
            engine.set_mk(mk, float(mk.mean()))
            kha_pass(engine, l, args.components, n_steps=4 * args.block)     # warm-up
            per_block, whole = [], []
            blocks = -(-args.steps // args.block)
            for _ in range(args.repeat):
                short, long = (stream_cpu(engine, l, args.components, steps)
                               for steps in (args.steps, 2 * args.steps))
                per_block.append((long - short) / blocks)
                whole.append(short / blocks)
            figures[l] = per_block, whole
            print(f"  l = {l}: coordinator CPU a block "
                  + ", ".join(f"{1e3 * s:.2f}" for s in per_block) + " ms (whole stream "
                  + ", ".join(f"{1e3 * s:.2f}" for s in whole) + ")", flush=True)
    first = statistics.median(figures[args.samples[0]][0])
    print(f"\n{args.workers} worker processes x 1 thread, projections on the workers, r = "
          f"{args.components}, blocks of {args.block}, {args.prefetch} ahead, {args.steps} steps; "
          f"load average after: {load_average()}")
    print(f"{'l':>8s} {'ms a block':>11s} {'range':>15s} {'vs first':>9s} {'whole stream':>13s}")
    for l, (per_block, whole) in figures.items():
        med = statistics.median(per_block)
        print(f"{l:8d} {1e3 * med:11.2f} {1e3 * min(per_block):7.2f}–{1e3 * max(per_block):<7.2f}"
              f" {med / first:8.2f}× {1e3 * statistics.median(whole):10.2f} ms")


if __name__ == "__main__":
    main()
