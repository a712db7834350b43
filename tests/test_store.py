"""Data stores: ingest round trips, image patches, validation of bad stores, atomic writes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xarray as xr
import zarr

from dkha.data.ingest import ingest_array, ingest_images
from dkha.data.store import open_store
from dkha.errors import InputError, ParameterError, RunDirectoryError, StoreNotFoundError

# --- helpers ------------------------------------------------------------------------------------


def write_raw_store(path, X=None, *, dims=None, label=None, extra=None):
    """A zarr group written directly (not by dkha), to build stores dkha must refuse."""
    g = zarr.open_group(str(path), mode="w")
    if X is not None:
        X = np.asarray(X)
        if dims is None:
            dims = ["sample", "feature", "channel"][:X.ndim]
        arr = g.create_array("X", shape=X.shape, dtype=X.dtype,
                             chunks=tuple(max(1, s) for s in X.shape), dimension_names=dims)
        if X.size:
            arr[...] = X
    if label is not None:
        lab = g.create_array("label", shape=label.shape, dtype=label.dtype)
        lab[...] = label
    for name, value in (extra or {}).items():
        g.create_array(name, shape=value.shape, dtype=value.dtype)[...] = value
    return str(path)


def leftovers(parent, name):
    """Entries of ``parent`` that belong to an ingest into ``parent/name`` (target or temp)."""
    return sorted(e for e in os.listdir(parent) if e == name or e.startswith(f".{name}."))


def direct_patches(img, patch, step):
    """Patches on the grid of ``step``, row-major, by plain slicing."""
    rows = range(0, img.shape[0] - patch + 1, step)
    cols = range(0, img.shape[1] - patch + 1, step)
    return np.array([img[r:r + patch, c:c + patch].ravel() for r in rows for c in cols])


# --- ingest_array -------------------------------------------------------------------------------


def test_ingest_array_round_trip(digits_store, digits_with_labels):
    X, y = digits_with_labels
    s = digits_store
    assert (s.n_samples, s.n_features, s.chunk_rows, s.n_chunks) == (300, 64, 64, 5)
    assert s.has_labels
    np.testing.assert_array_equal(s.read(), X)
    np.testing.assert_array_equal(s.labels(), y)
    assert s.chunk_bounds(4) == (256, 300)
    # the zarr array itself: float64, chunked along sample only
    arr = zarr.open_group(s.path, mode="r")["X"]
    assert arr.dtype == np.float64 and arr.chunks == (64, 64) and arr.shape == (300, 64)
    # chunk by chunk, any row order
    got = np.concatenate([c for _, _, c in s.iter_chunks()])
    np.testing.assert_array_equal(got, X)
    idx = np.array([299, 3, 150, 64, 63, 3])
    np.testing.assert_array_equal(s.read_rows(idx), X[idx])
    np.testing.assert_array_equal(s.read(60, 70), X[60:70])
    assert s.attrs["format"] == "dkha-store" and s.attrs["source"]["shape"] == [300, 64]


def test_store_is_an_xarray_dataset(digits_store, digits_with_labels):
    X, y = digits_with_labels
    ds = xr.open_zarr(digits_store.path, consolidated=False)
    assert ds["X"].dims == ("sample", "feature")
    assert ds["label"].dims == ("sample",)
    assert dict(ds.sizes) == {"sample": 300, "feature": 64}
    assert ds["X"].encoding["chunks"] == (64, 64)
    np.testing.assert_array_equal(ds["X"].values, X)
    np.testing.assert_array_equal(ds["label"].values, y)
    assert ds.attrs["format"] == "dkha-store"


def test_ingest_npy_file(tmp_path, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(37, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=37)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y)
    s = ingest_array(tmp_path / "x.npy", tmp_path / "s.zarr", labels=tmp_path / "y.npy",
                     chunk_rows=10)
    assert (s.n_samples, s.n_features, s.n_chunks) == (37, 3, 4)
    np.testing.assert_array_equal(s.read(), X.astype(np.float64))
    np.testing.assert_array_equal(s.labels(), y)
    assert s.attrs["source"] == {"kind": "array", "path": str(tmp_path / "x.npy"),
                                 "shape": [37, 3], "dtype": "float32"}
    reopened = open_store(tmp_path / "s.zarr", check_finite=True)
    assert reopened.n_samples == 37 and reopened.chunk_rows == 10


def test_sample_is_seeded(digits_store, digits):
    a = digits_store.sample(20, seed=3)
    b = digits_store.sample(20, seed=3)
    c = digits_store.sample(20, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # rows of the data, distinct, in index order
    pos = [int(np.flatnonzero((digits == row).all(axis=1))[0]) for row in a]
    assert len(set(pos)) == 20 and pos == sorted(pos)
    assert len(digits_store.sample(10_000, seed=0)) == 300


# --- ingest_images ------------------------------------------------------------------------------


def test_ingest_camera(tmp_path):
    import skimage.data

    s = ingest_images(["skimage:camera"], tmp_path / "cam.zarr", patch=11, step=16, chunk_rows=300)
    img = skimage.data.camera().astype(np.float64) / 255.0
    want = direct_patches(img, 11, 16)
    assert want.shape == (32 * 32, 121)
    assert (s.n_samples, s.n_features, s.n_chunks) == (1024, 121, 4)
    np.testing.assert_allclose(s.read(), want, rtol=0, atol=1e-15)
    src = s.attrs["source"]
    assert src["kind"] == "images"
    assert src["images"] == [{"path": "skimage:camera", "shape": [512, 512], "grid": [32, 32],
                              "first_sample": 0, "n_samples": 1024}]
    assert s.attrs["patch"] == 11 and s.attrs["step"] == 16


def test_ingest_png_files(tmp_path, seed):
    import skimage.io

    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, size=(23, 31, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, size=(17, 12), dtype=np.uint8)
    rgba = np.concatenate([rgb[:14, :16], np.full((14, 16, 1), 77, np.uint8)], axis=2)
    paths = [tmp_path / "rgb.png", tmp_path / "grey.png", tmp_path / "rgba.png"]
    for p, im in zip(paths, (rgb, grey, rgba)):
        skimage.io.imsave(p, im, check_contrast=False)

    patch, step = 5, 3
    s = ingest_images([str(p) for p in paths], tmp_path / "png.zarr", patch=patch, step=step,
                      chunk_rows=7)
    # grey by ITU-R BT.709 luma on [0, 1] (skimage's rgb2gray), alpha ignored
    luma = np.array([0.2125, 0.7154, 0.0721])
    greys = [rgb / 255.0 @ luma, grey / 255.0, rgba[..., :3] / 255.0 @ luma]
    expected = [direct_patches(g, patch, step) for g in greys]
    grids = [[(g.shape[0] - patch) // step + 1, (g.shape[1] - patch) // step + 1] for g in greys]
    assert [len(e) for e in expected] == [a * b for a, b in grids] == [63, 15, 16]
    np.testing.assert_allclose(s.read(), np.concatenate(expected), rtol=0, atol=1e-12)

    images = s.attrs["source"]["images"]
    first = np.cumsum([0] + [len(e) for e in expected])[:-1]
    assert [im["path"] for im in images] == [str(p) for p in paths]
    assert [im["shape"] for im in images] == [[23, 31], [17, 12], [14, 16]]
    assert [im["grid"] for im in images] == grids
    assert [im["first_sample"] for im in images] == first.tolist()
    assert [im["n_samples"] for im in images] == [63, 15, 16]
    assert s.attrs["patch"] == patch and s.attrs["step"] == step
    assert s.n_samples == 94 and s.chunk_rows == 7 and s.n_chunks == 14


def test_ingest_images_max_samples_spreads_over_the_images(tmp_path):
    """``max_samples`` draws its patches from every image (not the first image's top rows)."""
    import skimage.data
    from scipy.spatial.distance import pdist

    names = ("camera", "moon", "coins")
    every = [direct_patches(getattr(skimage.data, n)() / 255.0, 11, 16) for n in names]
    s = ingest_images([f"skimage:{n}" for n in names], tmp_path / "m.zarr", patch=11, step=16,
                      chunk_rows=100, max_samples=1500, seed=3)
    X = s.read()
    assert X.shape == (1500, 121)
    # each stored patch is one of its image's patches, in raster order, none twice
    images = s.attrs["source"]["images"]
    total = sum(len(p) for p in every)
    for im, patches in zip(images, every):
        part = X[im["first_sample"]:im["first_sample"] + im["n_samples"]]
        previous = -1
        for row in part:
            match = np.flatnonzero(np.abs(patches - row).max(axis=1) < 1e-12)
            match = match[match > previous]
            assert match.size, "a stored patch that is no later patch of its image"
            previous = match[0]
        # the image's share of the draw (hypergeometric: within 4 standard deviations)
        expect = 1500 * len(patches) / total
        assert abs(im["n_samples"] - expect) < 4 * np.sqrt(expect)
    assert s.attrs["max_samples"] == 1500 and s.attrs["sample"]["seed"] == 3
    # the spread shows in the kernel width the median heuristic would choose
    all_patches = np.concatenate(every)
    first = np.median(pdist(all_patches[:1500]))
    spread = np.median(pdist(X))
    assert abs(spread / np.median(pdist(all_patches)) - 1) < 0.1 < abs(first / spread - 1)


def test_ingest_images_streams(tmp_path, seed):
    """An image's patches (84 MB here) are never held at once: peak allocations stay near a
    few chunks of patches (2 MB each) and the image (2.9 MB)."""
    import tracemalloc

    img = np.random.default_rng(seed).random((600, 600))
    np.save(tmp_path / "img.npy", img)
    tracemalloc.start()
    try:
        s = ingest_images([str(tmp_path / "img.npy")], tmp_path / "big.zarr", patch=11, step=2,
                          chunk_rows=2048)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    all_patches = s.n_samples * s.n_features * 8
    assert s.n_samples == 295 * 295
    assert peak < 20e6 < all_patches / 4, f"peak {peak / 1e6:.1f} MB"
    np.testing.assert_array_equal(s.read(s.n_samples - 7), direct_patches(img, 11, 2)[-7:])


@pytest.mark.filterwarnings("ignore:The legacy `DICOM` plugin:DeprecationWarning")  # imageio
def test_ingest_images_bad_inputs(tmp_path):
    import skimage.io

    skimage.io.imsave(tmp_path / "small.png", np.zeros((4, 9), np.uint8), check_contrast=False)
    with pytest.raises(InputError, match="smaller than"):
        ingest_images([str(tmp_path / "small.png")], tmp_path / "a.zarr", patch=5, step=1)
    with pytest.raises(StoreNotFoundError, match="no such image"):
        ingest_images([str(tmp_path / "nope.png")], tmp_path / "a.zarr")
    with pytest.raises(InputError, match="no bundled image 'nothing_here'"):
        ingest_images(["skimage:nothing_here"], tmp_path / "a.zarr")
    (tmp_path / "junk.png").write_bytes(b"not a picture")
    with pytest.raises(InputError, match="cannot read image"):
        ingest_images([str(tmp_path / "junk.png")], tmp_path / "a.zarr")
    with pytest.raises(InputError, match="no images"):
        ingest_images([], tmp_path / "a.zarr")
    with pytest.raises(ParameterError, match="patch and step"):
        ingest_images(["skimage:camera"], tmp_path / "a.zarr", patch=0)
    assert leftovers(tmp_path, "a.zarr") == []


# --- bad stores and bad arrays ------------------------------------------------------------------


def test_nan_rows_are_named(tmp_path):
    X = np.zeros((100, 3))
    X[37, 1] = np.nan
    X[41, 0] = np.inf
    with pytest.raises(InputError, match=r"rows starting at 37 \(2 rows"):
        ingest_array(X, tmp_path / "a.zarr", chunk_rows=16)
    assert leftovers(tmp_path, "a.zarr") == []

    # a store written by another tool: open_store(check_finite=True) finds the rows
    X = np.ones((50, 2))
    X[[23, 24, 48], 0] = np.nan
    path = write_raw_store(tmp_path / "raw.zarr", X)
    s = open_store(path)  # structure is fine
    with pytest.raises(InputError, match=r"3 rows of X, first at rows 23\.\.48"):
        open_store(path, check_finite=True)
    with pytest.raises(InputError, match="first at rows 23"):
        s.check_finite()


@pytest.mark.parametrize("shape", [(0, 3), (4, 0)])
def test_empty(tmp_path, shape):
    with pytest.raises(InputError, match="empty"):
        ingest_array(np.zeros(shape), tmp_path / "a.zarr")
    assert leftovers(tmp_path, "a.zarr") == []
    path = write_raw_store(tmp_path / "raw.zarr", np.zeros(shape))
    with pytest.raises(InputError, match="empty"):
        open_store(path)


def test_wrong_dims(tmp_path):
    path = write_raw_store(tmp_path / "three.zarr", np.zeros((4, 3, 2)))
    with pytest.raises(InputError, match="2 dims"):
        open_store(path)
    path = write_raw_store(tmp_path / "swapped.zarr", np.zeros((4, 3)), dims=["feature", "sample"])
    with pytest.raises(InputError, match=r"dims \('feature', 'sample'\)"):
        open_store(path)
    for bad in (np.zeros(5), np.zeros((2, 3, 4))):
        with pytest.raises(InputError, match="2-d"):
            ingest_array(bad, tmp_path / "a.zarr")
    path = write_raw_store(tmp_path / "lab.zarr", np.zeros((4, 3)), label=np.arange(3))
    with pytest.raises(InputError, match="label must be a 1-d array of 4"):
        open_store(path)
    with pytest.raises(InputError, match=r"labels must have shape \(4,\)"):
        ingest_array(np.zeros((4, 3)), tmp_path / "a.zarr", labels=np.arange(3))
    assert leftovers(tmp_path, "a.zarr") == []


def test_missing_x(tmp_path):
    path = write_raw_store(tmp_path / "nox.zarr", extra={"Y": np.zeros((3, 2))})
    with pytest.raises(InputError, match="no variable X.*holds: Y"):
        open_store(path)
    g = zarr.open_group(str(tmp_path / "xgroup.zarr"), mode="w")
    g.create_group("X")
    with pytest.raises(InputError, match="X is a group"):
        open_store(tmp_path / "xgroup.zarr")


def test_not_a_store(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match="not a zarr group"):
        open_store(tmp_path / "empty_dir")
    zarr.create_array(str(tmp_path / "array.zarr"), shape=(3, 3), dtype="f8")
    with pytest.raises(InputError, match="not a zarr group"):
        open_store(tmp_path / "array.zarr")
    (tmp_path / "data.csv").write_text("1,2\n3,4\n")
    with pytest.raises(InputError, match="is a file"):
        open_store(tmp_path / "data.csv")
    with pytest.raises(StoreNotFoundError, match="no data store"):
        open_store(tmp_path / "missing.zarr")
    with pytest.raises(FileNotFoundError):  # the builtin a user expects
        open_store(tmp_path / "missing.zarr")
    with pytest.raises(StoreNotFoundError):
        ingest_array(tmp_path / "missing.npy", tmp_path / "a.zarr")
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(InputError, match="not a readable .npy"):
        ingest_array(tmp_path / "bad.npy", tmp_path / "a.zarr")


@pytest.mark.filterwarnings("ignore:The data type.*does not have a Zarr V3 specification")
def test_non_numeric(tmp_path):
    for bad in (np.array([["a", "b"], ["c", "d"]]), np.array([[1, None]], dtype=object),
                np.zeros((2, 2), dtype=complex)):
        with pytest.raises(InputError, match="not numeric"):
            ingest_array(bad, tmp_path / "a.zarr")
    assert leftovers(tmp_path, "a.zarr") == []
    for bad in (np.zeros((2, 2), dtype=bool), np.array([["a", "b"]])):
        path = write_raw_store(tmp_path / f"raw_{bad.dtype.kind}.zarr", bad)
        with pytest.raises(InputError, match="numeric dtype is required"):
            open_store(path)
    # integers are numbers
    path = write_raw_store(tmp_path / "int.zarr", np.arange(6, dtype=np.int16).reshape(3, 2))
    s = open_store(path)
    np.testing.assert_array_equal(s.read(), np.arange(6.0).reshape(3, 2))


# --- atomic writes ------------------------------------------------------------------------------


def test_no_partial_store_after_an_error(tmp_path):
    X = np.arange(200.0).reshape(100, 2)
    X[90, 1] = np.nan  # found after five chunks were written aside
    with pytest.raises(InputError):
        ingest_array(X, tmp_path / "a.zarr", chunk_rows=16)
    assert os.listdir(tmp_path) == []

    with pytest.raises(StoreNotFoundError):
        ingest_images(["skimage:camera", str(tmp_path / "missing.png")], tmp_path / "img.zarr",
                      patch=11, step=64)
    assert os.listdir(tmp_path) == []


def test_existing_store_is_kept(tmp_path):
    old = np.arange(12.0).reshape(6, 2)
    ingest_array(old, tmp_path / "a.zarr", chunk_rows=4)
    with pytest.raises(RunDirectoryError, match="already exists"):
        ingest_array(old + 1, tmp_path / "a.zarr")
    np.testing.assert_array_equal(open_store(tmp_path / "a.zarr").read(), old)

    # a failing overwrite leaves the old store whole
    bad = old + 1
    bad[5, 0] = np.nan
    with pytest.raises(InputError):
        ingest_array(bad, tmp_path / "a.zarr", chunk_rows=4, overwrite=True)
    np.testing.assert_array_equal(open_store(tmp_path / "a.zarr").read(), old)
    assert leftovers(tmp_path, "a.zarr") == ["a.zarr"]

    new = ingest_array(old * 2, tmp_path / "a.zarr", chunk_rows=5, overwrite=True)
    np.testing.assert_array_equal(new.read(), old * 2)
    assert new.chunk_rows == 5
    assert leftovers(tmp_path, "a.zarr") == ["a.zarr"]

    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirectoryError, match="not a directory"):
        ingest_array(old, tmp_path / "file", overwrite=True)
    assert (tmp_path / "file").read_text() == "x"


