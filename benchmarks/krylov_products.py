"""Krylov in few products: ``K' V`` passes and wall time to the residual ``‖K'v − λv‖/λ ≤ tol``
for every one of the top ``r`` components, before and after.

On ``--samples`` 11×11 patches of bundled photographs (gaussian kernel, σ the median distance of
a seeded 1 000-sample, r = 20), in one process and one in-process cluster, the centering row
computed once and shared:

* ``lobpcg``: what dkha did before — scipy's LOBPCG on blockwise products (block ``r + max(5,
  r/2)``, one subspace step as the start), its absolute tolerance set to ``tol·λ_r`` so that every
  component reaches ``tol`` relative to its own eigenvalue;
* ``block``: dkha's thick-restarted block Krylov solver (:mod:`dkha.solvers.eigen`), block ``r +
  max(10, r/2)``, random start (``dkha fit --algorithm krylov --tol``);
* ``block:B``: the same with a block of ``B`` columns;
* ``nystrom:M``: the block solver started from dkha's Nyström solution with ``M`` landmarks (its
  landmark rows are in the seconds);
* ``float32``: the block solver with float32 kernel tiles (``--precision float32``) to its
  round-off floor, then float64 from its vectors to ``tol``.

Each method's residuals are checked independently: a plain NumPy blockwise pass over the data
(kernel rows from the raw samples, centered with a NumPy centering row) computes
``‖K'v_i − λ_i v_i‖/λ_i`` for the returned pairs; the largest is printed.

    python benchmarks/krylov_products.py [--samples 3500 20000] [--tol 1e-6]
                                         [--methods lobpcg block nystrom:800]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _data import load_average, patch_store
from scipy.sparse.linalg import LinearOperator, lobpcg

from dkha import config
from dkha.engine.cluster import blas_threads_for, client_for
from dkha.engine.rows import RowEngine
from dkha.fit.init import nystrom_coefficients
from dkha.fit.spectrum import krylov_solve
from dkha.kernels import make_kernel, median_distance


def numpy_residuals(X: np.ndarray, sigma: float, w: np.ndarray, V: np.ndarray,
                    rows: int = 2000) -> np.ndarray:
    """``‖K'v_i − w_i v_i‖ / w_i`` by plain NumPy over row blocks of the gaussian kernel."""
    l = len(X)
    sq = np.einsum("ij,ij->i", X, X)

    def block(a, b):
        D = sq[a:b, None] + sq[None, :] - 2.0 * X[a:b] @ X.T
        return np.exp(-np.maximum(D, 0.0) / (2.0 * sigma * sigma))
    mk = np.zeros(l)
    for a in range(0, l, rows):
        mk += block(a, min(l, a + rows)).sum(axis=0)
    mk /= l
    mkm = mk.mean()
    KV = np.empty_like(V)
    s = mk @ V
    for a in range(0, l, rows):
        b = min(l, a + rows)
        # K'[a:b] V = K[a:b] V − mk[a:b] (1ᵀV)/… : K' = K − 1mkᵀ − mk1ᵀ + mkm 11ᵀ
        KV[a:b] = block(a, b) @ V - s[None, :] - mk[a:b, None] * V.sum(0)[None, :] \
            + mkm * V.sum(0)[None, :]
    return np.linalg.norm(KV - V * w, axis=0) / w


def old_lobpcg(engine, r: int, tol_abs: float, seed: int = 0, maxiter: int = 500):
    """dkha's Krylov solver before: LOBPCG with one subspace step as the start."""
    l = engine.n_samples
    k = min(l - 1, r + max(5, r // 2))
    X = np.linalg.qr(np.random.default_rng(seed).standard_normal((l, k)))[0]
    count = [0]

    def matmat(V):
        count[0] += 1
        return engine.matmat(V)
    X = np.linalg.qr(matmat(X))[0]
    op = LinearOperator((l, l), matvec=lambda v: matmat(v.reshape(-1, 1)).ravel(),
                        matmat=matmat, dtype=np.float64)
    w, V = lobpcg(op, X, largest=True, tol=tol_abs, maxiter=maxiter, verbosityLevel=0)
    order = np.argsort(w)[::-1][:r]
    return w[order], V[:, order], count[0], count[0] * k


def run_method(method: str, engine, r: int, tol: float, lam_r: float | None):
    t0 = time.perf_counter()
    extra = ""
    if method == "lobpcg":
        w, V, products, columns = old_lobpcg(engine, r, tol * lam_r)
    elif method.startswith("block"):
        b = method.partition(":")[2]
        w, V, info = krylov_solve(engine, r, tol=tol, oversample=int(b) - r if b else None)
        products, columns = info.products, info.columns
    elif method.startswith("nystrom:"):
        m = int(method.partition(":")[2])
        A, _ = nystrom_coefficients(engine, r, m, seed=0)
        extra = f" (+ {m} landmark rows: {time.perf_counter() - t0:.1f} s)"
        X0 = (A / np.linalg.norm(A, axis=1, keepdims=True)).T
        w, V, info = krylov_solve(engine, r, tol=tol, X0=X0)
        products, columns = info.products, info.columns
    elif method == "float32":
        engine.kernel = engine.kernel.computed_with(precision="float32")
        try:
            w, V, info = krylov_solve(engine, r, tol=tol)
        finally:
            engine.kernel = engine.exact_kernel
        w, V, info64 = krylov_solve(engine, r, tol=tol, X0=V)
        extra = f" ({info.products} float32 + {info64.products} float64)"
        products, columns = info.products + info64.products, info.columns + info64.columns
    else:
        raise SystemExit(f"unknown method {method!r}")
    return w, V, products, columns, time.perf_counter() - t0, extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[3500, 20000])
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--methods", nargs="+", default=["lobpcg", "block", "nystrom:800"])
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    r = args.components
    print(f"load {load_average()}; residual target ‖K'v − λv‖/λ ≤ {args.tol:g} per component, "
          f"r = {r}")
    for l in args.samples:
        store = patch_store(os.path.join(args.workdir, f"patches-{l}.zarr"), l)
        X = store.read()
        sample = X[np.random.default_rng(0).choice(l, size=min(l, 1000), replace=False)]
        sigma = median_distance(sample)
        print(f"\nl = {l}, n = {X.shape[1]}, sigma = {sigma:.4g} (median)")
        print(f"{'method':14s} {'products':>8s} {'columns':>8s} {'seconds':>8s} "
              f"{'residual (NumPy)':>16s}  eigenvalue error")
        settings = config.settings(mk_cache=False)
        with client_for(settings=settings) as client, blas_threads_for(client, settings):
            engine = RowEngine(store, make_kernel("gaussian", sigma=sigma), client, settings)
            engine.compute_mk()
            lam_r, ref = None, None
            methods = sorted(args.methods, key=lambda m: m == "lobpcg")   # lobpcg needs λ_r
            for method in methods:
                w, V, products, columns, secs, extra = run_method(method, engine, r, args.tol,
                                                                   lam_r)
                res = numpy_residuals(X, sigma, w, V)
                lam_r = lam_r or float(w[r - 1])
                ref = w if ref is None else ref
                print(f"{method:14s} {products:8d} {columns:8d} {secs:8.1f} {res.max():16.2e}  "
                      f"{np.max(np.abs(w - ref) / ref):.1e}{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
