"""Denoising photographs: dkha beside linear patch PCA and BM3D, on a panel of photographs, noise
types and two settings.

Photographs: scikit-image's bundled ones (default astronaut, camera, coins), grey, resized to
256×256 and cropped to their centre 128×128, in [0, 1]. Noise (seeded, clipped to [0, 1] as a
saved image would be): gaussian σ = 0.05 and 0.1, salt-and-pepper (5 % of the pixels), speckle
(multiplicative, variance 0.04).

Settings:

* ``own`` — fitted on the noisy image's own patches (8×8 on a 2-pixel grid, a seeded sample of
  ``--samples`` of them: `dkha ingest images --max-samples`);
* ``other`` — fitted on clean patches of the other photographs of the panel (the same number,
  drawn from both).

Each row denoises the noisy image on the training store's grid (every patch projected, mapped
back, overlaps averaged: `dkha denoise`), with:

* ``linear``: linear patch PCA on the same training patches with the same r (mean + the top r
  principal directions, the same grid and averaging);
* ``dkha``: `dkha fit` with its defaults (KHA-SMD from the Nyström start, gaussian kernel of
  σ = 3 × the median patch distance on image patches, ``dkha.patch-sigma-factor``) and
  `dkha denoise` with its defaults (fixed-point pre-images);
* ``conformal``: the same fit, `dkha denoise --preimage conformal`;
* ``σ=median``: the fit with σ = ``--sigma-factor`` (1) × the median distance, the width dkha
  used by default before this panel, fixed-point pre-images;
* ``BM3D``: the ``bm3d`` package (``pip install 'dkha[bench]'``) given the true noise level
  (for salt-and-pepper and speckle: the standard deviation of the noise actually added), when
  it is installed.

Prints the PSNR (dB, peak 1) of each and, per dkha column, the difference to linear PCA.

    python benchmarks/denoise_photo.py                          # the panel (a few minutes)
    python benchmarks/denoise_photo.py --photos camera --noise gaussian-0.1 --settings own
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's dkha
from dkha import KernelHebbianPCA
from dkha.apply.denoise import denoise_image, reconstruct_patches
from dkha.data.ingest import ingest_images
from dkha.engine.cluster import client_for

PATCH, STEP = 8, 2
NOISES = ("gaussian-0.05", "gaussian-0.1", "salt-pepper", "speckle")


def photograph(name: str, crop: int) -> np.ndarray:
    from skimage import color, data, transform, util

    img = getattr(data, name)()
    if img.ndim == 3:
        img = color.rgb2gray(img[..., :3])
    img = transform.resize(util.img_as_float64(img), (2 * crop, 2 * crop), anti_aliasing=True)
    a = crop // 2
    return np.ascontiguousarray(img[a:a + crop, a:a + crop])


def add_noise(img: np.ndarray, kind: str, seed: int) -> np.ndarray:
    from skimage.util import random_noise

    if kind.startswith("gaussian-"):
        return random_noise(img, mode="gaussian", var=float(kind.split("-")[1]) ** 2, rng=seed)
    if kind == "salt-pepper":
        return random_noise(img, mode="s&p", amount=0.05, rng=seed)
    if kind == "speckle":
        return random_noise(img, mode="speckle", var=0.04, rng=seed)
    raise SystemExit(f"unknown noise {kind}; one of {', '.join(NOISES)}")


def psnr(clean: np.ndarray, x: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / np.mean((clean - x) ** 2)))


class _Linear:
    """Linear patch PCA's reconstruction, in the shape reconstruct_patches expects."""

    def __init__(self, X: np.ndarray, r: int):
        self.mean = X.mean(axis=0)
        self.V = np.linalg.svd(X - self.mean, full_matrices=False)[2][:r]

    def __call__(self, P):
        out = type("Reconstruction", (), {})()
        out.Z = self.mean + (P - self.mean) @ self.V.T @ self.V
        out.iterations, out.converged, out.undefined = 0, np.ones(len(P)), np.zeros(len(P))
        return out


def linear_pca(train: np.ndarray, noisy: np.ndarray, r: int) -> np.ndarray:
    return np.clip(reconstruct_patches(noisy, PATCH, STEP, _Linear(train, r))[0], 0, 1)


