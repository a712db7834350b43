"""The ``dkha`` command.

    dkha demo [-o DIR]
    dkha ingest array SRC.npy -o STORE.zarr [--labels L.npy] [--chunk-rows N]
    dkha ingest images IMG... -o STORE.zarr --patch 11 --step 2
    dkha fit STORE.zarr -o RUN_DIR --algorithm kha-smd --components R ...
    dkha fit STORE.zarr -o RUN_DIR --algorithm kha-t,kha-et,kha-smd --eta0 0.5,0.2,0.2
    dkha tune STORE.zarr -o TUNE_DIR --algorithm kha-smd --passes 3
    dkha evaluate RUN_DIR [--variance] [--json]
    dkha transform RUN_DIR NEW.zarr -o OUT.zarr
    dkha report RUN_DIR

Errors a user can cause print one line (``dkha: error: ...``) and exit non-zero: 2 for bad
input or parameters, 3 for a diverged fit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from dkha.errors import DkhaError

ONLINE = ("on-kha", "oo-kha", "okpca")


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _float_list(s: str) -> list[float]:
    """``0.1,0.2,0.5`` → ``[0.1, 0.2, 0.5]`` (one value or one per model)."""
    try:
        return [float(v) for v in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or a comma-separated list of "
                                         f"numbers, got {s!r}") from None


def _add_kernel_options(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("kernel")
    k.add_argument("--kernel", default="gaussian", help="gaussian, laplacian, polynomial, sigmoid")
    k.add_argument("--sigma", type=float, help="gaussian/laplacian width (default: median distance)")
    k.add_argument("--degree", type=int, help="polynomial degree (default 1: dot product)")
    k.add_argument("--offset", type=float, help="polynomial / sigmoid offset")
    k.add_argument("--kernel-gamma", type=float, help="sigmoid slope")


def _add_stream_options(p: argparse.ArgumentParser, projections: bool) -> None:
    """How the kernel rows are streamed: blocks, prefetch, (projections), row cache, centering."""
    p.add_argument("--block", type=_positive_int, metavar="B", help="rows per block (dkha.block-rows)")
    p.add_argument("--prefetch", type=_positive_int, metavar="D", help="blocks computed ahead")
    if projections:
        p.add_argument("--projections", choices=("coordinator", "workers"),
                       help="where block projections are computed (dkha.projections): from kernel "
                            "rows shipped to the coordinator, or on the workers from replicas")
    p.add_argument("--cache-rows", action="store_true", default=None,
                   help="keep the kernel's upper-triangle tiles in worker memory (about 4·l² "
                        "bytes): kernels computed once, not once a pass (dkha.row-cache)")
    p.add_argument("--center-sample", type=_positive_int, metavar="N",
                   help="estimate the centering (MK) row from a seeded sample of N columns "
                        "instead of the exact O(l²n) pass: approximate, recorded in the run")


def _add_cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where it runs (default: an in-process local Dask cluster)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="attach to a running Dask scheduler (tcp://HOST:PORT); "
                        "DASK_SCHEDULER_ADDRESS is used when set")
    g.add_argument("--scheduler-file", metavar="F", help="attach via a scheduler file")
    g.add_argument("--workers", type=_positive_int, metavar="N",
                   help="start a local cluster of N worker processes")


def build_parser() -> argparse.ArgumentParser:
    from dkha import __version__
    from dkha.solvers.batch import ALGORITHMS

    parser = argparse.ArgumentParser(prog="dkha", description="Kernel PCA by the Kernel Hebbian "
                                     "Algorithm family, for data sets too large for a kernel matrix.")
    parser.add_argument("--version", action="version", version=f"dkha {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    sub = parser.add_subparsers(dest="command", required=True)

    # demo
    p = sub.add_parser("demo", help="ingest scikit-learn's digits and fit KHA-SMD (no cluster needed)")
    p.add_argument("-o", "--out", default="dkha-demo", help="directory for the store and run (default dkha-demo)")
    p.add_argument("--passes", type=_positive_int, default=20)
    p.add_argument("--algorithm", default="kha-smd", choices=ALGORITHMS)
    _add_cluster_options(p)

    # ingest
    p = sub.add_parser("ingest", help="create a data store")
    isub = p.add_subparsers(dest="kind", required=True)
    a = isub.add_parser("array", help="from a .npy array (samples × features)")
    a.add_argument("src")
    a.add_argument("-o", "--out", required=True)
    a.add_argument("--labels", help=".npy of one label per sample")
    a.add_argument("--chunk-rows", type=_positive_int)
    a.add_argument("--overwrite", action="store_true")
    im = isub.add_parser("images", help="grey-scale patches of images (skimage:NAME for bundled ones)")
    im.add_argument("images", nargs="+")
    im.add_argument("-o", "--out", required=True)
    im.add_argument("--patch", type=_positive_int, default=11)
    im.add_argument("--step", type=_positive_int, default=2)
    im.add_argument("--max-samples", type=_positive_int, metavar="N",
                    help="stop after N patches (the remaining images are not read)")
    im.add_argument("--chunk-rows", type=_positive_int)
    im.add_argument("--overwrite", action="store_true")

    # fit
    p = sub.add_parser("fit", help="fit kernel principal components")
    p.add_argument("store")
    p.add_argument("-o", "--out", required=True, metavar="RUN_DIR")
    p.add_argument("--algorithm", default="kha-smd",
                   help=f"one of {', '.join(ALGORITHMS + ('krylov',) + ONLINE)}; a comma-separated "
                        "list of batch algorithms (with --eta0/--mu lists) fits several models in "
                        "one pass over the kernel rows, each in RUN_DIR/<algorithm>[-eta0=V][-mu=V]")
    p.add_argument("--components", "-r", type=_positive_int, default=8)
    _add_kernel_options(p)
    g = p.add_argument_group("gains (a list gives one value per model; one value serves all)")
    g.add_argument("--eta0", type=_float_list, metavar="ETA0[,ETA0...]",
                   help="base gain (default per algorithm)")
    g.add_argument("--mu", type=_float_list, metavar="MU[,MU...]", help="SMD meta-gain (default 0.2)")
    g.add_argument("--xi", type=float, help="SMD decay (default 0.99)")
    g.add_argument("--rho0", type=float, default=0.0,
                   help="SMD initial log-gain (default 0; the paper's 1 multiplies gains by e)")
    o = p.add_argument_group("online algorithms (on-kha, oo-kha, okpca)")
    o.add_argument("--gamma", type=float, help="learning-rate decay η(k) = γ·η(k−1)")
    o.add_argument("--tau", type=float, help="Honeine's η_t = η0 / (1 + t/τ)")
    o.add_argument("--nu", type=float, help="dictionary threshold ν")
    o.add_argument("--max-members", type=_positive_int, help="dictionary size cap")
    o.add_argument("--center", dest="center", action="store_true", default=None)
    o.add_argument("--no-center", dest="center", action="store_false")
    n = p.add_mutually_exclusive_group()
    n.add_argument("--passes", type=_positive_int, help="passes through the data (default 10)")
    n.add_argument("--steps", type=_positive_int, help="single-sample steps")
    p.add_argument("--init", default="random", metavar="random|random:M|nystrom:M",
                   help="initial coefficients: random (the paper's), the same on M random "
                        "columns (KHA/et, SMD start from M kernel rows instead of a pass: for "
                        "large data), or the Nyström solution from M landmark rows")
    p.add_argument("--tol", type=float,
                   help="stop once the excess error E/E_min − 1 is at most TOL (krylov: "
                        "relative residual tolerance)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--evaluate-every", type=int, default=1, metavar="N",
                   help="evaluate every N passes (0: only at the end; -1: never)")
    _add_stream_options(p, projections=True)
    p.add_argument("--overwrite", action="store_true", help="replace a different run in RUN_DIR")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                   help="write the complete state to RUN_DIR/checkpoints every N passes "
                        "(SIGTERM also checkpoints, then exits with code 75)")
    c.add_argument("--checkpoint-steps", type=_positive_int, metavar="N",
                   help="write the complete state at the first block boundary after every N "
                        "steps")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR's run from its newest valid checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_cluster_options(p)

    # tune
    p = sub.add_parser("tune", help="try the {1,2,5}×10^b grid of eta0 (and mu) in one kernel "
                                    "stream; keep the best run of each algorithm")
    p.add_argument("store")
    p.add_argument("-o", "--out", required=True, metavar="TUNE_DIR",
                   help="gets tune.json (every setting's excess error) and TUNE_DIR/<algorithm>, "
                        "the best run (resumable: continue it with dkha fit ... --resume)")
    p.add_argument("--algorithm", default="kha-smd",
                   help="batch algorithm(s) to tune, comma-separated (default kha-smd)")
    p.add_argument("--eta0", type=_float_list, metavar="ETA0[,ETA0...]",
                   help="values to try (default 0.01,0.02,0.05,…,5: {1,2,5}×10^b, b = −2…0)")
    p.add_argument("--mu", type=_float_list, metavar="MU[,MU...]",
                   help="kha-smd: meta-gains to try with every eta0 (default 0.01,…,0.5,1)")
    p.add_argument("--passes", type=_positive_int, default=3,
                   help="passes of every setting, judged by the excess error after them (default 3)")
    p.add_argument("--components", "-r", type=_positive_int, default=8)
    _add_kernel_options(p)
    p.add_argument("--xi", type=float, help="SMD decay (default 0.99)")
    p.add_argument("--rho0", type=float, default=0.0, help="SMD initial log-gain (default 0)")
    p.add_argument("--init", default="random", metavar="random|nystrom:M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--evaluate-every", type=int, default=0, metavar="N",
                   help="also evaluate every N passes (default 0: only at the end)")
    _add_stream_options(p, projections=False)
    p.add_argument("--overwrite", action="store_true", help="tune into a TUNE_DIR that is not empty")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_cluster_options(p)

    # run (pipelines)
    p = sub.add_parser("run", help="run a pipeline file (TOML): ingest → fit → evaluate → apply → report")
    p.add_argument("pipeline")
    p.add_argument("--run-id", help="name of the run directory (default: the pipeline's name)")
    p.add_argument("--runs-dir", default="runs", help="where run directories go (default ./runs)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_cluster_options(p)

    # applications: denoise, cluster
    from dkha.apply.cli import add_parsers as add_apply_parsers

    add_apply_parsers(sub)

    # evaluate
    p = sub.add_parser("evaluate", help="reconstruction error E(A), E_min and the excess (eq. 22); "
                       "online runs: the AC index; --variance: explained variance (eq. 23)")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    p.add_argument("--recompute", action="store_true",
                   help="recompute the top eigenvalues of K' instead of reusing the fit's")
    p.add_argument("--variance", action="store_true",
                   help="also Honeine's explained variance per component (eq. 23), blockwise "
                        "over the training store")
    p.add_argument("--variance-samples", type=_positive_int, metavar="N",
                   help="estimate the variance on a seeded sample of N rows (huge stores)")
    p.add_argument("--cache-rows", action="store_true", default=None,
                   help="keep the kernel's tiles in worker memory while evaluating (pays when "
                        "the eigenvalues are recomputed: every Krylov iteration is a pass)")
    _add_cluster_options(p)

    # transform
    p = sub.add_parser("transform", help="project a data store on the components")
    p.add_argument("run_dir")
    p.add_argument("new_store")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    _add_cluster_options(p)

    # report
    p = sub.add_parser("report", help="an HTML page of a run: convergence, component pictures, "
                                      "response maps")
    p.add_argument("run_dir")
    p.add_argument("--components", type=_positive_int, default=8,
                   help="components to show (default 8)")
    return parser


def _cluster_kwargs(args) -> dict:
    return {"scheduler": args.scheduler, "scheduler_file": args.scheduler_file,
            "workers": args.workers}


def cmd_ingest(args) -> int:
    from dkha.store import ingest_array, ingest_images

    if args.kind == "array":
        st = ingest_array(args.src, args.out, labels=args.labels, chunk_rows=args.chunk_rows,
                          overwrite=args.overwrite)
    else:
        st = ingest_images(args.images, args.out, patch=args.patch, step=args.step,
                           chunk_rows=args.chunk_rows, max_samples=args.max_samples,
                           overwrite=args.overwrite)
    print(f"{st.path}: {st.n_samples} samples × {st.n_features} features "
          f"in chunks of {st.chunk_rows} rows")
    return 0


def _fit_summary(model, run_dir: str) -> dict:
    last = model.history_[-1] if model.history_ else {}
    return {"run_dir": run_dir, "algorithm": model.attrs_["algorithm"],
            "n_samples": model.n_samples_, "n_components": int(model.alpha_.shape[0]),
            "kernel": model.kernel_.describe(), **{k: last.get(k) for k in
                                                   ("pass", "step", "error", "error_min", "excess")},
            "fit_seconds": last.get("wall_time"), **_centering(model.attrs_)}


def _centering(attrs) -> dict:
    """How a run was centered, for summaries: exact, or from a sample of N columns."""
    n = attrs.get("center_sample")
    return {"centering": "exact" if n is None else "sample", "center_sample": n}


def _centering_line(attrs, n_samples: int) -> str | None:
    n = attrs.get("center_sample")
    if n is None:
        return None
    return (f"centering: approximate, the MK row estimated from a sample of {n} of the "
            f"{n_samples} columns (--center-sample); E and E_min use that centering")


def _model_settings(args) -> list[dict]:
    """``(algorithm, eta0, mu)`` of each model from ``--algorithm``/``--eta0``/``--mu`` lists
    (a single value serves every model)."""
    lists = {"algorithm": [a.strip() for a in args.algorithm.split(",")],
             "eta0": args.eta0 or [None], "mu": args.mu or [None]}
    k = max(len(v) for v in lists.values())
    for name, v in lists.items():
        if len(v) not in (1, k):
            raise_param(f"--{name} gives {len(v)} values for {k} models; give one value or one "
                        "per model")
    return [{name: v[i] if len(v) > 1 else v[0] for name, v in lists.items()} for i in range(k)]


def _batch_model(args, algorithm: str, eta0, mu, **overrides):
    """The :class:`KernelHebbianPCA` that ``dkha fit``'s (or ``dkha tune``'s) options describe."""
    from dkha.estimator import KernelHebbianPCA

    kwargs = {
        "algorithm": algorithm, "kernel": args.kernel, "sigma": args.sigma,
        "degree": args.degree, "offset": args.offset, "gamma": args.kernel_gamma, "eta0": eta0,
        "mu": mu, "xi": args.xi, "rho0": args.rho0, "passes": args.passes,
        "steps": getattr(args, "steps", None), "seed": args.seed,
        "evaluate_every": args.evaluate_every, "block_rows": args.block,
        "prefetch": args.prefetch, "init": args.init, "tol": getattr(args, "tol", None),
        "projections": getattr(args, "projections", None), "cache_rows": args.cache_rows,
        "center_sample": args.center_sample,
        "verbose": not args.quiet and sys.stderr.isatty() or args.verbose > 0,
        **_cluster_kwargs(args)}
    kwargs.update(overrides)
    return KernelHebbianPCA(args.components, **kwargs)


def _check_no_online_options(args, algorithm: str) -> None:
    for name in ("gamma", "tau", "nu", "max_members", "center"):
        if getattr(args, name) is not None:
            raise_param(f"--{name.replace('_', '-')} applies to the online algorithms "
                        f"({', '.join(ONLINE)}), not {algorithm}")


def cmd_fit(args) -> int:
    settings = _model_settings(args)
    if len(settings) > 1:
        return _fit_many(args, settings)
    args.algorithm, args.eta0, args.mu = (settings[0][k] for k in ("algorithm", "eta0", "mu"))
    if args.algorithm in ONLINE:
        return _fit_online(args)
    model = _batch_model(args, args.algorithm, args.eta0, args.mu)
    _check_no_online_options(args, args.algorithm)
    model.fit(args.store, run_dir=args.out, overwrite=args.overwrite,
              checkpoint_every=args.checkpoint_every or 0, resume=args.resume,
              checkpoint_steps=args.checkpoint_steps or 0)
    summary = _fit_summary(model, args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['algorithm']}: {summary['n_components']} components of "
              f"{summary['n_samples']} samples, {summary['kernel']}")
        line = _centering_line(model.attrs_, model.n_samples_)
        if line:
            print(line)
        if model.history_:
            print(f"after {summary['step']} steps: E = {summary['error']:.6g}, "
                  f"E_min = {summary['error_min']:.6g}, excess = {summary['excess']:.3e}")
        print(f"saved {os.path.join(args.out, 'components.zarr')}")
    return 0


def _fit_many(args, settings: list[dict]) -> int:
    """Several batch models in one pass over the kernel rows, one run directory each."""
    from dkha.errors import NumericalError, RunDirectoryError
    from dkha.estimator import fit_together, run_names

    for s in settings:
        if s["algorithm"] in ONLINE or s["algorithm"] == "krylov":
            raise_param(f"{s['algorithm']} fits one model at a time; list only batch algorithms "
                        "(kha, kha-t, kha-et, kha-smd) to fit several together")
    _check_no_online_options(args, settings[0]["algorithm"])
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise RunDirectoryError(f"{args.out} exists and is not a directory")
    models = [_batch_model(args, s["algorithm"], s["eta0"], s["mu"]) for s in settings]
    run_dirs = [os.path.join(args.out, name) for name in run_names(models)]
    fit_together(models, args.store, run_dirs=run_dirs, overwrite=args.overwrite,
                 checkpoint_every=args.checkpoint_every or 0, resume=args.resume,
                 checkpoint_steps=args.checkpoint_steps or 0, skip_diverged=True)
    summaries = []
    for m, d in zip(models, run_dirs):
        if m.failure_ is None:
            summaries.append(_fit_summary(m, d))
        else:
            summaries.append({"run_dir": d, "algorithm": m.algorithm, "diverged": m.failure_})
    if args.json:
        print(json.dumps(summaries))
    else:
        seconds = next((s["fit_seconds"] for s in summaries if s.get("fit_seconds")), None)
        print(f"{len(models)} models in one pass over the kernel rows"
              + (f" ({seconds:.1f} s of fitting)" if seconds else ""))
        for s in summaries:
            shown = ("diverged" if "diverged" in s else
                     f"excess {s['excess']:.3e}" if s.get("excess") is not None else "saved")
            print(f"  {s['run_dir']}: {shown}")
    failed = [s for s in summaries if "diverged" in s]
    if failed:
        raise NumericalError(f"{len(failed)} of {len(models)} models diverged ("
                             + ", ".join(os.path.basename(s["run_dir"]) for s in failed)
                             + "): lower their eta0 (or mu); the others were saved")
    return 0


def cmd_tune(args) -> int:
    from dkha.tune import tune

    algorithms = [a.strip() for a in args.algorithm.split(",")]
    proto = _batch_model(args, algorithms[0], None, None, projections="coordinator", tol=None)
    shared = {k: v for k, v in proto.__dict__.items()
              if k not in ("algorithm", "eta0", "mu", "passes", "steps")}
    summary = tune(args.store, algorithms, eta0=args.eta0, mu=args.mu, passes=args.passes,
                   tune_dir=args.out, overwrite=args.overwrite, **shared)
    if args.json:
        print(json.dumps(summary, default=float))
        return 0
    print(f"{summary['settings']} settings, {args.passes} passes each, in one pass over the "
          f"kernel rows ({summary['seconds']:.1f} s); excess error E/E_min − 1 after "
          f"{args.passes} passes:")
    print(f"  {'algorithm':10s} {'eta0':>8s} {'mu':>8s}  excess")
    for row in summary["grid"]:
        mu = "" if row["mu"] is None else f"{row['mu']:g}"
        shown = "diverged" if row["excess"] is None else f"{row['excess']:.3e}"
        print(f"  {row['algorithm']:10s} {row['eta0']:>8g} {mu:>8s}  {shown}"
              + ("  ← best" if row.get("best") else ""))
    options = {"sigma": "--sigma", "degree": "--degree", "offset": "--offset",
               "gamma": "--kernel-gamma"}
    kernel = " ".join(f"{options[k]} {v!r}" for k, v in summary["kernel_parameters"].items()
                      if k in options)
    for a, b in summary["best"].items():
        gains = f"--eta0 {b['eta0']:g}" + ("" if b["mu"] is None else f" --mu {b['mu']:g}")
        print(f"chosen {a}: {gains} (excess {b['excess']:.3e}), kept in {b['run_dir']}")
        if b["at_edge"]:
            print(f"  note: {' and '.join(b['at_edge'])} at the end of the grid; a wider range "
                  f"(--{' / --'.join(b['at_edge'])}) may do better")
        print(f"  continue: dkha fit {args.store} -o {b['run_dir']} --algorithm {a} {gains} "
              f"--components {args.components} --kernel {args.kernel} {kernel} --seed {args.seed}"
              + (f" --init {args.init}" if args.init != "random" else "")
              + (f" --xi {args.xi:g}" if args.xi is not None else "")
              + (f" --rho0 {args.rho0:g}" if args.rho0 else "")
              + (f" --block {args.block}" if args.block else "")
              + (f" --center-sample {args.center_sample}" if args.center_sample else "")
              + f" --evaluate-every {args.evaluate_every} --passes N --resume")
    for a in summary["algorithms"]:
        if a not in summary["best"]:
            print(f"{a}: every setting diverged")
    print(f"summary: {os.path.join(args.out, 'tune.json')}")
    return 0


def raise_param(msg: str):
    from dkha.errors import ParameterError

    raise ParameterError(msg)


def _fit_online(args) -> int:
    try:
        from dkha.online import OnlineKernelPCA
    except ImportError:  # pragma: no cover - until the online module lands
        raise_param(f"algorithm {args.algorithm} is not available in this build")
    from dkha.store import open_store

    n_samples = open_store(args.store).n_samples
    steps = args.steps
    if steps is None and args.passes is not None:
        steps = args.passes * n_samples
    for name in ("mu", "xi", "tol"):
        if getattr(args, name) is not None:
            raise_param(f"--{name} applies to the batch algorithms, not {args.algorithm}")
    if args.init != "random":
        raise_param(f"--init applies to the batch algorithms, not {args.algorithm}")
    if args.center_sample is not None:
        raise_param(f"--center-sample applies to the batch algorithms, not {args.algorithm} "
                    "(see --center/--no-center)")
    kwargs = dict(algorithm=args.algorithm, kernel=args.kernel, sigma=args.sigma,
                  degree=args.degree, offset=args.offset, kernel_gamma=args.kernel_gamma,
                  eta0=args.eta0, gamma=args.gamma, tau=args.tau, nu=args.nu,
                  max_members=args.max_members, center=args.center, steps=steps,
                  seed=args.seed, block_rows=args.block, prefetch=args.prefetch,
                  # --evaluate-every counts passes; the online estimator counts steps
                  evaluate_every=args.evaluate_every * n_samples if args.evaluate_every > 0 else None,
                  verbose=not args.quiet and sys.stderr.isatty())
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    model = OnlineKernelPCA(args.components, **kwargs)
    # --checkpoint-every counts passes; the online estimator counts steps
    checkpoint = (args.checkpoint_every * n_samples if args.checkpoint_every
                  else args.checkpoint_steps or 0)
    model.fit(args.store, run_dir=args.out, overwrite=args.overwrite,
              ac_reference=args.evaluate_every >= 0, checkpoint_every=checkpoint,
              resume=args.resume)
    ds = model.to_dataset()
    summary = {"run_dir": args.out, "algorithm": args.algorithm,
               "members": int(ds.sizes.get("member", 0))}
    if "ac_index" in ds and ds.sizes.get("evaluation", 0):
        summary["ac_index"] = float(ds["ac_index"].values[-1])
    print(json.dumps(summary) if args.json else
          ", ".join(f"{k} = {v}" for k, v in summary.items()))
    return 0


def cmd_evaluate(args) -> int:
    import numpy as np

    from dkha import result
    from dkha.cluster import client_for
    from dkha.evaluate import evaluate
    from dkha.transform import engine_for_run

    ds = result.load(args.run_dir)
    if args.variance_samples and not args.variance:
        raise_param("--variance-samples needs --variance")
    if "dictionary" in ds:
        return _evaluate_online(args, ds)
    eig = ds.attrs.get("top_eigenvalues")
    r = ds.sizes["component"]
    with client_for(**_cluster_kwargs(args)) as client:
        engine = engine_for_run(ds, client, cache_rows=args.cache_rows)
        ev = evaluate(engine, ds["alpha"].values,
                      None if (args.recompute or not eig or len(eig) < r) else np.asarray(eig))
        out = {"run_dir": args.run_dir, "n_samples": int(ds.sizes["sample"]),
               "n_components": int(r), **ev.as_dict(), **_variance(args, ds, client),
               **_centering(ds.attrs)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"E(A)   = {ev.error:.10g}\nE_min  = {ev.error_min:.10g}\nexcess = {ev.excess:.6e}")
        _print_variance(out)
        line = _centering_line(ds.attrs, int(ds.sizes["sample"]))
        if line:
            print(line)
    return 0


def _variance(args, ds, client) -> dict:
    """``dkha evaluate --variance``: eq. 23 per component (empty without the option)."""
    if not args.variance:
        return {}
    from dkha.evaluate import explained_variance

    return explained_variance(ds, client, samples=args.variance_samples,
                              seed=int(ds.attrs.get("seed", 0))).as_dict()


def _print_variance(out: dict) -> None:
    if "explained_variance" not in out:
        return
    total = out["total_variance"]
    where = (f"a sample of {out['variance_samples']}" if out["variance_sampled"]
             else f"all {out['variance_samples']}") + " samples"
    print(f"explained variance (eq. 23, over {where}):")
    cum = 0.0
    for j, v in enumerate(out["explained_variance"]):
        cum += v
        share = f"  {v / total:7.2%} (cumulative {cum / total:7.2%})" if total else ""
        print(f"  component {j:3d}  {v:.6g}{share}")
    print(f"  sum {out['cumulative_variance']:.6g}" +
          (f" of trace(K')/l = {total:.6g}" if total else ""))


def _evaluate_online(args, ds) -> int:
    """Online runs: the AC index against exact KPCA (a seeded subset of ≤ 2000 samples)."""
    import numpy as np

    from dkha.ac_index import ACReference
    from dkha.cluster import client_for
    from dkha.store import open_store
    from dkha.transform import kernel_of

    store = open_store(ds.attrs["store"])
    r = ds.sizes["component"]
    ref = ACReference.from_store(store, kernel_of(ds), r, seed=int(ds.attrs.get("seed", 0)))
    cos = ref.cosines(ds["alpha"].values, ds["dictionary"].values)
    out = {"run_dir": args.run_dir, "algorithm": ds.attrs["algorithm"],
           "members": int(ds.sizes["member"]), "ac_index": float(np.mean(cos)),
           "cosines": [float(c) for c in cos]}
    if args.variance:
        with client_for(**_cluster_kwargs(args)) as client:
            out.update(_variance(args, ds, client))
    if args.json:
        print(json.dumps(out))
    else:
        print(f"AC index = {out['ac_index']:.6f} over {r} components "
              f"({out['members']} dictionary members)")
        _print_variance(out)
    return 0


def cmd_transform(args) -> int:
    from dkha import result
    from dkha.transform import transform_store

    ds = result.load(args.run_dir)
    res = transform_store(ds, args.new_store, args.out, overwrite=args.overwrite, **_cluster_kwargs(args))
    print(f"{args.out}: projection {dict(res.sizes)}")
    return 0


def cmd_report(args) -> int:
    from dkha.report import report_run

    print(report_run(args.run_dir, components=args.components))
    return 0


def cmd_run(args) -> int:
    from dkha.pipeline import run_file

    code, summary = run_file(args.pipeline, run_id=args.run_id, runs_dir=args.runs_dir,
                             cluster=_cluster_kwargs(args), verbose=args.verbose > 0)
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        print(f"run {summary['run_id']} in {summary['run_dir']}: exit {code}")
        for name, figs in summary.get("figures", {}).items():
            shown = ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                              for k, v in figs.items() if v is not None)
            print(f"  {name}: {shown}")
        print(f"  report: {os.path.join(summary['run_dir'], 'report.html')}")
    return code


def cmd_demo(args) -> int:
    import numpy as np
    from sklearn.datasets import load_digits

    from dkha.estimator import KernelHebbianPCA
    from dkha.store import ingest_array

    os.makedirs(args.out, exist_ok=True)
    d = load_digits()
    X = np.concatenate([d.data[d.target == k][:100] for k in range(10)]) / 8.0 - 1.0
    y = np.concatenate([d.target[d.target == k][:100] for k in range(10)])
    store_path = os.path.join(args.out, "digits.zarr")
    store = ingest_array(X, store_path, labels=y, chunk_rows=250, overwrite=True)
    print(f"data store {store.path}: {store.n_samples} digits (8×8, pixels x/8 − 1)")
    run_dir = os.path.join(args.out, "run")
    model = KernelHebbianPCA(16, algorithm=args.algorithm, sigma=4.0, passes=args.passes,
                             evaluate_every=1, verbose=sys.stderr.isatty(), **_cluster_kwargs(args))
    model.fit(store_path, run_dir=run_dir, overwrite=True)
    print("pass   excess error E/E_min − 1")
    for h in model.history_:
        print(f"{h['pass']:4d}   {h['excess']:.3e}")
    print(f"saved {run_dir}/components.zarr (open it with xarray.open_zarr)")
    return 0


COMMANDS = {"demo": cmd_demo, "ingest": cmd_ingest, "fit": cmd_fit, "tune": cmd_tune,
            "evaluate": cmd_evaluate, "transform": cmd_transform, "run": cmd_run,
            "report": cmd_report}


def _quiet_distributed(level: int) -> None:
    """distributed logs INFO lines on every cluster start; keep them out of the CLI's output."""
    import distributed  # noqa: F401  (configures its loggers on import; then we override)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(max(level, logging.WARNING))


def _install_stop_handler() -> None:
    """SIGTERM: a running fit checkpoints at the next block and exits with code 75 (resumable).

    A second SIGTERM ends the process at once.
    """
    import signal

    from dkha.coordinator import STOP

    def handler(signum, frame):
        if STOP.is_set():
            raise SystemExit(128 + signum)
        STOP.set()
        print("dkha: stopping at the next block (checkpoint, then exit 75)", file=sys.stderr)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (embedded use)
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else (logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    for h in logging.root.handlers:  # library INFO lines go to files (pipelines), not the console
        h.setLevel(level)
    _quiet_distributed(level)
    from dkha.apply.cli import COMMANDS as APPLY_COMMANDS

    _install_stop_handler()
    try:
        return {**COMMANDS, **APPLY_COMMANDS}[args.command](args)
    except DkhaError as exc:
        print(f"dkha: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dkha: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
