"""Images as samples: reading grey-scale pictures and cutting them into patches on a grid."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from dkha.errors import InputError, StoreNotFoundError

BUNDLED_PREFIX = "skimage:"


def read_grey_image(path: str) -> np.ndarray:
    """A grey-scale image as float64 in [0, 1].

    ``skimage:NAME`` names one of scikit-image's bundled photographs (e.g. ``skimage:camera``).
    Colour images are converted with ``skimage.color.rgb2gray``; an alpha channel is dropped.
    """
    import skimage.color
    import skimage.data
    import skimage.io
    import skimage.util

    if path.startswith(BUNDLED_PREFIX):
        name = path[len(BUNDLED_PREFIX):]
        fn = getattr(skimage.data, name, None)
        if fn is None or not callable(fn):
            raise InputError(f"scikit-image has no bundled image {name!r}")
        img = fn()
    else:
        if not os.path.exists(path):
            raise StoreNotFoundError(f"no such image: {path}")
        try:
            img = skimage.io.imread(path)
        except Exception as exc:  # noqa: BLE001 - whatever the reader raises: one line
            raise InputError(f"cannot read image {path}: {exc}") from None
    img = np.asarray(img)
    if img.ndim == 3:
        if img.shape[2] == 4:
            img = img[..., :3]
        if img.shape[2] == 3:
            img = skimage.color.rgb2gray(img)
        elif img.shape[2] == 1:
            img = img[..., 0]
        else:
            raise InputError(f"image {path} has {img.shape[2]} channels; "
                             "expected grey, RGB or RGBA")
    elif img.ndim != 2:
        raise InputError(f"image {path} has shape {img.shape}; expected a 2-d picture")
    img = skimage.util.img_as_float64(img)
    if img.min() < 0 or img.max() > 1:  # float images outside [0, 1]: rescale
        lo, hi = float(img.min()), float(img.max())
        img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    return img


def patch_grid(shape: tuple[int, int], patch: int, step: int) -> tuple[int, int]:
    """Number of patch positions (rows, cols) on the grid of an image of ``shape``."""
    return (shape[0] - patch) // step + 1, (shape[1] - patch) // step + 1


def patch_windows(img: np.ndarray, patch: int, step: int) -> np.ndarray:
    """The ``grid rows × grid cols × patch × patch`` view of an image's patches (no copy)."""
    from skimage.util import view_as_windows

    if img.shape[0] < patch or img.shape[1] < patch:
        raise InputError(f"image of shape {img.shape} is smaller than a {patch}×{patch} patch")
    return view_as_windows(np.ascontiguousarray(img), (patch, patch), step=step)


def extract_patches(img: np.ndarray, patch: int, step: int) -> np.ndarray:
    """Patches of ``patch×patch`` pixels on a grid of ``step``, row-major, as rows."""
    return patch_windows(img, patch, step).reshape(-1, patch * patch)


def patch_bands(img: np.ndarray, patch: int, step: int, rows: int) -> Iterator[np.ndarray]:
    """:func:`extract_patches` in pieces of whole grid rows, about ``rows`` patches each (at
    least one grid row): an image's patches are never all held at once."""
    win = patch_windows(img, patch, step)
    per_band = max(1, rows // win.shape[1])
    for a in range(0, win.shape[0], per_band):
        yield win[a:a + per_band].reshape(-1, patch * patch)


def patch_coords(images: list[dict], keep: list[np.ndarray] | None = None) -> dict:
    """Where each patch came from, from the ``images`` entries of a patch store's attrs: the
    image's index and name, and the patch's row and column on that image's patch grid, as
    :meth:`StoreWriter.commit` coordinates (computed for one range of samples at a time).
    ``keep``: per image, the sorted raster positions of the patches kept (``--max-samples``)."""
    first = np.array([im["first_sample"] for im in images], dtype=np.int64)
    cols = np.array([im["grid"][1] for im in images], dtype=np.int64)
    # the names as numpy's fixed-width strings: xarray reads them back as such (zarr's
    # variable-length strings come back as StringDType, which unstacking cannot pad)
    names = np.array([str(im["path"]) for im in images])
    raster = None if keep is None else np.concatenate(keep).astype(np.int64)

    def image(a, b):
        return np.searchsorted(first, np.arange(a, b), side="right") - 1

    def position(a, b):
        """The patches' raster positions on their images' grids, and the grids' widths."""
        i = image(a, b)
        return (np.arange(a, b) - first[i] if raster is None else raster[a:b]), cols[i]

    return {"image": (np.int32, lambda a, b: image(a, b).astype(np.int32)),
            "image_name": (names.dtype, lambda a, b: names[image(a, b)]),
            "row": (np.int32, lambda a, b: np.floor_divide(*position(a, b)).astype(np.int32)),
            "col": (np.int32, lambda a, b: np.remainder(*position(a, b)).astype(np.int32))}
