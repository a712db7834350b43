"""The ``dkha fit`` and ``dkha tune`` commands; their options (:mod:`dkha.cli.parser`) come from
the one parameter table (:mod:`dkha.estimators.params`)."""

from __future__ import annotations

import os

from dkha import algorithms
from dkha.cli import rerun
from dkha.cli.options import centering_line, centering_summary
from dkha.cli.output import (
    TIMES,
    errors_text,
    excess_precision,
    excess_text,
    kernel_text,
    number,
    times_line,
)
from dkha.cli.where import cluster_kwargs
from dkha.data import result
from dkha.data.checkpoint import Checkpointer
from dkha.data.layout import components_path
from dkha.errors import NumericalError, ParameterError, RunDirectoryError, RunFinished
from dkha.estimators.batch import fit_together, run_names
from dkha.estimators.factory import (
    estimator_for,
    fit_run,
    held_components,
    null_components_of_runs,
)
from dkha.estimators.params import BATCH, PARAMETERS, cli_values, parameters
from dkha.estimators.tune import tune
from dkha.fit.track import kept_figures, result_entry


def _fit_summary(model, run_dir: str) -> dict:
    last = result_entry(model.history_, model.attrs_.get("kept_state"))
    return {"run_dir": run_dir, "algorithm": model.attrs_["algorithm"],
            "n_samples": model.n_samples_, "n_components": held_components(model),
            "kernel": model.kernel_.describe(),
            **{k: last.get(k) for k in ("pass", "step", "error", "error_min", "excess")},
            "excess_precision": excess_precision(
                last.get("error_min"), model.attrs_.get("top_eigenvalues"), model.n_samples_)
            if last else None,
            "fit_seconds": (getattr(model, "timings_", None) or {}).get("total",
                                                                        last.get("wall_time")),
            "backoffs": len(model.backoffs_),
            "times": {k: v for k, v in (getattr(model, "timings_", None) or {}).items()
                      if k in TIMES},
            **kept_figures(model.attrs_), **centering_summary(model.attrs_)}


def _print_backoffs(backoffs: list[dict]) -> None:
    """One line for a run's backoffs (none: nothing)."""
    if backoffs:
        first, last = backoffs[0], backoffs[-1]
        print(f"diverged and backed off {len(backoffs)} time{'s' * (len(backoffs) > 1)} "
              f"(first at step {first['step']}, pass {first['pass']}): eta0 "
              f"{first['gain_before']:.3g} → {last['gain_after']:.3g}")


def _backed_off(n: int | None) -> str:
    return f" (backed off {n}×)" if n else ""


def _families(names) -> list[str]:
    """The family of each ``--algorithm`` value (an unknown one refused in one line)."""
    try:
        return [algorithms.family(name, option="--algorithm") for name in names]
    except Exception as exc:  # noqa: BLE001 - an unknown name of any kind: one line
        raise ParameterError(str(exc))


def _model_settings(args) -> list[dict]:
    """``(algorithm, eta0, mu)`` of each model from ``--algorithm``/``--eta0``/``--mu`` lists
    (a single value serves every model)."""
    lists = {"algorithm": [a.strip() for a in args.algorithm.split(",")],
             "eta0": args.eta0 or [None], "mu": args.mu or [None]}
    k = max(len(v) for v in lists.values())
    for name, v in lists.items():
        if len(v) not in (1, k):
            raise ParameterError(f"--{name} gives {len(v)} values for {k} models; give one value "
                                 "or one per model")
    return [{name: v[i] if len(v) > 1 else v[0] for name, v in lists.items()} for i in range(k)]


def _model(args, algorithm: str, eta0=None, mu=None, **overrides):
    """The estimator that ``dkha fit``'s (or ``dkha tune``'s) options describe (an option of
    the other family is refused in one line)."""
    batch = algorithms.family(algorithm) != algorithms.ONLINE    # online: no cluster
    fixed = dict(verbose=not args.quiet or args.verbose > 0,
                 **(cluster_kwargs(args) if batch else {}), **overrides)
    return estimator_for(algorithm, dict(cli_values(args), eta0=eta0, mu=mu), store=args.store,
                         **fixed)


