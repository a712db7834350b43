"""What a batch fit is asked for, and what it gives back.

The estimators validate their parameters once and hand :func:`dkha.fit.coordinator.fit_batch`
one frozen :class:`FitRequest`: each model as asked (:class:`ModelRequest`), the kernel as asked
(its name and parameters, resolved on the data by the fit), the one kernel stream's seed,
evaluations, blocks and cluster, and where the runs are kept (:class:`RunOptions`). The fit resolves
the algorithm (:func:`dkha.fit.plan.route`) and each model's defaults (:func:`settings_of`)
without changing the request, writes each run directory, and returns one :class:`ModelFit`
per model, which the estimator copies into its fitted attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np
import xarray as xr

from dkha.algorithms import has_mu
from dkha.config import Settings
from dkha.data.checkpoint import Checkpointer
from dkha.data.store import DataStore
from dkha.fit.init import start_of
from dkha.fit.kha_stream import BatchResult
from dkha.fit.plan import Route
from dkha.solvers.batch import DEFAULT_XI, BatchKHA, default_eta0, default_mu


def frozen_mapping(d: Mapping | None = None) -> Mapping:
    """A read-only copy of ``d`` (a request is not changed by the fit it asks for)."""
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class ModelRequest:
    """One model as its estimator validated it (each field named as a row of the parameter
    table: that row's value, :func:`dkha.estimators.params.request_values`): the values that do
    not depend on the algorithm run resolved (``n_components`` at most ``l − 1``, the steps, the
    centering sample), those that do left as asked (``eta0``, ``mu``, ``xi``, ``init``:
    ``None`` is the algorithm's default);
    then, the same type, as the fit resolved them (:func:`settings_of`: its start's
    ``landmarks`` or ``support``; ``eta0`` ``None`` from a Nyström start, set by
    :func:`dkha.fit.coordinator.start`)."""

    algorithm: str
    n_components: int
    n_steps: int
    eta0: float | None
    mu: float | None
    xi: float | None
    rho0: float
    init: str | None
    center_sample: int | None
    tol: float | None = None
    on_divergence: str = "backoff"
    verbose: bool = False
    landmarks: int | None = None
    support: int | None = None
    #: the estimator's parameters as it holds them (``get_params``): the saved attrs' values
    #: where the fit resolves none, and which options of the KHA iterations were given
    params: Mapping = field(default_factory=frozen_mapping, repr=False)
    #: the parameters a bare resume repeats (JSON values; recorded in the checkpoints)
    recorded: Mapping = field(default_factory=frozen_mapping, repr=False)


@dataclass(frozen=True)
class RunOptions:
    """Where and how a fit is kept: run directories, checkpoints, resume."""

    run_dirs: tuple[str, ...] | None = None
    overwrite: bool = False
    checkpoint_every: int = 0
    resume: bool = False
    checkpoint_steps: int = 0
    skip_diverged: bool = False
    #: the attrs that tell runs apart, with their former names
    identity: Mapping = field(default_factory=frozen_mapping)

    def __post_init__(self):
        object.__setattr__(self, "identity", frozen_mapping(self.identity))


@dataclass(frozen=True)
class FitRequest:
    """Everything one batch fit is asked for (module docstring)."""

    store: DataStore
    #: the kernel as asked: a name (or callable) and its parameters (``sigma=None``: the
    #: median-distance heuristic, :func:`dkha.fit.coordinator.resolve_kernel`)
    kernel: object
    kernel_params: Mapping
    models: tuple[ModelRequest, ...]
    #: what shapes the one kernel stream every model shares (with ``block_rows``, ``prefetch``:
    #: ``None`` leaves them to :func:`dkha.engine.budget.block_rows_for`; and the cluster)
    seed: int
    evaluate_every: int
    #: every ``dkha.*`` setting, read once by the estimator as the fit starts (with its
    #: ``projections``, ``cache_rows`` as ``row_cache``, ``precision`` and ``device``):
    #: nothing below reads the configuration
    settings: Settings
    block_rows: int | None = None
    prefetch: int | None = None
    client: object = None
    run: RunOptions = field(default_factory=RunOptions)
    #: ``(parameter, attr)`` of every saved row of the estimator's parameter table
    saved: tuple[tuple[str, str], ...] = ()


def settings_of(model: ModelRequest, route: Route, n_samples: int, config: Settings
                ) -> ModelRequest:
    """``model`` as it fits once :func:`dkha.fit.plan.route` said what runs (the defaults are
    those of the algorithm it is saved under, ``route.named``): its start (the Nyström start
    with :func:`dkha.solvers.batch.default_landmarks` landmarks by default, within the memory
    budget of ``config``, the random one for the exact solver), and its gains' defaults from
    that start."""
    algorithm = route.named
    kind, m = start_of(model.init, algorithm, n_samples, model.n_components, config)
    landmarks = m if kind == "nystrom" else None
    support = m if kind == "random" else None
    warm = bool(landmarks)
    # None from a Nyström start: it follows from the start (warm_eta0)
    return replace(
        model, algorithm=algorithm, landmarks=landmarks, support=support,
        eta0=default_eta0(algorithm, warm=warm) if model.eta0 is None else model.eta0,
        mu=default_mu(warm=warm) if model.mu is None else model.mu,
        xi=DEFAULT_XI if model.xi is None else model.xi,
        init=(f"nystrom:{landmarks}" if landmarks else f"random:{support}" if support
              else "random"))


@dataclass(frozen=True)
class ModelFit:
    """One model's outcome: its components as kept (order and signs fixed, null ones counted:
    :func:`dkha.fit.spectrum.finalise_components`), its run's attrs, and what continues it."""

    settings: ModelRequest
    #: the attrs saved with the run (the gains as applied and the top eigenvalues added)
    attrs: dict
    result: BatchResult
    mk: np.ndarray
    mkm: float
    #: seconds before the first pass, the row engine's passes, the projections' choice
    timings: dict
    #: the batch solver (``None`` for the exact paths), for a resumable save
    solver: BatchKHA | None
    #: the meta its checkpoints carry (the start's deficit, the exact settings)
    meta: dict
    #: the kernel as resolved on the data (e.g. the median-distance ``sigma``)
    kernel: object = None
    alpha: np.ndarray | None = None
    eigenvalues: np.ndarray | None = None
    #: ``projection (sample, component)`` of the training samples, with the store's coordinates
    projection: xr.DataArray | None = None
    null_components: int = 0
    #: where it was saved (``None``: not saved, or diverged)
    run_dir: str | None = None
    checkpointer: Checkpointer | None = field(default=None, repr=False)

    @property
    def failure(self) -> str | None:
        return self.result.failure

    def describe_failure(self) -> str:
        """``algorithm (eta0=…[, mu=…]): why`` of a diverged model."""
        s = self.settings
        return (f"{s.algorithm} (eta0={s.eta0:g}"
                + (f", mu={s.mu:g}" if has_mu(s.algorithm) else "")
                + f"): {self.result.failure}")
