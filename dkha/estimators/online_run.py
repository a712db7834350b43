"""An online run saved and loaded: the ``components.zarr`` dataset of a dictionary run and the
fitted estimator back from it (see :mod:`dkha.estimators.online` for the schema)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dkha.data import result
from dkha.errors import InputError
from dkha.estimators.params import ONLINE, from_attrs
from dkha.fit.online import new_solver
from dkha.kernels import make_kernel


def dataset_of(model) -> xr.Dataset:
    """A fitted :class:`~dkha.estimators.online.OnlineKernelPCA` as its ``components.zarr``
    dataset, with the solver's complete state (so that :func:`dkha.load` continues it)."""
    hist = model.history_
    extra = {
        "dictionary": (("member", "feature"), model.dictionary_),
        "member_index": ("member", model.member_index_),
        "member_step": ("member", model.member_step_),
        "mean_coefficient": ("member", model.mean_coefficient_),
        "ac_index": ("evaluation", np.array([h["ac_index"] for h in hist], dtype=np.float64)),
        "members": ("evaluation", np.array([h["members"] for h in hist], dtype=np.int64)),
        "explained_variance": (("evaluation", "component"), np.array(
            [h["explained_variance"] for h in hist], dtype=np.float64).reshape(
                len(hist), model.solver_.r)),
    }
    # the solver's complete state, so that dkha.load continues the run (partial_fit)
    arrays, scalars = model.solver_.snapshot()
    extra.update({"state_B": (("component", "member"), arrays["B"]),
                  "state_L": (("member", "member_column"), arrays["L"]),
                  "state_cbar": ("member", arrays["cbar"]),
                  "state_a_init": ("component", arrays["a_init"])})
    if "exact_S" in arrays:         # the exact span's sums (dkha.solvers.online_exact)
        extra.update({"state_exact_S": (("member", "member_column"), arrays["exact_S"]),
                      "state_exact_s": ("member", arrays["exact_s"])})
    attrs = dict(model.attrs_, members=int(model.dictionary_.shape[0]), state_scalars=scalars)
    return result.build_dataset(model.alpha_, model.eigenvalues_, hist, attrs,
                                member_dim="member", extra=extra,
                                backoffs=getattr(model, "backoffs_", []))


def estimator_of(cls, ds: xr.Dataset):
    """The fitted ``cls`` (:class:`~dkha.estimators.online.OnlineKernelPCA`) of a saved online
    run, its solver restored from the saved state."""
    a = ds.attrs
    kp = dict(a.get("kernel_parameters", {}))
    model = cls(**from_attrs(ONLINE, a))
    # the scales the run was fitted with (the unit of eta0, read off its data then)
    p = dict(model._validated(), feature_norm=a["feature_norm"], gain=a["gain"])
    kernel = make_kernel(a["kernel"], **kp)
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
    return model

