"""Response maps: the projection of every patch position of whole images on a run's components.

A run fitted on image patches (``dkha ingest images``, possibly a ``--max-samples`` draw of the
positions) holds the training projections only at the positions it kept. A response map is the
projection of *every* position of an image's patch grid (the training store's ``patch`` and
``step``): the images are sent to the workers once, each task cuts its block of patches
exactly as ingest cuts them (:func:`dkha.data.patches.extract_patches`), and the blocks are
projected by the transform's tasks (:func:`dkha.runs.transform.project_blocks`: the same
kernel rows, the same centering with the training ``mk``, ``mkm``). The result is
``response (component, image, row, col)`` with the images' names as the ``image`` coordinate;
grid positions outside a smaller image's grid are NaN, every patch position of an image is a
number.

    dkha maps RUN IMAGE... -o maps.zarr
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import dask
import dask.array as da
import numpy as np
import xarray as xr

from dkha import config
from dkha.data import cf
from dkha.data.ingest import grey_values
from dkha.data.patches import patch_grid, patch_windows
from dkha.engine.cluster import client_for, shared
from dkha.errors import InputError, RunDirectoryError
from dkha.progress import phase
from dkha.runs.run import Run, as_run
from dkha.runs.transform import project_blocks, write_dataset

#: patches per projection task
BLOCK_PATCHES = 2048


def response_maps(run: Run | xr.Dataset | str | os.PathLike, images: Sequence, *,
                  names: Sequence[str] | None = None, block: int = BLOCK_PATCHES,
                  client=None) -> xr.DataArray:
    """The projections of every patch position of ``images`` on the run's components.

    Parameters
    ----------
    run : str, xarray.Dataset or Run
        A run (batch or online) fitted on image patches.
    images : sequence
        Image paths (``skimage:NAME`` for scikit-image's bundled photographs), ``.npy`` files or
        2-d arrays, read as ``dkha ingest images`` reads them.
    names : sequence of str, optional
        The ``image`` coordinate (default: the paths' file names, ``<array i>`` for arrays).
    block : int
        Patches per task.
    client : optional
        Where it runs (:func:`dkha.engine.cluster.client_for`).

    Returns
    -------
    xarray.DataArray
        ``response (component, image, row, col)``; ``row``, ``col`` index each image's patch
        grid (the patch at ``(row, col)`` has its top left corner at pixel
        ``(step·row, step·col)``); the coordinates ``image_rows``, ``image_cols`` give each
        image's grid (NaN beyond it, where another image's grid is larger).

    Examples
    --------
    >>> maps = response_maps("run", ["skimage:camera"])              # doctest: +SKIP
    >>> maps.sel(image="camera", component=0).plot(yincrease=False)  # doctest: +SKIP
    """
    run = as_run(run)
    patch, step = run.patch_geometry("response maps need")
    if len(images) == 0:
        raise InputError("no images given")
    if names is not None and len(names) != len(images):
        raise InputError(f"{len(names)} names for {len(images)} images")
    if int(block) < 1:
        raise InputError(f"block must be positive, got {block}")
    pictures, grids, labels = [], [], []
    for i, item in enumerate(images):
        img, name = grey_values(item, i)
        if img.shape[0] < patch or img.shape[1] < patch:
            raise InputError(f"image {name} of shape {img.shape} is smaller than a "
                             f"{patch}×{patch} patch")
        pictures.append(img)
        grids.append(patch_grid(img.shape, patch, step))
        labels.append(display_name(name) if names is None else str(names[i]))
    if len(set(labels)) != len(labels):
        labels = [f"{i}: {n}" for i, n in enumerate(labels)]
    with client_for(client, settings=config.settings()) as c:
        # said once the cluster is up: the heartbeat then names this, not the cluster's start
        phase(f"response maps: projecting {sum(g[0] * g[1] for g in grids)} patches of "
              f"{len(pictures)} images on the workers")
        # the images go to the workers once, as data; each task cuts its block of patches
        parts = [_patch_blocks(img, src, patch, step, int(block))
                 for img, src in zip(pictures, shared(c, *pictures))]
        flat = project_blocks(run, da.concatenate(parts, axis=0), client=c).compute()
    r = run.n_components
    rows, cols = max(g[0] for g in grids), max(g[1] for g in grids)
    out = np.full((r, len(pictures), rows, cols), np.nan)
    start = 0
    for i, (gr, gc) in enumerate(grids):
        out[:, i, :gr, :gc] = flat[start:start + gr * gc].T.reshape(r, gr, gc)
        start += gr * gc
    return xr.DataArray(
        out, dims=("component", "image", "row", "col"), name="response",
        coords={"component": ("component", run.ds["component"].values,
                              cf.VARIABLE_ATTRS["component"]),
                "image": ("image", np.array(labels, dtype=object), {"long_name": "image"}),
                "row": ("row", np.arange(rows), cf.VARIABLE_ATTRS["row"]),
                "col": ("col", np.arange(cols), cf.VARIABLE_ATTRS["col"]),
                "image_rows": ("image", np.array([g[0] for g in grids]),
                               {"long_name": "rows of the image's patch grid", "units": "1"}),
                "image_cols": ("image", np.array([g[1] for g in grids]),
                               {"long_name": "columns of the image's patch grid", "units": "1"})},
        attrs={"long_name": "projection on the component", "units": "1", "patch": patch,
               "step": step, **run.describe()})


def _patch_blocks(img: np.ndarray, src, patch: int, step: int, block: int) -> da.Array:
    """The patches of ``img`` (:func:`~dkha.data.patches.extract_patches`' rows) as a dask
    array of ``block`` rows a chunk, each chunk cut by its task from ``src`` (the image, or its
    future on the cluster)."""
    rows, cols = patch_grid(img.shape, patch, step)
    n = rows * cols
    cut = dask.delayed(_cut_patches, pure=True)
    return da.concatenate([
        da.from_delayed(cut(src, patch, step, a, min(a + block, n), cols),
                        shape=(min(a + block, n) - a, patch * patch), dtype=img.dtype)
        for a in range(0, n, block)], axis=0)


def _cut_patches(img: np.ndarray, patch: int, step: int, a: int, b: int, cols: int
                 ) -> np.ndarray:
    """Rows ``a:b`` of ``extract_patches(img, patch, step)``, cutting only the grid rows they
    lie on (the grid ``cols`` wide)."""
    first, last = a // cols, (b - 1) // cols + 1
    band = patch_windows(img, patch, step)[first:last].reshape(-1, patch * patch)
    return band[a - first * cols:b - first * cols]


def display_name(name: str) -> str:
    """``skimage:camera`` → ``camera``, ``dir/photo.png`` → ``photo.png``."""
    return name.split(":", 1)[1] if name.startswith("skimage:") else os.path.basename(name)


def save_maps(maps: xr.DataArray, out: str, *, overwrite: bool = False) -> xr.Dataset:
    """Write ``maps`` as a zarr store ``out`` (aside, then renamed into place)."""
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    ds = maps.to_dataset()
    # zarr v3 strings
    ds = ds.assign_coords(image=("image", ds["image"].values.astype(np.dtypes.StringDType()),
                                 ds["image"].attrs))
    # attrs as netCDF takes them (the kernel's parameters as JSON text), CF's global ones
    ds["response"].attrs = cf.encode_attrs(maps.attrs)
    ds.attrs = cf.encode_attrs(cf.dataset_attrs({
        "title": f"dkha response maps of {ds.sizes['image']} images on the components of "
                 f"{maps.attrs.get('run', maps.attrs.get('run_store'))}",
        "history": cf.stamped("maps")}))
    return write_dataset(ds, out)
