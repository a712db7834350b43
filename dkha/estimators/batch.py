"""The scikit-learn style estimator for the batch KHA family."""

from __future__ import annotations

import logging
import os
import shutil
import weakref
from collections.abc import Sequence

import dask.array as da
import numpy as np

from dkha import config
from dkha.algorithms import AUTO, KRYLOV, has_mu, is_exact
from dkha.apply.pictures import add_component_pictures, is_patch_store, pictures_cluster
from dkha.apply.preimage import preimages, run_preimages
from dkha.data import result
from dkha.data.layout import components_path
from dkha.data.sources import seeded_rows
from dkha.data.store import DataStore, open_store
from dkha.errors import (
    RESUME_HINT,
    InputError,
    Interrupted,
    NumericalError,
    ParameterError,
    RunFinished,
)
from dkha.estimators.contract import (
    START_CANDIDATES,
    DkhaTransformer,
    input_kind,
    lazy_values,
    resolve_store,
    validated_fit,
)
from dkha.estimators.params import (
    BATCH,
    declare,
    from_attrs,
    get_params,
    identity_attrs,
    kernel_values,
    recorded_params,
    request_values,
    saved_rows,
    shared_settings,
)
from dkha.estimators.sklearn_view import finish_fit, fit_seed
from dkha.fit.coordinator import fit_batch, resolve_kernel
from dkha.fit.init import start_of
from dkha.fit.request import (
    FitRequest,
    ModelFit,
    ModelRequest,
    RunOptions,
    frozen_mapping,
)
from dkha.fit.run_dir import run_dataset, write_run
from dkha.kernels import kernel_names, pairwise, precomputed_rows, spec_of
from dkha.runs.run import kernel_of
from dkha.runs.transform import project_rows
from dkha.solvers.batch import ALGORITHMS, default_eta0, default_mu

log = logging.getLogger(__name__)


def fitted_components(n_components: int | None, n_samples: int) -> int:
    """The components a fit computes: at most ``l − 1`` (the centered ``K'`` has rank ``l − 1``
    at most; scikit-learn's further ones are null), all ``l − 1`` for ``None``."""
    limit = int(config.settings().dense_eigh_limit)
    if n_components is None:
        if n_samples > limit:
            raise ParameterError(f"n_components=None asks for all {n_samples - 1} components, "
                                 f"more than dkha fits above dkha.dense-eigh-limit ({limit}) "
                                 "samples; give n_components")
        return max(n_samples - 1, 0)
    return min(int(n_components), max(n_samples - 1, 0))


