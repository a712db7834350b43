"""The batch KHA family: per-step updates against the paper's equations, gains, blocks, schedule.

The oracle here is a literal transcription of Schraudolph, Günter & Vishwanathan (2006): eqs.
9 and 11 for KHA, and for KHA-SMD eq. 16 with ``Γ K' Bᵀ`` formed from the full ``K'``, eq. 20
for ``dΓ``, eq. 19 for ``B`` and eq. 15 for ``A``, with dense matrices (``diag``, ``e_p``, ``lt``)
exactly as printed. BatchKHA is exercised only through ``start``, ``begin_pass``, ``apply_block``,
``.A`` and ``state.t``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dkha import schedule
from dkha.errors import NumericalError
from dkha.solvers.batch import BatchKHA
from dkha.solvers.updates import gha, smd

R = 4
MU = 1.0
XI = 0.99


# --- the paper, literally -----------------------------------------------------------------------


def lt(M):
    """lt(·): zero every element above the diagonal."""
    return np.tril(M)


def unit(l, p):
    e = np.zeros(l)
    e[p] = 1.0
    return e


def paper_kha_step(A, Kc, p, eta):
    """Eq. 7, 9 and 11: ``A + diag(η) Γ`` with ``Γ = y e_pᵀ − lt(y yᵀ) A``."""
    y = A @ Kc[:, p]                                           # (7)
    gamma = np.outer(y, unit(len(Kc), p)) - lt(np.outer(y, y)) @ A  # (9)
    return A + np.diag(eta) @ gamma                            # (11)


def paper_smd_step(A, B, rho, Kc, p, eta, mu, xi, floor=True):
    """Eqs. 16, 19/20 (= 21) and 15, with the full ``K'``; returns new ``A, B, ρ`` and gains.

    ``floor``: SMD's safeguard on eq. 16 (each step multiplies a gain by at least ½)."""
    l = len(Kc)
    kp, e = Kc[:, p], unit(l, p)
    y = A @ kp                                                 # (7)
    gamma = np.outer(y, e) - lt(np.outer(y, y)) @ A            # (9)
    # (16), with SMD's safeguard: each step multiplies a gain by at least 1/2
    rho = rho + np.maximum(mu * np.diag(gamma @ Kc @ B.T), np.log(0.5) if floor else -np.inf)
    gains = np.exp(rho) * eta
    d_gamma = (np.outer(B @ kp, e) - lt(np.outer(y, y)) @ B
               - lt(np.outer(B @ kp, y) + np.outer(y, kp) @ B.T) @ A)  # (20)
    B = xi * B + np.diag(gains) @ (gamma + xi * d_gamma)       # (19)
    A = A + np.diag(gains) @ gamma                             # (15)
    return A, B, rho, gains


def eigenvalue_estimates(A, Kc):
    """Eq. 13: ``λ_i = ‖[A K']_i‖ / ‖A_i‖``."""
    AK = A @ Kc
    return np.array([np.linalg.norm(AK[i]) / np.linalg.norm(A[i]) for i in range(len(A))])


def et_gain(lam, t, l, eta0, kappa=1.0):
    """Eq. 12, ``[η_t]_i = ‖λ‖ / λ_i · l / (t + l) · η̃0``, with dkha's base gain
    ``η̃0 = η0 λ_min / (‖λ‖ κ̄)``: the largest gain is ``η0/κ̄ · l/(t + l)``."""
    base = eta0 * lam.min() / (np.linalg.norm(lam) * kappa)
    return np.linalg.norm(lam) / lam * (l / (t + l)) * base


def kappa_bar(Kc):
    """The gains' unit written out: ``Σ K'_pp² / Σ K'_pp`` over the dense diagonal."""
    d = np.diag(Kc)
    return float(np.sum(d * d) / np.sum(d))


def rel_err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def problem(digits_subset, dense_centered):
    """60 digits (6 per class), gaussian σ = 4: ``K'`` dense."""
    X, _ = digits_subset(6)
    _, Kc = dense_centered(X, "gaussian", sigma=4.0)
    return Kc


