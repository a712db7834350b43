"""The coordinator of a batch fit: one kernel stream, one or several models, from one request.

:func:`fit_batch` is the one entry of every batch fit (``KernelHebbianPCA.fit``,
:func:`dkha.fit_together`, ``dkha fit``, ``dkha tune``, pipelines): given the
:class:`~dkha.fit.request.FitRequest` its estimator validated, it resolves the kernel on the data
and what each model runs (:func:`dkha.fit.plan.route`, the one resolution of ``auto``), opens
the run directories (:mod:`dkha.fit.run_dir`: checks, checkpoints, resume), connects to Dask,
builds the row engine, computes the MK row and the start, runs the block stream
(:func:`dkha.fit.kha_stream.run_batches`), the exact solver (:func:`dkha.fit.krylov.run_krylov`)
or the dense path (:func:`dkha.fit.dense.dense_fit`), writes each run directory and returns one
:class:`~dkha.fit.request.ModelFit` per model, which the estimators copy into their fitted
attributes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace

from distributed import Client

from dkha import schedule
from dkha.algorithms import AUTO, KRYLOV, is_exact
from dkha.config import Settings
from dkha.data.checkpoint import Checkpointer
from dkha.data.result import projection_array
from dkha.data.store import DataStore
from dkha.engine.budget import Layout
from dkha.engine.cluster import (
    blas_limit,
    blas_threads_for,
    client_for,
    cluster_stage,
    computes_on_gpu,
    names_a_cluster,
    release_free_heap,
)
from dkha.engine.content import check_finite, on_sample
from dkha.engine.rows import RowEngine
from dkha.errors import RESUME_HINT, Interrupted, ParameterError
from dkha.fit.dense import dense_fit
from dkha.fit.evaluate import projections
from dkha.fit.init import nystrom_coefficients, unit_norm_components
from dkha.fit.kha_stream import run_batches
from dkha.fit.krylov import KrylovCheckpoints, run_krylov
from dkha.fit.plan import (
    Plan,
    Route,
    auto_krylov_tol,
    choose_path,
    cluster_threads,
    passes_eta_line,
    plan_fit,
    probed_rate,
    route,
)
from dkha.fit.request import (
    FitRequest,
    ModelFit,
    ModelRequest,
    RunOptions,
    frozen_mapping,
    settings_of,
)
from dkha.fit.run_dir import (
    finished_attrs,
    open_runs,
    routed_attrs,
    run_attrs,
    settings_dropped_on_failure,
    write_runs,
)
from dkha.fit.spectrum import dense_shortcut, finalise_components
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


def resolve_kernel(store, kernel: str, seed: int, settings: Settings, client=None, **params):
    """The kernel with its parameters; a width of None (the gaussian's ``sigma``, the spec's
    ``width``) → the median-distance heuristic on a seeded sample of ``dkha.median-sample``
    rows of ``store`` (a :class:`DataStore` or any source with ``sample(n, seed)``; read and
    measured on a worker of ``client`` where its workers are other processes), times
    ``dkha.patch-sigma-factor`` (3) on image patches for a kernel whose spec widens it there
    (``widen_on_patches``: the gaussian, the width that keeps patch denoising level with linear
    patch PCA; benchmarks/denoise_photo.py, README); both of ``settings``."""
    k = make_kernel(kernel, **params)
    if getattr(store, "n_features", None) is not None:
        k = k.with_defaults(store.n_features)      # scikit-learn's gamma = 1/n_features
    if k.needs_width():
        median = on_sample(store, client, int(settings.median_sample), seed, median_distance,
                           settings=settings)
        patches = k.spec.widen_on_patches and "patch" in (getattr(store, "attrs", None) or {})
        factor = float(settings.patch_sigma_factor) if patches else 1.0
        k = k.with_width(factor * median)
        log.info("%s by the median-distance heuristic%s: %g", k.spec.width,
                 f" × {factor:g} (image patches)" if patches else "", k[k.spec.width])
    return k


def start(engine, settings: list[ModelRequest], exact: bool, cks, n_samples: int, seed: int):
    """``(settings, A_init, C_init, starts)``: the shared start (``None`` for the paper's random
    start or a resume) and the settings it leaves: for the KHA passes, the components the
    Nyström start found (fewer where ``K'`` has a lower rank; the exact solver solves for all
    it was asked, the start padded), and the default ``eta0`` of each model that has none:
    from a Nyström start, scaled to unit feature-space norm,
    :func:`~dkha.solvers.batch.warm_eta0` of its eigenvalue deficit; ``starts``: what each
    model's checkpoints record of it (the deficit, read back on a resume, and ``warm_gains``:
    the default gains for the start, so that a pass that does not improve on it stops the model
    at once). ``exact``: the exact solver runs (it takes the Nyström start as it is)."""
    p0 = settings[0]
    A_init = C_init = None
    starts = [{} for _ in settings]
    if p0.landmarks and cks is None:
        A_init, s = nystrom_coefficients(engine, p0.n_components, p0.landmarks, seed=seed,
                                         check_rank=not exact)
        # the landmark rows, freed, stay resident otherwise
        release_free_heap(8 * p0.landmarks * n_samples)
        # K' has that rank to the start's tolerance (its trace checked): the KHA passes keep
        # the start's components and the rest null; the exact solver still solves for all it
        # was asked (the start padded with random vectors), so components below the start's
        # rcond but above round-off are found, as a dense eigh finds them
        if not len(A_init) or (len(A_init) < p0.n_components and not exact):
            settings = [replace(p, n_components=len(A_init)) for p in settings]
            if not len(A_init):
                return settings, None, None, starts
        if not exact:     # unit norms: one pass for C = A K'
            A_init, C_init = unit_norm_components(A_init, projections(engine, A_init))
            deficit = start_deficit(s, eigenvalue_estimate(A_init, C_init))
            log.info("Nyström start: eigenvalue deficit %.3g", deficit)
            starts = [{"start_deficit": deficit, **({"warm_gains": True} if p.eta0 is None
                                                     else {})} for p in settings]
            settings = [p if p.eta0 is not None else
                        replace(p, eta0=warm_eta0(p.algorithm, deficit)) for p in settings]
    elif p0.support and cks is None:
        A_init = initial_coefficients(p0.n_components, n_samples, schedule.init_generator(seed),
                                      support=p0.support)
    if cks is not None and not exact:
        settings = [_resumed_components(p, ck) for p, ck in zip(settings, cks)]
        starts = [_resumed_start(p, ck) for p, ck in zip(settings, cks)]
        settings = [p if p.eta0 is not None else
                    replace(p, eta0=warm_eta0(p.algorithm, m["start_deficit"]))
                    for p, m in zip(settings, starts)]
    return settings, A_init, C_init, starts


def _resumed_components(p: ModelRequest, ck) -> ModelRequest:
    """A resumed model fits the components its checkpointed state holds: fewer than asked where
    the start found ``K'`` of a lower rank (:func:`start`; the run then holds the rest null)."""
    r = (ck.meta.get("state_scalars") or {}).get("r")
    return p if r is None or int(r) >= p.n_components else replace(p, n_components=int(r))


