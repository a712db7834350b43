"""Projection of new samples on saved components (coordinator-math.md §1 centering).

``k'(x)_j = k(x, x_j) − mk_j − k̄(x) + mkm`` with the training ``mk``, ``mkm`` and
``k̄(x) = (1/l) Σ_j k(x, x_j)``; the projection on component ``i`` is ``Σ_j alpha[i, j] k'(x)_j``.
"""

from __future__ import annotations

import os

import numpy as np
import xarray as xr

from dkha.cluster import client_for
from dkha.errors import InputError, RunDirectoryError
from dkha.kernels import make_kernel
from dkha.rows import RowEngine, project_rows
from dkha.store import consolidate, open_store, replace_directory, sample_coords


def kernel_of(ds: xr.Dataset):
    return make_kernel(ds.attrs["kernel"], **ds.attrs.get("kernel_parameters", {}))


def engine_for_run(ds: xr.Dataset, client, cache_rows: bool | None = None) -> RowEngine:
    """The row engine of a batch run's training store and kernel, with the run's centering."""
    store = open_store(ds.attrs["store"])
    if store.n_samples != ds.sizes["sample"]:
        raise InputError(f"the training store {store.path} now holds {store.n_samples} samples; "
                         f"the run was fitted on {ds.sizes['sample']}")
    engine = RowEngine(store, kernel_of(ds), client, cache_rows=cache_rows)
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
        return engine_for_run(ds, c).transform(X, ds["alpha"].values)


def transform_lazy(ds: xr.Dataset, new_store: str) -> xr.DataArray:
    """Projections of a data store's samples as a lazy, blockwise ``(sample, component)`` array.

    One dask task per chunk of the new store; each reads its chunk and the training chunks
    (cached per worker process) and projects them. Compute it under any Dask scheduler, or write
    it with ``.to_zarr``.
    """
    import dask.array as da

    new = open_store(new_store, check_finite=True)
    if new.n_features != int(ds.attrs["n_features"]):
        raise InputError(f"{new_store} has {new.n_features} features; the run was fitted on "
                         f"{ds.attrs['n_features']}")
    X = da.from_zarr(new.array())
    r = ds.sizes["component"]
    alpha = np.ascontiguousarray(ds["alpha"].values)
    if "dictionary" in ds:
        from dkha.online import project as project_online

        small = ds[["alpha", "dictionary", "mean_coefficient"]].load()
        small.attrs = dict(ds.attrs)
        proj = X.map_blocks(lambda b: project_online(small, b), dtype=np.float64,
                            chunks=(X.chunks[0], (r,)))
    else:
        train = open_store(ds.attrs["store"])
        groups = tuple((a, b) for a, b in (train.chunk_bounds(i) for i in range(train.n_chunks)))
        proj = X.map_blocks(_project_chunk, train.path, kernel_of(ds), ds["mk"].values,
                            float(ds.attrs["mkm"]), groups, alpha, dtype=np.float64,
                            chunks=(X.chunks[0], (r,)))
    return xr.DataArray(proj, dims=("sample", "component"),
                        coords={"component": ds["component"].values, **sample_coords(new.path)},
                        name="projection",
                        attrs={"run_store": ds.attrs["store"], "source": os.path.abspath(new_store)
                               if "://" not in new_store else new_store,
                               "algorithm": ds.attrs["algorithm"]})


def _project_chunk(Xc, path, kernel, mk, mkm, groups, alpha):
    return project_rows(path, kernel, np.asarray(Xc, dtype=np.float64), mk, mkm,
                        tuple((g,) for g in groups), alpha)


def transform_store(ds: xr.Dataset, new_store: str, out: str, *, overwrite: bool = False,
                    client=None, scheduler=None, scheduler_file=None, workers=None) -> xr.Dataset:
    """Project every sample of a data store; write ``projection (sample, component)`` to ``out``
    (blockwise on the cluster, written aside and renamed into place)."""
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    if os.path.abspath(out) in (os.path.abspath(new_store), os.path.abspath(ds.attrs["store"])):
        raise RunDirectoryError(f"{out} is an input of this transform; write elsewhere")
    proj = transform_lazy(ds, new_store)
    res = proj.to_dataset()
    res.attrs = dict(proj.attrs)
    tmp = out + ".tmp"
    with client_for(scheduler, scheduler_file, workers, client):
        res.to_zarr(tmp, mode="w", consolidated=False, zarr_format=3)
    consolidate(tmp)
    replace_directory(tmp, out)
    return xr.open_zarr(out)
