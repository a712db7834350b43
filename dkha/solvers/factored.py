"""The exact factored engine of the batch KHA family (coordinator-math.md §3).

The stacked state ``S = [A; B]`` (``2r×l`` for KHA-SMD, just ``A`` otherwise) is held as
``S = T · S̃`` with a small lower-triangular ``T``; a step multiplies ``T`` by the step's ``G`` and
changes one column of ``S̃``. ``C = A K'`` (kept for KHA/et and KHA-SMD) is held as
``C = T_AA · C̃``. Per block of centered rows ``K'_P`` (``b×l``) the work is

1. ``Y₀ = S̃ K'_Pᵀ``                         one GEMM (NumPy/BLAS)
2. the ``b`` steps, ``O(r² + b r)`` each     one compiled call (:mod:`dkha.solvers.compiled`)
3. ``C̃ += U_A K'_P``                         one more GEMM, the deferred eq. 18 (row ``j`` of
                                             ``U_A`` the ``A`` part of step ``j``'s column update)

``T`` is folded into ``S̃`` (``S̃ ← T S̃``, ``C̃ ← T_AA C̃``, ``T ← I``) before its condition number
would pass ``fold_condition``, and at every pass start. The result equals the per-step form
(:mod:`dkha.solvers.reference`) up to rounding. Reading ``A``, ``B`` or ``C`` returns the true
values ``T · S̃`` without changing the state, so evaluations do not perturb a run.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas

from dkha.solvers import compiled

DEFAULT_FOLD_CONDITION = 1e3
_EMPTY = np.zeros((0, 0))


def lower_times_inplace(T: np.ndarray, X: np.ndarray) -> None:
    """``X ← T X`` in place for lower-triangular ``T`` and C-contiguous ``X`` (BLAS ``trmm``)."""
    # X (C order, k×l) is Xᵀ in Fortran order; (T X)ᵀ = Xᵀ Tᵀ
    out = blas.dtrmm(1.0, T, X.T, side=1, lower=1, trans_a=1, overwrite_b=1)
    if not np.shares_memory(out, X):      # pragma: no cover - SciPy copied after all
        X[...] = out.T


class FactoredState:
    """The coordinator's state in the factored form ``S = T · S̃``.

    Attributes read by callers: ``A``, ``B`` (SMD), ``C`` (KHA/et, SMD) as read-only snapshots of
    the true values; ``rho`` (SMD), ``lam``, ``t``; ``folds``, the number of folds so far.
    """

    def __init__(self, A: np.ndarray, *, C: np.ndarray | None = None, smd: bool = False,
                 rho0: float = 0.0, t: int = 0, fold_condition: float = DEFAULT_FOLD_CONDITION):
        A = np.asarray(A, dtype=np.float64)
        r, l = A.shape
        self.r = r
        self.smd = bool(smd)
        m = 2 * r if smd else r
        self.S_tilde = np.zeros((m, l))
        self.S_tilde[:r] = A
        self.T = np.eye(m)
        self.C_tilde = None if C is None else np.array(C, dtype=np.float64, order="C")
        if smd and self.C_tilde is None:
            raise ValueError("kha-smd needs C = A K' to start")
        self.rho = np.full(r, float(rho0)) if smd else None
        self.gram_aa = self.gram_ab = None
        self.lam: np.ndarray | None = None
        self.t = int(t)
        self.fold_condition = float(fold_condition)
        self.folds = 0
        self._fresh = True       # T is exactly the identity
        self._cache: dict[str, np.ndarray] = {}
        if smd:
            self.resync_grams()

    # -- true values --------------------------------------------------------------------------

    def _value(self, name: str) -> np.ndarray:
        v = self._cache.get(name)
        if v is None:
            r = self.r
            if name == "A":
                v = self.T[:r, :r] @ self.S_tilde[:r]
            elif name == "B":
                v = self.T[r:] @ self.S_tilde
            else:
                v = self.T[:r, :r] @ self.C_tilde
            v.flags.writeable = False
            self._cache[name] = v
        return v

    @property
    def A(self) -> np.ndarray:
        """The coefficients ``A`` (``r×l``), a read-only snapshot."""
        return self._value("A")

    @property
    def B(self) -> np.ndarray | None:
        """SMD's ``B = ∂A/∂ρ`` (``r×l``), a read-only snapshot; ``None`` for the other gains."""
        return self._value("B") if self.smd else None

    @property
    def C(self) -> np.ndarray | None:
        """``C = A K'`` as kept by eq. 18 (read-only snapshot), or ``None`` where it is not kept."""
        return None if self.C_tilde is None else self._value("C")

    # -- maintenance --------------------------------------------------------------------------

    def fold(self) -> None:
        """``S̃ ← T S̃``, ``C̃ ← T_AA C̃``, ``T ← I`` (exact; the true values do not change)."""
        if self._fresh:
            return
        lower_times_inplace(self.T, self.S_tilde)
        if self.C_tilde is not None:
            lower_times_inplace(self.T[:self.r, :self.r], self.C_tilde)
        self.T = np.eye(self.T.shape[0])
        self._fresh = True
        self.folds += 1

    def resync_grams(self) -> None:
        """SMD: ``G_AA = C Aᵀ``, ``G_AB = C Bᵀ`` from the kept ``C`` (no recurrence drift)."""
        C = self.C
        self.gram_aa = np.ascontiguousarray(C @ self.A.T)
        self.gram_ab = np.ascontiguousarray(C @ self.B.T)

    def nonfinite(self) -> str | None:
        """The name of a state component holding non-finite values, or ``None``."""
        r = self.r
        if self.rho is not None and not np.isfinite(self.rho).all():
            return "rho"
        if not (np.isfinite(self.T[:r]).all() and np.isfinite(self.S_tilde[:r]).all()):
            return "A"
        if self.smd and not (np.isfinite(self.T[r:]).all() and np.isfinite(self.S_tilde[r:]).all()):
            return "B"
        return None

    # -- the block ----------------------------------------------------------------------------

    def apply_block(self, index: np.ndarray, rows: np.ndarray, eta: np.ndarray, *,
                    mu: float = 0.0, xi: float = 0.0) -> None:
        """Take one step per entry of ``index`` (``rows[j] = K'[index[j], :]``, gains ``eta[j]``).

        Does not advance ``t``; the caller owns the step count and the gains.
        """
        index = np.ascontiguousarray(index, dtype=np.int64)
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        eta = np.ascontiguousarray(eta, dtype=np.float64)
        b = index.shape[0]
        if b == 0:
            return
        self._cache.clear()
        r = self.r
        Kpp = np.take(rows, index, axis=1)           # K'_P[:, P], b×b
        Y = rows @ self.S_tilde.T                     # Y₀ᵀ = K'_P S̃ᵀ (b×m), the block's GEMM
        U = np.empty_like(Y)                          # row j: the column update Δ_j of step j
        start = 0
        while start < b:
            C_tilde = _EMPTY if self.C_tilde is None else self.C_tilde
            if self.smd:
                stop, fold, self._fresh = compiled.smd_block(
                    self.T, self.S_tilde, C_tilde, self.gram_aa, self.gram_ab, self.rho, rows, Y, U,
                    Kpp, index, eta, float(mu), float(xi), start, self._fresh, self.fold_condition)
            else:
                stop, fold, self._fresh = compiled.kha_block(
                    self.T, self.S_tilde, C_tilde, rows, Y, U, Kpp, index, eta, start,
                    self._fresh, self.fold_condition)
            if fold:
                # carry what is still pending into the new basis: the projections of the steps
                # to come, and the deferred C̃ updates of the steps taken
                Y[stop:] = Y[stop:] @ self.T.T
                if self.C_tilde is not None:
                    U[:stop, :r] = U[:stop, :r] @ self.T[:r, :r].T
                self.fold()
            start = stop
        if self.C_tilde is not None:                  # eq. 18, deferred: C̃ += U_A K'_P
            self.C_tilde += U[:, :r].T @ rows
