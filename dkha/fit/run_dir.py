"""The run directory of a batch fit, owned here end to end: the attrs it is saved with (built
once, :func:`run_attrs`, and completed once the model is fitted, :func:`finished_attrs`), its
checks before any work (:func:`check_run_dirs`), its checkpoints (opened and resumed,
:func:`open_runs`; dropped when a fresh fit fails for good), and the run written at the end
(:func:`write_run`: ``components.zarr``, ``timings.json``, the spent checkpoints cleared).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from dkha.algorithms import AUTO, has_mu, is_exact
from dkha.config import Settings
from dkha.data import cf, result
from dkha.data.checkpoint import Checkpointer, open_fit
from dkha.data.layout import shares_a_tree
from dkha.data.store import DataStore
from dkha.engine.budget import block_rows_for
from dkha.errors import InputError, ParameterError, RunDirectoryError
from dkha.fit.kha_stream import save_checkpoint
from dkha.fit.plan import Route
from dkha.fit.request import (
    FitRequest,
    ModelFit,
    ModelRequest,
    RunOptions,
)
from dkha.fit.track import kept_reason
from dkha.version import __version__


def saved_attrs(saved: Sequence[tuple[str, str]], resolved: Mapping, asked: Mapping,
                kernel) -> dict:
    """``{attr: value}`` of every saved row ``(parameter, attr)`` of an estimator's table
    (``saved``), with its value as the fit resolved it (``resolved``; the row ``kernel``: the
    resolved kernel's name) or, where it resolves none, as asked (``asked``: the estimator's
    ``get_params``), a row in neither refused with a ``KeyError`` (never saved as ``None``);
    and the resolved ``kernel``'s parameters (e.g. the median-distance ``sigma``; a callable's
    ``kernel_params``) once, as ``kernel_parameters``. The one builder of both estimators'
    saved rows."""
    resolved = dict(resolved, kernel=kernel.name)
    attrs = {}
    for name, attr in saved:
        if name in resolved:
            attrs[attr] = resolved[name]
        elif name in asked:
            attrs[attr] = asked[name]
        else:
            raise KeyError(f"the saved parameter {name!r} is neither resolved by the fit nor "
                           "among the estimator's parameters")
    attrs["kernel_parameters"] = kernel.param_dict
    return attrs


def run_attrs(request: FitRequest, model: ModelRequest, settings: ModelRequest, route: Route,
              kernel) -> dict:
    """The attrs a model's run is saved with (they also tell runs apart): every saved row of
    the estimator's table (``request.saved``) with its value as resolved (``settings``, the
    seed, the kernel's name) or, where the fit resolves none, as asked (``model.params``, the
    estimator's ``get_params``), the kernel's parameters as resolved, the data and the length,
    and why ``auto`` ran what it ran."""
    store = request.store
    attrs = saved_attrs(request.saved, dict(vars(settings), seed=int(request.seed)),
                        model.params, kernel)
    attrs.update(data_attrs(store_path(store), store.n_samples, store.n_features,
                            settings.n_steps), centered=True, dkha_version=__version__,
                 centering="exact" if settings.center_sample is None else "sample")
    for k in unused_settings(route, model.params):
        attrs.pop(k, None)
    return routed_attrs(attrs, route)


def data_attrs(store: str, n_samples: int, n_features: int, n_steps: int) -> dict:
    """A run's attrs of its data and length (batch and online)."""
    return {"n_steps": int(n_steps), "passes": n_steps / max(n_samples, 1), "store": store,
            "n_samples": int(n_samples), "n_features": int(n_features)}


def store_path(source) -> str:
    """The ``store`` attr: a data store's path (absolute where local), ``<array>`` else."""
    if isinstance(source, DataStore):
        return os.path.abspath(source.path) if "://" not in source.path else source.path
    return "<array>"


