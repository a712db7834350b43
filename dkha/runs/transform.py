"""Projection of new samples on saved components.

Batch runs (coordinator-math.md §1 centering): ``k'(x)_j = k(x, x_j) − mk_j − k̄(x) + mkm`` with
the training ``mk``, ``mkm`` and ``k̄(x) = (1/l) Σ_j k(x, x_j)``; the projection on component
``i`` is ``Σ_j alpha[i, j] k'(x)_j``. Dictionary (online) runs: ``alpha · (k(D, x) − K_m β̄)``
(:func:`project_dictionary`).
"""

from __future__ import annotations

import os

import dask
import dask.array as da
import numpy as np
import xarray as xr
from distributed import Client, as_completed, futures_of

from dkha import config
from dkha.data import cf, result
from dkha.data.atomic import write_zarr_atomically
from dkha.data.result import sample_coords
from dkha.data.store import open_store
from dkha.engine.cluster import client_for, shared
from dkha.engine.tasks import project_rows
from dkha.errors import InputError, RunDirectoryError
from dkha.progress import Progress, phase
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
                        coords={"component": ("component", ds["component"].values,
                                              cf.VARIABLE_ATTRS["component"]),
                                **sample_coords(new.path)},
                        name="projection",
                        attrs={"long_name": "projection of the sample on the run's component",
                               "units": "1", **run.describe(),
                               "source": os.path.abspath(new_store)
                               if "://" not in new_store else new_store})


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


def projected(proj: xr.DataArray, client, verbose: bool = True) -> xr.DataArray:
    """``proj`` (lazy) computed on ``client``'s workers and held there (``n × r``: small), the
    samples projected so far, of all, in the progress (a line every few seconds outside a
    terminal); as it is where ``client`` is not a cluster's."""
    if not isinstance(client, Client):
        return proj
    data = client.persist(proj.data)
    rows = dict(zip((k[1] for k in dask.core.flatten(data.__dask_keys__())), data.chunks[0]))
    with Progress(verbose, int(data.shape[0]), "transform: projecting", unit="sample") as bar:
        for future in as_completed(futures_of(data)):
            if future.status == "error":
                future.result()     # the task's error, here
            bar.update(rows[future.key[1]])
    return proj.copy(data=data)


def transform_store(ds: xr.Dataset | Run, new_store: str, out: str, *, overwrite: bool = False,
                    client=None, verbose: bool = True) -> xr.Dataset:
    """Project every sample of a data store; write ``projection (sample, component)`` to ``out``
    (blockwise on the cluster, the fraction of samples projected in the progress, then written
    aside and renamed into place), its attrs naming the run (its directory where known, its
    store, algorithm, kernel and the kernel's parameters, e.g. σ)."""
    run = as_run(ds)
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    if os.path.abspath(out) in (os.path.abspath(new_store), os.path.abspath(run.store_path)):
        raise RunDirectoryError(f"{out} is an input of this transform; write elsewhere")
    with client_for(client, settings=config.settings()) as c:
        proj = projected(transform_lazy(run, new_store, client=c), c, verbose)
        res = proj.to_dataset()
        # the run it came from (directory, kernel and its parameters, e.g. σ) in the global
        # attrs, as netCDF takes them
        run_name = proj.attrs.get("run", proj.attrs["run_store"])
        about = {k: v for k, v in proj.attrs.items() if k not in ("long_name", "units")}
        res.attrs = cf.dataset_attrs({
            **about, "title": f"dkha projections of {proj.attrs['source']} on the "
                                   f"components of {run_name}",
            "history": cf.stamped(f"transform of {proj.attrs['source']} by {run_name}")})
        res["projection"].attrs = {k: proj.attrs[k] for k in ("long_name", "units")}
        return write_dataset(result.encoded(res), out, client=c)


def write_dataset(res: xr.Dataset, out: str, *, client=None) -> xr.Dataset:
    """Write ``res`` (lazy parts computed on the cluster) aside and rename it into ``out``
    (:func:`~dkha.data.atomic.write_zarr_atomically`)."""
    phase(f"writing {out}")
    with client_for(client, settings=config.settings()):
        write_zarr_atomically(res, out)
    return xr.open_zarr(out)
