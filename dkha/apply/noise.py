"""The noise model of a noisy image, estimated from the image alone, and the variance-stabilising
transform that makes signal-dependent noise gaussian of a known level.

Nothing here sees a clean image. :func:`dkha.apply.risk.noise_report` uses the model to pick the
risk rule, and :func:`dkha.apply.choose.fit_denoise` denoises Poisson noise in the stabilised
space.

The variance against the intensity
----------------------------------
The image's 2×2 blocks are sorted by their mean and split into :data:`BINS` groups of equal
size; in each group the noise variance is the mean of the squared finest diagonal Haar
coefficients (:func:`haar_diagonal`) below their :data:`TRIM` quantile, divided
by what that trimmed mean is for a standard normal (edges of the picture, which make the largest
coefficients, are left out). Three models of the observation ``y = clip(x + noise, 0, 1)`` (an
image dkha reads is in [0, 1]) are fitted to these (mean, variance) pairs by least squares on
the log-variance, each group weighted by its size:

* ``gaussian``: noise of one standard deviation ``s``;
* ``poisson-gaussian``: variance ``a·x + b`` (photon counts scaled by ``a``, plus read noise
  of variance ``b``);
* ``multiplicative``: standard deviation ``c·x`` (speckle).

The clip is part of each model (a censored normal's mean and variance, :func:`censored`), so
gaussian noise clipped at 0 and 1, whose variance falls at both ends, reads as gaussian. A
photograph's texture makes every model miss by much more than the groups' sampling error, so
a signal-dependent model is taken only when it explains most of the gaussian model's misfit
(its weighted squared error below :data:`GAIN` of the gaussian's) and, for Poisson, when the
photon part ``a·x`` is most of the variance at the median intensity.

The generalised Anscombe transform and its exact unbiased inverse
-----------------------------------------------------------------
For ``y = a·p + n``, ``p ~ Poisson(x/a)``, ``n ~ N(0, b)`` (Starck, Murtagh & Bijaoui 1998)::

    f(y) = 2 sqrt(max(y/a + 3/8 + b/a², 0))

has a variance close to 1 whatever ``x`` is; :class:`Stabiliser` maps it affinely so that
``f(0), f(1)`` become 0 and 1 (the noise's standard deviation is then ``1 / (f(1) − f(0))``).
A denoiser of ``t = f(y)`` estimates ``E[f(y) | x]``, not ``f(x)``; the exact unbiased inverse
(Mäkitalo & Foi 2011, 2013) maps an estimate ``D`` to the ``x`` with ``E[f(clip(y)) | x] = D``,
the expectation computed exactly (the Poisson sum over counts, Gauss-Hermite over ``n``, the
clip to [0, 1] included) on a grid of ``x`` and inverted by interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.errors import InputError, ParameterError

#: groups of 2×2 blocks by intensity
BINS = 16
#: the fraction of each group's squared Haar coefficients kept (the largest are edges)
TRIM = 0.9
#: a signal-dependent model must bring the gaussian's weighted squared error below this fraction
GAIN = 0.5
MODELS = ("gaussian", "poisson-gaussian", "multiplicative")
MAD_TO_SIGMA = 0.6745
#: 2×2 blocks a group needs at least; a smaller image is taken to have noise of one level
MIN_BLOCKS = 16
_GRID = np.linspace(0.0, 1.0, 401)


def haar_diagonal(image: np.ndarray) -> np.ndarray:
    """The finest diagonal Haar coefficients of ``image`` (its even-sized part)."""
    y = np.asarray(image, dtype=np.float64)
    h, w = (y.shape[0] // 2) * 2, (y.shape[1] // 2) * 2
    y = y[:h, :w]
    return (y[0::2, 0::2] - y[0::2, 1::2] - y[1::2, 0::2] + y[1::2, 1::2]) / 2.0


def mad(image: np.ndarray) -> float:
    """The median absolute finest diagonal Haar coefficient of ``image``."""
    hh = haar_diagonal(image)
    if hh.size == 0:
        raise ParameterError(f"an image of shape {np.shape(image)} is too small to estimate "
                             "its noise level")
    return float(np.median(np.abs(hh)))


def noise_level(image: np.ndarray) -> float:
    """``σ̂``: the median absolute finest diagonal Haar coefficient over 0.6745 (module
    docstring); an estimate of the standard deviation of white noise in ``image``."""
    return mad(image) / MAD_TO_SIGMA


def _trim_factor() -> float:
    """``E[z² | |z| < z_q]`` for a standard normal ``z`` and ``q`` = :data:`TRIM`."""
    from scipy.stats import norm

    zq = norm.ppf(0.5 + TRIM / 2)
    return float(1.0 - 2.0 * zq * norm.pdf(zq) / TRIM)


def variance_bins(image: np.ndarray, bins: int = BINS
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, variance, count)`` of each group of 2×2 blocks by intensity (module docstring)."""
    y = np.asarray(image, dtype=np.float64)
    h, w = (y.shape[0] // 2) * 2, (y.shape[1] // 2) * 2
    if h * w < 4 * MIN_BLOCKS * bins:
        raise InputError(f"an image of shape {y.shape} is too small to estimate how its noise "
                         "depends on the intensity")
    means = ((y[0:h:2, 0:w:2] + y[0:h:2, 1:w:2] + y[1:h:2, 0:w:2] + y[1:h:2, 1:w:2]) / 4).ravel()
    hh2 = haar_diagonal(y).ravel() ** 2
    groups = np.array_split(np.argsort(means, kind="stable"), bins)
    factor = _trim_factor()
    mu = np.array([means[g].mean() for g in groups])
    var = np.array([np.sort(hh2[g])[:int(np.ceil(TRIM * len(g)))].mean() / factor
                    for g in groups])
    return mu, var, np.array([len(g) for g in groups])


def censored(x: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``clip(x + s·z, 0, 1)``, ``z ~ N(0, 1)``, elementwise."""
    from scipy.stats import norm

    s = np.maximum(sd, 1e-9)
    lo, hi = -x / s, (1.0 - x) / s
    c_lo, c_hi, p_lo, p_hi = norm.cdf(lo), norm.cdf(hi), norm.pdf(lo), norm.pdf(hi)
    mid = c_hi - c_lo
    m = x * mid + s * (p_lo - p_hi) + (1.0 - c_hi)
    m2 = (x * x * mid + 2 * x * s * (p_lo - p_hi) + s * s * (mid + lo * p_lo - hi * p_hi)
          + (1.0 - c_hi))
    return m, np.maximum(m2 - m * m, 1e-12)


def _misfit(sd_of_x: np.ndarray, mu, log_var, weight) -> float:
    m, v = censored(_GRID, sd_of_x)
    order = np.argsort(m, kind="stable")
    pred = np.interp(mu, m[order], v[order])
    return float(np.sum(weight * (log_var - np.log(pred)) ** 2))


def _sd(kind: str, p: np.ndarray) -> np.ndarray:
    if kind == "gaussian":
        return np.full_like(_GRID, p[0])
    if kind == "multiplicative":
        return p[0] * _GRID + 1e-4
    return np.sqrt(p[0] * _GRID + p[1]) + 1e-5


@dataclass(frozen=True)
class NoiseModel:
    """The fitted models: ``kind`` (the one taken), the gaussian's ``s``, the Poisson-gaussian's
    ``a`` and ``b``, the multiplicative ``c``, and each model's weighted squared error
    (``misfit``)."""

    kind: str
    s: float
    a: float
    b: float
    c: float
    misfit: dict

    def summary(self) -> dict:
        return {"noise_model": self.kind, "gaussian_sd": self.s, "photon_scale": self.a,
                "read_variance": self.b, "multiplicative_sd": self.c,
                "model_misfit": dict(self.misfit)}

    def describe(self) -> str:
        if self.kind == "poisson-gaussian":
            return (f"the variance grows with the intensity: {self.a:.3g}·x + {self.b:.2g} "
                    f"(about {1 / self.a:.3g} photons at white)")
        if self.kind == "multiplicative":
            return f"the noise's standard deviation grows as {self.c:.3g}·x (speckle)"
        if not self.misfit:
            return f"one noise level ({self.s:.3g}) taken: too few pixels to tell how it varies"
        return f"one noise level ({self.s:.3g}), the clip to [0, 1] aside"


def fit_noise_model(image: np.ndarray) -> NoiseModel:
    """Fit the three models of the module docstring to the image's variance against intensity and
    take a signal-dependent one only where it explains most of the gaussian model's misfit. An
    image of fewer than :data:`MIN_BLOCKS` × :data:`BINS` 2×2 blocks is taken to have noise of
    one level (``s`` its :func:`noise_level`, no misfits)."""
    y = np.asarray(image, dtype=np.float64)
    if (y.shape[0] // 2) * (y.shape[1] // 2) < MIN_BLOCKS * BINS:
        return NoiseModel("gaussian", noise_level(y), 0.0, 0.0, 0.0, {})
    return _fit(y)


def _fit(image: np.ndarray) -> NoiseModel:
    from scipy.optimize import minimize

    mu, var, count = variance_bins(image)
    log_var, weight = np.log(np.maximum(var, 1e-12)), count / 2.0
    s0 = float(np.sqrt(np.median(var)))

    def fit(kind, starts):
        def loss(q):
            return _misfit(_sd(kind, np.exp(q)), mu, log_var, weight)
        best = min((loss(np.log(p)), np.log(p)) for p in starts)
        res = minimize(loss, best[1], method="Nelder-Mead",
                       options={"xatol": 1e-4, "fatol": 1e-6, "maxiter": 400})
        return (float(res.fun), np.exp(res.x)) if res.fun < best[0] else (best[0],
                                                                          np.exp(best[1]))

    g = fit("gaussian", [np.array([s0 * f]) for f in (0.7, 1.0, 1.4)])
    m = fit("multiplicative", [np.array([s0 / max(float(np.median(mu)), 0.05) * f])
                               for f in (0.5, 1.0, 2.0)])
    p = fit("poisson-gaussian", [np.array([s0 ** 2 * fa, s0 ** 2 * fb])
                                 for fa in (0.3, 1.0, 3.0) for fb in (0.01, 0.3)])
    misfit = {"gaussian": g[0], "poisson-gaussian": p[0], "multiplicative": m[0]}
    a, b = float(p[1][0]), float(p[1][1])
    kind = "gaussian"
    photon_dominant = a * float(np.median(mu)) > b
    if p[0] < GAIN * g[0] and p[0] <= m[0] and photon_dominant:
        kind = "poisson-gaussian"
    elif m[0] < GAIN * g[0] and m[0] < p[0]:
        kind = "multiplicative"
    return NoiseModel(kind, float(g[1][0]), a, b, float(m[1][0]), misfit)


class Stabiliser:
    """The generalised Anscombe transform for ``y = a·Poisson(x/a) + N(0, b)`` clipped to [0, 1],
    scaled so that 0 and 1 map to 0 and 1, and its exact unbiased inverse (module docstring).

    ``sigma`` is the standard deviation of the noise in the stabilised space."""

    #: Gauss-Hermite nodes over the read noise
    NODES = 24

    def __init__(self, a: float, b: float):
        if not (a > 0 and b >= 0):
            raise ParameterError(f"a Poisson-gaussian model needs a > 0 and b ≥ 0, got {a}, {b}")
        self.a, self.b = float(a), float(b)
        self.lo = self._raw(np.array(0.0))
        self.span = self._raw(np.array(1.0)) - self.lo
        self.sigma = 1.0 / float(self.span)
        self.x_grid, self.expected = self._table()

    def _raw(self, y: np.ndarray) -> np.ndarray:
        return 2.0 * np.sqrt(np.maximum(y / self.a + 0.375 + self.b / self.a ** 2, 0.0))

    def forward(self, y: np.ndarray) -> np.ndarray:
        """``(f(y) − f(0)) / (f(1) − f(0))``."""
        return (self._raw(np.asarray(y, dtype=np.float64)) - self.lo) / self.span

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        """``E[forward(clip(y, 0, 1)) | x]`` on a grid of ``x`` in [0, 1], denser near 0."""
        from scipy.stats import poisson

        x = np.unique(np.concatenate([np.linspace(0, 1, 513), np.geomspace(1e-5, 0.05, 128)]))
        lam = x / self.a
        kmax = int(np.ceil(lam[-1] + 12 * np.sqrt(lam[-1]) + 20))
        k = np.arange(kmax + 1)
        if self.b > 0:
            nodes, w = np.polynomial.hermite_e.hermegauss(self.NODES)
            w = w / w.sum()
            obs = self.a * k[:, None] + np.sqrt(self.b) * nodes[None, :]
            per_k = self.forward(np.clip(obs, 0.0, 1.0)) @ w
        else:
            per_k = self.forward(np.clip(self.a * k, 0.0, 1.0))
        pmf = poisson.pmf(k[None, :], lam[:, None])
        expected = pmf @ per_k / pmf.sum(axis=1)
        return x, np.maximum.accumulate(expected)

    def inverse(self, d: np.ndarray) -> np.ndarray:
        """The exact unbiased inverse: the ``x`` whose expected transform is ``d``."""
        return np.interp(d, self.expected, self.x_grid)
