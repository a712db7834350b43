"""Image hyperresolution by kernel PCA (Kim, Franz & Schölkopf 2003, §4.2).

The components are learned from patches of high-resolution images (``dkha ingest images``, then
``dkha fit``). A low-resolution image is scaled up by an integer factor — by pixel replication
(each pixel a ``F×F`` square, the paper's choice) or bilinear interpolation — cut into
overlapping ``patch×patch`` windows, each window is projected on the components (which pulls it
towards the statistics of the high-resolution training patches) and mapped back to pixels by a
pre-image started from the window itself (:mod:`dkha.apply.preimage`), and the overlapping
windows are averaged (:func:`dkha.apply.denoise.reconstruct_patches`). The window grid is the
training store's step unless another is given; the result is clipped to ``[0, 1]``.

Quality, given the original: ``PSNR = 10 log10(1 / mean((orig − x)²))`` dB for images in [0, 1].
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np

from dkha.apply.denoise import as_image, preimage_patches, psnr
from dkha.apply.preimage import check_options
from dkha.errors import InputError, ParameterError
from dkha.runs.run import as_run, kernel_of

UPSCALING = ("replicate", "bilinear")


@dataclass
class SuperresolveResult:
    """A scaled-up image and how it was made.

    Attributes
    ----------
    image : ndarray (F·H, F·W)
        The hyperresolution image, in [0, 1].
    upscaled : ndarray (F·H, F·W)
        The low-resolution image scaled up (the pre-images' starting points).
    psnr_upscaled, psnr : float or None
        PSNR in dB of ``upscaled`` and of ``image`` against the reference (None without one).
    factor, patch, step, n_patches, iterations, converged, undefined : int
    method, upscaling : str
    seconds : float
    """

    image: np.ndarray
    upscaled: np.ndarray
    psnr_upscaled: float | None
    psnr: float | None
    factor: int
    patch: int
    step: int
    n_patches: int
    iterations: int
    converged: int
    undefined: int
    method: str
    upscaling: str
    seconds: float

    def summary(self) -> dict:
        """Every field but the two images, in their order."""
        return {f.name: getattr(self, f.name) for f in fields(self)[2:]}


def upscale(image: np.ndarray, factor: int, how: str = "replicate") -> np.ndarray:
    """``image`` scaled up ``factor`` times: pixel replication or bilinear interpolation."""
    factor = int(factor)
    if factor < 1:
        raise ParameterError(f"the factor must be a positive integer, got {factor}")
    if how == "replicate":
        return np.kron(image, np.ones((factor, factor)))
    if how == "bilinear":
        from skimage.transform import resize

        return resize(image, (factor * image.shape[0], factor * image.shape[1]), order=1,
                      mode="edge", anti_aliasing=False)
    raise ParameterError(f"unknown upscaling {how!r}; choose one of {', '.join(UPSCALING)}")


def downscale(image: np.ndarray, factor: int) -> np.ndarray:
    """The mean of each ``factor×factor`` block (the image cropped to a multiple of ``factor``):
    a low-resolution version of a high-resolution image, for experiments."""
    h, w = (s - s % factor for s in image.shape)
    return image[:h, :w].reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3))


def superresolve(run, image, *, factor: int, upscaling: str = "replicate", reference=None,
                 step: int | None = None, method: str | None = None,
                 iterations: int | None = None, tol: float | None = None,
                 eta: float | None = None, gradient_step: float | None = None,
                 nonnegative: bool = False, orthonormalize: bool = False,
                 block: int | None = None, client=None,
                 verbose: bool = False) -> SuperresolveResult:
    """Scale a grey image up ``factor`` times with the kernel principal components of a run
    fitted on high-resolution patches.

    Parameters
    ----------
    run : str or xarray.Dataset
        A run directory (or its components) fitted on image patches (batch or online).
    image : str or ndarray (H, W)
        The low-resolution image (a path or ``skimage:NAME``, read as grey in [0, 1]).
    factor : int
        The scale factor.
    upscaling : {"replicate", "bilinear"}
        How the image is first scaled up (the pre-images start from it).
    reference : str or ndarray, optional
        The original high-resolution image, to report the PSNR.
    step : int, optional
        The window grid (default: the training store's step).
    method, iterations, tol, eta, gradient_step, nonnegative, orthonormalize :
        The pre-image (:class:`dkha.apply.preimage.RunPreimages`; ``gradient_step`` is its
        ``step``).
    block, client, verbose :
        As :func:`dkha.apply.denoise.denoise_image`.
    """
    t0 = time.perf_counter()
    ds = as_run(run).ds
    check_options(method, kernel_of(ds), eta=eta, step=gradient_step, nonnegative=nonnegative)
    patch, store_step = as_run(ds).patch_geometry("super-resolution needs")
    step = store_step if step is None else int(step)
    if step < 1:
        raise ParameterError(f"step must be positive, got {step}")
    low = as_image(image, "image")
    up = upscale(low, factor, upscaling)
    ref = None if reference is None else as_image(reference, "reference")
    if ref is not None and ref.shape != up.shape:
        raise InputError(f"the reference has shape {ref.shape}; the image scaled up {factor}× "
                         f"has {up.shape}")
    out, stats = preimage_patches(
        ds, up, patch, step, desc="superresolve", block=block, verbose=verbose,
        client=client, method=method,
        orthonormalize=orthonormalize, iterations=iterations, tol=tol, eta=eta,
        step=gradient_step, nonnegative=nonnegative)
    return SuperresolveResult(
        image=out, upscaled=up, psnr_upscaled=None if ref is None else psnr(ref, up),
        psnr=None if ref is None else psnr(ref, out), factor=int(factor), patch=patch, step=step,
        upscaling=upscaling, seconds=time.perf_counter() - t0, **stats)
