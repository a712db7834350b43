"""Kernel ridge systems ``(K + alpha I) C = B`` by conjugate gradients on matrix products.

``K`` is symmetric positive semi-definite and ``alpha > 0``, so ``K + alpha I`` is symmetric
positive definite with smallest eigenvalue at least ``alpha``: conjugate gradients converge.
``K`` is seen only through ``matmat(V) = K V`` (``l × m`` in, ``l × m`` out), so the caller
decides where the product runs (blockwise on the workers: :mod:`dkha.fit.ridge`). The ``n``
right-hand sides (the columns of ``B``) are solved together: each column keeps its own CG
scalars, and one product per iteration serves every column not yet converged (converged columns
leave the product, so late iterations cost less).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class RidgeSolution:
    """The solution ``C`` (``l × n``), the iterations (products with ``K``) it took, the largest
    relative residual ``‖(K + alpha I) c_j − b_j‖ / ‖b_j‖`` over the columns, and whether every
    column reached the tolerance."""

    C: np.ndarray
    iterations: int
    residual: float
    converged: bool


def ridge_cg(matmat: Callable[[np.ndarray], np.ndarray], B: np.ndarray, alpha: float, *,
             tol: float = 1e-8, maxiter: int = 1000) -> RidgeSolution:
    """Solve ``(K + alpha I) C = B`` for every column of ``B`` by conjugate gradients from
    ``C = 0``, stopping each column when its relative residual is at most ``tol`` (a zero
    column is solved by zero). ``matmat(V)`` must return ``K V``."""
    if not alpha > 0:
        raise ValueError(f"the ridge alpha must be positive for conjugate gradients, got {alpha}")
    B = np.asarray(B, dtype=np.float64)
    vector = B.ndim == 1
    if vector:
        B = B[:, None]
    C = np.zeros_like(B)
    R = B.copy()
    norm_b = np.linalg.norm(B, axis=0)
    target = tol * norm_b
    rr = np.einsum("ij,ij->j", R, R)
    active = np.flatnonzero(np.sqrt(rr) > target)
    D = R.copy()
    it = 0
    while active.size and it < maxiter:
        Da = D[:, active]
        Q = matmat(Da) + alpha * Da
        it += 1
        step = rr[active] / np.einsum("ij,ij->j", Da, Q)
        C[:, active] += Da * step
        R[:, active] -= Q * step
        rr_new = np.einsum("ij,ij->j", R[:, active], R[:, active])
        D[:, active] = R[:, active] + D[:, active] * (rr_new / rr[active])
        rr[active] = rr_new
        active = active[np.sqrt(rr_new) > target[active]]
    scale = np.where(norm_b > 0, norm_b, 1.0)
    residual = float(np.max(np.sqrt(rr) / scale)) if B.shape[1] else 0.0
    return RidgeSolution(C[:, 0] if vector else C, it, residual, not active.size)