def _resumed_start(p: ModelRequest, ck) -> dict:
    """What a resumed model's checkpoints record of its start: for the default ``eta0``, the
    deficit the run started with (its gain follows from it)."""
    if p.eta0 is not None:
        return {}
    if ck.meta.get("start_deficit") is None:
        raise ParameterError(f"cannot resume {ck.path} with the default eta0: the "
                             "checkpoint does not record its start (an older dkha); "
                             "give --eta0")
    return {"start_deficit": float(ck.meta["start_deficit"]), "warm_gains": True}


def _solver(p: ModelRequest, n_samples: int) -> BatchKHA:
    return BatchKHA(p.algorithm, p.n_components, n_samples, eta0=p.eta0, mu=p.mu, xi=p.xi,
                    rho0=p.rho0, on_divergence=p.on_divergence, feature_norm=None,
                    gain_params=p.params.get("gain_params"))


def _check_data(store: DataStore, verbose: bool, *, client, settings: Settings) -> Progress:
    """Check that the data is finite (recorded at ingest, else read by the workers:
    :mod:`dkha.engine.content`); the stage after it is said once the path is known (connecting
    to Dask, starting its workers or running inline: :func:`~dkha.engine.cluster.cluster_stage`;
    the progress of the seconds before the first pass can show its own)."""
    stages = Progress(verbose, None, "checking the data (finite values)", unit="stage",
                      transient=True)
    try:
        check_finite(store, client, settings=settings)
    except BaseException:
        stages.close()      # a refused store leaves no bar open (heartbeats would repeat it)
        raise
    return stages


