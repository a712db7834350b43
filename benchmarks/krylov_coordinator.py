"""The block Krylov solver's own arithmetic at large ``l`` against its floor: what the coordinator
does between two products ``K'V`` (issue 40: on one H200 at l = 10⁶ the solver's own work took
~50 s of a 147 s fit while the GPU idled, docs/device-check.md).

A stand-in product (a diagonal operator with a power-law spectrum, no kernel) isolates the
solver's basis work: the Ritz pairs, residuals, orthogonalisation (two projections against the
basis, CholeskyQR2), thick restarts. Its seconds are the solve's minus those inside the stand-in
product, a product. Beside them, measured in the same run, **the floor**: the BLAS-3 work one
block step cannot avoid, on the same shapes (a basis of ``--max-basis`` columns, a block of
``--block``): two projections of the new block against the basis (``Qᵀ Z``, ``Z − Q C``,
twice), its Gram matrix ``ZᵀZ`` and a triangular solve ``Z R⁻¹`` (in place, preallocated),
sampled before the solve and after each product (so that it sees the load the solver sees)::

    python benchmarks/krylov_coordinator.py --samples 1000000

Both run on the BLAS threads a CPU fit gives the coordinator (one: ``dkha fit`` holds its
coordinator's and workers' BLAS to the layout's thread,
:func:`dkha.engine.cluster.blas_threads_for`, so that its bits do not follow the cores);
``--blas-threads 0`` leaves OpenBLAS its default (all cores), as the coordinator of a fit with
tiles on a GPU has it.

Acceptance (issue 40, on 2 cores): the solver's own seconds a product ≤ 3× the floor. Before
CholeskyQR2 and the preallocated basis: 9.96 s a product against a floor of 1.2 s (8.3×; the SVD
and QR of l-row blocks and ``np.hstack`` of the basis were the difference; all cores). Since
then the solver sweeps its ``n``-row blocks in chunks of rows (:func:`dkha.solvers.eigen._sweep`):
the projections, the triangular solves (products with ``R⁻¹``) and the Gram matrices of a chunk
while it is in the cache, the residuals with the thick restart's Ritz vectors in one read of the
basis. ``--profile``
prints the functions that take the time (cProfile, cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import _data  # noqa: F401 - first: this checkout's dkha on the path
import numpy as np
from scipy.linalg.blas import dtrsm

from dkha.solvers.eigen import top_eigenpairs


class Floor:
    """One block step's unavoidable BLAS-3 work (module docstring) on its own arrays, timed
    where :meth:`step` is called: before the solve and after each product, so that its samples
    see the load the solver's work sees."""

    def __init__(self, xp, l: int, basis: int, block: int, rng):
        self.xp = xp
        self.Q = xp.asarray(rng.standard_normal((l, basis)) / np.sqrt(l))  # QᵀQ ≈ I
        self.Z0 = xp.asarray(rng.standard_normal((l, block)))
        self.Z, self.scratch = xp.empty_like(self.Z0), xp.empty_like(self.Z0)
        self.Z[...] = self.Z0          # the pages touched before any timing
        self.scratch[...] = 0.0
        self.samples: list[float] = []

    def step(self) -> float:
        xp, Q, Z, scratch = self.xp, self.Q, self.Z, self.scratch
        Z[...] = self.Z0
        _sync(xp)
        t0 = time.perf_counter()
        for _ in range(2):
            C = Q.T @ Z
            xp.matmul(Q, C, out=scratch)
            Z -= scratch
        G = Z.T @ Z
        if xp is np:
            R = np.linalg.cholesky(G).T
            dtrsm(1.0, R, Z.T, side=0, lower=0, trans_a=1, overwrite_b=1)
        else:
            from cupyx.scipy.linalg import solve_triangular

            R = xp.asarray(np.linalg.cholesky(xp.asnumpy(G)).T)
            Z[...] = solve_triangular(R, Z.T, trans="T", lower=False).T
        _sync(xp)
        seconds = time.perf_counter() - t0
        self.samples.append(seconds)
        return seconds


def _sync(xp) -> None:
    if xp is not np:
        xp.cuda.Device().synchronize()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--block", type=int, default=30)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--products", type=int, default=8)
    ap.add_argument("--max-basis", type=int, default=90,
                    help="basis columns (at l = 10⁶, dkha.krylov-memory's 512 MiB gives 33; "
                         "the solver's floor of 3 blocks, 90)")
    ap.add_argument("--repeat", type=int, default=3, help="floor measurements (mean)")
    ap.add_argument("--profile", action="store_true", help="print the solver's profile")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="BLAS threads of the solver and the floor (1: as a CPU fit's "
                         "coordinator runs; 0: OpenBLAS's default, all cores)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the basis and the stand-in products live (cuda: CuPy, a GPU "
                         "host; the floor on the GPU too, its triangular solve by cuBLAS)")
    args = ap.parse_args(argv)
    if args.blas_threads > 0:
        from dkha.engine.cluster import blas_limit

        with blas_limit(args.blas_threads):
            return run(args)
    return run(args)


def run(args) -> None:
    l = args.samples
    rng = np.random.default_rng(0)
    load0 = os.getloadavg()[0]
    if args.device == "cuda":
        import cupy as xp
    else:
        xp = np
    floor = Floor(xp, l, args.max_basis, args.block, rng)
    for _ in range(args.repeat):
        floor.step()
    d = xp.asarray(1.0 / (1.0 + np.arange(l)) ** 1.5)
    excluded = [0.0]        # the stand-in products and the floor's samples between them

    def matmat(V):
        _sync(xp)
        t0 = time.perf_counter()
        out = V * d[:, None]
        floor.step()
        excluded[0] += time.perf_counter() - t0
        return out

    X0 = xp.asarray(rng.standard_normal((l, args.block)))
    profile = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    _, _, info = top_eigenpairs(matmat, X0, args.components, tol=1e-12, maxiter=args.products,
                                max_basis=args.max_basis)
    _sync(xp)
    if profile is not None:
        profile.disable()
    seconds = time.perf_counter() - t0
    own = (seconds - excluded[0]) / info.products
    f = float(np.mean(floor.samples))
    threads = (f"{args.blas_threads} BLAS thread{'s' if args.blas_threads > 1 else ''}"
               if args.blas_threads > 0 else "OpenBLAS's default threads")
    print(f"l = {l}, block {args.block}, basis ≤ {args.max_basis}, on the {args.device} "
          f"({threads}): "
          f"{info.products} products, "
          f"{info.restarts} restarts, {info.householder} Householder fallbacks in {seconds:.1f} s"
          f" ({excluded[0]:.1f} s of it in the stand-in products and the floor's samples)")
    print(f"the solver's own seconds a product: {own:.2f} s; the floor of one block step "
          f"(2 projections against {args.max_basis} columns, Gram, triangular solve; mean of "
          f"{len(floor.samples)} samples, {min(floor.samples):.2f}–{max(floor.samples):.2f} s, "
          f"{args.repeat} before the solve and one after each product): {f:.2f} s; "
          f"ratio {own / f:.2f}x (acceptance: <= 3x)")
    print(f"load {load0:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores")
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(14)


if __name__ == "__main__":
    main()
