"""KernelHebbianPCA end to end on 300 digits: history, reproducibility, the run directory,
transform and parameter checks, against a dense NumPy oracle."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr

import dkha
from dkha import KernelHebbianPCA
from dkha.data import cf, result
from dkha.errors import ParameterError, RunDirectoryError

SIGMA = 4.0
R = 4
PASSES = 3
ALGORITHMS = ["kha", "kha-t", "kha-et", "kha-smd"]
UNREACHABLE = "tcp://127.0.0.1:9"  # a fit that reaches the cluster would fail differently


@pytest.fixture(scope="module")
def oracle(digits, dense_centered):
    K, Kc = dense_centered(digits, "gaussian", sigma=SIGMA)
    w = np.linalg.eigvalsh(Kc)[::-1]
    return {"K": K, "Kc": Kc, "w": w, "Emin": np.sqrt(np.sum(w[R:] ** 2))}


def dense_errors(oracle, alpha):
    AK = alpha @ oracle["Kc"]
    E = np.linalg.norm(oracle["Kc"] - AK.T @ AK, "fro")
    return E, oracle["Emin"], E / oracle["Emin"] - 1.0


def model_for(algorithm, seed, client, **kw):
    # the paper's random start: the default Nyström start on 300 samples is nearly exact
    # (299 landmarks), leaving the history nothing to show (tests/test_gains.py tests it)
    params = dict(algorithm=algorithm, sigma=SIGMA, passes=PASSES, seed=seed, client=client,
                  block_rows=64, init="random")
    params.update(kw)
    return KernelHebbianPCA(R, **params)


@pytest.fixture(scope="module")
def runs(digits_store, client, seed, tmp_path_factory):
    """One 3-pass fit per algorithm, each saved to its own run directory."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for algorithm in ALGORITHMS:
        run_dir = str(base / algorithm)
        model = model_for(algorithm, seed, client).fit(digits_store.path, run_dir=run_dir)
        out[algorithm] = (model, run_dir)
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_history_matches_dense(runs, oracle, algorithm):
    model, _ = runs[algorithm]
    h = model.history_
    assert [e["pass"] for e in h] == [0, 1, 2, 3]
    assert [e["step"] for e in h] == [0, 300, 600, 900]
    E, Emin, excess = dense_errors(oracle, model.alpha_)
    assert h[-1]["error"] == pytest.approx(E, rel=1e-8)
    assert h[-1]["excess"] == pytest.approx(excess, rel=1e-8)
    for e in h:
        assert e["error_min"] == pytest.approx(Emin, rel=1e-8)
        assert e["excess"] == pytest.approx(e["error"] / e["error_min"] - 1, rel=1e-12)
    walls = [e["wall_time"] for e in h]
    assert walls[0] >= 0 and walls == sorted(walls)
    assert h[-1]["excess"] < 0.5 * h[0]["excess"]  # it learned something in 3 passes
    assert model.alpha_.shape == (R, 300) and np.isfinite(model.alpha_).all()
    # eq. 13 estimates from the final coefficients
    AK = model.alpha_ @ oracle["Kc"]
    lam = np.linalg.norm(AK, axis=1) / np.linalg.norm(model.alpha_, axis=1)
    np.testing.assert_allclose(model.eigenvalues_, lam, rtol=1e-8)
    np.testing.assert_allclose(model.mk_, oracle["K"].mean(axis=0), rtol=1e-12)
    assert model.mkm_ == pytest.approx(oracle["K"].mean(), rel=1e-12)
    assert model.n_samples_ == 300 and model.n_features_in_ == 64
    assert model.kernel_.name == "gaussian" and model.kernel_["sigma"] == SIGMA


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_intermediate_history_matches_shorter_runs(runs, oracle, digits_store, client, seed,
                                                   algorithm):
    """The entry after pass k is E of the coefficients a k-pass run ends with (same seed)."""
    model, _ = runs[algorithm]
    for k in (1, 2):
        short = model_for(algorithm, seed, client, passes=k).fit(digits_store.path)
        E, _, excess = dense_errors(oracle, short.alpha_)
        entry = model.history_[k]
        assert entry["pass"] == k
        assert entry["error"] == pytest.approx(E, rel=1e-8)
        assert entry["excess"] == pytest.approx(excess, rel=1e-8)


