"""What the chosen denoiser delivers: its PSNR estimated from the noisy image alone, as a point
and a range.

Nothing here sees a clean image. :func:`dkha.apply.choose.fit_denoise` ranks its candidates by
SURE at the noise level ``σ̂`` (:mod:`dkha.apply.risk`); that score, read as the MSE the chosen
candidate delivers, was optimistic by 0.5–2 dB on photographs (china at σ 0.1: 25.31 dB
estimated, 23.71 delivered) for two reasons, measured on the development photographs (astronaut,
camera, coins at σ 0.05, 0.1, 0.2, crop 128; ``benchmarks/denoise_estimate.py``):

* **the noise level**. SURE of a smoothing denoiser falls by about ``(1 − 2 div/N) Δσ²`` when
  ``σ̂`` rises, and the chosen candidate's risk is only 0.2–0.5 σ²: a σ̂ 5 % high makes it
  0.4–1.2 dB optimistic. σ̂ (the finest diagonal Haar MAD) reads a photograph's fine texture as
  noise (4–16 % high at σ 0.05) and reads noise clipped to [0, 1] as less noise (14 % low at
  σ 0.2);
* **the clip of the noisy image** (a saved image is in [0, 1]): SURE takes every pixel's noise
  as gaussian of variance σ², but clipped noise has less variance near 0 and 1 and a mean away
  from the bound (``E clip(x + n) ≠ x``), an error the denoiser passes on and SURE does not see.
  With the true σ, plain SURE was 0.4–1 dB optimistic at σ 0.1 and infinite at σ 0.2.

Neither the probe's noise nor the choice among candidates (the winner's curse) mattered beside
these (SURE with the true σ and the clip model below: within 0.15 dB at σ 0.05 and 0.1).

The estimate
------------
*The clip model* (Foi 2009): ``y = clip(x + n, 0, 1)``, ``n ~ N(0, s²)``, whose censored mean
``m_s(x)`` and variance ``v_s(x)`` are :func:`dkha.apply.noise.censored`. The denoised image
``g`` estimates ``m_s(x)`` pixel by pixel; ``x̂ = m_s⁻¹(g)``, and the risk of the delivered
(clipped) result is::

    R(s) = mean( (y − g)² − v_s(x̂) + 2 v_s(x̂) div_i + (m_s(x̂) − x̂)² )

SURE with each pixel's own noise variance and the mean shift the denoiser keeps
(:func:`clipped_risk`).

*The noise level* ``s`` (:func:`calibrated_level`): the level at which the clip model, noising
the denoised image ``g`` itself, gives the noisy image's finest diagonal Haar MAD: the
``s`` solving ``mean_k MAD(clip(g + s z_k)) = MAD(y)`` (four seeded draws ``z_k``). The clip
and the detail the denoiser kept are in the simulated MAD, so neither biases ``s``; the fine
texture the denoiser smoothed away still reads as noise, so ``s`` can only be high by it
(adding a signal to symmetric unimodal noise only raises its absolute values, Anderson 1955).

*The range*: ``R`` at ``s (1 + 2 e)`` (the optimistic end; ``e`` the MAD's relative
sampling error, from the four draws), held below the PSNR of the variance the noise leaves in
the result at the low level less two standard errors (:func:`output_variance`: the MSE is at
least that variance), and ``R`` at ``s (1 − TEXTURE_DOUBT)`` (the pessimistic end: the texture
that can hide in ``s``). The point is ``R(s)``, held below the high end. A point estimate cannot
be held to 0.5 dB on photographs in principle: texture finer than the windows is
indistinguishable from noise in one image, and at σ ≥ 0.1 a few % of σ is more than 0.5 dB; so
the range is printed beside it.

*The variance bound* is taken with the denoiser's fit held fixed (the basis and pre-image
learned from the noisy image applied to the perturbed image's windows). The whole denoiser's
first-order variance, from the same probe through the refit, is no bound: the fitted basis
turns far more under the probe's ``ε = σ̂/10`` than under the noise itself (eigenvectors of
near-equal eigenvalues), and its one-probe estimate is dominated by a few image-wide terms.
On the development photographs at crop 128 (20 probes and 20 noise draws each, linear patch
PCA chosen) its mean over probes overstated the variance of the result over noise draws by
3.5 dB on clock at σ 0.2 (and by 1.7 on grass at 0.05), its probe-to-probe spread was 38–56 % of
it there, and the one probe printed moon at σ 0.2 as at most 29.5 dB for 29.78 delivered. The
held map is local, its estimate's spread over probes was 1–6.5 % (the batch means of its
2·patch tiles gave 1.2–4.7 % from one probe), and the PSNR of its variance was 0.7 dB below to
1.0 dB above that of the result's variance over noise draws (7 rows; the fit's own noise, left
out, mostly adds variance). The bound is therefore loose where the fit's
noise is much of the variance (small images at high noise), and the two standard errors are of
the difference between the probe's estimate and the variance the noise realised in this image
(two quadratic forms of about the same matrix, each with the tiles' error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.apply.noise import MAD_TO_SIGMA, censored, mad
from dkha.apply.risk import region_sums, sure_parts
from dkha.schedule import Stream, random_stream

#: how far below the calibrated level ``s`` the noise may be (texture read as noise): the
#: pessimistic end of the range
TEXTURE_DOUBT = 0.15
#: the standard errors below the variance the noise leaves in the result that the high end is
#: held at (the probe's draw and the noise's own, :func:`delivered`)
CAP_Z = 2.0
#: the seeded noise draws of :func:`calibrated_level`
DRAWS = 4
_GRID = np.linspace(0.0, 1.0, 2001)


@dataclass(frozen=True)
class Estimate:
    """The delivered MSE and PSNR (dB, peak 1) estimated from the noisy image: ``psnr`` the point
    at ``sigma`` (the calibrated noise level), ``low``/``high`` the range's ends (``high`` may be
    ``inf``, saved as None: no upper bound), and the noise levels they were taken at."""

    mse: float
    psnr: float
    low: float
    high: float
    sigma: float
    sigma_range: tuple[float, float]

    def summary(self) -> dict:
        high = self.high if np.isfinite(self.high) else None     # None: no upper bound
        return {"estimated_psnr": self.psnr, "estimated_psnr_range": [self.low, high],
                "estimated_mse": self.mse, "estimate_sigma": self.sigma,
                "estimate_sigma_range": list(self.sigma_range)}

    def text(self) -> str:
        high = "∞" if not np.isfinite(self.high) else f"{self.high:.1f}"
        return f"PSNR ≈ {self.psnr:.1f} dB ({self.low:.1f}–{high})"


def psnr_of(mse: float) -> float:
    """``10 log10(1 / mse)`` dB (peak 1); ``inf`` for a non-positive MSE (estimate)."""
    return float(10 * np.log10(1.0 / mse)) if mse > 0 else float("inf")


def _clean(g: np.ndarray, s: float) -> np.ndarray:
    """``x̂ = m_s⁻¹(g)``: the clean value whose censored mean at noise level ``s`` is ``g``."""
    m, _ = censored(_GRID, np.full_like(_GRID, s))
    return np.interp(g, m, _GRID)


def calibrated_level(noisy: np.ndarray, denoised: np.ndarray, seed: int = 0
                     ) -> tuple[float, float]:
    """``(s, e)``: the noise level at which the clip model noising ``denoised`` reproduces
    ``noisy``'s Haar MAD (module docstring), and the MAD's relative sampling error."""
    target = mad(noisy)
    g = np.clip(np.asarray(denoised, dtype=np.float64), 0.0, 1.0)
    z = random_stream(seed, Stream.DENOISE_CHOICE, 2).standard_normal((DRAWS, *g.shape))

    def simulated(s: float) -> np.ndarray:
        return np.array([mad(np.clip(g + s * zk, 0.0, 1.0)) for zk in z])

    lo, hi = 0.0, max(2.0 * target / MAD_TO_SIGMA, 1e-6)
    while np.mean(simulated(hi)) < target and hi < 4.0:
        hi *= 2.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.mean(simulated(mid)) < target else (lo, mid)
    s = 0.5 * (lo + hi)
    sims = simulated(s)
    return float(s), float(np.std(sims, ddof=1) / max(np.mean(sims), 1e-12))


def clipped_risk(noisy: np.ndarray, denoised: np.ndarray, divergence: np.ndarray,
                 s: float) -> float:
    """``R(s)`` of the module docstring: SURE of the clipped result ``denoised`` (in [0, 1])
    under the clip model at noise level ``s``; ``divergence`` the Monte-Carlo terms of
    :func:`dkha.apply.risk.sure_parts`."""
    g = np.clip(denoised, 0.0, 1.0)
    x_hat = _clean(g, s)
    mean, var = censored(x_hat, np.full_like(x_hat, s))
    terms = (noisy - g) ** 2 - var + 2.0 * var * divergence + (mean - x_hat) ** 2
    return float(np.mean(terms))


def output_variance(denoised: np.ndarray, held: np.ndarray, epsilon: float, s: float,
                    region: int) -> tuple[float, float]:
    """``(V, its standard error)``: the variance the noise leaves in the clipped result with the
    denoiser's fit held fixed, to first order, per pixel ``v_s(x̂_i) Σ_j J_ij²`` (``J`` the
    Jacobian of the held map, :meth:`dkha.apply.choose.Evaluation.held`; ``Σ_j J_ij²`` by
    Hutchinson's estimate ``((f_held(y + εb) − f(y)) / ε)_i²`` with the Rademacher probe ``b``),
    0 where the clip bites. The held map is local (a window's output depends on that window
    alone), so the pixels' terms are independent beyond the windows' reach and the spread of
    their sums over ``region``-pixel tiles measures the error of the probe's one draw (batch
    means)."""
    g = np.clip(denoised, 0.0, 1.0)
    _, var = censored(_clean(g, s), np.full_like(g, s))
    inside = (denoised > 0.0) & (denoised < 1.0)
    terms = inside * var * ((held - denoised) / epsilon) ** 2 / denoised.size
    shares = region_sums(terms, region)
    return float(np.sum(shares)), float(np.sqrt(len(shares)) * np.std(shares, ddof=1))


def delivered(noisy: np.ndarray, denoised: np.ndarray, perturbed: np.ndarray,
              held: np.ndarray, probe: np.ndarray, epsilon: float, region: int,
              seed: int = 0) -> Estimate:
    """The point and range of the module docstring for the denoiser's output ``denoised``
    (before the clip) on ``noisy``, ``perturbed`` on ``noisy + ε·probe`` and ``held`` the
    output there with the fit held fixed. The high end is also held below the PSNR of
    :func:`output_variance` at the low noise level less :data:`CAP_Z` standard errors of its
    difference from the variance the noise realised (where the image is smooth, its risk is a
    small fraction of σ² and SURE's ``−σ²`` makes any error of ``s`` a large one: rocket at
    σ 0.1 had no upper bound), and the point below the high end."""
    _, divergence = sure_parts(noisy, denoised, perturbed, probe, epsilon, clip=(0.0, 1.0))
    s, e = calibrated_level(noisy, denoised, seed)
    levels = (s * (1.0 - TEXTURE_DOUBT), s * (1.0 + 2.0 * e))
    low, high = (psnr_of(clipped_risk(noisy, denoised, divergence, v)) for v in levels)
    variance, error = output_variance(denoised, held, epsilon, levels[0], region)
    high = min(high, psnr_of(variance - CAP_Z * np.sqrt(2.0) * error))
    point = min(psnr_of(clipped_risk(noisy, denoised, divergence, s)), high)
    low = min(low, point)
    return Estimate(10.0 ** (-point / 10.0), point, low, max(high, point), s, levels)
