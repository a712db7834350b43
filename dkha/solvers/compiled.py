"""The compiled pieces of the factored batch engine's in-block loops (coordinator-math.md §3).

This module, :mod:`dkha.solvers.block_loops` (the pieces the loops share) and the updates' block
loops (:mod:`dkha.solvers.updates`, written from these pieces) own the batch engine's compiled
code. The engine (:mod:`dkha.solvers.factored`) keeps the stacked
state ``S = [A; B]`` (``m = 2r`` rows for KHA-SMD, ``m = r`` rows of ``A`` for the other gains) as
``S = T · S̃`` with a small lower-triangular ``m×m`` matrix ``T``, so that each step changes one
column of ``S̃``. For a block of ``b`` rows ``P`` it computes, in NumPy/BLAS,
``Y₀ = S̃ K'_Pᵀ`` (one GEMM) and afterwards the deferred ``C̃ += U_Aᵀ K'_P`` (one more GEMM); what
lies between, the ``b`` sequential steps of ``O(r² + b r)`` work each, is one call of
:func:`~dkha.solvers.updates.gha.kha_block_logged` or
:func:`~dkha.solvers.updates.smd.smd_block_logged`.
Measured (benchmarks/coordinator_speed.py): BLAS computes ``Y₀`` some 20× faster than a compiled
naive loop, while NumPy's per-call overhead would dominate the small per-step products: hence
this split.

Notation of the step (coordinator-math.md §2, §3): ``y = A k'_p``, ``z = B k'_p``, gains ``d``,
``a = c_A = d ⊙ y``, ``c_B = d ⊙ (y + ξ z)``,

* ``M   = I − D L = I − tril(a yᵀ)``
* ``N_A = −D (L + ξ Lz) = −tril(c_B yᵀ) − ξ tril(a zᵀ)``,  ``N_B = ξ M``
* ``G   = [[M, 0], [N_A, ξ M]]`` (lower triangular), ``S ← G S + c e_pᵀ`` with ``c = [c_A; c_B]``.

Every product with ``M`` or ``N_A`` is a prefix sum over rows (or columns), ``O(r)`` per column.

All arrays are float64 and C-contiguous (``index`` int64), as normalised by the caller; results are
written into the arrays passed in. Every function has a plain NumPy twin in tests/test_factored.py.

Numerical guards. Each step is checked before its results are kept (the updates'
``kha_step_problem``, ``smd_step_problem``, and ``keep_factored_step`` of
:mod:`dkha.solvers.block_loops`; ``O(m²)`` next to the step's ``O(m³)`` conditioning test):
the projections ``y = A k'_p`` before and ``y⁺ = A' k'_p = M y + κ a`` after the step
(``κ = K'[p, p]``), ``z = B k'_p``, the new log-gains and gains, the new ``T`` and column
update. A step is bad when any of them is not finite, when ``|y_i| > RUNAWAY·√κ`` (then
component ``i``'s feature-space norm ``‖w_i‖ ≥ |y_i|/√κ``
exceeds ``RUNAWAY``; KHA converges to unit norms) or when a gain factor ``e^{ρ_i}`` exceeds
``RUNAWAY``. The block loops stop at the first bad step and report it (``GUARD_*`` codes);
:mod:`dkha.solvers.reference` applies the same definition to the per-step form.
"""

from __future__ import annotations

import numpy as np
from numba import njit

RUNAWAY = 1e6             # a component's norm, or a gain factor e^ρ, past this is a runaway
LOG_RUNAWAY = np.log(RUNAWAY)
LOG_HALF = np.log(0.5)    # SMD's safeguard: each step multiplies a gain by at least 1/2
# what a bad step showed (the block loops return it with the component)
GUARD_OK = 0
GUARD_A = 1               # non-finite A (its projections, T, the column update)
GUARD_B = 2               # non-finite B = ∂A/∂ρ (SMD)
GUARD_GAIN = 3            # non-finite log-gains or gains
GUARD_A_RUNAWAY = 4       # ‖w_i‖ > RUNAWAY
GUARD_GAIN_RUNAWAY = 5    # e^{ρ_i} > RUNAWAY
GUARD_GRAM = 6            # non-finite Gram matrices (SMD)

