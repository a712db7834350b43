"""Gains that need no tuning, the default start and the online algorithms' default ν.

Oracles: the dense centered kernel matrix (``tests/conftest.py``), its ``numpy.linalg.eigh``
spectrum for ``E_min``, and the reference per-step form of the updates.
"""

from __future__ import annotations

import numpy as np
import pytest

from dkha import config, schedule
from dkha.data.ingest import ingest_array
from dkha.data.patches import extract_patches, read_grey_image
from dkha.engine.rows import RowEngine
from dkha.errors import NumericalError
from dkha.estimators.batch import KernelHebbianPCA
from dkha.estimators.online import OnlineKernelPCA
from dkha.fit.ac_index import ACReference
from dkha.fit.init import nystrom_coefficients, unit_norm_components
from dkha.kernels import make_kernel
from dkha.solvers.batch import BatchKHA, feature_norm, initial_coefficients
from tests.conftest import centered_kernel_oracle

R = 8


def dense_excess(A: np.ndarray, Kc: np.ndarray, r: int) -> float:
    """``E(A)/E_min − 1`` (eq. 22) from the dense ``K'``."""
    C = A @ Kc
    w = np.linalg.eigvalsh(Kc)[::-1]
    e_min = np.sqrt(np.sum(w[r:] ** 2))
    return float(np.linalg.norm(Kc - C.T @ C) / e_min - 1.0)


def kappa_bar(Kc: np.ndarray) -> float:
    d = np.diag(Kc)
    return float(np.sum(d * d) / np.sum(d))


def standardized_cancer() -> np.ndarray:
    from sklearn.datasets import load_breast_cancer

    X = load_breast_cancer().data
    return (X - X.mean(axis=0)) / X.std(axis=0)


def camera_patches(n: int, seed: int) -> np.ndarray:
    P = extract_patches(read_grey_image("skimage:camera"), 8, 4)
    return P[np.sort(np.random.default_rng(seed).choice(len(P), size=n, replace=False))]


# --- the unit of the gains --------------------------------------------------------------------


@pytest.mark.parametrize("kernel,params", [("gaussian", {"sigma": 4.0}),
                                           ("polynomial", {"degree": 2, "offset": 1.0})])
def test_engine_centered_diagonal_is_the_dense_one(digits_store, digits, client, kernel, params):
    engine = RowEngine(digits_store, make_kernel(kernel, **params), client, config.settings())
    engine.compute_mk(cache=False)
    _, Kc = centered_kernel_oracle(np.array(digits), kernel, **params)
    np.testing.assert_allclose(engine.centered_diagonal(), np.diag(Kc), rtol=1e-10, atol=1e-12)
    assert feature_norm(engine.centered_diagonal()) == pytest.approx(kappa_bar(Kc), rel=1e-10)


def run_reference(algorithm, Kc, *, eta0, mu, feature_norm_value, start_scale=1.0, passes=2,
                  seed=3):
    l = len(Kc)
    solver = BatchKHA(algorithm, R, l, eta0=eta0, mu=mu, engine="reference",
                      feature_norm=feature_norm_value)
    A = initial_coefficients(R, l, schedule.init_generator(seed)) * start_scale
    solver.start(A, C=A @ Kc if solver.needs_projection else None)
    for _, t, idx in schedule.blocks(seed, l, passes * l, 50):
        if t % l == 0:
            solver.begin_pass()
        solver.apply_block(idx, Kc[idx])
    return solver.A