@declare(BATCH, kernel_names(plugins=False))
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
        worker replicas were rebuilt (a worker lost) and moved (workers joined). Saved with the run
        as ``RUN_DIR/timings.json`` (:func:`dkha.data.result.load_timings`).
    kernel_ : dkha.kernels.Kernel
    n_samples_, n_features_in_ : int
    store_ : DataStore
    dual_coef_, X_transformed_fit_ : ndarray (n_samples, n_features), (n_samples, n_components)
        With ``fit_inverse_transform=True``: scikit-learn's learned pre-image
        ``(k(P, P) + alpha I)⁻¹ X`` and the training projections ``P`` it regresses from
        (dense solve up to ``dkha.dense-eigh-limit`` samples, conjugate gradients on blockwise
        products on the workers above: :func:`dkha.fit.ridge.learned_preimage`).
    inverse_iterations_, inverse_residual_ : int, float
        The products ``k(P, P) V`` the conjugate gradients took (0: the dense solve) and the
        largest relative residual they reached (at most ``dkha.ridge-tol``).

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

    _unpicklable = ("_tmp_store", "_final")

    # -- validation --
    def _request(self, n_samples: int, settings) -> ModelRequest:
        """This model as the fit is asked for it: the parameters checked against ``n_samples``
        (the table checked each alone: validated_fit, fit_together); what depends on the
        algorithm run (``auto`` may become kha-smd) is resolved by the fit
        (:func:`dkha.fit.plan.route`, :func:`dkha.fit.request.settings_of`)."""
        r = fitted_components(self.n_components, n_samples)
        if self.init is not None:       # an explicit start: checked here, before any work
            kind, m = start_of(self.init, str(self.algorithm), n_samples, r, settings)
            if kind == "nystrom" and m < r:
                raise ParameterError(f"init nystrom:{m} needs at least as many landmarks as "
                                     f"components ({r})")
        if self.passes is not None and self.steps is not None:
            raise ParameterError("give passes or steps, not both")
        if self.steps is not None:
            n_steps = int(self.steps)
        else:
            n_steps = (10 if self.passes is None else int(self.passes)) * n_samples
        if self.center_sample is not None and self.center_sample > n_samples:
            raise ParameterError(f"center_sample must be an integer in 1..{n_samples} (the "
                                 f"number of samples), got {self.center_sample!r}")
        return ModelRequest(**{
            **request_values(self, BATCH, ModelRequest), "n_components": int(r),
            "n_steps": n_steps, "verbose": bool(self.verbose),
            "params": frozen_mapping(get_params(self, BATCH)),
            "recorded": frozen_mapping(recorded_params(self, BATCH))})

    def _keep(self, fit: ModelFit, store: DataStore, tmp_store, X_fit) -> None:
        """The fitted attributes: the fit's result, copied."""
        res = fit.result
        self._tmp_store = tmp_store
        self.timings_ = fit.timings
        self.failure_ = res.failure
        self.history_ = res.history
        self.backoffs_ = res.backoffs
        self.kernel_ = fit.kernel
        self.store_ = store
        self.n_samples_ = store.n_samples
        self.n_features_in_ = store.n_features
        self.stream_stats_ = res.stream_stats
        if res.failure is not None:
            return
        self.alpha_ = fit.alpha
        self.eigenvalues_ = fit.eigenvalues
        self.null_components_ = fit.null_components
        self.n_components_ = int(fit.alpha.shape[0])
        self.X_fit_ = X_fit
        self.projection_ = fit.projection
        self.component_image_ = None
        self.mk_, self.mkm_ = fit.mk, fit.mkm
        self.attrs_ = fit.attrs
        self._final = fit

    @validated_fit
    def fit(self, X, y=None, *, run_dir: str | None = None, overwrite: bool = False,
            checkpoint_every: int = 0, resume: bool = False,
            checkpoint_steps: int = 0) -> KernelHebbianPCA:
        """Fit the components on ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), dask array, xarray DataArray, str or \
DataStore
            An array-like is validated as scikit-learn does; a dask array or an xarray
            DataArray (or a Dataset's ``X``) is written blockwise into a temporary store, never
            gathered here; a data store is given by its path or as a :class:`DataStore`. With
            ``kernel="precomputed"``: the square kernel matrix.
        y : None
            Ignored (scikit-learn's signature).
        run_dir : str, optional
            Save the run there (``components.zarr``, ``timings.json``); a directory holding a
            different run is refused before any work unless ``overwrite``.
        overwrite : bool, default False
            Replace a different run in ``run_dir``.
        checkpoint_every : int, default 0
            Write the complete state to ``run_dir/checkpoints`` every that many passes (the
            exact paths: every that many Krylov products). The exact paths (the default,
            ``krylov``) checkpoint by themselves in ``run_dir``: their settings first, then the
            Krylov solve's basis and products at a cost of at most about 5 %
            (:class:`dkha.fit.krylov.KrylovCheckpoints`); checkpoints never change the
            algorithm.
        resume : bool, default False
            Continue from the newest valid checkpoint in ``run_dir``; the result equals the
            uninterrupted run bit for bit. Other settings or data are refused with the list of
            differences; more passes (or steps) than the checkpointed run asked for continue
            it.
        checkpoint_steps : int, default 0
            Also checkpoint at the first block boundary after every that many steps (and on
            a stop, :data:`dkha.engine.stop.STOP`: SIGTERM or Ctrl-C in the CLI).

        Returns
        -------
        self : KernelHebbianPCA
            The fitted estimator.
        """
        precomputed = pairwise(self.kernel)
        if precomputed and self.fit_inverse_transform is True:
            raise ParameterError("Cannot fit_inverse_transform with a precomputed kernel.")
        if input_kind(X) == "array":
            X = self._validate_array(X, reset=True, copy=bool(self.copy_X))
            if precomputed:
                X = precomputed_rows(_square_kernel(X))
        else:
            self._set_lazy_features(X)
            if precomputed:
                X = _lazy_precomputed_rows(X)
        seed = self.seed
        try:    # random_state (scikit-learn's) gives the seed of this fit
            self.seed = fit_seed(self)
            _fit_models([self], X, run_dirs=None if run_dir is None else [run_dir],
                        overwrite=overwrite, checkpoint_every=checkpoint_every, resume=resume,
                        checkpoint_steps=checkpoint_steps)
        finally:
            self.seed = seed
        finish_fit(self, precomputed)
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.pairwise = pairwise(self.kernel)
        return tags

    def to_dataset(self):
        """The components as an xarray dataset (the ``components.zarr`` schema), with the
        training projections and, for patch data, the component pictures."""
        return run_dataset(self.history_, self.eigenvalues_, self.attrs_, alpha=self.alpha_,
                           mk=self.mk_, mkm=self.mkm_,
                           projection=getattr(self, "projection_", None),
                           pictures=getattr(self, "component_image_", None),
                           backoffs=getattr(self, "backoffs_", []))

    def save(self, run_dir: str, *, resumable: bool = False) -> str:
        """Write the components to ``run_dir/components.zarr`` (and the timings beside).

        Parameters
        ----------
        run_dir : str
            The run directory (created if needed); a ``components.zarr`` there is replaced.
        resumable : bool, default False
            Also write the final state as a checkpoint, so that ``fit(..., resume=True)`` with
            more passes continues this run exactly where it ended (a fit of the KHA
            iterations, in this process).

        Returns
        -------
        str
            The path of the ``components.zarr`` written.
        """
        return write_run(run_dir, self.to_dataset(), getattr(self, "timings_", None),
                         resumable=resumable, final=getattr(self, "_final", None))

    @classmethod
    def from_dataset(cls, ds) -> KernelHebbianPCA:
        """The fitted estimator of a saved batch run (:func:`dkha.load`).

        It transforms and inverse-transforms against the run's training store; with more
        ``passes`` (or ``steps``), ``fit(store, run_dir=RUN_DIR, resume=True)`` continues a run
        saved with ``save(..., resumable=True)`` or stopped at a checkpoint.

        Parameters
        ----------
        ds : xarray.Dataset
            The run's ``components.zarr`` (:func:`dkha.data.result.load`).

        Returns
        -------
        KernelHebbianPCA
            The estimator with the run's parameters and fitted attributes.
        """
        return _from_dataset(cls, ds)

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
        """``alpha · k'(x)`` with the training centering (:func:`dkha.engine.tasks.project_rows`),
        in this process (on a worker for lazy inputs), blocks of rows at a time."""
        if not np.isfinite(X).all():
            raise InputError("new data holds NaN or inf")
        rows, groups = self._training_rows(), self._column_groups()
        return self._project_rows_blocked(X, lambda part: project_rows(
            rows, self.kernel_, part, self.mk_, self.mkm_, groups, self.alpha_))

    def _start_candidates(self) -> np.ndarray:
        if getattr(self, "X_fit_", None) is not None:
            return seeded_rows(self.X_fit_, START_CANDIDATES, self.seed)
        return self.store_.sample(START_CANDIDATES, self.seed)

    def _preimages(self, Y: np.ndarray, start: np.ndarray) -> np.ndarray:
        if getattr(self, "X_fit_", None) is not None:
            return preimages(self.X_fit_, self.kernel_, self.alpha_, Y, start).Z
        return run_preimages(self.to_dataset(), Y, start, client=self.client)


