"""The scikit-learn style estimator for the batch KHA family."""

from __future__ import annotations

import logging
import os
import shutil
import time
import weakref
from collections.abc import Sequence

import numpy as np
from sklearn.base import _fit_context

from dkha import config, schedule
from dkha.apply.preimage import RunPreimages, preimages
from dkha.data import result
from dkha.data.checkpoint import Checkpointer, open_fit
from dkha.data.store import DataStore, open_store
from dkha.engine.budget import block_rows_for
from dkha.engine.cluster import blas_threads_for, client_for
from dkha.engine.rows import RowEngine
from dkha.engine.tasks import project_rows
from dkha.errors import InputError, NumericalError, ParameterError, RunDirectoryError
from dkha.estimators.contract import START_CANDIDATES, DkhaTransformer, input_kind, resolve_store
from dkha.estimators.params import BATCH, constraints, declare, shared_settings, validate
from dkha.estimators.pictures import component_images, is_patch_store, projection_array
from dkha.fit.batch import run_batches, save_checkpoint
from dkha.fit.evaluate import projections
from dkha.fit.init import nystrom_coefficients, unit_norm_components
from dkha.fit.krylov import run_krylov
from dkha.kernels import make_kernel, median_distance
from dkha.progress import Progress
from dkha.runs.run import kernel_of
from dkha.solvers.batch import (
    ALGORITHMS,
    DEFAULT_XI,
    BatchKHA,
    check_algorithm,
    default_eta0,
    default_landmarks,
    default_mu,
    eigenvalue_estimate,
    initial_coefficients,
    start_deficit,
    warm_eta0,
)
from dkha.solvers.warmup import compile_ahead
from dkha.version import __version__

log = logging.getLogger(__name__)


def resolve_kernel(store, kernel: str, seed: int, **params):
    """The kernel with its parameters; ``sigma=None`` → the median-distance heuristic on a seeded
    sample of ``store`` (a :class:`DataStore` or any source with ``sample(n, seed)``)."""
    k = make_kernel(kernel, **params)
    if k.needs_sigma():
        sample = store.sample(int(config.get("median-sample")), seed)
        k = k.with_params(sigma=median_distance(sample))
        log.info("sigma by the median-distance heuristic: %g", k["sigma"])
    return k


