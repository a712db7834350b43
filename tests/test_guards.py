"""Numerical guards within a step, and SMD's gain safeguard.

The oracle is written out here: the paper's steps (tests/test_solvers.py's literal transcriptions)
replayed one at a time with the definition of a bad step checked densely after each — a
non-finite value, a projection ``|y_i| = |(A k'_p)_i| > 1e6 √K'_pp`` before or after the step
(component ``i``'s feature-space norm then exceeds 1e6; KHA converges to unit norms), or a gain
factor ``e^{ρ_i} > 1e6``. The fit must stop at exactly that step, with the compiled factored engine
and with the per-step reference engine.
"""

from __future__ import annotations

import os
import re
import subprocess
import warnings

import numpy as np
import pytest

from dkha import config, schedule
from dkha.errors import NumericalError
from dkha.solvers.batch import BatchKHA, initial_coefficients
from tests.processes import dkha_command, subprocess_env
from tests.test_online import online_digits  # noqa: F401  (a fixture)
from tests.test_solvers import eigenvalue_estimates, et_gain, paper_kha_step, paper_smd_step

R = 4
XI = 0.99
BOUND = 1e6


@pytest.fixture(scope="module")
def kc(digits_subset, dense_centered):
    X, _ = digits_subset(10)
    return dense_centered(X, "gaussian", sigma=4.0)[1]


@pytest.fixture(scope="module")
def kc60(digits_subset, dense_centered):
    X, _ = digits_subset(6)
    return dense_centered(X, "gaussian", sigma=4.0)[1]


def first_bad_step(Kc, algorithm, eta0, mu, rho0, passes):
    """The oracle: 1-based step of the first bad step of the paper's per-step form, or None."""
    l = len(Kc)
    A = initial_coefficients(R, l, schedule.init_generator(0))
    B, rho = np.zeros_like(A), np.full(R, rho0)

    def runaway(y, kappa):
        return not np.isfinite(y).all() or np.any(y**2 > BOUND**2 * kappa)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for t in range(passes * l):
            k, pos = divmod(t, l)
            if pos == 0:
                lam = eigenvalue_estimates(A, Kc)
            p = schedule.pass_permutation(0, k, l)[pos]
            kappa = Kc[p, p]
            if runaway(A @ Kc[:, p], kappa):
                return t + 1
            if algorithm == "kha":
                A = paper_kha_step(A, Kc, p, np.full(R, eta0))
            else:
                A, B, rho, gains = paper_smd_step(A, B, rho, Kc, p, et_gain(lam, t, l, eta0),
                                                  mu, XI)
                if not np.isfinite(B @ Kc[:, p]).all() or not np.isfinite(gains).all() \
                        or np.any(rho > np.log(BOUND)):
                    return t + 1
            if runaway(A @ Kc[:, p], kappa) or not np.isfinite(A).all():
                return t + 1
    return None


def fit(Kc, algorithm, engine, *, eta0, mu=0.2, rho0=0.0, passes=3, block=16,
        on_divergence="stop"):
    l = len(Kc)
    solver = BatchKHA(algorithm, R, l, eta0=eta0, mu=mu, xi=XI, rho0=rho0, engine=engine,
                      on_divergence=on_divergence)
    A = initial_coefficients(R, l, schedule.init_generator(0))
    solver.start(A, C=A @ Kc if solver.needs_projection else None)
    for _, t, idx in schedule.blocks(0, l, passes * l, block):
        if t % l == 0:
            solver.begin_pass()
        solver.apply_block(idx, Kc[idx])
    return solver


@pytest.mark.parametrize("algorithm,eta0,mu,what", [
    ("kha", 5.0, 0.0, "runaway growth: component"),          # a gain far too large
    ("kha-smd", 2.0, 50.0, "runaway growth of the gain"),    # a meta-gain far too large
])
def test_a_diverging_gain_stops_at_its_first_bad_step(kc, algorithm, eta0, mu, what):
    want = first_bad_step(kc, algorithm, eta0, mu, 0.0, passes=3)
    assert want is not None and want % 16 not in (0, 1), "the bad step lies inside a block"
    for engine in ("factored", "reference"):
        with pytest.raises(NumericalError) as e:
            fit(kc, algorithm, engine, eta0=eta0, mu=mu)
        msg = str(e.value)
        assert f"diverged at step {want} (pass {(want - 1) // len(kc) + 1})" in msg, msg
        assert what in msg and "lower eta0" in msg


