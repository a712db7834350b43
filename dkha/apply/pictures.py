"""What a run's components look like, for patch data: the named step after a batch fit of
image patches (:func:`add_component_pictures`).

* :func:`component_images` — each component's pre-image as a picture
  ``component_image (component, patch_row, patch_col)``: the input-space patch whose image in
  feature space is closest to the point two standard deviations along the component from the
  mean (:class:`dkha.apply.preimage.RunPreimages`, the pre-images dkha denoises with).

Where the components respond is the run's ``projection (sample, component)`` with the data
store's provenance coordinates (:func:`dkha.data.result.projection_array`), so
``projection.set_index(sample=["image", "row", "col"]).unstack()`` is a response map per image
and component.
"""

from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from dkha import config
from dkha.apply.preimage import RunPreimages
from dkha.data import cf, result
from dkha.data.store import DataStore
from dkha.engine.cluster import client_for
from dkha.progress import phase

log = logging.getLogger(__name__)

#: standard deviations along a component at which its pre-image is taken
PICTURE_DEVIATIONS = 2.0


def is_patch_store(store: DataStore) -> bool:
    """Whether the store holds square image patches (``dkha ingest images``)."""
    patch = store.attrs.get("patch")
    return patch is not None and int(patch) ** 2 == store.n_features


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
    return picture_array(res.Z.reshape(r, side, side), ds["component"].values,
                         {"meaning": f"pre-image of the mean + {PICTURE_DEVIATIONS:g} standard "
                                     "deviations along the component", "method": pre.method})


def picture_array(pictures: np.ndarray, component: np.ndarray, attrs: dict) -> xr.DataArray:
    """``component_image (component, patch_row, patch_col)`` of the ``pictures`` (each in image
    order: its first row the top). ``patch_row`` counts up from the bottom edge, as a plot's
    y axis does, so ``.plot.imshow()`` (and ``.plot()``) draw each picture upright;
    ``patch_col`` counts from the left edge."""
    rows, cols = pictures.shape[1:]
    return xr.DataArray(
        pictures, dims=("component", "patch_row", "patch_col"), name="component_image",
        coords={"component": ("component", component, cf.VARIABLE_ATTRS["component"]),
                "patch_row": ("patch_row", np.arange(rows)[::-1], cf.VARIABLE_ATTRS["patch_row"]),
                "patch_col": ("patch_col", np.arange(cols), cf.VARIABLE_ATTRS["patch_col"])},
        attrs={**cf.VARIABLE_ATTRS["component_image"], **attrs})


def pictures_cluster(store: DataStore, client=None):
    """The cluster the pictures of fits on ``store`` are drawn on, one for all the models fitted
    together (:func:`dkha.engine.cluster.client_for` of ``client``: an open one as it is; none
    for at most ``dkha.inline-samples`` samples), closed on exit if started here."""
    return client_for(client, samples=store.n_samples, settings=config.settings())


def add_component_pictures(ds: xr.Dataset, store: DataStore, *, client=None,
                           run_dir: str | None = None) -> xr.DataArray:
    """The step after a batch fit of image patches: the pictures of the fitted run ``ds`` (its
    ``components.zarr`` dataset, with the training ``projection``), on the cluster ``client``
    names (:func:`dkha.engine.cluster.client_for`; none for at most ``dkha.inline-samples``
    samples), added to the saved run in ``run_dir`` if given. The spread of each component is
    its training projections' standard deviation; the seed is the run's."""
    # the projections as the fit computed them (component × sample): the same bits of spread
    spread = np.ascontiguousarray(ds["projection"].values.T).std(axis=1)
    with client_for(client, samples=store.n_samples, settings=config.settings()) as c:
        pictures = component_images(ds, c, store, spread, seed=int(ds.attrs["seed"]))
    if run_dir is not None:
        result.add_variable(run_dir, pictures)
    return pictures