# ---------------------------------------------------------------------------------------------
# Structured products: M X, G X, X Mᵀ, X N_Aᵀ


@njit(cache=True, nogil=True)
def apply_m(X, a, y, out):
    """``out = (I − tril(a yᵀ)) X`` for ``X`` with ``len(a)`` rows; ``out`` may be ``X``. On
    transposes, ``X (I − tril(a yᵀ))ᵀ``: ``apply_m(X.T, a, y, out.T)``."""
    r = a.shape[0]
    n = X.shape[1]
    acc = np.zeros(n)
    for i in range(r):
        yi = y[i]
        ai = a[i]
        for q in range(n):
            x = X[i, q]
            acc[q] += yi * x
            out[i, q] = x - ai * acc[q]


@njit(cache=True, nogil=True)
def apply_g(X, a, cb, y, z, xi, out):
    """``out = G X``, SMD's ``G = [[M, 0], [N_A, ξ M]]``, ``X`` of ``2r`` rows; ``out`` may be X."""
    r = a.shape[0]
    n = X.shape[1]
    acc_y = np.zeros(n)   # Σ_{k≤i} y_k X_k      (top rows)
    acc_z = np.zeros(n)   # Σ_{k≤i} z_k X_k      (top rows)
    acc_b = np.zeros(n)   # Σ_{k≤i} y_k X_{r+k}  (bottom rows)
    for i in range(r):
        yi = y[i]
        zi = z[i]
        ai = a[i]
        cbi = cb[i]
        xai = xi * ai
        for q in range(n):
            top = X[i, q]
            bottom = X[r + i, q]
            acc_y[q] += yi * top
            acc_z[q] += zi * top
            acc_b[q] += yi * bottom
            out[i, q] = top - ai * acc_y[q]
            out[r + i, q] = xi * bottom - xai * acc_b[q] - cbi * acc_y[q] - xai * acc_z[q]


@njit(cache=True, nogil=True)
def apply_na_right(X, a, cb, y, z, xi, out):
    """``out = X N_Aᵀ`` with ``N_A = −tril(c_B yᵀ) − ξ tril(a zᵀ)``; ``out`` may be ``X``."""
    r = a.shape[0]
    n = X.shape[0]
    acc_y = np.zeros(n)
    acc_z = np.zeros(n)
    for i in range(r):
        yi = y[i]
        zi = z[i]
        cbi = cb[i]
        xai = xi * a[i]
        for q in range(n):
            x = X[q, i]
            acc_y[q] += yi * x
            acc_z[q] += zi * x
            out[q, i] = -cbi * acc_y[q] - xai * acc_z[q]


# ---------------------------------------------------------------------------------------------
# Small dense helpers on the lower-triangular T


@njit(cache=True, nogil=True)
def copy_square(src, dst):
    """``dst[:, :] = src`` as a loop: numba compiles a slice assignment with its shape-mismatch
    error message, which cost ~4 s of a first run's compilation (1-D ~7 s)."""
    for i in range(src.shape[0]):
        for k in range(src.shape[1]):
            dst[i, k] = src[i, k]


@njit(cache=True, nogil=True)
def lower_matvec(T, x, out):
    """``out = T x`` for lower-triangular ``T`` (the upper triangle is not read)."""
    for i in range(T.shape[0]):
        s = 0.0
        for k in range(i + 1):
            s += T[i, k] * x[k]
        out[i] = s


@njit(cache=True, nogil=True)
def solve_lower(T, c, out):
    """``out = T⁻¹ c`` by forward substitution (``T`` lower triangular)."""
    for i in range(T.shape[0]):
        s = c[i]
        for k in range(i):
            s -= T[i, k] * out[k]
        out[i] = s / T[i, i]


