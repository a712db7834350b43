"""The coordinator of a batch fit: one kernel stream, one or several models, from resolved settings.

:func:`fit_batch` is the one entry of every batch fit (``KernelHebbianPCA.fit``,
:func:`dkha.fit_together`, ``dkha fit``, ``dkha tune``, pipelines): given a data store, the
resolved kernel and each model's :class:`ModelSettings` (validated by the estimator), it opens
the run directories (checkpoints, resume), connects to Dask, builds the row engine, computes the
MK row and the start, runs the block stream (:func:`dkha.fit.kha_stream.run_batches`) or the exact
solver (:func:`dkha.fit.krylov.run_krylov`) and returns one :class:`ModelFit` per model. The
estimators set their fitted attributes from those and save them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from distributed import Client

from dkha import config, schedule
from dkha.algorithms import AUTO, KRYLOV, has_mu, is_exact
from dkha.data import result
from dkha.data.checkpoint import Checkpointer, open_fit
from dkha.data.store import DataStore
from dkha.engine.budget import block_rows_for
from dkha.engine.cluster import (
    blas_limit,
    blas_threads_for,
    client_for,
    computes_on_gpu,
    names_a_cluster,
)
from dkha.engine.content import check_finite, on_sample
from dkha.engine.rows import RowEngine
from dkha.errors import RESUME_HINT, InputError, Interrupted, ParameterError, RunDirectoryError
from dkha.fit.dense import dense_fit
from dkha.fit.evaluate import projections
from dkha.fit.init import nystrom_coefficients, unit_norm_components
from dkha.fit.kha_stream import BatchResult, run_batches
from dkha.fit.krylov import KrylovCheckpoints, run_krylov
from dkha.fit.plan import Plan, auto_krylov_tol, plan_fit
from dkha.kernels import make_kernel, median_distance
from dkha.progress import Progress, announce
from dkha.solvers.batch import (
    BatchKHA,
    eigenvalue_estimate,
    initial_coefficients,
    start_deficit,
    warm_eta0,
)
from dkha.solvers.warmup import compile_ahead

log = logging.getLogger(__name__)



def resolve_kernel(store, kernel: str, seed: int, client=None, **params):
    """The kernel with its parameters; a width of None (the gaussian's ``sigma``, the spec's
    ``width``) → the median-distance heuristic on a seeded sample of ``store`` (a
    :class:`DataStore` or any source with ``sample(n, seed)``; read and measured on a worker of
    ``client`` where its workers are other processes), times
    ``dkha.patch-sigma-factor`` (3) for a gaussian kernel on image patches: the width that keeps
    patch denoising level with linear patch PCA (benchmarks/denoise_photo.py, README)."""
    k = make_kernel(kernel, **params)
    if getattr(store, "n_features", None) is not None:
        k = k.with_defaults(store.n_features)      # scikit-learn's gamma = 1/n_features
    if k.needs_width():
        median = on_sample(store, client, int(config.get("median-sample")), seed,
                           median_distance)
        patches = kernel == "gaussian" and "patch" in (getattr(store, "attrs", None) or {})
        factor = float(config.get("patch-sigma-factor")) if patches else 1.0
        k = k.with_width(factor * median)
        log.info("%s by the median-distance heuristic%s: %g", k.spec.width,
                 f" × {factor:g} (image patches)" if patches else "", k[k.spec.width])
    return k


@dataclass
class ModelSettings:
    """One model's resolved settings (what the estimator validated; ``eta0`` ``None``: from the
    Nyström start, set by :func:`fit_batch`)."""

    algorithm: str
    n_components: int
    eta0: float | None
    mu: float
    xi: float
    rho0: float
    n_steps: int
    landmarks: int | None
    support: int | None
    init: str
    center_sample: int | None
    tol: float | None = None
    on_divergence: str = "backoff"
    verbose: bool = False


@dataclass
class StreamSettings:
    """What shapes the one kernel stream every model of a fit shares."""

    seed: int
    evaluate_every: int
    block_rows: int | None = None
    prefetch: int | None = None
    projections: str | None = None
    cache_rows: bool | None = None
    precision: str | None = None
    device: str | None = None
    client: object = None


@dataclass
class ModelFit:
    """One model's outcome: its result and what it needs to be kept, saved or continued."""

    settings: ModelSettings
    #: the attrs saved with the run (the gains as applied and the top eigenvalues added)
    attrs: dict
    result: BatchResult
    mk: np.ndarray
    mkm: float
    #: seconds before the first pass, the row engine's passes, the projections' choice
    timings: dict
    #: the batch solver (``None`` for krylov), for a resumable save
    solver: BatchKHA | None
    #: the meta its checkpoints carry (the start's deficit, the exact settings)
    meta: dict
    checkpointer: Checkpointer | None = None
    #: what the ``extras`` hook of :func:`fit_batch` made of it (e.g. component pictures)
    extra: object = None

    @property
    def failure(self) -> str | None:
        return self.result.failure

    def describe_failure(self) -> str:
        """``algorithm (eta0=…[, mu=…]): why`` of a diverged model."""
        s = self.settings
        return (f"{s.algorithm} (eta0={s.eta0:g}"
                + (f", mu={s.mu:g}" if has_mu(s.algorithm) else "")
                + f"): {self.result.failure}")


