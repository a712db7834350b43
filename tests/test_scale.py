"""What large data needs besides the centering: the start on M columns (``init="random:M"``),
whose ``C = A K'`` comes from M kernel rows, and the final eigenvalue estimates from the ``C``
the state keeps when a fit is not evaluated. Oracle: the dense ``K'`` of the digits."""

from __future__ import annotations

import numpy as np
import pytest

from dkha import KernelHebbianPCA, config, schedule
from dkha.engine.rows import RowEngine
from dkha.fit.evaluate import projections
from dkha.kernels import make_kernel
from dkha.solvers.batch import eigenvalue_estimate, initial_coefficients

SIGMA = 4.0


@pytest.fixture(scope="module")
def Kc(digits, dense_centered):
    return dense_centered(digits, "gaussian", sigma=SIGMA)[1]


def test_projections_of_a_sparse_start_use_its_rows(digits_store, client, Kc, monkeypatch):
    A = initial_coefficients(5, 300, np.random.default_rng(1), support=40)
    assert np.count_nonzero(np.any(A != 0, axis=0)) == 40
    assert np.sum(A ** 2, axis=1) == pytest.approx(np.full(5, 1 / 5), rel=0.5)
    engine = RowEngine(digits_store, make_kernel("gaussian", sigma=SIGMA), client,
                       config.settings(), block_rows=16)
    engine.compute_mk(cache=False)
    monkeypatch.setattr(engine, "matmat", lambda V: pytest.fail("a full pass for 40 columns"))
    np.testing.assert_allclose(projections(engine, A), A @ Kc, rtol=0, atol=1e-12)
    monkeypatch.undo()
    dense = np.random.default_rng(2).standard_normal((5, 300))
    np.testing.assert_allclose(projections(engine, dense), dense @ Kc, rtol=0, atol=1e-11)


def test_fit_from_a_sparse_start(digits_store, client, Kc, seed):
    model = KernelHebbianPCA(4, algorithm="kha-smd", sigma=SIGMA, passes=2, seed=seed,
                             init="random:30", client=client).fit(digits_store.path)
    A1 = initial_coefficients(4, 300, schedule.init_generator(seed), support=30)
    C1 = A1 @ Kc
    w = np.linalg.eigvalsh(Kc)[::-1]
    e_min = np.sqrt(np.sum(w[4:] ** 2))
    first = model.history_[0]
    assert first["pass"] == 0
    assert first["error"] == pytest.approx(np.linalg.norm(Kc - C1.T @ C1), rel=1e-10)
    assert model.history_[-1]["excess"] < 0.1 * first["excess"]
    assert model.history_[-1]["error_min"] == pytest.approx(e_min, rel=1e-9)


def test_unevaluated_fit_estimates_eigenvalues_from_the_kept_c(digits_store, client, Kc, seed,
                                                               monkeypatch):
    calls = []
    real = RowEngine.matmat
    monkeypatch.setattr(RowEngine, "matmat", lambda self, V: calls.append(1) or real(self, V))
    model = KernelHebbianPCA(4, algorithm="kha-smd", sigma=SIGMA, passes=1, seed=seed,
                             init="random:30", evaluate_every=-1,
                             client=client).fit(digits_store.path)
    assert calls == []          # no pass over all of K': start from 30 rows, C kept by eq. 18
    exact = eigenvalue_estimate(model.alpha_, model.alpha_ @ Kc)
    np.testing.assert_allclose(model.eigenvalues_, exact, rtol=1e-9)