# --- writing a dataset atomically -----------------------------------------------------------------


def _dataset(value: float, fail: bool = False, barrier=None) -> xr.Dataset:
    """A small lazy dataset of ``value`` everywhere: 4 chunks, the third raising with ``fail``,
    every chunk waiting at ``barrier`` (so that two writes are mid-write together)."""
    import dask.array as da

    def block(x, block_info=None):
        if barrier is not None:
            barrier.wait()
        if fail and block_info[0]["chunk-location"][0] == 2:
            raise RuntimeError("the disk is full")
        return x

    data = da.full((40, 3), value, chunks=(10, 3)).map_blocks(block, dtype=float)
    return xr.Dataset({"v": (("sample", "feature"), data)}, attrs={"value": value})


def test_write_zarr_atomically_consolidates_and_replaces(tmp_path):
    from dkha.data.atomic import write_zarr_atomically

    out = tmp_path / "sub" / "result.zarr"
    assert write_zarr_atomically(_dataset(1.0), out) == str(out)
    assert write_zarr_atomically(_dataset(2.0), out) == str(out)
    assert zarr.open_group(str(out), mode="r").metadata.consolidated_metadata is not None
    ds = xr.open_zarr(out)      # consolidated: opens without consolidated=False
    assert ds.attrs["value"] == 2.0 and np.array_equal(ds["v"].values, np.full((40, 3), 2.0))
    assert leftovers(out.parent, "result.zarr") == ["result.zarr"]


