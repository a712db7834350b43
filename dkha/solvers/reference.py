"""What makes a step of the batch KHA family bad, per step: :func:`guard`.

The per-step forms of the updates (``O(r² l)`` each, coordinator-math.md §2: the oracle the
fast engines are tested against, and readable documentation of the updates) live with their
updates (:func:`dkha.solvers.updates.gha.per_step`, :func:`dkha.solvers.updates.smd.per_step`)
and run on the reference engine (:mod:`dkha.solvers.batch`); :func:`guard` is their definition
of a bad step (non-finite values, runaway growth), which the compiled block loops apply too.
"""

from __future__ import annotations

import numpy as np

from dkha.solvers.compiled import RUNAWAY


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
