"""The scikit-learn style estimator for the batch KHA family."""

from __future__ import annotations

import logging
import os
import shutil
import time
import tempfile
import weakref

import numpy as np

import dkha
from dkha import config, result, schedule
from dkha.cluster import blas_threads_for, client_for
from dkha.checkpoint import open_fit
from dkha.errors import ParameterError, RunDirectoryError
from dkha.kernels import make_kernel, median_distance
from dkha.rows import RowEngine
from dkha.solvers.batch import (ALGORITHMS, DEFAULT_ETA0, DEFAULT_MU, DEFAULT_XI, BatchKHA,
                                check_algorithm)
from dkha.store import DataStore, ingest_array, open_store

log = logging.getLogger(__name__)


def resolve_store(X) -> tuple[DataStore, str | None]:
    """A validated store for ``X``: a path, a :class:`DataStore`, or an array (ingested aside).

    Returns the store and the temporary directory to remove later (arrays only).
    """
    if isinstance(X, DataStore):
        return X, None
    if isinstance(X, (str, os.PathLike)):
        return open_store(X), None
    arr = np.asarray(X)
    tmp = tempfile.mkdtemp(prefix="dkha-")
    return ingest_array(arr, os.path.join(tmp, "data.zarr")), tmp


def resolve_kernel(store: DataStore, kernel: str, seed: int, **params):
    """The kernel with its parameters; ``sigma=None`` → the median-distance heuristic."""
    k = make_kernel(kernel, **params)
    if k.needs_sigma():
        sample = store.sample(int(config.get("median-sample")), seed)
        k = k.with_params(sigma=median_distance(sample))
        log.info("sigma by the median-distance heuristic: %g", k["sigma"])
    return k


