"""The exact kernel PCA of what an online run has seen, while its dictionary's span holds it.

The online algorithms (:mod:`dkha.solvers.online`) converge to the top components over a long
stream; on a short one (scikit-learn's ``partial_fit`` on a few dozen samples) they are far from
them. But while every sample seen lies in the dictionary's span — it joined the dictionary, or it
is a combination of the members up to round-off (``ε² = k(x, x) − ‖c‖² ≈ 0``) — the covariance
operator of the samples seen lives in that span, and its eigenvectors are computable exactly
from ``m × m`` sums of the samples' Cholesky coordinates ``c = L⁻¹ k(D_m, x)``::

    S = Σ c cᵀ,   s = Σ c,   n,        G = S/n − (s/n)(s/n)ᵀ   (uncentered: S/n)

whose top eigenvectors are the components' coordinates ``B`` (orthonormal: unit feature-space
norms) and ``s/n`` the mean's. A member that joins extends the basis by a direction orthogonal to
the earlier span, where every earlier sample has coordinate 0: ``S`` and ``s`` grow by zeros,
exactly. The first sample outside the span (a sample the dictionary does not admit, with ``ε²``
above round-off, or one past ``max_members``) ends this: the state is set to the exact
solution of what was seen up to then, and the streaming updates go on from it (the online
algorithm's answer from there on).
"""

from __future__ import annotations

import numpy as np

#: ``ε² ≤ SPAN_RTOL · k(x, x)``: the sample lies in the dictionary's span (round-off)
SPAN_RTOL = 1e-9


class ExactSpan:
    """The sums ``S``, ``s``, ``n`` of the samples' coordinates while they all lie in the span."""

    def __init__(self):
        self.S = np.zeros((0, 0))
        self.s = np.zeros(0)
        self.n = 0

    def add(self, C: np.ndarray, kdiag: np.ndarray) -> bool:
        """Add the samples of coordinates ``C`` (``m × b``, the current basis) and diagonal
        ``k(x, x)``; False (nothing added) where one of them lies outside the span."""
        eps2 = kdiag - np.einsum("ij,ij->j", C, C)
        if np.any(eps2 > SPAN_RTOL * np.maximum(kdiag, 1e-300)):
            return False
        m = C.shape[0]
        if m > len(self.s):     # members joined: earlier samples have coordinate 0 on them
            S = np.zeros((m, m))
            S[:len(self.s), :len(self.s)] = self.S
            self.S, self.s = S, np.concatenate([self.s, np.zeros(m - len(self.s))])
        self.S += C @ C.T
        self.s += C.sum(axis=1)
        self.n += C.shape[1]
        return True

    def solution(self, r: int, center: bool, m: int) -> tuple[np.ndarray, np.ndarray]:
        """``(B, cbar)`` over ``m`` members: the top eigenvectors of the samples' covariance in
        the span as rows (``min(r, dim) × m``, ``dim`` the span's dimension when the samples
        were added: no more unit components exist in it; zero coordinates on members that
        joined after the last samples added) and the mean's coordinates (zeros uncentered)."""
        have = len(self.s)
        mean = np.zeros(m)
        if center:
            mean[:have] = self.s / self.n
        G = self.S / self.n - np.outer(mean[:have], mean[:have])
        _, V = np.linalg.eigh(0.5 * (G + G.T))
        k = min(r, have)
        B = np.zeros((k, m))
        B[:, :have] = V[:, ::-1][:, :k].T
        return B, mean

    def arrays(self) -> dict[str, np.ndarray]:
        return {"exact_S": self.S, "exact_s": self.s}

    @classmethod
    def restored(cls, arrays: dict, n: int) -> ExactSpan:
        span = cls()
        span.S, span.s, span.n = (np.array(arrays["exact_S"], dtype=np.float64),
                                  np.array(arrays["exact_s"], dtype=np.float64), int(n))
        return span


def sign_fixed(B: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """``B`` with each row's sign such that the largest entry of ``directions`` (the row's
    component in some fixed coordinates, e.g. input space for the linear kernel) is positive:
    scikit-learn's ``svd_flip`` convention, deterministic whatever the eigensolver returned."""
    if directions.size == 0:
        return B
    idx = np.argmax(np.abs(directions), axis=1)
    signs = np.sign(directions[np.arange(len(directions)), idx])
    signs[signs == 0] = 1.0
    return B * signs[:, None]
