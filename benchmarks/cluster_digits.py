"""Spectral clustering of scikit-learn's digits on kernel principal components (Schraudolph et
al. §5.3): exact kernel PCA against KHA-SMD after 10 passes.

Data: all 1797 ``load_digits`` samples, pixels x/8 − 1, gaussian kernel (σ = 4 by default, as in
the other digits runs; σ from 3 to 8 gives exact VIs of 1.13 to 1.20), r = 10 components,
k = 10 clusters. Clustering (``dkha.apply.clustering``): the projections of
the samples on the components, each component scaled to a unit eigenvector, rows normalised,
k-means (seeded, 10 restarts); quality: the variation of information (nats) against the digit
labels, and that of the clusters shuffled (random performance).

Prints VI for exact kernel PCA (dense eigh of K') and for KHA-SMD after 10 passes, and KHA-SMD's
excess reconstruction error E/E_min − 1. Target: KHA-SMD within 0.1 of exact.

    python benchmarks/cluster_digits.py
    python benchmarks/cluster_digits.py --sigma 4 5 6 8   # exact VI per sigma; the run at the last
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _data  # noqa: F401 - first: this checkout's dkha on the path
import numpy as np
from sklearn.datasets import load_digits

from dkha import KernelHebbianPCA, config
from dkha.apply.clustering import cluster_run, score, spectral_clustering
from dkha.data.ingest import ingest_array
from dkha.engine.cluster import client_for
from dkha.engine.rows import RowEngine
from dkha.fit.evaluate import evaluate
from dkha.kernels import make_kernel


def exact(store, sigma, r, client):
    """Projections C = √λ u (r × l) and the top eigenvalues of the dense K'."""
    engine = RowEngine(store, make_kernel("gaussian", sigma=sigma), client, config.settings())
    w, V = np.linalg.eigh(engine.dense())
    w, V = w[::-1][:r], V[:, ::-1][:, :r]
    return (V * np.sqrt(w)).T, w, engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sigma", type=float, nargs="+", default=[4.0],
                    help="kernel widths: exact VI for each, the run with the last")
    ap.add_argument("--components", type=int, default=10)
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--eta0", type=float, default=0.2)
    ap.add_argument("--mu", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0, help="KHA-SMD's seed (k-means uses 0)")
    args = ap.parse_args(argv)

    d = load_digits()
    X, y = d.data / 8.0 - 1.0, d.target
    work = tempfile.mkdtemp(prefix="dkha-cluster-")
    store = ingest_array(X, os.path.join(work, "digits.zarr"), labels=y, chunk_rows=512)
    r, k = args.components, args.clusters
    print(f"load_digits: {store.n_samples} samples, pixels x/8 − 1; r = {r}, k = {k}", flush=True)
    with client_for(settings=config.settings()) as client:   # the in-process cluster
        for sigma in args.sigma:
            C, lam, engine = exact(store, sigma, r, client)
            s = score(spectral_clustering(C.T, k, seed=0), y)
            print(f"σ = {sigma:g}: VI exact {s['vi']:.4f} (random labels {s['vi_random']:.4f}, "
                  f"H(labels) {s['entropy_labels']:.4f})", flush=True)
        run_dir = os.path.join(work, "run")
        t0 = time.perf_counter()
        model = KernelHebbianPCA(r, algorithm="kha-smd", sigma=sigma, passes=args.passes,
                                 eta0=args.eta0, mu=args.mu, seed=args.seed, client=client,
                                 evaluate_every=-1)
        model.fit(store, run_dir=run_dir)
        t_fit = time.perf_counter() - t0
        ex = evaluate(engine, model.alpha_, lam).excess
        res = cluster_run(run_dir, k, seed=0, client=client)
        print(f"σ = {sigma:g}: VI KHA-SMD {res.vi:.4f} after {args.passes} passes "
              f"(η0 = {args.eta0:g}, μ = {args.mu:g}, {t_fit:.0f} s, excess error {ex:.2e}); "
              f"VI exact {s['vi']:.4f}; random labels {res.vi_random:.4f}")
        gap = res.vi - s["vi"]
        print(f"KHA-SMD − exact {gap:+.4f}; target (within 0.1): "
              f"{'met' if gap <= 0.1 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