@pytest.fixture
def A0(problem, seed):
    l = len(problem)
    return np.random.default_rng(seed).normal(size=(R, l)) / np.sqrt(R * l)


# --- reference steps against the paper ----------------------------------------------------------


def test_reference_step_is_eq_11(problem, A0, seed):
    Kc, l = problem, len(problem)
    rng = np.random.default_rng(seed + 1)
    eta = np.array([0.9, 0.5, 0.3, 0.2])
    A_ref, C_ref, A_lit = A0.copy(), A0 @ Kc, A0.copy()
    for p in rng.integers(0, l, size=40):
        y = gha.per_step(A_ref, int(p), Kc[p].copy(), eta, C_ref)
        np.testing.assert_allclose(y, A_lit @ Kc[:, p], rtol=1e-12)
        A_lit = paper_kha_step(A_lit, Kc, p, eta)
    assert rel_err(A_lit, A0) > 0.1  # it moved
    assert rel_err(A_ref, A_lit) < 1e-12
    assert rel_err(C_ref, A_lit @ Kc) < 1e-12  # eq. 18 keeps C = A K'
    # without C as well
    A2 = A0.copy()
    for p in rng.integers(0, l, size=5):
        A_lit2 = paper_kha_step(A2, Kc, p, eta)
        gha.per_step(A2, int(p), Kc[p].copy(), eta)
        assert rel_err(A2, A_lit2) < 1e-13


@pytest.mark.parametrize("rho0", [0.0, 0.3])
def test_reference_smd_step_is_algorithm_1(problem, A0, seed, rho0):
    Kc, l = problem, len(problem)
    rng = np.random.default_rng(seed + 2)
    eta = et_gain(eigenvalue_estimates(A0, Kc), 0, l, 0.2)
    A, B, C, rho = A0.copy(), np.zeros_like(A0), A0 @ Kc, np.full(R, rho0)
    A_lit, B_lit, rho_lit = A0.copy(), np.zeros_like(A0), np.full(R, rho0)
    for p in rng.integers(0, l, size=60):
        d = smd.per_step(A, B, C, rho, int(p), Kc[p].copy(), eta, MU, XI)
        A_lit, B_lit, rho_lit, d_lit = paper_smd_step(A_lit, B_lit, rho_lit, Kc, p, eta, MU, XI)
        np.testing.assert_allclose(d, d_lit, rtol=1e-11)
    assert np.abs(rho_lit - rho0).max() > 0.05  # SMD's log-gains moved
    assert np.abs(B_lit).max() > 0
    assert rel_err(A, A_lit) < 1e-11
    assert rel_err(B, B_lit) < 1e-11
    assert np.abs(rho - rho_lit).max() < 1e-11
    assert rel_err(C, A_lit @ Kc) < 1e-11  # eq. 18


# --- BatchKHA: gains through its public behaviour -----------------------------------------------


def one_step(algorithm, A, Kc, p, t0, *, eta0, rho0=0.0, feature_norm=1.0):
    solver = BatchKHA(algorithm, R, len(Kc), eta0=eta0, mu=MU, xi=XI, rho0=rho0,
                      feature_norm=feature_norm)
    solver.start(A, C=A @ Kc, t=t0)
    solver.begin_pass()
    solver.apply_block(np.array([p]), Kc[[p]])
    assert solver.state.t == t0 + 1
    return solver.A


@pytest.mark.parametrize("t0", [0, 17, 250])
def test_gain_kha_is_constant(problem, A0, t0):
    kappa = kappa_bar(problem)
    got = one_step("kha", A0, problem, 11, t0, eta0=0.05, feature_norm=kappa)
    want = paper_kha_step(A0, problem, 11, np.full(R, 0.05 / kappa))
    assert rel_err(got, want) < 1e-13