@dataclass
class FitOptions:
    """Where and how a fit is kept: run directories, checkpoints, resume."""

    run_dirs: Sequence[str] | None = None
    overwrite: bool = False
    checkpoint_every: int = 0
    resume: bool = False
    checkpoint_steps: int = 0
    skip_diverged: bool = False
    extras: Callable | None = field(default=None, repr=False)
    #: the attrs that tell runs apart, with their former names
    #: (:func:`dkha.estimators.params.identity_attrs`)
    identity: dict = field(default_factory=dict)
    #: each model's parameters as asked for, recorded in its checkpoints (a bare resume
    #: repeats them: :func:`dkha.estimators.params.recorded_params`)
    params: Sequence[dict] | None = None


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
    """The checkpoints to resume several models from: the newest step that all of them hold (a
    stop between two models' checkpoints leaves some a step ahead), at most ``n_steps``."""
    step = min(ck.step for ck in cks)
    out = []
    for c, ck in zip(checkpointers, cks):
        if ck.step != step:
            ck = c.at_step(step)
            if ck is None:
                raise InputError(f"cannot resume {c.run_dir}: the models' checkpoints are at "
                                 f"different steps and none at step {step} is left")
        if ck.step > n_steps:
            raise ParameterError(f"cannot resume {c.run_dir}: its checkpoint is at step {ck.step}, "
                                 f"beyond the {n_steps} steps asked for; ask for more passes")
        out.append(ck)
    return out


def start(engine, settings: list[ModelSettings], metas: list[dict], cks, n_samples: int,
          seed: int):
    """The shared start ``(A_init, C_init)`` (``None`` for the paper's random start or a resume)
    and the default ``eta0`` of each model that has none: from a Nyström start, scaled to unit
    feature-space norm, :func:`~dkha.solvers.batch.warm_eta0` of its eigenvalue deficit (kept in
    the checkpoints' meta, read back on a resume)."""
    p0 = settings[0]
    A_init = C_init = None
    if p0.landmarks and cks is None:
        A_init, s = nystrom_coefficients(engine, p0.n_components, p0.landmarks, seed=seed)
        if len(A_init) < p0.n_components:   # K' has that rank: the start is exact, the rest null
            for p in settings:
                p.n_components = len(A_init)
            if not len(A_init):
                return None, None
        if not is_exact(p0.algorithm):     # unit norms: one pass for C = A K'
            A_init, C_init = unit_norm_components(A_init, projections(engine, A_init))
            deficit = start_deficit(s, eigenvalue_estimate(A_init, C_init))
            log.info("Nyström start: eigenvalue deficit %.3g", deficit)
            for p, meta in zip(settings, metas):
                if p.eta0 is None:
                    p.eta0 = warm_eta0(p.algorithm, deficit)
                meta["start_deficit"] = deficit
    elif p0.support and cks is None:
        A_init = initial_coefficients(p0.n_components, n_samples, schedule.init_generator(seed),
                                      support=p0.support)
    for p, meta, ck in zip(settings, metas, cks or [None] * len(settings)):
        if p.eta0 is None and ck is not None and not is_exact(p.algorithm):
            # resumed: the gain the run started with
            if ck.meta.get("start_deficit") is None:
                raise ParameterError(f"cannot resume {ck.path} with the default eta0: the "
                                     "checkpoint does not record its start (an older dkha); "
                                     "give --eta0")
            meta["start_deficit"] = float(ck.meta["start_deficit"])
            p.eta0 = warm_eta0(p.algorithm, meta["start_deficit"])
    return A_init, C_init


