"""Pre-images: points of input space whose image approximates a point of feature space.

Denoising by kernel PCA projects a sample's image onto the leading components and asks for the
input-space point ``z`` whose image is closest to that projection (Mika et al. 1999, Kim et al.
2005). This module is the one home of pre-image methods (:data:`METHODS`):

* ``fixed-point`` — Mika et al.'s iteration (gaussian kernel; the default for it);
* ``conformal`` — Honeine's conformal-map linear solve (§5.3 of Honeine 2012, any kernel);
* ``gradient`` — ascent on ``⟨PΦ(x), Φ(z)⟩`` (Honeine §5.3, gaussian kernel), with the
  non-negativity option of Kallas et al. (steps weighted by ``z``, iterates kept ≥ 0).

All of them see the training set through the same two blockwise reductions, so they run alike on
an in-memory array, a dictionary, or a data store on the cluster (:class:`Training`).

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

Dictionary (online) runs
------------------------
For a run over a dictionary ``D`` (``m`` members) the components are ``w_i = Σ_q A[i, q] Φ(d_q)``
and the projection ``y = A (k(D, x) − K_m β̄)`` is relative to the running mean
``μ = Σ_q β̄_q Φ(d_q)``; eq. 22 of Honeine gives ``PΦ(x) + μ = Σ_q (β̃ᵀA + β̄ᵀ)_q Φ(d_q)``, with
``β̃ = G⁻¹ y``, ``G = A K_m Aᵀ`` (cheap: ``m × m``). dkha writes it in the same factored form by
appending ``β̄`` as one more row of ``A`` with weight 1 and no offset (:func:`dictionary_expansion`).

The gradient iteration (gaussian kernel)
----------------------------------------
``∇f(z) = (1/σ²) Σ_j γ_j k(z, x_j)(x_j − z) = (num − den·z)/σ²`` with the fixed-point sums. Each
iteration evaluates ``f`` and ``∇f`` at the candidate points ``z + s·d`` in one blockwise pass,
``d = ∇f`` (or ``z ⊙ ∇f`` and the candidate clipped at 0 with ``nonnegative``); a candidate that
does not raise ``f`` (Armijo, ``c = 1e-4``) is refused and the sample's step ``s`` shrinks 4×, an
accepted one lets it grow 2×. ``s`` starts at ``σ²`` (``s∇f`` is then the weighted mean
displacement ``num − den·z``). With a fixed ``step`` there is no line search: ``z ← z + step·d``
(Honeine's experiments: step 100 weighted by ``z``, a single iteration). Stops when the accepted
step is below ``tol·‖z‖``, or the step size below ``tol²·σ²``.

The conformal map (any kernel)
------------------------------
Honeine & Richard's conformal map preserves inner products between input and feature space; for
``PΦ(x) = Σ_j γ_j Φ(x_j)`` it gives the linear system (Honeine 2012, §5.3)::

    X_mᵀ z = (P_m − η K_m⁻¹) γ,      P_m = X_mᵀ X_m

solved in the least-squares sense: ``z = X_m γ − η (X_mᵀ)⁺ K_m⁻¹ γ``. With ``η = 0`` this is
``Σ_j γ_j x_j``, which needs only ``A X`` and ``Σ_j x_j`` (one blockwise pass over a store, then
a product per sample); ``η > 0`` needs ``K_m⁻¹``, so the samples in memory (dictionaries).
No iteration: it is rough where the projection is far from the data (the paper's "roughly").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dkha import config
from dkha.engine.cluster import client_for
from dkha.engine.tasks import group_rows, load_rows
from dkha.errors import InputError, ParameterError
from dkha.fit.evaluate import projections
from dkha.kernels import Kernel
from dkha.runs.run import as_run
from dkha.runs.transform import project_dictionary

log = logging.getLogger(__name__)

DEFAULT_ITERATIONS = 50
DEFAULT_TOL = 1e-5
DEFAULT_BLOCK = 4096  # training samples per block of kernel values
# |Σ γ k| below this fraction of Σ |γ k| makes the fixed-point step undefined
DENOMINATOR_FLOOR = 1e-8
METHODS = ("fixed-point", "conformal", "gradient")
#: why the conformal map's η > 0 is refused where the samples are a store's (batch runs)
ETA_NEEDS_SAMPLES = ("the conformal map with --eta > 0 needs K_m⁻¹ of the samples the components "
                     "are expanded over: available for dictionary (online) runs; use --eta 0 for "
                     "batch runs")
ARMIJO = 1e-4


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

    def take(self, index) -> Expansion:
        return Expansion(self.weights[index], self.offset[index])


def expansion(alpha: np.ndarray, projections: np.ndarray, *, gram: np.ndarray | None = None
              ) -> Expansion:
    """The expansion coefficients of ``PΦ(x) = Σ_j γ_j Φ(x_j)`` (module docstring).

    Parameters
    ----------
    alpha : ndarray (r, l)
        The coefficients of the components over the centered training samples.
    projections : ndarray (n, r)
        ``β``: the samples' projections on the components (``dkha.runs.transform.project``).
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


