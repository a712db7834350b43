"""A batch algorithm with a new in-block update, defined from outside the package: its update
(:class:`dkha.solvers.updates.base.Update`: a per-step form and a block loop over the factored
state, here a plain Python loop over dkha's compiled pieces) and its spec, registered from this
module, fit as its per-step rule says: on both engines of the solver, and streamed by the row
engine of the in-process cluster (kernel rows, or projections from the workers' replicas).

The update: GHA's step with normalised gains, ``d_i = η_i / (1 + η_i y_i²)`` (``y = A k'_p``),
a rule inside the block (each step's gains depend on its projections), on KHA/et's ``η``.
Oracle: the step written out here in numpy on the dense centered kernel matrix, one sample at a
time in the schedule's order, from the seeded start.
"""

from __future__ import annotations

import numpy as np
import pytest

from dkha import algorithms, config, schedule
from dkha.algorithms import BATCH, AlgorithmSpec
from dkha.engine.rows import RowEngine
from dkha.errors import ParameterError
from dkha.fit.evaluate import projections as projections_of
from dkha.kernels import make_kernel
from dkha.solvers import block_loops, compiled, updates
from dkha.solvers.batch import BatchKHA, feature_norm, initial_coefficients
from dkha.solvers.reference import guard
from dkha.solvers.updates.base import Update
from dkha.solvers.updates.gha import per_step as gha_step
from tests.test_algorithm_specs import fit_blocks, per_step

R, PASSES, SEED, SIGMA = 5, 2, 3, 4.0


