"""Kernel evaluations per second against the machine's bound for one pass, in one run.

On ``--samples`` 11×11 patches of the bundled photographs (n = 121, gaussian kernel, sigma =
median distance), for each precision (float64, float32), interleaved so that a change of load
hits the bound and dkha alike:

* the bound for one pass: the distance GEMM ``l×n·n×l`` plus ``exp`` of ``l²`` values, each at
  its best on this machine (the fastest of several blockings and of two ways of threading over
  all cores, for NumPy's BLAS; ``exp`` in one NumPy thread per core, in cache) — the issue's
  bound; and the same plus the GEMMs of the products the pass itself makes (``+products``: the
  pass's own product columns ``k`` over its tiles, at the same best);
* dkha on the in-process cluster (one thread per core, one BLAS thread each), one pass of:
  ``MK`` (the exact MK row), ``K'V`` (one Krylov product, k = r + r/2 columns, both halves of
  each tile ``I < J``), ``KHA`` (one KHA-SMD pass: the block stream of a 1-pass fit, centering
  cached; the coordinator multiplies each block by ``S̃_B`` (r columns: the ``A`` rows of the
  projections are columns of the kept ``C̃ = S̃_A K'``, as ``K'`` is symmetric) and a thread of
  its own updates ``C̃`` (r) meanwhile), ``evaluation`` (one residual pass ``‖K' − CᵀC‖``,
  ``C_Iᵀ C_J`` once a tile, r columns; always float64 tiles, so printed for float64 only);
* printed: seconds, kernel evaluations per second per core and dkha as % of the bound of the
  same precision (and of the bound with the pass's products), both for the evaluations the pass
  makes: l² for KHA, about l²/2 for MK, K'V and evaluation, which use K's symmetry. Each figure is
  the fastest of ``--repeat`` rounds.

    python benchmarks/throughput.py [--samples 20000] [--components 20] [--repeat 2]
                                    [--precision both|float64|float32] [--projections coordinator]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import dask.config
import numpy as np
from _data import load_average, patch_store
from threadpoolctl import threadpool_limits

from dkha import KernelHebbianPCA, config
from dkha.engine.cluster import blas_threads_for, client_for
from dkha.engine.rows import RowEngine
from dkha.kernels import make_kernel, median_distance

#: the blockings tried for the distance GEMM (rows × columns of each product; the fastest counts)
GEMM_SHAPES = ((256, None), (64, None), (256, 2048), (2048, 2048), (1024, 1024))


def _threads(cores: int, work, parts: int) -> float:
    """Seconds of ``work(part)`` for ``part`` in ``range(parts)``, one thread per core (each with
    one BLAS thread), or ``inf`` when ``parts`` is 0."""
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(cores) as pool:
        t0 = time.perf_counter()
        list(pool.map(work, range(cores)))
        return time.perf_counter() - t0


def _best(timings: dict) -> tuple[float, str]:
    how = min(timings, key=timings.get)
    return timings[how], how


def bound_parts(X: np.ndarray, dtype, ks: tuple[int, ...], cores: int, fraction: int = 8) -> dict:
    """Seconds for the parts of one pass's bound over all of ``X``, each at its best here:

    * ``gemm``: the distances ``X Xᵀ`` (``l×n·n×l``), the fastest of the blockings
      :data:`GEMM_SHAPES` (output blocks in cache or not), on all cores either as one BLAS call
      with ``cores`` threads or as one thread per core with one BLAS thread each; each timed on
      the first ``l/fraction`` rows and scaled;
    * ``gemmK`` for each ``K`` of ``ks``: the products of a pass with ``K`` columns, both shapes
      a block's products take (``b×l·l×K``, a 256-row panel times ``V``; and ``K×b·b×l``, the
      transposed update), the faster of the two way of threading, each half of ``K``;
    * ``exp``: exp of l² values (one NumPy thread per core on chunks of 32 768 values, in cache).

    ``how`` says which blocking and threading won."""
    l = len(X)
    Xd = np.ascontiguousarray(X, dtype=dtype)
    part_rows = max(1, l // fraction)
    out: dict = {}
    timings = {}
    for rows, cols in GEMM_SHAPES:
        cols = cols or l

        def blocks(first, step, rows=rows, cols=cols):
            buf = np.empty((rows, cols), dtype=dtype)
            for a in range(first * rows, part_rows, step * rows):
                b = min(a + rows, part_rows)
                for c in range(0, l, cols):
                    d = min(c + cols, l)
                    np.matmul(Xd[a:b], Xd[c:d].T, out=buf[:b - a, :d - c])

        with threadpool_limits(limits=cores, user_api="blas"):
            t0 = time.perf_counter()
            blocks(0, 1)
            timings[f"{rows}×{cols} BLAS×{cores}"] = time.perf_counter() - t0
        timings[f"{rows}×{cols} 1/thread"] = _threads(cores, lambda h: blocks(h, cores), cores)
    gemm, how = _best(timings)
    out["gemm"] = gemm * l / part_rows
    b = 256
    panel = np.ascontiguousarray(np.random.default_rng(0).random((b, l)), dtype=dtype)
    blocks = -(-l // b)
    for k in ks:
        V = np.ones((l, k // 2), dtype=dtype)
        U = np.ones((k - k // 2, b), dtype=dtype)

        def products(first, step, V=V, U=U):
            for _ in range(first, blocks, step):
                _ = panel @ V
                _ = U @ panel

        with threadpool_limits(limits=cores, user_api="blas"):
            t0 = time.perf_counter()
            products(0, 1)
            blas = time.perf_counter() - t0
        out[f"gemm{k}"] = min(blas, _threads(cores, lambda h: products(h, cores), cores))
    chunk = 1 << 15
    args = -np.random.default_rng(0).random(chunk).astype(dtype)   # exp arguments in [−1, 0]
    per_thread = -(-l * l // (chunk * cores))

    def exp_part(_):
        res = np.empty_like(args)
        for _ in range(per_thread):
            np.exp(args, out=res)

    with ThreadPoolExecutor(cores) as pool:
        t0 = time.perf_counter()
        list(pool.map(exp_part, range(cores)))
        out["exp"] = time.perf_counter() - t0
    out["how"] = how
    return out


def kha_pass(store, r: int, client, sigma: float, projections: str, precision: str
             ) -> tuple[float, dict]:
    """Seconds of one KHA-SMD pass: the block stream of a 1-pass fit (``timings_["stream"]``:
    start-up, the cached centering row and the final eigenvalue estimate excluded), and the
    pass's record (:class:`dkha.fit.kha_stream.PassMeter`)."""
    m = KernelHebbianPCA(r, algorithm="kha-smd", sigma=sigma, passes=1, evaluate_every=-1,
                         seed=0, eta0=0.05, mu=0.05, client=client, projections=projections,
                         precision=precision)
    m.fit(store.path)
    rec = [p for p in m.timings_["passes"] if p.get("kind") == "kha"][-1]
    return float(m.timings_["stream"]), rec