@pytest.mark.parametrize("algorithm", ["kha-t", "kha-et", "kha-smd"])
def test_gains_in_units_of_kappa_make_the_fit_invariant_under_kernel_scaling(digits,
                                                                              algorithm):
    """With η0 and μ in units of κ̄, the fit on ``c·K'`` is the fit on ``K'`` with every
    coefficient divided by ``√c`` (the components in feature space are the same); with raw
    gains it is not."""
    _, Kc = centered_kernel_oracle(np.array(digits)[:120], "gaussian", sigma=4.0)
    c = 9.0
    one = run_reference(algorithm, Kc, eta0=0.3, mu=1.0, feature_norm_value=kappa_bar(Kc))
    scaled = run_reference(algorithm, c * Kc, eta0=0.3, mu=1.0,     # the same start in
                           feature_norm_value=kappa_bar(c * Kc),   # feature space
                           start_scale=1 / np.sqrt(c))
    np.testing.assert_allclose(scaled * np.sqrt(c), one, rtol=1e-9, atol=1e-12 * np.abs(one).max())
    try:
        raw = run_reference(algorithm, c * Kc, eta0=0.3 * kappa_bar(Kc), mu=kappa_bar(Kc),
                            feature_norm_value=1.0,        # the same raw gains as on K'
                            start_scale=1 / np.sqrt(c))
    except NumericalError:      # 9× the step: SMD diverges
        return
    assert np.abs(raw * np.sqrt(c) - one).max() > 1e-3 * np.abs(one).max()


def test_fit_records_the_effective_gains(digits_store, digits, client):
    model = KernelHebbianPCA(R, algorithm="kha-smd", sigma=4.0, passes=1, evaluate_every=-1,
                             client=client)
    model.fit(digits_store.path)
    _, Kc = centered_kernel_oracle(np.array(digits), "gaussian", sigma=4.0)
    a = model.attrs_
    assert a["algorithm"] == "kha-smd" and a["init"] == "nystrom:299"   # l − 1 of 300 samples
    assert a["feature_norm"] == pytest.approx(kappa_bar(Kc), rel=1e-10)
    assert a["eta0"] is None        # from the start: δ/20 (warm_eta0)
    assert a["eta0_applied"] == pytest.approx(np.clip(0.05 * a["start_deficit"], 1e-8, 0.05),
                                              rel=1e-12)
    assert a["gain"] == pytest.approx(a["eta0_applied"] / kappa_bar(Kc), rel=1e-10)
    assert a["meta_gain"] == pytest.approx(a["mu"] / kappa_bar(Kc), rel=1e-10)


# --- the default start ------------------------------------------------------------------------


def test_nystrom_start_scaled_to_unit_norm_is_closer(digits_store, digits, client):
    """The Nyström components have unit norm only under the approximation; scaled to the
    exact unit norm the start's excess error falls (on these digits by more than 2×)."""
    kernel = make_kernel("gaussian", sigma=4.0)
    engine = RowEngine(digits_store, kernel, client, config.settings())
    engine.compute_mk(cache=False)
    A, _ = nystrom_coefficients(engine, R, 40, seed=0)
    _, Kc = centered_kernel_oracle(np.array(digits), "gaussian", sigma=4.0)
    An, Cn = unit_norm_components(A, A @ Kc)
    np.testing.assert_allclose(np.einsum("ij,ij->i", An, An @ Kc), 1.0, rtol=1e-12)
    np.testing.assert_allclose(Cn, An @ Kc, rtol=1e-12, atol=1e-14)
    assert np.abs(np.einsum("ij,ij->i", A, A @ Kc) - 1).max() > 1e-3    # it was off
    assert dense_excess(An, Kc, R) < 0.5 * dense_excess(A, Kc, R)


@pytest.fixture(scope="module")
def data_kinds(tmp_path_factory, digits_with_labels, seed):
    """Stores of three kinds of data: digits (x/8 − 1), a standardized table, image patches."""
    out = {}
    base = tmp_path_factory.mktemp("kinds")
    for name, X in (("digits", np.array(digits_with_labels[0])),
                    ("cancer", standardized_cancer()),
                    ("patches", camera_patches(900, seed))):
        out[name] = (ingest_array(X, base / f"{name}.zarr", chunk_rows=128), X)
    return out


