"""Pre-images: points of input space whose image approximates a point of feature space.

Denoising by kernel PCA projects a sample's image onto the leading components and asks for the
input-space point ``z`` whose image is closest to that projection (Mika et al. 1999, Kim et al.
2005). This module is the one home of pre-image methods; it holds the fixed-point iteration of
Mika et al. for the gaussian kernel.

The projection as an expansion over the training samples
--------------------------------------------------------
With ``m = (1/l) Σ_j Φ(x_j)``, ``Φ'(x) = Φ(x) − m`` and the components
``v_i = Σ_j alpha[i, j] Φ'(x_j)``, the projection of a new sample ``x`` on component ``i`` is
``β_i = ⟨v_i, Φ'(x)⟩ = Σ_j alpha[i, j] k'(x)_j`` (``k'(x)`` centered with the training ``mk``,
``mkm``, coordinator-math.md §1). Project the centered image, then add the mean back::

    PΦ(x) = m + Σ_i β̃_i v_i
          = Σ_j [ (β̃ᵀA)_j + (1 − Σ_k (β̃ᵀA)_k) / l ] Φ(x_j)  =  Σ_j γ_j Φ(x_j)

    γ = β̃ᵀ A + c 1ᵀ,    c = (1 − β̃ᵀ A 1) / l

where ``β̃ = β`` for orthonormal components (exact kernel PCA, a converged KHA: ``A K' Aᵀ = I``)
and ``β̃ = G⁻¹ β`` with the Gram matrix ``G = A K' Aᵀ`` otherwise (the orthogonal projection onto
the span of the components, whatever their norms). ``γ`` is ``n × l``: it is never formed whole,
only block by block of training samples, from the factors ``β̃`` (``n × r``) and ``c`` (``n``)
(:class:`Expansion`).

The fixed-point iteration (gaussian kernel)
-------------------------------------------
``‖PΦ(x) − Φ(z)‖² = k(z, z) − 2 Σ_j γ_j k(z, x_j) + ‖PΦ(x)‖²`` and ``k(z, z) = 1``, so the
pre-image maximises ``f(z) = Σ_j γ_j k(z, x_j)``. Setting its gradient to zero gives Mika et al.'s
iteration::

    z ← Σ_j γ_j k(z, x_j) x_j  /  Σ_j γ_j k(z, x_j)

run for many samples at once (rows of ``Z``), summing numerator and denominator block by block of
training samples. The denominator is ``f(z) = ⟨PΦ(x), Φ(z)⟩``; where it is not clearly positive
the step is undefined (the iteration can jump far away): such samples keep their current ``z`` and
are reported as not converged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dkha.errors import InputError, ParameterError
from dkha.kernels import Kernel

log = logging.getLogger(__name__)

DEFAULT_ITERATIONS = 50
DEFAULT_TOL = 1e-5
DEFAULT_BLOCK = 4096  # training samples per block of kernel values
# |Σ γ k| below this fraction of Σ |γ k| makes the fixed-point step undefined
DENOMINATOR_FLOOR = 1e-8


@dataclass(frozen=True)
class Expansion:
    """``γ = weights · alpha + offset 1ᵀ``: the projections as expansions over the training set.

    Attributes
    ----------
    weights : ndarray (n, r)
        ``β̃``: the projections, or ``G⁻¹ β`` when the components are not orthonormal.
    offset : ndarray (n,)
        ``c = (1 − β̃ᵀ A 1) / l``: the centering terms.
    """

    weights: np.ndarray
    offset: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)

    def block(self, alpha_block: np.ndarray) -> np.ndarray:
        """``γ[:, J]`` for the training samples ``J`` (``alpha_block = alpha[:, J]``)."""
        G = self.weights @ alpha_block
        G += self.offset[:, None]
        return G

    def dense(self, alpha: np.ndarray) -> np.ndarray:
        """``γ`` whole (``n × l``; small problems and tests only)."""
        return self.block(alpha)

    def take(self, index) -> "Expansion":
        return Expansion(self.weights[index], self.offset[index])


def expansion(alpha: np.ndarray, projections: np.ndarray, *, gram: np.ndarray | None = None
              ) -> Expansion:
    """The expansion coefficients of ``PΦ(x) = Σ_j γ_j Φ(x_j)`` (module docstring).

    Parameters
    ----------
    alpha : ndarray (r, l)
        The coefficients of the components over the centered training samples.
    projections : ndarray (n, r)
        ``β``: the samples' projections on the components (``dkha.transform.project``).
    gram : ndarray (r, r), optional
        ``G = A K' Aᵀ``; when given, the projection is the orthogonal one onto the span of the
        components (``β̃ = G⁻¹ β``), exact even if the components are not orthonormal.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.atleast_2d(np.asarray(projections, dtype=np.float64))
    if alpha.ndim != 2 or beta.shape[1] != alpha.shape[0]:
        raise InputError(f"projections of shape {beta.shape} do not match "
                         f"{alpha.shape[0]} components")
    if gram is not None:
        gram = np.asarray(gram, dtype=np.float64)
        # symmetric positive definite for independent components; lstsq copes with the rest
        beta = np.linalg.lstsq(gram, beta.T, rcond=None)[0].T
    l = alpha.shape[1]
    offset = (1.0 - beta @ alpha.sum(axis=1)) / l
    return Expansion(np.ascontiguousarray(beta), offset)


