"""dkha.solvers.eigen as it was before CholeskyQR2 and preallocated buffers (issue 40): the
oracle of tests/test_eigen_oracle.py only (the new solver must give the same eigenpairs at tol
1e-12)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: eigenvalues below this fraction of the largest are judged against the largest
FLOOR = 1e-8
#: residuals below this fraction of the largest eigenvalue are round-off of float64 products:
#: converged whatever ``tol`` (the null space of a rank-deficient operator)
ROUNDOFF = 1e-12


@dataclass
class KrylovInfo:
    """How a solve went: ``products`` (calls of ``matmat``), ``columns`` (columns multiplied in
    all), ``restarts``, ``converged`` (every wanted residual within ``tol``), ``residuals``
    (``‖K x_i − θ_i x_i‖ / θ_i`` of the ``r`` wanted pairs at the end) and ``history`` (the
    largest of those after each product)."""

    products: int = 0
    columns: int = 0
    restarts: int = 0
    converged: bool = False
    stalled: bool = False
    residuals: np.ndarray | None = None
    history: list = field(default_factory=list)


@dataclass
class KrylovState:
    """The iteration between two products (at the top of its loop): the basis ``Q``, its
    products ``KQ``, the Rayleigh quotient ``T`` and the stall counters, with the
    :class:`KrylovInfo` counts so far. The arrays are the iteration's own (no copies); an
    iteration continued from it (``top_eigenpairs(..., state=)``) does exactly what the one it
    was taken from would have done."""

    Q: np.ndarray
    KQ: np.ndarray
    T: np.ndarray
    best: float
    since: int
    products: int
    columns: int
    restarts: int
    history: list


def orthonormal_columns(Z: np.ndarray, Q: np.ndarray | None = None, *, drop: float = 1e-10
                        ) -> np.ndarray:
    """An orthonormal basis of the part of ``span(Z)`` orthogonal to ``Q`` (classical
    Gram–Schmidt twice, then an SVD that drops directions below ``drop`` of ``Z``'s scale)."""
    scale = np.linalg.norm(Z, axis=0).max(initial=0.0)
    if scale == 0.0:
        return Z[:, :0]
    Z = Z / scale
    if Q is not None and Q.shape[1]:
        for _ in range(2):
            Z = Z - Q @ (Q.T @ Z)
    U, s, _ = np.linalg.svd(Z, full_matrices=False)
    keep = s > drop * max(1.0, s.max(initial=0.0))
    U = U[:, keep]
    if Q is not None and Q.shape[1] and U.shape[1]:    # once more against Q after the rotation
        U = U - Q @ (Q.T @ U)
        U, _ = np.linalg.qr(U)
    return U


def top_eigenpairs(matmat, X0: np.ndarray, r: int, *, tol: float = 1e-8, maxiter: int = 300,
                   max_basis: int | None = None, stall: int = 6, callback=None,
                   state: KrylovState | None = None, on_state=None
                   ) -> tuple[np.ndarray, np.ndarray, KrylovInfo]:
    """The ``r`` largest eigenpairs ``(w, V)`` (descending, ``V`` orthonormal ``n × r``) of the
    symmetric positive semi-definite operator ``matmat: V ↦ K V``, from the start block ``X0``
    (``n × block``, ``block ≥ r``: its width is the block size), with the :class:`KrylovInfo`.

    ``maxiter`` bounds the products; ``max_basis`` the basis columns (default ``12·block``, at
    least ``3·block``); ``callback(info)`` is called after each product. ``on_state(state)``
    gets the :class:`KrylovState` at every product boundary (before the Ritz pairs it gives);
    ``state``: continue from one (``X0`` then only gives the block's width)."""
    n, block = X0.shape
    if not 0 < r <= block:
        raise ValueError(f"the start block needs at least r = {r} columns, got {block}")
    max_basis = min(n, max(3 * block, max_basis or 12 * block))
    info = KrylovInfo()
    if state is None:
        Q = orthonormal_columns(np.asarray(X0, dtype=np.float64))
        KQ = _product(matmat, Q, info)
        T = _sym(Q.T @ KQ)
        best, since = np.inf, 0
    else:
        Q, KQ, T, best, since = state.Q, state.KQ, state.T, state.best, state.since
        info.products, info.columns, info.restarts = state.products, state.columns, state.restarts
        info.history = list(state.history)
    while True:
        if on_state is not None:
            on_state(KrylovState(Q, KQ, T, float(best), since, info.products, info.columns,
                                 info.restarts, list(info.history)))
        theta, Y = _ritz(T)
        k = min(block, len(theta))
        X, KX = Q @ Y[:, :k], KQ @ Y[:, :k]
        R = KX - X * theta[:k]
        res = np.linalg.norm(R, axis=0)
        top = max(abs(theta[0]), np.finfo(float).tiny)
        scaled = res / np.maximum(np.abs(theta[:k]), FLOOR * top)
        scaled[res <= ROUNDOFF * top] = 0.0
        worst = float(scaled[:r].max())
        info.history.append(worst)
        info.residuals = scaled[:r].copy()
        if callback is not None:
            callback(info)
        if worst <= tol:
            info.converged = True
            break
        if worst < 0.5 * best:
            best, since = worst, 0
        else:
            since += 1
        if since >= stall:
            info.stalled = True
            break
        if info.products >= maxiter:
            break
        active = np.flatnonzero(scaled > tol)           # soft locking of converged pairs
        if Q.shape[1] + len(active) > max_basis:        # thick restart to the top 2·block
            keep = min(len(theta), 2 * block)
            Q, KQ = Q @ Y[:, :keep], KQ @ Y[:, :keep]
            T = np.diag(theta[:keep])
            info.restarts += 1
        Z = orthonormal_columns(R[:, active], Q)
        if Z.shape[1] == 0:         # an invariant subspace: the Ritz pairs are exact
            info.converged = True
            break
        KZ = _product(matmat, Z, info)
        C = Q.T @ KZ
        T = np.block([[T, C], [C.T, _sym(Z.T @ KZ)]])
        Q, KQ = np.hstack([Q, Z]), np.hstack([KQ, KZ])
    theta, Y = _ritz(T)
    V = Q @ Y[:, :r]
    return theta[:r].copy(), V, info


def _product(matmat, V: np.ndarray, info: KrylovInfo) -> np.ndarray:
    info.products += 1
    info.columns += V.shape[1]
    out = np.asarray(matmat(np.ascontiguousarray(V)), dtype=np.float64)
    if out.shape != V.shape:
        raise ValueError(f"matmat returned shape {out.shape} for a block of shape {V.shape}")
    return out


def _sym(T: np.ndarray) -> np.ndarray:
    return 0.5 * (T + T.T)


def _ritz(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of the Rayleigh quotient, largest first."""
    theta, Y = np.linalg.eigh(_sym(T))
    return theta[::-1], Y[:, ::-1]
