"""The online family's one driver, :func:`fit_online`, which ``OnlineKernelPCA.fit`` (and
through it ``dkha fit`` and pipelines) and ``partial_fit`` each call once: one frozen
:class:`OnlineRequest` in, one frozen :class:`OnlineFit` out. It resolves the kernel and the
scales (:func:`scaled`) on the data, applies the blocks to an
:class:`~dkha.solvers.online.OnlineKHA` in the one loop :func:`run_online` under the one block
driver (:class:`dkha.fit.control.BlockDriver`: stop, checkpoints, progress, timing): ``fit``'s
``n_steps`` samples in the seeded schedule's order (:func:`dkha.data.sources.stream_blocks`,
read ahead), a history entry every ``every`` steps, with checkpoints, resume and the run
directory written (:func:`dkha.fit.run_dir.run_dataset`); ``partial_fit``'s array once in its
own order, continuing the :class:`OnlineFit` it is given, one history entry a call."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from itertools import pairwise

import numpy as np

from dkha import schedule
from dkha.config import Settings
from dkha.data import cf
from dkha.data.checkpoint import open_fit
from dkha.data.sources import seeded_rows, stream_blocks
from dkha.engine.cluster import blas_limit
from dkha.errors import ParameterError
from dkha.fit.ac_index import ACReference, reference_of
from dkha.fit.control import BlockDriver
from dkha.fit.coordinator import resolve_kernel
from dkha.fit.evaluate import variance_of
from dkha.fit.request import RunOptions, frozen_mapping
from dkha.fit.run_dir import data_attrs, run_dataset, saved_attrs, store_path, write_run
from dkha.kernels import Kernel
from dkha.progress import announce
from dkha.solvers.online import INIT_STD, NU_RELATIVE, OnlineKHA, sample_scales
from dkha.version import __version__

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineSettings:
    """One online model as its estimator validated it: the rows of the parameter table the
    solver and the stream read (``tests/test_online_driver.py`` holds the fields to the table),
    ``gain_decay``'s default set where ``tau`` is not given; then, the same type, as the fit
    resolved it on the data (:func:`scaled`: ``nu``'s default, ``feature_norm`` and ``gain``)."""

    algorithm: str
    n_components: int
    eta0: float
    gain_decay: float | None
    tau: float | None
    nu: float | None
    max_members: int
    eigenvalue_samples: int
    center: bool
    on_divergence: str = "backoff"
    #: the unit of ``eta0``: the typical feature-space norm of the data (resolved by the fit)
    feature_norm: float | None = None
    #: the step size as applied, ``eta0 / feature_norm`` (resolved by the fit)
    gain: float | None = None


@dataclass(frozen=True)
class OnlineRequest:
    """Everything one call of :func:`fit_online` is asked for, as the estimator validated it."""

    #: a :class:`~dkha.data.store.DataStore` or an :class:`~dkha.data.sources.ArraySource`
    source: object
    #: the kernel as asked: a name and its parameters (``sigma=None``: the median-distance
    #: heuristic, :func:`dkha.fit.coordinator.resolve_kernel`)
    kernel: object
    kernel_params: Mapping
    model: OnlineSettings
    #: every ``dkha.*`` setting, read once by the estimator (``block_rows``, ``prefetch``,
    #: ``median_sample``, ``online_blas_threads``…): nothing below reads the configuration
    settings: Settings
    seed: int
    #: steps to stream in the seeded schedule's order (``fit``); ``None``: the source's rows
    #: once, in their order, after those of the state continued (``partial_fit``)
    n_steps: int | None = None
    #: steps between history entries (a scheduled fit's)
    every: int = 0
    verbose: bool = False
    ac_reference: object = None
    #: ``run_dirs``: the one run directory (or ``None``); checkpoints and resume as the batch
    #: fit's (``checkpoint_every`` in steps)
    run: RunOptions = field(default_factory=RunOptions)
    #: the estimator's parameters as it holds them (``get_params``): the saved attrs' values
    #: where the fit resolves none
    params: Mapping = field(default_factory=frozen_mapping, repr=False)
    #: the parameters a bare resume repeats (JSON values; recorded in the checkpoints)
    recorded: Mapping = field(default_factory=frozen_mapping, repr=False)
    #: ``(parameter, attr)`` of every saved row of the estimator's parameter table
    saved: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):     # read-only copies: the fit does not change its request
        for name in ("kernel_params", "params", "recorded"):
            object.__setattr__(self, name, frozen_mapping(getattr(self, name)))