#: the settings of the KHA iterations (and their length): what an exact path (krylov, dense)
#: takes no part of
KHA_SETTINGS = ("eta0", "mu", "xi", "rho0", "gain_params", "init", "n_steps", "passes")
#: SMD's settings: what the other KHA algorithms take no part of
SMD_SETTINGS = ("mu", "xi", "rho0")


def unused_settings(route: Route, asked) -> tuple[str, ...]:
    """The saved settings that take no part in what ``route`` runs, left out of its attrs (so
    not shown back by :func:`dkha.load` either): the KHA iterations' on an exact path (a
    Krylov solve but for a start ``init`` given to it), SMD's on the other KHA algorithms."""
    runs = route.runs
    if runs == AUTO or runs == "dense" or is_exact(runs):
        given_start = is_exact(runs) and asked.get("init") is not None
        return tuple(k for k in KHA_SETTINGS if not (k == "init" and given_start))
    return () if has_mu(runs) else SMD_SETTINGS


def routed_attrs(attrs: dict, route: Route) -> dict:
    """``attrs`` with what ``auto`` ran and why (:meth:`dkha.fit.plan.Route.attrs`)."""
    return {**attrs, **route.attrs()}


def finished_attrs(attrs: dict, res, solver, meta: dict) -> dict:
    """A fitted model's attrs: ``attrs`` with the top eigenvalues, the state kept where an
    earlier pass was better than the end, and the KHA gains as applied. Top eigenvalues fewer
    than the components asked are those of a ``K'`` of that rank (a Nyström start found it and
    checked its trace, :func:`dkha.fit.init.nystrom_coefficients`): the rest are 0."""
    if res.failure is not None:
        return attrs
    top = None if res.top_eigenvalues is None else [float(v) for v in res.top_eigenvalues]
    if top is not None:
        top += [0.0] * (int(attrs.get("n_components", 0)) - len(top))
    a = dict(attrs, top_eigenvalues=top)
    a["history"] = cf.history_line(a)     # CF's history: when the fit ended, what ran
    if res.kept is not None:    # an earlier pass was better than the end: its state, and why
        a["kept_state"] = dict(res.kept)
        a["kept_reason"] = kept_reason(res.kept, attrs)
    if solver is not None:      # the gains as applied (eta0 and mu in units of κ̄)
        a.update(solver.effective_gains(), eta0_applied=solver.eta0,
                 start_deficit=meta.get("start_deficit"))
    return a


def check_run_dirs(run_dirs: list[str], store: DataStore, attrs: list[dict], *, resume: bool,
                   overwrite: bool, identity) -> None:
    """Refuse run directories inside the data store, and (unless resuming) every directory
    that may not be written, before any is cleared."""
    if "://" not in store.path:
        real_store = os.path.realpath(store.path)
        for run_dir in run_dirs:
            real_run = os.path.realpath(run_dir)
            if real_run == real_store or real_run.startswith(real_store + os.sep):
                raise RunDirectoryError(f"the run directory {run_dir} is inside the data "
                                        f"store {store.path} being read; write the run elsewhere")
    if not resume:
        for run_dir, a in zip(run_dirs, attrs):
            result.check_run_dir(run_dir, a, overwrite, identity)


def common_step(checkpointers: list[Checkpointer], cks: list, n_steps: int) -> list:
    """The checkpoints to resume several models from: the newest step that all the running ones
    hold (a stop between two models' checkpoints leaves some a step ahead), at most ``n_steps``;
    a model that had stopped (its tol, the noise floor) resumes from its own newest."""
    running = [ck for ck in cks if ck.meta.get("active", True)]
    step = min(ck.step for ck in running or cks)
    out = []
    for c, ck in zip(checkpointers, cks):
        if ck.step != step and ck.meta.get("active", True):
            ck = c.at_step(step)
            if ck is None:
                raise InputError(f"cannot resume {c.run_dir}: the models' checkpoints are at "
                                 f"different steps and none at step {step} is left")
        if ck.step > n_steps:
            raise ParameterError(f"cannot resume {c.run_dir}: its checkpoint is at step {ck.step}, "
                                 f"beyond the {n_steps} steps asked for; ask for more passes")
        out.append(ck)
    return out