def dictionary_expansion(alpha: np.ndarray, mean_coefficient: np.ndarray, projections: np.ndarray,
                         kernel_matrix: np.ndarray) -> tuple[Expansion, np.ndarray]:
    """The expansion of ``PΦ(x) + μ`` over a dictionary (Honeine eq. 22), and the extended
    coefficients it is over: ``γ = β̃ᵀA + β̄ᵀ`` as ``[β̃, 1] · [A; β̄ᵀ]`` with no offset.

    ``β̃ = G⁻¹ y`` with ``G = A K_m Aᵀ``: the orthogonal projection whatever the components' norms.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    y = np.atleast_2d(np.asarray(projections, dtype=np.float64))
    if y.shape[1] != alpha.shape[0]:
        raise InputError(f"projections of shape {y.shape} do not match "
                         f"{alpha.shape[0]} components")
    gram = alpha @ kernel_matrix @ alpha.T
    beta = np.linalg.lstsq(gram, y.T, rcond=None)[0].T
    weights = np.hstack([beta, np.ones((len(beta), 1))])
    extended = np.vstack([alpha, np.asarray(mean_coefficient, dtype=np.float64)[None, :]])
    return Expansion(np.ascontiguousarray(weights), np.zeros(len(beta))), extended


def default_method(kernel: Kernel) -> str:
    """``fixed-point`` for a gaussian kernel (:meth:`~dkha.kernels.Kernel.gaussian_sigma`),
    ``conformal`` (the one that applies) otherwise."""
    return "fixed-point" if kernel.gaussian_sigma() is not None else "conformal"


def check_method(method: str | None, kernel: Kernel) -> str:
    """The pre-image method to use (``None``: :func:`default_method`); a one-line
    :class:`ParameterError` where it does not apply to ``kernel``."""
    if method is None:
        return default_method(kernel)
    if method not in METHODS:
        raise ParameterError(f"unknown pre-image method {method!r}; choose one of "
                             f"{', '.join(METHODS)}")
    if method in ("fixed-point", "gradient") and kernel.gaussian_sigma() is None:
        what = ("the fixed-point pre-image (Mika et al.)" if method == "fixed-point"
                else "the gradient pre-image (Honeine §5.3)")
        raise ParameterError(f"{what} needs a gaussian kernel; this run used {kernel.describe()}. "
                             "Use --preimage conformal, or fit with --kernel gaussian.")
    return method


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


def _add_up(parts) -> tuple:
    """Tuples of arrays (each group's or block's share of a reduction) added element by
    element from zeros, in their order: sums of the same bits on every run."""
    totals = None
    for part in parts:
        if totals is None:
            totals = tuple(np.zeros(np.shape(p)) for p in part)
        for total, p in zip(totals, part):
            total += p
    return totals


def _store_group_sums(path: str, kernel: Kernel, cols: tuple, Z: np.ndarray, weights: np.ndarray,
                      alpha_group: np.ndarray, offset: np.ndarray, block: int):
    """Worker task: the sums over one column group of a data store (chunk ranges ``cols``)."""
    a0 = cols[0][0]

    def blocks():
        for a, b in cols:
            X = load_rows(path, a, b)
            for s in range(a, b, block):
                e = min(s + block, b)
                yield fixed_point_sums(Z, X[s - a:e - a], kernel, weights,
                                       alpha_group[:, s - a0:e - a0], offset)

    return _add_up(blocks())


def _store_group_moments(path: str, cols: tuple, alpha_group: np.ndarray):
    """Worker task: ``A[:, J] X[J]`` and ``Σ_{j∈J} x_j`` over one column group of a store."""
    X = group_rows(path, cols)
    return alpha_group @ X, X.sum(axis=0)


@dataclass
class Training:
    """The training samples a pre-image expansion is over, seen through blockwise reductions.

    Attributes
    ----------
    kernel : Kernel
    alpha : ndarray (r, l)
        The coefficients the expansions' weights multiply (extended by ``β̄`` for dictionaries).
    sums : callable
        ``sums(Z, expansion) → (Σ_j w_j x_j, Σ_j w_j, Σ_j |w_j|)``, ``w_j = γ_j k(z, x_j)``.
    moments : callable
        ``moments() → (A X, Σ_j x_j)`` (computed once, on first use).
    samples : ndarray (l, d) or None
        The samples themselves when they are in memory (dictionaries, small problems): the
        conformal map's ``η`` term needs them.
    """

    kernel: Kernel
    alpha: np.ndarray
    sums: Callable
    moments: Callable
    samples: np.ndarray | None = None

    @classmethod
    def from_array(cls, X: np.ndarray, kernel: Kernel, alpha: np.ndarray, *,
                   block: int | None = None) -> Training:
        """An in-memory training set, ``block`` samples at a time."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        alpha = np.ascontiguousarray(alpha, dtype=np.float64)
        block = DEFAULT_BLOCK if block is None else int(block)

        def sums(Z: np.ndarray, exp: Expansion):
            return _add_up(fixed_point_sums(Z, X[a:a + block], kernel, exp.weights,
                                            alpha[:, a:a + block], exp.offset)
                           for a in range(0, len(X), block))

        return cls(kernel, alpha, sums, functools.cache(lambda: (alpha @ X, X.sum(axis=0))), X)

    @classmethod
    def from_engine(cls, engine, alpha: np.ndarray, *, block: int | None = None) -> Training:
        """A :class:`~dkha.engine.rows.RowEngine`'s store on the cluster: each reduction is one
        task per column group (the workers read their chunks from the store and keep them
        cached)."""
        alpha = np.ascontiguousarray(alpha, dtype=np.float64)
        client, groups = engine.client, engine.column_groups
        parts = [client.scatter(np.ascontiguousarray(alpha[:, cols[0][0]:cols[-1][1]]),
                                hash=False) for cols in groups]

        def run(task, args: list, what: str):
            return engine.passes.results([client.submit(task, *a, pure=False) for a in args],
                                         what)

        return cls._over_groups(engine.source, engine.kernel, groups, alpha, parts, run, block)

    @classmethod
    def from_chunks(cls, path: str, kernel: Kernel, groups: tuple, alpha: np.ndarray, *,
                    block: int | None = None) -> Training:
        """A data store read inside one task (chunks from the per-process cache): the reductions
        run here, group after group, for tasks that pre-image a whole block of samples."""
        parts = [alpha[:, cols[0][0]:cols[-1][1]] for cols in groups]
        return cls._over_groups(path, kernel, groups, alpha, parts,
                                lambda task, args, what: (task(*a) for a in args), block)

    @classmethod
    def _over_groups(cls, path: str, kernel: Kernel, groups: tuple, alpha: np.ndarray,
                     parts: list, run: Callable, block: int | None) -> Training:
        """The reductions over the column groups ``groups`` of the store at ``path``: one task
        per group (``parts``: its columns of ``alpha``), the results as ``run(task, the tasks'
        arguments, what)`` yields them, in the groups' order."""
        block = DEFAULT_BLOCK if block is None else int(block)

        def sums(Z: np.ndarray, exp: Expansion):
            return _add_up(run(_store_group_sums, [
                (path, kernel, cols, Z, exp.weights, part, exp.offset, block)
                for cols, part in zip(groups, parts)], "a pre-image iteration's sums"))

        def moments():
            return _add_up(run(_store_group_moments, [(path, cols, part) for cols, part
                                                      in zip(groups, parts)],
                               "the pre-images' moments"))

        return cls(kernel, alpha, sums, functools.cache(moments))


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
    ``w_j = γ_j k(z, x_j)`` (:attr:`Training.sums`). Converged samples leave
    the active set, so later iterations cost less.
    """
    Z, iterations, tol = _start(start, expansion_, iterations, tol)
    n = len(Z)
    converged = np.zeros(n, dtype=bool)
    undefined = np.zeros(n, dtype=bool)
    agreement = np.full(n, np.nan)
    rounds = _ActiveRounds(n)
    for active in rounds.run(iterations):
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
        rounds.active = active[ok & ~conv]
        log.debug("fixed point iteration %d: %d active", rounds.done, len(rounds.active))
    return PreimageResult(Z=Z, converged=converged, undefined=undefined, iterations=rounds.done,
                          agreement=agreement)


class _ActiveRounds:
    """The rounds of an iteration over the rows still active: ``run`` yields the active rows'
    indices each round (the loop body sets ``active`` to those that go on) until none is left
    or ``iterations`` rounds are done; ``done`` counts the rounds run."""

    def __init__(self, n: int):
        self.active = np.arange(n)
        self.done = 0

    def run(self, iterations: int):
        for it in range(iterations):
            if not len(self.active):
                return
            self.done = it + 1
            yield self.active


def _start(start, expansion_: Expansion, iterations, tol) -> tuple[np.ndarray, int, float]:
    """An iteration's starting points (a new array), iterations and tolerance, checked."""
    iterations = DEFAULT_ITERATIONS if iterations is None else int(iterations)
    tol = DEFAULT_TOL if tol is None else float(tol)
    if iterations < 0:
        raise ParameterError(f"iterations must be non-negative, got {iterations}")
    if not tol > 0:
        raise ParameterError(f"tol must be positive, got {tol}")
    Z = np.array(start, dtype=np.float64, ndmin=2)
    if len(expansion_) != len(Z):
        raise InputError(f"{len(expansion_)} expansions for {len(Z)} starting points")
    return Z, iterations, tol