def _recorded_exact(opts: RunOptions) -> dict:
    """What a resumed run's newest checkpoint records of its stream (``exact``: the block rows,
    where the blocks were projected); empty for a fresh fit. Its meta only: open_runs reads and
    verifies the checkpoint's arrays (once)."""
    if not (opts.resume and opts.run_dirs):
        return {}
    meta = Checkpointer(opts.run_dirs[0]).newest_meta()
    return dict((meta or {}).get("exact", {}))


def _asked_projections(settings: Settings, n_models: int, opts: RunOptions) -> str:
    """Where the block projections are asked to be computed (a resume keeps the run's)."""
    asked = str(settings.projections)
    if n_models > 1 and asked == "workers":
        raise ParameterError("projections on the workers follow one model per stream; fit "
                             "several models together with projections='coordinator'")
    if asked == "auto":         # where the run projected before
        asked = str(_recorded_exact(opts).get("projections", asked))
    return asked


def _recorded_blocks(request: FitRequest) -> FitRequest:
    """The request with the block rows a resumed run recorded, where none are asked for: the
    blocks are the fit's arithmetic, and the stream's budget that sizes them may have changed
    since (dkha.memory-budget, a dkha of another default: 1 GiB gave 111 rows at l = 200 000,
    512 MiB since gives 55)."""
    if request.block_rows is not None:
        return request
    rows = _recorded_exact(request.run).get("block_rows")
    return request if rows is None else replace(request, block_rows=int(rows))


def _planned(request: FitRequest, kernel, first: Route, p0: ModelRequest, cks) -> Route:
    """The first model's route once the cost model is asked, where ``auto`` waits for it
    (:func:`dkha.fit.plan.route`). A scheduler the user named is reached first: its workers'
    threads price the blockwise passes, and an unreachable one is refused in one line whichever
    path would have been chosen. A resumed run (``cks``) keeps the path its checkpoint
    records."""
    if first.runs != AUTO:
        return first
    store, m = request.store, request.models[0]
    if cks and "plan" in cks[0].meta:
        plan = Plan.from_attrs(cks[0].meta["plan"])
    elif not names_a_cluster(request.client) or isinstance(request.client, Client):
        plan = plan_fit(store, kernel, p0, request.client, request.seed, request.settings)
    else:   # reached first: unreachable is refused
        with client_for(request.client, settings=request.settings) as client:
            plan = plan_fit(store, kernel, p0, client, request.seed, request.settings)
    return route(m.algorithm, m.params, m.n_components, store.n_samples, plan=plan)


def fit_batch(request: FitRequest) -> list[ModelFit]:
    """Fit every model of ``request`` in one kernel stream over its store (see the module
    docstring) and save each completed one in its run directory, if any.

    A diverged model's :class:`~dkha.fit.request.ModelFit` carries its ``failure`` (no
    ``alpha``, no run written); raising is the caller's choice (``request.run.skip_diverged``
    only quietens the divergence's log line).
    """
    started = time.perf_counter()
    store = request.store
    kernel = resolve_kernel(store, request.kernel, request.seed, request.settings,
                            client=request.client, **request.kernel_params)
    routes = [route(m.algorithm, m.params, m.n_components, store.n_samples)
              for m in request.models]
    settings = [settings_of(m, r, store.n_samples, request.settings)
                for m, r in zip(request.models, routes)]
    attrs = [run_attrs(request, m, p, r, kernel)
             for m, p, r in zip(request.models, settings, routes)]
    with settings_dropped_on_failure(request.run.run_dirs, request.run.resume):
        fits = _fit(request, kernel, settings, routes[0], attrs, started)
        for f in fits:
            if f.timings is not None:
                add_total(f.timings, time.perf_counter() - started)
        return write_runs(fits, request.run.run_dirs)


