"""An online run saved and loaded: the ``components.zarr`` dataset of a dictionary run and the
fitted estimator back from it (see :mod:`dkha.estimators.online` for the schema)."""

from __future__ import annotations

import xarray as xr

from dkha import algorithms
from dkha.data import result
from dkha.errors import InputError
from dkha.estimators.params import ONLINE, from_attrs
from dkha.fit.online import new_solver, online_dataset
from dkha.kernels import spec_of
from dkha.runs.run import kernel_of


def dataset_of(model) -> xr.Dataset:
    """A fitted :class:`~dkha.estimators.online.OnlineKernelPCA` as its ``components.zarr``
    dataset (:func:`dkha.fit.online.online_dataset`)."""
    return online_dataset(model.solver_, model.history_, model.eigenvalues_, model.attrs_)


def estimator_of(cls, ds: xr.Dataset):
    """The fitted ``cls`` (:class:`~dkha.estimators.online.OnlineKernelPCA`) of a saved online
    run, its solver restored from the saved state."""
    a = ds.attrs
    kwargs = from_attrs(ONLINE, a, spec_of(a.get("kernel")))
    if "state_exact_S" in ds and "algorithm" in kwargs:
        # saved before the named algorithms ran their updates from the first sample: a state
        # still exact in the span meant the exact start, then the named update (on-kha: auto)
        kwargs["algorithm"] = algorithms.exact_span_twin(kwargs["algorithm"],
                                                         algorithms.ONLINE) or kwargs["algorithm"]
    model = cls(**kwargs)
    # the scales the run was fitted with (the unit of eta0, read off its data then)
    p = dict(model._validated(), feature_norm=a["feature_norm"], gain=a["gain"])
    kernel = kernel_of(ds)
    model.solver_ = new_solver(p, int(a["n_features"]), kernel, model.seed)
    if "state_B" not in ds:
        raise InputError("this run was saved without the solver's state (dkha before "
                         "0.1.0+state); it can be analysed but not continued")
    arrays = {"B": ds["state_B"].values, "L": ds["state_L"].values,
              "cbar": ds["state_cbar"].values, "dictionary": ds["dictionary"].values,
              "member_index": ds["member_index"].values,
              "member_step": ds["member_step"].values, "a_init": ds["state_a_init"].values}
    if "state_exact_S" in ds:
        arrays.update(exact_S=ds["state_exact_S"].values, exact_s=ds["state_exact_s"].values)
    model.solver_.restore(arrays, a["state_scalars"])
    model.kernel_ = kernel
    model.n_features_in_ = int(a["n_features"])
    model.n_components_ = p["n_components"]
    model._params_ = p
    model._reference_ = None
    model.history_ = result.history_of(ds)
    model.wall_time_ = float(ds["wall_time"].values[-1]) if ds.sizes.get("evaluation") else 0.0
    model.stream_stats_ = {}
    model.n_samples_seen_ = int(a["n_steps"])
    model._read_solver()
    model.eigenvalues_ = ds["eigenvalue"].values.copy()
    model.attrs_ = {k: v for k, v in a.items() if k not in ("members", "state_scalars")}
    if "algorithm" in a:
        model.attrs_["algorithm"] = model.algorithm
    return model

