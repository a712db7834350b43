"""scikit-learn's learned pre-image (``fit_inverse_transform=True``): the kernel ridge system
``(k(P, P) + alpha I) C = X`` solved dense up to ``dkha.dense-eigh-limit`` samples and by
conjugate gradients on blockwise products on the workers above, against a dense numpy solve with
an independently computed kernel and against scikit-learn's ``KernelPCA``."""

import dask
import numpy as np
import pytest
from scipy.spatial.distance import cdist

from dkha import KernelHebbianPCA, config
from dkha.fit.ridge import learned_preimage
from dkha.solvers.ridge import ridge_cg
from tests.processes import local_client

GAMMA = 0.05


def rbf(A, B):
    return np.exp(-GAMMA * cdist(A, B, "sqeuclidean"))


def oracle_dual_coef(P, X, alpha):
    K = rbf(P, P) + alpha * np.eye(len(P))
    return np.linalg.solve(K, X)


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_ridge_cg_solves_every_column_to_its_tolerance():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((60, 60))
    K = A @ A.T                                   # PSD, condition large without the ridge
    B = rng.standard_normal((60, 5))
    B[:, 2] = 0.0                                  # a zero right-hand side is solved by zero
    sol = ridge_cg(lambda V: K @ V, B, 0.5, tol=1e-12)
    exact = np.linalg.solve(K + 0.5 * np.eye(60), B)
    assert sol.converged and sol.residual <= 1e-12
    assert 1 < sol.iterations <= 200
    assert rel(sol.C, exact) < 1e-8
    assert not sol.C[:, 2].any()
    with pytest.raises(ValueError, match="positive"):
        ridge_cg(lambda V: K @ V, B, 0.0)
    short = ridge_cg(lambda V: K @ V, B, 0.5, tol=1e-12, maxiter=2)
    assert not short.converged and short.iterations == 2 and short.residual > 1e-12


@pytest.fixture(scope="module")
def data(digits):
    return np.asarray(digits, dtype=np.float64)


def fitted(X, client, **kw):
    return KernelHebbianPCA(6, algorithm="krylov", kernel="rbf", gamma=GAMMA,
                            fit_inverse_transform=True, alpha=0.1, client=client, **kw).fit(X)


def test_blockwise_solve_matches_the_dense_one_and_scikit_learn(data, client):
    from sklearn.decomposition import KernelPCA

    dense = fitted(data, client)
    assert dense.inverse_iterations_ == 0
    with dask.config.set({"dkha.dense-eigh-limit": 50, "dkha.ridge-tol": 1e-11}):
        cg = fitted(data, client)
    assert cg.inverse_iterations_ > 1 and cg.inverse_residual_ <= 1e-11
    P = cg.X_transformed_fit_
    oracle = oracle_dual_coef(P, data, 0.1)
    assert rel(cg.dual_coef_, oracle) < 1e-6
    assert rel(dense.dual_coef_, oracle_dual_coef(dense.X_transformed_fit_, data, 0.1)) < 1e-8
    Y = cg.transform(data[:40])
    assert rel(cg.inverse_transform(Y), rbf(Y, P) @ oracle) < 1e-6
    assert rel(cg.inverse_transform(Y), dense.inverse_transform(dense.transform(data[:40]))) < 1e-6
    # scikit-learn's own fit: the same pre-images (signs of components do not matter to them)
    sk = KernelPCA(6, kernel="rbf", gamma=GAMMA, fit_inverse_transform=True, alpha=0.1).fit(data)
    assert rel(cg.inverse_transform(Y), sk.inverse_transform(sk.transform(data[:40]))) < 1e-6
    with pytest.raises(ValueError, match="components"):
        cg.inverse_transform(np.zeros((2, 3)))


def test_blockwise_solve_on_a_process_cluster_above_the_limit(data, client):
    """l = 300 above a limit of 100, the products on two worker processes (tiles of 64 rows):
    the dense solve's coefficients; ``alpha = 0`` refused there (CG needs a positive ridge)."""
    model = KernelHebbianPCA(6, algorithm="krylov", kernel="rbf", gamma=GAMMA,
                             client=client).fit(data)
    P = model.projection_.values
    with dask.config.set({"dkha.tile-rows": 64}), local_client(2, 1, processes=True) as c:
        ridge = learned_preimage(P, data, model.kernel_, 0.1, c, config.settings(), dense_limit=100)
        assert ridge.method == "cg" and ridge.residual <= 1e-8 and ridge.iterations > 1
        assert rel(ridge.dual_coef, oracle_dual_coef(P, data, 0.1)) < 1e-5
        with pytest.raises(ValueError, match="alpha must be positive"):
            learned_preimage(P, data, model.kernel_, 0.0, c, config.settings(), dense_limit=100)
    small = learned_preimage(P[:80], data[:80], model.kernel_, 0.1, None, config.settings(),
                             dense_limit=100)
    assert small.method == "dense"
    assert rel(small.dual_coef, oracle_dual_coef(P[:80], data[:80], 0.1)) < 1e-8
