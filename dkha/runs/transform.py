"""Projection of new samples on saved components.

Batch runs (coordinator-math.md §1 centering): ``k'(x)_j = k(x, x_j) − mk_j − k̄(x) + mkm`` with
the training ``mk``, ``mkm`` and ``k̄(x) = (1/l) Σ_j k(x, x_j)``; the projection on component
``i`` is ``Σ_j alpha[i, j] k'(x)_j``. Dictionary (online) runs: ``alpha · (k(D, x) − K_m β̄)``
(:func:`project_dictionary`).
"""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import xarray as xr

from dkha import config
from dkha.data.atomic import write_zarr_atomically
from dkha.data.result import sample_coords
from dkha.data.store import open_store
from dkha.engine.cluster import client_for, shared
from dkha.engine.tasks import project_rows
from dkha.errors import InputError, RunDirectoryError
from dkha.progress import phase
from dkha.runs.run import Run, as_run


def project_dictionary(ds, X: np.ndarray) -> np.ndarray:
    """Projections of the rows of ``X`` on the components of a saved dictionary (online) run.

    ``alpha · (k(D, x) − K_m β̄)`` with ``D = dictionary``, ``β̄ = mean_coefficient``.
    """
    run = as_run(ds)
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    run.check_features(X.shape[1])
    kernel = run.kernel
    D = run.ds["dictionary"].values
    alpha = run.ds["alpha"].values
    beta_bar = run.ds["mean_coefficient"].values
    Kx = kernel.block(X, D)
    if np.any(beta_bar):
        Kx = Kx - kernel.block(D, D) @ beta_bar
    return Kx @ alpha.T


def project(ds: xr.Dataset | Run, X: np.ndarray, *, client=None) -> np.ndarray:
    """``(n, n_components)`` projections of the rows of ``X``."""
    run = as_run(ds)
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    if run.is_dictionary:  # no kernel rows of the training data
        return project_dictionary(run, X)
    run.check_features(X.shape[1])
    if not np.isfinite(X).all():
        raise InputError("new data holds NaN or inf")
    with client_for(client, settings=config.settings()) as c:
        return run.engine(c).transform(X, run.ds["alpha"].values)


def transform_lazy(ds: xr.Dataset | Run, new_store: str, *, client=None) -> xr.DataArray:
    """Projections of a data store's samples as a lazy, blockwise ``(sample, component)`` array.

    One dask task per chunk of the new store; each reads its chunk and the training chunks
    (cached per worker process) and projects them. Compute it under any Dask scheduler, or write
    it with ``.to_zarr``; with the ``client`` that will compute it, the run's coefficients are
    sent to its workers once, not inside the graph (:func:`project_blocks`).
    """
    run = as_run(ds)
    ds = run.ds
    new = open_store(new_store, check_finite=True)
    run.check_features(new.n_features, new_store)
    proj = project_blocks(run, da.from_zarr(new.array()), client=client)
    return xr.DataArray(proj, dims=("sample", "component"),
                        coords={"component": ds["component"].values, **sample_coords(new.path)},
                        name="projection",
                        attrs={"run_store": ds.attrs["store"], "source": os.path.abspath(new_store)
                               if "://" not in new_store else new_store,
                               "algorithm": ds.attrs["algorithm"]})


def project_blocks(run: Run, X: da.Array, *, client=None) -> da.Array:
    """The lazy ``(n, n_components)`` projections of the rows of the dask array ``X``: one task
    per block of rows, each projecting against the training chunks (cached per worker process)
    or an online run's dictionary. With the ``client`` that will compute it, the run's ``alpha``
    and ``mk`` (or the dictionary) go to its workers once, as data
    (:func:`~dkha.engine.cluster.shared`), not inside every task of the graph."""
    r = run.n_components
    if run.is_dictionary:
        (small,) = shared(client, run.dictionary_part(), broadcast=True)
        return X.map_blocks(_project_dictionary_block, small, dtype=np.float64,
                            chunks=(X.chunks[0], (r,)))
    train = run.training_store()
    groups = tuple((a, b) for a, b in (train.chunk_bounds(i) for i in range(train.n_chunks)))
    mk, alpha = shared(client, run.ds["mk"].values, run.alpha, broadcast=True)
    return X.map_blocks(_project_chunk, train.path, run.kernel, mk,
                        float(run.ds.attrs["mkm"]), groups, alpha, dtype=np.float64,
                        chunks=(X.chunks[0], (r,)))


def _project_dictionary_block(Xb, small):
    return project_dictionary(small, Xb)


def _project_chunk(Xc, path, kernel, mk, mkm, groups, alpha):
    return project_rows(path, kernel, np.asarray(Xc, dtype=np.float64), mk, mkm,
                        tuple((g,) for g in groups), alpha)


def transform_store(ds: xr.Dataset | Run, new_store: str, out: str, *, overwrite: bool = False,
                    client=None) -> xr.Dataset:
    """Project every sample of a data store; write ``projection (sample, component)`` to ``out``
    (blockwise on the cluster, written aside and renamed into place)."""
    run = as_run(ds)
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    if os.path.abspath(out) in (os.path.abspath(new_store), os.path.abspath(run.store_path)):
        raise RunDirectoryError(f"{out} is an input of this transform; write elsewhere")
    with client_for(client, settings=config.settings()) as c:
        proj = transform_lazy(run, new_store, client=c)
        res = proj.to_dataset()
        res.attrs = dict(proj.attrs)
        return write_dataset(res, out, client=c)


def write_dataset(res: xr.Dataset, out: str, *, client=None) -> xr.Dataset:
    """Write ``res`` (lazy parts computed on the cluster) aside and rename it into ``out``
    (:func:`~dkha.data.atomic.write_zarr_atomically`)."""
    phase(f"projecting and writing {out} on the workers")
    with client_for(client, settings=config.settings()):
        write_zarr_atomically(res, out)
    return xr.open_zarr(out)