@pytest.mark.parametrize("t0", [0, 17, 250])
def test_gain_kha_t_decays(problem, A0, t0):
    l = len(problem)
    kappa = kappa_bar(problem)
    got = one_step("kha-t", A0, problem, 11, t0, eta0=0.5, feature_norm=kappa)
    want = paper_kha_step(A0, problem, 11, np.full(R, 0.5 / kappa * l / (t0 + l)))
    assert rel_err(got, want) < 1e-13
    if t0:  # and is not the constant gain
        assert rel_err(got, paper_kha_step(A0, problem, 11, np.full(R, 0.5 / kappa))) > 1e-3


@pytest.mark.parametrize("t0", [0, 17, 250])
def test_gain_kha_et_is_eq_12(problem, A0, t0):
    Kc, l = problem, len(problem)
    lam = eigenvalue_estimates(A0, Kc)
    assert lam.max() / lam.min() > 1.05  # the gains differ per component
    kappa = kappa_bar(Kc)
    got = one_step("kha-et", A0, Kc, 11, t0, eta0=0.2, feature_norm=kappa)
    want = paper_kha_step(A0, Kc, 11, et_gain(lam, t0, l, 0.2, kappa))
    assert rel_err(got, want) < 1e-12
    # the largest gain is η0/κ̄ · l/(t + l), that of the component with the smallest λ
    gains = et_gain(lam, t0, l, 0.2, kappa)
    assert gains.max() == pytest.approx(0.2 / kappa * l / (t0 + l), rel=1e-14)
    assert np.argmax(gains) == np.argmin(lam)


@pytest.mark.parametrize("rho0", [0.0, 0.7])
def test_gain_kha_smd_first_step(problem, A0, rho0):
    """B₁ = 0, so the first step's gains are ``e^{ρ0} η`` with η by eq. 12."""
    Kc, l = problem, len(problem)
    eta = et_gain(eigenvalue_estimates(A0, Kc), 40, l, 0.2)
    got = one_step("kha-smd", A0, Kc, 11, 40, eta0=0.2, rho0=rho0)
    A_lit, _, _, gains = paper_smd_step(A0, np.zeros_like(A0), np.full(R, rho0), Kc, 11, eta,
                                        MU, XI)
    np.testing.assert_allclose(gains, np.exp(rho0) * eta, rtol=1e-14)
    assert rel_err(got, A_lit) < 1e-12


# --- BatchKHA over blocks against the reference steps one by one --------------------------------