def check_gaussian(kernel: Kernel) -> None:
    """Raise :class:`ParameterError` unless ``kernel`` is gaussian (the fixed point needs it)."""
    if kernel.name != "gaussian":
        raise ParameterError(
            f"the fixed-point pre-image (Mika et al.) needs a gaussian kernel; this run used "
            f"{kernel.describe()}. Fit with --kernel gaussian to denoise."
        )


# --- one block of the iteration: a pure function of blocks and scalars (runs on workers) -------


def fixed_point_sums(Z: np.ndarray, X_block: np.ndarray, kernel: Kernel, weights: np.ndarray,
                     alpha_block: np.ndarray, offset: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block of training samples' share of the fixed-point sums.

    Returns ``Σ_j w_j x_j`` (``n × d``), ``Σ_j w_j`` and ``Σ_j |w_j|`` over the block, with
    ``w_j = γ_j k(z, x_j)``.
    """
    W = kernel.block(Z, X_block)
    W *= weights @ alpha_block + offset[:, None]
    return W @ X_block, W.sum(axis=1), np.abs(W).sum(axis=1)


def array_sums(X_train: np.ndarray, kernel: Kernel, alpha: np.ndarray, *,
               block: int | None = None) -> Callable:
    """The fixed-point sums over an in-memory training set, ``block`` samples at a time."""
    X_train = np.ascontiguousarray(X_train, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    block = DEFAULT_BLOCK if block is None else int(block)

    def sums(Z: np.ndarray, exp: Expansion):
        num = np.zeros_like(Z)
        den = np.zeros(len(Z))
        mag = np.zeros(len(Z))
        for a in range(0, len(X_train), block):
            n_, d_, m_ = fixed_point_sums(Z, X_train[a:a + block], kernel, exp.weights,
                                          alpha[:, a:a + block], exp.offset)
            num += n_
            den += d_
            mag += m_
        return num, den, mag

    return sums


def _store_group_sums(path: str, kernel: Kernel, cols: tuple, Z: np.ndarray, weights: np.ndarray,
                      alpha_group: np.ndarray, offset: np.ndarray, block: int):
    """Worker task: the sums over one column group of a data store (chunk ranges ``cols``)."""
    from dkha.rows import load_rows

    num = np.zeros_like(Z)
    den = np.zeros(len(Z))
    mag = np.zeros(len(Z))
    a0 = cols[0][0]
    for a, b in cols:
        X = load_rows(path, a, b)
        for s in range(a, b, block):
            e = min(s + block, b)
            n_, d_, m_ = fixed_point_sums(Z, X[s - a:e - a], kernel, weights,
                                          alpha_group[:, s - a0:e - a0], offset)
            num += n_
            den += d_
            mag += m_
    return num, den, mag


def engine_sums(engine, alpha: np.ndarray, *, block: int | None = None) -> Callable:
    """The fixed-point sums over a :class:`~dkha.rows.RowEngine`'s store, one task per column
    group (the workers read their chunks from the store and keep them cached)."""
    block = DEFAULT_BLOCK if block is None else int(block)
    client = engine.client
    groups = engine.column_groups
    alpha = np.asarray(alpha, dtype=np.float64)
    parts = []
    for cols in groups:
        a, b = cols[0][0], cols[-1][1]
        parts.append(client.scatter(np.ascontiguousarray(alpha[:, a:b]), hash=False))

    def sums(Z: np.ndarray, exp: Expansion):
        futs = [client.submit(_store_group_sums, engine.store.path, engine.kernel, cols, Z,
                              exp.weights, part, exp.offset, block, pure=False)
                for cols, part in zip(groups, parts)]
        num = np.zeros_like(Z)
        den = np.zeros(len(Z))
        mag = np.zeros(len(Z))
        for f in futs:  # fixed order: reproducible sums
            n_, d_, m_ = f.result()
            num += n_
            den += d_
            mag += m_
        return num, den, mag

    return sums


# --- the iteration ------------------------------------------------------------------------------


@dataclass
class PreimageResult:
    """Pre-images and how the iteration went.

    Attributes
    ----------
    Z : ndarray (n, d)
        The pre-images.
    converged : ndarray of bool (n,)
        Whether the relative step ``‖Δz‖/‖z‖`` fell below ``tol``.
    undefined : ndarray of bool (n,)
        Samples whose fixed-point step was undefined (``Σ_j γ_j k(z, x_j)`` not clearly
        positive); they keep the last well-defined ``z``.
    iterations : int
        Iterations run (the most any sample needed).
    agreement : ndarray (n,)
        ``⟨PΦ(x), Φ(z)⟩ = Σ_j γ_j k(z, x_j)`` at the last evaluated ``z`` (larger is better:
        ``‖PΦ(x) − Φ(z)‖² = 1 − 2·agreement + ‖PΦ(x)‖²``).
    """

    Z: np.ndarray
    converged: np.ndarray
    undefined: np.ndarray
    iterations: int
    agreement: np.ndarray


def fixed_point(sums: Callable, expansion_: Expansion, start: np.ndarray, *,
                iterations: int | None = None, tol: float | None = None) -> PreimageResult:
    """Mika et al.'s fixed-point iteration, from ``start``, for all rows at once.

    ``sums(Z, expansion)`` returns ``(Σ_j w_j x_j, Σ_j w_j, Σ_j |w_j|)`` with
    ``w_j = γ_j k(z, x_j)`` (:func:`array_sums`, :func:`engine_sums`). Converged samples leave
    the active set, so later iterations cost less.
    """
    iterations = DEFAULT_ITERATIONS if iterations is None else int(iterations)
    tol = DEFAULT_TOL if tol is None else float(tol)
    if iterations < 0:
        raise ParameterError(f"iterations must be non-negative, got {iterations}")
    if not tol > 0:
        raise ParameterError(f"tol must be positive, got {tol}")
    Z = np.array(start, dtype=np.float64, ndmin=2)
    n = len(Z)
    if len(expansion_) != n:
        raise InputError(f"{len(expansion_)} expansions for {n} starting points")
    converged = np.zeros(n, dtype=bool)
    undefined = np.zeros(n, dtype=bool)
    agreement = np.full(n, np.nan)
    active = np.arange(n)
    done = 0
    for it in range(iterations):
        if not len(active):
            break
        done = it + 1
        Za = Z[active]
        num, den, mag = sums(Za, expansion_.take(active))
        agreement[active] = den
        ok = den > DENOMINATOR_FLOOR * np.maximum(mag, np.finfo(float).tiny)
        Znew = Za.copy()
        Znew[ok] = num[ok] / den[ok, None]
        step = np.linalg.norm(Znew - Za, axis=1)
        scale = np.maximum(np.linalg.norm(Za, axis=1), np.sqrt(Z.shape[1]) * 1e-8)
        Z[active] = Znew
        conv = ok & (step <= tol * scale)
        converged[active[conv]] = True
        undefined[active[~ok]] = True
        active = active[ok & ~conv]
        log.debug("fixed point iteration %d: %d active", done, len(active))
    return PreimageResult(Z=Z, converged=converged, undefined=undefined, iterations=done,
                          agreement=agreement)


def preimages(X_train: np.ndarray, kernel: Kernel, alpha: np.ndarray, projections: np.ndarray,
              start: np.ndarray, *, gram: np.ndarray | None = None, iterations: int | None = None,
              tol: float | None = None, block: int | None = None) -> PreimageResult:
    """Fixed-point pre-images of ``PΦ(x)`` for an in-memory training set.

    Parameters
    ----------
    X_train : ndarray (l, d)
        The training samples the components are expanded over.
    kernel : Kernel
        Must be gaussian.
    alpha : ndarray (r, l)
    projections : ndarray (n, r)
        ``β`` of the samples to reconstruct (centered with the training ``mk``, ``mkm``).
    start : ndarray (n, d)
        Starting points; for denoising, the noisy samples themselves.
    gram : ndarray (r, r), optional
        ``A K' Aᵀ``, for the orthogonal projection when the components are not orthonormal.
    iterations, tol, block :
        At most ``iterations`` steps, stopping a sample once ``‖Δz‖ ≤ tol·‖z‖``; ``block``
        training samples per kernel block.

    See Also
    --------
    dkha.apply.denoise.denoise_image : the same on a run directory, on the Dask cluster.
    """
    check_gaussian(kernel)
    exp = expansion(alpha, projections, gram=gram)
    return fixed_point(array_sums(X_train, kernel, alpha, block=block), exp, start,
                       iterations=iterations, tol=tol)