def _from_dataset(cls, ds) -> KernelHebbianPCA:
    """:meth:`KernelHebbianPCA.from_dataset`: the estimator's parameters from the run's attrs,
    its fitted attributes from the run's variables."""
    a = ds.attrs
    l = int(a["n_samples"])
    kw = from_attrs(BATCH, a, spec_of(a.get("kernel")))
    if "n_steps" in a:      # the KHA iterations (an exact path saves no length, nor start)
        n_steps = int(a["n_steps"])
        kw = dict({"init": "random"}, **kw)     # older runs: no init attr
        kw.update(passes=n_steps // l if n_steps % l == 0 else None,
                  steps=None if n_steps % l == 0 else n_steps)
    model = cls(**kw)
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
    model.projection_ = ds.get("projection", None)
    model.component_image_ = ds.get("component_image", None)
    return model


def _square_kernel(K: np.ndarray) -> np.ndarray:
    """A precomputed kernel matrix: square; symmetrised as ``(K + Kᵀ)/2`` (centering and the
    solvers read one triangle; scikit-learn centers the rows and columns as given, the same
    matrix where its centered ``K`` is symmetric)."""
    if K.shape[0] != K.shape[1]:
        raise InputError(f"a precomputed kernel must be a square matrix, got shape {K.shape}")
    if not np.array_equal(K, K.T):
        K = 0.5 * (K + K.T)
    return K


