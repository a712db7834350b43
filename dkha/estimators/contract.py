"""What the estimators share as citizens of scikit-learn, Dask and xarray.

* :class:`DkhaTransformer` — the scikit-learn contract (``BaseEstimator``/``TransformerMixin``,
  parameters validated from each estimator's ``_parameter_constraints`` table, scikit-learn's
  own validation messages through ``validate_data``, ``get_feature_names_out``,
  ``set_output``), ``transform`` of every input kind, and ``inverse_transform`` through dkha's
  pre-images.
* Lazy inputs (:func:`input_kind`): a dask array, an xarray DataArray (or a Dataset's ``X``), a
  zarr store path or a :class:`~dkha.store.DataStore`. ``transform`` returns the kind it got,
  computing nothing (one ``map_blocks`` over the module-level :func:`transform_block`, as
  dask-ml's ``ParallelPostFit`` does): dask → dask, DataArray → DataArray with a ``component``
  dim and the input's coordinates along ``sample``, store → lazy DataArray.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile

import dask.array as da
import numpy as np
import xarray as xr
from sklearn import get_config
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from dkha.data.ingest import ingest_array, ingest_dask
from dkha.data.result import sample_coords
from dkha.data.store import DataStore, held_in_memory, open_store
from dkha.errors import InputError
from dkha.estimators.params import validate

log = logging.getLogger(__name__)

#: rows of new data projected at once in memory (bounds the ``rows × l`` kernel block)
TRANSFORM_ELEMENTS = 2**24
#: training samples the starting points of inverse_transform are chosen among
START_CANDIDATES = 2000


def validated_fit(method):
    """Decorate ``fit``/``partial_fit``: the parameters are checked against the table first
    (unless scikit-learn's ``skip_parameter_validation`` is set, or ``partial_fit`` continues a
    fitted estimator), as scikit-learn's own estimators do."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not get_config()["skip_parameter_validation"] and not (
                method.__name__ == "partial_fit" and _fitted(self)):
            self._validate_params()
        return method(self, *args, **kwargs)

    return wrapper


def _fitted(estimator) -> bool:
    try:
        check_is_fitted(estimator)
    except NotFittedError:
        return False
    return True


def input_kind(X) -> str:
    """``"store"`` (path or DataStore), ``"dask"``, ``"xarray"`` (DataArray or Dataset) or
    ``"array"`` (anything else: validated by scikit-learn)."""
    if isinstance(X, (str, os.PathLike, DataStore)):
        return "store"
    if isinstance(X, (xr.DataArray, xr.Dataset)):
        return "xarray"
    if type(X).__module__.startswith("dask.array") and hasattr(X, "chunks"):
        return "dask"
    return "array"


def data_array(X):
    """The DataArray of an xarray input (a Dataset's variable ``X``), 2-d ``(sample, feature)``."""
    if isinstance(X, xr.Dataset):
        if "X" not in X:
            raise InputError(f"a Dataset input needs a variable X; it holds {list(X.data_vars)}")
        X = X["X"]
    if X.ndim != 2:
        raise InputError(f"expected a 2-d DataArray (sample × feature), got dims {X.dims}")
    return X


def lazy_values(X):
    """A dask array of the rows of a lazy input (chunked along samples only)."""
    kind = input_kind(X)
    if kind == "store":
        store = X if isinstance(X, DataStore) else open_store(X)
        return da.from_zarr(store.array())
    if kind == "xarray":
        X = data_array(X).data
    arr = da.asarray(X)
    if arr.ndim != 2:
        raise InputError(f"expected a 2-d array (samples × features), got shape {arr.shape}")
    return arr.rechunk({1: -1})


def resolve_store(X) -> tuple[DataStore, str | None, np.ndarray | None]:
    """A validated store for ``X``: a path or :class:`DataStore` as it is; a dask array or an
    xarray DataArray (or Dataset ``X``) written blockwise into a temporary store
    (:func:`~dkha.data.ingest.ingest_dask`); any other array copied into one, which also holds
    the array (:func:`~dkha.data.store.held_in_memory`: the fit reads its rows from memory).

    Returns the store, the temporary directory to remove later, and the in-memory training
    array (array inputs only; models keep it to transform without reading the store).
    """
    kind = input_kind(X)
    if kind == "store":
        return (X if isinstance(X, DataStore) else open_store(X)), None, None
    tmp = tempfile.mkdtemp(prefix="dkha-")
    out = os.path.join(tmp, "data.zarr")
    try:
        if kind in ("dask", "xarray"):
            return ingest_dask(lazy_values(X), out), tmp, None
        arr = np.asarray(X, dtype=np.float64)
        return held_in_memory(ingest_array(arr, out), arr), tmp, arr
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def transform_block(block: np.ndarray, model) -> np.ndarray:
    """The projections of one block of rows (runs on the workers)."""
    return model._transform_array(np.asarray(block, dtype=np.float64))