def gradient(sums: Callable, expansion_: Expansion, start: np.ndarray, sigma: float, *,
             iterations: int | None = None, tol: float | None = None, step: float | None = None,
             nonnegative: bool = False) -> PreimageResult:
    """Gradient ascent on ``f(z) = ⟨PΦ(x), Φ(z)⟩`` (gaussian kernel of width ``sigma``), for all
    rows at once (module docstring: line search, ``step``, ``nonnegative``)."""
    Z, iterations, tol = _start(start, expansion_, iterations, tol)
    if step is not None and not float(step) > 0:
        raise ParameterError(f"step must be positive, got {step}")
    s2 = float(sigma) ** 2
    if nonnegative:
        np.maximum(Z, 0.0, out=Z)
    n, dim = Z.shape
    num, f, _ = sums(Z, expansion_)
    G = (num - f[:, None] * Z) / s2
    s = np.full(n, s2 if step is None else float(step))
    converged = np.zeros(n, dtype=bool)
    rounds = _ActiveRounds(n)
    for active in rounds.run(iterations):
        Za, Ga = Z[active], G[active]
        D = Za * Ga if nonnegative else Ga
        C = Za + s[active, None] * D
        if nonnegative:
            np.maximum(C, 0.0, out=C)
        num_c, f_c, _ = sums(C, expansion_.take(active))
        if step is None:
            ok = f_c >= f[active] + ARMIJO * np.einsum("ij,ij->i", Ga, C - Za)
        else:
            ok = np.ones(len(active), dtype=bool)
        move = np.linalg.norm(C - Za, axis=1)
        scale = np.maximum(np.linalg.norm(Za, axis=1), np.sqrt(dim) * 1e-8)
        acc = active[ok]
        Z[acc], f[acc] = C[ok], f_c[ok]
        G[acc] = (num_c[ok] - f_c[ok, None] * C[ok]) / s2
        if step is None:
            s[acc] *= 2.0
            s[active[~ok]] /= 4.0
        conv = (ok & (move <= tol * scale)) | (s[active] <= tol * tol * s2)
        converged[active[conv]] = True
        rounds.active = active[~conv]
        log.debug("gradient iteration %d: %d active", rounds.done, len(rounds.active))
    return PreimageResult(Z=Z, converged=converged, undefined=np.zeros(n, dtype=bool),
                          iterations=rounds.done, agreement=f)


