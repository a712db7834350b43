"""Denoise an image with parameters chosen from the noisy image alone.

:func:`fit_denoise` fits kernel PCA on the noisy image's own patches and chooses the kernel
width, the number of components, the pre-image and the patch aggregation by a risk estimate on the
noisy image (:mod:`dkha.apply.risk`: Stein's unbiased risk estimate with the noise level
estimated from the image, or a held-out-pixel loss): **no parameter of this path is chosen by
looking at a clean image**. The same function with ``model="linear"`` is linear patch PCA under the
same patches, candidates of rank and aggregation and the same rule (the fair baseline).

The denoiser
------------
The image is cut into ``patch × patch`` windows on a grid of ``step`` pixels (plus the windows
flush with the far edges); a seeded sample of ``samples`` of them is the training set. For each
width ``w`` of ``widths`` (multiples of the median distance between training patches) dkha's
exact dense path (:func:`dkha.fit.dense.dense_fit`, the one ``dkha fit`` takes for a store this
small) gives the top ``max(ranks)`` components; every window is projected on the first ``r``
(``r`` in ``ranks``) and mapped back by a pre-image:

* ``conformal`` — Honeine's conformal map, ``Σ_j γ_j x_j`` (:func:`dkha.apply.preimage.conformal`);
* ``learned`` — kernel ridge regression from the training windows' projections back to the
  windows (Bakır et al.; :func:`dkha.fit.ridge.learned_preimage`), a gaussian kernel of twice
  the median distance between projections, ridge ``ridges``;
* ``fixed-point`` — Mika et al.'s iteration started from the conformal pre-image;

the learned pre-image and the fixed point for the :data:`SHORTLIST` (width, rank) pairs whose
conformal pre-image has the lowest risk.

Windows are averaged where they overlap, uniformly or weighted by their estimated reliability:
``1 / max(‖y_p − z_p‖² − (d − 2r)σ̂², rσ̂²)``, the inverse of the window's own risk estimate for
a rank-``r`` projection (BM3D's aggregation weighs its estimates by their inverse variance). The
result is clipped to [0, 1], and SURE is that of the clipped result (the clip's divergence
included: :func:`dkha.apply.risk.sure_parts`).

As the width grows the gaussian kernel's PCA tends to linear PCA: the candidates include that
limit (``σ → ∞``: linear PCA of the same windows, the same ranks and aggregations). A gaussian
width is used only when its best candidate's estimated risk is below the limit's best by at
least :data:`MARGIN` (5 %) of it and :data:`Z_SCORE` (2) standard errors of the difference,
measured from how the difference spreads over the image's 16×16 regions, and for SURE at each
noise level ``σ̂ (1 ± NOISE_DOUBT)`` as well as at ``σ̂`` (:func:`settle`); otherwise the limit
is, and the image gets linear patch PCA's own result: a kernel setting is taken where the image
shows it pays, not where the estimates' errors (σ̂, the probe, pixels clipped in the noisy
image) could make it look so.

Poisson noise
-------------
When the image's noise grows with its intensity as photon counts do (:mod:`dkha.apply.noise`),
the rule is ``anscombe``: the whole choice runs on the generalised Anscombe transform of the
image, where the noise is gaussian of one level (σ̂ estimated there), and the chosen result is
mapped back by the exact unbiased inverse; the risks are those of the stabilised space
(:attr:`Choice.space`). Linear patch PCA (``model="linear"``) takes the same path.

Every candidate's risk is estimated on the same two evaluations of the whole denoiser (fits
included): ``y`` and ``y + εb`` for SURE (``ε = σ̂/10``), or the two held-out images for the
held-out rule (then the chosen candidate is run once more on ``y``). The chosen candidate, its
estimated risk and the whole table are returned (:class:`Choice`) and written by ``dkha denoise``;
the table's risks are in the stabilised space for ``anscombe``.

No parameter of this path was chosen by looking at a clean image: the candidate grids, MARGIN,
NOISE_DOUBT and the noise models' thresholds were set on the development photographs
(scikit-image's astronaut, camera and coins, :mod:`benchmarks.denoise_photo`), and each image's
own choice is made from its noisy pixels alone.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from dkha import config
from dkha.apply.denoise import (
    DenoiseResult,
    accumulate_patches,
    as_image,
    patch_corners,
    reference_figures,
)
from dkha.apply.estimate import Estimate, delivered
from dkha.apply.preimage import Training, conformal, expansion, fixed_point
from dkha.apply.risk import (
    HOLD_OFFSETS,
    held_out_terms,
    hold_mask,
    hold_out,
    noise_report,
    probe,
    region_sums,
    stabiliser,
    sure_parts,
)
from dkha.engine.tasks import center_block
from dkha.errors import InputError, ParameterError
from dkha.fit.dense import dense_fit
from dkha.fit.ridge import learned_preimage
from dkha.kernels import make_kernel, median_distance
from dkha.progress import phase
from dkha.schedule import Stream, random_stream

MODELS = ("kernel", "linear")
DEFAULT_WIDTHS = (1.5, 3.0, 6.0, 30.0)
DEFAULT_RANKS = (4, 6, 8, 12, 16, 24, 32)
DEFAULT_RIDGES = (0.1,)
DEFAULT_PATCH, DEFAULT_STEP, DEFAULT_SAMPLES = 8, 2, 1000
#: (width, rank) pairs that also get the fixed-point pre-image
SHORTLIST = 3
#: the fixed point's tolerance here: tighter than denoising's default, for SURE's ε-difference
CHOICE_TOL = 1e-7
LEARNED_WIDTH = 2.0
#: the relative margin of estimated risk a gaussian width must win by over the σ → ∞ limit
MARGIN = 0.05
#: ... and by this many standard errors of the difference
Z_SCORE = 2.0
#: the relative error of the noise level σ̂ a gaussian width's gain must survive (on the
#: development photographs σ̂ of the finest diagonal Haar MAD was 0.98-1.14 × the standard
#: deviation of the noise actually added at σ = 0.05-0.2; 1.37 on the grass texture at 0.05)
NOISE_DOUBT = 0.15
#: the side of the square regions over which the risk's noise is measured (pixels)
REGION = 16


@dataclass(frozen=True)
class Candidate:
    """One setting of the denoiser: the kernel width (a multiple of the median patch distance;
    None for linear PCA), the rank, the pre-image (``linear``, ``conformal``, ``learned``,
    ``fixed-point``), the learned pre-image's ridge and whether windows are weighted."""

    width: float | None
    rank: int
    preimage: str
    ridge: float | None = None
    weighted: bool = False

    def label(self) -> str:
        w = "σ→∞ (linear)" if self.width is None else f"σ={self.width:g}×median"
        pre = self.preimage + ("" if self.ridge is None else f"(ridge {self.ridge:g})")
        return f"{w}, r={self.rank}, {pre}, {'weighted' if self.weighted else 'uniform'}"


