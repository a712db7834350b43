"""The ``dkha denoise`` and ``dkha cluster`` commands.

    dkha denoise RUN_DIR NOISY.png -o CLEAN.png [--reference ORIG.png] [--preimage M] [--json]
    dkha denoise NOISY.png -o CLEAN.png [--risk auto|sure|held-out] [--json]   # chooses its own
    dkha superresolve RUN_DIR LOW.png --factor F -o HIGH.png [--reference ORIG.png] [--json]
    dkha cluster RUN_DIR --k 10 -o LABELS.zarr [--json]

:func:`dkha.cli.parser.add_apply_parsers` declares their options; :data:`COMMANDS` maps their
names to the functions that run them (each takes the parsed arguments and returns an exit code).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from dkha.apply.choose import fit_denoise
from dkha.apply.clustering import cluster_run, save_clusters
from dkha.apply.denoise import denoise_image, denoise_store, save_image, store_mse
from dkha.apply.superresolve import superresolve
from dkha.cli.where import cluster_kwargs
from dkha.data import result
from dkha.data.atomic import write_json_atomically
from dkha.errors import ParameterError, RunDirectoryError


def preimage_kwargs(args) -> dict:
    return {"method": args.preimage, "iterations": args.iterations, "tol": args.tol,
            "eta": args.eta, "step": args.step, "nonnegative": args.nonnegative,
            "orthonormalize": args.orthonormalize}


def cmd_denoise(args: argparse.Namespace) -> int:
    choosing = args.run_dir is None
    if not choosing and os.path.isdir(args.image):
        return _denoise_vectors(args)
    asked = [f"--{k.replace('_', '-')}" for k in CHOICE_OPTIONS if getattr(args, k) is not None]
    if os.path.lexists(args.out) and not args.overwrite:
        raise RunDirectoryError(f"{args.out} already exists; pass --overwrite to replace it")
    if choosing:
        res = _fit_denoise(args)
    elif asked:
        raise ParameterError(f"{', '.join(asked)}: only for `dkha denoise IMAGE` without a "
                             "run (the parameters chosen from the noisy image)")
    else:
        res = denoise_image(args.run_dir, args.image, reference=args.reference,
                            block=args.block, verbose=True, **preimage_kwargs(args),
                            **cluster_kwargs(args))
    save_image(res.image, args.out)
    summary = {"out": args.out, **res.summary()}
    if choosing:
        summary["choice_file"] = args.out + ".choice.json"
        write_json_atomically(summary, summary["choice_file"])
    if args.json:
        print(result.dumps(summary))
    elif choosing:
        _print_choice(res, args.out, summary["choice_file"])
    else:
        print(f"{res.n_patches} patches of {res.patch}×{res.patch} (step {res.step}): "
              f"{res.converged} {res.method} pre-images converged within {res.iterations} "
              "iterations")
        _print_figures(res)
        print(f"saved {args.out}")
    return 0


#: the options of ``dkha denoise IMAGE`` without a run: ``fit_denoise``'s keywords (``patch_step``
#: its ``step``)
CHOICE_OPTIONS = ("risk", "model", "widths", "ranks", "patch", "patch_step", "samples", "seed")


def _fit_denoise(args: argparse.Namespace):
    """``dkha denoise IMAGE``: :func:`dkha.apply.choose.fit_denoise`; the options of a given
    run (pre-images, blocks, cluster) are refused."""
    if os.path.isdir(args.image):
        raise ParameterError(f"{args.image} is a data store: denoising vectors needs a run "
                             "(dkha denoise RUN_DIR NOISY.zarr -o OUT.zarr)")
    given = [{"method": "preimage"}.get(k, k) for k, v in preimage_kwargs(args).items()
             if v not in (None, False)]
    given += [k for k in ("block", "scheduler", "scheduler_file", "workers")
              if getattr(args, k, None) is not None]
    given = [k.replace("_", "-") for k in given]
    if given:
        raise ParameterError(f"--{', --'.join(given)}: only with a run; without RUN_DIR the "
                             "pre-image is chosen from the noisy image and the work runs in "
                             "this process")
    kw = {k: getattr(args, k) for k in CHOICE_OPTIONS if getattr(args, k) is not None}
    if "patch_step" in kw:
        kw["step"] = kw.pop("patch_step")
    return fit_denoise(args.image, reference=args.reference, **kw)


def _print_choice(res, out: str, choice_file: str) -> None:
    c = res.choice
    space = ", of the Anscombe-transformed image" if c.rule == "anscombe" else ""
    print(f"noise σ̂ {c.noise['noise_sigma']:.4f} (finest diagonal Haar MAD{space}); rule "
          f"{c.rule}: {c.noise['rule_reason']}")
    if c.estimate is not None:
        e = c.estimate
        implied = "SURE at σ̂, which ranks the candidates"
        delivered = (f"expected result: {e.text()}: the MSE {e.mse:.3g} at noise level "
                     f"{e.sigma:.4f} with the clip to [0, 1] modelled; the range from the noise "
                     f"level {e.sigma_range[0]:.4f} (fine texture read as noise) to "
                     f"{e.sigma_range[1]:.4f}")
    else:
        implied = ("in the Anscombe-transformed image" if c.space != "image" else
                   "held-out loss less σ̂², which ranks the candidates")
        delivered = ("no PSNR estimate for the held-out rule: its loss less σ̂² is the MSE only "
                     "where σ̂ is the noise's standard deviation, which the gaussian Haar MAD is "
                     "not under impulses or speckle"
                     if c.rule == "held-out" else None)
    print(f"chosen: {c.chosen.label()}; estimated MSE {c.risk:.3g} ({implied}), "
          f"best of {len(c.table)} candidates in {c.seconds:.1f} s")
    if delivered:
        print(delivered)
    _print_figures(res)
    print(f"saved {out} and the choice in {choice_file}")


def _print_figures(res) -> None:
    if res.snr_noisy is not None:
        print(f"noisy:    SNR {res.snr_noisy:.2f} dB, PSNR {res.psnr_noisy:.2f} dB\n"
              f"denoised: SNR {res.snr_denoised:.2f} dB, PSNR {res.psnr_denoised:.2f} dB "
              f"({res.snr_denoised - res.snr_noisy:+.2f} dB; PSNR with the data range "
              f"{res.data_range:g} as its peak)")


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
        print(result.dumps(summary))
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
    if os.path.lexists(args.out) and not args.overwrite:
        raise RunDirectoryError(f"{args.out} already exists; pass --overwrite to replace it")
    kw = preimage_kwargs(args)
    kw["gradient_step"] = kw.pop("step")
    res = superresolve(args.run_dir, args.image, factor=args.factor, upscaling=args.upscaling,
                       reference=args.reference, step=args.window_step, block=args.block,
                       verbose=True, **kw,
                       **cluster_kwargs(args))
    save_image(res.image, args.out)
    summary = {"out": args.out, **res.summary()}
    if args.json:
        print(result.dumps(summary))
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
    res = cluster_run(args.run_dir, args.k, scale=args.scale, seed=args.seed, verbose=True,
                      **cluster_kwargs(args))
    save_clusters(res, args.out, overwrite=args.overwrite,
                  attrs={"run_dir": os.path.abspath(args.run_dir), "scale": args.scale,
                         "seed": args.seed})
    summary = {"out": args.out, **res.summary()}
    if args.json:
        print(result.dumps(summary))
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