def _fit(request: FitRequest, kernel, settings: list[ModelRequest], first: Route,
         attrs: list[dict], started: float) -> list[ModelFit]:
    """:func:`fit_batch` once the settings and attrs are resolved: the fits, not yet saved."""
    request = _recorded_blocks(request)
    store, opts = request.store, request.run
    p0 = settings[0]
    asked = _asked_projections(request.settings, len(settings), opts)
    checkpointers, metas, cks = open_runs(store, settings, request, attrs, asked, opts,
                                          [m.recorded for m in request.models], request.settings)
    verbose = any(p.verbose for p in settings)
    if request.settings.compile_ahead:     # the solver's loops compile while the fit starts
        for algorithm in sorted({p.algorithm for p in settings}):
            compile_ahead(algorithm)
    stages = _check_data(store, verbose, client=request.client, settings=request.settings)
    # the stage bar is closed once the cluster is up, or by an error before (a bar left open
    # would be repeated by the heartbeat of a long-lived process)
    with stages, contextlib.ExitStack() as entering:
        first = _planned(request, kernel, first, p0, cks)
        attrs[0] = routed_attrs(attrs[0], first)
        if first.plan is not None:      # the checkpoints record the path (a resume keeps it)
            metas = [frozen_mapping(dict(m, plan=first.plan.attrs())) for m in metas]
        shortcut = (dense_shortcut(store.n_samples, p0.n_components)
                    if is_exact(first.runs) and p0.n_components > 0 else None)
        if shortcut is not None:        # the Krylov solver's dense eigh: said and saved
            attrs[0] = {**attrs[0], "path": "dense", "path_reason": shortcut}
            announce(f"path: dense ({shortcut})", verbose)
        elif first.plan is not None:     # the cost model's estimate, as an ETA (of the rest)
            announce(first.plan.eta_line(n_samples=store.n_samples,
                                         products=_products_done(cks)), verbose)
        checkpoints, cks = _exact_checkpoints(first, p0, checkpointers, metas, cks, opts)
        if first.runs == "dense":
            stages.close()
            return [_fit_dense(store, kernel, p0, request, attrs[0], first.plan, metas[0],
                               None if checkpointers is None else checkpointers[0], started)]
        stages.describe(cluster_stage(request.client, store.n_samples, request.settings))
        client = entering.enter_context(client_for(request.client, samples=store.n_samples,
                                                   settings=request.settings))
        entering.enter_context(blas_threads_for(
            client, request.settings, gpu=computes_on_gpu(client, request.settings.device)))
        cluster = entering.pop_all()
    with cluster:
        return _on_cluster(request, kernel, client, settings, first, attrs, asked,
                           (checkpointers, metas, cks, checkpoints), started)


def recorded_layout(cks) -> Layout | None:
    """The layout a resumed run's checkpoint records (None: a fresh fit, a checkpoint written
    before the row engine, an older dkha's): its tile grid and column groups, so the resume
    adds the same partial sums in the same order on any cluster."""
    return Layout.from_dict(cks[0].meta.get("layout")) if cks else None


