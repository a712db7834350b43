"""Ingest: filling data stores from arrays (``.npy``, NumPy, dask) and from images cut into
patches, chunk by chunk, never holding a whole corpus.

Arrays are copied chunk by chunk from a memory map, images are cut into patches one band of
patch rows at a time and appended.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence

import dask.array as da
import numpy as np

from dkha.data.patches import patch_bands, patch_coords, patch_grid, read_grey_image
from dkha.data.store import DataStore
from dkha.data.writer import StoreWriter
from dkha.errors import InputError, ParameterError, StoreNotFoundError
from dkha.schedule import Stream, random_stream

log = logging.getLogger(__name__)


def _check_matrix(data, name: str) -> None:
    """Refuse what cannot be a store's ``X``: not 2-d, not numeric, or empty."""
    if data.ndim != 2:
        raise InputError(f"{name}: expected a 2-d array (samples × features), "
                         f"got shape {data.shape}")
    if data.dtype.kind not in "fiub":
        raise InputError(f"{name}: dtype {data.dtype} is not numeric")
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise InputError(f"{name} is empty (shape {data.shape})")


def ingest_array(src: str | os.PathLike | np.ndarray, out: str | os.PathLike, *,
                 labels: str | os.PathLike | np.ndarray | None = None,
                 chunk_rows: int | None = None, overwrite: bool = False,
                 patch: int | None = None, step: int | None = None) -> DataStore:
    """Copy a 2-d array (``.npy`` file or in-memory array) into a data store.

    ``.npy`` files are memory-mapped and copied chunk by chunk. Non-finite values are refused
    (the row range is named) and nothing is written.

    ``patch``: the rows are ``patch×patch`` image patches, flattened row by row (as
    :func:`ingest_images` cuts them); recorded with ``step`` (default 2, the grid on which
    ``dkha maps`` and ``dkha denoise`` cut whole images) like an image store's geometry, so a
    fit on it gets what patches get: σ = 3× the median distance, component pictures, response
    maps and denoising. Refused unless every row has ``patch²`` values.
    """
    name = "<array>"
    if isinstance(src, np.ndarray):
        data = src
    else:
        name = os.fspath(src)
        data = _load_npy(name, mmap=True)
    _check_matrix(data, name)
    geometry = _patch_geometry(patch, step, data.shape[1], name)
    lab = None
    if labels is not None:
        lab = labels if isinstance(labels, np.ndarray) else _load_npy(labels)
        if lab.shape != (data.shape[0],):
            raise InputError(f"labels must have shape ({data.shape[0]},), got {lab.shape}")
    writer = StoreWriter(out, data.shape[1], chunk_rows=chunk_rows, overwrite=overwrite,
                         with_labels=lab is not None,
                         label_dtype=lab.dtype if lab is not None else "i8")
    try:
        step = writer.chunk_rows
        for a in range(0, data.shape[0], step):
            block = np.asarray(data[a:a + step], dtype=np.float64)
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                rows = np.flatnonzero(bad) + a
                raise InputError(f"{name}: non-finite values (NaN or inf) in rows starting at "
                                 f"{rows[0]} ({bad.sum()} rows in {a}..{a + len(block) - 1})")
            writer.append(block, None if lab is None else lab[a:a + step])
        return writer.commit({"source": {"kind": "array", "path": name, "shape": list(data.shape),
                                         "dtype": str(data.dtype)}, **geometry})
    except BaseException:
        writer.abort()
        raise


def _patch_geometry(patch: int | None, step: int | None, n_features: int, name: str) -> dict:
    """The store attrs declaring rows of ``patch×patch`` patches (none without ``patch``)."""
    if patch is None:
        if step is not None:
            raise ParameterError("step is the grid of patches: it needs patch")
        return {}
    step = 2 if step is None else step
    if patch < 1 or step < 1:
        raise ParameterError(f"patch and step must be positive, got patch={patch}, step={step}")
    if patch * patch != n_features:
        raise InputError(f"{name}: rows of {n_features} values are not {patch}×{patch} patches "
                         f"({patch * patch} values)")
    return {"patch": int(patch), "step": int(step)}


def ingest_dask(X, out: str | os.PathLike, *, chunk_rows: int | None = None,
                overwrite: bool = False) -> DataStore:
    """Write a 2-d dask array into a data store blockwise: the chunks are computed and written
    where Dask runs them (the workers, under a distributed client); nothing is gathered here."""
    _check_matrix(X, "<dask array>")
    writer = StoreWriter(out, X.shape[1], chunk_rows=chunk_rows, overwrite=overwrite)
    try:
        writer.X.resize(X.shape)
        da.store(X.astype(np.float64).rechunk((writer.chunk_rows, X.shape[1])), writer.X,
                 lock=False)
        writer.n = int(X.shape[0])
        return writer.commit({"source": {"kind": "dask", "shape": list(X.shape),
                                         "dtype": str(X.dtype)}})
    except BaseException:
        writer.abort()
        raise