@declare(BATCH)
class KernelHebbianPCA(DkhaTransformer):
    """Kernel principal components by the Kernel Hebbian Algorithm family.

    Parameters
    ----------
    {parameters}

    Attributes
    ----------
    alpha_ : ndarray (n_components, n_samples)
        Coefficients: component ``i`` is ``Σ_j alpha_[i, j] Φ'(x_j)``.
    eigenvalues_ : ndarray (n_components,)
        Eq. 13 estimates of the eigenvalues of ``K'``.
    mk_, mkm_ : the centering row and its mean.
    history_ : list of dict
        ``pass, step, error, error_min, excess, wall_time`` per evaluation (``wall_time``: seconds
        of the passes so far, evaluations excluded).
    backoffs_ : list of dict
        ``step, pass, gain_before, gain_after`` (the effective η0), ``rolled_back_to`` and
        ``reason`` per backoff (``on_divergence="backoff"``), oldest first.
    timings_ : dict
        Seconds spent before the first pass: ``centering`` (the MK row; with ``cache_rows`` also
        the kernel tiles) and ``init`` (the Nyström start); and ``stream``, the seconds of the
        passes (the block stream, evaluations excluded); ``passes``: one dict per pass of the
        row engine, in order, each with its ``kind`` (``mk``, ``product``, ``residual``, ``kha``),
        ``what``, ``tasks``, ``wall_seconds``, the coordinator's ``wait_seconds`` and
        ``busy_seconds`` (the rest), ``bytes_received`` (KHA passes also ``blocks``, ``rows``,
        ``bytes_sent`` to replicas and ``projections``); ``projections``: where the block
        projections were computed (``asked``, ``chosen``, ``reason``); ``replicas``: how often
        worker replicas were rebuilt (a worker lost) and moved (workers joined). Saved with the run as
        ``RUN_DIR/timings.json`` (:func:`dkha.data.result.load_timings`).
    kernel_ : dkha.kernels.Kernel
    n_samples_, n_features_in_ : int
    store_ : DataStore

    References
    ----------
    Kim, Franz & Schölkopf (2005), Iterative kernel principal component analysis for image
    modeling. Schraudolph, Günter & Vishwanathan (2006), Fast iterative kernel PCA.

    Examples
    --------
    >>> import numpy as np
    >>> from dkha import KernelHebbianPCA
    >>> X = np.random.default_rng(0).normal(size=(200, 5))
    >>> model = KernelHebbianPCA(4, algorithm="kha-et", sigma=3.0, passes=2).fit(X)
    >>> model.transform(X[:3]).shape
    (3, 4)
    """

    #: the parameter table's rows as scikit-learn's constraints (checked at the top of ``fit``)
    _parameter_constraints: dict = constraints(BATCH)
    _unpicklable = ("_tmp_store", "_final")

    # -- validation --
    def _init(self, n_samples: int) -> tuple[str, int | None]:
        """``("random", None)``, ``("random", M)`` or ``("nystrom", M)`` from ``init``
        (``None``: the Nyström start with :func:`default_landmarks` landmarks)."""
        if self.init is None and self.algorithm == "krylov":
            return "random", None
        if self.init is None:
            m = default_landmarks(n_samples, int(self.n_components))
            return ("nystrom", m) if m else ("random", None)
        init = str(self.init)
        if init == "random":
            return "random", None
        kind, _, m = init.partition(":")
        if kind in ("random", "nystrom"):
            try:
                m = int(m)
            except ValueError:
                m = -1
            if not 0 < m < n_samples:
                raise ParameterError(f"init {init!r}: M must be an integer in 1..{n_samples - 1}")
            return kind, m
        raise ParameterError(f"unknown init {init!r}; use 'random', 'random:M' or 'nystrom:M'")

    def _validated(self, n_samples: int) -> dict:
        validate(self, BATCH)
        if self.algorithm == "krylov":
            algorithm = "krylov"
        elif self.algorithm not in ALGORITHMS:
            raise ParameterError(f"unknown algorithm {self.algorithm!r}; choose one of "
                                 f"{', '.join(ALGORITHMS)}, krylov (or on-kha, oo-kha, okpca with "
                                 "dkha.estimators.online.OnlineKernelPCA)")
        else:
            algorithm = check_algorithm(self.algorithm)
        r = self.n_components
        if r >= n_samples:
            raise ParameterError(f"n_components ({r}) must be smaller than the number of samples ({n_samples})")
        init_kind, init_m = self._init(n_samples)
        landmarks = init_m if init_kind == "nystrom" else None
        support = init_m if init_kind == "random" else None
        if landmarks is not None and landmarks < r:
            raise ParameterError(f"init nystrom:{landmarks} needs at least as many landmarks as "
                                 f"components ({r})")
        # None from a Nyström start: it follows from the start (fit_together, warm_eta0)
        eta0 = default_eta0(algorithm, warm=bool(landmarks)) if self.eta0 is None else float(self.eta0)
        mu = default_mu(warm=bool(landmarks)) if self.mu is None else float(self.mu)
        xi = DEFAULT_XI if self.xi is None else float(self.xi)
        rho0 = float(self.rho0)
        if self.passes is not None and self.steps is not None:
            raise ParameterError("give passes or steps, not both")
        if self.steps is not None:
            n_steps = int(self.steps)
        else:
            n_steps = (10 if self.passes is None else int(self.passes)) * n_samples
        center_sample = self.center_sample
        if center_sample is not None:
            if (not isinstance(center_sample, (int, np.integer)) or isinstance(center_sample, bool)
                    or not 1 <= center_sample <= n_samples):
                raise ParameterError(f"center_sample must be an integer in 1..{n_samples} (the "
                                     f"number of samples), got {center_sample!r}")
            center_sample = int(center_sample)
        return {"center_sample": center_sample, "algorithm": algorithm, "r": int(r), "eta0": eta0, "mu": mu, "xi": xi,
                "rho0": rho0, "n_steps": n_steps, "landmarks": landmarks, "support": support,
                "init": (f"nystrom:{landmarks}" if landmarks else
                         f"random:{support}" if support else "random")}

    def run_attrs(self, store: DataStore, kernel, p: dict) -> dict:
        """The attrs saved with the components (also used to compare runs)."""
        attrs = {"algorithm": p["algorithm"], "kernel": kernel.name,
                 "kernel_parameters": kernel.param_dict, "n_components": p["r"],
                 "eta0": p["eta0"], "mu": p["mu"], "xi": p["xi"], "rho0": p["rho0"],
                 "n_steps": p["n_steps"], "passes": p["n_steps"] / store.n_samples,
                 "seed": int(self.seed), "store": os.path.abspath(store.path) if "://" not in store.path else store.path,
                 "n_samples": store.n_samples, "n_features": store.n_features, "centered": True,
                 "init": p["init"], "tol": self.tol, "dkha_version": __version__,
                 "centering": "exact" if p["center_sample"] is None else "sample",
                 "center_sample": p["center_sample"]}
        attrs.update({k: v for k, v in kernel.param_dict.items()})
        return attrs

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, run_dir: str | None = None, overwrite: bool = False,
            checkpoint_every: int = 0, resume: bool = False,
            checkpoint_steps: int = 0) -> KernelHebbianPCA:
        """Fit on ``X``: an array-like (validated as scikit-learn does), a dask array or an
        xarray DataArray (written blockwise into a temporary store, never gathered here), or
        a data store (path or :class:`DataStore`).

        With ``run_dir``, the components are saved there (``components.zarr``); a directory
        holding a different run is refused before any work unless ``overwrite``.
        ``checkpoint_every``: write the complete state to ``run_dir/checkpoints`` every that many
        passes, ``checkpoint_steps``: at the first block boundary after every that many steps
        (and on SIGTERM via :data:`dkha.fit.control.STOP`). ``resume``: continue from the
        newest valid checkpoint; the result equals the uninterrupted run bit for bit. Resuming
        with other settings or data is refused with the list of differences; more passes (or
        steps) than the checkpointed run asked for continue it.
        """
        if input_kind(X) == "array":
            X = self._validate_array(X, reset=True)
        else:
            self._set_lazy_features(X)
        fit_together([self], X, run_dirs=None if run_dir is None else [run_dir],
                     overwrite=overwrite, checkpoint_every=checkpoint_every, resume=resume,
                     checkpoint_steps=checkpoint_steps)
        return self

    def to_dataset(self):
        """The components as an xarray dataset (the ``components.zarr`` schema), with the
        training projections and, for patch data, the component pictures."""
        extra = {}
        if getattr(self, "projection_", None) is not None:
            extra["projection"] = self.projection_
        if getattr(self, "component_image_", None) is not None:
            extra["component_image"] = self.component_image_
        return result.build_dataset(self.alpha_, self.eigenvalues_, self.history_, self.attrs_,
                                    mk=self.mk_, mkm=self.mkm_, extra=extra,
                                    backoffs=getattr(self, "backoffs_", []))

    def save(self, run_dir: str, *, resumable: bool = False) -> str:
        """Write the components to ``run_dir/components.zarr``.

        ``resumable``: also write the final state as a checkpoint, so that ``fit(...,
        resume=True)`` with more passes continues this run exactly where it ended.
        """
        out = result.save(self.to_dataset(), run_dir)
        if getattr(self, "timings_", None):
            result.save_timings(self.timings_, run_dir)
        if resumable:
            fin = self._final
            checkpointer = Checkpointer(run_dir)
            checkpointer.clear()
            save_checkpoint(checkpointer, fin["solver"], self.mk_, self.mkm_,
                            history=self.history_, top_eigenvalues=fin["top_eigenvalues"],
                            fit_seconds=fin["fit_seconds"],
                            meta=self._final["meta"],
                            n_steps=int(self.attrs_["n_steps"]))
        return out

    @classmethod
    def from_dataset(cls, ds) -> "KernelHebbianPCA":
        """The fitted estimator of a saved batch run (:func:`dkha.load`): it transforms and
        inverse-transforms against the run's training store; with more ``passes`` (or
        ``steps``), ``fit(store, run_dir=RUN_DIR, resume=True)`` continues a run saved with
        ``save(..., resumable=True)`` or stopped at a checkpoint."""
        a = ds.attrs
        kp = dict(a.get("kernel_parameters", {}))
        l = int(a["n_samples"])
        n_steps = int(a["n_steps"])
        model = cls(int(a["n_components"]), algorithm=a["algorithm"], kernel=a["kernel"],
                    sigma=kp.get("sigma"), degree=kp.get("degree"), offset=kp.get("offset"),
                    gamma=kp.get("gamma"), eta0=a.get("eta0"), mu=a.get("mu"), xi=a.get("xi"),
                    rho0=a.get("rho0", 0.0), seed=int(a["seed"]), init=a.get("init", "random"),
                    tol=a.get("tol"), center_sample=a.get("center_sample"),
                    passes=n_steps // l if n_steps % l == 0 else None,
                    steps=None if n_steps % l == 0 else n_steps)
        model.alpha_ = ds["alpha"].values.copy()
        model.eigenvalues_ = ds["eigenvalue"].values.copy()
        model.n_components_ = int(model.alpha_.shape[0])
        model.mk_, model.mkm_ = ds["mk"].values.copy(), float(a["mkm"])
        model.history_ = result.history_of(ds)
        model.attrs_ = {k: v for k, v in a.items() if k != "mkm"}
        model.kernel_ = kernel_of(ds)
        model.store_ = open_store(a["store"])
        if model.store_.n_samples != l:
            raise InputError(f"the training store {a['store']} now holds "
                             f"{model.store_.n_samples} samples; the run was fitted on {l}")
        model.n_samples_, model.n_features_in_ = l, int(a["n_features"])
        model.X_fit_ = None
        model.timings_, model.failure_ = {}, None
        model.projection_ = ds["projection"] if "projection" in ds else None
        model.component_image_ = ds["component_image"] if "component_image" in ds else None
        return model

    def fit_transform(self, X, y=None, **fit_params):
        """Fit, and return the training samples' projections (which the fit's last pass
        computed: no further pass)."""
        self.fit(X, y, **fit_params)
        if input_kind(X) == "array":
            return self.projection_.values.copy()
        return self.transform(X)

    def _training_rows(self):
        """The training samples for projections: the array fitted on, or the store's path."""
        return self.X_fit_ if getattr(self, "X_fit_", None) is not None else self.store_.path

    def _column_groups(self) -> tuple:
        if getattr(self, "X_fit_", None) is not None:
            return (((0, len(self.X_fit_)),),)
        return tuple((self.store_.chunk_bounds(i),) for i in range(self.store_.n_chunks))

    def _expansion_size(self) -> int:
        return int(self.n_samples_)

    def _transform_array(self, X: np.ndarray) -> np.ndarray:
        """``alpha · k'(x)`` with the training centering (:func:`dkha.engine.tasks.project_rows`), in
        this process (on a worker for lazy inputs), blocks of rows at a time."""
        if not np.isfinite(X).all():
            raise InputError("new data holds NaN or inf")
        rows, groups = self._training_rows(), self._column_groups()
        return self._project_rows_blocked(X, lambda part: project_rows(
            rows, self.kernel_, part, self.mk_, self.mkm_, groups, self.alpha_))

    def _start_candidates(self) -> np.ndarray:
        if getattr(self, "X_fit_", None) is not None:
            X = self.X_fit_
            if len(X) <= START_CANDIDATES:
                return X
            pick = np.random.default_rng(self.seed).choice(len(X), START_CANDIDATES, replace=False)
            return X[np.sort(pick)]
        return self.store_.sample(START_CANDIDATES, self.seed)

    def _preimages(self, Y: np.ndarray, start: np.ndarray) -> np.ndarray:
        if getattr(self, "X_fit_", None) is not None:
            return preimages(self.X_fit_, self.kernel_, self.alpha_, Y, start).Z
        with client_for(self.client) as c:
            return RunPreimages(self.to_dataset(), c).from_projections(Y, start).Z