def resumed_options(args) -> list[dict] | None:
    """What ``--resume`` repeats of the run in ``args.out``: the meta of each model's newest
    checkpoint (``RUN_DIR`` for one model, ``RUN_DIR/<name>`` for several), which records the
    parameters as asked for (``params``) and the checkpoint interval; ``None`` where there is
    none to read (nothing to resume: the fit says why; an older dkha's checkpoint: the options
    as given). The algorithm and the checkpoint interval not given now are set in ``args``."""
    out = args.out
    metas = [Checkpointer(out).newest_meta()]
    if metas[0] is None and os.path.isdir(out):     # several models, one directory each
        metas = [Checkpointer(os.path.join(out, d)).newest_meta() for d in sorted(os.listdir(out))
                 if os.path.isdir(os.path.join(out, d, "checkpoints"))]
    metas = [m for m in metas if m is not None]
    if not metas or any(m.get("params") is None for m in metas):
        return None
    given = getattr(args, "given", set())
    if "algorithm" not in given:
        args.algorithm = ",".join(m["params"]["algorithm"] for m in metas)
    if not given & {"checkpoint_every", "checkpoint_steps"}:
        args.checkpoint_every = metas[0].get("checkpoint_every") or None
        args.checkpoint_steps = metas[0].get("checkpoint_steps") or None
    return metas


#: options given together count as given together (a length; ``passes`` is steps online)
_TOGETHER = ({"passes", "steps"},)


def repeat_params(model, meta: dict | None, args) -> list[str]:
    """Set the parameters recorded in a resumed run's checkpoint ``meta`` on ``model``, but
    those given now (``args.given``): a bare ``--resume`` continues the run as it was asked for,
    and an option given now that differs from the run is refused by the fit, naming it.
    Returns the names of those it changed."""
    if meta is None:
        return []
    given = set(getattr(args, "given", ()))
    for group in _TOGETHER:
        if given & group:
            given |= group
    names = {p.name for p in PARAMETERS
             if p.option is not None and (p.dest in given or (p.old and p.old in given))}
    changed = []
    for name, value in meta["params"].items():
        if name not in names and hasattr(model, name):
            if getattr(model, name) != value:
                changed.append(name)
            setattr(model, name, value)
    return changed


def _finished_run(out: str) -> bool:
    """Whether ``out`` holds a saved run with no checkpoint left (a fit of it to its end)."""
    return (os.path.isdir(components_path(out))
            and not Checkpointer(out).steps())


def cmd_fit(args) -> int:
    """``dkha fit``; again on a finished run with the same settings and data, or ``--resume`` of
    one, nothing to do: one line, exit code 0, no cluster started (a scheduler's retry of a
    finished fit succeeds); with other settings it is refused, pointing at ``--overwrite``."""
    request = rerun.request_of(args)    # the options as given, before the fit fills them in
    if not args.overwrite and not args.resume and _finished_run(args.out):
        args.resume = True      # the fit asks the run whether it is this one (RunFinished)
    try:
        code = _cmd_fit(args)
    except RunFinished as done:
        print(done)
        code = 0
    if code == 0 and not getattr(args, "replayed", False):
        rerun.record(request, args)     # the same command again answers at once
    return code