class DkhaTransformer(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Shared scikit-learn plumbing of :class:`~dkha.KernelHebbianPCA` and
    :class:`~dkha.OnlineKernelPCA` (see the module docstring)."""

    @property
    def _n_features_out(self) -> int:
        """The output width: the fit's (``n_components_``), which a later ``set_params`` does
        not change; the parameter before a fit."""
        if hasattr(self, "n_components_"):
            return int(self.n_components_)
        return int(self.n_components)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False          # kernel blocks are dense; sparse is refused
        tags.transformer_tags.preserves_dtype = ["float64"]
        tags.non_deterministic = False          # the seed fixes every random choice
        return tags

    def _validate_params(self):
        """The parameter table's one check (scikit-learn's wording), raised as
        :class:`~dkha.estimators.params.InvalidParameter`: a :class:`~dkha.errors.ParameterError`
        the CLI reports in one line."""
        validate(self, self._table)

    # -- input --
    def _validate_array(self, X, *, reset: bool, min_samples: int | None = None,
                        copy: bool = False) -> np.ndarray:
        """scikit-learn's validation (its messages), float64; at least two samples to fit
        (a kernel matrix of one sample has no principal component); ``copy``: a copy even
        where the input is float64 already (``copy_X``)."""
        if min_samples is None:
            min_samples = 2 if reset else 1
        return validate_data(self, X, reset=reset, dtype=np.float64,
                             ensure_min_samples=min_samples, copy=copy)

    def _set_lazy_features(self, X) -> None:
        """``feature_names_in_`` of a lazy input: a DataArray's ``feature`` coordinate when it
        holds names, none otherwise (``n_features_in_`` comes from the store the fit reads)."""
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        if input_kind(X) == "xarray":
            X = data_array(X)
            feature = X.dims[1]
            if feature in X.coords and X[feature].dtype.kind in "UOT":
                self.feature_names_in_ = np.asarray(X[feature].values, dtype=object)

    # -- transform --
    def transform(self, X):
        """Projections of the rows of ``X`` on the components.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), dask array, xarray DataArray or \
Dataset, or str
            An array-like is validated by scikit-learn; lazily, a dask array, an xarray
            DataArray (or a Dataset's ``X``) or a data store path.

        Returns
        -------
        ndarray, DataFrame, dask array or xarray.DataArray of shape (n_samples, n_components)
            A NumPy array for an array-like (a pandas DataFrame under
            ``set_output(transform="pandas")``); a dask array for a dask array; a DataArray
            ``(sample, component)`` keeping the sample coordinates for a DataArray or Dataset;
            a lazy DataArray with the store's provenance coordinates for a store. Lazy inputs
            are not computed.
        """
        check_is_fitted(self)
        kind = input_kind(X)
        if kind == "array":
            return self._transform_array(self._validate_array(X, reset=False))
        return self._transform_lazy(X, kind)

    def _transform_lazy(self, X, kind: str):
        arr = lazy_values(X)
        if arr.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {arr.shape[1]} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input.")
        r = int(self.n_components_)
        out = arr.map_blocks(transform_block, self, dtype=np.float64,
                             chunks=(arr.chunks[0], (r,)), meta=np.empty((0, 0)))
        if kind == "dask":
            return out
        component = np.arange(r)
        if kind == "store":
            path = X.path if isinstance(X, DataStore) else os.fspath(X)
            return xr.DataArray(out, dims=("sample", "component"), name="projection",
                                coords={"component": component, **sample_coords(path)})
        X = data_array(X)
        sample = X.dims[0]
        coords = {k: v for k, v in X.coords.items() if v.dims == (sample,)}
        return xr.DataArray(out, dims=(sample, "component"), name="projection",
                            coords={**coords, "component": component})

    def _project_rows_blocked(self, X: np.ndarray, project) -> np.ndarray:
        """``project`` over blocks of rows of ``X`` small enough for a kernel block."""
        rows = max(1, TRANSFORM_ELEMENTS // max(1, self._expansion_size()))
        if len(X) <= rows:
            return project(X)
        return np.concatenate([project(X[a:a + rows]) for a in range(0, len(X), rows)])

    # -- inverse transform --
    def inverse_transform(self, X) -> np.ndarray:
        """Input-space pre-images of points given by their projections ``X (n, n_components)``
        (:mod:`dkha.apply.preimage`: fixed-point for the gaussian kernel, the conformal map
        otherwise), each started from the training sample whose projection is nearest."""
        check_is_fitted(self)
        learned = getattr(self, "fit_inverse_transform", "preimage")
        if learned is False:
            raise NotFittedError("The fit_inverse_transform parameter was not set to True when "
                                 "instantiating and hence the inverse transform is not "
                                 "available (dkha's pre-images: fit_inverse_transform="
                                 "'preimage').")
        Y = check_array(X, dtype=np.float64)
        if learned is True:
            if not hasattr(self, "dual_coef_"):
                raise NotFittedError("the learned pre-image was not fitted; fit again with "
                                     "fit_inverse_transform=True")
            P, C = self.X_transformed_fit_, self.dual_coef_
            if Y.shape[1] != P.shape[1]:
                raise ValueError(f"X has {Y.shape[1]} features, but {type(self).__name__} has "
                                 f"{P.shape[1]} components.")
            # k(Y, P) dual_coef_ by blocks of rows of Y (each block's kernel bounded)
            return self._project_rows_blocked(Y, lambda part: self.kernel_.block(part, P) @ C)
        if Y.shape[1] != self.n_components_:
            raise ValueError(f"X has {Y.shape[1]} features, but {type(self).__name__} has "
                             f"{self.n_components_} components.")
        candidates = self._start_candidates()
        P = self._transform_array(candidates)
        d2 = (np.einsum("ij,ij->i", Y, Y)[:, None] - 2 * Y @ P.T
              + np.einsum("ij,ij->i", P, P)[None, :])
        start = candidates[np.argmin(d2, axis=1)]
        return self._preimages(Y, start)

    # -- pickling --
    def __getstate__(self):
        state = super().__getstate__()
        for name in self._unpicklable:
            state.pop(name, None)
        if state.get("client") is not None:  # a live connection does not travel
            state["client"] = None
        return state

    _unpicklable: tuple[str, ...] = ()
