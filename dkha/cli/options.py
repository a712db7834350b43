"""Command-line options shared by the ``dkha`` subcommands: argument types, where it runs, and
the one-line summaries of a run's centering (the value of the where-it-runs options:
:func:`dkha.cli.where.cluster_kwargs`). The fit options are generated from the parameter
table (:mod:`dkha.estimators.params`).

The parser is built before dask, xarray and scikit-learn load (``dkha --help`` and argument
errors answer at once): what needs them is imported where an option's value is used."""

from __future__ import annotations

import argparse

from dkha.data.storage import parse_storage_option
from dkha.errors import DkhaError


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


def name_values(s: str) -> dict:
    """``length_scale=2,nu=1.5`` → ``{"length_scale": 2.0, "nu": 1.5}`` (a value that is not a
    number stays a string)."""
    out = {}
    for item in s.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE[,NAME=VALUE...], got {s!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            out[name.strip()] = value.strip()
    return out


def storage_option(s: str) -> tuple[str, object]:
    try:
        return parse_storage_option(s)
    except DkhaError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_storage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", type=storage_option, action="append", metavar="KEY=VALUE",
                   help="a setting of the object store of s3://… (gs://, az://…) stores, passed to "
                        "fsspec (e.g. endpoint_url=http://host:9000, anon=true); repeatable; the "
                        "environment's AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID … apply too")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    add_storage_options(p)
    g = p.add_argument_group("where it runs (default: an in-process local Dask cluster)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="attach to a running Dask scheduler (tcp://HOST:PORT); "
                        "DASK_SCHEDULER_ADDRESS is used when set")
    g.add_argument("--scheduler-file", metavar="F", help="attach via a scheduler file")
    g.add_argument("--workers", type=positive_int, metavar="N",
                   help="start a local cluster of N worker processes")
    g.add_argument("--dashboard", metavar="ADDRESS", default="127.0.0.1:8787",
                   help="where the Dask dashboard of a cluster dkha starts listens, said in "
                        "the log (default 127.0.0.1:8787, another port where it is taken; "
                        ":8787 for every interface; none: no dashboard)")
    g.add_argument("--performance-report", metavar="FILE.html",
                   help="write Dask's performance report of the command's work on the cluster "
                        "(dask.distributed.performance_report; needs bokeh)")


def centering_summary(attrs) -> dict:
    """How a run was centered, for summaries: exact, or from a sample of N columns."""
    n = attrs.get("center_sample")
    return {"centering": "exact" if n is None else "sample", "center_sample": n}


def centering_line(attrs, n_samples: int) -> str | None:
    n = attrs.get("center_sample")
    if n is None:
        return None
    return (f"centering: approximate, the MK row estimated from a sample of {n} of the "
            f"{n_samples} columns (--center-sample); E and E_min use that centering")