def _cmd_fit(args) -> int:
    algorithm = args.algorithm
    metas = resumed_options(args) if args.resume else None
    args.replayed = args.algorithm != algorithm     # a checkpoint's settings, not the options'
    settings = _model_settings(args)
    _families([s["algorithm"] for s in settings])
    if len(settings) > 1:
        return _fit_many(args, settings, metas)
    args.algorithm, args.eta0, args.mu = (settings[0][k] for k in ("algorithm", "eta0", "mu"))
    model = _model(args, args.algorithm, args.eta0, args.mu)
    args.replayed |= bool(repeat_params(model, metas and metas[0], args))
    fit_run(model, args.store, args.out, overwrite=args.overwrite, resume=args.resume,
            checkpoint_every=args.checkpoint_every, checkpoint_steps=args.checkpoint_steps,
            ac_reference=args.evaluate_every >= 0)
    if algorithms.family(args.algorithm) == algorithms.ONLINE:
        return _online_summary(args, model)
    summary = _fit_summary(model, args.out)
    if args.json:
        print(result.dumps(summary))
    else:
        print(f"{summary['algorithm']}: {summary['n_components']} components of "
              f"{summary['n_samples']} samples, {kernel_text(model.kernel_)}")
        line = centering_line(model.attrs_, model.n_samples_)
        if line:
            print(line)
        if "path" in model.attrs_:
            print(f"path: {model.attrs_['path']} ({model.attrs_['path_reason']})")
        last = model.history_[-1] if model.history_ else {}
        if last:
            path = model.attrs_.get("path", summary["algorithm"])
            after = (f"after {summary['pass']} Krylov products" if algorithms.is_exact(path)
                     else "dense" if path == "dense" else f"after {summary['step']} steps")
        kept = model.attrs_.get("kept_state")
        if last.get("measure") == "residual":
            print(f"{after}: largest relative residual ‖K'v − λv‖/λ1 = {last['residual']:.2e} "
                  "(the exact excess: dkha evaluate RUN_DIR --exact, or fit with --tol)")
        elif last.get("measure") == "ritz":
            print(f"{after}: tracked Σθ² = {last['captured']:.10g}, the span moved "
                  f"{last.get('change', float('nan')):.1e} in the last pass (the exact excess: "
                  "dkha evaluate RUN_DIR --exact, or fit with --tol)"
                  + (f"; the result is pass {kept['pass']}'s state" if kept else ""))
        elif last:
            print(f"{after}: " + errors_text(summary["error"], summary["error_min"],
                                             summary["excess"], summary["excess_precision"])
                  + (f" (the state of pass {kept['pass']}, better than the last pass's excess "
                     f"{last['excess']:.3e})" if kept else ""))
        if "kept_pass" in summary:      # an earlier state than the last: which, and why
            print(f"kept the state of pass {summary['kept_pass']}, not the last: "
                  f"{summary['kept_reason']}")
        _print_backoffs(model.backoffs_)
        line = times_line(getattr(model, "timings_", None))
        if line:
            print(line)
        print(f"saved {os.path.join(args.out, 'components.zarr')}")
    return 0


def _fit_many(args, settings: list[dict], metas: list[dict] | None = None) -> int:
    """Several batch models in one pass over the kernel rows, one run directory each."""
    for s in settings:
        if not algorithms.streams_together(s["algorithm"]):
            raise ParameterError(f"{s['algorithm']} fits one model at a time; list only batch "
                                 f"algorithms ({', '.join(algorithms.names(algorithms.BATCH))}) "
                                 "to fit several together")
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise RunDirectoryError(f"{args.out} exists and is not a directory")
    models = [_model(args, s["algorithm"], s["eta0"], s["mu"]) for s in settings]
    if metas is not None and len(metas) == len(models):
        for m, meta in zip(models, metas):
            repeat_params(m, meta, args)
    run_dirs = [os.path.join(args.out, name) for name in run_names(models)]
    with null_components_of_runs(models):
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
        print(result.dumps(summaries))
    else:
        seconds = next((s["fit_seconds"] for s in summaries if s.get("fit_seconds")), None)
        print(f"{len(models)} models in one pass over the kernel rows"
              + (f" ({seconds:.1f} s of fitting)" if seconds else ""))
        for s in summaries:
            shown = ("diverged" if "diverged" in s else
                     f"excess {excess_text(s['excess'], s['excess_precision'])}"
                     if s.get("excess") is not None else "saved")
            print(f"  {s['run_dir']}: {shown}{_backed_off(s.get('backoffs'))}"
                  + (f"; kept the state of pass {s['kept_pass']}, not the last: "
                     f"{s['kept_reason']}" if "kept_pass" in s else ""))
        tree = os.path.join(args.out, result.COMPONENTS)
        if os.path.isdir(tree):
            print(f"saved {tree}, a group per model (xarray.open_datatree)")
    failed = [s for s in summaries if "diverged" in s]
    if failed:
        raise NumericalError(f"{len(failed)} of {len(models)} models diverged ("
                             + ", ".join(os.path.basename(s["run_dir"]) for s in failed)
                             + "): lower their eta0 (or mu); the others were saved")
    return 0


