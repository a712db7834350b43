"""Time and peak memory of scikit-learn's learned pre-image (``fit_inverse_transform=True``) above
``dkha.dense-eigh-limit``: the kernel ridge system ``(k(P, P) + alpha I) C = X`` solved by
conjugate gradients on blockwise products ``k(P, P) V`` (:func:`dkha.fit.ridge.learned_preimage`),
against what the ``l × l`` solve scikit-learn makes would hold (``l² · 8`` bytes for ``k(P, P)``).

The projections ``P`` are a krylov fit's (``r`` components, rbf kernel with scikit-learn's
default ``gamma = 1/n_features``) of ``l`` 11×11 patches of scikit-image's photographs. The
workers share this process (threads), so ``tracemalloc``'s peak covers the products too.

    python benchmarks/learned_preimage.py [--samples 20000] [--components 20] [--alpha 1.0]
        [--fit-samples M]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from _data import load_average, patches, peak_rss_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fit-samples", type=int, default=None,
                    help="fit the components on the first this many samples and project all "
                         "(P: their projections; default: fit on all, P the training projections)")
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    from dkha import KernelHebbianPCA, config
    from dkha.fit.ridge import learned_preimage

    X = patches(args.samples)
    l, n = X.shape
    print(f"l = {l}, n = {n} features, r = {args.components}, alpha = {args.alpha}; "
          f"load {load_average()}")
    with LocalCluster(n_workers=1, threads_per_worker=args.threads, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        t0 = time.perf_counter()
        m = l if args.fit_samples is None else min(l, args.fit_samples)
        model = KernelHebbianPCA(args.components, algorithm="krylov", kernel="rbf",
                                 gamma=1.0 / n, client=client).fit(X[:m])
        P = model.projection_.values if m == l else model.transform(X)
        print(f"krylov fit on {m} samples and the projections P: "
              f"{time.perf_counter() - t0:.1f} s")
        tracemalloc.start()
        ridge = learned_preimage(P, X, model.kernel_, args.alpha, client, config.settings(),
                                 dense_limit=0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    dense = l * l * 8
    print(f"blockwise CG: {ridge.seconds:.1f} s, {ridge.iterations} products k(P, P) V "
          f"({n} columns), relative residual {ridge.residual:.1e}")
    print(f"peak traced memory of the solve: {peak / 2**20:.1f} MiB (inputs P, X: "
          f"{(P.nbytes + X.nbytes) / 2**20:.1f} MiB); process peak RSS {peak_rss_mb():.0f} MiB")
    print(f"an l × l solve needs k(P, P) alone: {dense} bytes ({dense / 2**30:.2f} GiB), "
          f"{dense / peak:.0f}× this solve's peak")


if __name__ == "__main__":
    main()