@dataclass(frozen=True)
class OnlineFit:
    """The outcome of :func:`fit_online`: the state as it ended (the solver, which a later
    ``partial_fit`` continues in place) and what the estimator copies."""

    solver: OnlineKHA
    #: the settings as resolved (:func:`scaled`)
    settings: OnlineSettings
    kernel: Kernel
    history: tuple[dict, ...]
    wall_time: float
    stream_stats: Mapping
    reference: ACReference | None
    eigenvalues: np.ndarray
    #: samples streamed so far
    n_steps: int
    #: the attrs saved with the run
    attrs: Mapping

    def __post_init__(self):     # read-only copies
        for name in ("stream_stats", "attrs"):
            object.__setattr__(self, name, frozen_mapping(getattr(self, name)))
        object.__setattr__(self, "history", tuple(self.history))

    def __reduce__(self):       # a fitted estimator pickles (a mapping proxy does not)
        return type(self), tuple(dict(v) if isinstance(v, Mapping) else v
                                 for v in (getattr(self, f.name) for f in fields(self)))


def fit_online(request: OnlineRequest, state: OnlineFit | None = None) -> OnlineFit:
    """The one online driver (module docstring): ``state`` continued, or a new solver of
    ``request`` (its kernel and scales resolved on its source), streamed by :func:`run_online`
    in the schedule's order (``request.n_steps``) or the source's (``None``)."""
    if state is None:
        source, seed = request.source, request.seed
        kernel = resolve_kernel(source, request.kernel, seed, request.settings,
                                **request.kernel_params)
        p = scaled(request.model, source, kernel, seed, request.settings.median_sample)
        state = OnlineFit(new_solver(p, source.n_features, kernel, seed), p, kernel, (), 0.0,
                          {}, None, None, 0, {})
    return (_stream if request.n_steps is None else _schedule)(request, state)