@njit(cache=True, nogil=True)
def cond_lower(T):
    """The 1-norm condition number ``‖T‖₁ ‖T⁻¹‖₁`` of lower-triangular ``T`` (``inf``: singular)."""
    n = T.shape[0]
    norm = 0.0
    for j in range(n):
        s = 0.0
        for i in range(j, n):
            s += abs(T[i, j])
        norm = max(norm, s)
    for i in range(n):
        if T[i, i] == 0.0:
            return np.inf
    X = np.zeros((n, n))        # T⁻¹ row by row: X_i = (e_i − Σ_{k<i} T_ik X_k) / T_ii
    for i in range(n):
        for k in range(i):
            t = T[i, k]
            for q in range(k + 1):
                X[i, q] -= t * X[k, q]
        X[i, i] += 1.0
        inv_diag = 1.0 / T[i, i]
        for q in range(i + 1):
            X[i, q] *= inv_diag
    inv_norm = 0.0
    for q in range(n):
        s = 0.0
        for i in range(q, n):
            s += abs(X[i, q])
        inv_norm = max(inv_norm, s)
    return norm * inv_norm


@njit(cache=True, nogil=True)
def corrected_projection(Y, U, Kpp, j, start, out):
    """``out = Y[j] + Kpp[j, start:j] @ U[start:j]``: ``S̃ k'_{p_j}`` after steps ``start..j-1``.

    ``Y`` and ``U`` hold one step per row (``b×m``), so the sum runs over contiguous rows.
    """
    m = Y.shape[1]
    for q in range(m):
        out[q] = Y[j, q]
    for i in range(start, j):
        w = Kpp[j, i]
        for q in range(m):
            out[q] += w * U[i, q]


@njit(cache=True, nogil=True)
def finish_projections(Y, U, Kpp, start, stop):
    """Bring ``Y[stop:]`` up to date with the column updates ``U[start:stop]`` (before a fold)."""
    m = Y.shape[1]
    for j in range(stop, Y.shape[0]):
        for i in range(start, stop):
            w = Kpp[j, i]
            for q in range(m):
                Y[j, q] += w * U[i, q]


# ---------------------------------------------------------------------------------------------
# SMD's per-step pieces


@njit(cache=True, nogil=True)
def smd_log_gain(rho, y, z, gab, mu, out):
    """Eq. 16 with SMD's safeguard: ``out = ρ + max(μ (y ⊙ z − diag(L · C Bᵀ)), log ½)``,
    ``L = tril(y yᵀ)``, ``gab = C Bᵀ``: a step multiplies each gain ``e^ρ`` by at least ½ (the
    multiplicative form's ``max(½, 1 + μ …)``, in the log-gains Algorithm 1 adapts)."""
    r = rho.shape[0]
    for i in range(r):
        s = 0.0
        for k in range(i + 1):
            s += y[k] * gab[k, i]
        out[i] = rho[i] + max(mu * (y[i] * z[i] - y[i] * s), LOG_HALF)