class KernelHebbianPCA:
    """Kernel principal components by the Kernel Hebbian Algorithm family.

    Parameters
    ----------
    n_components : int, default 8
        Number of components ``r`` (must be below the number of samples).
    algorithm : {"kha", "kha-t", "kha-et", "kha-smd", "krylov"}, default "kha-smd"
        Constant gain (eq. 8), ``η0 l/(t+l)``, eq. 12 gains, Stochastic Meta-Descent
        (Algorithm 1) on top of eq. 12, or the exact top eigenvectors by a block Krylov method
        (LOBPCG) whose products are blockwise passes.
    kernel : {"gaussian", "laplacian", "polynomial", "sigmoid"}, default "gaussian"
    sigma : float, optional
        Width of the gaussian / laplacian kernel. ``None`` uses the median distance between
        samples (recorded in ``kernel_`` and the saved attrs).
    degree, offset, gamma : optional
        Parameters of the polynomial and sigmoid kernels.
    eta0 : float, optional
        Base gain. Defaults per algorithm: 0.05 (kha), 0.5 (kha-t), 0.2 (kha-et, kha-smd).
    mu : float, default 0.2
        SMD's meta-gain.
    xi : float, default 0.99
        SMD's decay factor.
    rho0 : float, default 0.0
        SMD's initial log-gain. Algorithm 1 prints ρ0 = 1 (which multiplies every initial gain
        by e); ρ0 = 0 converged an order of magnitude lower in our runs.
    passes : int, optional
        Passes through the data (default 10 when ``steps`` is not given).
    steps : int, optional
        Number of single-sample steps instead of whole passes.
    seed : int, default 0
        Seeds the initial coefficients, the sample order and the sigma heuristic's sample.
    evaluate_every : int, default 1
        Evaluate (eq. 22) every that many passes; 0 only at the end; negative never.
    block_rows, prefetch : int, optional
        Schedule positions per block of kernel rows and blocks computed ahead
        (``dkha.block-rows``, ``dkha.prefetch``).
    projections : {"coordinator", "workers"}, optional
        Where the block projections ``S̃ K'_Pᵀ`` are computed (``dkha.projections``): on the
        coordinator from shipped kernel rows, or on the workers from replicas of the
        coefficients (coordinator-math.md §4; equal up to rounding, less traffic).
    cache_rows : bool, optional
        Keep the kernel's upper-triangle tiles on the workers (``dkha.row-cache``; about
        ``4·l²`` bytes, refused above half the workers' memory): kernels are computed once, not
        once a pass, which pays from the second pass on (Krylov, many KHA passes, evaluations).
        Results equal the uncached run's up to rounding.
    init : {"random", "nystrom:M"}, default "random"
        Initial coefficients: the paper's ``A1 ~ N(0, 1/(r l))``, or the Nyström solution from
        ``M`` seeded random landmark rows (then refined; the default ``eta0`` is 20× smaller,
        suited to refinement). Recorded in the history as pass 0. With ``algorithm="krylov"``
        the Nyström vectors start the Krylov iteration.
    tol : float, optional
        Stop once an evaluation's excess error ``E/E_min − 1`` is at most ``tol`` (evaluations
        every ``evaluate_every`` passes, at least every pass when ``tol`` is set). For
        ``algorithm="krylov"``, the relative residual tolerance of the eigenvectors.
    center_sample : int, optional
        Estimate the centering row (the MK row) from a seeded sample of this many columns
        instead of computing it exactly (an ``O(l² n)`` pass): explicitly approximate, recorded
        in the run (attrs ``centering="sample"``, ``center_sample``) and reported by
        ``dkha evaluate``. Either row is cached in the data store (``dkha.mk-cache``).
    scheduler, scheduler_file, workers, client :
        Where the kernel rows are computed (see :func:`dkha.cluster.client_for`).
    verbose : bool, default False
        Show a progress bar.

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
    timings_ : dict
        Seconds spent before the first pass: ``centering`` (the MK row; with ``cache_rows`` also
        the kernel tiles) and ``init`` (the Nyström start).
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

    def __init__(self, n_components: int = 8, *, algorithm: str = "kha-smd",
                 kernel: str = "gaussian", sigma: float | None = None, degree: int | None = None,
                 offset: float | None = None, gamma: float | None = None,
                 eta0: float | None = None, mu: float | None = None, xi: float | None = None,
                 rho0: float = 0.0, passes: int | None = None, steps: int | None = None,
                 seed: int = 0, evaluate_every: int = 1, block_rows: int | None = None,
                 prefetch: int | None = None, init: str = "random", tol: float | None = None,
                 projections: str | None = None, cache_rows: bool | None = None,
                 center_sample: int | None = None,
                 scheduler: str | None = None,
                 scheduler_file: str | None = None, workers: int | None = None, client=None,
                 verbose: bool = False):
        self.n_components = n_components
        self.algorithm = algorithm
        self.kernel = kernel
        self.sigma = sigma
        self.degree = degree
        self.offset = offset
        self.gamma = gamma
        self.eta0 = eta0
        self.mu = mu
        self.xi = xi
        self.rho0 = rho0
        self.passes = passes
        self.steps = steps
        self.seed = seed
        self.evaluate_every = evaluate_every
        self.block_rows = block_rows
        self.prefetch = prefetch
        self.projections = projections
        self.cache_rows = cache_rows
        self.center_sample = center_sample
        self.init = init
        self.tol = tol
        self.scheduler = scheduler
        self.scheduler_file = scheduler_file
        self.workers = workers
        self.client = client
        self.verbose = verbose

    # -- validation --
    def _init(self, n_samples: int) -> int | None:
        """Landmarks of ``init="nystrom:M"`` (None for a random start)."""
        init = str(self.init)
        if init == "random":
            return None
        if init.startswith("nystrom:"):
            try:
                m = int(init.split(":", 1)[1])
            except ValueError:
                m = -1
            if not 0 < m < n_samples:
                raise ParameterError(f"init {init!r}: M must be an integer in 1..{n_samples - 1}")
            return m
        raise ParameterError(f"unknown init {init!r}; use 'random' or 'nystrom:M'")

    def _validated(self, n_samples: int) -> dict:
        if self.algorithm == "krylov":
            algorithm = "krylov"
        elif self.algorithm not in ALGORITHMS:
            raise ParameterError(f"unknown algorithm {self.algorithm!r}; choose one of "
                                 f"{', '.join(ALGORITHMS)}, krylov (or on-kha, oo-kha, okpca with "
                                 "dkha.online.OnlineKernelPCA)")
        else:
            algorithm = check_algorithm(self.algorithm)
        r = self.n_components
        if not isinstance(r, (int, np.integer)) or r < 1:
            raise ParameterError(f"n_components must be a positive integer, got {r!r}")
        if r >= n_samples:
            raise ParameterError(f"n_components ({r}) must be smaller than the number of samples ({n_samples})")
        landmarks = self._init(n_samples)
        if landmarks is not None and landmarks < r:
            raise ParameterError(f"init nystrom:{landmarks} needs at least as many landmarks as "
                                 f"components ({r})")
        default_eta0 = DEFAULT_ETA0.get(algorithm, 0.0) / (20.0 if landmarks else 1.0)
        eta0 = default_eta0 if self.eta0 is None else float(self.eta0)
        if self.tol is not None and not (np.isfinite(self.tol) and self.tol > 0):
            raise ParameterError(f"tol must be a positive number, got {self.tol}")
        mu = DEFAULT_MU if self.mu is None else float(self.mu)
        xi = DEFAULT_XI if self.xi is None else float(self.xi)
        rho0 = float(self.rho0)
        if algorithm != "krylov" and not (np.isfinite(eta0) and eta0 > 0):
            raise ParameterError(f"eta0 must be a positive number, got {eta0}")
        if not (np.isfinite(mu) and mu >= 0):
            raise ParameterError(f"mu must be a non-negative number, got {mu}")
        if not (0.0 <= xi <= 1.0):
            raise ParameterError(f"xi must lie in [0, 1], got {xi}")
        if not np.isfinite(rho0):
            raise ParameterError(f"rho0 must be finite, got {rho0}")
        if self.passes is not None and self.steps is not None:
            raise ParameterError("give passes or steps, not both")
        if self.steps is not None:
            n_steps = int(self.steps)
            if n_steps < 1:
                raise ParameterError(f"steps must be positive, got {self.steps}")
        else:
            passes = 10 if self.passes is None else int(self.passes)
            if passes < 1:
                raise ParameterError(f"passes must be positive, got {self.passes}")
            n_steps = passes * n_samples
        center_sample = self.center_sample
        if center_sample is not None:
            if (not isinstance(center_sample, (int, np.integer))
                    or not 1 <= center_sample <= n_samples):
                raise ParameterError(f"center_sample must be an integer in 1..{n_samples} (the "
                                     f"number of samples), got {center_sample!r}")
            center_sample = int(center_sample)
        return {"center_sample": center_sample, "algorithm": algorithm, "r": int(r), "eta0": eta0, "mu": mu, "xi": xi,
                "rho0": rho0, "n_steps": n_steps, "landmarks": landmarks}

    def run_attrs(self, store: DataStore, kernel, p: dict) -> dict:
        """The attrs saved with the components (also used to compare runs)."""
        attrs = {"algorithm": p["algorithm"], "kernel": kernel.name,
                 "kernel_parameters": kernel.param_dict, "n_components": p["r"],
                 "eta0": p["eta0"], "mu": p["mu"], "xi": p["xi"], "rho0": p["rho0"],
                 "n_steps": p["n_steps"], "passes": p["n_steps"] / store.n_samples,
                 "seed": int(self.seed), "store": os.path.abspath(store.path) if "://" not in store.path else store.path,
                 "n_samples": store.n_samples, "n_features": store.n_features, "centered": True,
                 "init": str(self.init), "tol": self.tol, "dkha_version": dkha.__version__,
                 "centering": "exact" if p["center_sample"] is None else "sample",
                 "center_sample": p["center_sample"]}
        attrs.update({k: v for k, v in kernel.param_dict.items()})
        return attrs

    def fit(self, X, y=None, *, run_dir: str | None = None, overwrite: bool = False,
            checkpoint_every: int = 0, resume: bool = False,
            checkpoint_steps: int = 0) -> "KernelHebbianPCA":
        """Fit on ``X`` (a data store path, a :class:`DataStore` or an array).

        With ``run_dir``, the components are saved there (``components.zarr``); a directory
        holding a different run is refused before any work unless ``overwrite``.
        ``checkpoint_every``: write the complete state to ``run_dir/checkpoints`` every that many
        passes, ``checkpoint_steps``: at the first block boundary after every that many steps
        (and on SIGTERM via :data:`dkha.coordinator.STOP`). ``resume``: continue from the
        newest valid checkpoint; the result equals the uninterrupted run bit for bit. Resuming
        with other settings or data is refused with the list of differences.
        """
        store, tmp = resolve_store(X)
        if tmp is not None:
            self._tmp_finalizer = weakref.finalize(self, shutil.rmtree, tmp, True)
        p = self._validated(store.n_samples)
        kernel = resolve_kernel(store, self.kernel, self.seed, sigma=self.sigma,
                                degree=self.degree, offset=self.offset, gamma=self.gamma)
        attrs = self.run_attrs(store, kernel, p)
        if run_dir is not None and "://" not in store.path:
            real_run, real_store = os.path.realpath(run_dir), os.path.realpath(store.path)
            if real_run == real_store or real_run.startswith(real_store + os.sep):
                raise RunDirectoryError(f"the run directory {run_dir} is inside the data store "
                                        f"{store.path} being read; write the run elsewhere")
        # what else a bit-identical continuation needs: the blocks and where they are projected
        exact = {"block_rows": int(config.get("block-rows", self.block_rows)),
                 "projections": str(config.get("projections", self.projections)),
                 "evaluate_every": int(self.evaluate_every)}
        checkpointer, ck, checkpoint_meta = open_fit(
            run_dir, attrs, overwrite=overwrite, resume=resume,
            checkpoint_every=checkpoint_every or checkpoint_steps, exact=exact)
        store.check_finite()
        from dkha.coordinator import run_batch, run_krylov
        from dkha.solvers.nystrom import nystrom_coefficients

        with client_for(self.scheduler, self.scheduler_file, self.workers, self.client) as client, \
                blas_threads_for(client):
            engine = RowEngine(store, kernel, client, block_rows=self.block_rows,
                               prefetch=self.prefetch, projections=self.projections,
                               cache_rows=self.cache_rows)
            A_init = None
            t0 = time.perf_counter()
            if ck is None:
                engine.compute_mk(center_sample=p["center_sample"], seed=self.seed)
            t1 = time.perf_counter()
            if p["landmarks"] and ck is None:
                A_init, _ = nystrom_coefficients(engine, p["r"], p["landmarks"], seed=self.seed)
            # seconds before the first pass (history wall times count the passes only)
            self.timings_ = {"centering": t1 - t0, "init": time.perf_counter() - t1}
            if p["algorithm"] == "krylov":
                res = run_krylov(engine, p["r"], seed=self.seed, A_init=A_init,
                                 tol=self.tol if self.tol is not None else 1e-8,
                                 with_evaluation=self.evaluate_every >= 0)
            else:
                solver = BatchKHA(p["algorithm"], p["r"], store.n_samples, eta0=p["eta0"],
                                  mu=p["mu"], xi=p["xi"], rho0=p["rho0"])
                res = run_batch(engine, solver, n_steps=p["n_steps"], seed=self.seed,
                                evaluate_every=self.evaluate_every, verbose=self.verbose,
                                A_init=A_init, tol=self.tol, checkpointer=checkpointer,
                                checkpoint_every=int(checkpoint_every or 0),
                                checkpoint_meta=checkpoint_meta, resume=ck,
                                checkpoint_steps=int(checkpoint_steps or 0))
        self.alpha_ = res.alpha
        self.eigenvalues_ = res.eigenvalue
        self.mk_, self.mkm_ = engine.mk, engine.mkm
        self.history_ = res.history
        self.kernel_ = kernel
        self.store_ = store
        self.n_samples_ = store.n_samples
        self.n_features_in_ = store.n_features
        self.stream_stats_ = res.stream_stats
        self.attrs_ = dict(attrs, top_eigenvalues=None if res.top_eigenvalues is None
                           else [float(v) for v in res.top_eigenvalues])
        if run_dir is not None:
            self.save(run_dir)
            checkpointer.clear()  # the run is complete: its checkpoints are spent
        return self

    def to_dataset(self):
        return result.build_dataset(self.alpha_, self.eigenvalues_, self.history_, self.attrs_,
                                    mk=self.mk_, mkm=self.mkm_)

    def save(self, run_dir: str) -> str:
        return result.save(self.to_dataset(), run_dir)

    def transform(self, X) -> np.ndarray:
        """Projections of new samples on the components, ``(n, n_components)``."""
        from dkha.transform import project

        return project(self.to_dataset(), np.asarray(X, dtype=np.float64), client=self.client,
                       scheduler=self.scheduler, scheduler_file=self.scheduler_file,
                       workers=self.workers)


__all__ = ["KernelHebbianPCA", "ALGORITHMS", "resolve_store", "resolve_kernel", "schedule"]
