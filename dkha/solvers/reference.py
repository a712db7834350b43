"""The straightforward per-step form of the batch KHA family (coordinator-math.md §2).

Each step costs ``O(r² l)``. This is the oracle the fast engines are tested against; it is also
readable documentation of the updates. With ``y = A k'_p``, ``L = lt(y yᵀ)`` and gains ``d``:

* KHA, KHA/t, KHA/et (eq. 8/11): ``A ← A + D (y e_pᵀ − L A)``; ``C = A K'`` kept by eq. 18
  when the gains need eigenvalues (KHA/et).
* KHA-SMD (Algorithm 1; eqs. 16, 21, 15, 18 in that order), ``z = B k'_p``, ``d = e^ρ ⊙ η``.
"""

from __future__ import annotations

import numpy as np


def step(A: np.ndarray, p: int, kp: np.ndarray, d: np.ndarray, C: np.ndarray | None = None) -> np.ndarray:
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
    rho += mu * (y * z - np.einsum("ij,ji->i", L, CBt))
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