def reference_run(algorithm, A0, Kc, n_steps, run_seed, *, eta0, rho0=0.0, kappa=1.0):
    """Reference steps one at a time over the schedule; λ (eq. 13) from the exact A K' at the
    first step of each pass. Returns A and (for SMD) the log-gains."""
    l = len(Kc)
    A = A0.copy()
    C = A0 @ Kc
    B = np.zeros_like(A0)
    rho = np.full(R, rho0)
    order = np.concatenate([schedule.pass_permutation(run_seed, k, l)
                            for k in range(-(-n_steps // l))])[:n_steps]
    lam = None
    for t, p in enumerate(order):
        if t % l == 0:
            lam = eigenvalue_estimates(A, Kc)
        if algorithm == "kha":
            eta = np.full(R, eta0 / kappa)
        elif algorithm == "kha-t":
            eta = np.full(R, eta0 / kappa * l / (t + l))
        else:
            eta = et_gain(lam, t, l, eta0, kappa)
        if algorithm == "kha-smd":
            smd.per_step(A, B, C, rho, int(p), Kc[p].copy(), eta, MU / kappa, XI)
        else:
            gha.per_step(A, int(p), Kc[p].copy(), eta, C)
    return A, rho


@pytest.mark.parametrize("block_rows", [7, 60])
@pytest.mark.parametrize("algorithm,eta0", [("kha", 0.05), ("kha-t", 0.5), ("kha-et", 0.2),
                                            ("kha-smd", 0.2)])
def test_batch_blocks_match_reference_steps(problem, A0, seed, algorithm, eta0, block_rows):
    Kc, l = problem, len(problem)
    n_steps = 150  # two and a half passes
    rho0 = 0.1
    kappa = kappa_bar(Kc)     # η0 and μ in units of κ̄, written out in the reference
    solver = BatchKHA(algorithm, R, l, eta0=eta0, mu=MU, xi=XI, rho0=rho0, feature_norm=kappa)
    solver.start(A0, C=A0 @ Kc)
    current = -1
    for k, first, idx in schedule.blocks(seed, l, n_steps, block_rows):
        assert first == solver.state.t
        if k != current:
            solver.begin_pass()
            current = k
        solver.apply_block(idx, Kc[idx])
    assert solver.state.t == n_steps

    want, rho = reference_run(algorithm, A0, Kc, n_steps, seed, eta0=eta0, rho0=rho0,
                              kappa=kappa)
    assert rel_err(want, A0) > 0.1
    if algorithm == "kha-smd":
        assert np.abs(rho - rho0).max() > 0.05
    assert rel_err(solver.A, want) < 1e-10


def test_batch_resumes_at_t(problem, A0, seed):
    """Splitting a run (start again from the state at step t) gives the same result."""
    Kc, l = problem, len(problem)
    full = BatchKHA("kha-t", R, l, eta0=0.5)
    full.start(A0)
    blocks = list(schedule.blocks(seed, l, 90, 16))
    for k, first, idx in blocks:
        if first % l == 0:
            full.begin_pass()
        full.apply_block(idx, Kc[idx])
    head = BatchKHA("kha-t", R, l, eta0=0.5)
    head.start(A0)
    for k, first, idx in schedule.blocks(seed, l, 45, 16):
        if first % l == 0:
            head.begin_pass()
        head.apply_block(idx, Kc[idx])
    tail = BatchKHA("kha-t", R, l, eta0=0.5)
    tail.start(head.A, t=45)
    for k, first, idx in schedule.blocks(seed, l, 90, 16, start_step=45):
        if first % l == 0:
            tail.begin_pass()
        tail.apply_block(idx, Kc[idx])
    assert tail.state.t == 90
    assert rel_err(tail.A, full.A) < 1e-12


def test_divergence_is_reported(problem, A0):
    Kc = problem
    solver = BatchKHA("kha", R, len(Kc), eta0=1e8, on_divergence="stop")
    solver.start(A0 * 100)
    with np.errstate(all="ignore"), pytest.raises(NumericalError, match="lower eta0"):
        idx = np.arange(len(Kc))
        solver.begin_pass()
        solver.apply_block(idx, Kc[idx])


# --- the schedule -------------------------------------------------------------------------------


@pytest.mark.parametrize("l,n_steps,block_rows", [(50, 125, 16), (50, 100, 50), (7, 30, 3)])
def test_schedule_covers_each_sample_once_per_pass(l, n_steps, block_rows, seed):
    out = list(schedule.blocks(seed, l, n_steps, block_rows))
    steps = 0
    per_pass: dict[int, list] = {}
    for k, first, idx in out:
        assert first == steps  # consecutive, no gaps
        assert 1 <= len(idx) <= block_rows
        assert first // l == k and (first + len(idx) - 1) // l == k  # never straddles a pass
        per_pass.setdefault(k, []).extend(idx.tolist())
        steps += len(idx)
    assert steps == n_steps
    n_full, rest = divmod(n_steps, l)
    for k in range(n_full):
        assert sorted(per_pass[k]) == list(range(l))
    if rest:
        last = per_pass[n_full]
        assert len(last) == rest and len(set(last)) == rest and max(last) < l
    # passes are different permutations
    assert per_pass[0] != per_pass[1]


def test_schedule_is_reproducible(seed):
    def flat(s, start=0, n=300):
        return np.concatenate([i for _, _, i in schedule.blocks(s, 100, n, 32, start_step=start)])

    a = flat(seed)
    np.testing.assert_array_equal(a, flat(seed))
    assert not np.array_equal(a, flat(seed + 1))
    # any step can be regenerated on its own: a resumed schedule is the tail of the full one
    np.testing.assert_array_equal(flat(seed, start=137), a[137:])
    # and the block size does not change the order
    np.testing.assert_array_equal(
        np.concatenate([i for _, _, i in schedule.blocks(seed, 100, 300, 7)]), a)
