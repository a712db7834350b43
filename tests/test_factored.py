"""The factored engine (coordinator-math.md §3) against the per-step reference form.

The oracle is :mod:`dkha.solvers.reference` driven through ``BatchKHA(engine="reference")`` on a
dense ``K'`` of 300 digits computed here with NumPy; blocks ``rows = K'[P, :]`` go straight into
:class:`~dkha.solvers.batch.BatchKHA` (no Dask). Each compiled function of
:mod:`dkha.solvers.compiled` is also checked against a plain NumPy twin written here.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from dkha import schedule
from dkha.algorithms import SMD
from dkha.data.checkpoint import state_from_arrays, state_to_arrays
from dkha.errors import NumericalError, ParameterError
from dkha.solvers import compiled
from dkha.solvers.batch import BatchKHA, default_eta0, initial_coefficients
from dkha.solvers.updates.gha import kha_block_logged
from dkha.solvers.updates.smd import smd_block_logged

R = 8
PASSES = 3
ALGORITHMS = ("kha", "kha-t", "kha-et", "kha-smd")
MU = 0.2
XI = 0.99


def rel_err(got, want):
    return np.abs(np.asarray(got) - want).max() / np.abs(want).max()


@pytest.fixture(scope="module")
def kc(digits, dense_centered):
    """``K'`` (300×300) of the digits subset, gaussian kernel σ = 4."""
    return dense_centered(np.array(digits), "gaussian", sigma=4.0)[1]


def run(kc, algorithm, engine, block_rows=37, seed=3, passes=PASSES, fold_condition=1e3,
        after_block=None):
    """``passes`` passes of ``algorithm`` over ``kc``; ``block_rows`` an int or a cycle of sizes."""
    l = kc.shape[0]
    solver = BatchKHA(algorithm, R, l, eta0=default_eta0(algorithm, warm=False), mu=MU, xi=XI,
                      engine=engine, fold_condition=fold_condition)
    A = initial_coefficients(R, l, schedule.init_generator(seed))
    solver.start(A, C=A @ kc if solver.needs_projection else None)
    sizes = itertools.cycle([block_rows] if np.isscalar(block_rows) else block_rows)
    for k in range(passes):
        solver.begin_pass()
        perm = schedule.pass_permutation(seed, k, l)
        pos = 0
        while pos < l:
            idx = perm[pos:pos + next(sizes)]
            solver.apply_block(idx, kc[idx])
            pos += len(idx)
            if after_block is not None:
                after_block(solver)
    assert solver.state.t == passes * l
    return solver


def snapshot(solver):
    st = solver.state
    return {name: None if getattr(st, name) is None else np.array(getattr(st, name))
            for name in ("A", "B", "C", "rho", "lam")}


@pytest.fixture(scope="module")
def reference_runs(kc):
    """The oracle's state after the passes, per algorithm (it does not depend on block sizes)."""
    return {a: snapshot(run(kc, a, "reference", block_rows=1000)) for a in ALGORITHMS}


def assert_agrees(got, want, tol=1e-9):
    for name, w in want.items():
        if w is None:
            assert got[name] is None, name
        else:
            assert rel_err(got[name], w) < tol, (name, rel_err(got[name], w))


# --- the engine against the reference form ------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("block_rows", [1, 37, 128, 300, (1, 5, 64, 2, 111)],
                         ids=["1", "37", "128", "300", "mixed"])
def test_factored_matches_reference(kc, reference_runs, algorithm, block_rows):
    solver = run(kc, algorithm, "factored", block_rows=block_rows)
    got, want = snapshot(solver), reference_runs[algorithm]
    assert_agrees(got, want)
    if algorithm == "kha-smd":
        # the log-gains moved: eq. 16 really ran, and its Gram recurrences with it
        assert np.abs(want["rho"]).max() > 0.1
        assert np.abs(got["rho"] - want["rho"]).max() < 1e-9 * np.abs(want["rho"]).max()


@pytest.mark.parametrize("algorithm", ("kha-et", "kha-smd"))
@pytest.mark.parametrize("fold_condition", [0.0, 2.0, 1e3, np.inf])
def test_fold_paths_match_reference(kc, reference_runs, algorithm, fold_condition):
    """0: every step taken directly (T stays I); 2: a fold every few steps, mid-block; ∞: folds
    only at pass starts. All reproduce the reference."""
    fresh_after_block = []
    solver = run(kc, algorithm, "factored", block_rows=64, fold_condition=fold_condition,
                 after_block=lambda s: fresh_after_block.append(s.state._fresh))
    assert_agrees(snapshot(solver), reference_runs[algorithm])
    mid_pass_folds = solver.state.folds - (PASSES - 1)
    if fold_condition == 0.0:
        assert all(fresh_after_block) and solver.state.folds == 0
    elif fold_condition == 2.0:
        assert mid_pass_folds > 20
    elif fold_condition == np.inf:
        assert mid_pass_folds == 0


