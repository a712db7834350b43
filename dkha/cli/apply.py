"""The ``dkha denoise`` and ``dkha cluster`` commands.

    dkha denoise RUN_DIR NOISY.png -o CLEAN.png [--reference ORIG.png] [--preimage M] [--json]
    dkha superresolve RUN_DIR LOW.png --factor F -o HIGH.png [--reference ORIG.png] [--json]
    dkha cluster RUN_DIR --k 10 -o LABELS.zarr [--json]

:func:`add_parsers` adds both to the ``dkha`` command's subparsers; :data:`COMMANDS` maps their
names to the functions that run them (each takes the parsed arguments and returns an exit code).
"""

from __future__ import annotations

import argparse
import json

from dkha.apply.clustering import cluster_run, save_clusters
from dkha.apply.denoise import denoise_image, denoise_store, save_image, store_mse
from dkha.apply.superresolve import superresolve
from dkha.cli.options import add_cluster_options, cluster_kwargs, positive_int
from dkha.errors import ParameterError, RunDirectoryError


def add_parsers(subparsers) -> None:
    """Add the ``denoise`` and ``cluster`` subcommands to ``dkha``'s subparsers."""
    p = subparsers.add_parser(
        "denoise", help="denoise an image (run fitted on its patches) or a data store of vectors",
        description="Images: cut the image into patches on the training store's grid, project "
                    "them on the components, map them back by a pre-image (--preimage) and "
                    "average the overlapping patches. Data stores (a directory, e.g. NOISY.zarr): "
                    "project and pre-image every sample, blockwise on the cluster (one task per "
                    "chunk), and write the result as a data store.")
    p.add_argument("run_dir")
    p.add_argument("image", metavar="INPUT",
                   help="the noisy image (grey or colour; skimage:NAME for bundled ones), or a "
                        "data store (.zarr) of noisy vectors")
    p.add_argument("-o", "--out", required=True,
                   help="where to write the denoised image (8-bit by extension; .tif float, "
                        ".npy) or data store (for a store input)")
    p.add_argument("--reference", metavar="ORIG",
                   help="the clean image (SNR before and after) or clean data store (mean "
                        "squared error before and after)")
    add_preimage_options(p)
    p.add_argument("--block", type=positive_int, metavar="B", help="patches per block (2048)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)

    p = subparsers.add_parser(
        "superresolve", help="scale an image up with a run fitted on high-resolution patches "
                             "(Kim et al. §4.2)",
        description="Scale the low-resolution image up by FACTOR (pixel replication or "
                    "bilinear), cut it into overlapping windows of the training patches' size, "
                    "project them on the components, map them back by a pre-image (--preimage) "
                    "and average the overlaps.")
    p.add_argument("run_dir")
    p.add_argument("image", help="the low-resolution image (skimage:NAME for bundled ones)")
    p.add_argument("--factor", type=positive_int, required=True, metavar="F",
                   help="scale factor (integer)")
    p.add_argument("-o", "--out", required=True,
                   help="where to write the image (8-bit by extension; .tif float, .npy)")
    p.add_argument("--upscaling", choices=("replicate", "bilinear"), default="replicate",
                   help="how the image is first scaled up (default: pixel replication, the "
                        "paper's); the pre-images start from it")
    p.add_argument("--step", dest="window_step", type=positive_int, metavar="S",
                   help="window grid in pixels (default: the training store's step)")
    p.add_argument("--reference", metavar="ORIG",
                   help="the original high-resolution image: print the PSNR")
    add_preimage_options(p, gradient_step="--gradient-step")
    p.add_argument("--block", type=positive_int, metavar="B", help="windows per block (2048)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)

    p = subparsers.add_parser(
        "cluster", help="spectral clustering (Ng, Jordan & Weiss) of a run's training samples",
        description="k-means on the row-normalised projections of the training samples on the "
                    "components; with labels in the store, prints the variation of information "
                    "(nats) and that of random labels.")
    p.add_argument("run_dir")
    p.add_argument("-k", "--k", dest="k", type=positive_int, required=True,
                   help="number of clusters")
    p.add_argument("-o", "--out", required=True, help="zarr store for cluster (sample)")
    p.add_argument("--scale", choices=("eigenvectors", "projections"), default="eigenvectors",
                   help="columns as unit eigenvectors (NJW, default) or the raw projections")
    p.add_argument("--seed", type=int, default=0, help="k-means seed (and the random labels')")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)


def add_preimage_options(p: argparse.ArgumentParser, *, gradient_step: str = "--step") -> None:
    """The pre-image options every reconstruction command shares (:mod:`dkha.apply.preimage`);
    ``gradient_step`` names the gradient step option where ``--step`` means something else."""
    g = p.add_argument_group("pre-images")
    g.add_argument("--preimage", choices=("fixed-point", "conformal", "gradient"),
                   help="fixed-point (Mika et al.; the default for gaussian kernels), conformal "
                        "(Honeine's conformal-map linear solve; any kernel, the default "
                        "otherwise) or gradient (Honeine §5.3; gaussian)")
    g.add_argument("--iterations", type=positive_int, metavar="N",
                   help="fixed-point / gradient iterations per sample, at most (default 50)")
    g.add_argument("--tol", type=float,
                   help="stop a sample once its relative step is below this (1e-5)")
    g.add_argument("--eta", type=float,
                   help="conformal: the regularisation η of (P_m − η K_m⁻¹) (default 0; "
                        "η > 0 needs a dictionary run)")
    g.add_argument(gradient_step, dest="step", type=float,
                   help="gradient: a fixed step size, no line search (default: Armijo steps)")
    g.add_argument("--nonnegative", action="store_true",
                   help="gradient: steps weighted by z and iterates kept ≥ 0 (Kallas et al.)")
    g.add_argument("--orthonormalize", action="store_true",
                   help="project with the components' Gram matrix (one more pass; for batch "
                        "runs stopped far from convergence)")


def preimage_kwargs(args) -> dict:
    return {"method": args.preimage, "iterations": args.iterations, "tol": args.tol,
            "eta": args.eta, "step": args.step, "nonnegative": args.nonnegative,
            "orthonormalize": args.orthonormalize}


def cmd_denoise(args: argparse.Namespace) -> int:
    import os
    import sys


    if os.path.isdir(args.image):
        return _denoise_vectors(args)
    if os.path.lexists(args.out) and not args.overwrite:
        raise RunDirectoryError(f"{args.out} already exists; pass --overwrite to replace it")
    res = denoise_image(args.run_dir, args.image, reference=args.reference, block=args.block,
                        verbose=sys.stderr.isatty() and not args.json, **preimage_kwargs(args),
                        **cluster_kwargs(args))
    save_image(res.image, args.out)
    summary = {"out": args.out, **res.summary()}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{res.n_patches} patches of {res.patch}×{res.patch} (step {res.step}): "
              f"{res.converged} {res.method} pre-images converged within {res.iterations} "
              "iterations")
        if res.snr_noisy is not None:
            print(f"SNR noisy    {res.snr_noisy:.2f} dB\nSNR denoised {res.snr_denoised:.2f} dB "
                  f"({res.snr_denoised - res.snr_noisy:+.2f} dB)")
        print(f"saved {args.out}")
    return 0