def test_write_zarr_atomically_failure_keeps_the_old_result(tmp_path):
    """A write failing mid-way (its third chunk) leaves the old result as it was and removes its
    temporary (computed in order here: with threads, chunks still being written when the error
    arrives could put pieces of the temporary back after its removal)."""
    import dask

    from dkha.data.atomic import write_zarr_atomically

    out = tmp_path / "result.zarr"
    write_zarr_atomically(_dataset(1.0), out)
    with pytest.raises(RuntimeError, match="the disk is full"), \
            dask.config.set(scheduler="synchronous"):
        write_zarr_atomically(_dataset(2.0, fail=True), out)
    ds = xr.open_zarr(out)
    assert ds.attrs["value"] == 1.0 and np.array_equal(ds["v"].values, np.full((40, 3), 1.0))
    assert sorted(os.listdir(tmp_path)) == ["result.zarr"]     # no temporary left behind


def test_write_zarr_atomically_concurrent_writers(tmp_path):
    """Two writes of the same target at once (both mid-write together: every chunk waits for the
    other write's) write aside under their own temporary names: both succeed, and the target is
    one of the two datasets whole (with one shared ``.tmp`` name they wipe each other's)."""
    import threading

    import dask

    from dkha.data.atomic import write_zarr_atomically

    out = tmp_path / "result.zarr"
    barrier = threading.Barrier(2, timeout=60)
    errors = []

    def write(value):
        try:
            with dask.config.set(scheduler="synchronous"):
                write_zarr_atomically(_dataset(value, barrier=barrier), out)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(v,)) for v in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ds = xr.open_zarr(out)
    assert ds.attrs["value"] in (1.0, 2.0)
    assert np.array_equal(ds["v"].values, np.full((40, 3), ds.attrs["value"]))
    assert sorted(os.listdir(tmp_path)) == ["result.zarr"]


