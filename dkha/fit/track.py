"""Convergence tracked from what the passes already compute: no kernel pass of its own.

The exact evaluation (eq. 22, :mod:`dkha.fit.evaluate`) needs ``E_min``, i.e. the exact top
eigenvalues of ``K'``: as costly as solving the problem exactly, so a fit asks for it only when
told to (``dkha.evaluation: exact``, or a ``tol`` on the excess error). By default each
evaluation is instead *tracked* from ``A`` and ``C = A K'``, which KHA/et and SMD keep anyway
(eq. 18; the other gains need one projection pass):

* ``G = A Cᵀ = A K' Aᵀ`` (the components' Gram matrix in feature space) and
  ``H = C Cᵀ = A K'² Aᵀ`` give the Rayleigh–Ritz values ``θ`` of ``K'`` on the span of the
  components (the pencil ``H x = θ G x``); ``captured = Σ θ_i²`` never exceeds ``Σ λ_i²`` (Cauchy
  interlacing) and reaches it at the exact solution, so ``‖K'‖²_F − captured`` bounds the error
  of the best representation of that span from above and falls as the span improves
  (``E_min² = ‖K'‖²_F − Σ λ_i²``);
* ``change``: the sine of the largest principal angle between the span now and at the previous
  entry, from ``C_now A_prevᵀ`` — how far the last pass(es) moved it.

:func:`tracked` computes both (``O(r² l)``, no kernel entries).
"""

from __future__ import annotations

import numpy as np

#: the history's ``measure`` of a tracked entry
MEASURE = "ritz"


def _orthonormaliser(G: np.ndarray) -> np.ndarray | None:
    """``L⁻¹`` with ``L Lᵀ = G`` (``None`` where ``G`` is not positive definite)."""
    try:
        L = np.linalg.cholesky(0.5 * (G + G.T))
    except np.linalg.LinAlgError:
        return None
    return np.linalg.inv(L)


def ritz_values(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The Rayleigh–Ritz values of ``K'`` on the span of the components ``A`` (``C = A K'``),
    descending (NaN where the components are linearly dependent in feature space)."""
    Li = _orthonormaliser(A @ C.T)
    if Li is None:
        return np.full(A.shape[0], np.nan)
    M = Li @ (C @ C.T) @ Li.T
    return np.linalg.eigvalsh(0.5 * (M + M.T))[::-1].copy()


def tracked(A: np.ndarray, C: np.ndarray, previous: tuple[np.ndarray, np.ndarray] | None = None
            ) -> dict:
    """``{"captured": Σ θ_i², "change": sin of the largest angle to the previous span (NaN
    without one)}`` for the components ``A`` with ``C = A K'`` (module docstring); ``previous``:
    ``(A_prev, L⁻¹_prev)`` as :func:`state_of` returns them."""
    theta = ritz_values(A, C)
    out = {"captured": float(np.sum(theta ** 2)), "change": float("nan")}
    if previous is not None:
        A_prev, Li_prev = previous
        Li = _orthonormaliser(A @ C.T)
        if Li is not None and Li_prev is not None:
            cos = np.linalg.svd(Li @ (C @ A_prev.T) @ Li_prev.T, compute_uv=False)
            out["change"] = float(np.sqrt(max(0.0, 1.0 - float(np.min(cos)) ** 2)))
    return out


def state_of(A: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """What :func:`tracked` needs of this entry to measure the next one's ``change``."""
    return np.array(A, copy=True), _orthonormaliser(A @ C.T)