#: settings that every model of one shared kernel stream must agree on (from the table)
SHARED_SETTINGS = shared_settings(BATCH)


class _TemporaryStore:
    """The directory of a store ingested from an array, removed when no model needs it."""

    def __init__(self, path: str):
        self.path = path
        self._finalizer = weakref.finalize(self, shutil.rmtree, path, True)


def _check_shared(models: Sequence[KernelHebbianPCA]) -> None:
    first = models[0]
    for i, m in enumerate(models[1:], start=1):
        for name in SHARED_SETTINGS:
            a, b = getattr(first, name), getattr(m, name)
            if a is not b and a != b:
                raise ParameterError(
                    f"models fitted together share one kernel stream and must agree on {name}: "
                    f"model 0 has {a!r}, model {i} has {b!r}")
    if len(models) > 1 and any(m.algorithm == "krylov" for m in models):
        raise ParameterError("krylov does not stream kernel rows; fit it on its own")


def _common_step(checkpointers: list[Checkpointer], cks: list, n_steps: int) -> list:
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


def run_names(models: Sequence[KernelHebbianPCA]) -> list[str]:
    """Directory names for models fitted together: ``<algorithm>``, with ``-eta0=<value>`` where
    the algorithm appears with several base gains and ``-mu=<value>`` where KHA-SMD appears with
    several meta-gains."""
    def eta0(m):
        return m.eta0 if m.eta0 is not None else default_eta0(m.algorithm, warm=m.init is None)

    def mu(m):
        return m.mu if m.mu is not None else default_mu(warm=m.init is None)

    names = []
    for m in models:
        same = [o for o in models if o.algorithm == m.algorithm]
        name = str(m.algorithm)
        if len({eta0(o) for o in same}) > 1:
            name += "-eta0=" + ("auto" if eta0(m) is None else f"{eta0(m):g}")
        if m.algorithm == "kha-smd" and len({mu(o) for o in same}) > 1:
            name += f"-mu={mu(m):g}"
        names.append(name)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ParameterError(f"the same model is asked for twice ({', '.join(twice)}); give each "
                             "model its own algorithm, eta0 or mu")
    return names


