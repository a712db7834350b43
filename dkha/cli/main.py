"""The ``dkha`` command.

    dkha demo [-o DIR]
    dkha ingest array SRC.npy -o STORE.zarr [--labels L.npy] [--chunk-rows N]
    dkha ingest images IMG... -o STORE.zarr --patch 11 --step 2
    dkha fit STORE.zarr -o RUN_DIR --algorithm kha-smd --components R ...
    dkha fit STORE.zarr -o RUN_DIR --algorithm kha-t,kha-et,kha-smd --eta0 0.5,0.2,0.2
    dkha tune STORE.zarr -o TUNE_DIR --algorithm kha-smd --passes 3
    dkha evaluate RUN_DIR [--exact] [--variance] [--json]
    dkha transform RUN_DIR NEW.zarr -o OUT.zarr
    dkha report RUN_DIR
    dkha maps RUN_DIR IMAGE... -o MAPS.zarr

Errors a user can cause print one line (``dkha: error: ...``) and exit non-zero: 2 for bad
input or parameters, 3 for a diverged fit.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import warnings

import numpy as np

from dkha import config
from dkha.cli.apply import COMMANDS as APPLY_COMMANDS
from dkha.cli.fit import COMMANDS as FIT_COMMANDS
from dkha.cli.options import centering_line, centering_summary
from dkha.cli.output import (
    LogFormatter,
    excess_precision,
    excess_text,
    log_warning,
    pair_digits,
    progress_lines,
)
from dkha.cli.parser import build_parser
from dkha.cli.where import cluster_kwargs, performance_reported
from dkha.data import result
from dkha.data.ingest import ingest_array, ingest_images
from dkha.data.storage import set_storage_options
from dkha.data.store import open_store
from dkha.engine.cluster import client_for
from dkha.errors import DkhaError, Interrupted, ParameterError
from dkha.estimators.batch import KernelHebbianPCA
from dkha.fit.ac_index import ACReference
from dkha.fit.control import STOP
from dkha.fit.evaluate import evaluate
from dkha.fit.spectrum import cached_top_eigenvalues
from dkha.pipeline.report import report_run
from dkha.pipeline.runner import run_file
from dkha.runs.maps import response_maps, save_maps
from dkha.runs.run import Run
from dkha.runs.transform import transform_store
from dkha.runs.variance import explained_variance


def cmd_ingest(args) -> int:
    if args.kind == "array":
        st = ingest_array(args.src, args.out, labels=args.labels, chunk_rows=args.chunk_rows,
                          overwrite=args.overwrite, patch=args.patch, step=args.step)
    else:
        st = ingest_images(args.images, args.out, patch=args.patch, step=args.step,
                           chunk_rows=args.chunk_rows, max_samples=args.max_samples,
                           seed=args.seed, overwrite=args.overwrite)
    print(f"{st.path}: {st.n_samples} samples × {st.n_features} features "
          f"in chunks of {st.chunk_rows} rows")
    return 0


def cmd_evaluate(args) -> int:
    run = Run.open(args.run_dir)
    ds = run.ds
    if args.variance_samples and not args.variance:
        raise ParameterError("--variance-samples needs --variance")
    if run.is_dictionary:
        return _evaluate_online(args, ds)
    eig = ds.attrs.get("top_eigenvalues")
    r = ds.sizes["component"]
    with client_for(**cluster_kwargs(args), settings=config.settings()) as client:
        engine = run.engine(client, cache_rows=args.cache_rows)
        engine.verbose = True       # each pass's progress (--exact: the Krylov solve too)
        known = None if (args.recompute or not eig or len(eig) < r) else np.asarray(eig)
        if known is None and not (args.exact or args.recompute):
            known = cached_top_eigenvalues(engine, r)
            if known is None:
                known = np.full(r, np.nan)      # E(A) only: E_min is asked for with --exact
        ev = evaluate(engine, ds["alpha"].values, known)
        out = {"run_dir": args.run_dir, "n_samples": int(ds.sizes["sample"]),
               "n_components": int(r), **ev.as_dict(), **_variance(args, ds, client),
               **centering_summary(ds.attrs)}
    if args.json:
        if ev.error_min != ev.error_min:    # not computed: null, not NaN (invalid JSON)
            out.update(error_min=None, excess=None)
        print(result.dumps(out))
    else:
        if ev.error_min != ev.error_min:
            print(f"E(A)   = {ev.error:.10g}\nE_min  = not computed: the exact top eigenvalues of "
                  "K' are neither in the run nor cached in the data store (--exact computes them)")
        else:
            precision = excess_precision(ev.error_min, eig if eig and len(eig) >= r else None,
                                         int(ds.sizes["sample"]))
            d = pair_digits(ev.excess, precision)
            print(f"E(A)   = {ev.error:.{d}g}\nE_min  = {ev.error_min:.{d}g}\n"
                  f"excess = {excess_text(ev.excess, precision)}")
        _print_variance(out)
        line = centering_line(ds.attrs, int(ds.sizes["sample"]))
        if line:
            print(line)
    return 0


def _variance(args, ds, client) -> dict:
    """``dkha evaluate --variance``: eq. 23 per component (empty without the option)."""
    if not args.variance:
        return {}

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
    store = open_store(ds.attrs["store"])
    r = ds.sizes["component"]
    ref = ACReference.from_store(store, Run(ds).kernel, r, seed=int(ds.attrs.get("seed", 0)))
    cos = ref.cosines(ds["alpha"].values, ds["dictionary"].values)
    out = {"run_dir": args.run_dir, "algorithm": ds.attrs["algorithm"],
           "members": int(ds.sizes["member"]), "ac_index": float(np.mean(cos)),
           "cosines": [float(c) for c in cos]}
    if args.variance:
        with client_for(**cluster_kwargs(args), settings=config.settings()) as client:
            out.update(_variance(args, ds, client))
    if args.json:
        print(result.dumps(out))
    else:
        print(f"AC index = {out['ac_index']:.6f} over {r} components "
              f"({out['members']} dictionary members)")
        _print_variance(out)
    return 0


def cmd_transform(args) -> int:
    res = transform_store(args.run_dir, args.new_store, args.out, overwrite=args.overwrite,
                          **cluster_kwargs(args))
    print(f"{args.out}: projection {dict(res.sizes)}")
    return 0


def cmd_maps(args) -> int:
    maps = response_maps(args.run_dir, args.images, **cluster_kwargs(args))
    save_maps(maps, args.out, overwrite=args.overwrite)
    print(f"{args.out}: response {dict(maps.sizes)}")
    return 0


def cmd_report(args) -> int:
    print(report_run(args.run_dir, components=args.components, maps=args.maps,
                     **cluster_kwargs(args)))
    return 0


def cmd_run(args) -> int:
    # the stages as they start and end, without -v (the pipeline's INFO lines, to stderr)
    stages = progress_lines("run")
    stages.addFilter(lambda record: record.levelno < logging.WARNING
                     and record.getMessage().startswith("stage "))
    pipeline_log = logging.getLogger("dkha.pipeline")
    pipeline_log.addHandler(stages)
    try:
        code, summary = run_file(args.pipeline, run_id=args.run_id, runs_dir=args.runs_dir,
                                 cluster=cluster_kwargs(args), verbose=True)
    finally:
        pipeline_log.removeHandler(stages)
    if args.json:
        print(result.dumps(summary))
    else:
        print(f"run {summary['run_id']} in {summary['run_dir']}: exit {code}")
        for name, figs in summary.get("figures", {}).items():
            shown = ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                              for k, v in figs.items()
                              if v is not None and not isinstance(v, dict)
                              and k != "paper_source")
            along = [k for k, v in figs.items() if isinstance(v, dict)]
            if along:       # the figures along the fit: in summary.json and the report
                shown += f" ({', '.join(along)} in summary.json)"
            print(f"  {name}: {shown}")
        print(f"  report: {os.path.join(summary['run_dir'], 'report.html')}")
    return code


def cmd_demo(args) -> int:
    import dask
    from sklearn.datasets import load_digits

    out = args.out or tempfile.mkdtemp(prefix="dkha-demo-")   # never into the working directory
    os.makedirs(out, exist_ok=True)
    d = load_digits()
    X = np.concatenate([d.data[d.target == k][:100] for k in range(10)]) / 8.0 - 1.0
    y = np.concatenate([d.target[d.target == k][:100] for k in range(10)])
    store_path = os.path.join(out, "digits.zarr")
    store = ingest_array(X, store_path, labels=y, chunk_rows=250, overwrite=True)
    print(f"data store {store.path}: {store.n_samples} digits (8×8, pixels x/8 − 1)")
    run_dir = os.path.join(out, "run")
    # from a random start, as in the paper: the default Nyström start (800 landmarks of these
    # 1 000 digits) is already within 3e-6 of the exact components, where the passes show
    # nothing but round-off-level noise
    model = KernelHebbianPCA(16, algorithm=args.algorithm, sigma=4.0, passes=args.passes,
                             init="random", evaluate_every=1, verbose=sys.stderr.isatty(),
                             **cluster_kwargs(args))
    # the demo shows the paper's measure, eq. 22, at every pass: E_min of 1 000 digits is cheap
    with dask.config.set({"dkha.evaluation": "exact"}):
        model.fit(store_path, run_dir=run_dir, overwrite=True)
    print("pass   excess error E/E_min − 1")
    for h in model.history_:
        print(f"{h['pass']:4d}   {h['excess']:.3e}")
    kept = model.attrs_.get("kept_state")
    if kept:
        print(f"kept the state of pass {kept['pass']} (excess {kept['excess']:.3e}), not the "
              f"last: {model.attrs_.get('kept_reason')}")
    print(f"saved {run_dir}/components.zarr (open it with xarray.open_zarr)")
    return 0


COMMANDS = {"demo": cmd_demo, "ingest": cmd_ingest, **FIT_COMMANDS,
            "evaluate": cmd_evaluate, "transform": cmd_transform, "run": cmd_run,
            "report": cmd_report, "maps": cmd_maps}


def _quiet_distributed(level: int) -> None:
    """distributed logs INFO lines on every cluster start, and a WARNING for each task a stop
    cancels (a fit that ends on bad input or divergence cancels its prefetched rows): keep them
    out of the CLI's output, where an error is one line. ``-v`` shows its warnings, ``-vv`` all.

    The local clusters dkha starts take the same level into their worker processes
    (``engine.cluster.client_for``).
    """
    import distributed  # noqa: F401  (configures its loggers on import; then we override)

    quiet = {logging.WARNING: logging.ERROR, logging.INFO: logging.WARNING}.get(level, level)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(quiet)


#: commands that never check the stop request (no fit, no cluster passes): Ctrl-C ends them
#: at once, as Python's default does
UNSTOPPABLE = ("ingest", "report")


def _install_stop_handler(command: str | None = None) -> None:
    """SIGTERM and SIGINT (Ctrl-C): a running fit checkpoints at the next task boundary and
    exits with code 75 (resumable), with one line saying so; every long phase stops at its
    next task (:data:`~dkha.engine.stop.STOP`). A second signal ends the process at once.
    ``command``: one of :data:`UNSTOPPABLE` keeps Python's Ctrl-C (``KeyboardInterrupt``).
    """
    import signal

    def handler(signum, frame):
        if STOP.is_set():
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        STOP.set()
        print(f"dkha: {signal.Signals(signum).name}: stopping at the next task (checkpoint "
              "where there is a state to keep, then exit 75; again to end at once)",
              file=sys.stderr)

    handlers = {signal.SIGTERM: handler,
                signal.SIGINT: signal.default_int_handler if command in UNSTOPPABLE else handler}
    for signum, h in handlers.items():
        try:
            signal.signal(signum, h)
        except ValueError:  # not the main thread (embedded use)
            pass


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command (as ``dkha`` does, with the engine loaded first)."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the command that the parsed ``args`` describe; returns the exit code."""
    level = (logging.WARNING if args.verbose == 0 else
             logging.INFO if args.verbose == 1 else logging.DEBUG)
    console = logging.StreamHandler()
    # warnings and -v's lines in the format of the progress lines (dkha.cli.output)
    console.setFormatter(LogFormatter(args.command, names=level <= logging.DEBUG))
    logging.basicConfig(level=level, handlers=[console])
    for h in logging.root.handlers:  # library INFO lines go to files (pipelines), not the console
        h.setLevel(level)
    _quiet_distributed(level)

    _install_stop_handler(args.command)
    shown = warnings.showwarning
    warnings.showwarning = log_warning
    try:
        if getattr(args, "storage_option", None):
            set_storage_options(dict(args.storage_option))
        with performance_reported(args):
            return {**COMMANDS, **APPLY_COMMANDS}[args.command](args)
    except Interrupted as exc:      # a stop asked for (SIGTERM, Ctrl-C): no error
        text = str(exc)
        print("dkha: " + (text if text.startswith("stopped") else f"stopped: {text}"),
              file=sys.stderr)
        return exc.exit_code
    except DkhaError as exc:
        print(f"dkha: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dkha: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown
