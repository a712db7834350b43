"""The online coordinator: :func:`fit_online` (the one entry of ``OnlineKernelPCA.fit``,
``dkha fit`` and pipelines) and its loop :func:`run_online`: the seeded schedule's blocks of samples
(:func:`dkha.data.sources.stream_blocks`, read ahead on a background thread) applied to an
:class:`~dkha.solvers.online.OnlineKHA`, a history entry every ``every`` steps, under the one block
driver (:class:`dkha.fit.control.BlockDriver`: stop, checkpoints, progress, timing)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from dkha import schedule
from dkha.data import result
from dkha.data.checkpoint import Checkpointer, open_fit
from dkha.data.sources import stream_blocks
from dkha.data.store import DataStore
from dkha.engine.cluster import blas_limit
from dkha.errors import ParameterError
from dkha.fit.ac_index import DEFAULT_REFERENCE_SAMPLES, ACReference
from dkha.fit.control import BlockDriver
from dkha.fit.evaluate import variance_of
from dkha.fit.request import RunOptions, frozen_mapping
from dkha.fit.run_dir import write_run
from dkha.kernels import Kernel
from dkha.solvers.online import INIT_STD, NU_RELATIVE, OnlineKHA, sample_scales

log = logging.getLogger(__name__)



def coordinator_threads(threads: int):
    """Limit BLAS threads while streaming (``dkha.online-blas-threads``, default 1).

    The per-block products are small (``b × m``); on a shared or busy machine several BLAS
    threads made them ten times slower here, not faster.
    """
    return blas_limit(int(threads))


def run_online(solver, source, driver: BlockDriver, *, seed: int, n_steps: int, every: int,
               block_rows: int, prefetch: int, blas_threads: int, stats: dict,
               record: Callable[[], dict]) -> None:
    """Stream steps ``solver.state.step .. n_steps - 1`` of the schedule of ``seed`` over
    ``source`` into ``solver`` (on ``blas_threads`` BLAS threads), calling ``record()`` (which
    returns the history entry) after every ``every`` steps and at the end; between blocks the
    driver checkpoints and stops."""
    l = source.n_samples
    start = solver.state.step
    with coordinator_threads(blas_threads):
        while start < n_steps:
            stop = min(n_steps, (start // every + 1) * every)
            driver.start()
            for _, _, idx, rows in stream_blocks(source, seed, start, stop, block_rows,
                                                 prefetch, stats):
                solver.apply_block(rows, idx)
                driver.advance(len(idx))
                t = solver.state.step
                if t < stop:  # a segment's end checkpoints after its history entry
                    driver.between_blocks(t, t // l + 1)
            driver.stop_clock()
            start = stop
            entry = record()
            if np.isfinite(entry["ac_index"]):
                driver.show(ac=f"{entry['ac_index']:.3f}", members=entry["members"])
            driver.between_blocks(stop, stop // l + 1)


def scaled(p: dict, source, kernel: Kernel, seed: int, n_sample: int) -> dict:
    """``p`` with the scales read off a seeded sample of ``n_sample`` rows of the data (the
    sigma heuristic's, ``dkha.median-sample``): the default ``nu`` (:data:`NU_RELATIVE` × the
    variance in feature space) and the unit of ``eta0``
    (:func:`~dkha.solvers.online.sample_scales`)."""
    sample = source.sample(int(n_sample), seed)
    variance, unit = sample_scales(kernel.block(sample, sample))
    p = dict(p, feature_norm=unit, gain=p["eta0"] / unit)
    if p["nu"] is None:
        if not (np.isfinite(variance) and variance > 0):
            raise ParameterError(
                f"the default nu needs the data's spread in feature space, and the {len(sample)} "
                "sample(s) it was measured on coincide there (a first partial_fit batch of "
                "one sample, duplicates, or a kernel width far too large); give nu")
        p["nu"] = NU_RELATIVE * variance
        log.info("nu = %g × the variance in feature space %.4g = %.4g", NU_RELATIVE,
                 variance, p["nu"])
    return p


def new_solver(p: dict, n_features: int, kernel: Kernel, seed: int) -> OnlineKHA:
    """The online solver of resolved settings ``p`` (its seeded initial coefficients): a named
    algorithm runs its paper's update from the first sample; ``auto`` is exact on what it has
    seen while that lies in its dictionary's span (:mod:`dkha.solvers.online_exact`), ON-KHA
    from the first sample outside (:attr:`dkha.algorithms.AlgorithmSpec.exact_span`)."""
    a_init = INIT_STD * schedule.init_generator(seed).standard_normal(p["n_components"])
    return OnlineKHA(p["algorithm"], p["n_components"], n_features, kernel, nu=p["nu"],
                     max_members=p["max_members"], eta0=p["gain"], gamma=p["gain_decay"],
                     tau=p["tau"], center=p["center"], a_init=a_init,
                     on_divergence=p["on_divergence"])


def ac_reference_for(ac_reference, source, kernel: Kernel, r: int,
                     seed: int) -> ACReference | None:
    """The AC reference asked for: ``None``/``False`` none, an :class:`ACReference` as is,
    ``True`` exact KPCA on (a seeded subset of) the data, else an array of samples."""
    if ac_reference is None or ac_reference is False:
        return None
    if isinstance(ac_reference, ACReference):
        return ac_reference
    if ac_reference is True:
        if isinstance(source, DataStore):
            return ACReference.from_store(source, kernel, r, seed=seed)
        Xr = source.X if source.n_samples <= DEFAULT_REFERENCE_SAMPLES else \
            source.sample(DEFAULT_REFERENCE_SAMPLES, seed)
        return ACReference.from_data(Xr, kernel, r)
    return ACReference.from_data(np.asarray(ac_reference, dtype=np.float64), kernel, r)


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


def seeded_rows(X: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``X`` itself up to ``n`` rows, else ``n`` of its rows drawn by ``seed``, in order."""
    if len(X) <= n:
        return X
    return X[np.sort(np.random.default_rng(seed).choice(len(X), n, replace=False))]


def eigenvalues_of(solver: OnlineKHA, sample: np.ndarray) -> np.ndarray:
    """The variance of ``sample`` along each unit component (NaN before any member)."""
    if not solver.n_members:
        return np.full(solver.r, np.nan)
    Y = solver.transform(sample)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.mean(Y**2, axis=0) / solver.component_norms()**2


@dataclass
class OnlineFit:
    """The outcome of :func:`fit_online`."""

    solver: OnlineKHA
    history: list
    wall_time: float
    stream_stats: dict
    reference: ACReference | None
    #: the seeded sample the history's explained variance was measured on
    variance_sample: np.ndarray
    eigenvalues: np.ndarray
    n_steps: int
    checkpointer: Checkpointer | None = field(default=None, repr=False)


@dataclass(frozen=True)
class OnlineRequest:
    """Everything one online fit is asked for, as its estimator validated it."""

    source: object
    kernel: Kernel
    #: the resolved settings, with the scales read off the data (:func:`scaled`)
    settings: Mapping
    #: the run's saved attrs, of which the keys ``run.identity`` tell runs apart
    attrs: Mapping
    seed: int
    n_steps: int
    #: steps between history entries
    every: int
    #: BLAS threads while streaming (``dkha.online-blas-threads``)
    blas_threads: int
    verbose: bool = False
    ac_reference: object = None
    #: ``run_dirs``: the one run directory (or ``None``); checkpoints and resume as the batch
    #: fit's (``checkpoint_every`` in steps)
    run: RunOptions = field(default_factory=RunOptions)
    #: the estimator's parameters as asked for, recorded in the checkpoints (a bare resume
    #: repeats them)
    params: Mapping = field(default_factory=frozen_mapping)