def _keep_results(models, results, solvers, attrs, metas, engine, kernel, store, tmp_store,
                  timings, run_dirs, checkpointers, params, X_fit, pictures) -> list[str]:
    """Each model's fitted attributes from its result (saved in its run directory, if any);
    returns the failures of the diverged ones."""
    failures = []
    for i, (m, res, solver, a) in enumerate(zip(models, results, solvers, attrs)):
        m._tmp_store = tmp_store
        # and every tile pass of the engine (MK row, K'V, residuals): tasks, wall, waiting, bytes
        m.timings_ = dict(timings, stream=res.wall_time, passes=list(engine.stats.passes),
                          replicas={"rebuilds": engine.stats.replica_rebuilds,
                                    "moves": engine.stats.replica_moves})
        m.failure_ = res.failure
        m.history_ = res.history
        m.backoffs_ = res.backoffs
        m.kernel_ = kernel
        m.store_ = store
        m.n_samples_ = store.n_samples
        m.n_features_in_ = store.n_features
        m.stream_stats_ = res.stream_stats
        if res.failure is not None:
            failures.append(f"{a['algorithm']} (eta0={params[i]['eta0']:g}"
                            + (f", mu={a['mu']:g}" if a["algorithm"] == "kha-smd" else "")
                            + f"): {res.failure}")
            continue
        m.alpha_ = res.alpha
        m.eigenvalues_ = res.eigenvalue
        m.n_components_ = int(res.alpha.shape[0])
        m.X_fit_ = X_fit
        m.projection_ = projection_array(res.projection, store)
        m.component_image_ = pictures[i]
        m.mk_, m.mkm_ = engine.mk, engine.mkm
        m.attrs_ = dict(a, top_eigenvalues=None if res.top_eigenvalues is None
                        else [float(v) for v in res.top_eigenvalues])
        if solver is not None:      # the gains as applied (eta0 and mu are in units of κ̄)
            m.attrs_.update(solver.effective_gains(), eta0_applied=solver.eta0,
                            start_deficit=metas[i].get("start_deficit"))
        m._final = {"solver": solver, "top_eigenvalues": res.top_eigenvalues,
                    "fit_seconds": res.wall_time, "meta": metas[i]}
        if run_dirs is not None:
            m.save(run_dirs[i])
            checkpointers[i].clear()  # the run is complete: its checkpoints are spent
    return failures


