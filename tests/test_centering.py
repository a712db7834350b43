"""The centering row: its cache in the data store, and the approximate row from a column sample.

Oracle: the dense MK row ``K.mean(axis=0)`` of a kernel matrix computed by ``scipy.spatial``
distances (``conftest.centered_kernel_oracle``).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import zarr

from dkha import KernelHebbianPCA, config
from dkha.data.centering import CENTERING_GROUP
from dkha.data.ingest import ingest_array
from dkha.data.store import open_store
from dkha.engine.rows import RowEngine
from dkha.engine.tasks import clear_cache
from dkha.errors import ParameterError
from dkha.kernels import make_kernel

SIGMA = 4.0


@pytest.fixture
def store(tmp_path, digits):
    """A writable copy of the digits (each test its own: the cache is written into it)."""
    return ingest_array(np.array(digits), tmp_path / "digits.zarr", chunk_rows=64)


@pytest.fixture(scope="module")
def dense_mk(digits, dense_centered):
    def mk(sigma):
        K, _ = dense_centered(digits, "gaussian", sigma=sigma)
        return K.mean(axis=0), K.mean()
    return mk


def entries(store):
    d = os.path.join(store.path, CENTERING_GROUP)
    return sorted(e for e in os.listdir(d) if not e.startswith(".") and e != "zarr.json")


def never(*args, **kwargs):
    raise AssertionError("the MK row was computed again instead of read from the cache")


def engine_for(store, client, sigma=SIGMA):
    return RowEngine(store, make_kernel("gaussian", sigma=sigma), client, config.settings())


def test_cached_row_is_exact_and_reused(store, client, dense_mk, monkeypatch):
    first = engine_for(store, client)
    mk, mkm = first.compute_mk()
    want, want_m = dense_mk(SIGMA)
    np.testing.assert_allclose(mk, want, rtol=1e-13)
    assert mkm == pytest.approx(want_m, rel=1e-13)
    assert first.centering["cached"] is False and len(entries(store)) == 1

    monkeypatch.setattr("dkha.engine.mkrow.exact_mk_row", never)
    second = engine_for(open_store(store.path), client)
    mk2, mkm2 = second.compute_mk()
    assert second.centering["cached"] is True
    assert np.array_equal(mk2, mk) and mkm2 == mkm

    # another sigma is another entry (computed, then cached beside the first)
    monkeypatch.undo()
    mk3, _ = engine_for(store, client, sigma=2.0).compute_mk()
    np.testing.assert_allclose(mk3, dense_mk(2.0)[0], rtol=1e-13)
    assert len(entries(store)) == 2
    assert np.abs(mk3 - mk).max() > 1e-3


def test_changed_data_invalidates(store, client, dense_mk, digits, dense_centered):
    engine_for(store, client).compute_mk()
    old = entries(store)
    X = zarr.open_group(store.path, mode="r+")["X"]
    X[5] = X[5] + 0.5                           # the data change in place
    client.run(clear_cache)                     # (the workers' chunk cache holds the old rows)
    changed = np.array(digits)
    changed[5] += 0.5
    engine = engine_for(open_store(store.path), client)
    mk, _ = engine.compute_mk()
    assert engine.centering["cached"] is False
    K, _ = dense_centered(changed, "gaussian", sigma=SIGMA)
    np.testing.assert_allclose(mk, K.mean(axis=0), rtol=1e-13)
    assert len(entries(store)) == 1 and entries(store) != old   # the stale entry is gone


def test_damaged_entry_is_recomputed(store, client, dense_mk, caplog):
    engine_for(store, client).compute_mk()
    entry = zarr.open_array(os.path.join(store.path, CENTERING_GROUP, entries(store)[0]), mode="r+")
    entry[3] = entry[3] + 1e-9                  # a valid chunk holding a wrong value
    engine = engine_for(store, client)
    with caplog.at_level(logging.WARNING, logger="dkha.data.centering"):
        mk, _ = engine.compute_mk()
    assert engine.centering["cached"] is False
    assert "do not match their checksum" in caplog.text
    np.testing.assert_allclose(mk, dense_mk(SIGMA)[0], rtol=1e-13)
    assert engine_for(store, client).compute_mk()[0][3] == mk[3]     # rewritten correctly


def test_read_only_store_computes_without_caching(store, client, dense_mk, caplog, monkeypatch):
    real_access = os.access
    monkeypatch.setattr("dkha.data.centering.os.access",
                        lambda p, mode: False if mode == os.W_OK else real_access(p, mode))
    engine = engine_for(store, client)
    with caplog.at_level(logging.WARNING, logger="dkha.data.centering"):
        mk, _ = engine.compute_mk()
    assert "read-only" in caplog.text
    assert not os.path.exists(os.path.join(store.path, CENTERING_GROUP))
    np.testing.assert_allclose(mk, dense_mk(SIGMA)[0], rtol=1e-13)


def test_second_fit_reads_the_cache(store, client, seed, monkeypatch):
    def fit():
        return KernelHebbianPCA(3, algorithm="kha-smd", sigma=SIGMA, passes=1, seed=seed,
                                evaluate_every=-1, client=client).fit(store.path)

    first = fit()
    monkeypatch.setattr("dkha.engine.mkrow.exact_mk_row", never)
    second = fit()
    assert np.array_equal(second.mk_, first.mk_)
    assert np.array_equal(second.alpha_, first.alpha_)


def test_center_sample_error_shrinks_and_is_exact_at_l(store, client, dense_mk):
    want = dense_mk(SIGMA)[0]
    l = store.n_samples
    errors = {}
    for n in (10, 60, l):
        engine = engine_for(store, client)
        mk, mkm = engine.compute_mk(center_sample=n, seed=3, cache=False)
        assert engine.centering == {"kernel": "gaussian", "parameters": {"sigma": SIGMA},
                                    "centering": "sample", "center_sample": n, "seed": 3,
                                    "cached": False}
        assert mkm == pytest.approx(mk.mean(), rel=1e-15)
        errors[n] = np.abs(mk - want).max() / np.abs(want).max()
    assert errors[10] > 2 * errors[60] > 0.02 * errors[10]
    assert errors[l] < 1e-13
    with pytest.raises(ParameterError, match="center_sample must lie in"):
        engine_for(store, client).compute_mk(center_sample=l + 1)


def test_center_sample_is_recorded_and_reported(store, tmp_path, capsys):
    import json

    from dkha.cli.main import main

    run = str(tmp_path / "run")
    assert main(["fit", store.path, "-o", run, "-r", "3", "--passes", "1", "--sigma", str(SIGMA),
                 "--center-sample", "100", "--evaluate-every", "0", "--quiet", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["centering"] == "sample" and fitted["center_sample"] == 100
    assert main(["evaluate", run]) == 0
    out = capsys.readouterr().out
    assert "approximate, the MK row estimated from a sample of 100 of the 300" in out
    assert main(["evaluate", run, "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["centering"] == "sample" and evaluated["center_sample"] == 100
    assert evaluated["excess"] == pytest.approx(fitted["excess"], rel=1e-9)
