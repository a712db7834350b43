"""Image denoising by kernel PCA: patches → projection → pre-image → overlapping average.

The run (batch or online) must be fitted on image patches (``dkha ingest images``). The image to
denoise is cut into patches on the same grid as the training store (its ``patch`` and ``step``
attrs), each patch is projected on the components and mapped back to pixel space by a pre-image
(:mod:`dkha.apply.preimage`: the fixed point for gaussian kernels by default, started from the
noisy patch itself; or the conformal map, or the gradient iteration), and the
reconstructed patches are averaged where they overlap (Kim, Franz & Schölkopf 2005; Schraudolph
et al. 2006 §5.2). Patches are processed ``block`` at a time, so memory stays bounded by a block
of patches against the training set.

The grid is the store's, ``0, step, 2·step, …``, plus one more position flush with the far edge
when the grid stops short of it, so every pixel is covered. The result is clipped to ``[0, 1]``,
the range of images dkha ingests.

Quality, given the clean reference: ``SNR = 10 log10(Σ clean² / Σ (clean − x)²)`` dB, for the
noisy input and for the result.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import xarray as xr

from dkha import config
from dkha.apply.preimage import RunPreimages, Training, check_options, expansion, solve
from dkha.data.atomic import write_zarr_atomically
from dkha.data.patches import read_grey_image
from dkha.data.store import open_store
from dkha.engine.cluster import client_for
from dkha.engine.tasks import project_rows
from dkha.errors import InputError, ParameterError, RunDirectoryError
from dkha.progress import Progress
from dkha.runs.run import as_run, kernel_of

log = logging.getLogger(__name__)

DEFAULT_BLOCK_PATCHES = 2048


@dataclass
class DenoiseResult:
    """A denoised image and how it was made.

    Attributes
    ----------
    image : ndarray (H, W)
        The denoised image, in [0, 1].
    noisy : ndarray (H, W)
        The input.
    snr_noisy, snr_denoised : float or None
        SNR in dB of the input and of the result against the reference (None without one).
    psnr_noisy, psnr_denoised : float or None
        PSNR in dB, the peak being ``data_range`` (the tables of the literature and the README).
    data_range : float or None
        The PSNR's peak: 1 for grey images in [0, 1], else the reference's range.
    n_patches, patch, step : int
    iterations : int
        The most pre-image iterations any block needed.
    converged, undefined : int
        Patches whose pre-image converged / whose fixed-point step was undefined.
    seconds : float
    method : str
        The pre-image method.
    choice : dkha.apply.choose.Choice or None
        How :func:`dkha.apply.choose.fit_denoise` chose the parameters (None for a given run).
    """

    image: np.ndarray
    noisy: np.ndarray
    snr_noisy: float | None
    snr_denoised: float | None
    n_patches: int
    patch: int
    step: int
    iterations: int
    converged: int
    undefined: int
    seconds: float
    method: str = "fixed-point"
    psnr_noisy: float | None = None
    psnr_denoised: float | None = None
    data_range: float | None = None
    choice: object = None

    def summary(self) -> dict:
        out = {k: getattr(self, k) for k in ("snr_noisy", "snr_denoised", "psnr_noisy",
                                             "psnr_denoised", "data_range", "n_patches", "patch",
                                             "step", "iterations", "converged", "undefined",
                                             "seconds", "method")}
        if self.choice is not None:
            out["choice"] = self.choice.summary()
        return out


def squared_error(reference: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(reference, (reference − x)²)`` as float arrays; one-line error when the shapes differ."""
    reference = np.asarray(reference, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    if reference.shape != x.shape:
        raise InputError(f"the reference has shape {reference.shape}, the image {x.shape}")
    return reference, (reference - x) ** 2


def snr(clean: np.ndarray, x: np.ndarray) -> float:
    """``10 log10(Σ clean² / Σ (clean − x)²)`` in dB (``inf`` when ``x`` equals ``clean``)."""
    clean, sq = squared_error(clean, x)
    err = float(np.sum(sq))
    sig = float(np.sum(clean**2))
    if err == 0.0:
        return float("inf")
    return float(10.0 * np.log10(sig / err))


def data_range(reference: np.ndarray) -> float:
    """The peak of a PSNR against ``reference``: 1 for grey values in [0, 1], else the
    reference's range (max − min)."""
    lo, hi = float(np.min(reference)), float(np.max(reference))
    return 1.0 if 0.0 <= lo and hi <= 1.0 else hi - lo


def psnr(reference: np.ndarray, x: np.ndarray, peak: float = 1.0) -> float:
    """``10 log10(peak² / mean((reference − x)²))`` dB (peak 1: images in [0, 1])."""
    mse = float(np.mean(squared_error(reference, x)[1]))
    return float("inf") if mse == 0.0 else float(10.0 * np.log10(peak ** 2 / mse))


def patch_positions(length: int, patch: int, step: int) -> np.ndarray:
    """Top (or left) corners along one axis: the grid ``0, step, …`` plus the last position
    ``length − patch`` when the grid stops short of the edge."""
    if length < patch:
        raise InputError(f"an image side of {length} pixels is smaller than a {patch}-pixel patch")
    pos = np.arange(0, length - patch + 1, step)
    if pos[-1] != length - patch:
        pos = np.append(pos, length - patch)
    return pos


def patch_corners(shape: tuple[int, int], patch: int, step: int) -> np.ndarray:
    """The top-left corners ``(row, col)`` of an image's windows, row-major: every pair of
    :func:`patch_positions` along the two axes."""
    rows = patch_positions(shape[0], patch, step)
    cols = patch_positions(shape[1], patch, step)
    return np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1).reshape(-1, 2)