def _solver(p: ModelSettings, n_samples: int) -> BatchKHA:
    return BatchKHA(p.algorithm, p.n_components, n_samples, eta0=p.eta0, mu=p.mu, xi=p.xi,
                    rho0=p.rho0, on_divergence=p.on_divergence, feature_norm=None)


def _check_data(store: DataStore, verbose: bool, *, client) -> Progress:
    """Check that the data is finite (recorded at ingest, else read by the workers:
    :mod:`dkha.engine.content`), then show the next stage: connecting to Dask, or starting its
    workers (the progress of the seconds before the first pass can show its own)."""
    stages = Progress(verbose, None, "checking the data (finite values)", unit="stage",
                      transient=True)
    try:
        check_finite(store, client)
    except BaseException:
        stages.close()      # a refused store leaves no bar open (heartbeats would repeat it)
        raise
    connect = client is not None
    stages.describe("connecting to Dask" if connect else "starting the Dask workers")
    return stages


def _asked_projections(stream: StreamSettings, n_models: int, opts: FitOptions) -> str:
    """Where the block projections are asked to be computed (a resume keeps the run's)."""
    asked = str(config.get("projections", stream.projections))
    if n_models > 1 and asked == "workers":
        raise ParameterError("projections on the workers follow one model per stream; fit "
                             "several models together with projections='coordinator'")
    if opts.resume and asked == "auto" and opts.run_dirs:     # where the run projected before
        ck = Checkpointer(opts.run_dirs[0]).latest()
        if ck is not None:
            asked = str(ck.meta.get("exact", {}).get("projections", asked))
    return asked


def _open_runs(store: DataStore, settings: list[ModelSettings], stream: StreamSettings,
               attrs: list[dict], asked: str, opts: FitOptions):
    """``(checkpointers, metas, checkpoints to resume from)`` of the run directories."""
    # what else a bit-identical continuation needs: the blocks and where they are projected
    exact = {"block_rows": block_rows_for(store.n_samples, stream.block_rows),
             "projections": asked, "evaluate_every": int(stream.evaluate_every)}
    # a longer run continues a shorter one exactly: the step count does not identify a run
    resume_identity = {**{k: f for k, f in opts.identity.items() if k != "n_steps"},
                       "n_samples": None, "n_features": None}
    run_dirs = opts.run_dirs
    if run_dirs is not None:
        check_run_dirs(run_dirs, store, attrs, resume=opts.resume, overwrite=opts.overwrite,
                       identity=opts.identity)
    opened = [open_fit(d, a, overwrite=opts.overwrite, resume=opts.resume,
                       checkpoint_every=opts.checkpoint_every or opts.checkpoint_steps,
                       exact=exact, identity=opts.identity, resume_identity=resume_identity)
              for d, a in zip(run_dirs or [None] * len(settings), attrs)]
    checkpointers = None if run_dirs is None else [o[0] for o in opened]
    metas = [o[2] for o in opened]
    for i, meta in enumerate(metas):    # what a bare resume repeats
        meta.update(params=None if opts.params is None else opts.params[i],
                    checkpoint_every=opts.checkpoint_every, checkpoint_steps=opts.checkpoint_steps)
    cks = None
    if opts.resume:
        cks = common_step(checkpointers, [o[1] for o in opened], settings[0].n_steps)
    return checkpointers, metas, cks