@pytest.mark.parametrize("algorithm", ["kha-et", "kha-smd"])
def test_seed_reproducible(runs, digits_store, client, seed, algorithm):
    model, _ = runs[algorithm]
    again = model_for(algorithm, seed, client).fit(digits_store.path)
    assert np.array_equal(again.alpha_, model.alpha_)
    assert [h["error"] for h in again.history_] == [h["error"] for h in model.history_]
    other = model_for(algorithm, seed + 1, client).fit(digits_store.path)
    diff = np.linalg.norm(other.alpha_ - model.alpha_) / np.linalg.norm(model.alpha_)
    assert diff > 1e-3


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_saved_run_dir(runs, oracle, digits_store, seed, algorithm):
    model, run_dir = runs[algorithm]
    ds = xr.open_zarr(os.path.join(run_dir, "components.zarr"), consolidated=False).load()
    assert ds["alpha"].dims == ("component", "sample")
    assert ds["alpha"].dtype == np.float64
    np.testing.assert_array_equal(ds["alpha"].values, model.alpha_)
    assert ds["eigenvalue"].dims == ("component",)
    np.testing.assert_array_equal(ds["eigenvalue"].values, model.eigenvalues_)
    assert ds["mk"].dims == ("sample",)
    np.testing.assert_allclose(ds["mk"].values, oracle["K"].mean(axis=0), rtol=1e-12)
    assert ds.attrs["mkm"] == pytest.approx(oracle["K"].mean(), rel=1e-12)
    for name in ("pass", "step", "error", "error_min", "excess", "wall_time"):
        assert ds[name].dims == ("evaluation",)
        np.testing.assert_array_equal(ds[name].values, [h[name] for h in model.history_])
    assert ds["pass"].values.tolist() == [0, 1, 2, 3]
    a = result.load(run_dir).attrs      # the attrs as dkha reads them back (plain xarray:
    assert ds.attrs["kernel_parameters"] == f'{{"sigma":{SIGMA!r}}}'      # JSON text)
    assert a["algorithm"] == algorithm
    assert a["kernel"] == "gaussian" and a["kernel_parameters"] == {"sigma": SIGMA}
    assert "sigma" not in a          # saved once, in kernel_parameters
    assert a["seed"] == seed
    assert a["store"] == os.path.abspath(digits_store.path)
    assert (a["n_samples"], a["n_features"]) == (300, 64)
    assert a["centered"] is True
    assert a["dkha_version"] == dkha.__version__
    assert a["n_components"] == R



def test_a_saved_parameter_no_fit_setting_holds_is_saved_as_asked(digits, tmp_path,
                                                                   monkeypatch):
    """The saved attrs come from the estimator's parameters (``get_params``), overlaid with the
    values the fit resolved: a saved row of the table that no fit setting resolves is saved with
    the value the estimator holds (it was saved as None, and resume could not tell runs apart
    on it), and a resume with another value of it is refused."""
    from dkha.data import result
    from dkha.estimators import params

    row = params.Param("note", "plain", "A note saved with the run.", str,
                       models=(params.BATCH,), saved=True, identity=True, flag=None,
                       pipeline=False)
    monkeypatch.setattr(params, "PARAMETERS", params.PARAMETERS + (row,))
    run = str(tmp_path / "run")
    model = KernelHebbianPCA(R, algorithm="kha-et", sigma=SIGMA, passes=1, block_rows=64,
                             init="random")
    model.note = "asked"
    model.fit(digits, run_dir=run, checkpoint_every=1)
    assert model.attrs_["note"] == "asked"
    assert result.load(run).attrs["note"] == "asked"
    other = KernelHebbianPCA(R, algorithm="kha-et", sigma=SIGMA, passes=1, block_rows=64,
                             init="random")
    other.note = "another"
    with pytest.raises(RunDirectoryError, match="note"):
        other.fit(digits, run_dir=run)


def test_history_is_indexed_by_pass_step_and_wall_time(runs, tmp_path):
    """``pass``, ``step``, ``wall_time`` are coordinates along ``evaluation`` (so xarray plots and
    selects by them), every history variable has units; a run saved before, with them as data
    variables, loads the same way and gives the same history to ``dkha.load``."""
    import matplotlib

    matplotlib.use("Agg")
    model, run_dir = runs["kha-smd"]
    ds = result.load(run_dir)
    assert {"pass", "step", "wall_time"} <= set(ds.coords)
    assert ds["wall_time"].attrs["units"] == "s" and ds["excess"].attrs["units"] == "1"
    line, = ds.excess.plot(x="pass")
    np.testing.assert_array_equal(line.get_xdata(), [0, 1, 2, 3])
    by_pass = ds.swap_dims(evaluation="pass")
    assert by_pass.excess.sel({"pass": 2}).item() == model.history_[2]["excess"]
    # the old layout: history fields as data variables, no attrs
    old = xr.open_zarr(os.path.join(run_dir, "components.zarr"), consolidated=False).load()
    old = old.reset_coords(["pass", "step", "wall_time"])
    for name in ("pass", "step", "error", "error_min", "excess", "wall_time"):
        old[name].attrs = {}
    assert "pass" in old.data_vars
    old.attrs = cf.decode_attrs(old.attrs)      # zarr's JSON attrs, as runs saved before held
    old.attrs.update(old.attrs["kernel_parameters"])     # and the kernel's parameters twice
    result.save(old, str(tmp_path / "old"))
    again = result.load(tmp_path / "old")
    assert {"pass", "step", "wall_time"} <= set(again.coords)
    assert again["wall_time"].attrs["units"] == "s"
    assert result.history_of(again) == model.history_
    loaded = dkha.load(str(tmp_path / "old"))
    assert loaded.history_ == model.history_
    assert loaded.sigma == SIGMA and loaded.kernel_.param_dict == {"sigma": SIGMA}