def _on_cluster(request: FitRequest, kernel, client, settings, first: Route, attrs, asked,
                runs, started: float) -> list[ModelFit]:
    """The fit's passes on the cluster ``client``: the row engine, the MK row, the start, then
    the block stream or the exact solver."""
    store, opts = request.store, request.run
    checkpointers, metas, cks, checkpoints = runs
    verbose = any(p.verbose for p in settings)
    engine = RowEngine(store, kernel, client, replace(request.settings, projections=asked),
                       block_rows=request.block_rows, prefetch=request.prefetch,
                       models=len(settings), layout=recorded_layout(cks))
    engine.verbose = verbose
    bands = engine.bands            # GPU workers: the passes' plan is the device's
    plan_line = bands.describe() if bands is not None else engine.memory.describe()
    announce(plan_line, verbose)
    if first.plan is None and settings[0].n_components:   # a named algorithm's ETA
        line = _eta_line(request, kernel, client, first, settings[0], cks)
        if line is not None:
            announce(line, verbose)
    t0 = time.perf_counter()
    if cks is None:
        engine.compute_mk(center_sample=settings[0].center_sample, seed=request.seed)
    elif checkpoints is not None:   # the exact solver resumed: its centering row
        engine.set_mk(cks[0].arrays["mk"], float(cks[0].meta["mkm"]))
    t1 = time.perf_counter()
    exact = is_exact(first.runs)
    settings, A_init, C_init, starts = start(engine, settings, exact, cks, store.n_samples,
                                             request.seed)
    # what the start's passes dropped (its landmark rows, its A K' pass), before the stream
    release_free_heap(8 * (settings[0].landmarks or 0) * store.n_samples)
    p0 = settings[0]
    # seconds before the first pass (history wall times count the passes only), an earlier
    # attempt's added (its checkpoint's)
    times = phase_times(started, t0, t1, time.perf_counter(), cks)
    # the checkpoints' meta, built once: the projections' mode chosen and the layout the bits
    # follow (a resume keeps both), the start, this attempt's phases (every checkpoint after)
    metas = [frozen_mapping(dict(m, exact=dict(m["exact"], projections=engine.projections),
                                 layout=engine.layout.as_dict(), **st,
                                 times={k: times[k] for k in (*PHASES, "attempts")}))
             for m, st in zip(metas, starts)]
    timings = {**times,
               "projections": {"asked": asked, "chosen": engine.projections,
                               "reason": engine.projections_reason},
               "memory": engine.memory.as_dict(), "plan": plan_line,
               **({} if first.plan is None else {"path": first.plan.attrs()})}
    if bands is not None:
        timings["bands"] = bands.as_dict()
    if exact or p0.n_components == 0:  # 0: K' = 0
        checkpoints = None if checkpoints is None else dict(checkpoints, meta=metas[0])
        results = [_krylov(engine, p0, request, first.plan, A_init, checkpoints)]
        solvers = [None]
    else:
        solvers = [_solver(p, store.n_samples) for p in settings]
        handed = [A_init, C_init]       # dropped by run_batches once the solvers hold copies
        del A_init, C_init
        results = run_batches(
            engine, solvers, n_steps=p0.n_steps, seed=request.seed,
            evaluate_every=request.evaluate_every, verbose=verbose, handed=handed,
            tol=[p.tol for p in settings], checkpointers=checkpointers,
            checkpoint_every=int(opts.checkpoint_every or 0), checkpoint_metas=metas,
            resumes=cks, checkpoint_steps=int(opts.checkpoint_steps or 0),
            divergence_level=logging.INFO if opts.skip_diverged else logging.WARNING)
    # and every tile pass of the engine (MK row, K'V, residuals): tasks, wall, waiting, bytes
    replicas = {"rebuilds": engine.stats.replica_rebuilds, "moves": engine.stats.replica_moves}
    return [model_fit(store, kernel, p, finished_attrs(a, res, solver, meta), res, engine.mk,
                      engine.mkm, dict(timings, stream=res.wall_time,
                                       passes=list(engine.stats.passes), replicas=replicas),
                      solver, meta,
                      None if checkpointers is None else checkpointers[i])
            for i, (p, a, res, solver, meta) in enumerate(zip(settings, attrs, results, solvers,
                                                              metas))]


