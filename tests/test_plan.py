"""The default fit (``algorithm="auto"``): the path chosen by the cost model, its record, and
its accuracy against the dense oracle (``numpy.linalg.eigh`` of the centered kernel matrix)."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dkha import KernelHebbianPCA
from dkha.data.result import history_of, load
from dkha.fit.plan import AUTO_KRYLOV_TOL, Plan, auto_krylov_tol, choose_path, route
from tests.conftest import centered_kernel_oracle

R, SIGMA = 4, 4.0


def dense_excess(alpha, Kc, r):
    C = alpha @ Kc
    E = np.linalg.norm(Kc - C.T @ C)
    w = np.linalg.eigvalsh(Kc)[::-1]
    Emin = np.sqrt(np.sum(w[r:] ** 2))
    return E / Emin - 1.0


def residuals(alpha, Kc):
    """``‖K'v − λv‖/λ`` of the unit vectors along each component's projections."""
    C = alpha @ Kc
    V = (C / np.linalg.norm(C, axis=1, keepdims=True)).T
    KV = Kc @ V
    lam = np.einsum("ij,ij->j", V, KV)
    return np.linalg.norm(KV - V * lam, axis=0) / lam


def test_auto_is_resolved_by_route_alone():
    """``fit.plan.route`` is the one resolution of ``auto``: another algorithm runs as asked;
    options of the KHA iterations make it KHA-SMD (saved so, with the reason); no or all
    components, the exact solver (saved as auto); else the cost model's path once its plan is
    given. It changes nothing it is given (a frozen Route)."""
    import dataclasses

    params = {"passes": None, "steps": None, "eta0": 0.5, "mu": None, "xi": None, "init": None}
    asked = dict(params)
    r = route("auto", params, 4, 100)
    assert (r.named, r.runs) == ("kha-smd", "kha-smd") and r.reason.startswith("eta0 given")
    assert r.attrs() == {"path": "kha-smd", "path_reason": r.reason}
    assert params == asked
    none = dict.fromkeys(params)
    assert (route("kha-t", params, 4, 100).named, route("kha-t", params, 4, 100).runs) == (
        "kha-t", "kha-t")
    assert (route("auto", none, 99, 100).named, route("auto", none, 99, 100).runs) == (
        "auto", "krylov")
    waiting = route("auto", none, 4, 100)
    assert (waiting.runs, waiting.plan, waiting.attrs()) == ("auto", None, {})
    plan = Plan("dense", "small", {"dense": 1.0, "krylov": 2.0})
    planned = route("auto", none, 4, 100, plan=plan)
    assert (planned.named, planned.runs, planned.plan) == ("auto", "dense", plan)
    assert planned.attrs() == plan.attrs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.runs = "krylov"


def test_cost_model_chooses_by_memory_and_time():
    # small l: the matrix fits and the dense path is cheaper
    p = choose_path(3000, 20, rate=1e8, threads=2, landmarks=800, dense_bytes=1e9)
    assert p.path == "dense" and p.estimates["dense"] < p.estimates["krylov"]
    assert "fits within" in p.reason
    # the matrix does not fit: Krylov whatever the times
    p = choose_path(20000, 20, rate=1e8, threads=2, dense_bytes=1e9)
    assert p.path == "krylov" and p.estimates["dense"] is None and "exceeds" in p.reason
    # it fits, but blockwise passes on many threads are faster
    p = choose_path(10000, 20, rate=1e8, threads=4096, dense_bytes=1e9)
    assert p.path == "krylov" and p.estimates["krylov"] < p.estimates["dense"]
    assert p.attrs()["path_estimates"]["dense"] is not None
    assert auto_krylov_tol(None) == AUTO_KRYLOV_TOL and auto_krylov_tol(1e-4) == AUTO_KRYLOV_TOL
    assert auto_krylov_tol(1e-12) == pytest.approx(1e-8)


def test_default_dense_path_is_exact(digits_store, digits, client, tmp_path):
    model = KernelHebbianPCA(R, sigma=SIGMA, client=client).fit(
        digits_store.path, run_dir=str(tmp_path / "run"))
    _, Kc = centered_kernel_oracle(np.array(digits), "gaussian", sigma=SIGMA)
    a = model.attrs_
    assert a["algorithm"] == "auto" and a["path"] == "dense" and "fits within" in a["path_reason"]
    assert dense_excess(model.alpha_, Kc, R) < 1e-10
    assert residuals(model.alpha_, Kc).max() < 1e-10
    w = np.linalg.eigvalsh(Kc)[::-1][:R]
    np.testing.assert_allclose(model.eigenvalues_, w, rtol=1e-10)
    h = model.history_[-1]
    assert h["measure"] == "exact"
    assert h["error_min"] == pytest.approx(np.sqrt(np.sum(np.linalg.eigvalsh(Kc)[::-1][R:] ** 2)),
                                           rel=1e-9)
    # the run on disk says which path and which measure
    ds = load(str(tmp_path / "run"))
    assert ds.attrs["path"] == "dense" and history_of(ds)[-1]["measure"] == "exact"
    np.testing.assert_allclose(model.transform(np.array(digits)[:5]),
                               model.projection_.values[:5], rtol=1e-8, atol=1e-10)


def test_default_krylov_path_tracks_without_evaluation(digits_store, digits, client):
    """Where K' does not fit (dkha.dense-bytes 0 here): Krylov from the Nyström start to a
    residual of 1e-6, its history entry LOBPCG's own residual (no evaluation pass) by default
    (``dkha.evaluation: tracked``); with a ``tol`` on the excess the entry is exact."""
    _, Kc = centered_kernel_oracle(np.array(digits), "gaussian", sigma=SIGMA)
    with dask.config.set({"dkha.dense-bytes": 0, "dkha.evaluation": "tracked"}):
        model = KernelHebbianPCA(R, sigma=SIGMA, client=client).fit(digits_store.path)
        exact = KernelHebbianPCA(R, sigma=SIGMA, client=client, tol=1e-6).fit(digits_store.path)
    assert model.attrs_["path"] == "krylov" and "exceeds" in model.attrs_["path_reason"]
    kinds = [p["kind"] for p in model.timings_["passes"]]
    assert "residual" not in kinds          # no evaluation pass
    h = model.history_[-1]
    assert h["measure"] == "residual" and np.isnan(h["excess"])
    assert h["residual"] <= 2 * AUTO_KRYLOV_TOL
    assert residuals(model.alpha_, Kc).max() < 1e-4
    assert dense_excess(model.alpha_, Kc, R) < 1e-8
    he = exact.history_[-1]
    assert he["measure"] == "exact"
    assert he["excess"] == pytest.approx(dense_excess(exact.alpha_, Kc, R), abs=1e-8)


def test_kha_options_make_the_default_kha_smd(digits_store, client):
    model = KernelHebbianPCA(R, sigma=SIGMA, passes=1, evaluate_every=-1, client=client).fit(
        digits_store.path)
    assert model.attrs_["algorithm"] == "kha-smd" and model.attrs_["path"] == "kha-smd"
    assert "passes" in model.attrs_["path_reason"]