@dataclass
class Choice:
    """The choice and how it was made: the noise report (``σ̂``, the noise model, the rule and
    why), the chosen candidate, its estimated risk (MSE per pixel; for the held-out rule also its
    loss) and the risk of every candidate tried, best first; ``space``: where the risks are
    measured, ``image`` or ``anscombe`` (the stabilised space, where the noise's standard
    deviation is ``σ̂``; no PSNR is implied there); ``estimate``: for SURE's rule, the PSNR the
    result delivers as a point and a range (:mod:`dkha.apply.estimate`: the candidates' SURE at
    σ̂, which ranks them, read as that PSNR was 0.5-2 dB optimistic on photographs); None for
    the held-out rule (its loss less σ̂², read as a PSNR before, was 3-14 dB low under impulses
    and speckle: σ̂, the gaussian Haar MAD, is not their noise's variance) and ``anscombe``."""

    noise: dict
    rule: str
    chosen: Candidate
    risk: float
    table: list = field(default_factory=list)
    seconds: float = 0.0
    space: str = "image"
    estimate: Estimate | None = None

    def summary(self) -> dict:
        delivered = ({"estimated_psnr": None, "estimated_psnr_range": None}
                     if self.estimate is None else self.estimate.summary())
        return {**self.noise, "rule": self.rule, "chosen": asdict(self.chosen),
                "chosen_label": self.chosen.label(), "estimated_risk": self.risk,
                "risk_space": self.space, **delivered, "candidates": self.table,
                "choice_seconds": self.seconds}


