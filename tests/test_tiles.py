"""Fused kernel tiles (dkha/tiles/): the compiled sweep and the panel products against their
plain NumPy twins, float32 against float64 to stated tolerances, and the GPU code path's array
module dispatch run on CPU (NumPy behind a stand-in ``cupy`` module)."""

from __future__ import annotations

import sys
import types

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster
from numba import njit
from scipy.spatial.distance import cdist

from dkha import KernelHebbianPCA, config, tiles
from dkha.cli.main import build_parser
from dkha.data.ingest import ingest_array
from dkha.engine.rows import RowEngine
from dkha.errors import ParameterError
from dkha.estimators import params
from dkha.fit.spectrum import krylov_eigenpairs
from dkha.kernels import make_kernel

KERNELS = {
    "gaussian": dict(sigma=3.0),
    "laplacian": dict(sigma=5.0),
    "polynomial": dict(degree=3, offset=0.5),
    "sigmoid": dict(gamma=0.02, offset=-0.3),
}


# --- the NumPy twins: direct differences and plain elementwise functions, no GEMM expansion ---


def twin_kernel(X, Y, name, **p):
    if name == "gaussian":
        return np.exp(-cdist(X, Y, "sqeuclidean") / (2.0 * p["sigma"] ** 2))
    if name == "laplacian":
        return np.exp(-cdist(X, Y, "euclidean") / p["sigma"])
    G = np.einsum("if,jf->ij", X, Y)
    if name == "polynomial":
        return (G + p["offset"]) ** p["degree"]
    return np.tanh(p["gamma"] * G + p["offset"])


def twin_centered(X, Y, name, mk_rows, mk_cols, mkm, **p):
    return twin_kernel(X, Y, name, **p) - mk_cols[None, :] - mk_rows[:, None] + mkm


@pytest.fixture(scope="module")
def blocks():
    """Two blocks of patch-like data with an offset (mean 3: the expansion cancels), a shared
    duplicate row, and centering rows."""
    rng = np.random.default_rng(7)
    X = 3.0 + rng.random((150, 20))
    Y = 3.0 + rng.random((230, 20))
    Y[11] = X[4]                                    # a coincident pair
    return X, Y, rng.random(150), rng.random(230), 0.37


def scale_of(A):
    return max(1.0, np.abs(A).max())


@pytest.mark.parametrize("name", list(KERNELS))
def test_fused_tile_matches_numpy_twin(blocks, name):
    X, Y, mr, mc, mkm = blocks
    p = KERNELS[name]
    k = make_kernel(name, **p)
    want = twin_kernel(X, Y, name, **p)
    got = k.block(X, Y)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * scale_of(want))
    wantc = twin_centered(X, Y, name, mr, mc, mkm, **p)
    gotc = k.centered_block(X, Y, mr, mc, mkm)
    np.testing.assert_allclose(gotc, wantc, rtol=0, atol=1e-12 * scale_of(wantc))
    if name in ("gaussian", "laplacian"):
        assert got[4, 11] == pytest.approx(1.0, abs=1e-14)     # k(x, x) = 1 exactly enough


@pytest.mark.parametrize("name", list(KERNELS))
def test_fused_products_match_numpy_twin(blocks, name, monkeypatch):
    """``T V``, ``Tᵀ W``, the sums and the residuals ``‖T − CᵢᵀCⱼ‖²``, computed panel by panel
    (small panels: several of them)."""
    X, Y, mr, mc, mkm = blocks
    p = KERNELS[name]
    monkeypatch.setattr(tiles.cpu, "PANEL_BYTES", 64 * 230 * 8)   # panels of 64 rows: 3 panels
    T = twin_centered(X, Y, name, mr, mc, mkm, **p)
    rng = np.random.default_rng(1)
    V, W = rng.standard_normal((230, 4)), rng.standard_normal((150, 3))
    TV, TW, rows, cols = make_kernel(name, **p).products(X, Y, V, W, mr, mc, mkm, sums=True)
    for got, want in ((TV, T @ V), (TW, T.T @ W), (rows, T.sum(axis=1)), (cols, T.sum(axis=0))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * scale_of(want))
    none = make_kernel(name, **p).products(X, Y)
    assert none == (None, None, None, None)
    C = rng.standard_normal((3, 400))           # C[:, 10:160] meets X, C[:, 170:400] meets Y
    res = make_kernel(name, **p).residuals(X, Y, (C, 2 * C), slice(10, 160), slice(170, 400),
                                           mr, mc, mkm)
    want = [np.sum(T * T)] + [np.sum((T - D[:, 10:160].T @ D[:, 170:400]) ** 2) for D in (C, 2 * C)]
    np.testing.assert_allclose(res, want, rtol=1e-12)


