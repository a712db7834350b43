"""Risk estimates from a noisy image alone: the noise level, Stein's unbiased risk estimate and a
held-out-pixel loss, and the rule that picks between them.

Nothing here sees a clean image. :func:`dkha.apply.choose.fit_denoise` uses these to choose a
denoiser's parameters.

The noise level
---------------
``σ̂ = median(|HH|) / 0.6745`` over the finest diagonal Haar coefficients
``HH = (y[2i, 2j] − y[2i, 2j+1] − y[2i+1, 2j] + y[2i+1, 2j+1]) / 2`` (Donoho & Johnstone 1994):
for white noise of standard deviation ``σ`` each coefficient carries noise of the same ``σ``, and
a photograph's own diagonal detail at the finest scale is sparse, so the median ignores it
(:func:`noise_level`, kept with the noise model in :mod:`dkha.apply.noise`).

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

Stein's unbiased risk estimate of a clipped output
--------------------------------------------------
The denoised image is clipped to [0, 1], the range of the images dkha reads: ``g = clip(f)``.
Its divergence is ``Σ_i 1[0 < f_i < 1] ∂f_i/∂y_i`` (the clip is piecewise linear), so SURE of what
is returned takes the residual of ``g`` and the Monte-Carlo divergence of ``f`` over the pixels
``f`` leaves inside (0, 1) (:func:`sure_parts` with ``clip``); taking the finite difference of
two clipped outputs instead errs at pixels within ``ε`` of a bound.

Which rule (``auto``)
---------------------
SURE needs gaussian noise of one level. ``auto`` fits three models of how the noise's variance
depends on the intensity (:func:`dkha.apply.noise.fit_noise_model`: one level, Poisson-gaussian,
multiplicative; the clip to [0, 1] part of each) and takes

* the held-out-pixel loss when the image shows impulses (more than :data:`IMPULSE_FRACTION` of
  its pixels isolated extremes: at exactly 0 with all eight neighbours above 0.3, or at 1 with
  all below 0.7) or multiplicative noise (speckle);
* ``anscombe`` for Poisson-gaussian noise: SURE in the space of the generalised Anscombe
  transform, where the noise is gaussian of one level (σ̂ estimated there), the result mapped
  back by the exact unbiased inverse (:class:`dkha.apply.noise.Stabiliser`);
* ``sure`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.apply.noise import (
    NoiseModel,
    Stabiliser,
    fit_noise_model,
    noise_level,
)
from dkha.errors import ParameterError
from dkha.schedule import Stream, random_stream

#: the rules :func:`dkha.apply.choose.fit_denoise` takes (``risk=``)
RULES = ("auto", "sure", "held-out", "anscombe")
#: more impulse pixels than this fraction: the noise is not gaussian
IMPULSE_FRACTION = 0.005
HOLD_STRIDE = 4
HOLD_OFFSETS = ((0, 0), (2, 2))


@dataclass(frozen=True)
class NoiseReport:
    """What the image says about its noise: ``sigma`` (``σ̂``; in the stabilised space for the
    ``anscombe`` rule), the fraction of impulse pixels, the fitted noise model
    (:class:`dkha.apply.noise.NoiseModel`), the rule ``auto`` takes (``rule``) with why
    (``reason``)."""

    sigma: float
    impulses: float
    model: NoiseModel
    rule: str
    reason: str

    def summary(self) -> dict:
        return {"noise_sigma": self.sigma, "impulse_fraction": self.impulses,
                **self.model.summary(), "rule": self.rule, "rule_reason": self.reason}


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


def noise_report(image: np.ndarray, rule: str = "auto", *, sigma: float | None = None
                 ) -> NoiseReport:
    """The noise model, the rule to use (``rule``: one of :data:`RULES`; ``auto`` decides from
    the image, module docstring) and the noise level (``sigma`` when known, else
    :func:`noise_level`; for ``anscombe``, of the stabilised image)."""
    if rule not in RULES:
        raise ParameterError(f"unknown risk rule {rule!r}; choose one of {', '.join(RULES)}")
    if sigma is not None and not (np.isfinite(sigma) and sigma > 0):
        raise ParameterError(f"the noise level must be a positive number, got {sigma}")
    imp, model = impulse_fraction(image), fit_noise_model(image)
    if rule == "auto":
        rule, reason = _auto_rule(imp, model)
    else:
        reason = "asked"
    if rule == "anscombe" and model.a <= 0:
        raise ParameterError("the anscombe rule needs noise whose variance grows with the "
                             "intensity; this image's does not")
    if sigma is None:
        sigma = noise_level(stabiliser(model).forward(image) if rule == "anscombe" else image)
    return NoiseReport(float(sigma), imp, model, rule, reason)


def _auto_rule(imp: float, model: NoiseModel) -> tuple[str, str]:
    if imp > IMPULSE_FRACTION:
        return "held-out", (f"{imp:.1%} of the pixels are isolated extremes (over "
                            f"{IMPULSE_FRACTION:.1%}): impulses")
    if model.kind == "multiplicative":
        return "held-out", model.describe()
    if model.kind == "poisson-gaussian":
        return "anscombe", model.describe() + ": SURE after the generalised Anscombe transform"
    return "sure", model.describe() + ": gaussian"


def stabiliser(model: NoiseModel) -> Stabiliser:
    """The generalised Anscombe transform of the model's Poisson-gaussian fit."""
    return Stabiliser(model.a, model.b)


def probe(shape: tuple, seed: int) -> np.ndarray:
    """The Rademacher probe ``b`` (±1) of the Monte-Carlo divergence."""
    return random_stream(seed, Stream.DENOISE_CHOICE, 1).choice([-1.0, 1.0], size=shape)


def sure(noisy: np.ndarray, denoised: np.ndarray, perturbed: np.ndarray, b: np.ndarray,
         epsilon: float, sigma: float, clip: tuple[float, float] | None = None) -> float:
    """Monte-Carlo SURE per pixel (module docstring): ``denoised = f(y)``,
    ``perturbed = f(y + ε b)``; with ``clip``, of ``clip(f(y))``: the mean of
    ``residual − σ² + 2σ² divergence`` (:func:`sure_parts`)."""
    residual, divergence = sure_parts(noisy, denoised, perturbed, b, epsilon, clip)
    return float(np.mean(residual - sigma**2 + 2.0 * sigma**2 * divergence))


def sure_parts(noisy: np.ndarray, denoised: np.ndarray, perturbed: np.ndarray, b: np.ndarray,
               epsilon: float, clip: tuple[float, float] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """SURE's two terms pixel by pixel that do not depend on the noise level: the squared
    residual ``(y − g)²`` and the divergence's Monte-Carlo terms ``m b (f(y + εb) − f) / ε``,
    with ``g = f``, ``m = 1``, or for ``clip = (lo, hi)`` ``g = clip(f)`` and
    ``m = 1[lo < f < hi]`` (the clip's derivative). SURE at any ``σ`` is
    ``residual − σ² + 2σ² divergence``; its sums over regions show how much of it each region
    carries."""
    denoised_out, inside = denoised, 1.0
    if clip is not None:
        inside = (denoised > clip[0]) & (denoised < clip[1])
        denoised_out = np.clip(denoised, *clip)
    return (noisy - denoised_out) ** 2, inside * b * (perturbed - denoised) / epsilon


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
