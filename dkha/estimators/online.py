"""The scikit-learn style estimator for the online algorithms (ON-KHA, OO-KHA, okpca).

Samples stream from a data store in prefetched blocks, in the seeded schedule order
(:func:`dkha.schedule.blocks`: concatenated random permutations, one per pass); a background
thread reads block ``i + prefetch`` (``DataStore.read_rows`` on the sorted block index) while the
compiled loop of :mod:`dkha.solvers.online` runs block ``i``. The store is never loaded whole:
at most ``prefetch + 1`` blocks of rows, the dictionary and the ``m × m`` Cholesky factor are held.

The saved components (``components.zarr``, :meth:`OnlineKernelPCA.to_dataset`):

* ``alpha (component, member)`` — component ``i`` is ``Σ_q alpha[i, q] Φ(dictionary[q])``;
* ``dictionary (member, feature)``, ``member_index (member)`` (the sample's row in the store, or
  its position in the stream for :meth:`~OnlineKernelPCA.partial_fit`), ``member_step (member)``
  (the step at which it joined);
* ``mean_coefficient (member)`` — the running mean ``μ = Σ_q β̄_q Φ(d_q)`` (zeros uncentered);
  the projection of new ``x`` is ``alpha · (k(D, x) − K_m β̄)`` (see :func:`project`);
* ``eigenvalue (component)`` — the variance of the data along each unit component,
  ``mean((w_iᵀ(Φ(x) − μ))²) / ‖w_i‖²`` over a seeded sample of the data (``eigenvalue_samples``
  rows; the second moment when uncentered): an estimate of the eigenvalue of the covariance
  operator, i.e. of ``λ_i(K)/l``;
* history over ``evaluation``: ``pass, step, wall_time`` (no ``error``, ``error_min``, ``excess``:
  online runs have no kernel matrix to evaluate against), ``ac_index`` (NaN unless an AC reference
  was given), ``members`` and ``explained_variance (evaluation, component)`` — Honeine's eq. 23 at
  that step over a seeded sample of the data (``eigenvalue_samples`` rows, the same as the
  eigenvalues'; :func:`dkha.fit.evaluate.variance_of`);
* attrs: algorithm, kernel and parameters, n_components, nu, max_members, eta0, gain_decay, tau,
  centered, seed, store, n_samples, n_features, n_steps, dkha_version.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings

import numpy as np
from sklearn.utils.validation import check_is_fitted

from dkha import config
from dkha.apply.preimage import RunPreimages
from dkha.data.sources import ArraySource
from dkha.errors import DictionaryWarning, InputError, ParameterError
from dkha.estimators import online_run
from dkha.estimators.contract import DkhaTransformer, input_kind, resolve_store, validated_fit
from dkha.estimators.params import (
    ONLINE,
    declare,
    get_params,
    identity_attrs,
    kernel_values,
    recorded_params,
    request_values,
    saved_rows,
)
from dkha.fit.ac_index import DEFAULT_REFERENCE_SAMPLES, reference_of
from dkha.fit.online import (
    OnlineFit,
    OnlineRequest,
    OnlineSettings,
    fit_online,
)
from dkha.fit.request import RunOptions
from dkha.fit.run_dir import run_dataset, write_run
from dkha.kernels import kernel_names, pairwise
from dkha.solvers.online import ALGORITHMS, DEFAULT_GAMMA, OnlineKHA

log = logging.getLogger(__name__)

#: the attrs that tell runs apart (from the parameter table), both estimators' (a directory
#: holding a batch run is another run too)
IDENTITY = identity_attrs()

#: ``fit``'s default length: one pass, and at least this many steps (passes over small data in
#: the seeded order: one pass over a few hundred samples leaves the components far from converged)
MIN_STEPS = 20_000

def _check_dictionary(solver: OnlineKHA) -> None:
    """Warn where the dictionary holds fewer members than components (below ``r`` members the
    solver admits any independent sample, so the data span no more dimensions)."""
    m, r = solver.n_members, solver.r
    if m < r:
        warnings.warn(f"the dictionary holds {m} members for {r} components: the data span only "
                      f"{m} dimensions in feature space, so components beyond that many are not "
                      f"independent; ask for at most {m} components", DictionaryWarning,
                      stacklevel=3)


# --- the estimator -------------------------------------------------------------------------------


@declare(ONLINE, kernel_names(plugins=False))
class OnlineKernelPCA(DkhaTransformer):
    """Kernel principal components online, over a dictionary chosen by the ALD criterion.

    Parameters
    ----------
    {parameters}

    Attributes
    ----------
    alpha_ : ndarray (n_components, n_members)
        Component ``i`` is ``Σ_q alpha_[i, q] Φ(dictionary_[q])``.
    dictionary_ : ndarray (n_members, n_features)
    member_index_, member_step_ : ndarray (n_members,)
    mean_coefficient_ : ndarray (n_members,)
        The running mean is ``Σ_q mean_coefficient_[q] Φ(dictionary_[q])`` (zeros uncentered).
    eigenvalues_ : ndarray (n_components,)
        Variance of the data along each unit component (see the module docstring).
    history_ : list of dict
    backoffs_ : list of dict
        ``step, pass, gain_before, gain_after`` (the step size's η0), ``rolled_back_to`` and
        ``reason`` per backoff, oldest first.
    kernel_ : dkha.kernels.Kernel
    n_features_in_, n_samples_seen_, n_steps_ : int

    See Also
    --------
    dkha.KernelHebbianPCA : the batch KHA family (whole kernel rows, many passes).

    References
    ----------
    J. B. O. Souza Filho and P. S. R. Diniz, "Improving KPCA online extraction by
    orthonormalization in the feature space", IEEE TNNLS, 2017.
    P. Honeine, "Online kernel principal component analysis: a reduced-order model",
    IEEE TPAMI 34(9), 2012.

    Examples
    --------
    >>> import numpy as np
    >>> from dkha.estimators.online import OnlineKernelPCA
    >>> X = np.random.default_rng(0).normal(size=(200, 5))
    >>> model = OnlineKernelPCA(3, sigma=3.0, steps=2000).fit(X)
    >>> model.transform(X[:4]).shape
    (4, 3)
    """

    # -- the request (the table checked once at the top of ``fit`` and a first ``partial_fit``) --
    def _request(self, source, state: OnlineFit | None = None, **fit) -> OnlineRequest:
        """What :func:`dkha.fit.online.fit_online` is asked for: the validated settings (or the
        ``state``'s, which a ``partial_fit`` continues) and every ``dkha.*`` setting, read now."""
        settings = config.settings(block_rows=self.block_rows, prefetch=self.prefetch)
        return OnlineRequest(
            source=source, kernel=self.kernel, kernel_params=kernel_values(self, ONLINE),
            model=validated_settings(self, settings) if state is None else state.settings,
            settings=settings, seed=self.seed, params=get_params(self, ONLINE),
            recorded=recorded_params(self, ONLINE), saved=saved_rows(ONLINE), **fit)

    # -- fitting --
    @validated_fit
    def fit(self, X, y=None, *, run_dir: str | None = None, overwrite: bool = False,
            ac_reference=None, checkpoint_every: int = 0, resume: bool = False
            ) -> OnlineKernelPCA:
        """Stream ``steps`` samples of ``X`` in the seeded random order, a block at a time
        through the same step as :meth:`partial_fit` (``OnlineKHA.apply_block``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), dask array, xarray DataArray, str or \
DataStore
            An array-like is validated as scikit-learn does; a data store is given by its path
            or as a :class:`DataStore`; a dask array or an xarray DataArray is written
            blockwise into a temporary store first, never gathered here.
        y : None
            Ignored (scikit-learn's signature).
        run_dir : str, optional
            Save ``components.zarr`` there; a directory holding a different run is refused
            before any work unless ``overwrite``.
        ac_reference : optional
            Record the AC index in the history: an :class:`~dkha.fit.ac_index.ACReference`, an
            array of reference samples, or ``True`` for exact KPCA on (a seeded subset of up to
            2000 samples of) the data, uncentered as eq. 62.
        checkpoint_every : int, optional
            Write the complete state (:meth:`OnlineKHA.snapshot`) to ``run_dir/checkpoints`` at
            the first block boundary after every that many steps, and at the next block boundary
            when :data:`dkha.fit.control.STOP` is set (SIGTERM or Ctrl-C in the CLI; then
            :class:`~dkha.errors.Interrupted` is raised).
        resume : bool
            Continue from the newest valid checkpoint in ``run_dir``: the result (alpha,
            dictionary, history) equals the uninterrupted run's bit for bit. Resuming with other
            settings or data is refused with the list of differences.

        Returns
        -------
        self : OnlineKernelPCA
            The fitted estimator.
        """
        kind = input_kind(X)
        tmp = None
        if kind == "array":
            source = ArraySource(self._validate_array(X, reset=True))
        else:
            self._set_lazy_features(X)
            source, tmp, _ = resolve_store(X)
        try:
            n_steps = max(source.n_samples, MIN_STEPS) if self.steps is None else int(self.steps)
            self._keep(fit_online(self._request(
                source, n_steps=n_steps, verbose=self.verbose, ac_reference=ac_reference,
                every=n_steps if self.evaluate_every is None else int(self.evaluate_every),
                run=RunOptions(run_dirs=None if run_dir is None else (os.fspath(run_dir),),
                               overwrite=overwrite, checkpoint_every=checkpoint_every,
                               resume=resume, identity=IDENTITY))))
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        _check_dictionary(self.solver_)
        return self

    @validated_fit
    def partial_fit(self, X, y=None) -> OnlineKernelPCA:
        """Stream the rows of the array ``X`` in their order, continuing from earlier calls.

        The first call validates the parameters, resolves the kernel on ``X`` and creates the
        state; later calls (also after :meth:`fit`) continue it. ``member_index_`` then counts
        positions in the whole stream, and the history gets one entry per call.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            The next samples of the stream, in their order.
        y : None
            Ignored (scikit-learn's signature).

        Returns
        -------
        self : OnlineKernelPCA
            The estimator, continued.
        """
        first_call = not hasattr(self, "solver_")
        X = self._validate_array(X, reset=first_call, min_samples=1)
        if first_call and self.n_components is not None and len(X) < self.n_components:
            raise ParameterError(f"n_components={self.n_components} must be less or equal to "
                                 f"the batch number of samples {len(X)} for the first "
                                 "partial_fit call.")
        if not first_call and self.n_components != self.n_components_:
            raise ParameterError(f"Number of components has changed from {self.n_components_} "
                                 f"to {self.n_components} between calls to partial_fit! Try "
                                 "setting n_components to a fixed value.")
        state = None if first_call else self._fit
        self._keep(fit_online(self._request(ArraySource(X), state), state))
        return self

    def _keep(self, fit: OnlineFit) -> None:
        """The fitted attributes: the fit itself (the state :meth:`partial_fit` continues) and
        its result and its solver's state, copied."""
        s, self._fit = fit.solver, fit
        self.solver_, self.kernel_, self.n_features_in_ = s, fit.kernel, s.n_features
        self.history_, self.wall_time_ = list(fit.history), fit.wall_time
        self.stream_stats_, self.attrs_ = dict(fit.stream_stats), dict(fit.attrs)
        self.n_samples_seen_, self.n_components_ = fit.n_steps, fit.settings.n_components
        self.eigenvalues_, self.backoffs_ = fit.eigenvalues, list(s.backoffs)
        self.alpha_, self.dictionary_ = s.alpha(), s.dictionary()
        self.member_index_, self.member_step_ = s.members()
        self.mean_coefficient_, self.n_steps_ = s.mean_coefficients(), s.state.step

    def _transform_array(self, X: np.ndarray) -> np.ndarray:
        """Projections ``w_iᵀ(Φ(x) − μ)`` of the rows of ``X``, ``(n, n_components)``."""
        if not np.isfinite(X).all():
            raise InputError("new data holds NaN or inf")
        return self._project_rows_blocked(X, self.solver_.transform)

    def _expansion_size(self) -> int:
        return int(self.solver_.n_members)

    def _start_candidates(self) -> np.ndarray:
        return self.dictionary_

    def _preimages(self, Y: np.ndarray, start: np.ndarray) -> np.ndarray:
        return RunPreimages(self.to_dataset(), None).from_projections(Y, start).Z

    def ac_index(self, reference=None, *, centered: bool = False,
                 max_samples: int = DEFAULT_REFERENCE_SAMPLES, per_component: bool = False):
        """The AC index (eqs. 61–63) against exact KPCA.

        ``reference``: an :class:`~dkha.fit.ac_index.ACReference`, an array of reference samples, or
        a data store (path); ``None`` reuses the reference given to :meth:`fit`. Stores larger
        than ``max_samples`` use a seeded subset. ``centered`` picks the centered reference (the
        default is the paper's uncentered eq. 62). ``per_component`` returns the ``|cos|``
        values instead of their mean.
        """
        check_is_fitted(self)
        r = self.solver_.r
        ref = self._fit.reference if reference is None else reference_of(
            reference, self.kernel_, r, seed=self.seed, max_samples=max_samples, centered=centered)
        if ref is None:
            raise ParameterError("no AC reference: pass reference samples or a data store")
        cos = ref.cosines(self.solver_.alpha(), self.solver_.dictionary())
        return cos if per_component else float(np.mean(cos))

    def to_dataset(self):
        """The components as an xarray dataset (the ``components.zarr`` schema of a dictionary
        run, :func:`dkha.fit.run_dir.run_dataset`)."""
        check_is_fitted(self)
        return run_dataset(self.history_, self.eigenvalues_, self.attrs_, solver=self.solver_)

    def save(self, run_dir: str) -> str:
        """Write the run (its dictionary, coefficients and history) as
        ``RUN_DIR/components.zarr``.

        Parameters
        ----------
        run_dir : str
            The run directory (created if needed); a ``components.zarr`` there is replaced.

        Returns
        -------
        str
            The path of the ``components.zarr`` written.
        """
        return write_run(run_dir, self.to_dataset(), None)

    @classmethod
    def from_dataset(cls, ds) -> OnlineKernelPCA:
        """The fitted estimator of a saved online run (:func:`dkha.load`): it transforms,
        inverse-transforms and continues with :meth:`partial_fit` exactly where the run ended.

        Parameters
        ----------
        ds : xarray.Dataset
            The run's ``components.zarr`` (:func:`dkha.data.result.load`).

        Returns
        -------
        OnlineKernelPCA
            The estimator with the run's parameters, dictionary and state.
        """
        return online_run.estimator_of(cls, ds)

    components_ = property(lambda self: input_axes(self), doc="The linear kernel's principal "
                           "axes in input space (:func:`input_axes`).")


def validated_settings(model: OnlineKernelPCA, settings: config.Settings) -> OnlineSettings:
    """The online settings: the table's values the fit reads, with those that depend on several
    parameters (or on the ``dkha.*`` ``settings``: ``block_rows``, ``prefetch``) resolved and
    checked."""
    if pairwise(model.kernel):
        raise ParameterError("OnlineKernelPCA cannot take a precomputed kernel (its "
                             "dictionary needs the kernel of each new sample against the "
                             "members); use KernelHebbianPCA")
    if model.n_components is None:
        raise ParameterError("OnlineKernelPCA needs n_components (None, all components, is "
                             "KernelHebbianPCA's: a stream has no fixed number of samples)")
    r = int(model.n_components)
    if model.gain_decay is not None and model.tau is not None:
        raise ParameterError("give gain_decay (η = η0 γ^s) or tau (η = η0/(1 + s/τ)), not both")
    tau = None if model.tau is None else float(model.tau)
    gain_decay = None if tau is not None else float(
        DEFAULT_GAMMA if model.gain_decay is None else model.gain_decay)
    mm = int(model.max_members)
    if mm < r:
        raise ParameterError(f"max_members ({mm}) must be at least n_components ({r}): the "
                             "components live in the dictionary's span")
    for name in ("block_rows", "prefetch"):
        if int(getattr(settings, name)) < 1:
            raise ParameterError(f"{name} must be positive, got {getattr(settings, name)}")
    return OnlineSettings(**{**request_values(model, ONLINE, OnlineSettings), "n_components": r,
                             "gain_decay": gain_decay, "tau": tau})


def input_axes(model: OnlineKernelPCA) -> np.ndarray:
    """The linear kernel's principal axes in input space, ``(n_components, n_features)``:
    ``Σ_q alpha_[i, q] dictionary_[q]`` (unit norm, IncrementalPCA's ``components_``, signs as
    its ``svd_flip``). Other kernels' components have no input-space vector."""
    scale = model.kernel_.input_scale() if hasattr(model, "alpha_") else None
    if scale is None:
        raise AttributeError("components_ is the linear kernel's (input-space axes) and needs "
                             "a fitted OnlineKernelPCA(kernel='linear')")
    return scale * (model.alpha_ @ model.dictionary_)


__all__ = ["ALGORITHMS", "OnlineKernelPCA"]
