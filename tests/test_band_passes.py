"""The passes of GPU workers (one task per band of tiles, rows resident on the device, the bands'
results chained on the device) run here with NumPy behind the same functions
(``dkha.band-passes: true`` on CPU workers), checked against the dense ``K'`` in NumPy."""

from __future__ import annotations

import dask.config
import numpy as np
import pytest

from dkha import config
from dkha.data.ingest import ingest_array
from dkha.engine.bandpass import BandPlan, band_side
from dkha.engine.device import device_info, drop_resident
from dkha.engine.rows import RowEngine
from dkha.kernels import make_kernel
from tests.processes import local_client

SIGMA = 4.0


@pytest.fixture(scope="module")
def store(tmp_path_factory, digits):
    return ingest_array(np.array(digits), tmp_path_factory.mktemp("bands") / "d.zarr",
                        chunk_rows=64)


@pytest.fixture(scope="module")
def oracle(digits, dense_centered):
    return dense_centered(digits, "gaussian", sigma=SIGMA)


@pytest.fixture
def bands():
    """Band passes on the CPU workers, bands of 64 rows (5 bands of the 300 digits)."""
    with dask.config.set({"dkha.band-passes": True, "dkha.tile-rows": 64}):
        yield
    drop_resident()


def _engine(store, client, **kw):
    return RowEngine(store, make_kernel("gaussian", sigma=SIGMA), client, config.settings(**kw))


def _close(got, want, tol):
    err = np.abs(np.asarray(got) - want).max()
    assert err <= tol * np.abs(want).max(), f"max error {err:.3e}"


def test_band_passes_equal_the_dense_kernel(store, oracle, client, bands, seed):
    K, Kc = oracle
    engine = _engine(store, client)
    plan = engine.bands
    assert isinstance(plan, BandPlan) and plan.side == 64 and len(plan.bands) == 5
    assert plan.tiles == 15 and "5 tasks a pass" in plan.describe()
    mk, _ = engine.compute_mk(cache=False)
    _close(mk, K.mean(axis=0), 1e-13)
    assert engine.stats.passes[-1]["kind"] == "sums"
    assert engine.stats.passes[-1]["tasks"] == 5
    V = np.random.default_rng(seed).standard_normal((len(Kc), 7))
    got = engine.matmat(V)
    _close(got, Kc @ V, 1e-12)
    assert np.array_equal(engine.matmat(V), got)        # the same bits, pass after pass
    C = np.random.default_rng(seed + 1).standard_normal((3, len(Kc))) * 0.1
    frob2, res2 = engine.residual(C)
    assert frob2 == pytest.approx(np.sum(Kc * Kc), rel=1e-12)
    assert res2 == pytest.approx(np.sum((Kc - C.T @ C) ** 2), rel=1e-12)


def test_band_passes_in_float32(store, oracle, client, bands, seed):
    K, Kc = oracle
    engine = _engine(store, client, precision="float32")
    mk, _ = engine.compute_mk(cache=False)
    _close(mk, K.mean(axis=0), 1e-6)
    V = np.random.default_rng(seed).standard_normal((len(Kc), 4))
    _close(engine.matmat(V), Kc @ V, 1e-5)
    # E_min's products stay float64 (on the float32 MK row): as the CPU's tile passes make them
    with dask.config.set({"dkha.band-passes": False}):
        tiles = _engine(store, client, precision="float32")
        tiles.set_mk(engine.mk, engine.mkm)
        assert tiles.bands is None
        _close(engine.matmat(V, exact=True), tiles.matmat(V, exact=True), 1e-12)


def test_bands_dealt_to_several_workers(store, oracle, bands, seed):
    """Two workers: bands pinned round-robin, each worker's chained on it, the sum the same."""
    _, Kc = oracle
    with local_client(2, 1) as two:
        engine = _engine(store, two)
        assert len(engine.bands.workers) == 2
        engine.compute_mk(cache=False)
        V = np.random.default_rng(seed).standard_normal((len(Kc), 3))
        _close(engine.matmat(V), Kc @ V, 1e-12)


def test_krylov_on_band_passes_equals_eigh(store, oracle, client, bands):
    _, Kc = oracle
    from dkha.fit.spectrum import krylov_eigenpairs

    engine = _engine(store, client)
    engine.compute_mk(cache=False)
    w, _ = krylov_eigenpairs(engine, 5, tol=1e-10)
    want = np.linalg.eigvalsh(Kc)[::-1][:5]
    np.testing.assert_allclose(w, want, rtol=1e-9)


def test_no_band_passes_on_cpu_by_default(store, client):
    assert _engine(store, client).bands is None


def test_device_info_of_a_cpu_worker():
    info = device_info("cpu")
    assert info["kind"] == "cpu" and 0 < info["free"] <= info["total"]


@pytest.mark.parametrize("free,streams,workers,l,want", [
    # one H200 (140 GiB free), l = 10⁶ 11×11 patches: the cap, 41 bands, 861 tiles
    (140 * 2**30, 2, 1, 1_000_000, 24576),
    # one 16 GiB GPU: a quarter of what is left beside 0.97 GB of rows, two tiles + temporaries
    (16 * 2**30, 2, 1, 1_000_000, None),
    # a small store on 2 workers with 2 streams each: two bands for every stream
    (140 * 2**30, 2, 2, 20_000, 2304),
])
def test_band_side_from_the_device(free, streams, workers, l, want):
    side, _ = band_side(l, 121, 8, free, streams=streams, workers=workers, cap=24576)
    if want is None:        # the memory rule, computed here independently
        room = 0.25 * (free - l * (121 * 8 + 8))
        want = int(np.sqrt(room / (streams * 16)))
        want -= want % 256
    assert side == want
    bands = -(-l // side)
    if l == 1_000_000 and free > 100 * 2**30:
        assert bands == 41 and bands * (bands + 1) // 2 == 861


def test_a_stop_mid_band_pass_leaves_the_scheduler_quiet(store, client, bands, monkeypatch):
    """A stop while a band pass runs lets go of its band and combine tasks (released, not
    cancelled: cancelling a band cancels the chain of combines after it, and cancelling one of
    those afterwards trips the scheduler's ``assert ts.who_wants``); the next pass gives the
    same bits."""
    from dkha.engine import bandpass
    from tests.stops import stop_mid_pass_quietly

    monkeypatch.setattr(bandpass, "FAN_IN", 1)      # a chain of one combine a band
    engine = _engine(store, client)
    engine.compute_mk(cache=False)
    V = np.random.default_rng(0).normal(size=(300, 6))
    stop_mid_pass_quietly(engine, V, monkeypatch, (1, 3, 5))
