"""Saved runs as plain xarray takes them (issue 43): a default (Krylov) batch run of a
``--max-samples`` patch store, models fitted together and a transform's output open with
``xarray.open_zarr`` / ``open_datatree`` and round-trip through ``to_netcdf`` as they are; the
README's xarray recipes run on them; CF attributes; only the settings that played a part; an
entry per Krylov product; pictures upright; ``save()`` writes the run ``fit(run_dir=…)`` writes
(issue 44); runs saved before still load."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import logging
import os
import re
import warnings

import dask
import numpy as np
import pytest
import xarray as xr
import zarr

import dkha
from dkha import KernelHebbianPCA, fit_together
from dkha.data import cf, result
from dkha.data.layout import components_path
from dkha.errors import InputError, RunDirectoryError
from dkha.runs.transform import transform_store
from dkha.solvers.eigen import top_eigenpairs
from tests.processes import REPO
from tests.test_readme import python_blocks

R = 6
#: the default path's dense matrix refused: the default fit runs blockwise Krylov
KRYLOV = {"dkha.dense-bytes": 1e5}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, client):
    """Two photographs cut into 5×5 patches with ``max_samples`` (positions left blank), the
    default fit of them saved as ``run`` (the Krylov path), two models fitted together as
    ``runs/et`` and ``runs/smd``."""
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
    together = fit_together([KernelHebbianPCA(4, algorithm=a, sigma=3.0, passes=2)
                             for a in ("kha-et", "kha-smd")], store.path,
                            run_dirs=[str(d / "runs" / "et"), str(d / "runs" / "smd")])
    return d, store, model, together


def _open(path, **kw):
    """``xarray.open_zarr`` with every warning an error (zarr's about data types, xarray's about
    consolidated metadata)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_zarr(path, **kw)


def _round_trip(ds: xr.Dataset, path) -> xr.Dataset:
    """``ds`` written by ``to_netcdf`` (whatever engine plain xarray has: with scipy's, loaded
    first, as a lazy dataset is not written by it under a distributed client) and read back."""
    ds = ds.load()
    ds.to_netcdf(path)
    with xr.open_dataset(path) as back:
        back = back.load()
    numeric = [k for k, v in ds.variables.items() if v.dtype.kind in "biuf"]
    xr.testing.assert_allclose(back[numeric].reset_coords(drop=True),
                               ds[numeric].reset_coords(drop=True).load(), rtol=0, atol=0)
    for k, v in ds.coords.items():
        if v.dtype.kind in "UOT":
            assert back[k].values.astype(str).tolist() == v.values.astype(str).tolist()
    assert cf.decode_attrs(back.attrs).keys() == cf.decode_attrs(ds.attrs).keys()
    return back


def test_a_default_krylov_run_opens_in_plain_xarray_and_round_trips_netcdf(runs, tmp_path):
    d, _, model, _ = runs
    ds = _open(d / "run" / "components.zarr")
    assert ds.attrs["Conventions"].startswith("CF-")
    assert "fit auto (krylov)" in ds.attrs["history"] and "dkha" in ds.attrs["title"]
    for name in ("alpha", "eigenvalue", "mk", "projection", "component_image", "residual",
                 "ritz_value", "pass", "wall_time", "component", "image", "row", "col",
                 "patch_row", "patch_col"):
        assert {"long_name", "units"} <= set(ds[name].attrs), name
    assert "grid index" in ds["row"].attrs["long_name"]
    back = _round_trip(ds, tmp_path / "run.nc")
    attrs = cf.decode_attrs(back.attrs)
    assert json.loads(back.attrs["kernel_parameters"]) == model.kernel_.param_dict
    assert attrs["centered"] is True and attrs["algorithm"] == "auto"
    # dkha reads the attrs back as they were
    loaded = result.load(d / "run")
    assert loaded.attrs["kernel_parameters"] == model.kernel_.param_dict
    assert loaded.attrs["history_measures"] == [h["measure"] for h in model.history_]