def _lazy_precomputed_rows(X):
    """The rows of a lazy square kernel matrix (dask array, DataArray or data store) with
    their index appended (:func:`dkha.kernels.precomputed_rows`), blockwise: the matrix is
    read chunk by chunk and must be symmetric already."""
    arr = lazy_values(X)
    if arr.shape[0] != arr.shape[1]:
        raise InputError(f"a precomputed kernel must be a square matrix, got shape {arr.shape}")
    index = da.arange(arr.shape[0], chunks=(arr.chunks[0],), dtype=np.float64)[:, None]
    return da.concatenate([arr.astype(np.float64), index], axis=1)


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
    if len(models) > 1 and any(is_exact(m.algorithm) for m in models):
        raise ParameterError(f"{KRYLOV} does not stream kernel rows; fit it on its own")
    if len(models) > 1 and any(m.algorithm == AUTO for m in models):
        raise ParameterError(f"algorithm {AUTO!r} fits one model at a time; name the algorithms "
                             "of models fitted together")


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
        if has_mu(m.algorithm) and len({mu(o) for o in same}) > 1:
            name += f"-mu={mu(m):g}"
        names.append(name)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ParameterError(f"the same model is asked for twice ({', '.join(twice)}); give each "
                             "model its own algorithm, eta0 or mu")
    return names