def test_reading_the_state_does_not_perturb_the_run(kc):
    quiet = run(kc, "kha-smd", "factored")
    reads = []
    watched = run(kc, "kha-smd", "factored",
                  after_block=lambda s: reads.append(s.A.sum() + s.state.B.sum()))
    for name in ("A", "B", "C", "rho"):
        np.testing.assert_array_equal(getattr(watched.state, name), getattr(quiet.state, name))
    assert len(reads) > 10
    with pytest.raises(ValueError):
        watched.A[0, 0] = 1.0           # a snapshot, read-only


def test_block_gains_are_base_gains(kc):
    for algorithm in ALGORITHMS:
        solver = run(kc, algorithm, "factored", passes=1)
        solver.begin_pass()
        t = solver.state.t
        want = np.array([solver.base_gain(t + j) for j in range(9)])
        np.testing.assert_array_equal(solver.block_gains(t, 9), want)


@pytest.mark.parametrize("engine", ["factored", "reference"])
def test_divergence_raises(kc, engine):
    solver = BatchKHA("kha", R, kc.shape[0], eta0=1e6, engine=engine, on_divergence="stop")
    solver.start(initial_coefficients(R, kc.shape[0], np.random.default_rng(0)))
    solver.begin_pass()
    with pytest.raises(NumericalError, match="diverged"), np.errstate(all="ignore"):
        for k in range(10):
            idx = np.arange(30 * k, 30 * k + 30)
            solver.apply_block(idx, kc[idx])


def test_unknown_engine():
    with pytest.raises(ParameterError, match="engine"):
        BatchKHA("kha", 2, 10, eta0=0.1, engine="fast")


# --- the compiled functions against plain NumPy twins --------------------------------------------


@pytest.fixture()
def rng(seed):
    return np.random.default_rng(seed)


def m_matrix(a, y):
    return np.eye(len(a)) - np.tril(np.outer(a, y))


def na_matrix(a, cb, y, z, xi):
    return -np.tril(np.outer(cb, y)) - xi * np.tril(np.outer(a, z))


def g_matrix(a, cb, y, z, xi):
    M = m_matrix(a, y)
    return np.block([[M, np.zeros_like(M)], [na_matrix(a, cb, y, z, xi), xi * M]])


def vectors(rng, r):
    return [rng.standard_normal(r) for _ in range(4)]


def test_apply_m(rng):
    a, y, _, _ = vectors(rng, 6)
    X = rng.standard_normal((6, 11))
    out = np.empty_like(X)
    compiled.apply_m(X, a, y, out)
    np.testing.assert_allclose(out, m_matrix(a, y) @ X, rtol=1e-13, atol=1e-13)
    compiled.apply_m(X, a, y, X)            # in place
    np.testing.assert_allclose(X, out, rtol=1e-15, atol=0)


def test_apply_g(rng):
    a, cb, y, z = vectors(rng, 5)
    X = rng.standard_normal((10, 7))
    want = g_matrix(a, cb, y, z, XI) @ X
    compiled.apply_g(X, a, cb, y, z, XI, X)
    np.testing.assert_allclose(X, want, rtol=1e-13, atol=1e-13)


def test_apply_right(rng):
    a, cb, y, z = vectors(rng, 6)
    X = rng.standard_normal((4, 6))
    out = np.empty_like(X)
    compiled.apply_m(X.T, a, y, out.T)
    np.testing.assert_allclose(out, X @ m_matrix(a, y).T, rtol=1e-13, atol=1e-13)
    compiled.apply_na_right(X, a, cb, y, z, XI, out)
    np.testing.assert_allclose(out, X @ na_matrix(a, cb, y, z, XI).T, rtol=1e-13, atol=1e-13)


def test_lower_triangular_helpers(rng):
    n = 9
    T = np.tril(rng.standard_normal((n, n))) + 3 * np.eye(n)
    T_full = T + np.triu(rng.standard_normal((n, n)), 1)   # the upper triangle must not be read
    x = rng.standard_normal(n)
    out = np.empty(n)
    compiled.lower_matvec(T_full, x, out)
    np.testing.assert_allclose(out, T @ x, rtol=1e-14)
    compiled.solve_lower(T_full, x, out)
    np.testing.assert_allclose(out, solve_triangular(T, x, lower=True), rtol=1e-13)
    assert compiled.cond_lower(T_full) == pytest.approx(np.linalg.cond(T, 1), rel=1e-12)
    T[4, 4] = 0.0
    assert compiled.cond_lower(T) == np.inf