def ingest_images(paths: Sequence, out: str | os.PathLike, *, patch: int = 11, step: int = 2,
                  chunk_rows: int | None = None, max_samples: int | None = None,
                  seed: int = 0, overwrite: bool = False) -> DataStore:
    """Cut grey-scale images into patches and store them as samples.

    Each image is read, converted to grey in [0, 1], cut into ``patch×patch`` patches on a grid
    of ``step`` pixels, and appended a band of grid rows at a time (memory: one image and one
    chunk of patches). ``max_samples`` keeps that many patches spread over all the images: a
    seeded (``seed``) uniform sample of the grid positions of every image, in raster order
    (the first ``N`` patches would be the top rows of the first image — e.g. camera's sky).
    Attrs record, per image, its path, shape, the patch grid and the range of samples it
    produced (and with ``max_samples``, how many of its positions were drawn), so patches can
    be put back. An item may also be a 2-d array or a ``.npy`` file of one: taken as grey values
    as they are (no rescaling — a noisy image keeps values outside [0, 1]).
    """
    if patch < 1 or step < 1:
        raise ParameterError(f"patch and step must be positive, got patch={patch}, step={step}")
    if max_samples is not None and max_samples < 1:
        raise ParameterError(f"max_samples must be positive, got {max_samples}")
    if paths is None or len(paths) == 0:
        raise InputError("no images given")
    keep = None        # per image: the sorted positions (raster order) of its kept patches
    if max_samples is not None:
        sizes = [int(np.prod(patch_grid(grey_values(p, i)[0].shape, patch, step)))
                 for i, p in enumerate(paths)]
        if max_samples < sum(sizes):
            drawn = np.sort(random_stream(seed, Stream.PATCH_SAMPLE).choice(
                sum(sizes), size=int(max_samples), replace=False))
            starts = np.cumsum([0] + sizes)
            keep = [drawn[(drawn >= a) & (drawn < b)] - a for a, b in itertools.pairwise(starts)]
    writer = StoreWriter(out, patch * patch, chunk_rows=chunk_rows, overwrite=overwrite)
    images = []
    try:
        for i, p in enumerate(paths):
            first = writer.rows_appended
            img, name = grey_values(p, i)
            position = 0
            for band in patch_bands(img, patch, step, writer.chunk_rows):
                if keep is not None:
                    chosen = keep[i][(keep[i] >= position) & (keep[i] < position + len(band))]
                    position += len(band)
                    band = band[chosen - (position - len(band))]
                if len(band):
                    writer.append(band)
            images.append({"path": name, "shape": list(img.shape),
                           "grid": list(patch_grid(img.shape, patch, step)),
                           "first_sample": first, "n_samples": writer.rows_appended - first})
            log.info("ingested %s: %d patches", name, images[-1]["n_samples"])
        attrs = {"source": {"kind": "images", "images": images}, "patch": patch, "step": step,
                 "scaling": "grey, [0, 1] (skimage img_as_float)"}
        if max_samples is not None:
            attrs["max_samples"] = int(max_samples)
            attrs["sample"] = ({"kind": "seeded uniform sample of the patch positions",
                                "seed": int(seed)} if keep is not None else "all patches")
        return writer.commit(attrs, coords=patch_coords(images, keep))
    except BaseException:
        writer.abort()
        raise


def _load_npy(path, what: str = "file", mmap: bool = False) -> np.ndarray:
    """A ``.npy`` array (never unpickled; memory-mapped with ``mmap``), or a one-line error."""
    name = os.fspath(path)
    if not os.path.exists(name):
        raise StoreNotFoundError(f"no such {what}: {name}")
    try:
        return np.load(name, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - whatever numpy raises: one line
        raise InputError(f"{name} is not a readable .npy array ({exc})") from None


def grey_values(item, i: int) -> tuple[np.ndarray, str]:
    """An image item of :func:`ingest_images` as a 2-d float array, and its name."""
    if isinstance(item, np.ndarray) or (isinstance(item, (str, os.PathLike))
                                        and os.fspath(item).endswith(".npy")):
        name = f"<array {i}>" if isinstance(item, np.ndarray) else os.fspath(item)
        img = np.asarray(item if isinstance(item, np.ndarray) else _load_npy(name, "image"),
                         dtype=np.float64)
        if img.ndim != 2:
            raise InputError(f"image {name} has shape {img.shape}; expected a 2-d grey picture")
        if not np.isfinite(img).all():
            raise InputError(f"image {name} holds NaN or inf")
        return img, name
    return read_grey_image(str(item)), str(item)