def open_runs(store: DataStore, settings: list[ModelRequest], request: FitRequest,
              attrs: list[dict], asked: str, opts: RunOptions, recorded: list, config: Settings):
    """``(checkpointers, metas, checkpoints to resume from)`` of the run directories (each meta
    read-only, with what a bare resume repeats: ``recorded``, the checkpoint options)."""
    # what else a bit-identical continuation needs: the blocks and where they are projected
    exact = {"block_rows": block_rows_for(store.n_samples, config, request.block_rows),
             "projections": asked, "evaluate_every": int(request.evaluate_every)}
    # a longer run continues a shorter one exactly: the step count does not identify a run
    resume_identity = {**{k: f for k, f in opts.identity.items() if k != "n_steps"},
                       "n_samples": None, "n_features": None}
    run_dirs = opts.run_dirs
    if run_dirs is not None:
        check_run_dirs(run_dirs, store, attrs, resume=opts.resume, overwrite=opts.overwrite,
                       identity=opts.identity)
    opened = [open_fit(d, a, overwrite=opts.overwrite, resume=opts.resume,
                       checkpoint_every=opts.checkpoint_every or opts.checkpoint_steps,
                       exact=exact, identity=opts.identity, resume_identity=resume_identity,
                       repeat={"params": dict(r), "checkpoint_every": opts.checkpoint_every,
                               "checkpoint_steps": opts.checkpoint_steps})
              for d, a, r in zip(run_dirs or [None] * len(settings), attrs, recorded)]
    checkpointers = None if run_dirs is None else [o[0] for o in opened]
    metas = [o[2] for o in opened]
    cks = None
    if opts.resume:
        cks = common_step(checkpointers, [o[1] for o in opened], settings[0].n_steps)
    return checkpointers, metas, cks


@contextlib.contextmanager
def settings_dropped_on_failure(run_dirs: Sequence[str] | None, resume: bool):
    """A fresh fit that fails for good (not stopped and not a lost cluster: exit code 75) leaves
    no checkpoint of its settings alone (step 0, which the exact paths write before any work):
    there is nothing to resume, and a fit into the run directory again is not refused."""
    try:
        yield
    except Exception as exc:
        if run_dirs and not resume and getattr(exc, "exit_code", None) != 75:
            for d in run_dirs:
                if Checkpointer(d).steps() == [0]:
                    Checkpointer(d).clear()
        raise


def run_dataset(history: Sequence[dict], eigenvalues, attrs: Mapping, *, alpha=None, mk=None,
                mkm: float | None = None, projection=None, pictures=None, backoffs=(),
                solver=None):
    """The one builder of every run's ``components.zarr`` dataset (the schema:
    :mod:`dkha.data.result`): what a fit writes at the end (:func:`write_runs`,
    :func:`dkha.fit.online.fit_online`), what the estimators' ``to_dataset()`` and ``save()``
    give, the same for the same fit. A batch run: ``alpha`` over the samples, the centering row
    ``mk``, ``mkm``, the training ``projection`` and the component ``pictures`` (the step after
    the fit adds them to the run the fit wrote:
    :func:`dkha.apply.pictures.add_component_pictures`) where there are. A dictionary run (the
    online family): its ``solver``'s components over the dictionary's members, with the solver's
    complete state (so that :func:`dkha.load` continues it)."""
    extra = {k: v for k, v in (("projection", projection), ("component_image", pictures))
             if v is not None}
    if solver is not None:
        alpha, backoffs = solver.alpha(), solver.backoffs
        attrs = dict(attrs, **_dictionary_variables(solver, history, extra))
    return result.build_dataset(alpha, eigenvalues, list(history), attrs, mk=mk, mkm=mkm,
                                member_dim="sample" if solver is None else "member",
                                extra=extra, backoffs=list(backoffs))