def test_projection_corrections(rng):
    b, m, start = 12, 6, 3
    Y, U = rng.standard_normal((b, m)), rng.standard_normal((b, m))
    Kpp = rng.standard_normal((b, b))
    out = np.empty(m)
    compiled.corrected_projection(Y, U, Kpp, 8, start, out)
    np.testing.assert_allclose(out, Y[8] + Kpp[8, start:8] @ U[start:8], rtol=1e-14)
    want = Y[8:] + Kpp[8:, start:8] @ U[start:8]
    compiled.finish_projections(Y, U, Kpp, start, 8)
    np.testing.assert_allclose(Y[8:], want, rtol=1e-14)


def test_smd_log_gain(rng):
    r = 7
    rho, y, z, _ = vectors(rng, r)
    gab = rng.standard_normal((r, r))
    out = np.empty(r)
    compiled.smd_log_gain(rho, y, z, gab, MU, out)
    L = np.tril(np.outer(y, y))
    np.testing.assert_allclose(out, rho + np.maximum(MU * (y * z - np.diag(L @ gab)),
                                                     np.log(0.5)), rtol=1e-14)


def test_smd_gram_update_follows_the_definitions(rng):
    """``G_AA = A K' Aᵀ``, ``G_AB = A K' Bᵀ`` after one step of eqs. 21 and 15, densely."""
    r, l, p = 5, 30, 11
    F = rng.standard_normal((l, 8))
    K = F @ F.T
    A, B = rng.standard_normal((r, l)) * 0.1, rng.standard_normal((r, l)) * 0.1
    y, z = A @ K[p], B @ K[p]
    d = rng.uniform(0.01, 0.1, r)
    a, cb = d * y, d * (y + XI * z)
    G = g_matrix(a, cb, y, z, XI)
    S = G @ np.vstack([A, B])
    S[:, p] += np.concatenate([a, cb])
    A1, B1 = S[:r], S[r:]
    gaa, gab = A @ K @ A.T, A @ K @ B.T
    compiled.smd_gram_update(gaa, gab, a, cb, y, z, K[p, p], XI)
    np.testing.assert_allclose(gaa, A1 @ K @ A1.T, rtol=1e-12, atol=1e-12 * np.abs(gaa).max())
    np.testing.assert_allclose(gab, A1 @ K @ B1.T, rtol=1e-12, atol=1e-12 * np.abs(gab).max())


def twin_block(T, S, C, gaa, gab, rho, rows, Y, U, Kpp, index, eta, mu, xi, start, fresh,
               cond_limit):
    """A plain NumPy transcription of ``kha_block_logged`` (``rho is None``) and
    ``smd_block_logged``, without a log of direct steps."""
    smd = rho is not None
    m = T.shape[0]
    r = m // 2 if smd else m
    for j in range(start, len(index)):
        p = index[j]
        yz = T @ (Y[j] + Kpp[j, start:j] @ U[start:j])
        y = yz[:r]
        if smd:
            z = yz[r:]
            rho_new = rho + np.maximum(mu * (y * z - np.diag(np.tril(np.outer(y, y)) @ gab)),
                                       np.log(0.5))
            d = np.exp(rho_new) * eta[j]
            a, cb = d * y, d * (y + xi * z)
            G, c = g_matrix(a, cb, y, z, xi), np.concatenate([a, cb])
        else:
            a = eta[j] * y
            G, c = m_matrix(a, y), a
        Tn = G @ T
        if np.linalg.cond(Tn, 1) > cond_limit and not fresh:
            Y[j:] += Kpp[j:, start:j] @ U[start:j]
            return j, True, fresh, 0, -1
        if smd:
            rho[:] = rho_new
            M, NA = m_matrix(a, y), na_matrix(a, cb, y, z, xi)
            kappa = Kpp[j, j]
            gaa_new = (M @ gaa @ M.T + np.outer(M @ y, a) + np.outer(a, M @ y)
                       + kappa * np.outer(a, a))
            gab[:] = (M @ gaa @ NA.T + xi * M @ gab @ M.T + np.outer(M @ y, cb)
                      + np.outer(a, NA @ y + xi * M @ z) + kappa * np.outer(a, cb))
            gaa[:] = gaa_new
        if np.linalg.cond(Tn, 1) > cond_limit:          # fresh: the direct step
            S[:] = G @ S
            S[:, p] += c
            if C.shape[0]:
                C[:] = m_matrix(a, y) @ C + np.outer(a, rows[j])
                U[:j, :r] = U[:j, :r] @ m_matrix(a, y).T     # pending C̃ updates, carried
            Y[j + 1:] = Y[j + 1:] @ G.T + np.outer(Kpp[j + 1:, j], c)
            U[j] = 0.0
            continue
        T[:] = Tn
        U[j] = solve_triangular(T, c, lower=True)
        S[:, p] += U[j]
        fresh = False
    return len(index), False, fresh, 0, -1