def test_panel_buffers_are_reused_without_changing_a_bit(blocks, monkeypatch):
    """The panels' per-thread buffers (:func:`dkha.tiles.scratch`): tiles of other shapes and
    precisions in between, in this thread and in another, give the same bits as fresh
    buffers, and a second tile of a shape allocates nothing new."""
    import threading

    X, Y, mr, mc, mkm = blocks
    rng = np.random.default_rng(2)
    V, W = rng.standard_normal((230, 4)), rng.standard_normal((150, 3))
    C = rng.standard_normal((3, 400))
    monkeypatch.setattr(tiles.cpu, "PANEL_BYTES", 64 * 230 * 8)   # several panels a tile
    kernels = [make_kernel("gaussian", sigma=3.0), make_kernel("laplacian", sigma=5.0),
               make_kernel("gaussian", sigma=3.0).computed_with("float32", "cpu")]

    def run():
        out = []
        for k in kernels:
            for A, B, VV, WW in ((X, Y, V, W), (Y[:97], X, W, V[:97]), (X, Y, V, W)):
                out.append(k.products(A, B, VV, WW, mr[:len(A)] if len(A) == 150 else None,
                                      None, mkm, sums=True))
            out.append((k.residuals(X, Y, (C,), slice(10, 160), slice(170, 400), mr, mc, mkm),))
        return out

    monkeypatch.setattr(tiles.cpu, "SCRATCH_BYTES", 0)  # every buffer fresh: the reference
    fresh = run()
    monkeypatch.setattr(tiles.cpu, "SCRATCH_BYTES", 1 << 26)
    reused = run()
    box = []
    t = threading.Thread(target=lambda: box.append(run()))
    t.start()
    t.join()
    for got in (reused, box[0]):
        for a, b in zip(got, fresh, strict=True):
            for x, y in zip(a, b, strict=True):
                assert (x is None and y is None) or np.array_equal(x, y)
    buffers = dict(tiles.cpu._scratch_arrays.buffers)
    run()
    assert all(tiles.cpu._scratch_arrays.buffers[k] is v for k, v in buffers.items())


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_prepared_columns_give_the_same_bits(blocks, precision, tmp_path):
    """Column blocks prepared once (:func:`dkha.tiles.prepare_columns`, kept per worker process
    by :func:`dkha.engine.tasks.column_operands` for a stream's blocks) give the same bits as
    preparing them for each tile, for every kernel; the worker keeps and reuses them, and
    :func:`~dkha.engine.tasks.clear_cache` drops them."""
    from dkha.engine import tasks

    X, Y, mr, mc, mkm = blocks
    for name, p in KERNELS.items():
        k = make_kernel(name, **p).computed_with(precision, "cpu")
        want = k.centered_block(X, Y, mr, mc, mkm, dtype=precision)
        got = k.centered_block(X, k.prepared_columns(Y), mr, mc, mkm, dtype=precision)
        assert got.dtype == np.dtype(precision) and np.array_equal(got, want), name
        # the oracle: the plain NumPy twin, to the precision's tolerance
        twin = twin_centered(X, Y, name, mr, mc, mkm, **p)
        tol = 1e-10 if precision == "float64" else 2e-4
        assert np.abs(got - twin).max() < tol * scale_of(twin), name
    path = str(tmp_path / "cols.zarr")
    ingest_array(Y, path, chunk_rows=100)
    cols = ((0, 100), (100, 200), (200, 230))
    k = make_kernel("gaussian", sigma=3.0).computed_with(precision, "cpu")
    first = tasks.column_operands(path, k, cols)
    assert tasks.column_operands(path, k, cols) is first
    assert np.array_equal(k.centered_block(X, first, mr, mc, mkm, dtype=precision),
                          k.centered_block(X, Y, mr, mc, mkm, dtype=precision))
    tasks.clear_cache()
    assert tasks.column_operands(path, k, cols) is not first