def fit_together(models: Sequence[KernelHebbianPCA], X, *, run_dirs: Sequence[str] | None = None,
                 overwrite: bool = False, checkpoint_every: int = 0, resume: bool = False,
                 checkpoint_steps: int = 0, skip_diverged: bool = False) -> list[KernelHebbianPCA]:
    """Fit several batch models in one pass over the kernel rows: each block of centered rows
    is computed once and applied by every model (:func:`dkha.fit.kha_stream.run_batches`).

    The models may differ in ``algorithm``, ``eta0``, ``mu``, ``xi``, ``rho0``, ``tol`` and
    ``verbose``; everything that shapes the kernel stream (:data:`SHARED_SETTINGS`: data,
    kernel, number of components, schedule, evaluations, cluster) must agree. Each model ends
    as if fitted alone (the same ``alpha_``; evaluations share kernel passes, so their figures
    agree up to rounding). A model that diverges is set aside while the others go on.

    Parameters
    ----------
    models : sequence of KernelHebbianPCA
        The models, each with the parameters it is fitted with (validated here).
    X : array-like, dask array, xarray DataArray, str or DataStore
        The training data, as :meth:`KernelHebbianPCA.fit` takes it.
    run_dirs : sequence of str, optional
        One run directory per model: each is saved as a complete run directory, with
        checkpoints and ``resume`` as in :meth:`KernelHebbianPCA.fit`.
    overwrite, checkpoint_every, resume, checkpoint_steps :
        As :meth:`KernelHebbianPCA.fit`, for every model (resuming with more passes than the
        checkpointed runs continues them).
    skip_diverged : bool, default False
        A diverged model's ``failure_`` says why and it has no ``alpha_``; without it,
        :class:`~dkha.errors.NumericalError` names the diverged models once the others are
        saved.

    Returns
    -------
    list of KernelHebbianPCA
        ``models``, fitted.

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
    for m in models:
        m._validate_params()
    return _fit_models(models, X, run_dirs=run_dirs, overwrite=overwrite,
                       checkpoint_every=checkpoint_every, resume=resume,
                       checkpoint_steps=checkpoint_steps, skip_diverged=skip_diverged)


def _fit_models(models: list[KernelHebbianPCA], X, *, run_dirs=None, overwrite=False,
                checkpoint_every=0, resume=False, checkpoint_steps=0,
                skip_diverged=False) -> list[KernelHebbianPCA]:
    """:func:`fit_together` of models whose parameters were checked: one request to
    :func:`dkha.fit.coordinator.fit_batch`, then the component pictures of patch data
    (:func:`dkha.apply.pictures.add_component_pictures`)."""
    if not models:
        raise ParameterError("no models to fit")
    if run_dirs is not None:
        run_dirs = tuple(os.fspath(d) for d in run_dirs)
        if len(run_dirs) != len(models):
            raise ParameterError(f"{len(models)} models but {len(run_dirs)} run directories")
        if len(set(map(os.path.realpath, run_dirs))) < len(run_dirs):
            raise ParameterError("models fitted together need a run directory each")
    _check_shared(models)
    first = models[0]
    store, tmp, X_fit = resolve_store(X)
    tmp_store = None if tmp is None else _TemporaryStore(tmp)
    if pairwise(first.kernel) and store.n_features != store.n_samples + 1:
        raise ParameterError("a precomputed kernel goes through KernelHebbianPCA.fit (which "
                             "appends each row's index), not fit_together")
    # every dkha.* setting, read now (the fit's one reading), the stream's options in their place
    settings = config.settings(projections=first.projections, row_cache=first.cache_rows,
                               precision=first.precision, device=first.device)
    request = FitRequest(
        store=store, kernel=first.kernel, kernel_params=frozen_mapping(kernel_values(first, BATCH)),
        models=tuple(m._request(store.n_samples, settings) for m in models),
        seed=first.seed, evaluate_every=first.evaluate_every, block_rows=first.block_rows,
        prefetch=first.prefetch, client=first.client,
        settings=settings,
        run=RunOptions(run_dirs=run_dirs, overwrite=overwrite,
                       checkpoint_every=checkpoint_every, resume=resume,
                       checkpoint_steps=checkpoint_steps, skip_diverged=skip_diverged,
                       identity=identity_attrs()),
        saved=saved_rows(BATCH))
    try:
        fits = fit_batch(request)
    except RunFinished:     # this run, finished: its pictures, if a stop left them
        drawn = _undrawn_pictures(run_dirs, store, first.client) if is_patch_store(store) else []
        if drawn:
            raise RunFinished("; ".join(f"{d} holds this run, finished: drew its component "
                                        "pictures, which a stop had left undrawn"
                                        for d in drawn)) from None
        raise
    for m, f in zip(models, fits):
        m._keep(f, store, tmp_store, X_fit)
    fitted = [(m, f) for m, f in zip(models, fits) if f.failure is None]
    if fitted and is_patch_store(store):    # one cluster for every model (they share a client)
        with pictures_cluster(store, first.client) as client:
            for m, f in fitted:
                m.component_image_ = _pictures(m, store, f.run_dir, client)
    failures = [f.describe_failure() for f in fits if f.failure is not None]
    if failures and not skip_diverged:
        if len(models) == 1:
            raise NumericalError(fits[0].failure)
        raise NumericalError(f"{len(failures)} of {len(models)} models diverged (the others "
                             "were completed): " + "; ".join(failures))
    return models


def _pictures(model: KernelHebbianPCA, store: DataStore, run_dir: str | None, client):
    """The component pictures of a fitted patch model, the step after the fit, on ``client``
    (:func:`dkha.apply.pictures.pictures_cluster`). A stop during them ends this step only:
    the run is saved whole already (``fit/`` wrote it and cleared its checkpoints), without
    its pictures, which a ``--resume`` (or the same fit again) draws
    (:func:`_undrawn_pictures`): :class:`~dkha.errors.Interrupted` (exit code 75). Without a
    run directory there is nothing to resume: the fit returns fitted, without pictures
    (``None``), said in one line."""
    try:
        return add_component_pictures(model.to_dataset(), store, client=client,
                                      run_dir=run_dir)
    except Interrupted as exc:
        if run_dir is not None:
            raise Interrupted(f"{exc}: the run in {run_dir} is saved without its component "
                              f"pictures; continue with {RESUME_HINT} to draw them") from None
        log.warning("%s: the fit is complete, without its component pictures", exc)
        return None


def _undrawn_pictures(run_dirs: Sequence[str] | None, store: DataStore, client) -> list[str]:
    """Draw the component pictures of the finished runs in ``run_dirs`` that lack them (a stop
    during them: :func:`_pictures`), from each saved run as it is (no fit: the pictures of the
    uninterrupted fit, bit for bit); the run directories drawn."""
    runs = {d: result.load(d) for d in run_dirs or ()
            if os.path.isdir(components_path(d))}
    undrawn = {d: ds for d, ds in runs.items() if "component_image" not in ds}
    if undrawn:
        with pictures_cluster(store, client) as c:
            for d, ds in undrawn.items():
                add_component_pictures(ds, store, client=c, run_dir=d)
    return list(undrawn)


__all__ = ["ALGORITHMS", "KernelHebbianPCA", "fit_together", "resolve_kernel", "resolve_store"]