@njit(cache=True, nogil=True)
def smd_gram_update(gaa, gab, a, cb, y, z, kappa, xi):
    """The recurrences of ``G_AA = A K' Aᵀ`` and ``G_AB = A K' Bᵀ`` over one SMD step, in place.

    ``G_AA ← M G_AA Mᵀ + (M y) c_Aᵀ + c_A (M y)ᵀ + κ c_A c_Aᵀ``
    ``G_AB ← M G_AA N_Aᵀ + M G_AB N_Bᵀ + (M y) c_Bᵀ + c_A (N_A y + N_B z)ᵀ + κ c_A c_Bᵀ``
    with ``κ = K'[p, p]`` (coordinator-math.md §3).
    """
    r = a.shape[0]
    mgaa = np.empty((r, r))
    mgab = np.empty((r, r))
    apply_m(gaa, a, y, mgaa)
    apply_m(gab, a, y, mgab)
    my = np.empty(r)
    nay_nbz = np.empty(r)
    acc_yy = 0.0
    acc_zy = 0.0
    for i in range(r):
        acc_yy += y[i] * y[i]
        acc_zy += z[i] * y[i]
        my[i] = y[i] - a[i] * acc_yy
        # N_A y = −c_B Σ y_k y_k − ξ a Σ z_k y_k ;  N_B z = ξ (z − a Σ y_k z_k)
        nay_nbz[i] = -cb[i] * acc_yy - xi * a[i] * acc_zy + xi * (z[i] - a[i] * acc_zy)
    apply_m(mgaa.T, a, y, gaa.T)     # right products, Mᵀ: M on the transposes
    apply_m(mgab.T, a, y, mgab.T)
    apply_na_right(mgaa, a, cb, y, z, xi, mgaa)
    for i in range(r):
        for k in range(r):
            gaa[i, k] += my[i] * a[k] + a[i] * my[k] + kappa * a[i] * a[k]
            gab[i, k] = (mgaa[i, k] + xi * mgab[i, k] + my[i] * cb[k] + a[i] * nay_nbz[k]
                         + kappa * a[i] * cb[k])


# ---------------------------------------------------------------------------------------------
# A cheap upper bound on cond(T): the exact O(m³) test only where the bound could pass the limit

BOUND_SLACK = 1e-6        # the exact test runs once the bound is within this of the limit


@njit(cache=True, nogil=True)
def _m_norms(a, y):
    """``λ = ‖tril(a yᵀ)‖₁`` (so ``‖M‖₁ ≤ 1 + λ`` and, for ``λ < 1``, ``‖M⁻¹‖₁ ≤ 1/(1 − λ)``)."""
    r = a.shape[0]
    lam = 0.0
    suffix = 0.0
    for k in range(r - 1, -1, -1):
        suffix += abs(a[k])
        lam = max(lam, abs(y[k]) * suffix)
    return lam


@njit(cache=True, nogil=True)
def m_cond_bound(a, y):
    """An upper bound on ``cond₁(M)``, ``M = I − tril(a yᵀ)`` (``inf`` where it gives none)."""
    lam = _m_norms(a, y)
    if not lam < 1.0:
        return np.inf
    return (1.0 + lam) / (1.0 - lam)


@njit(cache=True, nogil=True)
def g_cond_bound(a, cb, y, z, xi):
    """An upper bound on ``cond₁(G)`` of an SMD step, ``G = [[M, 0], [N_A, ξ M]]``:
    ``‖G‖₁ ≤ max(1 + λ + ν, ξ (1 + λ))`` and ``‖G⁻¹‖₁ ≤ max(μ + μ² ν / ξ, μ / ξ)`` with
    ``λ = ‖M − I‖₁``, ``μ = 1/(1 − λ) ≥ ‖M⁻¹‖₁`` and ``ν ≥ ‖N_A‖₁`` (``inf`` where ``λ ≥ 1``)."""
    r = a.shape[0]
    lam = _m_norms(a, y)
    if not lam < 1.0 or not xi > 0.0:
        return np.inf
    nu = 0.0
    s_cb = 0.0
    s_a = 0.0
    for k in range(r - 1, -1, -1):
        s_cb += abs(cb[k])
        s_a += abs(a[k])
        nu = max(nu, abs(y[k]) * s_cb + xi * abs(z[k]) * s_a)
    mu = 1.0 / (1.0 - lam)
    norm = max(1.0 + lam + nu, xi * (1.0 + lam))
    inv = max(mu + mu * mu * nu / xi, mu / xi)
    return norm * inv