def _products_done(cks) -> int:
    """The Krylov products a resumed checkpoint holds (0: none, or a fresh fit)."""
    return int(cks[0].meta.get(KRYLOV, {}).get("products", 0)) if cks else 0


def _eta_line(request: FitRequest, kernel, client, first: Route, p0: ModelRequest,
              cks) -> str | None:
    """The cost model's estimate of a named algorithm's fit (the KHA iterations' passes left,
    or the Krylov solve's rest) as an ETA line; ``None`` where the Krylov solver's dense
    shortcut was said instead."""
    store = request.store
    client = client if isinstance(client, Client) else None     # tasks inline: probed here
    if is_exact(first.runs):
        if dense_shortcut(store.n_samples, p0.n_components):
            return None
        plan = choose_path(store.n_samples, p0.n_components,
                           rate=probed_rate(store, kernel, client, request.seed,
                                            request.settings),
                           threads=cluster_threads(client), dense_bytes=0,
                           landmarks=p0.landmarks)      # its krylov estimate
        return plan.eta_line(
            n_samples=store.n_samples, products=_products_done(cks))
    done = cks[0].step if cks else 0
    return passes_eta_line(store, kernel, client, p0.algorithm,
                           (p0.n_steps - done) / store.n_samples, request.seed,
                           request.settings, landmarks=p0.landmarks, resumed=bool(cks))


def model_fit(store: DataStore, kernel, settings: ModelRequest, attrs: dict, res, mk, mkm,
              timings: dict, solver, meta: dict, checkpointer) -> ModelFit:
    """One model's :class:`~dkha.fit.request.ModelFit`: a completed fit's components as kept
    (:func:`~dkha.fit.spectrum.finalise_components`: order and signs fixed, null ones counted),
    its training projections with the store's coordinates."""
    fit = ModelFit(settings=settings, attrs=attrs, result=res, mk=mk, mkm=mkm, timings=timings,
                   solver=solver, meta=meta, kernel=kernel, checkpointer=checkpointer)
    if res.failure is not None:
        return fit
    alpha, eigenvalue, projection, null = finalise_components(
        res.alpha, res.eigenvalue, res.projection, r=int(attrs.get("n_components", 0)))
    return replace(fit, alpha=alpha, eigenvalues=eigenvalue, null_components=null,
                   projection=projection_array(projection, store))


def _exact_checkpoints(first: Route, p0: ModelRequest, checkpointers, metas, cks,
                       opts: RunOptions):
    """The exact paths' checkpoints (dense and Krylov): ``(KrylovCheckpoints' settings but its
    meta, the checkpoints to resume from)``, both ``None`` without a run directory;
    ``(None, cks)`` where the KHA iterations run (they checkpoint in their block stream).

    A fresh fit writes its settings (with the default's path) as the checkpoint of step 0
    before any work, so that a run stopped or killed at any moment resumes (``--resume``
    reads them back); the Krylov solve adds its states (:class:`KrylovCheckpoints`). A resume
    from a step-0 checkpoint starts the solve again (``None``: nothing to restore)."""
    if first.plan is None and not is_exact(first.runs) and p0.n_components != 0:
        return None, cks
    if checkpointers is None:
        return None, cks
    if cks is None:
        checkpointers[0].save(0, {}, dict(metas[0]))
    resume = cks[0] if cks and KRYLOV in cks[0].meta else None
    return ({"checkpointer": checkpointers[0], "resume": resume,
             "every": int(opts.checkpoint_every or 0)}, None if resume is None else [resume])