@pytest.mark.parametrize("kind", ["digits", "cancer", "patches"])
def test_default_fit_is_near_exact(data_kinds, client, kind):
    """``KernelHebbianPCA(r, algorithm="kha-smd")`` with nothing else (the default Nyström
    start and gains, the median width, 10 passes): excess ≤ 1e-3 against the dense oracle."""
    store, X = data_kinds[kind]
    model = KernelHebbianPCA(R, algorithm="kha-smd", evaluate_every=0,
                             client=client).fit(store.path)
    _, Kc = centered_kernel_oracle(X, "gaussian", sigma=model.kernel_["sigma"])
    excess = dense_excess(model.alpha_, Kc, R)
    assert excess <= 1e-3, excess
    assert model.history_[-1]["excess"] == pytest.approx(excess, rel=1e-3, abs=1e-7)


@pytest.mark.parametrize("algorithm", ["kha-t", "kha-et", "kha-smd"])
def test_default_gains_from_the_random_start_converge(data_kinds, client, algorithm):
    """``init="random"`` with the default (cold) gains: no divergence on patches, whose
    spectrum made the old defaults diverge, and the excess falls well below the start's."""
    store, X = data_kinds["patches"]
    model = KernelHebbianPCA(R, algorithm=algorithm, init="random", evaluate_every=0,
                             client=client).fit(store.path)
    _, Kc = centered_kernel_oracle(X, "gaussian", sigma=model.kernel_["sigma"])
    start = initial_coefficients(R, len(X), schedule.init_generator(0))
    assert dense_excess(model.alpha_, Kc, R) < 0.1 * dense_excess(start, Kc, R)


# --- online: ν and η0 scaled to the kernel ----------------------------------------------------


def test_online_default_nu_keeps_the_dictionary_small():
    """All 1797 digits, one pass of ON-KHA: ν = 1e-3 puts nearly every digit into the
    dictionary; the default (0.1 × the variance in feature space) keeps under a quarter of them
    at about the same AC index as the papers' streaming updates with ν = 1e-3 (ON-KHA named).
    (With every digit joining, ν = 1e-3 stays in the dictionary's span throughout, so the
    default ``auto`` returns the exact solution there, AC 0.97.)"""
    from sklearn.datasets import load_digits

    X = load_digits().data / 8.0 - 1.0
    sigma = 6.0
    ref = ACReference.from_data(X, make_kernel("gaussian", sigma=sigma), 16)
    exact = OnlineKernelPCA(16, sigma=sigma, nu=1e-3).fit(X, ac_reference=ref)
    small = OnlineKernelPCA(16, algorithm="on-kha", sigma=sigma, nu=1e-3).fit(
        X, ac_reference=ref)
    assert exact.history_[-1]["ac_index"] > small.history_[-1]["ac_index"]
    default = OnlineKernelPCA(16, sigma=sigma).fit(X, ac_reference=ref)
    sample = X[np.sort(np.random.default_rng(0).choice(len(X), size=1000, replace=False))]
    _, Ks = centered_kernel_oracle(sample, "gaussian", sigma=sigma)
    assert default.attrs_["nu"] == pytest.approx(0.1 * np.trace(Ks) / len(Ks), rel=1e-10)
    assert len(small.dictionary_) > 0.9 * len(X)
    assert len(default.dictionary_) < 0.25 * len(X)
    assert default.history_[-1]["ac_index"] > small.history_[-1]["ac_index"] - 0.02


def test_online_eta0_is_in_units_of_the_squared_norm(digits):
    X = np.array(digits)
    kw = dict(kernel="polynomial", degree=2, offset=1.0, steps=50, eta0=0.05, nu=1e-2)
    model = OnlineKernelPCA(4, **kw).fit(X)
    d = (np.einsum("ij,ij->i", X, X) + 1.0) ** 2          # k(x, x), every sample (l < 1000)
    unit = np.sum(d * d) / np.sum(d)
    assert model.attrs_["feature_norm"] == pytest.approx(unit, rel=1e-12)
    assert model.attrs_["gain"] == pytest.approx(0.05 / unit, rel=1e-12)
    assert model.solver_.eta0 == pytest.approx(0.05 / unit, rel=1e-12)