def test_exp_is_exact_to_two_ulps():
    """The vectorisable exp of the sweep against NumPy's, over the whole range it is used on."""
    x = -np.concatenate([np.linspace(0, 750, 200_001), np.geomspace(1e-12, 1, 1001)])
    @njit
    def many(x, out64, out32):
        for i in range(len(x)):
            out64[i] = tiles.cpu._exp_neg64(x[i])
            out32[i] = tiles.cpu._exp_neg32(np.float32(x[i]))

    e64, e32 = np.empty_like(x), np.empty(len(x), np.float32)
    many(x, e64, e32)
    want = np.exp(x)
    ok = want > 1e-300
    assert np.max(np.abs(e64[ok] - want[ok]) / want[ok]) < 5e-16
    assert np.all(e64[x < -708.5] < 1e-300)
    ok32 = want > 1e-36
    want32 = np.exp(x.astype(np.float32).astype(np.float64))
    assert np.max(np.abs(e32[ok32] - want32[ok32]) / want32[ok32]) < 5e-7


@pytest.mark.parametrize("name", list(KERNELS))
def test_float32_tiles_within_stated_tolerance(blocks, name):
    """float32 tiles: within 2e-6 of the kernel's scale (distance kernels: the data are shifted
    by the block mean first; without it the mean-3 offset would cost ~1e-5)."""
    X, Y, mr, mc, mkm = blocks
    p = KERNELS[name]
    k32 = make_kernel(name, **p).computed_with(precision="float32")
    want = twin_centered(X, Y, name, mr, mc, mkm, **p)
    got = k32.centered_block(X, Y, mr, mc, mkm)
    tol = 2e-6 * scale_of(twin_kernel(X, Y, name, **p))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    TV = k32.products(X, Y, np.ones((230, 1)), mk_rows=mr, mk_cols=mc, mkm=mkm)[0]
    np.testing.assert_allclose(TV[:, 0], want.sum(axis=1), rtol=0, atol=230 * tol)
    if name == "laplacian":      # near pairs recomputed exactly: no sqrt(eps32) error
        assert k32.block(X, Y)[4, 11] == pytest.approx(1.0, abs=1e-7)


def test_float32_shift_is_what_keeps_distances_accurate(blocks):
    """Not vacuous: the same float32 GEMM without the shift by the mean misses 2e-6."""
    X, Y = blocks[0] + 30.0, blocks[1] + 30.0
    want = twin_kernel(X, Y, "gaussian", sigma=3.0)
    got = make_kernel("gaussian", sigma=3.0).computed_with(precision="float32").block(X, Y)
    assert np.abs(got - want).max() < 2e-6
    G = X.astype(np.float32) @ Y.astype(np.float32).T
    d2 = np.maximum((X * X).sum(1)[:, None] + (Y * Y).sum(1)[None] - 2.0 * G, 0)
    assert np.abs(np.exp(-d2 / 18.0) - want).max() > 1e-4


def test_precision_and_device_are_checked():
    k = make_kernel("gaussian", sigma=1.0)
    with pytest.raises(ParameterError, match="precision"):
        k.computed_with(precision="float16")
    with pytest.raises(ParameterError, match="device"):
        k.computed_with(device="tpu")
    assert k.computed_with(precision="float32").with_params(sigma=2.0).precision == "float32"


# --- the GPU code path on CPU ----------------------------------------------------------------