def bm3d_denoise(noisy: np.ndarray, sigma: float) -> np.ndarray | None:
    try:
        import bm3d
    except ImportError:
        return None
    return np.clip(bm3d.bm3d(noisy, sigma_psd=sigma), 0, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", nargs="+", default=["astronaut", "camera", "coins"])
    ap.add_argument("--noise", nargs="+", default=list(NOISES), choices=NOISES)
    ap.add_argument("--settings", nargs="+", default=["own", "other"], choices=("own", "other"))
    ap.add_argument("--crop", type=int, default=128, help="side of the centre crop (pixels)")
    ap.add_argument("--components", type=int, default=16, help="r, for dkha and linear PCA")
    ap.add_argument("--samples", type=int, default=600, help="training patches per fit")
    ap.add_argument("--sigma-factor", type=float, default=1.0,
                    help="the last dkha column's σ as a multiple of the median distance")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    r = args.components
    work = tempfile.mkdtemp(prefix="dkha-denoise-panel-")
    clean = {name: photograph(name, args.crop) for name in args.photos}
    print(f"{len(args.photos)} photographs {args.crop}×{args.crop} grey, patches {PATCH}×{PATCH} "
          f"(step {STEP}), {args.samples} training patches, r = {r}; PSNR in dB "
          f"(Δ: dkha − linear PCA)", flush=True)
    columns = ["noisy", "linear", "dkha", "Δ", "conformal", "Δ",
               f"σ={args.sigma_factor:g}×med" if args.sigma_factor != 1 else "σ=median", "Δ",
               "BM3D"]
    print(f"{'photo':10s} {'noise':14s} {'setting':7s} " + " ".join(f"{c:>10s}" for c in columns),
          flush=True)
    t_start = time.perf_counter()
    deltas = {"dkha": [], "conformal": [], "σ factor": []}
    with client_for() as client:
        def fit(store, sigma_factor, run_dir):
            model = KernelHebbianPCA(r, seed=args.seed, client=client)
            if sigma_factor is not None:
                from dkha.data.store import open_store
                from dkha.kernels import median_distance

                sample = open_store(store).sample(1000, args.seed)
                model.set_params(sigma=sigma_factor * median_distance(sample))
            model.fit(store, run_dir=run_dir, overwrite=True)
            return run_dir

        clean_runs = {}
        for i, name in enumerate(args.photos):
            for kind in args.noise:
                noisy = add_noise(clean[name], kind, args.seed + i)
                for setting in args.settings:
                    if setting == "own":
                        sources = [noisy]
                        key = f"{name}-{kind}"
                    else:
                        sources = [clean[o] for o in args.photos if o != name]
                        key = f"others-of-{name}"
                    store = os.path.join(work, f"{key}.zarr")
                    if setting == "own" or key not in clean_runs:
                        ingest_images(sources, store, patch=PATCH, step=STEP,
                                      max_samples=args.samples, seed=args.seed, overwrite=True)
                        runs = (fit(store, None, os.path.join(work, f"{key}-default")),
                                fit(store, args.sigma_factor, os.path.join(work, f"{key}-factor")))
                        if setting == "other":
                            clean_runs[key] = runs
                    else:
                        runs = clean_runs[key]
                    from dkha.data.store import open_store

                    train = open_store(store).read()
                    row = [psnr(clean[name], noisy),
                           psnr(clean[name], linear_pca(train, noisy, r))]
                    for run_dir, method in ((runs[0], None), (runs[0], "conformal"),
                                            (runs[1], None)):
                        res = denoise_image(run_dir, noisy, method=method, client=client)
                        row += [psnr(clean[name], res.image), psnr(clean[name], res.image) - row[1]]
                    for k, d in zip(deltas, row[3::2]):
                        deltas[k].append(d)
                    den = bm3d_denoise(noisy, float(np.std(noisy - clean[name])))
                    row.append(float("nan") if den is None else psnr(clean[name], den))
                    print(f"{name:10s} {kind:14s} {setting:7s} "
                          + " ".join(f"{v:+10.2f}" if c == "Δ" else f"{v:10.2f}"
                                     for c, v in zip(columns, row)), flush=True)
    for k, v in deltas.items():
        if v:
            print(f"{k:10s}: dkha − linear PCA from {min(v):+.2f} to {max(v):+.2f} dB; "
                  f"{sum(d >= 0 for d in v)} of {len(v)} rows no worse", flush=True)
    print(f"{time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