def _denoise_vectors(args: argparse.Namespace) -> int:
    """``dkha denoise RUN NOISY.zarr -o CLEAN.zarr``: a store of plain vectors."""
    if args.block is not None:
        raise ParameterError("--block applies to images; a store is processed chunk by chunk")
    kw = preimage_kwargs(args)
    if kw.pop("orthonormalize"):
        raise ParameterError("--orthonormalize applies to images, not data stores")
    summary = denoise_store(args.run_dir, args.image, args.out, overwrite=args.overwrite, **kw,
                            **cluster_kwargs(args))
    if args.reference is not None:
        summary["mse_noisy"] = store_mse(args.reference, args.image)
        summary["mse_denoised"] = store_mse(args.reference, args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['n_samples']} samples × {summary['n_features']} features "
              f"({summary['chunks']} chunks): {summary['method']} pre-images")
        if args.reference is not None:
            cut = 1.0 - summary["mse_denoised"] / summary["mse_noisy"]
            print(f"MSE noisy    {summary['mse_noisy']:.6g}\nMSE denoised "
                  f"{summary['mse_denoised']:.6g} ({cut:+.1%} reduction)")
        print(f"saved {args.out}")
    return 0


def cmd_superresolve(args: argparse.Namespace) -> int:
    import os
    import sys


    if os.path.lexists(args.out) and not args.overwrite:
        raise RunDirectoryError(f"{args.out} already exists; pass --overwrite to replace it")
    kw = preimage_kwargs(args)
    kw["gradient_step"] = kw.pop("step")
    res = superresolve(args.run_dir, args.image, factor=args.factor, upscaling=args.upscaling,
                       reference=args.reference, step=args.window_step, block=args.block,
                       verbose=sys.stderr.isatty() and not args.json, **kw,
                       **cluster_kwargs(args))
    save_image(res.image, args.out)
    summary = {"out": args.out, **res.summary()}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{res.upscaled.shape[0] // res.factor}×{res.upscaled.shape[1] // res.factor} → "
              f"{res.image.shape[0]}×{res.image.shape[1]} ({res.upscaling} ×{res.factor}): "
              f"{res.n_patches} windows of {res.patch}×{res.patch} (step {res.step}), "
              f"{res.converged} {res.method} pre-images converged")
        if res.psnr is not None:
            print(f"PSNR {res.upscaling:9s} {res.psnr_upscaled:.2f} dB\n"
                  f"PSNR dkha      {res.psnr:.2f} dB ({res.psnr - res.psnr_upscaled:+.2f} dB)")
        print(f"saved {args.out}")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    import os

    import numpy as np


    res = cluster_run(args.run_dir, args.k, scale=args.scale, seed=args.seed,
                      **cluster_kwargs(args))
    save_clusters(res, args.out, overwrite=args.overwrite,
                  attrs={"run_dir": os.path.abspath(args.run_dir), "scale": args.scale,
                         "seed": args.seed})
    summary = {"out": args.out, **res.summary()}
    if args.json:
        print(json.dumps(summary))
    else:
        sizes = ", ".join(str(int(n)) for n in
                          sorted(np.bincount(res.clusters, minlength=args.k), reverse=True))
        print(f"{len(res.clusters)} samples in {args.k} clusters (sizes {sizes})")
        if res.vi is not None:
            print(f"VI (nats)         {res.vi:.4f}\nVI random labels  {res.vi_random:.4f}")
        else:
            print("the store has no labels: no VI")
        print(f"saved {args.out}")
    return 0


COMMANDS = {"denoise": cmd_denoise, "superresolve": cmd_superresolve, "cluster": cmd_cluster}
