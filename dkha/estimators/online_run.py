"""An online run loaded: the fitted estimator back from a dictionary run's ``components.zarr``
(:func:`dkha.fit.run_dir.run_dataset`; its schema: :mod:`dkha.estimators.online`)."""

from __future__ import annotations

from dataclasses import replace

import xarray as xr

from dkha import algorithms
from dkha.data import result
from dkha.errors import InputError
from dkha.estimators.params import ONLINE, from_attrs
from dkha.fit.online import OnlineFit, new_solver
from dkha.kernels import spec_of
from dkha.runs.run import kernel_of


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
    # its settings as a fit would be asked them, with the scales the run was fitted with (the
    # unit of eta0, read off its data then)
    settings = replace(model._request(None).model, feature_norm=a["feature_norm"],
                       gain=a["gain"])
    kernel = kernel_of(ds)
    solver = new_solver(settings, int(a["n_features"]), kernel, model.seed)
    if "state_B" not in ds:
        raise InputError("this run was saved without the solver's state (dkha before "
                         "0.1.0+state); it can be analysed but not continued")
    # the solver's snapshot (dkha.fit.run_dir.run_dataset): its state_* and member variables
    arrays = {k.removeprefix("state_"): ds[k].values for k in ds.data_vars
              if k.startswith("state_") or k in ("dictionary", "member_index", "member_step")}
    solver.restore(arrays, a["state_scalars"])
    attrs = {k: v for k, v in a.items() if k not in ("members", "state_scalars")}
    if "algorithm" in a:
        attrs["algorithm"] = model.algorithm
    model._keep(OnlineFit(
        solver, settings, kernel, result.history_of(ds),
        float(ds["wall_time"].values[-1]) if ds.sizes.get("evaluation") else 0.0, {}, None,
        ds["eigenvalue"].values.copy(), int(a["n_steps"]), attrs))
    return model

