"""Image hyperresolution ×2 by kernel PCA (Kim, Franz & Schölkopf 2003, §4.2).

Components are learned from 8×8 patches (6-pixel grid) of bundled photographs — camera, coins,
moon — resized to 256×256 grey: r = 40 components of a gaussian kernel (σ = a multiple of the
median patch distance) by dkha's krylov solver (LOBPCG on blockwise passes; KHA-SMD diverged at
the default gains on these 11 907 patches) or `--algorithm kha-smd`. The test photograph
(astronaut, not used for training: its 256×256 grey version, centre crop) is reduced 2× by
averaging 2×2 blocks, then scaled back up by

* pixel replication (the starting point of the paper's method),
* bicubic interpolation (scikit-image, order 3),
* linear PCA: the replicated image's windows projected on the top r principal components of the
  same training patches, overlaps averaged,
* dkha: `dkha.apply.superresolve.superresolve` — windows projected on the kernel components,
  fixed-point pre-images from the replicated windows, overlaps averaged (windows on a 2-pixel
  grid); and the same started from the bilinear upscaling (`--upscaling bilinear`).

Prints the PSNR (dB) of each against the original. Target: dkha above pixel replication.

    python benchmarks/superresolve.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _data  # noqa: F401 - first: this checkout's dkha on the path
import numpy as np

import dkha
from dkha import KernelHebbianPCA, config
from dkha.apply.denoise import reconstruct_patches
from dkha.apply.superresolve import downscale, psnr, superresolve, upscale
from dkha.data.ingest import ingest_images
from dkha.data.patches import read_grey_image
from dkha.engine.cluster import client_for
from dkha.kernels import median_distance

TRAIN = ("camera", "coins", "moon")
TEST = "astronaut"


def grey(name: str, size: int) -> np.ndarray:
    from skimage.transform import resize

    return resize(read_grey_image(f"skimage:{name}"), (size, size), anti_aliasing=True)


class LinearPCA:
    """Ordinary PCA of the training patches: reconstruct m + V Vᵀ (p − m)."""

    def __init__(self, X: np.ndarray, r: int):
        self.mean = X.mean(axis=0)
        self.V = np.linalg.svd(X - self.mean, full_matrices=False)[2][:r].T

    def __call__(self, P: np.ndarray):
        from dkha.apply.preimage import PreimageResult

        Z = self.mean + (P - self.mean) @ self.V @ self.V.T
        n = len(P)
        return PreimageResult(Z, np.ones(n, bool), np.zeros(n, bool), 0, np.full(n, np.nan))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256, help="photographs resized to this square")
    ap.add_argument("--crop", type=int, default=128, help="centre crop of the test photograph")
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--train-step", type=int, default=6)
    ap.add_argument("--step", type=int, default=2, help="window grid on the test image")
    ap.add_argument("--components", type=int, default=40)
    ap.add_argument("--sigma-factor", type=float, default=3.0)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--algorithm", default="krylov",
                    help="krylov (exact, LOBPCG on blockwise passes; default) or a KHA variant")
    ap.add_argument("--eta0", type=float, help="gain of the KHA variants")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir")
    args = ap.parse_args(argv)
    print(f"dkha from {os.path.dirname(dkha.__file__)}")
    work = args.workdir or tempfile.mkdtemp(prefix="dkha-sr-")
    os.makedirs(work, exist_ok=True)

    train = [grey(n, args.size) for n in TRAIN]
    store = ingest_images(train, os.path.join(work, "train.zarr"), patch=args.patch,
                          step=args.train_step, chunk_rows=1024, overwrite=True)
    full = grey(TEST, args.size)
    a = (args.size - args.crop) // 2
    orig = full[a:a + args.crop, a:a + args.crop]
    low = downscale(orig, 2)
    median = median_distance(store.sample(1000, args.seed))
    sigma = args.sigma_factor * median
    r = args.components
    print(f"training: {store.n_samples} patches {args.patch}×{args.patch} of {', '.join(TRAIN)} "
          f"({args.size}²); gaussian σ = {sigma:.4f} ({args.sigma_factor:g} × median); r = {r}")
    print(f"test: {TEST} {args.crop}×{args.crop} → {low.shape[0]}×{low.shape[1]} → ×2, windows "
          f"on a {args.step}-pixel grid")

    rep = upscale(low, 2, "replicate")
    from skimage.transform import resize

    bicubic = np.clip(resize(low, orig.shape, order=3, mode="edge", anti_aliasing=False), 0, 1)
    pca, _ = reconstruct_patches(rep, args.patch, args.step, LinearPCA(store.read(), r))
    figures = {"pixel replication": psnr(orig, rep), "bicubic": psnr(orig, bicubic),
               "linear PCA": psnr(orig, np.clip(pca, 0, 1))}

    with client_for(settings=config.settings()) as client:   # the in-process cluster
        t0 = time.perf_counter()
        run_dir = os.path.join(work, "run")
        KernelHebbianPCA(r, algorithm=args.algorithm, sigma=sigma, passes=args.passes,
                         seed=args.seed, eta0=args.eta0,
                         tol=1e-6 if args.algorithm == "krylov" else None,
                         client=client, evaluate_every=-1,
                         verbose=sys.stderr.isatty()).fit(store, run_dir=run_dir, overwrite=True)
        t_fit = time.perf_counter() - t0
        res = superresolve(run_dir, low, factor=2, reference=orig, step=args.step, client=client)
        figures["dkha"] = res.psnr
        bil = superresolve(run_dir, low, factor=2, upscaling="bilinear", reference=orig,
                           step=args.step, client=client)
        figures["bilinear"] = bil.psnr_upscaled
        figures["dkha from bilinear"] = bil.psnr
    for name, v in figures.items():
        print(f"PSNR {name:18s} {v:7.3f} dB")
    print(f"({args.algorithm} fit in {t_fit:.0f} s; superresolution {res.seconds:.0f} s, "
          f"{res.n_patches} windows, {res.converged} pre-images converged)")
    gain = figures["dkha"] - figures["pixel replication"]
    print(f"dkha − pixel replication {gain:+.3f} dB; target (dkha above pixel replication): "
          f"{'met' if gain > 0 else 'NOT met'}; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
