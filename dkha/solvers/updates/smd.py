"""Stochastic Meta-Descent's update: KHA-SMD (Schraudolph, Günter & Vishwanathan 2006,
Algorithm 1; eqs. 16, 21, 15, 18 in that order; coordinator-math.md §2, §3).

With ``y = A k'_p``, ``z = B k'_p`` (``B = ∂A/∂ρ``) and ``d = e^ρ ⊙ η``: the log-gains ``ρ``
by eq. 16 with the meta-gain ``μ`` and SMD's safeguard ``ρ ← ρ + max(μ (…), log ½)`` (a step
multiplies each gain by at least ½), then ``B`` by eq. 21, ``A`` by eq. 15 and ``C = A K'`` by
eq. 18. Its per-step oracle form is :func:`per_step` (the reference engine's
:func:`reference_step`); its factored form keeps ``S = [A; B]`` (``2r`` rows), ``T ← G T`` with
``G = [[M, 0], [N_A, ξ M]]`` (:func:`dkha.solvers.compiled.apply_g`), its Grams ``A K' Aᵀ`` and
``A K' Bᵀ`` by their recurrences (resynchronised from ``C`` at each pass start), in the compiled
block loop :func:`smd_block_logged`. Every compiled function has a plain NumPy twin in
tests/test_factored.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dkha.algorithms import SMD
from dkha.solvers.block_loops import (
    add_column,
    add_to_later,
    direct_on_c,
    fold_or_direct,
    keep_factored_step,
    log_direct,
)
from dkha.solvers.compiled import (
    GUARD_A,
    GUARD_B,
    GUARD_GAIN,
    GUARD_GAIN_RUNAWAY,
    GUARD_GRAM,
    GUARD_OK,
    LOG_HALF,
    LOG_RUNAWAY,
    all_finite,
    apply_g,
    corrected_projection,
    g_cond_bound,
    lower_matvec,
    projection_problem,
    smd_gram_update,
    smd_log_gain,
)
from dkha.solvers.reference import guard
from dkha.solvers.updates.base import Update


def per_step(A: np.ndarray, B: np.ndarray, C: np.ndarray, rho: np.ndarray, p: int,
             kp: np.ndarray, eta: np.ndarray, mu: float, xi: float) -> np.ndarray:
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


def reference_step(st, p: int, kp: np.ndarray, eta: np.ndarray, mu: float, xi: float):
    """The reference engine's step (:attr:`Update.reference_step`): :func:`per_step`, then
    :func:`~dkha.solvers.reference.guard` on it (with the new log-gains and ``z``)."""
    y = st.A @ kp
    z = st.B @ kp
    d = per_step(st.A, st.B, st.C, st.rho, p, kp, eta, mu, xi)
    return guard(y, st.A @ kp, kp[p], d, rho=st.rho, z=z, state=(("A", st.A), ("B", st.B)))


def start(r: int, rho0: float) -> dict:
    """Its own state: the log-gains ``ρ``, all ``rho0`` (``B`` starts at 0 with ``A``)."""
    return {"rho": np.full(r, float(rho0))}


def resync(st) -> None:
    """``G_AA = C Aᵀ``, ``G_AB = C Bᵀ`` from the kept ``C`` (no recurrence drift)."""
    C = st.C
    if C is None:
        raise ValueError("SMD's update needs C = A K' to start")
    st.gram_aa = np.ascontiguousarray(C @ st.A.T)
    st.gram_ab = np.ascontiguousarray(C @ st.B.T)


# ---------------------------------------------------------------------------------------------
# The factored form's step


@njit(inline="always")
def smd_step_problem(rho_new, y, z, eta, j, xi, kappa, a, cb, c):
    """The gains ``d = e^ρ ⊙ η_j`` of an SMD step, ``a = d ⊙ y``, ``c_B = d ⊙ (y + ξ z)``,
    ``c = [a; c_B]``, and its guards: ``(guard, component)``."""
    r = a.shape[0]
    for i in range(r):
        d = np.exp(rho_new[i]) * eta[j, i]
        a[i] = d * y[i]
        cb[i] = d * (y[i] + xi * z[i])
        c[i] = a[i]
        c[r + i] = cb[i]
    guard, comp = projection_problem(y, a, kappa, True)
    if guard != GUARD_OK:
        return guard, comp
    for i in range(r):
        if not np.isfinite(z[i]):
            return GUARD_B, i
        if not (np.isfinite(rho_new[i]) and np.isfinite(eta[j, i])
                and np.isfinite(np.exp(rho_new[i]) * eta[j, i])):
            return GUARD_GAIN, i
        if rho_new[i] > LOG_RUNAWAY:
            return GUARD_GAIN_RUNAWAY, i
    return projection_problem(y, a, kappa, False)


@njit(inline="always")
def smd_direct_step(S, C, rows, Y, U, Kpp, a, cb, y, z, c, xi, j, p, b, has_s):
    """An SMD step taken directly on ``S̃`` and ``C̃`` (``T = I`` and ``G`` too ill-conditioned
    to factor); ``Y[j+1:]`` and the pending ``U[:j]`` follow. Whether ``S̃`` stayed finite."""
    apply_g(S, a, cb, y, z, xi, S)
    if has_s:
        add_column(S, p, c)
    direct_on_c(C, U, rows, a, y, j)
    rest = Y[j + 1:].T
    apply_g(rest, a, cb, y, z, xi, rest)
    add_to_later(Y, Kpp, c, j, b)
    U[j] = 0.0
    return all_finite(S)


# ---------------------------------------------------------------------------------------------
# The block loop


@njit(cache=True, nogil=True)
def smd_block_logged(T, S, C, gaa, gab, rho, rows, Y, U, Kpp, index, eta, mu, xi, start, fresh,
                     cond_limit, direct_log, bound):
    """Steps ``start..b-1`` of a block of KHA-SMD (Algorithm 1) in the factored form ``S = T · S̃``.

    As :func:`kha_block_logged`, with ``S = [A; B]`` (``2r`` rows, ``T`` ``2r×2r``), ``C`` (r, l)
    the ``C̃`` of ``C = T_AA C̃``, ``rho`` (r) the log-gains (eq. 16), and ``gaa``, ``gab`` (r, r) the
    Grams ``A K' Aᵀ`` and ``A K' Bᵀ`` kept by their recurrences. Per step: eq. 16 (ρ), then
    eqs. 21, 15 (``T ← G T``, ``S̃[:, p] += T⁻¹ c``), and eq. 18 deferred to the caller's
    ``C̃ += U_A K'_P`` (``U_A = U[:, :r]``).

    ``direct_log`` : (b, 1 + 4r) or (0, 0), as in :func:`kha_block_logged`, a direct step's row
    holding ``1, a, c_B, y, z`` (which define its ``G``). Returns as :func:`kha_block_logged`.
    """
    m = T.shape[0]
    r = m // 2
    b = index.shape[0]
    has_s = S.shape[1] > 0      # (2r, 0): S̃ is kept elsewhere (FactoredState's deferred S̃)
    logged = direct_log.shape[0] > 0
    yt = np.empty(m)
    yz = np.empty(m)
    rho_new = np.empty(r)
    a = np.empty(r)
    cb = np.empty(r)
    c = np.empty(m)
    delta = np.empty(m)
    Tn = np.empty((m, m))
    if fresh:
        bound[0] = 1.0
    for j in range(start, b):
        corrected_projection(Y, U, Kpp, j, start, yt)
        lower_matvec(T, yt, yz)
        y = yz[:r]
        z = yz[r:]
        smd_log_gain(rho, y, z, gab, mu, rho_new)
        guard, comp = smd_step_problem(rho_new, y, z, eta, j, xi, Kpp[j, j], a, cb, c)
        if guard != GUARD_OK:
            return j, False, fresh, guard, comp
        apply_g(T, a, cb, y, z, xi, Tn)
        p = index[j]
        if logged:
            direct_log[j, 0] = 0.0
        fold, direct, new_bound = fold_or_direct(Tn, bound, g_cond_bound(a, cb, y, z, xi),
                                                 cond_limit, fresh, Y, U, Kpp, start, j)
        if fold:
            return j, True, fresh, GUARD_OK, -1
        if direct and logged:
            direct_log[j, 0] = 1.0
            log_direct(direct_log, j, 0, a)
            log_direct(direct_log, j, 1, cb)
            log_direct(direct_log, j, 2, y)
            log_direct(direct_log, j, 3, z)
        for i in range(r):
            rho[i] = rho_new[i]
        smd_gram_update(gaa, gab, a, cb, y, z, Kpp[j, j], xi)
        if not (all_finite(gaa) and all_finite(gab)):
            return j, False, fresh, GUARD_GRAM, -1
        if direct:
            # T = I and G itself is ill-conditioned: take the step directly
            if not smd_direct_step(S, C, rows, Y, U, Kpp, a, cb, y, z, c, xi, j, p, b, has_s):
                return j, False, fresh, GUARD_A, -1
            continue
        guard, comp = keep_factored_step(T, Tn, c, delta, U, S, j, p, has_s, r, bound, new_bound)
        if guard != GUARD_OK:
            return j, False, fresh, guard, comp
        fresh = False
    return b, False, fresh, GUARD_OK, -1


def block(st, S, C, rows, Y, U, Kpp, index, eta, mu, xi, start, direct_log):
    """The factored engine's block (:attr:`Update.block`): :func:`smd_block_logged`."""
    return smd_block_logged(st.T, S, C, st.gram_aa, st.gram_ab, st.rho, rows, Y, U, Kpp, index,
                            eta, float(mu), float(xi), start, st.fresh, st.fold_condition,
                            direct_log, st.condition_bound())


def direct_payload(row: np.ndarray, r: int, xi: float) -> tuple:
    """A direct step's ``(a, y, c_B, z, ξ)`` from its ``direct_log`` row
    (:func:`smd_block_logged`: ``1, a, c_B, y, z``)."""
    a, cb, y, z = (np.array(row[1 + k * r:1 + (k + 1) * r]) for k in range(4))
    return a, y, cb, z, xi


def direct(X: np.ndarray, payload: tuple) -> np.ndarray:
    """``X ← G X`` in place for a direct step's ``G``; returns its column ``c = [a; c_B]``."""
    a, y, cb, z, xi = payload
    apply_g(X, a, cb, y, z, xi, X)
    return np.concatenate([a, cb])


UPDATE = Update(SMD, reference_step, block, stacked=2, start=start, resync=resync,
                direct_vectors=4, direct_payload=direct_payload, direct=direct)