def conformal(training: Training, expansion_: Expansion, *, eta: float = 0.0) -> PreimageResult:
    """Honeine's conformal-map pre-images ``z = X_m γ − η (X_mᵀ)⁺ K_m⁻¹ γ`` (module docstring).

    ``agreement`` is NaN: nothing here evaluates ``⟨PΦ(x), Φ(z)⟩``.
    """
    eta = float(eta)
    if not (np.isfinite(eta) and eta >= 0):
        raise ParameterError(f"eta must be a non-negative number, got {eta}")
    M, total = training.moments()
    Z = expansion_.weights @ M + expansion_.offset[:, None] * total[None, :]
    if eta:
        X = training.samples
        if X is None:
            raise ParameterError(ETA_NEEDS_SAMPLES)
        K = training.kernel.block(X, X)
        gamma = expansion_.dense(training.alpha)
        W = np.linalg.solve(K, gamma.T)                    # K_m⁻¹ γ, m × n
        Z -= eta * np.linalg.lstsq(X, W, rcond=None)[0].T   # X is X_mᵀ (m × d)
    n = len(Z)
    return PreimageResult(Z=Z, converged=np.ones(n, dtype=bool), undefined=np.zeros(n, dtype=bool),
                          iterations=0, agreement=np.full(n, np.nan))