@pytest.fixture(scope="module")
def mid_run(kc):
    """Solvers one pass into a run (kha-et and kha-smd), for realistic block inputs."""
    return {smd: run(kc, "kha-smd" if smd else "kha-et", "factored", passes=1)
            for smd in (False, True)}


@pytest.mark.parametrize("smd", [False, True], ids=["kha", "smd"])
@pytest.mark.parametrize("cond_limit", [0.0, 1.5, 1e3])
@pytest.mark.parametrize("fresh", [True, False])
def test_block_loops_match_twin(kc, mid_run, rng, smd, cond_limit, fresh):
    solver = mid_run[smd]
    solver.begin_pass()
    st = solver.state
    l, b, start = kc.shape[0], 40, 3
    m = 2 * R if smd else R
    index = rng.permutation(l)[:b]
    rows = np.ascontiguousarray(kc[index])
    # a factored state S = T S̃ of the true values, T = I or a lower-triangular T
    S_true = np.vstack([st.A, st.B]) if smd else np.array(st.A)
    T = np.eye(m) if fresh else np.tril(rng.standard_normal((m, m))) * 0.05 + np.eye(m)
    S = np.ascontiguousarray(solve_triangular(T, S_true, lower=True))
    C = np.ascontiguousarray(solve_triangular(T[:R, :R], st.C, lower=True))
    gaa = np.ascontiguousarray(st.C @ st.A.T)
    gab = np.ascontiguousarray(st.C @ st.B.T) if smd else np.zeros((R, R))
    rho = st.rho.copy() if smd else None
    Y = rows @ S.T
    U = np.zeros((b, m))
    U[:start] = rng.standard_normal((start, m)) * 1e-3 * np.abs(S).max()   # earlier steps
    eta = solver.block_gains(st.t, b)
    Kpp = np.ascontiguousarray(rows[:, index])
    args_c = [T, S, C, gaa, gab, rho, rows, Y, U, Kpp, index, eta, MU, XI, start, fresh, cond_limit]
    args_t = [x.copy() if isinstance(x, np.ndarray) else x for x in args_c]
    want = twin_block(*args_t)
    unlogged = (np.zeros((0, 0)), np.full(1, np.inf))    # no log of direct steps; bound unknown
    if smd:
        got = smd_block_logged(*args_c, *unlogged)
    else:
        got = kha_block_logged(T, S, C, rows, Y, U, Kpp, index, eta, start, fresh, cond_limit,
                               *unlogged)
    assert got == want
    if cond_limit == 1.5:
        assert got[1]                   # a fold was asked for
    for name, g, w in zip(["T", "S", "C", "gaa", "gab", "rho", "_", "Y", "U"], args_c, args_t):
        if isinstance(g, np.ndarray):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12 * np.abs(w).max(), err_msg=name)


def test_fold_gives_the_same_bits_for_any_columns():
    """The coordinator folds all of S̃, each replica its own columns: every column must come out
    the same (a BLAS trmm rounded differently with the width and its threads, so a replica
    rebuilt from the coordinator's S̃ did not match the lost one). Checked against T @ X too."""
    from dkha.solvers.factored import lower_times_inplace

    rng = np.random.default_rng(5)
    T = np.tril(rng.standard_normal((40, 40)))
    X = rng.standard_normal((40, 1001))
    whole = X.copy()
    lower_times_inplace(T, whole)
    assert np.allclose(whole, T @ X, rtol=1e-12, atol=1e-12)
    for lo, hi in [(0, 150), (150, 300), (151, 301), (3, 4), (997, 1001)]:
        part = np.ascontiguousarray(X[:, lo:hi])
        lower_times_inplace(T, part)
        assert np.array_equal(part, whole[:, lo:hi]), (lo, hi)
    sub = X[:20].copy()
    lower_times_inplace(T[:20, :20], sub)       # a non-contiguous corner, as C̃'s fold uses
    assert np.allclose(sub, T[:20, :20] @ X[:20], rtol=1e-12, atol=1e-12)


