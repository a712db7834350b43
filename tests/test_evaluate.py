"""Blockwise evaluation (eq. 22) and the top eigenpairs, against dense NumPy on 400 digits."""

from __future__ import annotations

import json

import dask.config
import numpy as np
import pytest
from scipy.linalg import subspace_angles

from dkha import config
from dkha.data.ingest import ingest_array
from dkha.engine.rows import RowEngine
from dkha.fit.evaluate import evaluate, projections
from dkha.fit.spectrum import krylov_eigenpairs, top_eigenvalues
from dkha.kernels import make_kernel

SIGMA = 4.0
R = 5
REL = 1e-8


@pytest.fixture(scope="module")
def data(tmp_path_factory, digits_subset, dense_centered):
    """400 digits (40 per class) in chunks of 64 rows, with the dense K' and its eigh."""
    X, _ = digits_subset(40)
    store = ingest_array(X, tmp_path_factory.mktemp("eval") / "d400.zarr", chunk_rows=64)
    _, Kc = dense_centered(X, "gaussian", sigma=SIGMA)
    w, V = np.linalg.eigh(Kc)
    return store, Kc, w[::-1].copy(), V[:, ::-1].copy()


@pytest.fixture(scope="module")
def engine(data, client):
    store = data[0]
    return RowEngine(store, make_kernel("gaussian", sigma=SIGMA), client,
                     config.settings(column_groups=3))


def dense_evaluation(Kc, A, w, r):
    """E(A) = ‖K' − (AK')ᵀ AK'‖_F, E_min = sqrt(Σ_{i>r} λ_i²), excess = E/E_min − 1."""
    AK = A @ Kc
    E = np.linalg.norm(Kc - AK.T @ AK, "fro")
    Emin = np.sqrt(np.sum(w[r:] ** 2))
    return E, Emin, E / Emin - 1.0


def coefficient_matrices(Kc, w, V, seed):
    """A random start (Algorithm 1's scale), a perturbed optimum and the optimum itself."""
    l = len(Kc)
    rng = np.random.default_rng(seed)
    optimum = (V[:, :R] / np.sqrt(w[:R])).T  # A K' = Λ^{1/2} Vᵀ: (AK')ᵀ AK' = V Λ Vᵀ
    return {
        "random": rng.normal(size=(R, l)) / np.sqrt(R * l),
        "perturbed": optimum + 0.1 * rng.normal(size=(R, l)) / np.sqrt(l),
        "optimum": optimum,
    }


@pytest.mark.parametrize("which", ["random", "perturbed", "optimum"])
def test_evaluate_matches_dense(data, engine, seed, which):
    _, Kc, w, V = data
    A = coefficient_matrices(Kc, w, V, seed)[which]
    E, Emin, excess = dense_evaluation(Kc, A, w, R)
    ev = evaluate(engine, A)
    assert ev.error == pytest.approx(E, rel=REL)
    assert ev.error_min == pytest.approx(Emin, rel=REL)
    assert ev.frobenius == pytest.approx(np.linalg.norm(Kc, "fro"), rel=1e-12)
    if which == "optimum":
        assert abs(ev.excess) < 1e-8
    else:
        assert excess > 1e-3  # a real excess to compare
        assert ev.excess == pytest.approx(excess, rel=REL)
    assert ev.as_dict() == {"error": ev.error, "error_min": ev.error_min, "excess": ev.excess,
                            "frobenius": ev.frobenius}


def test_evaluate_with_given_eigenvalues_and_projections(data, engine, seed):
    _, Kc, w, V = data
    A = coefficient_matrices(Kc, w, V, seed)["perturbed"]
    C = projections(engine, A)
    np.testing.assert_allclose(C, A @ Kc, rtol=0, atol=1e-12 * np.abs(A @ Kc).max())
    E, Emin, excess = dense_evaluation(Kc, A, w, R)
    ev = evaluate(engine, A, w[:R], C=C)
    assert (ev.error, ev.error_min) == pytest.approx((E, Emin), rel=REL)
    assert ev.excess == pytest.approx(excess, rel=REL)
    # eigenvalues passed in are what E_min is made of: a wrong one shows
    wrong = evaluate(engine, A, w[:R] * 0.9, C=C)
    assert wrong.error_min == pytest.approx(
        np.sqrt(np.sum(w**2) - np.sum((0.9 * w[:R]) ** 2)), rel=REL)


def test_top_eigenvalues_dense_path(data, engine):
    _, _, w, _ = data
    got = top_eigenvalues(engine, R, dense_limit=10_000)
    np.testing.assert_allclose(got, w[:R], rtol=1e-12)


def test_top_eigenvalues_krylov_path(data, engine):
    _, _, w, _ = data
    got = top_eigenvalues(engine, R, dense_limit=0)
    np.testing.assert_allclose(got, w[:R], rtol=REL)


def test_krylov_eigenpairs(data, engine, seed):
    _, Kc, w, V = data
    assert (w[R - 1] - w[R]) / w[0] > 1e-2  # a gap the comparison of subspaces needs
    lam, U = krylov_eigenpairs(engine, R, seed=seed)
    assert lam.shape == (R,) and U.shape == (len(Kc), R)
    np.testing.assert_allclose(lam, w[:R], rtol=REL)
    assert np.all(np.diff(lam) < 0)  # descending
    # the same subspace (signs of eigenvectors are arbitrary), vector by vector
    assert np.max(subspace_angles(U, V[:, :R])) < 1e-6
    for i in range(R):
        assert abs(abs(U[:, i] @ V[:, i]) / np.linalg.norm(U[:, i]) - 1) < 1e-8
    resid = np.linalg.norm(Kc @ U - U * lam, axis=0) / np.linalg.norm(U, axis=0)
    assert resid.max() < 1e-6 * w[0]