def _default_path(store: DataStore, kernel, p0: ModelSettings, stream: StreamSettings,
                  cks=None):
    """The default's (``algorithm="auto"``) :class:`~dkha.fit.plan.Plan`, or ``None`` for
    another algorithm. No components, or all of them, make it the exact solver's dense eigh. A
    scheduler the user named is reached first: its workers' threads price the blockwise passes,
    and an unreachable one is refused in one line whichever path would have been chosen. A
    resumed run (``cks``) keeps the path its checkpoint records."""
    if p0.algorithm == AUTO and not 0 < p0.n_components < store.n_samples - 1:
        p0.algorithm = KRYLOV
    if p0.algorithm != AUTO:
        return None
    if cks and "plan" in cks[0].meta:
        return Plan.from_attrs(cks[0].meta["plan"])
    if not names_a_cluster(stream.client) or isinstance(stream.client, Client):
        return plan_fit(store, kernel, p0, stream.client, stream.seed)
    with client_for(stream.client) as client:   # reached first: unreachable is refused at once
        return plan_fit(store, kernel, p0, client, stream.seed)


def fit_batch(store: DataStore, kernel, settings: Sequence[ModelSettings],
              stream: StreamSettings, attrs: Sequence[dict],
              opts: FitOptions | None = None) -> list[ModelFit]:
    """Fit every model of ``settings`` in one kernel stream over ``store`` (see the module
    docstring); ``attrs``: each model's saved attrs (they identify its run directory).

    A diverged model's :class:`ModelFit` carries its ``failure`` (no ``alpha``); raising is the
    caller's choice (``opts.skip_diverged`` only quietens the divergence's log line).
    ``opts.extras(fits, engine, client)``, if given, runs while the cluster is up and sets each
    fit's ``extra``.
    """
    opts = opts or FitOptions()
    settings, attrs = list(settings), [dict(a) for a in attrs]
    p0 = settings[0]
    asked = _asked_projections(stream, len(settings), opts)
    checkpointers, metas, cks = _open_runs(store, settings, stream, attrs, asked, opts)
    verbose = any(p.verbose for p in settings)
    if config.get("compile-ahead"):     # the solver's loops compile while the fit starts
        for algorithm in sorted({p.algorithm for p in settings}):
            compile_ahead(algorithm)
    stages = _check_data(store, verbose, client=stream.client)
    # the stage bar is closed once the cluster is up, or by an error before (a bar left open
    # would be repeated by the heartbeat of a long-lived process)
    with stages, contextlib.ExitStack() as entering:
        plan, checkpoints, cks = _exact_path(store, kernel, p0, stream, checkpointers, metas,
                                             cks, opts)
        if plan is not None:
            attrs[0].update(plan.attrs())
            if plan.path == "dense":
                stages.close()
                return [_fit_dense(store, kernel, p0, stream, attrs[0], plan, metas[0],
                                   None if checkpointers is None else checkpointers[0], opts)]
            p0.algorithm = KRYLOV      # the attrs keep "auto" and the path
        client = entering.enter_context(client_for(stream.client, samples=store.n_samples))
        entering.enter_context(blas_threads_for(client,
                                                gpu=computes_on_gpu(client, stream.device)))
        cluster = entering.pop_all()
    with cluster:
        engine = RowEngine(store, kernel, client, block_rows=stream.block_rows,
                           prefetch=stream.prefetch, projections=asked,
                           cache_rows=stream.cache_rows, precision=stream.precision,
                           device=stream.device, models=len(settings))
        engine.verbose = verbose
        bands = engine.bands            # GPU workers: the passes' plan is the device's
        plan_line = bands.describe() if bands is not None else engine.memory.describe()
        announce(plan_line, verbose)
        for meta in metas:      # checkpoints record the mode chosen (a resume keeps it)
            if meta is not None and isinstance(meta.get("exact"), dict):
                meta["exact"]["projections"] = engine.projections
        t0 = time.perf_counter()
        if cks is None:
            engine.compute_mk(center_sample=p0.center_sample, seed=stream.seed)
        elif checkpoints is not None:   # the exact solver resumed: its centering row
            engine.set_mk(cks[0].arrays["mk"], float(cks[0].meta["mkm"]))
        t1 = time.perf_counter()
        A_init, C_init = start(engine, settings, metas, cks, store.n_samples, stream.seed)
        # seconds before the first pass (history wall times count the passes only)
        timings = {"centering": t1 - t0, "init": time.perf_counter() - t1,
                   "projections": {"asked": asked, "chosen": engine.projections,
                                   "reason": engine.projections_reason},
                   "memory": engine.memory.as_dict(), "plan": plan_line,
                   **({} if plan is None else {"path": plan.attrs()})}
        if bands is not None:
            timings["bands"] = bands.as_dict()
        if plan is not None or is_exact(p0.algorithm) or p0.n_components == 0:  # 0: K' = 0
            results = [_krylov(engine, p0, stream, plan, A_init, checkpoints)]
            solvers = [None]
        else:
            solvers = [_solver(p, store.n_samples) for p in settings]
            results = run_batches(
                engine, solvers, n_steps=p0.n_steps, seed=stream.seed,
                evaluate_every=stream.evaluate_every, verbose=verbose, A_init=A_init,
                tol=[p.tol for p in settings], checkpointers=checkpointers,
                checkpoint_every=int(opts.checkpoint_every or 0), checkpoint_metas=metas,
                resumes=cks, checkpoint_steps=int(opts.checkpoint_steps or 0), C_init=C_init,
                divergence_level=logging.INFO if opts.skip_diverged else logging.WARNING)
        fits = _fits(settings, attrs, results, solvers, metas, checkpointers, engine, timings)
        if opts.extras is not None:
            opts.extras(fits, engine, client)
    return fits


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


