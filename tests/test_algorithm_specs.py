"""An algorithm is its spec (:mod:`dkha.algorithms`): a batch algorithm defined from outside the
package, as a spec only, fits as the per-step form of its gains says.

Oracle: GHA's step in feature space written out here in numpy, with the new algorithm's gains,
on the dense centered kernel matrix (``tests/conftest.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from dkha import algorithms, schedule
from dkha.algorithms import BATCH, GHA, AlgorithmSpec
from dkha.errors import ParameterError
from dkha.solvers.batch import BatchKHA, default_eta0, initial_coefficients, warm_eta0
from dkha.solvers.warmup import tiny_fit
from tests.conftest import centered_kernel_oracle

R, PASSES, SEED = 6, 2, 5
#: eq. 12's equalised gains without the decay: a batch algorithm the package does not define
CONSTANT_ET = AlgorithmSpec("kha-e-const", BATCH, eta0=0.4, warm_eta0=0.02,
                            gains=algorithms.Equalised(), update=GHA)


@pytest.fixture
def registered(monkeypatch):
    """:data:`CONSTANT_ET` in the registry for one test (the registry as it was after)."""
    monkeypatch.setattr(algorithms, "REGISTRY", dict(algorithms.REGISTRY))
    return algorithms.register(CONSTANT_ET)


def per_step(Kc: np.ndarray, A: np.ndarray, order, eta0: float, *, decays: bool = False,
             rule=None) -> np.ndarray:
    """GHA in feature space, ``w_i ← w_i + d_i y_i (Φ'(x_p) − Σ_{j≤i} y_j w_j)``, one sample
    of ``order`` at a time, with ``d = η``, ``η_i = η0/κ̄ · λ_r/λ_i`` (times ``l/(t + l)`` where
    the gains ``decays``) and ``λ`` by eq. 13 from ``A K'`` at each pass's start; ``rule``:
    ``d = rule(η, y)`` instead (``y = A k'_p``)."""
    l = len(Kc)
    diag = np.diag(Kc)
    kappa = float(np.sum(diag * diag) / np.sum(diag))
    A = A.copy()
    for t, p in enumerate(order):
        if t % l == 0:
            C = A @ Kc
            lam = np.sqrt(np.sum(C * C, axis=1) / np.sum(A * A, axis=1))
        eta = eta0 / kappa * lam.min() / lam * (l / (t + l) if decays else 1.0)
        y = A @ Kc[p]
        d = eta if rule is None else rule(eta, y)
        new = A - d[:, None] * (np.tril(np.outer(y, y)) @ A)
        new[:, p] += d * y
        A = new
    return A


def fit_blocks(solver: BatchKHA, Kc: np.ndarray, seed: int, passes: int) -> list:
    """``passes`` passes of ``solver`` over ``Kc`` in the seed's blocks of 40; the order of the
    samples."""
    l = len(Kc)
    order = []
    for _, t, idx in schedule.blocks(seed, l, passes * l, 40):
        if t % l == 0:
            solver.begin_pass()
        solver.apply_block(idx, Kc[idx])
        order.extend(idx)
    return order


@pytest.mark.parametrize("engine", ["factored", "reference"])
def test_a_batch_algorithm_registered_from_outside_fits_as_its_gains_say(digits, registered,
                                                                        engine):
    """One spec, no other code: the solvers take its gains (equalised, not decaying), keep
    ``C`` for them and run GHA's update (the factored engine's compiled loop, or the per-step
    reference form); both end where the per-step oracle ends, after two passes."""
    _, Kc = centered_kernel_oracle(np.array(digits)[:150], "gaussian", sigma=4.0)
    l = len(Kc)
    d = np.diag(Kc)
    solver = BatchKHA(CONSTANT_ET.name, R, l, eta0=default_eta0(CONSTANT_ET.name, warm=False),
                      engine=engine, feature_norm=float(np.sum(d * d) / np.sum(d)))
    assert solver.needs_projection and solver.effective_gains().keys() == {"feature_norm", "gain"}
    A1 = initial_coefficients(R, l, schedule.init_generator(SEED))
    solver.start(A1, C=A1 @ Kc)
    order = fit_blocks(solver, Kc, SEED, PASSES)
    assert solver.backoffs == []
    want = per_step(Kc, A1, order, CONSTANT_ET.eta0)
    assert np.abs(want - A1).max() > 0.1 * np.abs(A1).max()       # the steps moved it
    np.testing.assert_allclose(solver.A, want, rtol=1e-8, atol=1e-10 * np.abs(want).max())
    # its warm gain too, from the spec
    assert warm_eta0(CONSTANT_ET.name, 0.5) == pytest.approx(0.01)


def test_compile_ahead_and_the_gains_differ_by_spec_only(registered):
    """The new algorithm's tiny fit (what compile-ahead runs) takes the constant equalised
    gains: the same component gains at every step, where KHA/et's decay."""
    new, et = tiny_fit(CONSTANT_ET.name), tiny_fit("kha-et")
    np.testing.assert_array_equal(new.block_gains(0, 3)[0], new.block_gains(100, 3)[2])
    assert (et.block_gains(100, 1) < et.block_gains(0, 1)).all()


def test_the_registry_refuses_what_it_cannot_serve(monkeypatch):
    monkeypatch.setattr(algorithms, "REGISTRY", dict(algorithms.REGISTRY))
    with pytest.raises(ParameterError, match="'kha-et' is registered already"):
        algorithms.register(AlgorithmSpec("kha-et", BATCH, eta0=1.0, update=GHA))
    algorithms.register(AlgorithmSpec("kha-newton", BATCH, eta0=1.0, update="newton"))
    with pytest.raises(ParameterError, match="asks for the update 'newton'; the batch solvers "
                                             "serve gha, smd"):
        BatchKHA("kha-newton", 2, 10, eta0=0.1)
    with pytest.raises(ParameterError, match="unknown algorithm 'krylov'; choose one of kha, "
                                             "kha-t, kha-et, kha-smd, kha-newton"):
        BatchKHA(algorithms.KRYLOV, 2, 10, eta0=0.1)


def test_the_specs_carry_what_the_family_did_by_name():
    """What the solvers read from a spec, for the paper's four algorithms (Schraudolph et al.
    2006: KHA eq. 8, KHA/t, KHA/et eq. 12, SMD Algorithm 1)."""
    got = {a: (isinstance(s.gains, algorithms.Decaying), isinstance(s.gains, algorithms.Equalised),
               s.keeps_c, s.has_mu)
           for a in algorithms.names(BATCH) for s in [algorithms.spec(a)]}
    assert got == {"kha": (False, False, False, False), "kha-t": (True, False, False, False),
                   "kha-et": (True, True, True, False), "kha-smd": (True, True, True, True)}
    assert [a for a in algorithms.names() if algorithms.is_exact(a)] == [algorithms.KRYLOV]
    assert not algorithms.streams_together(algorithms.AUTO)


def test_the_estimator_fits_an_algorithm_registered_after_import(digits, registered, monkeypatch):
    """The estimator's parameter table asks the registry when it validates (not a list frozen
    at import): a clone of KHA/et's spec under a new name, registered here, fits through
    ``KernelHebbianPCA`` to KHA/et's bits; the spec's gains reach the fit (the registered
    non-decaying variant ends elsewhere); an unknown name's message lists the registered
    ones."""
    from dataclasses import replace

    from dkha import KernelHebbianPCA

    clone = algorithms.register(replace(algorithms.spec("kha-et"), name="kha-et-clone"))
    X = np.array(digits)[:150]

    def fit(name):
        return KernelHebbianPCA(R, algorithm=name, sigma=4.0, passes=PASSES, init="random",
                                eta0=0.4, seed=SEED).fit(X).alpha_

    built_in = fit("kha-et")
    np.testing.assert_array_equal(fit(clone.name), built_in)
    assert np.abs(fit(CONSTANT_ET.name) - built_in).max() > 1e-3 * np.abs(built_in).max()
    with pytest.raises(ParameterError, match="kha-et-clone"):
        KernelHebbianPCA(R, algorithm="kha-nope").fit(X)