def _start(engine, params: list[dict], metas: list[dict], cks, n_samples: int, seed: int):
    """The shared start ``(A_init, C_init)`` (``None`` for the paper's random start or a resume)
    and the default ``eta0`` of each model that has none: from a Nyström start, scaled to unit
    feature-space norm, :func:`~dkha.solvers.batch.warm_eta0` of its eigenvalue deficit (kept in
    the checkpoints' meta, read back on a resume)."""
    p0 = params[0]
    A_init = C_init = None
    if p0["landmarks"] and cks is None:
        A_init, s = nystrom_coefficients(engine, p0["r"], p0["landmarks"], seed=seed)
        if p0["algorithm"] != "krylov":     # unit norms: one pass for C = A K'
            A_init, C_init = unit_norm_components(A_init, projections(engine, A_init))
            deficit = start_deficit(s, eigenvalue_estimate(A_init, C_init))
            log.info("Nyström start: eigenvalue deficit %.3g", deficit)
            for p, meta in zip(params, metas):
                if p["eta0"] is None:
                    p["eta0"] = warm_eta0(p["algorithm"], deficit)
                meta["start_deficit"] = deficit
    elif p0["support"] and cks is None:
        A_init = initial_coefficients(p0["r"], n_samples, schedule.init_generator(seed),
                                      support=p0["support"])
    for p, meta, ck in zip(params, metas, cks or [None] * len(params)):
        if p["eta0"] is None and ck is not None:    # resumed: the gain the run started with
            if ck.meta.get("start_deficit") is None:
                raise ParameterError(f"cannot resume {ck.path} with the default eta0: the "
                                     "checkpoint does not record its start (an older dkha); "
                                     "give --eta0")
            meta["start_deficit"] = float(ck.meta["start_deficit"])
            p["eta0"] = warm_eta0(p["algorithm"], meta["start_deficit"])
    return A_init, C_init