def test_run_dir_holding_a_different_run(digits_store, client, seed, tmp_path):
    run_dir = str(tmp_path / "run")
    first = model_for("kha", seed, client, passes=1).fit(digits_store.path, run_dir=run_dir)
    comp = os.path.join(run_dir, "components.zarr")

    def saved_alpha():
        return xr.open_zarr(comp, consolidated=False)["alpha"].values

    # refused before any work: it never reaches the (unreachable) scheduler
    different = model_for("kha", seed + 1, UNREACHABLE, passes=1)
    with pytest.raises(RunDirectoryError, match="different run.*seed"):
        different.fit(digits_store.path, run_dir=run_dir)
    with pytest.raises(RunDirectoryError, match="different run.*algorithm"):
        model_for("kha-t", seed, UNREACHABLE, passes=1).fit(
            digits_store.path, run_dir=run_dir)
    np.testing.assert_array_equal(saved_alpha(), first.alpha_)

    replaced = model_for("kha", seed + 1, client, passes=1).fit(digits_store.path,
                                                                run_dir=run_dir, overwrite=True)
    np.testing.assert_array_equal(saved_alpha(), replaced.alpha_)
    assert not np.array_equal(replaced.alpha_, first.alpha_)
    assert sorted(os.listdir(run_dir)) == ["components.zarr", "timings.json"]  # no temporaries

    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunDirectoryError, match="not a directory"):
        model_for("kha", seed, UNREACHABLE, passes=1).fit(
            digits_store.path, run_dir=str(tmp_path / "afile"))


def test_transform(runs, oracle, digits, seed):
    model, _ = runs["kha-smd"]
    Kc, K = oracle["Kc"], oracle["K"]
    rng = np.random.default_rng(seed)
    idx = rng.choice(300, 25, replace=False)
    got = model.transform(digits[idx])
    want = (model.alpha_ @ Kc[:, idx]).T
    assert got.shape == (25, R)
    scale = (np.abs(model.alpha_) @ np.abs(Kc[:, idx])).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * scale)

    # new samples, centered with the training mk: k'(x)_j = k(x, x_j) − mk_j − k̄(x) + mkm
    from scipy.spatial.distance import cdist

    Xnew = digits[idx[:5]] + 0.2 * rng.normal(size=(5, 64))
    Knew = np.exp(-cdist(Xnew, digits, "sqeuclidean") / (2 * SIGMA**2))
    Kc_new = Knew - K.mean(axis=0) - Knew.mean(axis=1)[:, None] + K.mean()
    np.testing.assert_allclose(model.transform(Xnew), Kc_new @ model.alpha_.T, rtol=0,
                               atol=1e-11 * scale)


def test_all_components_refused_above_the_dense_limit(digits_store):
    """n_components=None (scikit-learn's all components) fits l − 1 of them: refused in one
    line, before any work, where l is above dkha.dense-eigh-limit. (n_components ≥ l is
    scikit-learn's: null components, tests/test_sklearn_kernel_pca_port.py.)"""
    import dask

    model = KernelHebbianPCA(None, algorithm="kha", sigma=SIGMA, passes=1, client=UNREACHABLE)
    with dask.config.set({"dkha.dense-eigh-limit": 100}), \
            pytest.raises(ParameterError, match=r"n_components=None asks for all 299 components"):
        model.fit(digits_store.path)


@pytest.mark.parametrize("eta0", [0.0, -0.1, float("nan")])
def test_nonpositive_eta0_refused(digits_store, eta0):
    model = KernelHebbianPCA(R, algorithm="kha-et", sigma=SIGMA, eta0=eta0, passes=1,
                             client=UNREACHABLE)
    with pytest.raises(ParameterError,
                       match="'eta0' parameter of KernelHebbianPCA must be a float"):
        model.fit(digits_store.path)


@pytest.mark.parametrize("algorithm", ["kha-smd", "krylov"])
def test_row_cache_fit_equals_uncached(runs, oracle, digits_store, client, seed, algorithm):
    """``cache_rows=True`` (kernel tiles kept on the workers) changes only rounding."""
    if algorithm == "krylov":
        plain = model_for("krylov", seed, client, tol=1e-10).fit(digits_store.path)
    else:
        plain = runs[algorithm][0]
    cached = model_for(algorithm, seed, client, cache_rows=True,
                       **({"tol": 1e-10} if algorithm == "krylov" else {})).fit(digits_store.path)
    if algorithm == "krylov":  # eigenvectors up to sign
        signs = np.sign(np.sum(cached.alpha_ * plain.alpha_, axis=1, keepdims=True))
        np.testing.assert_allclose(cached.alpha_ * signs, plain.alpha_,
                                   atol=1e-8 * np.abs(plain.alpha_).max())
    else:
        np.testing.assert_allclose(cached.alpha_, plain.alpha_, rtol=0,
                                   atol=1e-9 * np.abs(plain.alpha_).max())
    _E, _, excess = dense_errors(oracle, cached.alpha_)
    assert cached.history_[-1]["excess"] == pytest.approx(excess, rel=1e-8, abs=1e-12)
