"""Saved runs as plain xarray takes them (issue 43): the default (Krylov) fit of a
``--max-samples`` patch store has an entry per K'V product (the README's plot along ``pass``
draws a line, the report's convergence panel too); the solver's trace behind it, checked
against numpy.linalg.eigh and continued by a resumed solve."""

from __future__ import annotations

import copy
import itertools
import warnings

import dask
import numpy as np
import pytest
import xarray as xr

import dkha
from dkha import KernelHebbianPCA
from dkha.solvers.eigen import top_eigenpairs

R = 6
#: the default path's dense matrix refused: the default fit runs blockwise Krylov
KRYLOV = {"dkha.dense-bytes": 1e5}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, client):
    """Two photographs cut into 5×5 patches with ``max_samples`` (positions left blank), the
    default fit of them saved as ``run`` (the Krylov path)."""
    import skimage.data
    import skimage.transform

    d = tmp_path_factory.mktemp("xarray")
    # 1 783 patch positions, 1 500 kept: more samples than the Nyström start's 400 landmarks
    # (the Krylov solve takes several products), fewer than dkha.inline-samples (no cluster)
    photos = [skimage.transform.resize(skimage.data.camera(), (70, 80), anti_aliasing=True),
              skimage.transform.resize(skimage.data.coins(), (50, 50), anti_aliasing=True)]
    store = dkha.ingest_images(photos, str(d / "data.zarr"), patch=5, step=2, max_samples=1500)
    with dask.config.set(KRYLOV):
        model = KernelHebbianPCA(R).fit(store.path, run_dir=str(d / "run"))
    assert model.attrs_["path"] == "krylov"
    return d, store, model


def _open(path, **kw):
    """``xarray.open_zarr`` with every warning an error (zarr's about data types, xarray's about
    consolidated metadata)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_zarr(path, **kw)


def test_a_krylov_run_has_an_entry_per_product(runs):
    """The default's Krylov path records the largest residual and the Ritz values after each
    K'V product (before: one entry, the last product's): the README's plot along ``pass``
    draws a line, not a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d, _, model = runs
    ds = _open(d / "run" / "components.zarr").load()
    n = ds.sizes["evaluation"]
    assert n >= 3 and ds["pass"].values.tolist() == list(range(1, n + 1))
    assert len(model.history_) == n
    assert np.all(np.diff(ds["wall_time"].values) >= 0)
    residual = ds["residual"].values
    assert np.isfinite(residual).all() and residual[-1] < 1e-5 < residual[0]
    assert ds["residual"].attrs["units"] == "1"
    # the last Ritz values are the eigenvalues the solve returned
    assert ds["ritz_value"].dims == ("evaluation", "component")
    assert {"long_name", "units"} <= set(ds["ritz_value"].attrs)
    np.testing.assert_allclose(ds["ritz_value"].values[-1], ds["eigenvalue"].values, rtol=1e-12)
    # the README's plot
    figure = next(f for f in ("residual", "excess", "change") if f in ds)
    line, = ds[figure].where(ds[figure] > 0).plot.line(x="pass", yscale="log", marker="o")
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, n + 1))
    plt.close("all")
    # dkha.load gives the entries back, the Ritz values per component
    back = dkha.load(str(d / "run"))
    assert [h["pass"] for h in back.history_] == list(range(1, n + 1))
    np.testing.assert_array_equal(back.history_[0]["ritz_value"], ds["ritz_value"].values[0])


def test_the_reports_convergence_panel_draws_every_product(runs):
    from dkha.data import result
    from dkha.pipeline.report import convergence_figure

    d = runs[0]
    ds = result.load(d / "run")
    fig = convergence_figure({"run": ds})
    ax, = fig.axes
    assert ax.get_xlabel() == "K'V products (block Krylov)"
    assert ax.get_ylabel().startswith("largest relative residual")
    line, = ax.lines
    assert line.get_xdata().tolist() == ds["pass"].values.tolist()
    assert len(line.get_xdata()) == ds.sizes["evaluation"] >= 3
    fig.clf()


def test_the_solvers_trace_is_each_products_residual_and_ritz_values_and_a_resume_continues_it():
    """``top_eigenpairs``'s trace against the per-product figures computed here from
    numpy.linalg.eigh of a dense matrix: after each product, the wanted Ritz values and the
    largest relative residual; a solve resumed from a state continues the trace as the
    uninterrupted solve made it."""
    rng = np.random.default_rng(0)
    n, r, block = 300, 4, 8
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    w_true = 1.0 / np.arange(1, n + 1) ** 1.5
    K = (Q * w_true) @ Q.T
    X0 = rng.standard_normal((n, block))
    states = []     # (copies: a state's arrays are views of the solver's buffers)
    w, V, info = top_eigenpairs(lambda V: K @ V, X0, r, tol=1e-10, max_basis=3 * block,
                                on_state=lambda s: states.append(copy.deepcopy(s)))
    np.testing.assert_allclose(w, w_true[:r], rtol=1e-9)
    trace = info.trace
    assert [t["products"] for t in trace] == list(range(1, len(trace) + 1))
    assert len(trace) >= 4 and info.restarts >= 1
    assert [t["residual"] for t in trace] == info.history
    np.testing.assert_allclose(trace[-1]["ritz"], w, rtol=1e-12)
    for t in trace:    # Ritz values from below, the largest first (Cauchy interlacing)
        assert np.all(np.asarray(t["ritz"]) <= w_true[:r] * (1 + 1e-12))
    assert trace[-1]["residual"] <= 1e-10 < trace[0]["residual"]
    assert all(b["seconds"] >= a["seconds"] for a, b in itertools.pairwise(trace))
    # the largest relative residual of the last pairs, from V
    res = np.linalg.norm(K @ V - V * w, axis=0) / w
    assert trace[-1]["residual"] == pytest.approx(res.max(), rel=1e-3, abs=1e-13)
    # a resume from the state at product 3 continues the trace as it was
    mid = next(s for s in states if s.products == 3)
    assert [t["products"] for t in mid.trace] == [1, 2]
    w2, _, again = top_eigenpairs(lambda V: K @ V, X0, r, tol=1e-10, max_basis=3 * block,
                                  state=mid)
    np.testing.assert_array_equal(w2, w)
    assert [t["products"] for t in again.trace] == [t["products"] for t in trace]
    assert [t["ritz"] for t in again.trace] == [t["ritz"] for t in trace]
    assert again.trace[2]["seconds"] >= again.trace[1]["seconds"] == trace[1]["seconds"]