def test_fold_sums_each_entry_in_one_order():
    """The oracle of the fold's bits: every entry ``Σ_{k ≤ i} T[i, k] X[k, j]`` summed from
    ``k = 0`` up, one rounding a product and a sum (plain Python floats), for widths that are
    and are not multiples of the compiled loop's eight columns."""
    from dkha.solvers.factored import lower_times_inplace

    rng = np.random.default_rng(11)
    for m, n in [(40, 37), (9, 8), (5, 3), (1, 17)]:
        T = np.tril(rng.standard_normal((m, m)))
        X = rng.standard_normal((m, n)) * rng.choice([1e-8, 1.0, 1e8], size=(m, n))
        want = np.empty_like(X)
        for i in range(m):
            for j in range(n):
                acc = 0.0
                for k in range(i + 1):
                    acc += float(T[i, k]) * float(X[k, j])
                want[i, j] = acc
        got = X.copy()
        lower_times_inplace(T, got)
        assert np.array_equal(got, want), (m, n)


@pytest.mark.parametrize("xi", [0.99, 0.5, 1.0])
def test_condition_bounds_hold(rng, xi):
    """The block loops test cond(T) exactly only where the bound cond(T)·cond(G) could pass the
    limit: the step bounds must really bound cond₁ of M and G, from tiny to large gains."""
    r = 6
    checked = 0
    for scale in (1e-4, 1e-2, 0.2, 1.0):
        for _ in range(100):
            a = rng.standard_normal(r) * scale
            cb = rng.standard_normal(r) * scale
            y, z = rng.standard_normal(r), rng.standard_normal(r)
            M = np.empty((r, r))
            compiled.apply_m(np.eye(r), a, y, M)
            bm = compiled.m_cond_bound(a, y)
            assert bm >= compiled.cond_lower(M) * (1 - 1e-12)
            G = np.empty((2 * r, 2 * r))
            compiled.apply_g(np.eye(2 * r), a, cb, y, z, xi, G)
            bg = compiled.g_cond_bound(a, cb, y, z, xi)
            assert bg >= compiled.cond_lower(G) * (1 - 1e-12)
            checked += np.isfinite(bm) + np.isfinite(bg)
    assert checked > 200        # many draws give a finite bound (λ < 1)


@pytest.mark.parametrize("algorithm", ("kha-et", "kha-smd"))
def test_the_condition_bound_changes_no_decision(kc, algorithm):
    """Forgetting the bound before every block (the exact test at the block's first steps) gives
    the same folds and the same bits as keeping it: the bound only saves exact tests."""
    kept = run(kc, algorithm, "factored", block_rows=64, fold_condition=20.0)
    forgot = run(kc, algorithm, "factored", block_rows=64, fold_condition=20.0,
                 after_block=lambda s: s.state.cond_bound.fill(np.inf))
    assert kept.state.folds == forgot.state.folds > 2 * PASSES
    for name in ("A", "B", "C", "rho"):
        want = getattr(forgot.state, name)
        if want is not None:
            np.testing.assert_array_equal(getattr(kept.state, name), want, err_msg=name)


@pytest.mark.parametrize("algorithm", ["kha-et", "kha-smd"])
def test_a_state_checkpointed_before_updates_had_names_goes_on_the_same(kc, algorithm):
    """A factored state saved with ``smd`` (a bool) and no ``update`` name, as states were
    checkpointed before :mod:`dkha.solvers.updates`, reads back as its update and takes the
    next pass to the same bits as the state it was saved from."""
    first, again = (run(kc, algorithm, "factored", passes=1) for _ in range(2))
    arrays, scalars = state_to_arrays(again.state)
    scalars["smd"] = scalars.pop("update") == SMD
    again.state = state_from_arrays(type(again.state), arrays, scalars)
    assert again.state.step_update.name == first.state.step_update.name
    for solver in (first, again):
        solver.begin_pass()
        perm = schedule.pass_permutation(3, 1, kc.shape[0])
        for pos in range(0, len(perm), 37):
            solver.apply_block(perm[pos:pos + 37], kc[perm[pos:pos + 37]])
    for name in ("A", "B", "C", "rho"):
        want, got = getattr(first.state, name), getattr(again.state, name)
        assert (want is None and got is None) or np.array_equal(want, got), name
