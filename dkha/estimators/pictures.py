"""What a run's components look like and where they respond, for patch data.

* :func:`component_images` — each component's pre-image as a picture
  ``component_image (component, patch_row, patch_col)``: the input-space patch whose image in
  feature space is closest to the point two standard deviations along the component from the
  mean (:class:`dkha.apply.preimage.RunPreimages`, the pre-images dkha denoises with);
* :func:`projection_array` — the training samples' projections ``projection (sample,
  component)`` with the data store's provenance coordinates (image, image_name, row, col), so
  ``projection.set_index(sample=["image", "row", "col"]).unstack()`` is a response map per
  image and component.
"""

from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from dkha.apply.preimage import RunPreimages
from dkha.data.result import sample_coords
from dkha.data.store import DataStore
from dkha.progress import phase

log = logging.getLogger(__name__)

#: standard deviations along a component at which its pre-image is taken
PICTURE_DEVIATIONS = 2.0


def is_patch_store(store: DataStore) -> bool:
    """Whether the store holds square image patches (``dkha ingest images``)."""
    patch = store.attrs.get("patch")
    return patch is not None and int(patch) ** 2 == store.n_features


def projection_array(C: np.ndarray, store: DataStore | None) -> xr.DataArray:
    """``projection (sample, component)`` from ``C = A K'`` (component × sample), with the
    store's provenance coordinates."""
    coords = {"component": np.arange(C.shape[0])}
    if store is not None and store.rows is None:    # (written from an array: no provenance)
        coords.update(sample_coords(store.path))
    return xr.DataArray(np.ascontiguousarray(np.asarray(C, dtype=np.float64).T),
                        dims=("sample", "component"), coords=coords, name="projection")


def component_images(ds: xr.Dataset, client, store: DataStore, spread: np.ndarray, *,
                     seed: int = 0, iterations: int = 50) -> xr.DataArray:
    """Pre-images of ``mean + PICTURE_DEVIATIONS · spread_i · w_i`` per component ``i``, as
    ``(component, patch_row, patch_col)`` pictures.

    ``spread``: the standard deviation of the training projections on each component. The
    iteration starts from the mean of a seeded sample of the data.
    """
    phase("component pictures (pre-images)")
    r = ds.sizes["component"]
    side = int(store.attrs["patch"])
    pre = RunPreimages(ds, client, iterations=iterations)
    y = np.diag(PICTURE_DEVIATIONS * np.asarray(spread, dtype=np.float64))
    start = np.repeat(store.sample(2000, seed).mean(axis=0, keepdims=True), r, axis=0)
    res = pre.from_projections(y, start)
    log.info("component pictures: %d of %d pre-images converged in %d iterations",
             int(res.converged.sum()), r, res.iterations)
    return xr.DataArray(res.Z.reshape(r, side, side), dims=("component", "patch_row", "patch_col"),
                        coords={"component": ds["component"].values}, name="component_image",
                        attrs={"meaning": f"pre-image of the mean + {PICTURE_DEVIATIONS:g} "
                                          "standard deviations along the component",
                               "method": pre.method})