@njit(cache=True, nogil=True)
def cond_exceeds(Tn, bound, step_bound, cond_limit):
    """Whether ``cond₁(Tn) > cond_limit``, as :func:`cond_lower` decides it, computing it only
    where ``bound[0] · step_bound`` (an upper bound: ``cond(G T) ≤ cond(G) cond(T)``) comes
    within :data:`BOUND_SLACK` of the limit. ``bound[0]`` becomes the bound for ``Tn`` (the
    exact value where it was computed); the caller keeps it only if the step is taken."""
    nb = bound[0] * step_bound
    if nb > cond_limit * (1.0 - BOUND_SLACK) or np.isnan(nb):
        c = cond_lower(Tn)
        if c > cond_limit:
            return True, c
        nb = c * (1.0 + BOUND_SLACK)
    return False, nb


# ---------------------------------------------------------------------------------------------
# Numerical guards


@njit(cache=True, nogil=True)
def projection_problem(y, a, kappa, before):
    """Guard code and component for ``y = A k'_p`` and, unless ``before``, ``y⁺ = M y + κ a``."""
    r = y.shape[0]
    bound2 = RUNAWAY * RUNAWAY * kappa
    acc = 0.0
    for i in range(r):
        v = y[i]
        if not before:
            acc += v * v                     # (M y)_i = y_i − a_i Σ_{k≤i} y_k²
            v = v - a[i] * acc + kappa * a[i]
        if not np.isfinite(v):
            return GUARD_A, i
        if kappa > 0.0 and v * v > bound2:
            return GUARD_A_RUNAWAY, i
    return GUARD_OK, -1


@njit(cache=True, nogil=True)
def lower_nonfinite(T):
    """Whether the lower triangle of ``T`` holds a non-finite value."""
    for i in range(T.shape[0]):
        for k in range(i + 1):
            if not np.isfinite(T[i, k]):
                return True
    return False


@njit(cache=True, nogil=True)
def all_finite(X):
    """Whether every entry of the 2-d ``X`` is finite."""
    for i in range(X.shape[0]):
        for k in range(X.shape[1]):
            if not np.isfinite(X[i, k]):
                return False
    return True


# ---------------------------------------------------------------------------------------------
# Worker-side replicas of S̃ and C̃ (coordinator-math.md §4)


#: the columns :func:`lower_times` sums at a time (its buffer and theirs in the L1 cache)
FOLD_COLUMNS = 64


@njit(cache=True, nogil=True)
def add_columns(S, lo, hi, index, delta):
    """``S[:, p - lo] += delta[j]`` for each ``p = index[j]`` with ``lo ≤ p < hi`` (a message's
    column updates on a replica of columns ``lo:hi``; ``index`` holds distinct positions)."""
    for j in range(index.shape[0]):
        p = index[j]
        if lo <= p < hi:
            for i in range(S.shape[0]):
                S[i, p - lo] += delta[j, i]


@njit(cache=True, nogil=True)
def lower_times(T, X):
    """``X ← T X`` in place (``T`` lower triangular, ``m×m``; ``X`` ``m×n``), each entry summed
    over ``k = 0 … i`` in that order: the same bits for any ``n`` (no fast-math reassociation:
    the vector lanes are columns, never terms of one sum).

    :data:`FOLD_COLUMNS` columns at a time into a small buffer, then copied back: ``T``, the
    columns and their sums stay in the first-level cache, where a whole row of sums at a time
    streamed all of ``X`` through memory once per row of ``T`` (at ``m = 40``, beside it in one
    run: 1.5–2.4× faster at ``n = 2·10⁴``, 5× at ``2·10⁵``; a fold of ``S̃`` and ``C̃`` comes
    every ~690 steps of KHA-SMD at ``ξ = 0.99``)."""
    m, n = X.shape
    out = np.empty((m, FOLD_COLUMNS))
    for c in range(0, n, FOLD_COLUMNS):
        w = min(FOLD_COLUMNS, n - c)
        for i in range(m):
            o = out[i, :w]
            o[:] = 0.0
            for k in range(i + 1):
                t = T[i, k]
                x = X[k, c:c + w]
                for j in range(w):
                    o[j] += t * x[j]
        for i in range(m):
            X[i, c:c + w] = out[i, :w]