def _exact_path(store, kernel, p0: ModelSettings, stream: StreamSettings, checkpointers, metas,
                cks, opts: FitOptions):
    """``(plan, checkpoints, cks)``: the default's plan (``None`` for another algorithm) and,
    for the exact paths, their checkpoints (:func:`_exact_checkpoints`)."""
    plan = _default_path(store, kernel, p0, stream, cks)
    if plan is None and not is_exact(p0.algorithm) and p0.n_components != 0:
        return None, None, cks
    return (plan, *_exact_checkpoints(checkpointers, metas, cks, plan, opts))


def _exact_checkpoints(checkpointers, metas, cks, plan, opts: FitOptions):
    """The exact paths' checkpoints (dense and Krylov): ``(KrylovCheckpoints' settings, the
    checkpoints to resume from)``, both ``None`` without a run directory.

    A fresh fit writes its settings (with the default's path) as the checkpoint of step 0
    before any work, so that a run stopped or killed at any moment resumes (``--resume``
    reads them back); the Krylov solve adds its states (:class:`KrylovCheckpoints`). A resume
    from a step-0 checkpoint starts the solve again (``None``: nothing to restore)."""
    if checkpointers is None:
        return None, cks
    meta = metas[0]
    if plan is not None:
        meta["plan"] = plan.attrs()
    if cks is None:
        checkpointers[0].save(0, {}, meta)
    resume = cks[0] if cks and KRYLOV in cks[0].meta else None
    return ({"checkpointer": checkpointers[0], "meta": meta, "resume": resume,
             "every": int(opts.checkpoint_every or 0)}, None if resume is None else [resume])