def test_evaluate_krylov_path(data, engine, seed):
    """Above dkha.dense-eigh-limit, E_min comes from LOBPCG; same numbers."""
    _, Kc, w, V = data
    A = coefficient_matrices(Kc, w, V, seed)["perturbed"]
    E, Emin, excess = dense_evaluation(Kc, A, w, R)
    with dask.config.set({"dkha.dense-eigh-limit": 0}):
        ev = evaluate(engine, A)
    assert (ev.error, ev.error_min) == pytest.approx((E, Emin), rel=REL)
    assert ev.excess == pytest.approx(excess, abs=2 * REL * (1 + excess))


# --- explained variance (Honeine eq. 23) ----------------------------------------------------


def run_dataset(store, alpha, engine, kernel="gaussian", **params):
    """A batch run's components dataset for ``alpha`` on ``store`` (what `dkha fit` saves)."""
    from dkha.data import result

    if engine.mk is None:
        engine.compute_mk()
    return result.build_dataset(alpha, np.zeros(len(alpha)), [], {
        "algorithm": "exact", "kernel": kernel, "kernel_parameters": params,
        "store": str(store.path), "n_samples": store.n_samples, "n_features": store.n_features,
        "seed": 0}, mk=engine.mk, mkm=engine.mkm)


def test_explained_variance_blockwise_equals_dense(data, engine, client, seed):
    """Eq. 23 by one blockwise pass, and on a seeded sample, against Var of the dense A K'."""
    from dkha.runs.variance import explained_variance

    store, Kc, w, V = data
    A = coefficient_matrices(Kc, w, V, seed)["perturbed"]
    ds = run_dataset(store, A, engine, sigma=SIGMA)
    C = A @ Kc  # ψ_j(x_i) up to a constant per component
    dense = np.mean(C**2, axis=1) - np.mean(C, axis=1) ** 2
    ev = explained_variance(ds, client)
    np.testing.assert_allclose(ev.variance, dense, rtol=1e-9)
    assert (ev.n_samples, ev.sampled) == (len(Kc), False)
    assert ev.total == pytest.approx(np.trace(Kc) / len(Kc), rel=1e-12)
    idx = np.sort(np.random.default_rng(7).choice(len(Kc), 150, replace=False))  # store.sample
    sub = explained_variance(ds, client, samples=150, seed=7)
    np.testing.assert_allclose(sub.variance, C[:, idx].var(axis=1), rtol=1e-9)
    assert sub.sampled and sub.n_samples == 150


def test_explained_variance_of_all_exact_components_is_the_trace(data, engine, client):
    """All components of exact KPCA (unit norm): Var(ψ_j) = λ_j / l, Σ_j = trace(K')/l."""
    from dkha.runs.variance import explained_variance

    store, Kc, w, V = data
    keep = w > 1e-9 * w[0]  # the rest hold < 400·1e-9 of the trace
    A = (V[:, keep] / np.sqrt(w[keep])).T
    ev = explained_variance(run_dataset(store, A, engine, sigma=SIGMA), client)
    l = len(Kc)
    np.testing.assert_allclose(ev.variance[:20], w[:20] / l, rtol=1e-8)
    assert ev.variance.sum() == pytest.approx(np.trace(Kc) / l, rel=1e-7)
    assert ev.total == pytest.approx(np.trace(Kc) / l, rel=1e-12)
    assert ev.as_dict()["explained_fraction"] == pytest.approx(1.0, rel=1e-7)


def test_explained_variance_of_online_runs_and_their_history(data, client, tmp_path):
    """A dictionary run: eq. 23 blockwise on the workers equals Var of Σ_q α_jq k(d_q, x) computed
    densely; the fit's history records it (the sample of ≤ 2000 rows is the whole store here)."""
    from scipy.spatial.distance import cdist

    from dkha.data import result
    from dkha.estimators.online import OnlineKernelPCA
    from dkha.runs.variance import explained_variance

    store = data[0]
    X = store.read()
    model = OnlineKernelPCA(3, sigma=SIGMA, steps=800, evaluate_every=400, center=True,
                            max_members=60).fit(store, run_dir=str(tmp_path / "on"))
    ds = result.load(str(tmp_path / "on"))
    alpha, D = ds["alpha"].values, ds["dictionary"].values
    psi = np.exp(-cdist(X, D, "sqeuclidean") / (2 * SIGMA**2)) @ alpha.T
    dense = psi.var(axis=0)
    ev = explained_variance(ds, client)
    np.testing.assert_allclose(ev.variance, dense, rtol=1e-9)
    assert ev.total is None and ev.n_samples == len(X)
    hist = ds["explained_variance"]
    assert hist.dims == ("evaluation", "component") and hist.shape == (2, 3)
    np.testing.assert_allclose(hist.values[-1], dense, rtol=1e-9)
    assert not np.allclose(hist.values[0], hist.values[-1])  # it moves while fitting
    assert len(model.history_) == 2


def test_evaluate_command_prints_variance(data, engine, tmp_path, capsys, seed):
    from dkha.cli.main import main
    from dkha.data import result

    store, Kc, w, V = data
    A = (V[:, :R] / np.sqrt(w[:R])).T
    run = str(tmp_path / "run")
    result.save(run_dataset(store, A, engine, sigma=SIGMA), run)
    assert main(["evaluate", run, "--variance", "--json", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(out["explained_variance"], w[:R] / len(Kc), rtol=1e-8)
    assert out["explained_fraction"] == pytest.approx(w[:R].sum() / np.trace(Kc), rel=1e-8)
    assert main(["evaluate", run, "--variance-samples", "10"]) == 2
    assert "--variance-samples needs --variance" in capsys.readouterr().err