def as_image(image, what: str) -> np.ndarray:
    if isinstance(image, (str, os.PathLike)):
        return read_grey_image(os.fspath(image))
    arr = np.asarray(image, dtype=np.float64)
    if arr.ndim != 2:
        raise InputError(f"the {what} must be a 2-d grey image, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError(f"the {what} holds NaN or inf")
    return arr


def preimage_patches(ds, image: np.ndarray, patch: int, grid: int, *, desc: str,
                     block: int | None, verbose: bool, client=None, **preimage
                     ) -> tuple[np.ndarray, dict]:
    """``image``'s ``patch×patch`` windows (on the grid of ``grid``) replaced by the pre-images of
    their projections on the run ``ds`` (:class:`~dkha.apply.preimage.RunPreimages` with
    ``preimage`` options), overlaps averaged, clipped to [0, 1]: denoising and hyperresolution.
    ``client``: where it runs (:func:`dkha.engine.cluster.client_for`). Returns the image and the
    counts of :func:`reconstruct_patches` with the pre-image ``method`` used."""
    with client_for(client, settings=config.settings()) as c:
        pre = RunPreimages(ds, c, **preimage)
        out, stats = reconstruct_patches(image, patch, grid, pre, block=block, desc=desc,
                                         verbose=verbose)
    return np.clip(out, 0.0, 1.0), dict(stats, method=pre.method)


def reconstruct_patches(image: np.ndarray, patch: int, step: int, reconstruct, *,
                        block: int | None = None, desc: str = "patches", verbose: bool = False
                        ) -> tuple[np.ndarray, dict]:
    """Cut ``image`` into ``patch×patch`` windows on the grid of ``step`` (:func:`patch_corners`),
    map each block of windows through ``reconstruct`` and average the overlaps.

    ``reconstruct(P)`` takes ``(n, patch²)`` windows and returns a
    :class:`~dkha.apply.preimage.PreimageResult` (or anything with ``Z``, ``iterations``,
    ``converged``, ``undefined``). Returns the averaged image (not clipped) and the counts.
    """
    from skimage.util import view_as_windows

    block = DEFAULT_BLOCK_PATCHES if block is None else int(block)
    if block < 1:
        raise ParameterError(f"block must be positive, got {block}")
    corners = patch_corners(image.shape, patch, step)
    windows = view_as_windows(np.ascontiguousarray(image), (patch, patch))
    total = np.zeros_like(image, dtype=np.float64)
    count = np.zeros_like(total)
    stats = {"n_patches": len(corners), "iterations": 0, "converged": 0, "undefined": 0}
    bar = Progress(verbose, len(corners), desc, unit="patch")
    try:
        for a in range(0, len(corners), block):
            pos = corners[a:a + block]
            res = reconstruct(windows[pos[:, 0], pos[:, 1]].reshape(len(pos), -1))
            stats["iterations"] = max(stats["iterations"], int(res.iterations))
            stats["converged"] += int(np.sum(res.converged))
            stats["undefined"] += int(np.sum(res.undefined))
            Zp = np.asarray(res.Z).reshape(len(pos), patch, patch)
            accumulate_patches(total, count, pos, Zp)
            bar.update(len(pos))
    finally:
        bar.close()
    if stats["undefined"]:
        log.warning("%d of %d patches had an undefined fixed-point step (kept their last iterate)",
                    stats["undefined"], len(corners))
    return total / count, stats


def accumulate_patches(total: np.ndarray, count: np.ndarray, corners: np.ndarray, Z: np.ndarray,
                       weights: np.ndarray | None = None) -> None:
    """Add the windows ``Z`` (``n × p × p``, top-left corners ``corners``, distinct) into
    ``total`` with ``weights`` (default 1 each) and the weights into ``count``, in place: one
    vectorised addition per pixel offset of the window."""
    p = Z.shape[1]
    w = np.ones(len(Z)) if weights is None else np.asarray(weights, dtype=np.float64)
    for dr in range(p):
        for dc in range(p):
            rows, cols = corners[:, 0] + dr, corners[:, 1] + dc
            total[rows, cols] += w * Z[:, dr, dc]
            count[rows, cols] += w


def denoise_image(run, image, *, reference=None, method: str | None = None,
                  iterations: int | None = None, tol: float | None = None,
                  eta: float | None = None, step: float | None = None, nonnegative: bool = False,
                  orthonormalize: bool = False, block: int | None = None, client=None,
                  verbose: bool = False) -> DenoiseResult:
    """Denoise a grey image with the kernel principal components of a run.

    Parameters
    ----------
    run : str or xarray.Dataset
        A run directory (or its loaded components dataset) fitted on image patches: a batch run,
        or a dictionary (online) run.
    image : str or ndarray (H, W)
        The noisy image: a path (or ``skimage:NAME``) read as grey in [0, 1], or an array.
    reference : str or ndarray, optional
        The clean image, to report the SNR before and after.
    method : {"fixed-point", "conformal", "gradient"}, optional
        The pre-image (:mod:`dkha.apply.preimage`); default fixed-point for a gaussian kernel,
        conformal otherwise.
    iterations, tol : optional
        Iterations per patch (at most) and the relative step that stops them
        (:data:`dkha.apply.preimage.DEFAULT_ITERATIONS`, ``DEFAULT_TOL``).
    eta, step, nonnegative : optional
        The conformal map's regularisation; the gradient method's fixed step and
        non-negativity (:func:`dkha.apply.preimage.solve`).
    orthonormalize : bool, default False
        Project orthogonally onto the span of the components using their Gram matrix
        ``A K' Aᵀ`` (one more blockwise pass over the training set), rather than assuming them
        orthonormal. Worth it for runs stopped far from convergence.
    block : int, optional
        Patches processed at a time (default 2048).
    client : optional
        Where the work runs (:func:`dkha.engine.cluster.client_for`): a ``distributed.Client``,
        a scheduler address, a number of local worker processes, or ``None``.
    verbose : bool
        Show a progress bar over blocks of patches.

    Returns
    -------
    DenoiseResult

    Examples
    --------
    >>> res = denoise_image("run", "noisy.png", reference="clean.png")  # doctest: +SKIP
    >>> res.snr_noisy, res.snr_denoised, res.psnr_denoised                # doctest: +SKIP
    """
    t0 = time.perf_counter()
    ds = as_run(run).ds
    check_options(method, kernel_of(ds), eta=eta, step=step, nonnegative=nonnegative)
    patch, step_ = as_run(ds).patch_geometry("denoising needs")
    noisy = as_image(image, "image")
    clean = None if reference is None else as_image(reference, "reference")
    if clean is not None and clean.shape != noisy.shape:
        raise InputError(f"the reference has shape {clean.shape}, the image {noisy.shape}")
    out, stats = preimage_patches(
        ds, noisy, patch, step_, desc="denoise", block=block, verbose=verbose,
        client=client, method=method,
        orthonormalize=orthonormalize, iterations=iterations, tol=tol, eta=eta, step=step,
        nonnegative=nonnegative)
    return DenoiseResult(image=out, noisy=noisy, patch=patch, step=step_,
                         seconds=time.perf_counter() - t0, **stats,
                         **reference_figures(clean, noisy, out))


def reference_figures(clean: np.ndarray | None, noisy: np.ndarray, out: np.ndarray) -> dict:
    """The SNR and PSNR of the input and of the result against the clean image, and the PSNR's
    peak (:func:`data_range`), as :class:`DenoiseResult`'s fields; None without a reference."""
    if clean is None:
        return {"snr_noisy": None, "snr_denoised": None}
    peak = data_range(clean)
    return {"snr_noisy": snr(clean, noisy), "snr_denoised": snr(clean, out),
            "psnr_noisy": psnr(clean, noisy, peak), "psnr_denoised": psnr(clean, out, peak),
            "data_range": peak}


def denoise_store(run, noisy: str, out: str, *, method: str | None = None,
                  iterations: int | None = None, tol: float | None = None,
                  eta: float | None = None, step: float | None = None, nonnegative: bool = False,
                  overwrite: bool = False, client=None):
    """Denoise every sample of a data store of plain vectors; write them as a data store.

    Blockwise on the cluster: one task per chunk of ``noisy``; each projects its samples on the
    components (against the training store's chunks, cached per worker, or the dictionary of an
    online run) and takes their pre-images started from the samples themselves (Schraudolph et
    al. §5.4: motion-capture frames; Mika et al.). The output ``X (sample, feature)`` has the
    input's chunks (and its labels), is written aside and renamed into place, and is itself a
    data store (``dkha fit``, ``dkha transform`` read it).

    Parameters
    ----------
    run : str or xarray.Dataset
        A run directory or its components (batch or online), fitted on vectors of the same
        dimension.
    noisy, out : str
        The input store and where to write the result (refused when it exists, unless
        ``overwrite``; never one of the inputs).
    method, iterations, tol, eta, step, nonnegative :
        The pre-image (:func:`dkha.apply.preimage.solve`).
    client : optional
        Where it runs (:func:`dkha.engine.cluster.client_for`).

    Returns
    -------
    dict
        ``n_samples``, ``n_features``, ``chunks``, ``method``, ``seconds``.
    """
    import dask.array as da


    t0 = time.perf_counter()
    ds = as_run(run).ds
    kernel = kernel_of(ds)
    options = {"iterations": iterations, "tol": tol, "eta": eta, "step": step,
               "nonnegative": nonnegative}
    method = check_options(method, kernel, eta=eta, step=step, nonnegative=nonnegative,
                           batch=not as_run(ds).is_dictionary)
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    if os.path.abspath(out) in (os.path.abspath(noisy), os.path.abspath(ds.attrs["store"])):
        raise RunDirectoryError(f"{out} is an input of this denoising; write elsewhere")
    src = open_store(noisy, check_finite=True)
    if src.n_features != int(ds.attrs["n_features"]):
        raise InputError(f"{noisy} has {src.n_features} features; the run was fitted on "
                         f"{ds.attrs['n_features']}")
    X = da.from_zarr(src.array())
    if as_run(ds).is_dictionary:
        small = as_run(ds).dictionary_part()
        Z = X.map_blocks(_denoise_dictionary_chunk, small, method, options, dtype=np.float64)
    else:
        train = open_store(ds.attrs["store"])
        groups = tuple((train.chunk_bounds(i),) for i in range(train.n_chunks))
        Z = X.map_blocks(_denoise_store_chunk, train.path, kernel, ds["mk"].values,
                         float(ds.attrs["mkm"]), groups, np.ascontiguousarray(ds["alpha"].values),
                         method, options, dtype=np.float64)
    data = {"X": (("sample", "feature"), Z)}
    labels = src.labels()
    if labels is not None:
        data["label"] = ("sample", da.from_array(labels, chunks=X.chunks[0]))
    res = xr.Dataset(data)
    res.attrs = {"source": os.path.abspath(noisy), "denoised_by": "dkha denoise",
                 "run_store": ds.attrs["store"], "algorithm": ds.attrs["algorithm"],
                 "preimage": method}
    with client_for(client, settings=config.settings()):
        write_zarr_atomically(res, out)
    return {"out": out, "n_samples": src.n_samples, "n_features": src.n_features,
            "chunks": src.n_chunks, "method": method, "seconds": time.perf_counter() - t0}


def store_mse(reference: str, other: str) -> float:
    """Mean squared error per feature, ``mean((reference − other)²)``, chunk by chunk."""
    a, b = open_store(reference), open_store(other)
    if (a.n_samples, a.n_features) != (b.n_samples, b.n_features):
        raise InputError(f"{reference} holds {a.n_samples} × {a.n_features} values, {other} "
                         f"{b.n_samples} × {b.n_features}")
    total = 0.0
    for start, stop, A in a.iter_chunks():
        total += float(np.sum((A - b.read(start, stop)) ** 2))
    return total / (a.n_samples * a.n_features)


def _denoise_store_chunk(Xc, path, kernel, mk, mkm, groups, alpha, method, options):
    """Worker task: pre-images of one chunk of samples against a batch run's training store."""
    Xc = np.ascontiguousarray(Xc, dtype=np.float64)
    beta = project_rows(path, kernel, Xc, mk, mkm, groups, alpha)
    training = Training.from_chunks(path, kernel, groups, alpha)
    return solve(method, training, expansion(alpha, beta), Xc, **options).Z


def _denoise_dictionary_chunk(Xc, small, method, options):
    """Worker task: pre-images of one chunk of samples with a dictionary run."""
    return RunPreimages(small, None, method=method, **options)(Xc).Z


def save_image(img: np.ndarray, path: str) -> None:
    """Write a grey image in [0, 1] (8-bit PNG/JPEG..., or float TIFF/.npy by extension)."""
    img = np.clip(np.asarray(img, dtype=np.float64), 0.0, 1.0)
    if os.fspath(path).endswith(".npy"):
        np.save(path, img)
        return
    import skimage.io
    from skimage.util import img_as_ubyte

    ext = os.path.splitext(os.fspath(path))[1].lower()
    data = img.astype(np.float32) if ext in (".tif", ".tiff") else img_as_ubyte(img)
    try:
        skimage.io.imsave(path, data, check_contrast=False)
    except Exception as exc:  # noqa: BLE001 - whatever the writer raises: one line
        raise InputError(f"cannot write image {path}: {exc}") from None