def cmd_tune(args) -> int:
    names = [a.strip() for a in args.algorithm.split(",")]
    for name, family in zip(names, _families(names)):
        if family != algorithms.BATCH:
            raise ParameterError(f"cannot tune {name!r}: tuning applies to the batch algorithms "
                                 + ", ".join(algorithms.names(algorithms.BATCH)))
    proto = _model(args, names[0], projections="coordinator", tol=None)
    shared = {k: v for k, v in proto.__dict__.items()
              if k not in ("algorithm", "eta0", "mu", "passes", "steps")}
    summary = tune(args.store, names, eta0=args.eta0, mu=args.mu, passes=args.passes,
                   tune_dir=args.out, overwrite=args.overwrite, **shared)
    if args.json:
        print(result.dumps(summary))
        return 0
    print(f"{summary['settings']} settings, {args.passes} passes each, in one pass over the "
          f"kernel rows ({summary['seconds']:.1f} s); excess error E/E_min − 1 after "
          f"{args.passes} passes:")
    print(f"  {'algorithm':10s} {'eta0':>8s} {'mu':>8s}  excess")
    for row in summary["grid"]:
        mu = "" if row["mu"] is None else f"{row['mu']:g}"
        shown = "diverged" if row["excess"] is None else f"{row['excess']:.3e}"
        print(f"  {row['algorithm']:10s} {row['eta0']:>8g} {mu:>8s}  {shown}"
              + _backed_off(row.get("backoffs")) + ("  ← best" if row.get("best") else ""))
    options = {p.kernel_param: p.option for p in parameters(BATCH)      # --sigma, --kernel-gamma…
               if p.kernel_param is not None and p.option is not None}
    kernel = " ".join(f"{options[k]} {v!r}" for k, v in summary["kernel_parameters"].items()
                      if k in options)
    rest = ",".join(f"{k}={v}" for k, v in summary["kernel_parameters"].items()
                    if k not in options)
    kernel += f" --kernel-params {rest}" if rest else ""
    for a, b in summary["best"].items():
        gains = f"--eta0 {b['eta0']:g}" + ("" if b["mu"] is None else f" --mu {b['mu']:g}")
        print(f"chosen {a}: {gains} (excess {b['excess']:.3e}), kept in {b['run_dir']}")
        if b["at_edge"]:
            print(f"  note: {' and '.join(b['at_edge'])} at the end of the grid; a wider range "
                  f"(--{' / --'.join(b['at_edge'])}) may do better")
        print(f"  continue: dkha fit {args.store} -o {b['run_dir']} --algorithm {a} {gains} "
              f"--components {args.components} --kernel {args.kernel} {kernel} --seed {args.seed}"
              + (f" --init {args.init}" if args.init is not None else "")
              + (f" --xi {args.xi:g}" if args.xi is not None else "")
              + (f" --rho0 {args.rho0:g}" if args.rho0 else "")
              + (f" --block {args.block_rows}" if args.block_rows else "")
              + (f" --center-sample {args.center_sample}" if args.center_sample else "")
              + f" --evaluate-every {args.evaluate_every} --passes N --resume")
    for a in summary["algorithms"]:
        if a not in summary["best"]:
            print(f"{a}: every setting diverged")
    print(f"summary: {os.path.join(args.out, 'tune.json')}")
    return 0


def _online_summary(args, model) -> int:
    """The one line (or JSON) an online fit prints."""
    ds = model.to_dataset()
    summary = {"run_dir": args.out, "algorithm": args.algorithm,
               "members": int(ds.sizes.get("member", 0))}
    if "ac_index" in ds and ds.sizes.get("evaluation", 0):
        summary["ac_index"] = float(ds["ac_index"].values[-1])
    if model.backoffs_:
        summary["backoffs"] = len(model.backoffs_)
        summary["eta0_final"] = model.backoffs_[-1]["gain_after"]
    print(result.dumps(summary) if args.json else
          ", ".join(f"{k} = {number(v)}" for k, v in summary.items()))
    return 0


COMMANDS = {"fit": cmd_fit, "tune": cmd_tune}