def fit_online(request: OnlineRequest) -> OnlineFit:
    """Stream ``request.n_steps`` samples of its source in the seeded order through a new
    solver of its settings, a history entry every ``request.every`` steps, with checkpoints and
    resume in its run directory, which is written at the end (:func:`online_dataset`,
    :func:`dkha.fit.run_dir.write_run`)."""
    source, kernel, p, seed = request.source, request.kernel, request.settings, request.seed
    n_steps, every, opts = request.n_steps, request.every, request.run
    run_dir = opts.run_dirs[0] if opts.run_dirs else None
    attrs = dict(request.attrs)
    checkpoint_every = int(opts.checkpoint_every or 0)
    # the block boundaries (hence the rounding) depend on these too
    exact = {"block_rows": p["block_rows"], "evaluate_every": every,
             "ac_reference": describe_reference(request.ac_reference)}
    checkpointer, ck, ck_meta = open_fit(run_dir, attrs, overwrite=opts.overwrite,
                                         resume=opts.resume, checkpoint_every=checkpoint_every,
                                         exact=exact, identity=opts.identity)
    ck_meta.update(params=dict(request.params), checkpoint_steps=checkpoint_every)
    reference = ac_reference_for(request.ac_reference, source, kernel, p["n_components"], seed)
    solver = new_solver(p, source.n_features, kernel, seed)
    solver.stream_length = source.n_samples
    fit = OnlineFit(solver, [], 0.0, {}, reference,
                    source.sample(p["eigenvalue_samples"], seed), None, n_steps,
                    checkpointer)
    if ck is not None:
        solver.restore({k[len("state."):]: v for k, v in ck.arrays.items()
                        if k.startswith("state.")}, ck.meta["state_scalars"])
        fit.history = list(ck.meta["history"])
        solver.backoffs = list(ck.meta.get("backoffs", []))
        fit.wall_time = float(ck.meta["fit_seconds"])
        fit.stream_stats = dict(ck.meta["stream_stats"])
        log.info("resuming at step %d from %s", solver.state.step, ck.path)

    def save(t: int, pass_end_pending: bool) -> None:
        fit.wall_time = driver.seconds
        arrays, scalars = solver.snapshot()
        meta = dict(ck_meta, history=fit.history, fit_seconds=fit.wall_time,
                    backoffs=solver.backoffs, stream_stats=fit.stream_stats,
                    state_scalars=scalars, n_steps=n_steps)
        checkpointer.save(scalars["step"], {f"state.{k}": v for k, v in arrays.items()}, meta)

    def record() -> dict:
        fit.wall_time = driver.seconds
        entry = history_entry(solver, reference, fit.variance_sample, fit.wall_time,
                              source.n_samples)
        fit.history.append(entry)
        return entry

    driver = BlockDriver(n_steps, solver.state.step, desc=p["algorithm"],
                         verbose=request.verbose,
                         save=None if checkpointer is None else save,
                         checkpoint_steps=checkpoint_every, seconds=fit.wall_time)
    try:
        run_online(solver, source, driver, seed=seed, n_steps=n_steps, every=every,
                   block_rows=p["block_rows"], prefetch=p["prefetch"],
                   blas_threads=request.blas_threads, stats=fit.stream_stats, record=record)
    finally:
        driver.close()
        fit.wall_time = driver.seconds
    fit.eigenvalues = eigenvalues_of(solver, source.sample(p["eigenvalue_samples"], seed))
    if run_dir is not None:     # the run written, its spent checkpoints cleared
        write_run(run_dir, online_dataset(solver, fit.history, fit.eigenvalues, attrs), None,
                  spent=checkpointer)
    return fit


def online_dataset(solver: OnlineKHA, history: list[dict], eigenvalues: np.ndarray,
                   attrs: dict) -> xr.Dataset:
    """A dictionary run's ``components.zarr`` dataset: ``solver``'s components and dictionary,
    the ``history``, ``eigenvalues`` and ``attrs``, with the solver's complete state (so that
    :func:`dkha.load` continues it)."""
    hist = history
    member_index, member_step = solver.members()
    dictionary = solver.dictionary()
    extra = {
        "dictionary": (("member", "feature"), dictionary),
        "member_index": ("member", member_index),
        "member_step": ("member", member_step),
        "mean_coefficient": ("member", solver.mean_coefficients()),
        "ac_index": ("evaluation", np.array([h["ac_index"] for h in hist], dtype=np.float64)),
        "members": ("evaluation", np.array([h["members"] for h in hist], dtype=np.int64)),
        "explained_variance": (("evaluation", "component"), np.array(
            [h["explained_variance"] for h in hist], dtype=np.float64).reshape(
                len(hist), solver.r)),
    }
    # the solver's complete state, so that dkha.load continues the run (partial_fit)
    arrays, scalars = solver.snapshot()
    extra.update({"state_B": (("component", "member"), arrays["B"]),
                  "state_L": (("member", "member_column"), arrays["L"]),
                  "state_cbar": ("member", arrays["cbar"]),
                  "state_a_init": ("component", arrays["a_init"])})
    if "exact_S" in arrays:         # the exact span's sums (dkha.solvers.online_exact)
        extra.update({"state_exact_S": (("member", "member_column"), arrays["exact_S"]),
                      "state_exact_s": ("member", arrays["exact_s"])})
    attrs = dict(attrs, members=int(dictionary.shape[0]), state_scalars=scalars)
    return result.build_dataset(solver.alpha(), eigenvalues, hist, attrs,
                                member_dim="member", extra=extra,
                                backoffs=list(solver.backoffs))
