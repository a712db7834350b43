"""The online family's one driver (issue 44): ``OnlineKernelPCA.fit`` and ``partial_fit`` each
call ``fit/`` once (:func:`dkha.fit.online.fit_online`), with one typed, frozen request whose
settings are held to the parameter table here, and a frozen result."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import xarray as xr

import dkha
from dkha.data.ingest import ingest_array
from dkha.data.layout import components_path
from dkha.estimators import online as online_estimator
from dkha.estimators import online_run
from dkha.estimators.online import OnlineKernelPCA
from dkha.estimators.params import BATCH, ONLINE, parameters


@pytest.fixture
def calls(monkeypatch):
    """Every call the online estimator's modules make into a function of ``dkha.fit``, by name
    (each such function in their namespaces replaced by a spy that calls it)."""
    made = []
    for module in (online_estimator, online_run):
        for name, value in list(vars(module).items()):
            if inspect.isfunction(value) and value.__module__.startswith("dkha.fit."):
                def spy(*args, _f=value, **kwargs):
                    made.append(_f.__name__)
                    return _f(*args, **kwargs)
                monkeypatch.setattr(module, name, spy)
    return made


def _X(n=240, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 5))


def test_fit_and_partial_fit_each_call_the_driver_once(calls, tmp_path):
    X = _X()
    model = OnlineKernelPCA(3, sigma=3.0, steps=700, evaluate_every=300)
    model.fit(X, ac_reference=True)
    assert calls == ["fit_online"]
    assert [h["step"] for h in model.history_] == [300, 600, 700]
    model.partial_fit(X[:50])                        # continues the fit
    assert calls == ["fit_online"] * 2 and model.n_samples_seen_ == 750

    del calls[:]
    streamed = OnlineKernelPCA(3, sigma=3.0)
    for a in range(0, 240, 80):                      # a first call, then two continuing ones
        streamed.partial_fit(X[a:a + 80])
    assert calls == ["fit_online"] * 3
    assert [h["step"] for h in streamed.history_] == [80, 160, 240]
    assert streamed.member_index_.max() < 240 and streamed.n_steps_ == 240

    store = str(tmp_path / "x.zarr")
    ingest_array(X, store, chunk_rows=60)
    del calls[:]
    run = str(tmp_path / "run")
    OnlineKernelPCA(3, sigma=3.0, steps=500, block_rows=32).fit(store, run_dir=run,
                                                                checkpoint_every=200)
    assert calls == ["fit_online"]
    loaded = dkha.load(run)
    del calls[:]
    loaded.partial_fit(X[:30])
    assert calls == ["fit_online"] and loaded.n_samples_seen_ == 530


@pytest.mark.parametrize("algorithm", ["auto", "oo-kha"])
def test_save_writes_the_run_that_fit_writes(tmp_path, algorithm):
    """One builder of a run (:func:`dkha.fit.run_dir.run_dataset`), as the batch family's
    (tests/test_xarray_runs.py): an online model's ``save()`` writes what ``fit(run_dir=…)``
    wrote, the same datasets, attrs (the CF history line too: stamped when the fit ended) and
    chunks; the run saved after a ``partial_fit`` is the continued state."""
    X = _X()
    fitted, saved = str(tmp_path / "fitted"), str(tmp_path / "saved")
    model = OnlineKernelPCA(3, algorithm=algorithm, sigma=3.0, steps=600, evaluate_every=200)
    model.fit(X, run_dir=fitted, ac_reference=True)
    model.save(saved)
    a = xr.open_zarr(components_path(fitted)).load()
    b = xr.open_zarr(components_path(saved)).load()
    xr.testing.assert_identical(a, b)
    assert a.attrs == b.attrs
    for name in a.variables:
        assert a[name].encoding.get("chunks") == b[name].encoding.get("chunks"), name
    model.partial_fit(X[:40]).save(saved)
    c = dkha.load(saved)
    assert c.n_samples_seen_ == 640 and len(c.history_) == 4
    np.testing.assert_array_equal(c.alpha_, model.alpha_)


def test_a_stream_equals_its_blocks_applied_in_order():
    """partial_fit through the driver is the solver fed the rows in order, blocks of
    ``block_rows`` (the per-block form, written out here)."""
    from dkha.fit.online import new_solver

    X = _X(200, 1)
    model = OnlineKernelPCA(3, sigma=3.0, block_rows=16, seed=4)
    model.partial_fit(X[:120]).partial_fit(X[120:])
    solver = new_solver(model._fit.settings, 5, model.kernel_, 4)
    for a in range(0, 120, 16):
        solver.apply_block(X[a:min(a + 16, 120)], np.arange(a, min(a + 16, 120)))
    for a in range(120, 200, 16):
        solver.apply_block(X[a:min(a + 16, 200)], np.arange(a, min(a + 16, 200)))
    np.testing.assert_array_equal(model.alpha_, solver.alpha())
    np.testing.assert_array_equal(model.member_index_, solver.members()[0])


def test_the_request_is_typed_and_held_to_the_table_and_the_result_frozen():
    from dkha.fit.online import OnlineFit, OnlineRequest, OnlineSettings

    request = {f.name for f in dataclasses.fields(OnlineRequest)}
    settings = {f.name for f in dataclasses.fields(OnlineSettings)}
    # the rows the estimator hands over elsewhere in the request than its settings
    elsewhere = {"kernel": "kernel", "sigma": "kernel_params", "degree": "kernel_params",
                 "offset": "kernel_params", "kernel_params": "kernel_params",
                 "kernel_gamma": "kernel_params", "steps": "n_steps",
                 "evaluate_every": "every", "seed": "seed", "verbose": "verbose",
                 "block_rows": "settings", "prefetch": "settings"}
    resolved_by_the_fit = {"feature_norm", "gain"}
    rows = {p.name for p in parameters(ONLINE)}
    assert rows == (settings - resolved_by_the_fit) | set(elsewhere)
    assert not (settings - resolved_by_the_fit) & set(elsewhere)
    assert set(elsewhere.values()) <= request

    model = OnlineKernelPCA(3, sigma=3.0, steps=300).fit(_X())
    fit = model._fit
    assert isinstance(fit, OnlineFit) and isinstance(fit.history, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.n_steps = 0
    with pytest.raises(TypeError):
        fit.attrs["n_steps"] = 0
    req = model._request(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.model.nu = 1.0
    with pytest.raises(TypeError):
        req.params["eta0"] = 1.0
    # the fit resolved the scales on the data; the model's settings as asked leave them open
    assert model._fit.settings.feature_norm > 0 and model._fit.settings.nu > 0
    assert req.model.feature_norm is None and req.model.nu is None


def test_both_requests_take_the_tables_rows_by_name():
    """Each field of the batch ``ModelRequest`` and of ``OnlineSettings`` named as a row of its
    estimator's table holds that row's value, of the row's type
    (:func:`dkha.estimators.params.request_values`): a new setting is a row and a field."""
    from dkha import KernelHebbianPCA, config
    from dkha.fit.online import OnlineSettings
    from dkha.fit.request import ModelRequest

    batch = KernelHebbianPCA(3, algorithm="kha-smd", eta0=1, mu=0.5, rho0=0, init="random",
                             tol=1, steps=50)
    req = batch._request(40, config.settings())
    own = {"n_components", "center_sample", "verbose"}      # checked against the data
    rows = {p.name for p in parameters(BATCH)} & {f.name for f in dataclasses.fields(ModelRequest)}
    assert rows - own == {"algorithm", "eta0", "mu", "xi", "rho0", "init", "tol", "on_divergence"}
    for name in rows - own:
        assert getattr(req, name) == getattr(batch, name), name
    assert [type(getattr(req, k)) for k in ("eta0", "rho0", "tol")] == [float] * 3
    assert req.xi is None and req.n_steps == 50      # xi's default is the fit's (settings_of)

    online = OnlineKernelPCA(3, eta0=1, nu=2, max_members=np.int64(50), center=np.bool_(True))
    settings = online._request(None).model
    assert isinstance(settings, OnlineSettings)
    assert (settings.eta0, settings.nu, settings.max_members, settings.center) == (1.0, 2.0, 50,
                                                                                   True)
    assert [type(v) for v in (settings.eta0, settings.nu, settings.max_members,
                              settings.center)] == [float, float, int, bool]