def test_a_krylov_run_records_only_the_settings_that_played_a_part(runs):
    d, _, model, _ = runs
    unused = {"eta0", "mu", "xi", "rho0", "gain_params", "init", "passes", "n_steps"}
    assert not unused & set(_open(d / "run" / "components.zarr").attrs)
    assert not unused & set(model.attrs_)
    back = dkha.load(str(d / "run")).get_params()
    assert {k: back[k] for k in ("mu", "xi", "passes", "steps", "init", "eta0")} == dict.fromkeys(
        ("mu", "xi", "passes", "steps", "init", "eta0"))
    # KHA/et: its gains, not SMD's
    et = result.load(d / "runs" / "et").attrs
    assert {"eta0_applied", "n_steps", "passes", "init"} <= set(et)
    assert not {"mu", "xi", "rho0"} & set(et)
    assert {"mu", "xi", "rho0"} <= set(result.load(d / "runs" / "smd").attrs)


def test_a_krylov_run_has_an_entry_per_product(runs):
    """The default's Krylov path records the largest residual and the Ritz values after each
    K'V product (before: one entry, the last product's): the README's plot along ``pass``
    draws a line, not a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d, _, model, _ = runs
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



def test_the_readme_xarray_recipes_run_on_the_krylov_run_of_a_max_samples_store(runs):
    """The README's blocks that read ``run/components.zarr`` with plain xarray, plots included,
    on a default (Krylov) run of a store with blank patch positions (before: unstacking the
    projections raised DTypePromotionError on the lazy ``image_name``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d, store, _, _ = runs
    with open(f"{REPO}/README.md", encoding="utf-8") as f:
        blocks = [b for b in python_blocks(f.read()) if 'xr.open_zarr("run/components.zarr")' in b]
    assert len(blocks) == 2, "the README's xarray recipes moved"
    names: dict = {"dkha": dkha, "xr": xr}
    plt.close("all")      # (figure 1 is the README's: one another test left open is not)
    with contextlib.chdir(d):
        for block in blocks:
            exec(compile(block, "README.md", "exec"), names)    # noqa: S102 - the README's code
    assert names["figure"] == "residual"
    assert len(plt.figure(1).axes[0].lines[0].get_xdata()) == _open(
        d / "run" / "components.zarr").sizes["evaluation"] > 1       # a line, not a dot
    maps = names["maps"]
    assert maps.dims == ("component", "image", "row", "col")
    ds = names["ds"]
    kept = ds.projection.isel(sample=7)
    got = maps.sel(image=int(kept.image), row=int(kept.row), col=int(kept.col))
    np.testing.assert_array_equal(got.values, kept.values)
    assert int(maps.isel(component=0).notnull().sum()) == store.n_samples  # blanks: NaN
    assert (d / "run.nc").exists()
    # the store too: its image names are numpy strings, which unstacking pads
    X = _open(store.path)["X"].set_index(sample=["image", "row", "col"]).unstack()
    assert X.dims == ("feature", "image", "row", "col") and X["image_name"].dtype.kind == "O"
    plt.close("all")


def test_component_pictures_plot_upright(runs):
    """``.plot.imshow()`` of a picture draws its first row (the top of the patch, in image
    order) at the top of the axes, with no ``yincrease=False``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = runs[0]
    picture = _open(d / "run" / "components.zarr").component_image.sel(component=0).load()
    image = picture.plot.imshow()
    bottom, top = image.get_extent()[2:]
    low, high = image.axes.get_ylim()
    assert image.origin == "upper"      # the array's first row drawn at ``top``
    assert (top > bottom) == (high > low), "the first row is drawn at the bottom"
    plt.close("all")


def test_arrays_along_samples_are_chunked_along_samples(runs, tmp_path, monkeypatch):
    model = runs[2]
    monkeypatch.setattr(result, "SAMPLE_CHUNK_BYTES", 8 * R * 100)
    model.save(str(tmp_path / "saved"))
    group = zarr.open_group(str(tmp_path / "saved" / "components.zarr"), mode="r")
    assert group["alpha"].chunks == (R, 100)
    assert group["projection"].chunks == (100, R)
    assert group["mk"].chunks == (R * 100,)


def test_save_writes_the_run_that_fit_writes(runs, tmp_path):
    """One builder of a run: ``save()`` of a fitted model writes what ``fit(run_dir=…)`` wrote
    (the pictures, added after the fit, included): the same datasets, attrs, chunks, timings."""
    d, _, model, together = runs
    for m, fitted in ((model, d / "run"), (together[0], d / "runs" / "et")):
        saved = tmp_path / fitted.name
        m.save(str(saved))
        a = xr.open_zarr(components_path(str(fitted))).load()     # (et: in the runs' tree)
        b = xr.open_zarr(saved / "components.zarr").load()
        xr.testing.assert_identical(a, b)
        assert a.attrs == b.attrs
        for name in a.variables:
            assert a[name].encoding.get("chunks") == b[name].encoding.get("chunks"), name
        with open(fitted / "timings.json") as f, open(saved / "timings.json") as g:
            assert json.load(f) == json.load(g)


def test_models_fitted_together_are_one_datatree(runs, tmp_path):
    d, store, _, together = runs
    tree_path = d / "runs" / "components.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = xr.open_datatree(tree_path, engine="zarr")
    assert set(tree.children) == {"et", "smd"}
    for name, m in zip(("et", "smd"), together):
        node = tree[name].to_dataset()
        np.testing.assert_array_equal(node["alpha"].values, m.alpha_)
        assert node.attrs["algorithm"] == m.algorithm
        _round_trip(node, tmp_path / f"{name}.nc")
        loaded = dkha.load(str(d / "runs" / name))
        np.testing.assert_array_equal(loaded.alpha_, m.alpha_)
        assert loaded.get_params()["algorithm"] == m.algorithm
        assert os.path.exists(d / "runs" / name / "timings.json")
    with pytest.raises(InputError, match=r"2 models fitted together \(et, smd\)"):
        dkha.load(str(d / "runs"))
    # the tree still tells runs apart: other settings into it are refused
    with pytest.raises(RunDirectoryError, match="already holds a different run"):
        fit_together([KernelHebbianPCA(4, algorithm=a, sigma=2.0, passes=2)
                      for a in ("kha-et", "kha-smd")], store.path,
                     run_dirs=[str(d / "runs" / "et"), str(d / "runs" / "smd")])


def test_models_fitted_together_by_an_older_dkha_still_load(runs, tmp_path):
    """The layout before the tree: a ``components.zarr`` in each model's directory, the attrs as
    zarr's JSON (dicts, None) — made here by that structure."""
    d, _, _, together = runs
    for name, m in zip(("et", "smd"), together):
        ds = result.load(d / "runs" / name)
        ds.attrs = dict(ds.attrs, eta0=None)        # None and dicts, as zarr's JSON held them
        ds = ds.assign_coords({k: v.astype(object) for k, v in ds.coords.items()   # and the
                               if v.dtype.kind == "U"})     # names as variable-length strings
        os.makedirs(tmp_path / "old" / name)
        ds.to_zarr(tmp_path / "old" / name / "components.zarr", zarr_format=3,
                   consolidated=False)
        loaded = dkha.load(str(tmp_path / "old" / name))
        np.testing.assert_array_equal(loaded.alpha_, m.alpha_)
        assert loaded.get_params() == dkha.load(str(d / "runs" / name)).get_params()
        assert loaded.kernel_.param_dict == {"sigma": 3.0}
    assert not os.path.exists(tmp_path / "old" / "components.zarr")


def test_a_transform_output_names_its_run_and_opens_in_plain_xarray(runs, tmp_path, caplog):
    d, store, model, _ = runs
    out = tmp_path / "projected.zarr"
    caplog.set_level(logging.INFO, logger="dkha.progress")
    transform_store(str(d / "run"), store.path, str(out))
    # its progress: the samples projected, of all (issue 43: it had no fraction)
    lines = [r.getMessage() for r in caplog.records if r.name == "dkha.progress"
             and r.getMessage().startswith("transform: projecting")]
    n = store.n_samples
    assert lines[0] == f"transform: projecting: 0/{n} samples so far in 0 s", lines
    assert re.fullmatch(rf"transform: projecting: {n}/{n} samples in \d+ s", lines[-1]), lines
    ds = _open(out)
    a = cf.decode_attrs(ds.attrs)
    assert a["run"] == str(d / "run") and a["kernel"] == "gaussian"
    assert a["kernel_parameters"] == model.kernel_.param_dict       # σ
    assert a["Conventions"].startswith("CF-") and re.search(r"transform of .* by ", a["history"])
    np.testing.assert_allclose(ds["projection"].values, model.transform(store.read()),
                               rtol=1e-10, atol=1e-12)
    _round_trip(ds, tmp_path / "projected.nc")
    maps = ds.projection.set_index(sample=["image", "row", "col"]).unstack()
    assert maps.dims == ("component", "image", "row", "col")
