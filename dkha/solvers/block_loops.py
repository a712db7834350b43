"""The compiled in-block loops of the factored batch engine (coordinator-math.md §3): the ``b``
sequential steps of a block of KHA, KHA/t, KHA/et (:func:`kha_block`) or KHA-SMD
(:func:`smd_block`) between the block's two GEMMs, written from the compiled pieces of
:mod:`dkha.solvers.compiled` (the structured products, the triangular ``T``, SMD's recurrences,
the ``cond(T)`` bound and the numerical guards; notation and guards: its docstring).

Each loop is a short numba function over the pieces of a step below, which are inlined into it
(numba IR inlining, before type inference): the compiled loops are those written out in one
function, bit for bit, and as fast. Every function has a plain NumPy twin in
tests/test_factored.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dkha.solvers.compiled import (
    GUARD_A,
    GUARD_B,
    GUARD_GAIN,
    GUARD_GAIN_RUNAWAY,
    GUARD_GRAM,
    GUARD_OK,
    LOG_RUNAWAY,
    all_finite,
    apply_g,
    apply_m,
    cond_exceeds,
    copy_square,
    corrected_projection,
    finish_projections,
    g_cond_bound,
    lower_matvec,
    lower_nonfinite,
    m_cond_bound,
    projection_problem,
    smd_gram_update,
    smd_log_gain,
    solve_lower,
)

# ---------------------------------------------------------------------------------------------
# The pieces of a step shared by the block loops


@njit(inline="always")
def add_column(S, p, v):
    """``S[:, p] += v`` (``len(v)`` rows)."""
    for i in range(v.shape[0]):
        S[i, p] += v[i]


@njit(inline="always")
def log_direct(direct_log, j, slot, v):
    """Row ``j`` of ``direct_log`` receives ``v`` as its ``slot``-th vector (columns
    ``1 + slot·len(v) …``) of a direct step's row."""
    r = v.shape[0]
    for i in range(r):
        direct_log[j, 1 + slot * r + i] = v[i]


@njit(inline="always")
def direct_on_c(C, U, rows, a, y, j):
    """A direct step on ``C̃`` (``C̃ ← M C̃ + a k'_pᵀ``) and on the pending column updates
    ``U[:j]`` of ``C̃`` (their ``A`` part, ``M`` applied)."""
    r = a.shape[0]
    apply_m(C, a, y, C)
    for i in range(r):
        for q in range(C.shape[1]):
            C[i, q] += a[i] * rows[j, q]
    pending = U[:j, :r].T
    apply_m(pending, a, y, pending)


@njit(inline="always")
def add_to_later(Y, Kpp, c, j, b):
    """The projections of the block's later rows gain a direct step's column: ``Y[jj] += c
    K'[p_jj, p_j]`` for ``jj = j+1 … b-1`` (their ``G`` was applied by the caller)."""
    for jj in range(j + 1, b):
        for i in range(c.shape[0]):
            Y[jj, i] += c[i] * Kpp[jj, j]


@njit(inline="always")
def fold_or_direct(Tn, bound, step_bound, cond_limit, fresh, Y, U, Kpp, start, j):
    """Whether ``T ← Tn`` would pass ``cond_limit`` (:func:`cond_exceeds`): then with ``T`` not
    fresh the block must fold first (``Y[j:]`` brought up to date), with ``T = I`` the step is
    taken directly. Returns ``(fold, direct, new bound)``."""
    exceeded, new_bound = cond_exceeds(Tn, bound, step_bound, cond_limit)
    if exceeded and not fresh:
        finish_projections(Y, U, Kpp, start, j)
        return True, False, new_bound
    return False, exceeded, new_bound


@njit(inline="always")
def keep_factored_step(T, Tn, c, delta, U, S, j, p, has_s, r, bound, new_bound):
    """Keep a factored step: ``T ← Tn``, ``Δ_j = Tn⁻¹ c`` into ``U[j]`` (and ``S̃[:, p]`` where
    kept here), the ``cond(T)`` bound. Returns ``(guard, component)``: a non-finite ``Δ_j``
    (``GUARD_A`` in its first ``r`` entries, ``GUARD_B`` below) or ``Tn`` keeps nothing."""
    m = c.shape[0]
    solve_lower(Tn, c, delta)
    for i in range(m):
        if not np.isfinite(delta[i]):
            return GUARD_A if i < r else GUARD_B, i % r
    if lower_nonfinite(Tn):
        return GUARD_A, -1
    copy_square(Tn, T)
    bound[0] = new_bound
    for i in range(m):
        U[j, i] = delta[i]
    if has_s:
        add_column(S, p, delta)
    return GUARD_OK, -1


# ---------------------------------------------------------------------------------------------
# KHA's step


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
# KHA-SMD's step


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
# The block loops


@njit(cache=True, nogil=True)
def kha_block(T, S, C, rows, Y, U, Kpp, index, eta, start, fresh, cond_limit):
    """Steps ``start..b-1`` of a block of KHA, KHA/t or KHA/et in the factored form ``A = T · S̃``.

    :func:`kha_block_logged` without the log of direct steps (see there for the parameters).
    """
    return kha_block_logged(T, S, C, rows, Y, U, Kpp, index, eta, start, fresh, cond_limit,
                            np.zeros((0, 0)), np.full(1, np.inf))


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


@njit(cache=True, nogil=True)
def smd_block(T, S, C, gaa, gab, rho, rows, Y, U, Kpp, index, eta, mu, xi, start, fresh,
              cond_limit):
    """Steps ``start..b-1`` of a block of KHA-SMD (Algorithm 1) in the factored form ``S = T · S̃``.

    :func:`smd_block_logged` without the log of direct steps (see there).
    """
    return smd_block_logged(T, S, C, gaa, gab, rho, rows, Y, U, Kpp, index, eta, mu, xi, start,
                            fresh, cond_limit, np.zeros((0, 0)), np.full(1, np.inf))


@njit(cache=True, nogil=True)
def smd_block_logged(T, S, C, gaa, gab, rho, rows, Y, U, Kpp, index, eta, mu, xi, start, fresh,
                     cond_limit, direct_log, bound):
    """Steps ``start..b-1`` of a block of KHA-SMD (Algorithm 1) in the factored form ``S = T · S̃``.

    As :func:`kha_block`, with ``S = [A; B]`` (``2r`` rows, ``T`` ``2r×2r``), ``C`` (r, l) the
    ``C̃`` of ``C = T_AA C̃``, ``rho`` (r) the log-gains (eq. 16), and ``gaa``, ``gab`` (r, r) the
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