def _dictionary_variables(solver, history: Sequence[dict], extra: dict) -> dict:
    """A dictionary run's variables (its members, its history's AC index, members and
    explained variance, the solver's state) added to ``extra``; the attrs they add."""
    member_index, member_step = solver.members()
    dictionary = solver.dictionary()
    arrays, scalars = solver.snapshot()
    extra.update({
        "dictionary": (("member", "feature"), dictionary),
        "member_index": ("member", member_index),
        "member_step": ("member", member_step),
        "mean_coefficient": ("member", solver.mean_coefficients()),
        "ac_index": ("evaluation", np.array([h["ac_index"] for h in history], dtype=np.float64)),
        "members": ("evaluation", np.array([h["members"] for h in history], dtype=np.int64)),
        "explained_variance": (("evaluation", "component"), np.array(
            [h["explained_variance"] for h in history], dtype=np.float64).reshape(
                len(history), solver.r)),
        "state_B": (("component", "member"), arrays["B"]),
        "state_L": (("member", "member_column"), arrays["L"]),
        "state_cbar": ("member", arrays["cbar"]),
        "state_a_init": ("component", arrays["a_init"])})
    if "exact_S" in arrays:         # the exact span's sums (dkha.solvers.online_exact)
        extra.update({"state_exact_S": (("member", "member_column"), arrays["exact_S"]),
                      "state_exact_s": ("member", arrays["exact_s"])})
    return {"members": int(dictionary.shape[0]), "state_scalars": scalars}


def write_run(run_dir: str, ds, timings: dict | None, *, spent: Checkpointer | None = None,
              resumable: bool = False, final: ModelFit | None = None,
              member: bool = False) -> str:
    """Write a run directory: ``ds`` as ``components.zarr`` (``member``: as its model's group
    in the parent's tree, :mod:`dkha.data.layout`), the ``timings`` as ``timings.json``; then
    clear its ``spent`` checkpoints (in that order: a stop between the two leaves a run that
    still resumes) or, ``resumable``, write the ``final`` fit's last state as its one
    checkpoint (a fit with more passes continues it exactly where it ended; refused where there
    is none: the exact paths, a loaded run). Returns the path of the components written."""
    if resumable and (final is None or final.solver is None):
        raise ParameterError("save(resumable=True) needs a fit of the KHA iterations in this "
                             "process (the exact paths and a loaded run keep no solver state "
                             "to continue)")
    if not resumable:
        final = None
    out = result.save(ds, run_dir, member=member)
    if timings:
        result.save_timings(timings, run_dir)
    if spent is not None:
        spent.clear()
    if final is not None:
        checkpointer = Checkpointer(run_dir)
        checkpointer.clear()
        res = final.result
        save_checkpoint(checkpointer, final.solver, final.mk, final.mkm, history=res.history,
                        top_eigenvalues=res.top_eigenvalues, fit_seconds=res.wall_time,
                        meta=final.meta, n_steps=int(final.attrs["n_steps"]))
    return out


def write_runs(fits: list[ModelFit], run_dirs: Sequence[str] | None) -> list[ModelFit]:
    """Each completed model saved in its run directory (if any), its checkpoints cleared;
    models fitted together into directories of one parent as one zarr group tree
    (:mod:`dkha.data.layout`)."""
    if run_dirs is None:
        return fits
    out = []
    member = shares_a_tree(run_dirs)
    for f, d in zip(fits, run_dirs):
        if f.failure is None:
            ds = run_dataset(f.result.history, f.eigenvalues, f.attrs, alpha=f.alpha, mk=f.mk,
                             mkm=f.mkm, projection=f.projection, backoffs=f.result.backoffs)
            write_run(d, ds, f.timings, spent=f.checkpointer, member=member)
            f = replace(f, run_dir=d)
        out.append(f)
    return out
