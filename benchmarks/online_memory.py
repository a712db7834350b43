"""Peak memory of an online fit streaming from a 1 000 000-sample data store.

Generates a store of 1 000 000 samples × 16 features chunk by chunk with ``StoreWriter`` (a
smooth 3-d latent manifold in 16-d plus noise, 128 MB of float64 on disk uncompressed), then runs
ON-KHA for 200 000 steps in the seeded random order, reading prefetched blocks of rows
(``DataStore.read_rows``). Prints the process's peak RSS (``resource.getrusage``; must stay below
1 GB), its growth during the fit compared with the size of the data, and the reading statistics
(the largest single read, rows read in all) that show the store is never read whole.

    python benchmarks/online_memory.py [--samples 1000000] [--steps 200000] [--keep PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
from dkha.data.writer import StoreWriter
from dkha.estimators.online import OnlineKernelPCA

N_FEATURES = 16


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def generate(path: str, n_samples: int, seed: int = 0, piece: int = 50_000) -> None:
    """A store of ``n_samples`` rows, written ``piece`` rows at a time (never held whole)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(3, N_FEATURES))
    writer = StoreWriter(path, N_FEATURES, overwrite=True)
    try:
        for a in range(0, n_samples, piece):
            z = rng.normal(size=(min(piece, n_samples - a), 3))
            X = np.tanh(z @ W) + 0.05 * rng.normal(size=(len(z), N_FEATURES))
            writer.append(X)
        writer.commit({"source": {"kind": "generated", "latent_dims": 3, "noise": 0.05}})
    except BaseException:
        writer.abort()
        raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--block-rows", type=int, default=8192)
    ap.add_argument("--keep", help="write the store here and keep it (default: a temporary one)")
    args = ap.parse_args()

    tmp = None if args.keep else tempfile.mkdtemp(prefix="dkha-online-memory-")
    path = args.keep or os.path.join(tmp, "generated.zarr")
    try:
        t0 = time.perf_counter()
        if not (args.keep and os.path.exists(path)):
            generate(path, args.samples)
        data_mb = args.samples * N_FEATURES * 8 / 2**20
        print(f"store: {args.samples} × {N_FEATURES} float64 ({data_mb:.0f} MB of data), "
              f"written in {time.perf_counter() - t0:.1f} s; "
              f"peak RSS so far {peak_rss_mb():.0f} MB")
        before = peak_rss_mb()
        model = OnlineKernelPCA(8, algorithm="on-kha", kernel="gaussian", sigma=None, eta0=0.05,
                                gain_decay=0.99999, nu=1e-3, max_members=1000, steps=args.steps,
                                seed=0, block_rows=args.block_rows, prefetch=2)
        t0 = time.perf_counter()
        model.fit(path)
        seconds = time.perf_counter() - t0
        peak = peak_rss_mb()
        stats = model.stream_stats_
        print(f"fit: on-kha, {args.steps} steps in {seconds:.1f} s "
              f"({1e6 * seconds / args.steps:.0f} µs/step), sigma = {model.kernel_['sigma']:.3g}, "
              f"{model.dictionary_.shape[0]} members")
        share = 100 * stats["largest_read"] / args.samples
        print(f"reads: {stats['blocks']} blocks, {stats['rows_read']} rows in all, largest single "
              f"read {stats['largest_read']} rows = {share:.2f}% of the store; "
              f"waited {stats['wait_seconds']:.1f} s for data")
        print(f"peak RSS {peak:.0f} MB (limit 1024 MB: {'ok' if peak < 1024 else 'EXCEEDED'}); "
              f"growth during the fit {peak - before:.0f} MB vs {data_mb:.0f} MB of data")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