def test_smd_safeguard_floors_each_gain_multiplier_at_one_half(kc60):
    """ρ0 = 3 (gains × 20) with μ = 1 and η0 = 0.45: SMD cuts gains as fast as the safeguard
    allows, which is what keeps this run finite; the compiled engine follows the per-step
    reference exactly."""
    l = len(kc60)
    ref = BatchKHA("kha-smd", R, l, eta0=0.45, mu=1.0, xi=XI, rho0=3.0, engine="reference")
    A0 = initial_coefficients(R, l, schedule.init_generator(0))
    ref.start(A0, C=A0 @ kc60)
    ref.begin_pass()
    floored = 0
    for p in schedule.pass_permutation(0, 0, l):
        before = ref.state.rho.copy()
        ref.apply_block(np.array([p]), kc60[[p]])
        change = ref.state.rho - before
        assert np.all(change >= np.log(0.5) - 1e-15)        # every multiplier e^Δρ ≥ ½
        floored += int(np.sum(change <= np.log(0.5) + 1e-15))
    assert floored >= 3
    fac = fit(kc60, "kha-smd", "factored", eta0=0.45, mu=1.0, rho0=3.0, passes=1)
    assert np.isfinite(fac.A).all()
    np.testing.assert_allclose(fac.A, ref.A, rtol=1e-8, atol=1e-10 * np.abs(ref.A).max())
    np.testing.assert_allclose(fac.state.rho, ref.state.rho, rtol=1e-9)
    # without the safeguard the same run diverges (the paper's eq. 16 as printed)
    A, B, rho = A0.copy(), np.zeros_like(A0), np.full(R, 3.0)
    lam = eigenvalue_estimates(A0, kc60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for t, p in enumerate(schedule.pass_permutation(0, 0, l)):
            A, B, rho, _ = paper_smd_step(A, B, rho, kc60, p, et_gain(lam, t, l, 0.45), 1.0, XI,
                                          floor=False)
    assert not np.isfinite(A).all()


def test_cli_reports_the_bad_step_exits_3_and_keeps_only_good_checkpoints(digits_store,
                                                                          tmp_path):
    run = str(tmp_path / "run")
    p = subprocess.run(dkha_command("fit", digits_store.path, "-o", run, "--algorithm", "kha",
                                    "--eta0", "3", "--components", "4", "--sigma", "4",
                                    "--init", "random",
                                    "--passes", "2", "--checkpoint-steps", "8", "--block", "8",
                                    "--on-divergence", "stop", "--quiet"),
                       env=subprocess_env(), capture_output=True, text=True, timeout=300,
                       check=False)
    assert p.returncode == 3, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dkha: error: kha diverged at step "), p.stderr
    step = int(re.search(r"at step (\d+) \(pass \d+\)", lines[0]).group(1))
    assert not os.path.exists(os.path.join(run, "components.zarr"))
    from dkha.data.checkpoint import Checkpointer

    ck = Checkpointer(run).latest()
    assert ck is not None and ck.step < step
    assert all(np.isfinite(v).all() for v in ck.arrays.values())


def test_cli_keeps_distributed_warnings_off_its_one_line_errors(capfd):
    """A fit that stops on divergence cancels its prefetched row tasks, and distributed logs a
    WARNING for each one still running (CI once saw it as a second stderr line above the error).
    Without -v the CLI lets distributed log errors only, in this process and in the worker
    processes of the clusters it starts (their stderr is this process's); -v shows warnings."""
    import logging

    from dkha.cli.main import _quiet_distributed
    from dkha.engine.cluster import client_for

    def say(tag):
        logging.getLogger("distributed.worker.state_machine").warning("warning-%s", tag)
        logging.getLogger("distributed.worker.state_machine").error("error-%s", tag)

    names = [n for n in logging.root.manager.loggerDict if n.startswith("distributed")]
    old = {n: logging.getLogger(n).level for n in names}
    try:
        for level, shown in [(logging.WARNING, {"error"}), (logging.INFO, {"warning", "error"})]:
            _quiet_distributed(level)
            machine = logging.getLogger("distributed.worker.state_machine")
            assert {k for k, lv in [("warning", logging.WARNING), ("error", logging.ERROR)]
                    if machine.isEnabledFor(lv)} == shown
            capfd.readouterr()
            with client_for(2, settings=config.settings()) as c:
                c.run(say, "worker")
            err = capfd.readouterr().err
            for kind in ["warning", "error"]:
                assert err.count(f"{kind}-worker") == (2 if kind in shown else 0), err
    finally:
        for n, level in old.items():
            logging.getLogger(n).setLevel(level)


@pytest.mark.parametrize("algorithm", ["oo-kha", "okpca"])
def test_online_diverging_gain_stops_at_its_first_bad_step(online_digits, algorithm):  # noqa: F811
    """The papers' dictionary form (tests/test_online.py) replayed step by step: the first step
    after which a component's feature-space norm ``√(α_k K_m α_kᵀ)`` passes 1e6 or is not finite."""
    from tests.test_online import a_init_for, paper_steps, run_solver, sequence

    Xs = online_digits[sequence(online_digits, 0, 60)]
    kw = dict(nu=0.05, eta0=5.0, gamma=1.0, a_init=a_init_for(0, 3))
    want = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for s in range(2, len(Xs) + 1):
            ref = paper_steps(Xs[:s], algorithm, 3, **kw)
            norm2 = np.einsum("ij,jk,ik->i", ref["alpha"], ref["K"], ref["alpha"])
            if not np.all(norm2 <= BOUND**2):
                want = s
                break
    assert want is not None and want % 16 not in (0, 1), "the bad step lies inside a block"
    with pytest.raises(NumericalError, match=f"{algorithm} diverged at step {want}:"):
        run_solver(Xs, algorithm, 3, block_rows=16, **kw)