def _solver(model: KernelHebbianPCA, p: dict, n_samples: int) -> BatchKHA:
    return BatchKHA(p["algorithm"], p["r"], n_samples, eta0=p["eta0"], mu=p["mu"], xi=p["xi"],
                    rho0=p["rho0"], on_divergence=model.on_divergence,
                    feature_norm=None)


def _check_data(store: DataStore, verbose: bool, *, connect: bool) -> Progress:
    """Check that the data is finite, then show the next stage: connecting to Dask, or starting
    its workers (the progress of the seconds before the first pass can show its own)."""
    stages = Progress(verbose, None, "checking the data (finite values)", unit="stage",
                      transient=True)
    store.check_finite()
    stages.describe("connecting to Dask" if connect else "starting the Dask workers")
    return stages


def _pictures(results, attrs, engine, client, store, seed: int) -> list:
    """Each fitted model's component pictures, for patch data (None otherwise)."""
    pictures = [None] * len(results)
    if is_patch_store(store):
        for i, (res, a) in enumerate(zip(results, attrs)):
            if res.failure is None:
                ds = result.build_dataset(res.alpha, res.eigenvalue, [], a, mk=engine.mk,
                                          mkm=engine.mkm)
                pictures[i] = component_images(ds, client, store, res.projection.std(axis=1),
                                               seed=seed)
    return pictures