def _krylov(engine, p0: ModelRequest, request: FitRequest, plan, A_init, checkpoints):
    """:func:`~dkha.fit.krylov.run_krylov` as the default's Krylov path (``plan``; exact
    evaluation only when asked) or ``algorithm="krylov"`` runs it; ``checkpoints``: the
    settings of its :class:`~dkha.fit.krylov.KrylovCheckpoints` (``None``: no run directory)."""
    if checkpoints is not None:
        checkpoints = KrylovCheckpoints(engine=engine, **checkpoints)
    if plan is not None:
        return run_krylov(engine, p0.n_components, seed=request.seed, A_init=A_init,
                          tol=auto_krylov_tol(p0.tol),
                          with_evaluation=(p0.tol is not None or
                                           str(engine.settings.evaluation) == "exact"),
                          tracked=request.evaluate_every >= 0, checkpoints=checkpoints)
    return run_krylov(engine, p0.n_components, seed=request.seed, A_init=A_init,
                      tol=p0.tol if p0.tol is not None else 1e-8,
                      with_evaluation=request.evaluate_every >= 0, checkpoints=checkpoints)


def _fit_dense(store: DataStore, kernel, p: ModelRequest, request: FitRequest, attrs: dict,
               plan: Plan, meta: dict, checkpointer, started: float) -> ModelFit:
    """The default fit's dense path (:func:`dkha.fit.dense.dense_fit`): in this process, no
    cluster."""
    # a small matrix's products are too short for BLAS threads to pay: one thread, as inline
    # (the same bits; on a busy 2-core machine ARPACK on 1 000 samples took 0.05 s instead of 1.3)
    small = store.n_samples <= int(request.settings.inline_samples)
    t0 = time.perf_counter()
    try:
        with blas_limit(1) if small else contextlib.nullcontext():
            res, mk, mkm, stats = dense_fit(store.read(), kernel, p.n_components,
                                            seed=request.seed)
    except Interrupted as exc:
        raise Interrupted(f"{exc}; " + (f"continue with {RESUME_HINT} (the dense path "
                                        "starts again: it keeps no partial state)"
                                        if checkpointer is not None else "run the command "
                                        "again (the dense path keeps no partial state)")) from None
    # (its centering is in the solve's seconds: stream)
    timings = {"startup": t0 - started, "centering": 0.0, "init": 0.0, "attempts": 1,
               "path": plan.attrs(), "stream": res.wall_time,
               "passes": list(stats.passes), "replicas": {"rebuilds": 0, "moves": 0},
               "projections": {"asked": None, "chosen": "dense", "reason": plan.reason}}
    return model_fit(store, kernel, p, finished_attrs(attrs, res, None, meta), res, mk, mkm,
                     timings, None, meta, checkpointer)


#: the seconds of a fit before its passes (timings.json): startup (the data checked, the path
#: planned, the cluster reached or started), centering (the MK row), init (the start state)
PHASES = ("startup", "centering", "init")


def phase_times(started: float, t0: float, t1: float, t2: float, cks) -> dict:
    """:data:`PHASES`' seconds of this attempt (``started`` → ``t0`` → ``t1`` → ``t2``), added
    to those of the attempts before that the resumed checkpoint records (``attempts`` counts
    them, ``earlier`` is their seconds to it: phases and passes)."""
    recorded = (cks[0].meta.get("times") or {}) if cks else {}
    times = {k: float(recorded.get(k, 0.0)) + v
             for k, v in zip(PHASES, (t0 - started, t1 - t0, t2 - t1))}
    times["attempts"] = int(recorded.get("attempts", 0)) + 1
    times["earlier"] = (sum(float(recorded.get(k, 0.0)) for k in PHASES)
                        + float(cks[0].meta.get("fit_seconds", 0.0)) if cks else 0.0)
    return times


def add_total(timings: dict, elapsed: float) -> None:
    """The fit's ``total`` seconds in ``timings``: this attempt's ``elapsed`` seconds and the
    attempts' before (``earlier``), with ``other``, the rest besides :data:`PHASES` and
    ``stream`` (the passes): evaluations, checkpoints, the end's work. The phases, ``stream``
    and ``other`` add up to ``total``."""
    total = float(timings.get("earlier", 0.0)) + elapsed
    parts = sum(float(timings.get(k, 0.0)) for k in (*PHASES, "stream"))
    timings["other"] = max(0.0, total - parts)
    timings["total"] = parts + timings["other"]
