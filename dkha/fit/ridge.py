"""The learned pre-image's kernel ridge regression (Bakır, Weston & Schölkopf 2004; scikit-learn's
``fit_inverse_transform=True``): ``dual_coef = (k(P, P) + alpha I)⁻¹ X``, from the ``l × r``
training projections ``P`` back to the ``l × n`` inputs ``X``.

Up to ``dkha.dense-eigh-limit`` samples the ``l × l`` system is formed and solved by Cholesky
(exact, and cheapest there). Above, by conjugate gradients (:func:`dkha.solvers.ridge.ridge_cg`)
on the ``n`` columns of ``X`` together, each product ``k(P, P) V`` one blockwise pass on the
workers (:func:`dkha.engine.rows.array_engine`: the fit's tile pass, uncentered): memory
``O(l·(r + n))`` on the coordinator, never ``l × l``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dkha.config import Settings
from dkha.engine.cluster import client_for
from dkha.engine.rows import array_engine
from dkha.kernels import Kernel
from dkha.solvers.ridge import ridge_cg

#: the most conjugate-gradient iterations (products) of one solve
RIDGE_MAXITER = 1000


@dataclass
class RidgeFit:
    """The dual coefficients and how they were found: ``method`` (``"dense"`` or ``"cg"``),
    the products ``k(P, P) V`` taken (0 dense), the largest relative residual and seconds."""

    dual_coef: np.ndarray
    method: str
    iterations: int
    residual: float
    seconds: float


def learned_preimage(P: np.ndarray, X: np.ndarray, kernel: Kernel, alpha: float, client,
                     settings: Settings, *, tol: float | None = None,
                     dense_limit: int | None = None) -> RidgeFit:
    """``(k(P, P) + alpha I)⁻¹ X``: dense up to ``dense_limit`` samples (default
    ``dkha.dense-eigh-limit`` of ``settings``), by conjugate gradients above with relative
    residual ``tol`` (default ``dkha.ridge-tol``). ``client``: where to compute above the limit
    (any ``client=`` value: :func:`dkha.engine.cluster.client_for`). Raises ``ValueError`` when
    CG does not reach ``tol`` within :data:`RIDGE_MAXITER` products or ``alpha`` is not positive
    there."""
    from scipy import linalg

    t0 = time.perf_counter()
    l = len(P)
    limit = int(settings.dense_eigh_limit if dense_limit is None else dense_limit)
    if l <= limit:
        K = kernel.block(P, P)
        K.flat[::l + 1] += alpha
        C = linalg.solve(K, X, assume_a="pos", overwrite_a=True)
        return RidgeFit(C, "dense", 0, 0.0, time.perf_counter() - t0)
    if not alpha > 0:
        raise ValueError(f"alpha must be positive for the learned pre-image above "
                         f"dkha.dense-eigh-limit ({limit}) samples, got {alpha}")
    tol = float(settings.ridge_tol if tol is None else tol)
    with client_for(client, settings=settings) as c:
        engine = array_engine(P, kernel, c, settings)
        with engine.labelled("learned pre-image (k(P, P) V)"):
            sol = ridge_cg(lambda V: engine.matmat(V, exact=True), X, alpha, tol=tol,
                           maxiter=RIDGE_MAXITER)
    if not sol.converged:
        raise ValueError(f"the learned pre-image's conjugate gradients reached a relative "
                         f"residual of {sol.residual:.2g}, not dkha.ridge-tol ({tol:g}), in "
                         f"{sol.iterations} products; raise alpha")
    return RidgeFit(sol.C, "cg", sol.iterations, sol.residual, time.perf_counter() - t0)