def _fake_cuda(calls: dict):
    """``cupy.cuda`` as the band passes use it: streams (entered, synchronised: counted), the
    device's memory and name."""
    class Stream:
        def __init__(self, non_blocking=False):
            calls["streams"] = calls.get("streams", 0) + 1

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            calls["synchronize"] = calls.get("synchronize", 0) + 1

    runtime = types.SimpleNamespace(
        memGetInfo=lambda: (8 * 2**30, 16 * 2**30),
        getDeviceProperties=lambda i: {"name": b"stand-in GPU"})
    return types.SimpleNamespace(Stream=Stream, runtime=runtime,
                                 Device=lambda: types.SimpleNamespace(id=0),
                                 get_current_stream=lambda: Stream())


@pytest.fixture
def fake_cupy(monkeypatch):
    """A ``cupy`` module with NumPy behind it that counts the arrays moved to the 'device'."""
    mod = types.ModuleType("cupy")
    calls = {"asarray": 0, "asnumpy": 0}

    def asarray(a):
        calls["asarray"] += 1
        return np.asarray(a)

    def asnumpy(a):
        calls["asnumpy"] += 1
        return np.asarray(a)

    for name in ("exp", "sqrt", "tanh", "maximum", "nonzero", "float64", "float32", "zeros",
                 "empty", "matmul", "vdot", "ones", "ascontiguousarray"):
        setattr(mod, name, getattr(np, name))
    mod.asarray, mod.asnumpy, mod.calls = asarray, asnumpy, calls
    mod.cuda = _fake_cuda(calls)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def test_cuda_without_cupy_is_a_clear_error(monkeypatch, blocks):
    monkeypatch.setitem(sys.modules, "cupy", None)
    k = make_kernel("gaussian", sigma=3.0).computed_with(device="cuda")
    with pytest.raises(ParameterError, match=r"dkha\[gpu\]"):
        k.block(blocks[0], blocks[1])


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_array_path_dispatch_matches_fused(fake_cupy, blocks, name, precision):
    """``device="cuda"`` sends the tile through the array-function path with the device module;
    with NumPy behind it the results equal the compiled CPU path."""
    X, Y, mr, mc, mkm = blocks
    k = make_kernel(name, **KERNELS[name]).computed_with(precision=precision)
    kg = k.computed_with(device="cuda")
    tol = (1e-12 if precision == "float64" else 4e-6) * scale_of(k.block(X, Y))
    np.testing.assert_allclose(kg.centered_block(X, Y, mr, mc, mkm),
                               k.centered_block(X, Y, mr, mc, mkm), rtol=0, atol=tol)
    V, W = np.ones((230, 2)), np.ones((150, 1))
    for got, want in zip(kg.products(X, Y, V, W, mr, mc, mkm, sums=True),
                         k.products(X, Y, V, W, mr, mc, mkm, sums=True)):
        np.testing.assert_allclose(got, want, rtol=0, atol=230 * tol)
    C = np.random.default_rng(2).standard_normal((2, 400))
    args = ((C,), slice(0, 150), slice(170, 400), mr, mc, mkm)
    np.testing.assert_allclose(kg.residuals(X, Y, *args), k.residuals(X, Y, *args), rtol=1e-5)
    assert fake_cupy.calls["asarray"] > 0 and fake_cupy.calls["asnumpy"] > 0