def normalised(eta: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The new rule's gains."""
    return eta / (1.0 + eta * y * y)


def reference_step(st, p, kp, eta, mu, xi):
    """The per-step form on the reference engine's state."""
    y = st.A @ kp
    d = normalised(eta, y)
    gha_step(st.A, p, kp, d, st.C)
    return guard(y, st.A @ kp, kp[p], d, state=(("A", st.A),))


def block(st, S, C, rows, Y, U, Kpp, index, eta, mu, xi, start, direct_log):
    """Steps ``start…b-1`` on the factored state (the contract of
    :func:`dkha.solvers.updates.gha.kha_block_logged`), without direct steps: a step whose own
    ``M`` is too ill-conditioned to factor is refused as bad (a backoff halves the gains)."""
    T, bound, fresh = st.T, st.condition_bound(), st.fresh
    r, b = T.shape[0], len(index)
    yt, y, delta, Tn = np.empty(r), np.empty(r), np.empty(r), np.empty((r, r))
    if fresh:
        bound[0] = 1.0
    for j in range(start, b):
        compiled.corrected_projection(Y, U, Kpp, j, start, yt)
        compiled.lower_matvec(T, yt, y)
        a = normalised(eta[j], y) * y
        for before in (True, False):
            bad, comp = compiled.projection_problem(y, a, Kpp[j, j], before)
            if bad != compiled.GUARD_OK:
                return j, False, fresh, bad, comp
        compiled.apply_m(T, a, y, Tn)
        fold, direct, new_bound = block_loops.fold_or_direct(
            Tn, bound, compiled.m_cond_bound(a, y), st.fold_condition, fresh, Y, U, Kpp, start, j)
        if fold:
            return j, True, fresh, compiled.GUARD_OK, -1
        if direct:
            return j, False, fresh, compiled.GUARD_A, -1
        bad, comp = block_loops.keep_factored_step(T, Tn, a, delta, U, S, j, int(index[j]),
                                                   S.shape[1] > 0, r, bound, new_bound)
        if bad != compiled.GUARD_OK:
            return j, False, fresh, bad, comp
        fresh = False
    return b, False, fresh, compiled.GUARD_OK, -1


NORMALISED = Update("normalised-gha", reference_step, block)
#: KHA/et's gains, normalised in the block
SPEC = AlgorithmSpec("kha-et-normalised", BATCH, eta0=1.0, warm_eta0=0.05,
                     gains=algorithms.EqualisedDecaying(), update=NORMALISED.name)


@pytest.fixture
def registered(monkeypatch):
    """The update and its algorithm registered for one test (both registries as they were
    after)."""
    monkeypatch.setattr(updates, "TABLE", dict(updates.TABLE))
    monkeypatch.setattr(algorithms, "REGISTRY", dict(algorithms.REGISTRY))
    updates.register(NORMALISED)
    return algorithms.register(SPEC)


def oracle(Kc: np.ndarray, A: np.ndarray, order, eta0: float) -> np.ndarray:
    """The new update's steps: KHA/et's gains ``η`` (decaying, equalised), ``d = η / (1 + η y²)``
    (:func:`tests.test_algorithm_specs.per_step`, written out in numpy)."""
    return per_step(Kc, A, order, eta0, decays=True, rule=lambda eta, y: eta / (1.0 + eta * y * y))


@pytest.fixture(scope="module")
def kc(digits, dense_centered):
    return dense_centered(digits, "gaussian", sigma=SIGMA)[1]


@pytest.mark.parametrize("engine", ["factored", "reference"])
@pytest.mark.parametrize("fold_condition", [1e3, 2.0])
def test_a_new_update_fits_as_its_rule_says(kc, registered, engine, fold_condition):
    """Both engines take the registered update (its block loop, its per-step form; with a
    fold condition low enough that its loop folds inside blocks too) and end where the
    per-step oracle ends; the rule matters: KHA/et's own steps end elsewhere."""
    l = len(kc)
    diag = np.diag(kc)
    eta0 = 1.0
    solver = BatchKHA(SPEC.name, R, l, eta0=eta0, engine=engine, fold_condition=fold_condition,
                      feature_norm=float(np.sum(diag * diag) / np.sum(diag)))
    A1 = initial_coefficients(R, l, schedule.init_generator(SEED))
    solver.start(A1, C=A1 @ kc)
    order = fit_blocks(solver, kc, SEED, PASSES)
    assert solver.backoffs == []
    want = oracle(kc, A1, order, eta0)
    scale = np.abs(want).max()
    np.testing.assert_allclose(solver.A, want, rtol=1e-8, atol=1e-10 * scale)
    assert np.abs(per_step(kc, A1, order, eta0, decays=True) - want).max() > 0.1 * scale
    np.testing.assert_allclose(solver.state.C, solver.A @ kc, rtol=1e-7, atol=1e-9 * scale)
    if engine == "factored" and fold_condition < 10:
        assert solver.state.folds > 2 * PASSES      # folds inside blocks, not only at starts


@pytest.mark.parametrize("projections", ["coordinator", "workers"])
def test_a_new_update_fits_on_the_row_engine(kc, registered, digits_store, client, projections):
    """The row engine on the in-process cluster streams the blocks (kernel rows to the
    coordinator, or the projections computed by the workers' replicas of ``S̃``, which follow
    the new update's messages) and the solver ends where the per-step oracle ends.

    (The estimator's parameter table is fixed when :mod:`dkha.estimators` is imported: an
    algorithm registered later fits through :class:`~dkha.solvers.batch.BatchKHA` and the row
    engine, as here.)"""
    engine = RowEngine(digits_store, make_kernel("gaussian", sigma=SIGMA), client,
                       config.settings(column_groups=3, projections=projections), block_rows=37)
    engine.compute_mk()
    l, eta0 = len(kc), 1.0
    solver = BatchKHA(SPEC.name, R, l, eta0=eta0, fold_condition=2.0, feature_norm=None)
    solver.set_feature_norm(feature_norm(engine.centered_diagonal()))
    A1 = initial_coefficients(R, l, schedule.init_generator(SEED))
    solver.start(A1, C=projections_of(engine, A1))
    tagged = ((k, idx) for k, _, idx in schedule.blocks(SEED, l, PASSES * l, engine.block_rows))
    current = None
    for k, idx, block in engine.stream(tagged, solver=solver):
        if k != current:
            solver.begin_pass()
            current = k
        solver.apply_block(idx, block)
    assert solver.backoffs == []
    order = np.concatenate([schedule.pass_permutation(SEED, k, l) for k in range(PASSES)])
    want = oracle(kc, A1, order, eta0)
    np.testing.assert_allclose(solver.A, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())


def test_the_update_table_refuses_a_name_taken_and_names_what_it_serves(monkeypatch):
    monkeypatch.setattr(updates, "TABLE", dict(updates.TABLE))
    with pytest.raises(ParameterError, match="update 'gha' is registered already"):
        updates.register(Update("gha", reference_step, block))
    with pytest.raises(ParameterError, match="unknown update 'newton'; the batch solvers "
                                             "serve gha, smd"):
        updates.get("newton")