def check_options(method: str | None, kernel: Kernel, *, eta: float | None = None,
                  step: float | None = None, nonnegative: bool = False, batch: bool = False) -> str:
    """:func:`check_method`, and refuse options that belong to another method, and ``eta > 0``
    for a ``batch`` run (:data:`ETA_NEEDS_SAMPLES`)."""
    method = check_method(method, kernel)
    if eta is not None and method != "conformal":
        raise ParameterError(f"--eta applies to the conformal pre-image, not {method}")
    if (step is not None or nonnegative) and method != "gradient":
        raise ParameterError(f"--step and --nonnegative apply to the gradient pre-image, "
                             f"not {method}")
    if batch and eta is not None and float(eta) > 0:
        raise ParameterError(ETA_NEEDS_SAMPLES)
    return method


def solve(method: str | None, training: Training, expansion_: Expansion, start: np.ndarray, *,
          iterations: int | None = None, tol: float | None = None, eta: float | None = None,
          step: float | None = None, nonnegative: bool = False) -> PreimageResult:
    """Pre-images by ``method`` (:data:`METHODS`; ``None``: the kernel's default).

    ``start`` seeds the iterative methods (for denoising, the noisy samples); ``eta`` is the
    conformal map's regularisation; ``step`` and ``nonnegative`` are the gradient method's.
    Options that do not belong to the method are refused.
    """
    method = check_options(method, training.kernel, eta=eta, step=step, nonnegative=nonnegative)
    if method == "conformal":
        return conformal(training, expansion_, eta=0.0 if eta is None else eta)
    if method == "gradient":
        return gradient(training.sums, expansion_, start, training.kernel.gaussian_sigma(),
                        iterations=iterations, tol=tol, step=step, nonnegative=nonnegative)
    return fixed_point(training.sums, expansion_, start, iterations=iterations, tol=tol)


def preimages(X_train: np.ndarray, kernel: Kernel, alpha: np.ndarray, projections: np.ndarray,
              start: np.ndarray, *, method: str | None = None, gram: np.ndarray | None = None,
              iterations: int | None = None, tol: float | None = None, eta: float | None = None,
              step: float | None = None, nonnegative: bool = False, block: int | None = None
              ) -> PreimageResult:
    """Pre-images of ``PΦ(x)`` for an in-memory training set.

    Parameters
    ----------
    X_train : ndarray (l, d)
        The training samples the components are expanded over.
    kernel : Kernel
    alpha : ndarray (r, l)
    projections : ndarray (n, r)
        ``β`` of the samples to reconstruct (centered with the training ``mk``, ``mkm``).
    start : ndarray (n, d)
        Starting points of the iterative methods; for denoising, the noisy samples themselves.
    method : {"fixed-point", "conformal", "gradient"}, optional
        Default: fixed-point for the gaussian kernel, conformal otherwise.
    gram : ndarray (r, r), optional
        ``A K' Aᵀ``, for the orthogonal projection when the components are not orthonormal.
    iterations, tol, block :
        At most ``iterations`` steps, stopping a sample once ``‖Δz‖ ≤ tol·‖z‖``; ``block``
        training samples per kernel block.
    eta, step, nonnegative :
        The conformal map's regularisation; the gradient method's fixed step and
        non-negativity.

    See Also
    --------
    dkha.apply.denoise.denoise_image : the same on a run directory, on the Dask cluster.
    """
    training = Training.from_array(X_train, kernel, alpha, block=block)
    return solve(method, training, expansion(alpha, projections, gram=gram), start,
                 iterations=iterations, tol=tol, eta=eta, step=step, nonnegative=nonnegative)