def _check_run_dirs(run_dirs: list[str], store: DataStore, attrs: list[dict], *, resume: bool,
                    overwrite: bool) -> None:
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
            result.check_run_dir(run_dir, a, overwrite)


def fit_together(models: Sequence[KernelHebbianPCA], X, *, run_dirs: Sequence[str] | None = None,
                 overwrite: bool = False, checkpoint_every: int = 0, resume: bool = False,
                 checkpoint_steps: int = 0, skip_diverged: bool = False) -> list[KernelHebbianPCA]:
    """Fit several batch models in one pass over the kernel rows: each block of centered rows
    is computed once and applied by every model (:func:`dkha.fit.batch.run_batches`).

    The models may differ in ``algorithm``, ``eta0``, ``mu``, ``xi``, ``rho0``, ``tol`` and
    ``verbose``; everything that shapes the kernel stream (:data:`SHARED_SETTINGS`: data,
    kernel, number of components, schedule, evaluations, cluster) must agree. Each model ends
    as if fitted alone (the same ``alpha_``; evaluations share kernel passes, so their figures
    agree up to rounding), and with ``run_dirs`` (one per model) each is saved as a complete run
    directory, with checkpoints and ``resume`` as in :meth:`KernelHebbianPCA.fit` (resuming with
    more passes than the checkpointed run continues it).

    A model that diverges is set aside while the others go on: with ``skip_diverged`` its
    ``failure_`` says why and it has no ``alpha_``; otherwise, once the others are saved,
    :class:`~dkha.errors.NumericalError` names it. Returns ``models``.

    Examples
    --------
    >>> import numpy as np
    >>> from dkha import KernelHebbianPCA, fit_together
    >>> X = np.random.default_rng(0).normal(size=(200, 5))
    >>> models = [KernelHebbianPCA(4, algorithm=a, sigma=3.0, passes=2)
    ...           for a in ("kha-t", "kha-et", "kha-smd")]
    >>> [m.alpha_.shape for m in fit_together(models, X)]
    [(4, 200), (4, 200), (4, 200)]
    """
    models = list(models)
    if not models:
        raise ParameterError("no models to fit")
    if run_dirs is not None:
        run_dirs = [os.fspath(d) for d in run_dirs]
        if len(run_dirs) != len(models):
            raise ParameterError(f"{len(models)} models but {len(run_dirs)} run directories")
        if len(set(map(os.path.realpath, run_dirs))) < len(run_dirs):
            raise ParameterError("models fitted together need a run directory each")
    _check_shared(models)
    first = models[0]
    store, tmp, X_fit = resolve_store(X)
    tmp_store = None if tmp is None else _TemporaryStore(tmp)
    params = [m._validated(store.n_samples) for m in models]
    p0 = params[0]
    kernel = resolve_kernel(store, first.kernel, first.seed, sigma=first.sigma,
                            degree=first.degree, offset=first.offset, gamma=first.gamma)
    attrs = [m.run_attrs(store, kernel, p) for m, p in zip(models, params)]
    asked = str(config.get("projections", first.projections))
    if len(models) > 1 and asked == "workers":
        raise ParameterError("projections on the workers follow one model per stream; fit "
                             "several models together with projections='coordinator'")
    if resume and asked == "auto" and run_dirs:     # where the run projected them before
        ck = Checkpointer(run_dirs[0]).latest()
        if ck is not None:
            asked = str(ck.meta.get("exact", {}).get("projections", asked))
    # what else a bit-identical continuation needs: the blocks and where they are projected
    exact = {"block_rows": block_rows_for(store.n_samples, first.block_rows),
             "projections": asked, "evaluate_every": int(first.evaluate_every)}
    # a longer run continues a shorter one exactly: the step count does not identify a run
    identity = tuple(k for k in result.IDENTITY_ATTRS if k != "n_steps") + ("n_samples",
                                                                            "n_features")
    if run_dirs is not None:
        _check_run_dirs(run_dirs, store, attrs, resume=resume, overwrite=overwrite)
    opened = [open_fit(d, a, overwrite=overwrite, resume=resume,
                       checkpoint_every=checkpoint_every or checkpoint_steps, exact=exact,
                       identity=identity)
              for d, a in zip(run_dirs or [None] * len(models), attrs)]
    checkpointers = None if run_dirs is None else [o[0] for o in opened]
    metas = [o[2] for o in opened]
    cks = None
    if resume:
        cks = _common_step(checkpointers, [o[1] for o in opened], p0["n_steps"])
    verbose = any(m.verbose for m in models)
    if config.get("compile-ahead"):     # the solver's loops compile while the fit starts
        for algorithm in {p["algorithm"] for p in params}:
            compile_ahead(algorithm)
    stages = _check_data(store, verbose, connect=first.client is not None)
    with client_for(first.client) as client, \
            blas_threads_for(client):
        stages.close()
        engine = RowEngine(store, kernel, client, block_rows=first.block_rows,
                           prefetch=first.prefetch, projections=asked,
                           cache_rows=first.cache_rows, precision=first.precision,
                           device=first.device, models=len(models))
        engine.verbose = verbose
        for meta in metas:      # checkpoints record the mode chosen (a resume keeps it)
            if meta is not None and isinstance(meta.get("exact"), dict):
                meta["exact"]["projections"] = engine.projections
        t0 = time.perf_counter()
        if cks is None:
            engine.compute_mk(center_sample=p0["center_sample"], seed=first.seed)
        t1 = time.perf_counter()
        A_init, C_init = _start(engine, params, metas, cks, store.n_samples, first.seed)
        # seconds before the first pass (history wall times count the passes only)
        timings = {"centering": t1 - t0, "init": time.perf_counter() - t1,
                   "projections": {"asked": asked, "chosen": engine.projections,
                                   "reason": engine.projections_reason},
                   "memory": engine.memory.as_dict()}
        if p0["algorithm"] == "krylov":
            results = [run_krylov(engine, p0["r"], seed=first.seed, A_init=A_init,
                                  tol=first.tol if first.tol is not None else 1e-8,
                                  with_evaluation=first.evaluate_every >= 0)]
            solvers = [None]
        else:
            solvers = [_solver(m, p, store.n_samples) for m, p in zip(models, params)]
            results = run_batches(
                engine, solvers, n_steps=p0["n_steps"], seed=first.seed,
                evaluate_every=first.evaluate_every, verbose=any(m.verbose for m in models),
                A_init=A_init, tol=[m.tol for m in models], checkpointers=checkpointers,
                checkpoint_every=int(checkpoint_every or 0), checkpoint_metas=metas, resumes=cks,
                checkpoint_steps=int(checkpoint_steps or 0), C_init=C_init, divergence_level=(
                    logging.INFO if skip_diverged else logging.WARNING))
        pictures = _pictures(results, attrs, engine, client, store, first.seed)
    failures = _keep_results(models, results, solvers, attrs, metas, engine, kernel, store,
                             tmp_store, timings, run_dirs, checkpointers, params, X_fit, pictures)
    if failures and not skip_diverged:
        if len(models) == 1:
            raise NumericalError(results[0].failure)
        raise NumericalError(f"{len(failures)} of {len(models)} models diverged (the others "
                             "were completed): " + "; ".join(failures))
    return models


__all__ = ["KernelHebbianPCA", "fit_together", "ALGORITHMS", "resolve_store", "resolve_kernel", "schedule"]
