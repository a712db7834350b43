"""Blockwise evaluation: reconstruction error E(A) (eq. 22), E_min, excess error, eigenvalues.

With ``C = A K'`` (one blockwise pass, ``K' Aᵀ``)::

    E(A)² = Σ over row blocks I of ‖K'[I, :] − C[:, I]ᵀ C‖²_F     (direct form, second pass)
    E_min² = ‖K'‖²_F − Σ_{i≤r} λ_i(K')²

``λ_1..λ_r`` come from dense ``eigh`` for small stores (``dkha.dense-eigh-limit``) and from a
block Krylov method (LOBPCG) whose products ``K' V`` are blockwise passes otherwise: ``K'`` is
never held whole above that limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from dkha import config

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """Reconstruction errors of one coefficient matrix."""

    error: float
    error_min: float
    excess: float
    frobenius: float

    def as_dict(self) -> dict:
        return {"error": self.error, "error_min": self.error_min, "excess": self.excess,
                "frobenius": self.frobenius}


def top_eigenvalues(engine, r: int, *, seed: int = 0, dense_limit: int | None = None,
                    tol: float = 1e-11, maxiter: int = 500) -> np.ndarray:
    """The ``r`` largest eigenvalues of ``K'`` (descending)."""
    l = engine.n_samples
    limit = int(config.get("dense-eigh-limit", dense_limit))
    if l <= limit:
        Kc = engine.dense()
        w = np.linalg.eigvalsh(Kc)
        return w[::-1][:r].copy()
    return krylov_eigenpairs(engine, r, seed=seed, tol=tol, maxiter=maxiter)[0]


def krylov_eigenpairs(engine, r: int, *, seed: int = 0, tol: float = 1e-8, maxiter: int = 300,
                      oversample: int | None = None, X0: np.ndarray | None = None):
    """Top-``r`` eigenpairs of ``K'`` by LOBPCG (a block Krylov method) on blockwise products.

    Each iteration is one blockwise pass ``K' V`` on the workers. ``tol`` is relative to the
    largest eigenvalue: iterations stop when every residual ``‖K'v − θv‖ ≤ tol·λ_1``, which bounds
    the eigenvalue errors by about ``(tol·λ_1)² / gap``.
    """
    from scipy.sparse.linalg import LinearOperator, lobpcg

    l = engine.n_samples
    k = min(l - 1, r + (oversample if oversample is not None else max(5, r // 2)))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((l, k)) if X0 is None else np.asarray(X0, dtype=np.float64)
    X, _ = np.linalg.qr(X)
    KX = engine.matmat(X)
    lam1 = float(np.max(np.linalg.eigvalsh(X.T @ KX)))  # Rayleigh-Ritz scale of the spectrum
    X, _ = np.linalg.qr(KX)  # one step of subspace iteration as the start
    op = LinearOperator((l, l), matvec=lambda v: engine.matmat(v.reshape(-1, 1)).ravel(),
                        matmat=engine.matmat, dtype=np.float64)
    w, V = lobpcg(op, X, largest=True, tol=tol * abs(lam1), maxiter=maxiter, verbosityLevel=0)
    order = np.argsort(w)[::-1]
    return w[order][:r], V[:, order][:, :r]


def projections(engine, A: np.ndarray) -> np.ndarray:
    """``C = A K'`` (``r × l``), one blockwise pass."""
    return engine.matmat(np.ascontiguousarray(A.T)).T.copy()


def evaluate(engine, A: np.ndarray, eigenvalues: np.ndarray | None = None, *,
             C: np.ndarray | None = None) -> Evaluation:
    """``E(A)``, ``E_min`` and the excess ``E/E_min − 1`` of eq. 22, blockwise.

    ``eigenvalues`` (the top ``r`` of ``K'``) may be passed to skip their computation.
    """
    r = A.shape[0]
    if C is None:
        C = projections(engine, A)
    frob2, res2 = engine.residual(C)
    if eigenvalues is None:
        eigenvalues = top_eigenvalues(engine, r)
    emin2 = frob2 - float(np.sum(np.asarray(eigenvalues[:r]) ** 2))
    error = float(np.sqrt(max(res2, 0.0)))
    error_min = float(np.sqrt(max(emin2, 0.0)))
    excess = error / error_min - 1.0 if error_min > 0 else float("inf")
    return Evaluation(error=error, error_min=error_min, excess=excess, frobenius=float(np.sqrt(frob2)))
