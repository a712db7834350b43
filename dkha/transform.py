"""Projection of new samples on saved components (coordinator-math.md §1 centering).

``k'(x)_j = k(x, x_j) − mk_j − k̄(x) + mkm`` with the training ``mk``, ``mkm`` and
``k̄(x) = (1/l) Σ_j k(x, x_j)``; the projection on component ``i`` is ``Σ_j alpha[i, j] k'(x)_j``.
"""

from __future__ import annotations

import os

import numpy as np
import xarray as xr

from dkha.cluster import client_for
from dkha.store import consolidate
from dkha.errors import InputError, RunDirectoryError
from dkha.kernels import make_kernel
from dkha.rows import RowEngine
from dkha.store import StoreWriter, open_store  # noqa: F401  (StoreWriter: same overwrite rules)


def kernel_of(ds: xr.Dataset):
    return make_kernel(ds.attrs["kernel"], **ds.attrs.get("kernel_parameters", {}))


def _engine(ds: xr.Dataset, client) -> RowEngine:
    store = open_store(ds.attrs["store"])
    if store.n_samples != ds.sizes["sample"]:
        raise InputError(f"the training store {store.path} now holds {store.n_samples} samples; "
                         f"the run was fitted on {ds.sizes['sample']}")
    engine = RowEngine(store, kernel_of(ds), client)
    engine.set_mk(ds["mk"].values, float(ds.attrs["mkm"]))
    return engine


def project(ds: xr.Dataset, X: np.ndarray, *, client=None, scheduler=None, scheduler_file=None,
            workers=None) -> np.ndarray:
    """``(n, n_components)`` projections of the rows of ``X``."""
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    if "dictionary" in ds:  # online (dictionary-based) run: no kernel rows of the training data
        from dkha.online import project as project_online

        return project_online(ds, X)
    if X.shape[1] != int(ds.attrs["n_features"]):
        raise InputError(f"new data has {X.shape[1]} features; the run was fitted on {ds.attrs['n_features']}")
    if not np.isfinite(X).all():
        raise InputError("new data holds NaN or inf")
    with client_for(scheduler, scheduler_file, workers, client) as c:
        return _engine(ds, c).transform(X, ds["alpha"].values)


def transform_store(ds: xr.Dataset, new_store: str, out: str, *, overwrite: bool = False,
                    client=None, scheduler=None, scheduler_file=None, workers=None) -> xr.Dataset:
    """Project every sample of a data store; write ``projection (sample, component)`` to ``out``."""
    new = open_store(new_store, check_finite=True)
    if new.n_features != int(ds.attrs["n_features"]):
        raise InputError(f"{new_store} has {new.n_features} features; the run was fitted on "
                         f"{ds.attrs['n_features']}")
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    alpha = ds["alpha"].values
    parts = []
    if "dictionary" in ds:
        parts = [project(ds, Xc) for _, _, Xc in new.iter_chunks()]
    else:
        with client_for(scheduler, scheduler_file, workers, client) as c:
            engine = _engine(ds, c)
            for _, _, Xc in new.iter_chunks():
                parts.append(engine.transform(Xc, alpha))
    proj = np.concatenate(parts)
    res = xr.Dataset({"projection": (("sample", "component"), proj)},
                     coords={"component": ds["component"].values},
                     attrs={"run_store": ds.attrs["store"], "source": os.path.abspath(new_store),
                            "algorithm": ds.attrs["algorithm"]})
    tmp = out + ".tmp"
    res.to_zarr(tmp, mode="w", consolidated=False, zarr_format=3)
    consolidate(tmp)
    if os.path.exists(out):
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    return res