class RunPreimages:
    """Project samples on a run's components and map the projections back to input space: the
    step that denoising (images, vectors) and hyperresolution share.

    Batch runs: projections and the pre-image reductions run on the cluster against the
    training store (:class:`Training.from_engine`). Dictionary (online) runs: the dictionary is
    in memory and the projection is Honeine's eq. 22 (:func:`dictionary_expansion`).

    Parameters
    ----------
    ds : xarray.Dataset
        The run's components (:func:`dkha.data.result.load`).
    client : distributed.Client
    method : {"fixed-point", "conformal", "gradient"}, optional
        Default: fixed-point for a gaussian kernel, conformal otherwise.
    orthonormalize : bool
        Batch runs: project with the Gram matrix ``A K' Aᵀ`` (one more pass). Dictionary runs
        always do (``A K_m Aᵀ`` is small).
    iterations, tol, eta, step, nonnegative :
        As :func:`solve`; options of another method are refused here, before any work.
    """

    def __init__(self, ds, client, *, method: str | None = None, orthonormalize: bool = False,
                 iterations: int | None = None, tol: float | None = None,
                 eta: float | None = None, step: float | None = None, nonnegative: bool = False):
        run = as_run(ds)
        kernel = run.kernel
        self.method = check_options(method, kernel, eta=eta, step=step, nonnegative=nonnegative,
                                    batch=not run.is_dictionary)
        self.options = {"iterations": iterations, "tol": tol, "eta": eta, "step": step,
                        "nonnegative": nonnegative}
        alpha = run.alpha
        if run.is_dictionary:
            D = np.ascontiguousarray(ds["dictionary"].values, dtype=np.float64)
            mean = ds["mean_coefficient"].values
            Km = kernel.block(D, D)
            small = run.dictionary_part()
            extended = dictionary_expansion(alpha, mean, np.zeros((1, len(alpha))), Km)[1]
            self.project = lambda P: project_dictionary(small, P)
            self.expand = lambda y: dictionary_expansion(alpha, mean, y, Km)[0]
            self.training = Training.from_array(D, kernel, extended)
        else:
            engine = run.engine(client)
            gram = projections(engine, alpha) @ alpha.T if orthonormalize else None
            self.project = lambda P: engine.transform(P, alpha)
            self.expand = lambda y: expansion(alpha, y, gram=gram)
            self.training = Training.from_engine(engine, alpha)

    def __call__(self, P: np.ndarray, start: np.ndarray | None = None) -> PreimageResult:
        """Pre-images of the projections of the rows of ``P`` (started from ``start``, default
        ``P`` itself)."""
        P = np.ascontiguousarray(P, dtype=np.float64)
        return self.from_projections(self.project(P), P if start is None else start)

    def from_projections(self, y: np.ndarray, start: np.ndarray) -> PreimageResult:
        """Pre-images of the points whose projections on the components are the rows of ``y``
        (e.g. ``t·e_i``: the point ``t`` along component ``i`` from the mean), from ``start``."""
        return solve(self.method, self.training, self.expand(np.atleast_2d(y)), start,
                     **self.options)


def run_preimages(ds, y: np.ndarray, start: np.ndarray, *, client=None) -> np.ndarray:
    """:meth:`RunPreimages.from_projections` of a saved run's dataset, on the workers that
    ``client`` names (:func:`dkha.engine.cluster.client_for`): the pre-images ``Z``."""
    with client_for(client, settings=config.settings()) as c:
        return RunPreimages(ds, c).from_projections(y, start).Z