def _schedule(request: OnlineRequest, state: OnlineFit) -> OnlineFit:
    """``request.n_steps`` samples of its source in the seeded order, a history entry every
    ``request.every`` steps, with checkpoints and resume in its run directory, which is
    written at the end (:func:`~dkha.fit.run_dir.run_dataset`, ``write_run``)."""
    source, seed, n_steps, opts = request.source, request.seed, request.n_steps, request.run
    solver, kernel, p = state.solver, state.kernel, state.settings
    run_dir = opts.run_dirs[0] if opts.run_dirs else None
    attrs = run_attrs(request, p, kernel, store_path(source), source.n_samples,
                      source.n_features, n_steps)
    checkpoint_every = int(opts.checkpoint_every or 0)
    # the block boundaries (hence the rounding) depend on these too
    block_rows, prefetch = int(request.settings.block_rows), int(request.settings.prefetch)
    exact = {"block_rows": block_rows, "evaluate_every": request.every,
             "ac_reference": describe_reference(request.ac_reference)}
    checkpointer, ck, ck_meta = open_fit(run_dir, attrs, overwrite=opts.overwrite,
                                         resume=opts.resume, checkpoint_every=checkpoint_every,
                                         exact=exact, identity=opts.identity,
                                         repeat={"params": dict(request.recorded),
                                                 "checkpoint_steps": checkpoint_every})
    reference = ac_reference_for(request.ac_reference, source, kernel, p.n_components, seed)
    solver.stream_length = source.n_samples
    sample = source.sample(p.eigenvalue_samples, seed)
    history, stats, seconds = [], {}, 0.0
    if ck is not None:
        solver.restore({k[len("state."):]: v for k, v in ck.arrays.items()
                        if k.startswith("state.")}, ck.meta["state_scalars"])
        history = list(ck.meta["history"])
        solver.backoffs = list(ck.meta.get("backoffs", []))
        seconds = float(ck.meta["fit_seconds"])
        stats = dict(ck.meta["stream_stats"])
        log.info("resuming at step %d from %s", solver.state.step, ck.path)

    def save(t: int, pass_end_pending: bool) -> None:
        arrays, scalars = solver.snapshot()
        meta = dict(ck_meta, history=history, fit_seconds=driver.seconds,
                    backoffs=solver.backoffs, stream_stats=stats, state_scalars=scalars,
                    n_steps=n_steps)
        checkpointer.save(scalars["step"], {f"state.{k}": v for k, v in arrays.items()}, meta)

    def blocks(start: int, stop: int):
        return ((idx, rows) for _, _, idx, rows in stream_blocks(
            source, seed, start, stop, block_rows, prefetch, stats))

    # among the first lines, as the batch paths' ETA: the cost model has none for a stream
    # whose every step costs what its growing dictionary holds
    announce(f"estimate: none for {p.algorithm} (no cost model for the online algorithms: "
             "each step's cost follows the dictionary it grows; the progress bar gives the "
             "time left)", request.verbose)
    driver = BlockDriver(n_steps, solver.state.step, desc=p.algorithm, verbose=request.verbose,
                         save=None if checkpointer is None else save,
                         checkpoint_steps=checkpoint_every, seconds=seconds)
    l, start, every = source.n_samples, solver.state.step, request.every
    # stretches between history entries: to each multiple of every steps, and to n_steps
    bounds = [start, *range((start // every + 1) * every, n_steps, every), n_steps]
    stretches = list(pairwise(bounds)) if start < n_steps else []
    try:
        # BLAS threads limited while streaming (dkha.online-blas-threads, default 1): the
        # per-block products are small (b × m); on a busy machine more were ten times slower
        with blas_limit(int(request.settings.online_blas_threads)):
            for stop in run_online(solver, driver, blocks, stretches, l):
                entry = history_entry(solver, reference, sample, driver.seconds, l)
                history.append(entry)
                if np.isfinite(entry["ac_index"]):
                    driver.show(ac=f"{entry['ac_index']:.3f}", members=entry["members"])
                driver.between_blocks(stop, stop // l + 1)
    finally:
        driver.close()
    eigenvalues = eigenvalues_of(solver, sample)
    attrs["history"] = cf.history_line(attrs)    # CF's history: when the fit ended, what ran
    if run_dir is not None:     # the run written, its spent checkpoints cleared
        write_run(run_dir, run_dataset(history, eigenvalues, attrs, solver=solver), None,
                  spent=checkpointer)
    return OnlineFit(solver, p, kernel, history, driver.seconds, stats, reference, eigenvalues,
                     n_steps, attrs)


def _stream(request: OnlineRequest, state: OnlineFit) -> OnlineFit:
    """The rows of ``request.source`` (an array) once, in their order, after the ``state``'s
    samples (their stream positions its ``n_steps`` on), one history entry at the end."""
    X, solver, p = request.source.X, state.solver, state.settings
    seen, stop = state.n_steps, state.n_steps + len(X)
    sample = seeded_rows(X, p.eigenvalue_samples, request.seed)
    index, b = np.arange(seen, stop), int(request.settings.block_rows)

    def blocks(start: int, stop: int):
        return ((index[a:a + b], X[a:a + b]) for a in range(0, len(X), b))

    driver = BlockDriver(stop, seen, desc=p.algorithm, verbose=False, seconds=state.wall_time)
    try:
        with blas_limit(int(request.settings.online_blas_threads)):
            for _ in run_online(solver, driver, blocks, [(seen, stop)], stop):
                pass
    finally:
        driver.close()
    # the history entry after the BLAS limit, as the stream's always was
    entry = history_entry(solver, state.reference, sample, driver.seconds, None)
    attrs = run_attrs(request, p, state.kernel, "<stream>", stop, solver.n_features, stop)
    attrs["history"] = cf.history_line(attrs)
    return replace(state, history=(*state.history, entry), wall_time=driver.seconds,
                   eigenvalues=eigenvalues_of(solver, sample), n_steps=stop, attrs=attrs)


def run_online(solver: OnlineKHA, driver: BlockDriver,
               blocks: Callable[[int, int], Iterable[tuple[np.ndarray, np.ndarray]]],
               stretches: Iterable[tuple[int, int]], pass_length: int) -> Iterator[int]:
    """The one online loop: for each stretch ``(start, stop)`` the blocks ``(index, rows)`` of
    ``blocks(start, stop)`` applied to ``solver``, then ``stop`` yielded (the caller records
    its history entry there); between blocks the driver checkpoints and stops (passes of
    ``pass_length`` steps in its messages)."""
    for start, stop in stretches:
        driver.start()
        for idx, rows in blocks(start, stop):
            solver.apply_block(rows, idx)
            driver.advance(len(idx))
            t = solver.state.step
            if t < stop:  # a stretch's end checkpoints after its history entry
                driver.between_blocks(t, t // pass_length + 1)
        driver.stop_clock()
        yield stop


def run_attrs(request: OnlineRequest, p: OnlineSettings, kernel: Kernel, store: str,
              n_samples: int, n_features: int, n_steps: int) -> dict:
    """The attrs saved with the components: every saved row of the estimator's table
    (``request.saved``) with its value as resolved (``p``, the seed, the kernel's name) or, where
    the fit resolves none, as asked (``request.params``), and the run's."""
    attrs = saved_attrs(request.saved, dict(vars(p), seed=int(request.seed)), request.params,
                        kernel)
    attrs.update(feature_norm=p.feature_norm, gain=p.gain, learning_rate=(
        "eta0/(1+s/tau)" if p.tau is not None else "eta0*gain_decay**s"),
        **data_attrs(store, n_samples, n_features, n_steps), init="random",
        dkha_version=__version__)
    return attrs


def scaled(p: OnlineSettings, source, kernel: Kernel, seed: int, n_sample: int
           ) -> OnlineSettings:
    """``p`` with the scales read off a seeded sample of ``n_sample`` rows of the data (the
    sigma heuristic's, ``dkha.median-sample``): the default ``nu`` (:data:`NU_RELATIVE` × the
    variance in feature space) and the unit of ``eta0``
    (:func:`~dkha.solvers.online.sample_scales`)."""
    sample = source.sample(int(n_sample), seed)
    variance, unit = sample_scales(kernel.block(sample, sample))
    p = replace(p, feature_norm=unit, gain=p.eta0 / unit)
    if p.nu is None:
        if not (np.isfinite(variance) and variance > 0):
            raise ParameterError(
                f"the default nu needs the data's spread in feature space, and the {len(sample)} "
                "sample(s) it was measured on coincide there (a first partial_fit batch of "
                "one sample, duplicates, or a kernel width far too large); give nu")
        p = replace(p, nu=NU_RELATIVE * variance)
        log.info("nu = %g × the variance in feature space %.4g = %.4g", NU_RELATIVE,
                 variance, p.nu)
    return p


def new_solver(p: OnlineSettings, n_features: int, kernel: Kernel, seed: int) -> OnlineKHA:
    """The online solver of resolved settings ``p`` (its seeded initial coefficients): a named
    algorithm runs its paper's update from the first sample; ``auto`` is exact on what it has
    seen while that lies in its dictionary's span (:mod:`dkha.solvers.online_exact`), ON-KHA
    from the first sample outside (:attr:`dkha.algorithms.AlgorithmSpec.exact_span`)."""
    a_init = INIT_STD * schedule.init_generator(seed).standard_normal(p.n_components)
    return OnlineKHA(p.algorithm, p.n_components, n_features, kernel, nu=p.nu,
                     max_members=p.max_members, eta0=p.gain, gamma=p.gain_decay, tau=p.tau,
                     center=p.center, a_init=a_init, on_divergence=p.on_divergence)


def ac_reference_for(ac_reference, source, kernel: Kernel, r: int,
                     seed: int) -> ACReference | None:
    """The AC reference asked for: ``None``/``False`` none, ``True`` exact KPCA on (a seeded
    subset of) the data, else :func:`dkha.fit.ac_index.reference_of`'s (an
    :class:`ACReference` as is, an array of samples)."""
    if ac_reference is None or ac_reference is False:
        return None
    return reference_of(source if ac_reference is True else ac_reference, kernel, r, seed=seed)


def describe_reference(ac_reference) -> str | None:
    """What a checkpoint records of the AC reference (arrays by a digest of their bytes)."""
    if ac_reference is None or ac_reference is False:
        return None
    if ac_reference is True:
        return "data"
    if isinstance(ac_reference, ACReference):
        return "ACReference"
    arr = np.ascontiguousarray(ac_reference, dtype=np.float64)
    return f"array {arr.shape} sha256 {hashlib.sha256(arr.tobytes()).hexdigest()[:16]}"


def history_entry(solver: OnlineKHA, reference: ACReference | None, sample, wall_time: float,
                  n_samples: int | None) -> dict:
    """The history entry of the solver's state now (the AC index against ``reference``, the
    explained variance on ``sample``; ``n_samples`` ``None``: a stream, no passes)."""
    st = solver.state
    ac = float("nan")
    if reference is not None and st.m:
        ac = reference.score(solver.alpha(), solver.dictionary())
    passes = 0 if n_samples is None else st.step // n_samples
    variance = (variance_of(solver.transform(sample)) if st.m and sample is not None
                else np.full(solver.r, np.nan))
    log.info("step %d: %d members, AC %.4f", st.step, st.m, ac)
    return {"pass": int(passes), "step": int(st.step),
            "error": float("nan"), "error_min": float("nan"), "excess": float("nan"),
            "wall_time": float(wall_time), "ac_index": ac, "members": int(st.m),
            "explained_variance": variance}


def eigenvalues_of(solver: OnlineKHA, sample: np.ndarray) -> np.ndarray:
    """The variance of ``sample`` along each unit component (NaN before any member)."""
    if not solver.n_members:
        return np.full(solver.r, np.nan)
    Y = solver.transform(sample)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.mean(Y**2, axis=0) / solver.component_norms()**2
