"""GHA's update with given gains: KHA, KHA/t, KHA/et (eqs. 8, 11; coordinator-math.md §2, §3).

With ``y = A k'_p``, ``L = lt(y yᵀ)`` and gains ``d``: ``A ← A + D (y e_pᵀ − L A)``, and
``C = A K'`` kept by eq. 18 where the gains need eigenvalues (KHA/et). Its per-step oracle form
is :func:`per_step` (``O(r² l)``, the reference engine's :func:`reference_step`); its factored
form, ``T ← M T`` with ``M = I − tril(a yᵀ)``, ``a = d ⊙ y``, and ``S̃[:, p] += T⁻¹ a``, is the
compiled block loop :func:`kha_block_logged`, written from the shared pieces of
:mod:`dkha.solvers.block_loops` (inlined) and :mod:`dkha.solvers.compiled`. Every compiled
function has a plain NumPy twin in tests/test_factored.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dkha.algorithms import GHA
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
    GUARD_GAIN,
    GUARD_OK,
    all_finite,
    apply_m,
    corrected_projection,
    lower_matvec,
    m_cond_bound,
    projection_problem,
)
from dkha.solvers.reference import guard
from dkha.solvers.updates.base import Update


def per_step(A: np.ndarray, p: int, kp: np.ndarray, d: np.ndarray,
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


def reference_step(st, p: int, kp: np.ndarray, eta: np.ndarray, mu: float, xi: float):
    """The reference engine's step (:attr:`Update.reference_step`): :func:`per_step`, then
    :func:`~dkha.solvers.reference.guard` on it."""
    y = per_step(st.A, p, kp, eta, st.C)      # A k'_p before the step
    return guard(y, st.A @ kp, kp[p], eta, state=(("A", st.A),))


# ---------------------------------------------------------------------------------------------
# The factored form's step


@njit(inline="always")
def kha_step_problem(eta, j, y, a, kappa):
    """``a = η_j ⊙ y`` and the guards of a KHA step: ``(guard, component)``."""
    for i in range(y.shape[0]):
        a[i] = eta[j, i] * y[i]
        if not np.isfinite(eta[j, i]):
            return GUARD_GAIN, i
    guard, comp = projection_problem(y, a, kappa, True)
    if guard == GUARD_OK:
        guard, comp = projection_problem(y, a, kappa, False)
    return guard, comp


@njit(inline="always")
def kha_direct_step(S, C, rows, Y, U, Kpp, a, y, j, p, b, has_s, has_c):
    """A KHA step taken directly on ``S̃`` and ``C̃`` (``T = I`` and ``M`` too ill-conditioned to
    factor); ``Y[j+1:]`` and the pending ``U[:j]`` follow. Whether ``S̃`` stayed finite."""
    apply_m(S, a, y, S)
    if has_s:
        add_column(S, p, a)
    if has_c:
        direct_on_c(C, U, rows, a, y, j)
    rest = Y[j + 1:].T
    apply_m(rest, a, y, rest)
    add_to_later(Y, Kpp, a, j, b)
    U[j] = 0.0
    return all_finite(S)


# ---------------------------------------------------------------------------------------------
# The block loop


@njit(cache=True, nogil=True)
def kha_block_logged(T, S, C, rows, Y, U, Kpp, index, eta, start, fresh, cond_limit, direct_log,
                     bound):
    """Steps ``start..b-1`` of a block of KHA, KHA/t or KHA/et in the factored form ``A = T · S̃``.

    Parameters (all written in place where they change)
    ----------
    T : (r, r) lower triangular; S : (r, l) the ``S̃``, or (r, 0) where ``S̃`` is kept elsewhere
        (its column updates are then only in ``U``, its direct steps in ``direct_log``);
        C : (r, l) the ``C̃`` of ``C = T C̃``, or
        (0, 0) when ``C`` is not kept. The caller adds ``U_A K'_P`` to ``C̃`` after the block; only
        the rare direct step touches ``C̃`` here (and then carries the pending ``U[:j]`` along).
    rows : (b, l) ``K'_P``; Y : (b, r) ``K'_P S̃ᵀ`` (row ``j`` the projection ``S̃ k'_{p_j}``) as of
        step ``start``; U : (b, r) receives the column updates ``Δ_j = T⁻¹ c`` (0 for a direct
        step); Kpp : (b, b) ``K'_P[:, P]``;
    index : (b,) ``P``; eta : (b, r) the gains of each step;
    fresh : whether ``T`` is the identity; cond_limit : fold before ``cond(T)`` exceeds this.

    Returns ``(stop, fold, fresh, guard, component)``: steps ``start..stop-1`` were taken, and
    ``fresh`` says whether ``T`` is still the identity. When ``fold`` is true the caller must fold
    ``T`` (``Y[stop:]`` has been brought up to date in the current basis) and call again from
    ``stop`` with ``fresh=True``. A ``guard`` other than ``GUARD_OK`` says step ``stop`` is bad (see
    the module docstring) and was not kept; the state is then unusable. A step whose own ``M`` is
    too ill-conditioned to be factored (checked with ``T = I``) is taken directly on ``S̃`` and
    ``C̃`` instead (``O(r l)`` by prefix sums; rare).

    ``direct_log`` : (b, 1 + 2r) or (0, 0). When it has rows, row ``j`` records step ``j``: column
    0 is 1 for a direct step (then columns ``1:1+r`` hold ``a = d ⊙ y`` and ``1+r:1+2r`` hold
    ``y``, which define its ``M``), 0 otherwise. ``bound`` : (1,) an upper bound on
    ``cond(T)`` kept from call to call (``inf``: unknown; reset to 1 where ``T`` is fresh): the
    exact ``O(r³)`` test of each step runs only where the bound could pass ``cond_limit``, which
    decides exactly as testing every step would. Worker-side replicas of ``S̃`` and ``C̃``
    (coordinator-math.md §4) replay direct steps from it. A ``C`` of shape ``(r, 0)`` keeps the
    pending ``C̃`` updates ``U`` in step with direct steps while ``C̃`` itself lives elsewhere.
    """
    r = T.shape[0]
    b = index.shape[0]
    has_c = C.shape[0] > 0
    has_s = S.shape[1] > 0      # (r, 0): S̃ is kept elsewhere (FactoredState's deferred S̃)
    logged = direct_log.shape[0] > 0
    yt = np.empty(r)
    y = np.empty(r)
    a = np.empty(r)
    delta = np.empty(r)
    Tn = np.empty((r, r))
    if fresh:
        bound[0] = 1.0
    for j in range(start, b):
        corrected_projection(Y, U, Kpp, j, start, yt)
        lower_matvec(T, yt, y)
        guard, comp = kha_step_problem(eta, j, y, a, Kpp[j, j])
        if guard != GUARD_OK:
            return j, False, fresh, guard, comp
        apply_m(T, a, y, Tn)
        p = index[j]
        if logged:
            direct_log[j, 0] = 0.0
        fold, direct, new_bound = fold_or_direct(Tn, bound, m_cond_bound(a, y), cond_limit,
                                                 fresh, Y, U, Kpp, start, j)
        if fold:
            return j, True, fresh, GUARD_OK, -1
        if direct:
            # T = I and M itself is ill-conditioned: take the step directly
            if logged:
                direct_log[j, 0] = 1.0
                log_direct(direct_log, j, 0, a)
                log_direct(direct_log, j, 1, y)
            if not kha_direct_step(S, C, rows, Y, U, Kpp, a, y, j, p, b, has_s, has_c):
                return j, False, fresh, GUARD_A, -1
            continue
        guard, comp = keep_factored_step(T, Tn, a, delta, U, S, j, p, has_s, r, bound, new_bound)
        if guard != GUARD_OK:
            return j, False, fresh, guard, comp
        fresh = False
    return b, False, fresh, GUARD_OK, -1


def block(st, S, C, rows, Y, U, Kpp, index, eta, mu, xi, start, direct_log):
    """The factored engine's block (:attr:`Update.block`): :func:`kha_block_logged`."""
    return kha_block_logged(st.T, S, C, rows, Y, U, Kpp, index, eta, start, st.fresh,
                            st.fold_condition, direct_log, st.condition_bound())


def direct_payload(row: np.ndarray, r: int, xi: float) -> tuple:
    """A direct step's ``(a, y)`` from its ``direct_log`` row (:func:`kha_block_logged`)."""
    return np.array(row[1:1 + r]), np.array(row[1 + r:1 + 2 * r])


def direct(X: np.ndarray, payload: tuple) -> np.ndarray:
    """``X ← M X`` in place for a direct step's ``M``; returns its column ``a``."""
    a, y = payload
    apply_m(X, a, y, X)
    return a


UPDATE = Update(GHA, reference_step, block, direct_payload=direct_payload, direct=direct)
