"""Patch provenance, training projections as response maps, component pictures, the report page
in a real headless Chromium."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
import xarray as xr

from dkha import KernelHebbianPCA
from dkha.data import result
from dkha.data.store import open_store
from tests.browser import chromium, decoded_images, rendered_images
from tests.processes import dkha_in_process

PATCH, STEP = 5, 2


def _dkha(*args, cwd):
    """``dkha ARGS`` run in this process (on the module's client) in the directory ``cwd``."""
    with contextlib.chdir(cwd):
        p = dkha_in_process(*args)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def photo_run(tmp_path_factory, client):
    """Two photographs of different sizes ingested by ``dkha ingest images``, a KHA/et fit saved
    as a run, and ``dkha transform`` of the same store."""
    import skimage.data
    import skimage.io
    import skimage.transform

    d = tmp_path_factory.mktemp("photos")
    shapes = {"camera.png": (30, 38), "coins.png": (24, 28)}
    for name, shape in shapes.items():
        img = getattr(skimage.data, name[:-4])()
        img = skimage.transform.resize(img, shape, anti_aliasing=True)
        skimage.io.imsave(d / name, (img * 255).astype(np.uint8), check_contrast=False)
    _dkha("ingest", "images", "camera.png", "coins.png", "-o", "patches.zarr", "--patch",
          str(PATCH), "--step", str(STEP), cwd=d)
    model = KernelHebbianPCA(3, algorithm="kha-et", sigma=1.5, passes=2, block_rows=64,
                             client=client).fit(str(d / "patches.zarr"), run_dir=str(d / "run"))
    _dkha("transform", "run", "patches.zarr", "-o", "projected.zarr", cwd=d)
    return d, shapes, model


def test_store_carries_patch_provenance(photo_run):
    import skimage.io

    d, shapes, _ = photo_run
    ds = xr.open_zarr(d / "patches.zarr")
    assert {"image", "image_name", "row", "col"} <= set(ds.coords)
    X = ds["X"].values
    for i, (name, shape) in enumerate(shapes.items()):
        img = np.asarray(skimage.io.imread(d / name), dtype=np.float64) / 255
        sel = ds["image"].values == i
        assert set(ds["image_name"].values[sel]) == {name}
        # each patch is the pixels at (STEP·row, STEP·col) of its image
        for k in np.flatnonzero(sel)[[0, 7, -1]]:
            r, c = int(ds["row"].values[k]), int(ds["col"].values[k])
            np.testing.assert_allclose(X[k].reshape(PATCH, PATCH),
                                       img[STEP * r:STEP * r + PATCH, STEP * c:STEP * c + PATCH])


def test_response_maps_equal_dkha_transform(photo_run):
    d, shapes, model = photo_run
    ds = result.load(d / "run")
    assert ds["projection"].dims == ("sample", "component")
    maps = ds.projection.set_index(sample=["image", "row", "col"]).unstack()
    projected = result.objects_for_strings(xr.open_zarr(d / "projected.zarr")).load()
    assert {"image", "row", "col"} <= set(projected.coords)  # carried through the transform
    expected = projected.projection.set_index(sample=["image", "row", "col"]).unstack()
    store = open_store(d / "patches.zarr")
    for i, (name, shape) in enumerate(shapes.items()):
        grid = ((shape[0] - PATCH) // STEP + 1, (shape[1] - PATCH) // STEP + 1)
        one = maps.sel(image=i).dropna("row", how="all").dropna("col", how="all")
        assert one.sizes["row"] == grid[0] and one.sizes["col"] == grid[1]
        assert np.isfinite(one.values).all()
        ref = expected.sel(image=i).dropna("row", how="all").dropna("col", how="all")
        np.testing.assert_allclose(one.transpose("component", "row", "col").values,
                                   ref.transpose("component", "row", "col").values,
                                   rtol=0, atol=1e-10)
        assert store.attrs["source"]["images"][i]["grid"] == list(grid)
    # and the in-memory transform of a few patches agrees with the saved projections
    np.testing.assert_allclose(model.transform(store.read(0, 9)), ds["projection"].values[:9],
                               rtol=0, atol=1e-10)


def test_component_pictures_are_preimages(photo_run, client):
    """Each picture is a fixed point of Mika's iteration for its target point: the weighted mean
    of the training patches with weights γ_j k(z, x_j), computed here with plain numpy."""
    from scipy.spatial.distance import cdist

    d, _, _ = photo_run
    ds = result.load(d / "run")
    pics = ds["component_image"]
    assert pics.dims == ("component", "patch_row", "patch_col") and pics.shape == (3, PATCH, PATCH)
    X = open_store(d / "patches.zarr").read()
    A = ds["alpha"].values
    sigma = ds.attrs["kernel_parameters"]["sigma"]
    spread = ds["projection"].values.std(axis=0)
    for i in range(3):
        beta = np.zeros(3)
        beta[i] = 2.0 * spread[i]
        gamma = beta @ A + (1.0 - beta @ A.sum(axis=1)) / len(X)  # PΦ + mean, over Φ(x_j)
        z = pics.values[i].ravel()
        w = gamma * np.exp(-cdist(z[None], X, "sqeuclidean")[0] / (2 * sigma**2))
        np.testing.assert_allclose(w @ X / w.sum(), z, atol=1e-3)


def test_models_fitted_together_get_their_own_pictures(photo_run, client):
    """fit_together on patches draws every model's pictures on one cluster: each model gets
    the pictures the same model fitted alone gets, in memory and in its saved run."""
    from dkha import fit_together

    d, _, _ = photo_run
    store = str(d / "patches.zarr")

    def model(eta0):
        # a random start: the Nyström start is already exact here, and every gain would keep it
        return KernelHebbianPCA(3, algorithm="kha-et", sigma=1.5, passes=1, eta0=eta0,
                                init="random", block_rows=64, projections="coordinator",
                                client=client)

    gains = (0.02, 2.0)
    runs = [str(d / f"together-{g}") for g in gains]
    together = fit_together([model(g) for g in gains], store, run_dirs=runs)
    pics = [m.component_image_.values for m in together]
    assert not np.allclose(pics[0], pics[1], atol=1e-6)      # two models, two sets
    for m, g, run in zip(together, gains, runs):
        alone = model(g).fit(store)
        np.testing.assert_allclose(m.component_image_.values, alone.component_image_.values,
                                   atol=1e-8)
        np.testing.assert_array_equal(result.load(run)["component_image"].values,
                                      m.component_image_.values)


@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (.ci/run installs it)")
def test_report_page_decodes_in_chromium(photo_run):
    d, _, _ = photo_run
    p = _dkha("report", "run", cwd=d)
    assert p.stdout.strip().endswith("report.html")
    page = (d / "run" / "report.html").read_text()
    sizes = decoded_images(page)
    # the convergence curve, the component pictures, 3 components × 2 images of maps: decoded
    assert len(sizes) == 2 + 3 * 2 and all(w > 50 and h > 50 for w, h in sizes), sizes
    # the probe can fail: a broken picture decodes to nothing
    broken = page.replace("base64,iVBOR", "base64,AAAA", 1)
    assert min(w for w, _ in decoded_images(broken)) == 0

@pytest.fixture(scope="module")
def sampled_run(photo_run, client):
    """The same photographs ingested with ``--max-samples`` (a third of the positions), a KHA/et
    fit on them and ``dkha maps`` of both whole images."""
    d, shapes, _ = photo_run
    _dkha("ingest", "images", "camera.png", "coins.png", "-o", "sampled.zarr", "--patch",
          str(PATCH), "--step", str(STEP), "--max-samples", "70", cwd=d)
    KernelHebbianPCA(3, algorithm="kha-et", sigma=1.5, passes=2, block_rows=32,
                     client=client).fit(str(d / "sampled.zarr"), run_dir=str(d / "sampled"))
    p = _dkha("maps", "sampled", "camera.png", "coins.png", "-o", "maps.zarr", cwd=d)
    assert "maps.zarr" in p.stdout
    return d, shapes


def test_maps_of_a_sampled_store_cover_every_patch_position(sampled_run):
    """Every grid position of each image is projected (no NaN), equal to the projection computed
    here with numpy from the run's alpha, mk, mkm and the kernel against the training patches;
    at the sampled positions it equals the fit's own training projections."""
    import skimage.io
    from scipy.spatial.distance import cdist

    d, shapes = sampled_run
    ds = result.load(d / "sampled")
    train = open_store(d / "sampled.zarr").read()
    assert len(train) == 70
    maps = xr.open_zarr(d / "maps.zarr")["response"].load()
    assert maps.dims == ("component", "image", "row", "col")
    assert list(maps["image"].values) == list(shapes)
    alpha, mk, mkm, sigma = (ds["alpha"].values, ds["mk"].values, ds.attrs["mkm"],
                             ds.attrs["kernel_parameters"]["sigma"])
    for name, shape in shapes.items():
        img = np.asarray(skimage.io.imread(d / name), dtype=np.float64) / 255
        grid = ((shape[0] - PATCH) // STEP + 1, (shape[1] - PATCH) // STEP + 1)
        one = maps.sel(image=name)
        inside = one.isel(row=slice(0, grid[0]), col=slice(0, grid[1])).values
        assert np.isfinite(inside).all()
        assert np.isnan(one.values).sum() == one.size - inside.size  # NaN only beyond the grid
        patches = np.array([img[STEP * r:STEP * r + PATCH, STEP * c:STEP * c + PATCH].ravel()
                            for r in range(grid[0]) for c in range(grid[1])])
        K = np.exp(-cdist(patches, train, "sqeuclidean") / (2 * sigma**2))
        expected = (K - mk - K.mean(axis=1, keepdims=True) + mkm) @ alpha.T
        np.testing.assert_allclose(inside.reshape(3, -1).T, expected, rtol=0, atol=1e-10)
    # the fit's training projections are the maps at the positions it drew
    proj = ds["projection"]
    names = list(shapes)
    for k in range(0, 70, 9):
        at = maps.sel(image=names[int(proj["image"][k])]).isel(
            row=int(proj["row"][k]), col=int(proj["col"][k]))
        np.testing.assert_allclose(at.values, proj.values[k], rtol=0, atol=1e-8)


def test_report_maps_of_a_whole_store_are_its_training_projections(photo_run, sampled_run,
                                                                  monkeypatch):
    """The report's maps of a run whose store holds every patch position of its images are the
    run's training projections, projected again by nothing (63 001 camera patches took a
    minute on 2 cores): equal to ``dkha transform`` of the store at every position of each
    image's grid, NaN only beyond it, the images by name. A ``--max-samples`` store's maps are
    still projected."""
    from dkha.pipeline import report

    d, shapes, _ = photo_run

    def projected_again(*args, **kwargs):
        raise AssertionError("the maps were projected again")

    monkeypatch.setattr(report, "response_maps", projected_again)
    with contextlib.chdir(d):
        maps, note = report.maps_for_report(result.load(d / "run"))
    assert note.startswith("every patch position of the training images"), note
    assert maps.dims == ("component", "image", "row", "col")
    assert list(maps["image"].values) == list(shapes)
    projected = result.objects_for_strings(xr.open_zarr(d / "projected.zarr")).load()
    expected = projected.projection.set_index(sample=["image", "row", "col"]).unstack()
    for i, (name, shape) in enumerate(shapes.items()):
        grid = ((shape[0] - PATCH) // STEP + 1, (shape[1] - PATCH) // STEP + 1)
        one = maps.sel(image=name).values
        inside = one[:, :grid[0], :grid[1]]
        assert np.isfinite(inside).all() and np.isnan(one).sum() == one.size - inside.size
        ref = expected.sel(image=i).transpose("component", "row", "col").values
        np.testing.assert_allclose(inside, ref[:, :grid[0], :grid[1]], rtol=0, atol=1e-10)
    called = []
    monkeypatch.setattr(report, "response_maps", lambda *a, **k: called.append(a) or "maps")
    with contextlib.chdir(sampled_run[0]):
        assert report.maps_for_report(result.load(sampled_run[0] / "sampled"))[0] == "maps"
    assert len(called) == 1


def test_maps_refuses_a_run_not_fitted_on_patches(tmp_path):
    from dkha.runs.maps import response_maps

    ds = result.build_dataset(np.ones((1, 3)), np.ones(1), [], {
        "algorithm": "kha", "kernel": "gaussian", "kernel_parameters": {"sigma": 1.0},
        "sigma": 1.0, "store": str(tmp_path / "plain.zarr"), "n_samples": 3, "n_features": 4},
        mk=np.zeros(3), mkm=0.0)
    from dkha.data.ingest import ingest_array

    ingest_array(np.zeros((3, 4)), str(tmp_path / "plain.zarr"))
    with pytest.raises(ValueError, match="not ingested from images"):
        response_maps(ds, [np.zeros((8, 8))])



@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (.ci/run installs it)")
def test_report_of_a_sampled_store_in_chromium(sampled_run):
    """``dkha report --maps`` of a run on a --max-samples store, rendered by Chromium: every
    picture decoded, one map panel per image and component under human titles, none of them
    blank (a NaN-only panel keeps only its colour bar in colour), the settings with units."""
    d, shapes = sampled_run
    _dkha("report", "sampled", "--maps", "maps.zarr", cwd=d)
    page = (d / "sampled" / "report.html").read_text()
    shown = rendered_images(page)
    assert all(im["width"] > 50 and im["height"] > 50 for im in shown), shown
    panels = [im for im in shown if im["kind"] == "map"]
    assert sorted(im["alt"] for im in panels) == sorted(
        f"{name}, component {c}" for name in shapes for c in (0, 1, 2))   # as ds.component
    assert all(im["coloured"] > 0.3 for im in panels), panels
    assert [im["kind"] for im in shown].count("components") == 1
    assert "All 3 components." in page and "wall time of fitting (s)" in page
    assert ".npy" not in page and "noisy-0" not in page
    # the same page's maps with every position but one component's blank: the probe sees it
    import xarray as xr

    maps = xr.open_zarr(d / "maps.zarr").load()
    maps["response"][1] = np.nan
    maps.to_zarr(d / "blank.zarr", mode="w", consolidated=False)
    _dkha("report", "sampled", "--maps", "blank.zarr", cwd=d)
    blank = rendered_images((d / "sampled" / "report.html").read_text())
    low = sorted(im["alt"] for im in blank if im["kind"] == "map" and im["coloured"] < 0.3)
    assert low == sorted(f"{name}, component 1" for name in shapes), blank


def test_report_axes_and_settings_read_as_a_person_expects():
    """Convergence on each algorithm's own axis (K'V products for krylov), integers as
    integers, seconds with their unit."""
    from dkha.pipeline.report import convergence_figure, settings_rows

    def run(algorithm, history, **old):
        return result.build_dataset(np.ones((2, 4)), np.ones(2), history, {
            "algorithm": algorithm, "kernel": "gaussian", "kernel_parameters": {"sigma": 2.0},
            "n_components": 2, "n_samples": 4, "n_features": 3, **old})

    def h(p, step, excess, wall):
        return {"pass": p, "step": step, "error": 1.0, "error_min": 1.0, "excess": excess,
                "wall_time": wall}

    krylov = run("krylov", [h(32, 0, 1e-9, 7.638)])
    smd = run("kha-smd", [h(0, 0, 1e-2, 0.5), h(1, 50000, 1e-3, 2.0), h(2, 100000, 1e-4, 3.5)])
    fig = convergence_figure({"exact": krylov, "smd": smd})
    labels = [a.get_xlabel() for a in fig.axes]
    assert labels == ["pass over the training samples", "K'V products (block Krylov)"]
    assert fig.axes[1].lines[0].get_xdata().tolist() == [32]
    assert fig.axes[0].lines[0].get_xdata().tolist() == [0, 1, 2]
    rows = dict(settings_rows(smd, {"fit_seconds": 3.5}))
    assert rows["steps done"] == "100 000" and rows["passes done"] == "2"
    assert rows["wall time of the passes (s)"] == "3.5" and rows["time: fit (s)"] == "3.5"
    # the fit's total (timings.json, centering and start included) is its wall time
    rows = dict(settings_rows(smd, {"startup": 1.0, "centering": 0.5, "stream": 3.5,
                                    "total": 5.0, "attempts": 1}))
    assert rows["wall time of fitting (s)"] == "5" and rows["time: centering (s)"] == "0.5"
    assert "time: total (s)" not in rows and "time: attempts (s)" not in rows
    assert dict(settings_rows(krylov, None))["K'V products"] == "32"
    # the kernel's parameters from kernel_parameters (runs saved before: at the top level too)
    assert rows["σ (kernel width)"] == "2"
    older = run("kha-smd", [h(0, 0, 1e-2, 0.5)], sigma=2.0)
    assert [r for r in settings_rows(older, None) if r[0].startswith("σ")] == [
        ("σ (kernel width)", "2")]


def test_runs_hold_and_report_only_what_was_measured():
    """A default Krylov run evaluated by its residual holds no error/excess (absent, not NaN),
    its report plots the residual against K'V products with no round-off claim and no KHA gains
    in its settings; a tracked KHA run holds captured/change and no excess."""
    from dkha.pipeline.report import convergence_figure, settings_rows

    nan = float("nan")
    attrs = {"algorithm": "auto", "path": "krylov", "path_reason": "the cost model",
             "kernel": "gaussian", "kernel_parameters": {"sigma": 2.0}, "n_components": 2,
             "n_samples": 4, "n_features": 3, "eta0": None, "mu": 0.3, "passes": 10.0,
             "n_steps": 40}
    krylov = result.build_dataset(np.ones((2, 4)), np.ones(2), [
        {"pass": 6, "step": 0, "error": nan, "error_min": nan, "excess": nan, "wall_time": 1.5,
         "measure": "residual", "residual": 3e-9}], attrs)
    assert {"error", "error_min", "excess", "captured", "change"}.isdisjoint(krylov.variables)
    assert krylov["residual"].values.tolist() == [3e-9]
    ritz = result.build_dataset(np.ones((2, 4)), np.ones(2), [
        {"pass": p, "step": 4 * p, "error": nan, "error_min": nan, "excess": nan,
         "wall_time": 0.1 * p, "measure": "ritz", "captured": 10.0 + p,
         "change": nan if p == 0 else 10.0 ** -p} for p in range(3)],
        {**attrs, "algorithm": "kha-smd", "path": None, "eta0_applied": 1e-3})
    assert {"error", "excess", "residual"}.isdisjoint(ritz.variables)
    fig = convergence_figure({"exact": krylov, "smd": ritz})
    assert [a.get_ylabel() for a in fig.axes] == [
        "sine of the largest angle the span moved", "largest relative residual ‖K'v − θv‖/θ"]
    assert fig.axes[0].lines[0].get_xdata().tolist() == [1, 2]
    assert fig.axes[1].lines[0].get_ydata().tolist() == [3e-9]
    assert not [t for a in fig.axes for t in a.texts if "round-off" in t.get_text()]
    rows = dict(settings_rows(krylov, None))
    assert rows["algorithm"] == "auto → krylov" and rows["K'V products"] == "6"
    assert not {"μ (meta-gain)", "passes asked", "steps", "steps done", "passes done",
                "excess error E/E_min − 1"} & set(rows)
    kha = dict(settings_rows(ritz, None))
    assert kha["μ (meta-gain)"] == "0.3" and kha["passes done"] == "2"


def test_maps_and_transform_send_no_large_graph(sampled_run, photo_run):
    """``dkha maps`` and ``dkha transform`` send the images and the run's ``alpha`` and ``mk`` to
    the workers once, as data, and read the run without the cluster: no graph carries data.
    Distributed's large-graph warning lowered to sizes these small runs reach only with data
    inside (maps: 16 kB, the images' patches are 69 kB, the run read through dask 27 kB;
    transform: 8 kB, ``alpha`` and ``mk`` are 11 kB): no warning, and the same results."""
    d, _ = sampled_run

    def quiet(*argv, threshold):
        with contextlib.chdir(d):
            p = dkha_in_process(*argv, config={
                "distributed.admin.large-graph-warning-threshold": threshold})
        assert p.returncode == 0, p.stderr
        assert not [str(w.message) for w in p.warnings if "large graph" in str(w.message)]
        assert "large graph" not in p.stderr

    quiet("maps", "sampled", "camera.png", "coins.png", "-o", "quiet.zarr", threshold="16kB")
    quiet("transform", "run", "patches.zarr", "-o", "quiet-projected.zarr", threshold="8kB")
    maps = xr.open_zarr(d / "maps.zarr")["response"].values
    assert np.array_equal(xr.open_zarr(d / "quiet.zarr")["response"].values, maps,
                          equal_nan=True)
    projected = xr.open_zarr(d / "projected.zarr")["projection"].values
    assert np.array_equal(xr.open_zarr(d / "quiet-projected.zarr")["projection"].values,
                          projected)


def test_a_stop_during_the_component_pictures_leaves_a_run_that_resume_completes(
        photo_run, client, tmp_path, monkeypatch):
    """The pictures are the step after the fit, which has saved the run and cleared its
    checkpoints: a stop during them (SIGTERM a moment late) ends that step with the run saved,
    bit for bit the run of the same fit, without pictures, and exit code 75 pointing at
    ``--resume`` (issue 43); the resume draws them from the saved run, fitting nothing, the
    pictures of the uninterrupted fit bit for bit, and says so; once drawn, the run is
    finished. Before, the stop exited 0 into a run without pictures that no command could
    complete short of a refit (a resume said the fit was complete)."""
    from dkha.data.checkpoint import Checkpointer
    from dkha.engine.stop import STOP
    from dkha.errors import Interrupted, RunFinished
    from dkha.estimators import batch

    d, _, model = photo_run
    steps_before = []

    def stopped(*args, **kwargs):      # the signal arrives as the pictures begin
        steps_before.append(Checkpointer(kwargs["run_dir"]).steps())
        STOP.set()
        try:
            return add(*args, **kwargs)
        finally:
            STOP.clear()

    add = batch.add_component_pictures
    monkeypatch.setattr(batch, "add_component_pictures", stopped)
    run = str(tmp_path / "run")
    with pytest.raises(Interrupted, match=r"saved without its component pictures; continue "
                                          r"with `dkha fit \.\.\. --resume` to draw them"):
        KernelHebbianPCA(**model.get_params()).fit(str(d / "patches.zarr"), run_dir=run)
    assert steps_before == [[]]
    saved, whole = result.load(run), result.load(d / "run")
    assert "component_image" not in saved
    np.testing.assert_array_equal(saved["alpha"].values, whole["alpha"].values)
    alpha = os.path.join(run, "components.zarr", "alpha")
    alpha_files = {f: os.stat(os.path.join(alpha, f)).st_mtime_ns for f in os.listdir(alpha)}
    monkeypatch.setattr(batch, "add_component_pictures", add)

    with pytest.raises(RunFinished, match="drew its component pictures, which a stop had left"):
        KernelHebbianPCA(**model.get_params()).fit(str(d / "patches.zarr"), run_dir=run,
                                                   resume=True)
    drawn = result.load(run)
    np.testing.assert_array_equal(drawn["component_image"].values,
                                  whole["component_image"].values)
    np.testing.assert_array_equal(drawn["alpha"].values, whole["alpha"].values)
    assert {f: os.stat(os.path.join(alpha, f)).st_mtime_ns for f in os.listdir(alpha)} == \
        alpha_files     # nothing refitted
    with pytest.raises(RunFinished, match="finished: nothing to do"):
        KernelHebbianPCA(**model.get_params()).fit(str(d / "patches.zarr"), run_dir=run,
                                                   resume=True)