def dkha_passes(store, kernel, client, r: int, precision: str, projections: str) -> dict:
    l = store.n_samples
    out = {}
    with dask.config.set({"dkha.precision": precision}):
        engine = RowEngine(store, kernel, client, config.settings())
        t0 = time.perf_counter()
        engine.compute_mk(cache=False)
        out["MK"] = time.perf_counter() - t0
        V = np.random.default_rng(0).standard_normal((l, r + r // 2))
        t0 = time.perf_counter()
        engine.matmat(V)
        out["K'V"] = time.perf_counter() - t0
        C = np.random.default_rng(1).standard_normal((r, l)) / np.sqrt(l)
        t0 = time.perf_counter()
        engine.residual(C)
        out["evaluation"] = time.perf_counter() - t0
        out["KHA"], rec = kha_pass(store, r, client, kernel["sigma"], projections, precision)
        # where the pass's time went: the coordinator's own work (CPU seconds of its thread:
        # block GEMMs, steps) and its waits for the workers' blocks
        out["KHA coordinator CPU"] = rec["busy_cpu_seconds"]
        out["KHA coordinator waiting"] = rec["wait_seconds"]
        sides = [g[-1][1] - g[0][0] for g in engine.tile_groups]
        symmetric = sum(sides[i] * sides[j]
                        for i in range(len(sides)) for j in range(i, len(sides)))
    return out, symmetric


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2, help="rounds; the fastest of each counts")
    ap.add_argument("--precision", choices=("both", "float64", "float32"), default="both")
    ap.add_argument("--projections", choices=("coordinator", "workers"), default="coordinator")
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"load average before: {load_average()}", flush=True)
    l, r = args.samples, args.components
    store = patch_store(os.path.join(args.workdir, f"patches-{l}.zarr"), l)
    X = store.read_rows(np.arange(l))
    sigma = median_distance(X[np.random.default_rng(0).choice(l, min(l, 1000), replace=False)])
    kernel = make_kernel("gaussian", sigma=sigma)
    cores = os.cpu_count() or 1
    precisions = ("float64", "float32") if args.precision == "both" else (args.precision,)
    # the product columns each pass multiplies its tiles by, and the share of the tiles' l²
    # values they multiply (K'V: both halves of a tile I < J; evaluation: C_Iᵀ C_J once)
    columns = {"MK": 0, "K'V": r + r // 2, "KHA": 2 * r, "evaluation": r}
    ks = tuple(sorted({k for k in columns.values() if k}))
    best_bound: dict = {}
    best_dkha: dict = {}
    print(f"l = {l}, n = {X.shape[1]}, r = {r}, sigma = {sigma:.3f}, {cores} cores, KHA-SMD "
          f"projections on the {args.projections}", flush=True)
    settings = config.settings()
    with client_for(settings=settings) as client, blas_threads_for(client, settings):
        for p in precisions:            # warm-up: compilation, the cached centering rows
            with dask.config.set({"dkha.precision": p}):
                KernelHebbianPCA(r, algorithm="kha-smd", sigma=sigma, steps=256, evaluate_every=-1,
                                 eta0=0.05, mu=0.05,
                                 client=client).fit(store.path)
        for rnd in range(max(1, args.repeat)):
            for p in precisions:        # bound and dkha interleaved: load changes hit both
                dtype = np.dtype(p)
                b = bound_parts(X, dtype, ks, cores)
                d, symmetric = dkha_passes(store, kernel, client, r, p, args.projections)
                print(f"  round {rnd + 1} {p}: bound parts "
                      + ", ".join(f"{k} {v:.2f} s" for k, v in b.items() if k != "how")
                      + f" (distances: {b['how']}); dkha "
                      + ", ".join(f"{k} {v:.2f} s" for k, v in d.items()), flush=True)
                for k, v in b.items():
                    if k == "how":
                        continue
                    best_bound[p, k] = min(v, best_bound.get((p, k), np.inf))
                for k, v in d.items():
                    best_dkha[p, k] = min(v, best_dkha.get((p, k), np.inf))
    print(f"load average after: {load_average()}")
    print(f"\n{'pass':<12}{'precision':<10}{'bound s':>9}{'+products':>10}{'dkha s':>9}"
          f"{'bound ev/s/core':>17}{'dkha ev/s/core':>16}{'% of bound':>12}{'% +products':>13}")
    for name, k in columns.items():
        # MK, K'V and evaluation use K's symmetry (tiles I ≤ J): their bound is for the
        # evaluations they make; a KHA pass computes whole rows, l² evaluations
        share = 1.0 if name == "KHA" else symmetric / (l * l)
        def rate(s, share=share):
            return share * l * l / s / cores
        for p in precisions:
            if name == "evaluation" and p != "float64":
                continue        # evaluation always uses float64 tiles (RowEngine.exact_kernel)
            bound = share * (best_bound[p, "gemm"] + best_bound[p, "exp"])
            products = 1.0 if name in ("KHA", "K'V") else share
            full = bound + products * (best_bound[p, f"gemm{k}"] if k else 0.0)
            t = best_dkha[p, name]
            print(f"{name:<12}{p:<10}{bound:>9.2f}{full:>10.2f}{t:>9.2f}{rate(bound):>17.3e}"
                  f"{rate(t):>16.3e}{100 * bound / t:>11.0f}%{100 * full / t:>12.0f}%")


if __name__ == "__main__":
    main()
