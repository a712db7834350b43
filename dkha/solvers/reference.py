"""The straightforward per-step form of the batch KHA family (coordinator-math.md §2).

Each step costs ``O(r² l)``. This is the oracle the fast engines are tested against; it is also
readable documentation of the updates. With ``y = A k'_p``, ``L = lt(y yᵀ)`` and gains ``d``:

* KHA, KHA/t, KHA/et (eq. 8/11): ``A ← A + D (y e_pᵀ − L A)``; ``C = A K'`` kept by eq. 18
  when the gains need eigenvalues (KHA/et).
* KHA-SMD (Algorithm 1; eqs. 16, 21, 15, 18 in that order), ``z = B k'_p``, ``d = e^ρ ⊙ η``,
  with SMD's safeguard on eq. 16: ``ρ ← ρ + max(μ (…), log ½)``, so that a step multiplies each
  gain by at least ½.

:func:`guard` is the per-step definition of a bad step (non-finite values, runaway growth) that
the compiled loops (:mod:`dkha.solvers.block_loops`) also apply.
"""

from __future__ import annotations

import numpy as np

from dkha.solvers.compiled import LOG_HALF, RUNAWAY


def step(A: np.ndarray, p: int, kp: np.ndarray, d: np.ndarray,
         C: np.ndarray | None = None) -> np.ndarray:
    """One KHA step (eq. 11) in place; also eq. 18 on ``C`` when given. Returns ``y``."""
    y = A @ kp
    L = np.tril(np.outer(y, y))
    if C is not None:
        C -= d[:, None] * (L @ C)
        C += np.outer(d * y, kp)
    A -= d[:, None] * (L @ A)
    A[:, p] += d * y
    return y


def smd_step(A: np.ndarray, B: np.ndarray, C: np.ndarray, rho: np.ndarray, p: int, kp: np.ndarray,
             eta: np.ndarray, mu: float, xi: float) -> np.ndarray:
    """One KHA-SMD step (eqs. 16, 21, 15, 18) in place on ``A, B, C, rho``. Returns the gains."""
    y = A @ kp
    z = B @ kp
    L = np.tril(np.outer(y, y))
    # eq. 16 with eq. 17: diag(Γ K' Bᵀ) = y ⊙ z − diag(L C Bᵀ)
    CBt = C @ B.T
    rho += np.maximum(mu * (y * z - np.einsum("ij,ji->i", L, CBt)), LOG_HALF)
    d = np.exp(rho) * eta
    Lz = np.tril(np.outer(z, y) + np.outer(y, z))
    # eq. 21 (with the new rho), from the pre-update A and B
    Bn = xi * B - d[:, None] * (L @ (A + xi * B) + xi * (Lz @ A))
    Bn[:, p] += d * (y + xi * z)
    # eq. 15
    A -= d[:, None] * (L @ A)
    A[:, p] += d * y
    # eq. 18
    C -= d[:, None] * (L @ C)
    C += np.outer(d * y, kp)
    B[...] = Bn
    return d


def guard(y: np.ndarray, y_after: np.ndarray, kappa: float, gains: np.ndarray,
          rho: np.ndarray | None = None, z: np.ndarray | None = None,
          state=()) -> tuple[str, int] | None:
    """What makes a step bad, or ``None``: ``(quantity, component)``.

    ``y = A k'_p`` before the step and ``y_after = A' k'_p`` after it, ``kappa = K'[p, p]``, the
    step's ``gains``; for SMD the new log-gains ``rho`` and ``z = B k'_p``; ``state`` the arrays
    the step produced (``(name, array)`` pairs). Bad: a non-finite value; ``|y_i| > RUNAWAY √κ``
    before or after the step (then ``‖w_i‖ ≥ |y_i| / √κ > RUNAWAY``: KHA's components converge
    to unit norm); a gain factor ``e^{ρ_i} > RUNAWAY``. The checks run in this order.
    """
    smd = rho is not None
    if not smd and not np.isfinite(gains).all():
        return "gain", int(np.flatnonzero(~np.isfinite(gains))[0])
    bad = _projection(y, kappa)
    if bad is not None:
        return bad
    if smd:
        for i in range(len(y)):
            if not np.isfinite(z[i]):
                return "B", i
            if not (np.isfinite(rho[i]) and np.isfinite(gains[i])):
                return "gain", i
            if rho[i] > np.log(RUNAWAY):
                return "gain runaway", i
    bad = _projection(y_after, kappa)
    if bad is not None:
        return bad
    for name, arr in state:
        if not np.isfinite(arr).all():
            return name, -1
    return None


def _projection(y, kappa):
    for i, v in enumerate(y):
        if not np.isfinite(v):
            return "A", i
        if kappa > 0 and v * v > RUNAWAY * RUNAWAY * kappa:
            return "A runaway", i
    return None
