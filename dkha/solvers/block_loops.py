"""The shared pieces of the factored batch engine's compiled in-block loops (coordinator-math.md
§3). Each update's loop, the ``b`` sequential steps of a block between the block's two GEMMs,
lives with its update (:func:`dkha.solvers.updates.gha.kha_block_logged`,
:func:`dkha.solvers.updates.smd.smd_block_logged`) and is written from these pieces and those of
:mod:`dkha.solvers.compiled` (the structured products, the triangular ``T``, SMD's recurrences,
the ``cond(T)`` bound and the numerical guards; notation and guards: its docstring).

A loop is a short numba function over the pieces of a step, which are inlined into it (numba
IR inlining, before type inference): the compiled loops are those written out in one function,
bit for bit, and as fast. Every function has a plain NumPy twin in tests/test_factored.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dkha.solvers.compiled import (
    GUARD_A,
    GUARD_B,
    GUARD_OK,
    apply_m,
    cond_exceeds,
    copy_square,
    finish_projections,
    lower_nonfinite,
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