def test_auto_device_follows_the_workers_gpu_resource(fake_cupy, tmp_path, digits):
    """``device="auto"``: a worker declaring ``GPU=1`` takes the array path (the stand-in cupy),
    and its results equal a CPU engine's; outside a worker ``auto`` is the CPU."""
    assert tiles.resolve_device("auto") == "cpu"
    X = np.array(digits)
    store = ingest_array(X, tmp_path / "d.zarr", chunk_rows=64)
    kernel = make_kernel("gaussian", sigma=4.0)
    V = np.random.default_rng(0).standard_normal((len(X), 3))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, resources={"GPU": 1},
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        cpu = RowEngine(store, kernel, client, config.settings(device="cpu"))
        want_mk = cpu.compute_mk(cache=False)[0]
        want = cpu.matmat(V)
        before = fake_cupy.calls["asarray"]
        gpu = RowEngine(store, kernel, client, config.settings(device="auto"))
        np.testing.assert_allclose(gpu.compute_mk(cache=False)[0], want_mk, rtol=1e-12)
        np.testing.assert_allclose(gpu.matmat(V), want, rtol=0, atol=1e-10 * np.abs(want).max())
        assert fake_cupy.calls["asarray"] > before
        # the GPU worker's passes: one task per band, each on a stream of its own thread
        plan = gpu.bands
        assert plan is not None and plan.device["name"] == "stand-in GPU"
        assert gpu.stats.passes[-1]["tasks"] == len(plan.bands)
        assert fake_cupy.calls["synchronize"] >= len(plan.bands)
        assert 1 <= fake_cupy.calls["streams"] <= 2 + 2 * len(plan.bands)


def test_float32_engine_products_and_krylov(tmp_path, digits, client, dense_centered):
    """A float32 engine (the digits, l = 300): ``K' V`` within 1e-6 of the dense float64 oracle
    (relative to its largest entry), and Krylov eigenvalues within 1e-6 relative (the
    coordinator stays float64)."""
    X = np.array(digits)
    l = len(X)
    store = ingest_array(X, tmp_path / "d.zarr", chunk_rows=64)
    kernel = make_kernel("gaussian", sigma=4.0)
    _, Kc = dense_centered(X, "gaussian", sigma=4.0)
    eng = RowEngine(store, kernel, client, config.settings(precision="float32"))
    assert eng.kernel.precision == "float32"
    eng.compute_mk(cache=False)
    V = np.random.default_rng(0).standard_normal((l, 5))
    want = Kc @ V
    got = eng.matmat(V)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    w = np.linalg.eigvalsh(Kc)[::-1][:8]
    w32, _ = krylov_eigenpairs(eng, 8, seed=0, tol=1e-5, maxiter=100)
    np.testing.assert_allclose(w32, w, rtol=1e-6)


def test_precision_and_device_are_fit_options():
    """``--precision`` and ``--device`` come from the one parameter table: ``dkha fit`` parses
    them into the estimator's keywords, and the estimator refuses values outside the choices."""
    args = build_parser().parse_args(["fit", "store.zarr", "--out", "run", "--precision",
                                      "float32", "--device", "auto"])
    kw = params.estimator_kwargs(params.cli_values(args), params.BATCH, "kha-smd")
    assert kw["precision"] == "float32" and kw["device"] == "auto"
    m = KernelHebbianPCA(**kw)
    assert (m.precision, m.device) == ("float32", "auto")
    with pytest.raises(ParameterError, match="precision"):
        KernelHebbianPCA(4, precision="float16").fit(np.zeros((10, 2)))


@pytest.mark.parametrize("algorithm", ["kha-smd", "krylov"])
def test_float32_fit_matches_float64(digits_store, client, algorithm):
    """A fit with float32 tiles (float32 rows into the coordinator's block GEMMs, its state in
    float64) ends within 0.1 % of the float64 fit's excess error (KHA-SMD, 5 passes; measured
    4e-6 apart), and Krylov reaches ≤ 1e-6."""

    excess = {}
    for precision in ("float64", "float32"):
        params = dict(eta0=0.2, mu=0.2, passes=5) if algorithm == "kha-smd" else dict(tol=1e-5)
        m = KernelHebbianPCA(8, algorithm=algorithm, sigma=4.0, seed=0, client=client, **params)
        with dask.config.set({"dkha.precision": precision, "dkha.mk-cache": False}):
            m.fit(digits_store.path)
        excess[precision] = m.history_[-1]["excess"]
    if algorithm == "kha-smd":
        assert excess["float64"] < 0.1
        assert excess["float32"] == pytest.approx(excess["float64"], rel=1e-3)
    else:
        assert excess["float32"] <= 1e-6 and excess["float64"] <= 1e-6