def _refuse(name):
    raise ValueError(f"not strict JSON: {name}")


def test_write_json_atomically_strict_and_exact(tmp_path):
    """Non-finite floats (numpy's too) are written as null, or with ``exact`` as tagged objects
    read back as the same floats; either text parses with a strict parser (RFC 8259)."""
    from dkha.data.atomic import write_json_atomically
    from dkha.data.jsontext import exact_loads

    obj = {"a": [1.5, float("nan"), np.float32("inf")], "b": (np.float64("-inf"), np.int64(3))}
    out = tmp_path / "x.json"
    assert write_json_atomically(obj, out) == str(out)
    assert json.loads(out.read_text(), parse_constant=_refuse) == {"a": [1.5, None, None],
                                                                    "b": [None, 3]}
    write_json_atomically(obj, out, exact=True, indent=1)
    text = out.read_text()
    json.loads(text, parse_constant=_refuse)
    back = exact_loads(text)
    assert back["a"][0] == 1.5 and np.isnan(back["a"][1]) and back["a"][2] == np.inf
    assert back["b"] == [-np.inf, 3]
    assert exact_loads('{"h": [NaN, 1]}')["h"][1] == 1     # bare NaN, as files written before
    assert sorted(os.listdir(tmp_path)) == ["x.json"]


