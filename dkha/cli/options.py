"""Command-line options shared by the ``dkha`` subcommands: argument types, the kernel, stream and
cluster options."""

from __future__ import annotations

import argparse


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def float_list(s: str) -> list[float]:
    """``0.1,0.2,0.5`` → ``[0.1, 0.2, 0.5]`` (one value or one per model)."""
    try:
        return [float(v) for v in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or a comma-separated list of "
                                         f"numbers, got {s!r}") from None


def add_kernel_options(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("kernel")
    k.add_argument("--kernel", default="gaussian", help="gaussian, laplacian, polynomial, sigmoid")
    k.add_argument("--sigma", type=float, help="gaussian/laplacian width (default: median distance)")
    k.add_argument("--degree", type=int, help="polynomial degree (default 1: dot product)")
    k.add_argument("--offset", type=float, help="polynomial / sigmoid offset")
    k.add_argument("--kernel-gamma", type=float, help="sigmoid slope")


def add_stream_options(p: argparse.ArgumentParser, projections: bool) -> None:
    """How the kernel rows are streamed: blocks, prefetch, (projections), row cache, centering."""
    p.add_argument("--block", type=positive_int, metavar="B", help="rows per block (dkha.block-rows)")
    p.add_argument("--prefetch", type=positive_int, metavar="D", help="blocks computed ahead")
    if projections:
        p.add_argument("--projections", choices=("coordinator", "workers"),
                       help="where block projections are computed (dkha.projections): from kernel "
                            "rows shipped to the coordinator, or on the workers from replicas")
    p.add_argument("--cache-rows", action="store_true", default=None,
                   help="keep the kernel's upper-triangle tiles in worker memory (about 4·l² "
                        "bytes): kernels computed once, not once a pass (dkha.row-cache)")
    p.add_argument("--center-sample", type=positive_int, metavar="N",
                   help="estimate the centering (MK) row from a seeded sample of N columns "
                        "instead of the exact O(l²n) pass: approximate, recorded in the run")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where it runs (default: an in-process local Dask cluster)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="attach to a running Dask scheduler (tcp://HOST:PORT); "
                        "DASK_SCHEDULER_ADDRESS is used when set")
    g.add_argument("--scheduler-file", metavar="F", help="attach via a scheduler file")
    g.add_argument("--workers", type=positive_int, metavar="N",
                   help="start a local cluster of N worker processes")


def cluster_kwargs(args) -> dict:
    return {"scheduler": args.scheduler, "scheduler_file": args.scheduler_file,
            "workers": args.workers}
