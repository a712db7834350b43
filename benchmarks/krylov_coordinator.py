"""The block Krylov solver's own arithmetic at large ``l``: what the coordinator does between
two products ``K'V`` (issue 32: on one H200 a product at l = 10⁶ took 9–10 s on the GPU and the
coordinator 6–7 s more between products, docs/device-check.md).

A stand-in product (a diagonal operator with a power-law spectrum, no kernel) isolates the
solver's basis work: the Ritz pairs, residuals, orthogonalisation (``orthonormal_columns``: two
projections against the basis, an SVD, a QR), the basis grown by ``np.hstack``, thick restarts.
Prints the seconds a product and the functions that take them (cProfile, cumulative)::

    python benchmarks/krylov_coordinator.py --samples 1000000 --block 30 --products 8

Measured on 2 busy cores (load ~7), l = 10⁶, block 30, basis 90: 18.3 s a product, of which the
SVD 2.1 s, the QR 2.0 s and ``hstack`` 2.9 s (memory copies and tall-skinny LAPACK, which do not
scale with cores); the rest is BLAS-3 products.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from dkha.solvers.eigen import top_eigenpairs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--block", type=int, default=30)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--products", type=int, default=8)
    ap.add_argument("--max-basis", type=int, default=90,
                    help="basis columns (dkha.krylov-memory's 512 MiB at l = 10⁶: 90)")
    args = ap.parse_args(argv)
    l = args.samples
    rng = np.random.default_rng(0)
    d = 1.0 / (1.0 + np.arange(l)) ** 1.5

    def matmat(V):
        return V * d[:, None]

    X0 = rng.standard_normal((l, args.block))
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    _, _, info = top_eigenpairs(matmat, X0, args.components, tol=1e-12, maxiter=args.products,
                                max_basis=args.max_basis)
    profile.disable()
    seconds = time.perf_counter() - t0
    print(f"l = {l}, block {args.block}, basis ≤ {args.max_basis}: {info.products} products in "
          f"{seconds:.1f} s, {seconds / info.products:.2f} s a product (the products themselves: "
          f"a diagonal scaling); load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(12)


if __name__ == "__main__":
    main()