def _krylov(engine, p0: ModelSettings, stream: StreamSettings, plan, A_init, checkpoints):
    """:func:`~dkha.fit.krylov.run_krylov` as the default's Krylov path (``plan``; exact
    evaluation only when asked) or ``algorithm="krylov"`` runs it; ``checkpoints``: the
    settings of its :class:`~dkha.fit.krylov.KrylovCheckpoints` (``None``: no run directory)."""
    if checkpoints is not None:
        checkpoints = KrylovCheckpoints(engine=engine, **checkpoints)
    if plan is not None:
        return run_krylov(engine, p0.n_components, seed=stream.seed, A_init=A_init,
                          tol=auto_krylov_tol(p0.tol),
                          with_evaluation=(p0.tol is not None or
                                           str(config.get("evaluation")) == "exact"),
                          tracked=stream.evaluate_every >= 0, checkpoints=checkpoints)
    return run_krylov(engine, p0.n_components, seed=stream.seed, A_init=A_init,
                      tol=p0.tol if p0.tol is not None else 1e-8,
                      with_evaluation=stream.evaluate_every >= 0, checkpoints=checkpoints)


def _fits(settings, attrs, results, solvers, metas, checkpointers, engine,
          timings) -> list[ModelFit]:
    """One :class:`ModelFit` per model, with the row engine's passes in its timings."""
    fits = []
    for i, (p, a, res, solver) in enumerate(zip(settings, attrs, results, solvers)):
        # and every tile pass of the engine (MK row, K'V, residuals): tasks, wall, waiting, bytes
        t = dict(timings, stream=res.wall_time, passes=list(engine.stats.passes),
                 replicas={"rebuilds": engine.stats.replica_rebuilds,
                           "moves": engine.stats.replica_moves})
        if res.failure is None:
            a = dict(a, top_eigenvalues=None if res.top_eigenvalues is None
                     else [float(v) for v in res.top_eigenvalues])
            if res.kept is not None:    # an earlier pass was better than the end: its state
                a["kept_state"] = dict(res.kept)
            if solver is not None:      # the gains as applied (eta0 and mu in units of κ̄)
                a.update(solver.effective_gains(), eta0_applied=solver.eta0,
                         start_deficit=metas[i].get("start_deficit"))
        fits.append(ModelFit(settings=p, attrs=a, result=res, mk=engine.mk, mkm=engine.mkm,
                             timings=t, solver=solver, meta=metas[i],
                             checkpointer=None if checkpointers is None else checkpointers[i]))
    return fits


def _fit_dense(store: DataStore, kernel, p: ModelSettings, stream: StreamSettings, attrs: dict,
               plan, meta: dict, checkpointer, opts: FitOptions) -> ModelFit:
    """The default fit's dense path (:func:`dkha.fit.dense.dense_fit`): in this process, no
    cluster (one only for ``opts.extras``, e.g. the component pictures of patch data)."""
    # a small matrix's products are too short for BLAS threads to pay: one thread, as inline
    # (the same bits; on a busy 2-core machine ARPACK on 1 000 samples took 0.05 s instead of 1.3)
    small = store.n_samples <= int(config.get("inline-samples"))
    try:
        with blas_limit(1) if small else contextlib.nullcontext():
            res, mk, mkm, stats = dense_fit(store.read(), kernel, p.n_components,
                                            seed=stream.seed)
    except Interrupted as exc:
        raise Interrupted(f"{exc}; " + (f"continue with {RESUME_HINT} (the dense path "
                                        "starts again: it keeps no partial state)"
                                        if checkpointer is not None else "run the command "
                                        "again (the dense path keeps no partial state)")) from None
    timings = {"centering": 0.0, "init": 0.0, "path": plan.attrs(), "stream": res.wall_time,
               "passes": list(stats.passes), "replicas": {"rebuilds": 0, "moves": 0},
               "projections": {"asked": None, "chosen": "dense", "reason": plan.reason}}
    a = dict(attrs, top_eigenvalues=[float(v) for v in res.top_eigenvalues])
    fit = ModelFit(settings=p, attrs=a, result=res, mk=mk, mkm=mkm, timings=timings,
                   solver=None, meta=meta, checkpointer=checkpointer)
    if opts.extras is not None:
        with client_for(stream.client) as client:
            opts.extras([fit], SimpleNamespace(store=store, mk=mk, mkm=mkm), client)
    return fit