class Windows:
    """The windows of one image on the patch grid, and their average back into an image."""

    def __init__(self, image: np.ndarray, patch: int, step: int):
        from skimage.util import view_as_windows

        self.image, self.patch, self.step = image, patch, step
        self.corners = patch_corners(image.shape, patch, step)
        w = view_as_windows(np.ascontiguousarray(image), (patch, patch))
        self.Y = np.ascontiguousarray(
            w[self.corners[:, 0], self.corners[:, 1]].reshape(len(self.corners), -1))

    def average(self, Z: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        total = np.zeros(self.image.shape)
        count = np.zeros(self.image.shape)
        accumulate_patches(total, count, self.corners, Z.reshape(-1, self.patch, self.patch),
                           weights)
        return total / count


class Evaluation:
    """The denoiser's candidates on one input image (``y``, ``y + εb`` or a held-out image):
    its windows, the training sample (the same positions for every input) and the fits per
    width, made once."""

    def __init__(self, image, patch, step, train_index, sigma_hat, max_rank):
        self.windows = Windows(image, patch, step)
        self.T = self.windows.Y[train_index]
        self.train_index, self.sigma_hat = train_index, sigma_hat
        self.max_rank = max_rank
        self.fits: dict = {}
        self.projectors: dict = {}
        self.source = self                 # the evaluation whose fits these are (held)
        self.median = median_distance(self.T)

    def fit(self, width: float | None):
        """``(kernel, alpha, projections of every window)`` for ``width`` (None: linear PCA,
        ``(mean, V, coefficients)``)."""
        if width not in self.fits:
            if width is None:
                mean = self.T.mean(axis=0)
                V = np.linalg.svd(self.T - mean, full_matrices=False)[2][:self.max_rank]
                first, A = mean, V
                self.projectors[width] = lambda Y: (Y - mean) @ V.T
            else:
                kernel = make_kernel("gaussian", sigma=width * self.median)
                res, mk, mkm, _ = dense_fit(self.T, kernel, self.max_rank)
                first, A = kernel, res.alpha

                def project(Y, T=self.T):
                    K = kernel.block(Y, T)
                    return center_block(K, K.mean(axis=1), mk, mkm) @ res.alpha.T
                self.projectors[width] = project
            self.fits[width] = (first, A, self.projectors[width](self.windows.Y))
        return self.fits[width]

    def held(self, image: np.ndarray, width: float | None) -> Evaluation:
        """This evaluation's fit for ``width`` (training windows, basis, pre-images' training)
        applied to the windows of ``image``: the denoiser with its fit held fixed, a local map
        (a window's output depends on that window alone), whose Jacobian
        :func:`dkha.apply.estimate.output_variance` takes."""
        first, A, _ = self.fit(width)
        held = copy.copy(self)
        held.windows = Windows(image, self.windows.patch, self.windows.step)
        held.fits = {width: (first, A, self.projectors[width](held.windows.Y))}
        return held

    def patches(self, c: Candidate, start: np.ndarray | None = None) -> np.ndarray:
        """The reconstructed windows of candidate ``c`` (aggregation aside)."""
        first, A, beta = self.fit(c.width)
        r = c.rank
        if c.preimage == "linear":
            return first + beta[:, :r] @ A[:r]
        kernel, alpha = first, A[:r]
        exp = expansion(alpha, beta[:, :r])
        training = Training.from_array(self.T, kernel, alpha)
        if c.preimage == "conformal":
            return conformal(training, exp).Z
        if c.preimage == "fixed-point":
            start = conformal(training, exp).Z if start is None else start
            return fixed_point(training.sums, exp, start, tol=CHOICE_TOL).Z
        P_train = self.source.fit(c.width)[2][self.train_index, :r]
        ridge_kernel = make_kernel("gaussian",
                                   sigma=LEARNED_WIDTH * median_distance(P_train))
        coef = learned_preimage(P_train, self.T, ridge_kernel, c.ridge, None,
                                config.settings()).dual_coef
        return ridge_kernel.block(beta[:, :r], P_train) @ coef

    def images(self, cands: list[Candidate]) -> dict:
        """The denoised image of every candidate before the clip to [0, 1] (uniform and weighted
        share their windows)."""
        out: dict = {}
        for c in cands:
            key = (c.width, c.rank, c.preimage, c.ridge)
            if key not in out:
                out[key] = self.patches(c)
        d = self.windows.Y.shape[1]
        s2 = self.sigma_hat ** 2
        result = {}
        for c in cands:
            Z = out[(c.width, c.rank, c.preimage, c.ridge)]
            weights = None
            if c.weighted:
                res = np.sum((self.windows.Y - Z) ** 2, axis=1)
                weights = 1.0 / np.maximum(res - (d - 2 * c.rank) * s2, max(c.rank * s2, 1e-12))
            result[c] = self.windows.average(Z, weights)
        return result


def candidates(model: str, widths, ranks) -> list[Candidate]:
    """The first round's candidates: every rank with linear PCA's reconstruction (for the
    kernel model, the gaussian kernel's ``σ → ∞`` limit) and, for the kernel model, every width
    with the conformal pre-image; uniform and weighted."""
    return [Candidate(w, r, "linear" if w is None else "conformal", weighted=weighted)
            for weighted in (False, True) for r in ranks
            for w in ((None,) if model == "linear" else (None, *widths))]


def shortlist(scored: list, ridges, fixed: bool) -> list[Candidate]:
    """The second round: the learned pre-image (each ridge) and the fixed point on the
    :data:`SHORTLIST` (width, rank) pairs whose first-round risk is lowest, each pair with the
    aggregation that served it best."""
    best: dict = {}
    for c, *_ in sorted(scored, key=lambda t: t[1]):
        if c.width is not None:
            best.setdefault((c.width, c.rank), c)
    out = []
    for c in list(best.values())[:SHORTLIST]:
        out += [Candidate(c.width, c.rank, "learned", g, c.weighted) for g in ridges]
        if fixed:
            out.append(Candidate(c.width, c.rank, "fixed-point", weighted=c.weighted))
    return out


class RiskRule:
    """The two evaluations a rule needs and its risk of each candidate from their outputs."""

    def __init__(self, y: np.ndarray, rule: str, sigma_hat: float, seed: int):
        self.y, self.sigma_hat = y, sigma_hat
        self.rule = "sure" if rule == "anscombe" else rule
        if self.rule == "sure":
            self.b = probe(y.shape, seed)
            self.epsilon = max(sigma_hat, 1e-3) / 10.0
            self.inputs = [y, y + self.epsilon * self.b]
        else:
            self.masks = [hold_mask(y.shape, o) for o in HOLD_OFFSETS]
            self.inputs = [hold_out(y, m) for m in self.masks]

    def risk(self, outputs: list[np.ndarray]) -> tuple[float, float | None, np.ndarray]:
        """``(estimated MSE per pixel, held-out loss or None, the estimate's sums over the
        image's :data:`REGION`-pixel tiles divided by the pixels it is over)``: the regions'
        shares add up to the estimate, and their spread measures its noise (:func:`settle`).
        For SURE the shares have one row for each noise level of :attr:`levels` (``σ̂`` less and
        more :data:`NOISE_DOUBT`, and ``σ̂``), the held-out loss one row."""
        if self.rule == "sure":
            residual, divergence = sure_parts(self.y, outputs[0], outputs[1], self.b,
                                              self.epsilon, clip=(0.0, 1.0))
            rows = [region_sums(residual - s * s + 2.0 * s * s * divergence, REGION)
                    / residual.size for s in self.levels]
            return float(np.sum(rows[-1])), None, np.array(rows)
        terms = held_out_terms(self.y, [np.clip(o, 0.0, 1.0) for o in outputs], self.masks)
        count = sum(self.masks)
        loss = float(np.sum(terms) / count.sum())
        shares = region_sums(terms - self.sigma_hat ** 2 * count, REGION) / count.sum()
        return loss - self.sigma_hat ** 2, loss, shares[None, :]

    @property
    def levels(self) -> tuple[float, float, float]:
        """The noise levels SURE is evaluated at: the gain of a kernel width must hold at each
        (``σ̂`` is off by up to :data:`NOISE_DOUBT` on textured photographs); ``σ̂`` last."""
        s = self.sigma_hat
        return (s * (1.0 - NOISE_DOUBT), s * (1.0 + NOISE_DOUBT), s)


def check_choice_options(model, patch, step, samples, widths, ranks, ridges, shape):
    if model not in MODELS:
        raise ParameterError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if patch < 2 or step < 1 or samples < 2:
        raise ParameterError(f"patch must be at least 2, step and samples positive; got patch "
                             f"{patch}, step {step}, samples {samples}")
    if min(shape) < patch:
        raise InputError(f"an image of shape {shape} is smaller than a {patch}-pixel patch")
    if not ranks or min(ranks) < 1 or max(ranks) > patch * patch:
        raise ParameterError(f"ranks must lie in 1..{patch * patch}, got {list(ranks)}")
    if model == "kernel" and (not widths or min(widths) <= 0 or min(ridges) <= 0):
        raise ParameterError("widths and ridges must be positive")


def fit_denoise(image, *, model: str = "kernel", reference=None, patch: int = DEFAULT_PATCH,
                step: int = DEFAULT_STEP, samples: int = DEFAULT_SAMPLES, widths=DEFAULT_WIDTHS,
                ranks=DEFAULT_RANKS, ridges=DEFAULT_RIDGES, risk: str = "auto",
                noise_sigma: float | None = None, fixed_point: bool = True,
                seed: int = 0) -> DenoiseResult:
    """Denoise a grey image by kernel PCA of its own patches, every parameter chosen by a risk
    estimate on the noisy image (module docstring). No parameter of this path was chosen by
    looking at a clean image: ``reference`` is only used to report the SNR afterwards.

    Parameters
    ----------
    image : str or ndarray (H, W)
        The noisy image (a path, ``skimage:NAME``, or an array in [0, 1]).
    model : {"kernel", "linear"}
        Kernel PCA (dkha), or linear patch PCA under the same patches and rule (the baseline).
    reference : str or ndarray, optional
        The clean image, to report the SNR (never used to choose).
    patch, step, samples : int
        Window side, grid step, and the training windows (a seeded sample; all if fewer).
    widths : sequence of float
        Gaussian widths tried, as multiples of the median distance between training windows.
    ranks : sequence of int
        Numbers of components tried.
    ridges : sequence of float
        The learned pre-image's ridges tried.
    risk : {"auto", "sure", "held-out", "anscombe"}
        The risk estimate (:mod:`dkha.apply.risk`); ``auto`` decides from the image's noise
        model; ``anscombe``: SURE after the generalised Anscombe transform (Poisson noise).
    noise_sigma : float, optional
        The noise's standard deviation when it is known (for ``anscombe``, in the stabilised
        space); default: estimated from the image (:func:`dkha.apply.risk.noise_level`).
    fixed_point : bool
        Also try the fixed-point pre-image on the shortlisted (width, rank) pairs.
    seed : int
        The training sample's and SURE's probe's seed.

    Returns
    -------
    DenoiseResult
        With ``choice`` (:class:`Choice`): the chosen candidate, its estimated risk, the table.

    Examples
    --------
    >>> res = fit_denoise("noisy.png")                    # doctest: +SKIP
    >>> res.choice.chosen.label(), res.choice.risk        # doctest: +SKIP
    """
    t0 = time.perf_counter()
    y = as_image(image, "image")
    clean = None if reference is None else as_image(reference, "reference")
    widths, ranks, ridges = tuple(widths), tuple(sorted(set(ranks))), tuple(ridges)
    check_choice_options(model, patch, step, samples, widths, ranks, ridges, y.shape)
    report = noise_report(y, risk, sigma=noise_sigma)
    stab = stabiliser(report.model) if report.rule == "anscombe" else None
    work = y if stab is None else stab.forward(y)
    rule = RiskRule(work, report.rule, report.sigma, seed)
    n_windows = len(patch_corners(y.shape, patch, step))
    rng = random_stream(seed, Stream.DENOISE_CHOICE, 0)
    train = np.sort(rng.choice(n_windows, min(samples, n_windows), replace=False))
    ranks = tuple(r for r in ranks if r < len(train)) or (min(len(train) - 1, patch * patch),)
    phase(f"choosing the denoiser: noise σ̂ {report.sigma:.4g}, rule {report.rule}; "
          f"{len(train)} training windows of {n_windows}")
    evals = [Evaluation(v, patch, step, train, report.sigma, max(ranks))
             for v in rule.inputs]
    scored = _rounds(evals, rule, model, candidates(model, widths, ranks), ridges, fixed_point)
    best, best_risk = settle(scored)
    phase(f"denoising with {best.label()}")
    final = evals[0] if rule.rule == "sure" else Evaluation(work, patch, step, train,
                                                            report.sigma, max(ranks))
    raw = final.images([best])[best]
    out = np.clip(raw if stab is None else stab.inverse(np.clip(raw, 0.0, 1.0)), 0.0, 1.0)
    table = [{"candidate": c.label(), "risk": r, **({} if h is None else {"held_out_loss": h})}
             for c, r, h, _ in scored]
    choice = Choice(noise=report.summary(), rule=report.rule, chosen=best, risk=best_risk,
                    table=table, space="image" if stab is None else "anscombe",
                    estimate=_delivered(rule, evals, best, raw, seed) if stab is None else None)
    choice.seconds = time.perf_counter() - t0
    return DenoiseResult(image=out, noisy=y, n_patches=n_windows, patch=patch, step=step,
                         iterations=0, converged=n_windows, undefined=0,
                         seconds=time.perf_counter() - t0, method=best.preimage, choice=choice,
                         **reference_figures(clean, y, out))


def _delivered(rule: RiskRule, evals: list, best: Candidate, raw: np.ndarray,
               seed: int) -> Estimate | None:
    """The PSNR the chosen candidate delivers, a point and a range
    (:func:`dkha.apply.estimate.delivered`), for SURE's rule; None for the held-out rule (its
    noise is not gaussian: the clip model does not apply)."""
    if rule.rule != "sure":
        return None
    phase("estimating what the chosen denoiser delivers")
    held = evals[0].held(rule.inputs[1], best.width).images([best])[best]
    return delivered(rule.y, raw, evals[1].images([best])[best], held, rule.b, rule.epsilon,
                     2 * evals[0].windows.patch, seed)


def _rounds(evals: list, rule: RiskRule, model: str, first: list, ridges,
            fixed_point: bool) -> list:
    """Both rounds' scores (:func:`_score`), best first; each round said as it begins."""
    phase(f"choosing the denoiser: {len(first)} candidates (linear and conformal pre-images)")
    scored = _score(evals, rule, first)
    if model == "kernel":
        second = shortlist(scored, ridges, fixed_point)
        phase(f"choosing the denoiser: {len(second)} more on the shortlist (learned"
              + (" and fixed-point" if fixed_point else "") + " pre-images)")
        scored += _score(evals, rule, second)
    return sorted(scored, key=lambda t: t[1])


def settle(scored: list) -> tuple[Candidate, float]:
    """The candidate to use from ``scored`` (best first): the best gaussian-kernel candidate when
    its estimated risk is below that of the best ``σ → ∞`` one (linear PCA, the kernel's limit)
    by at least :data:`MARGIN` of it and :data:`Z_SCORE` standard errors of the difference
    (from the spread of the two estimates' differences over the image's regions), the
    difference measured at every noise level of :attr:`RiskRule.levels` (one row of shares
    each) against the margin of the risk at ``σ̂``; else that one. The estimates'
    errors (σ̂'s, the probe's, clipped pixels') are of that order, and a kernel setting that is
    not clearly better is not taken."""
    limit = [t for t in scored if t[0].width is None]
    kernel = [t for t in scored if t[0].width is not None]
    if not limit:
        return scored[0][0], scored[0][1]
    if kernel and all(_wins(k, l, limit[0][1]) for k, l in zip(np.atleast_2d(kernel[0][3]),
                                                               np.atleast_2d(limit[0][3]))):
        return kernel[0][0], kernel[0][1]
    return limit[0][0], limit[0][1]


def _wins(shares: np.ndarray, shares0: np.ndarray, risk0: float) -> bool:
    """Whether the risk of regional shares ``shares`` is below that of ``shares0`` by
    :data:`MARGIN` of ``risk0`` (the limit's risk at ``σ̂``) and :data:`Z_SCORE` standard errors
    of the difference."""
    diff = shares - shares0
    error = float(np.sqrt(len(diff)) * np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
    return -float(np.sum(diff)) > max(MARGIN * risk0, Z_SCORE * error)


def _score(evals: list[Evaluation], rule: RiskRule, cands: list[Candidate]) -> list:
    """``[(candidate, risk, held-out loss or None, the risk's regional shares)]`` from both
    evaluations (:meth:`RiskRule.risk`)."""
    outputs = [e.images(cands) for e in evals]
    return [(c, *rule.risk([o[c] for o in outputs])) for c in cands]
