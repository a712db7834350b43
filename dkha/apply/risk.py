"""Risk estimates from a noisy image alone: the noise level, Stein's unbiased risk estimate and a
held-out-pixel loss, and the rule that picks between them.

Nothing here sees a clean image. :func:`dkha.apply.choose.fit_denoise` uses these to choose a
denoiser's parameters.

The noise level
---------------
``σ̂ = median(|HH|) / 0.6745`` over the finest diagonal Haar coefficients
``HH = (y[2i, 2j] − y[2i, 2j+1] − y[2i+1, 2j] + y[2i+1, 2j+1]) / 2`` (Donoho & Johnstone 1994):
for white noise of standard deviation ``σ`` each coefficient carries noise of the same ``σ``, and
a photograph's own diagonal detail at the finest scale is sparse, so the median ignores it.

Stein's unbiased risk estimate (gaussian noise)
-----------------------------------------------
For ``y = x + n``, ``n ~ N(0, σ² I)`` and a weakly differentiable denoiser ``f``, with ``N``
pixels::

    SURE(f) = ‖y − f(y)‖² / N − σ² + 2σ² div f(y) / N,     E[SURE(f)] = E[‖f(y) − x‖²] / N

The divergence by Monte Carlo (Ramani, Blu & Unser 2008): ``div f(y) ≈ bᵀ(f(y + εb) − f(y)) / ε``
with a Rademacher probe ``b`` (±1, seeded); one probe for every candidate, so their differences
carry less noise than their values. ``f`` here is the whole denoiser (the fit on the image's own
patches included), so the perturbed image is denoised from its own fit.

The held-out-pixel loss (any pixel-independent noise)
-----------------------------------------------------
Pixels on a grid ``J`` (every :data:`HOLD_STRIDE`-th row and column, :data:`HOLD_OFFSETS`) are
replaced by the mean of their four neighbours (none of which is in ``J``) and the whole denoiser
runs on that image, fit included, so its output on ``J`` does not depend on ``y_J``. Then
(Batson & Royer 2019, Noise2Self)::

    E[‖f_J(y)_J − y_J‖²] = E[‖f_J(y)_J − x_J‖²] + E[‖y_J − x_J‖²]

when the noise is independent from pixel to pixel and has zero mean: the loss ranks denoisers as
their error does, whatever the noise's distribution. The risk reported beside it is the loss less
``σ̂²`` (an estimate: ``σ̂`` is the gaussian one).

Which rule (``auto``)
---------------------
SURE needs gaussian noise of one level. ``auto`` takes SURE unless the image shows impulses
(more than :data:`IMPULSE_FRACTION` of its pixels isolated extremes: at exactly 0 with all eight
neighbours above 0.3, or at 1 with all below 0.7) or a noise level that depends on the
intensity (``σ̂`` of the brighter half of the mid-grey 2×2 blocks over that of the darker half
outside ``1/LEVEL_RATIO .. LEVEL_RATIO``): then the held-out-pixel loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.errors import ParameterError
from dkha.schedule import Stream, random_stream

#: the rules :func:`dkha.apply.choose.fit_denoise` takes (``risk=``)
RULES = ("auto", "sure", "held-out")
MAD_TO_SIGMA = 0.6745
#: more impulse pixels than this fraction: the noise is not gaussian
IMPULSE_FRACTION = 0.005
#: a ratio of noise levels between bright and dark regions beyond this: signal-dependent noise
LEVEL_RATIO = 1.25
HOLD_STRIDE = 4
HOLD_OFFSETS = ((0, 0), (2, 2))


def haar_diagonal(image: np.ndarray) -> np.ndarray:
    """The finest diagonal Haar coefficients of ``image`` (its even-sized part)."""
    y = np.asarray(image, dtype=np.float64)
    h, w = (y.shape[0] // 2) * 2, (y.shape[1] // 2) * 2
    y = y[:h, :w]
    return (y[0::2, 0::2] - y[0::2, 1::2] - y[1::2, 0::2] + y[1::2, 1::2]) / 2.0


def noise_level(image: np.ndarray) -> float:
    """``σ̂``: the median absolute finest diagonal Haar coefficient over 0.6745 (module
    docstring); an estimate of the standard deviation of white noise in ``image``."""
    hh = haar_diagonal(image)
    if hh.size == 0:
        raise ParameterError(f"an image of shape {np.shape(image)} is too small to estimate "
                             "its noise level")
    return float(np.median(np.abs(hh)) / MAD_TO_SIGMA)


@dataclass(frozen=True)
class NoiseReport:
    """What the image says about its noise: ``sigma`` (``σ̂``), the fraction of impulse pixels,
    the ratio of the noise levels of its bright and dark regions, and the rule ``auto`` takes
    (``rule``) with why (``reason``)."""

    sigma: float
    impulses: float
    level_ratio: float
    rule: str
    reason: str

    def summary(self) -> dict:
        return {"noise_sigma": self.sigma, "impulse_fraction": self.impulses,
                "level_ratio": self.level_ratio, "rule": self.rule, "rule_reason": self.reason}


def impulse_fraction(image: np.ndarray) -> float:
    """The fraction of isolated extreme pixels: at exactly 0 (or 1) with all eight neighbours
    above 0.3 (below 0.7). Salt-and-pepper noise makes them by the percent; gaussian noise
    clipped to [0, 1] puts its extremes beside other near-extreme pixels."""
    from scipy.ndimage import maximum_filter, minimum_filter

    y = np.asarray(image, dtype=np.float64)
    ring = np.ones((3, 3), dtype=bool)
    ring[1, 1] = False
    low = minimum_filter(y, footprint=ring, mode="reflect")
    high = maximum_filter(y, footprint=ring, mode="reflect")
    return float(np.mean(((y == 0.0) & (low > 0.3)) | ((y == 1.0) & (high < 0.7))))


def level_ratio(image: np.ndarray) -> float:
    """``σ̂`` of the brighter half of the 2×2 blocks whose mean lies in [0.2, 0.8] over ``σ̂`` of
    the darker half (1 for noise of one level; about √2 for Poisson noise, 2 for speckle)."""
    y = np.asarray(image, dtype=np.float64)
    h, w = (y.shape[0] // 2) * 2, (y.shape[1] // 2) * 2
    means = (y[0:h:2, 0:w:2] + y[0:h:2, 1:w:2] + y[1:h:2, 0:w:2] + y[1:h:2, 1:w:2]) / 4.0
    hh = np.abs(haar_diagonal(y))
    mid = (means >= 0.2) & (means <= 0.8)
    if mid.sum() < 64:
        return 1.0
    split = np.median(means[mid])
    dark = hh[mid & (means <= split)]
    bright = hh[mid & (means > split)]
    lo, hi = np.median(dark), np.median(bright)
    return float(hi / lo) if lo > 0 else float("inf")


def noise_report(image: np.ndarray, rule: str = "auto", *, sigma: float | None = None
                 ) -> NoiseReport:
    """The noise level (``sigma`` when known, else :func:`noise_level`) and the rule to use
    (``rule``: one of :data:`RULES`; ``auto`` decides from the image, module docstring)."""
    if rule not in RULES:
        raise ParameterError(f"unknown risk rule {rule!r}; choose one of {', '.join(RULES)}")
    if sigma is not None and not (np.isfinite(sigma) and sigma > 0):
        raise ParameterError(f"the noise level must be a positive number, got {sigma}")
    sigma = noise_level(image) if sigma is None else float(sigma)
    imp, ratio = impulse_fraction(image), level_ratio(image)
    if rule != "auto":
        return NoiseReport(sigma, imp, ratio, rule, "asked")
    if imp > IMPULSE_FRACTION:
        return NoiseReport(sigma, imp, ratio, "held-out",
                           f"{imp:.1%} of the pixels are isolated extremes (over "
                           f"{IMPULSE_FRACTION:.1%}): impulses")
    if not 1.0 / LEVEL_RATIO <= ratio <= LEVEL_RATIO:
        return NoiseReport(sigma, imp, ratio, "held-out",
                           f"the noise level of bright regions is {ratio:.2f}× that of dark ones: "
                           "signal-dependent")
    return NoiseReport(sigma, imp, ratio, "sure",
                       f"no impulses, one noise level (bright/dark {ratio:.2f}): gaussian")


def probe(shape: tuple, seed: int) -> np.ndarray:
    """The Rademacher probe ``b`` (±1) of the Monte-Carlo divergence."""
    return random_stream(seed, Stream.DENOISE_CHOICE, 1).choice([-1.0, 1.0], size=shape)


def sure(noisy: np.ndarray, denoised: np.ndarray, perturbed: np.ndarray, b: np.ndarray,
         epsilon: float, sigma: float) -> float:
    """Monte-Carlo SURE per pixel (module docstring): ``denoised = f(y)``,
    ``perturbed = f(y + ε b)``."""
    return float(np.mean(sure_terms(noisy, denoised, perturbed, b, epsilon, sigma)))


def sure_terms(noisy: np.ndarray, denoised: np.ndarray, perturbed: np.ndarray, b: np.ndarray,
               epsilon: float, sigma: float) -> np.ndarray:
    """SURE's terms pixel by pixel, ``(y − f)² − σ² + 2σ² b (f(y + εb) − f) / ε``: their mean is
    :func:`sure`, their sums over regions show how much of it each region carries."""
    return (noisy - denoised) ** 2 - sigma**2 + (2.0 * sigma**2 / epsilon) * b * (
        perturbed - denoised)


def hold_mask(shape: tuple, offset: tuple[int, int]) -> np.ndarray:
    """The held-out pixels ``J``: rows ``offset[0] + 4k``, columns ``offset[1] + 4k``."""
    mask = np.zeros(shape, dtype=bool)
    mask[offset[0]::HOLD_STRIDE, offset[1]::HOLD_STRIDE] = True
    return mask


def hold_out(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``image`` with the pixels of ``mask`` replaced by the mean of their four neighbours
    (reflected at the border)."""
    y = np.asarray(image, dtype=np.float64)
    p = np.pad(y, 1, mode="reflect")
    neighbours = (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:]) / 4.0
    out = y.copy()
    out[mask] = neighbours[mask]
    return out


def held_out_loss(noisy: np.ndarray, outputs: list[np.ndarray], masks: list[np.ndarray]) -> float:
    """``mean over the held-out pixels of (f_J(y) − y)²``, each output scored on its own mask."""
    terms = held_out_terms(noisy, outputs, masks)
    return float(np.sum(terms) / sum(int(m.sum()) for m in masks))


def held_out_terms(noisy: np.ndarray, outputs: list[np.ndarray], masks: list[np.ndarray]
                   ) -> np.ndarray:
    """``(f_J(y) − y)²`` at the held-out pixels of each output's own mask, 0 elsewhere."""
    terms = np.zeros(noisy.shape)
    for out, m in zip(outputs, masks):
        terms[m] += (out[m] - noisy[m]) ** 2
    return terms


def region_sums(terms: np.ndarray, side: int) -> np.ndarray:
    """Sums of ``terms`` over the ``side × side`` tiles of the image (the last ones smaller)."""
    h, w = terms.shape
    rows = np.add.reduceat(terms, np.arange(0, h, side), axis=0)
    return np.add.reduceat(rows, np.arange(0, w, side), axis=1).ravel()