def test_write_json_atomically_failures_keep_the_old_file(tmp_path):
    """An object JSON cannot encode leaves the old file as it was; a rename that fails after the
    temporary is written (a directory where the file goes) leaves no temporary behind."""
    from dkha.data.atomic import write_json_atomically

    out = tmp_path / "x.json"
    write_json_atomically({"v": 1}, out)
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json_atomically({"v": object()}, out, default=None)
    assert json.loads(out.read_text()) == {"v": 1}
    (tmp_path / "d.json").mkdir()
    (tmp_path / "d.json" / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_json_atomically({"v": 2}, tmp_path / "d.json")
    assert (tmp_path / "d.json" / "inside").read_text() == "kept"
    assert sorted(os.listdir(tmp_path)) == ["d.json", "x.json"]


def test_write_json_atomically_concurrent_writers(tmp_path, monkeypatch):
    """Two writers of the same file, both with their text written and about to rename at once,
    use temporaries of their own: both succeed, and the file is one of the two texts whole (with
    one fixed ``.tmp`` name the second open truncates the first's and one rename finds nothing)."""
    import threading

    from dkha.data.atomic import write_json_atomically

    out = tmp_path / "x.json"
    barrier = threading.Barrier(2, timeout=60)
    real_replace = os.replace
    errors = []

    def replace(src, dst):
        if os.fspath(dst) == str(out):      # only these writers' renames wait
            barrier.wait()
        real_replace(src, dst)

    def write(value):
        try:
            write_json_atomically({"v": value, "pad": [value] * 1000}, out)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    monkeypatch.setattr(os, "replace", replace)
    threads = [threading.Thread(target=write, args=(v,)) for v in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    assert errors == []
    got = json.loads(out.read_text())
    assert got["v"] in (1, 2) and got["pad"] == [got["v"]] * 1000
    assert sorted(os.listdir(tmp_path)) == ["x.json"]


@pytest.mark.parametrize("how", ["a file where the cache goes", "a read-only directory"])
def test_write_spectrum_on_a_store_it_cannot_write(tmp_path, how, caplog):
    """Where the store's spectrum cache cannot be made, ``write_spectrum`` says so and returns
    False (it raised UnboundLocalError); the entry is not there to read."""
    from dkha.data.spectra import SPECTRUM_GROUP, read_spectrum, write_spectrum

    if how == "a read-only directory" and os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    path = tmp_path / "s.zarr"
    store = ingest_array(np.arange(12.0).reshape(6, 2), path)
    if how == "a file where the cache goes":
        (path / SPECTRUM_GROUP).write_text("not a directory")
    else:
        os.chmod(path, 0o555)
    key = ("entry", {"data": "x"})
    try:
        with caplog.at_level("WARNING", logger="dkha.data.spectra"):
            assert write_spectrum(store, key, np.array([3.0, 2.0])) is False
    finally:
        os.chmod(path, 0o755)
    assert "the spectrum is not cached" in caplog.text
    assert read_spectrum(store, key, 2) is None


def test_spectrum_cache_round_trip(tmp_path):
    """What ``write_spectrum`` keeps, ``read_spectrum`` gives back (fewer values too), in strict
    JSON, with no temporary left in the group."""
    from dkha.data.spectra import SPECTRUM_GROUP, read_spectrum, write_spectrum

    path = tmp_path / "s.zarr"
    store = ingest_array(np.arange(12.0).reshape(6, 2), path)
    key = ("entry", {"data": "x"})
    values = np.array([3.0, 2.0, 0.1])
    assert write_spectrum(store, key, values) is True
    assert np.array_equal(read_spectrum(store, key, 3), values)
    assert np.array_equal(read_spectrum(store, key, 2), values[:2])
    assert read_spectrum(store, key, 4) is None
    assert read_spectrum(store, ("entry", {"data": "y"}), 2) is None
    assert os.listdir(path / SPECTRUM_GROUP) == ["entry.json"]
    json.loads((path / SPECTRUM_GROUP / "entry.json").read_text(), parse_constant=_refuse)
