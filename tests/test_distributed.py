"""The row engine on real multi-process clusters: results do not depend on where the fit ran.

The module starts ``dask scheduler`` and two ``dask worker`` processes as separate OS processes
on 127.0.0.1 and runs the ``dkha`` command (in this process) against them.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xarray as xr

from dkha import config
from dkha.data import cf
from dkha.data.ingest import ingest_array
from tests.processes import dkha_in_process, start_dask_cluster, stop_processes

pytestmark = pytest.mark.cluster



def _dkha(*args, check=True):
    """``dkha ARGS`` run in this process (the command's code; the cluster's processes are
    the separate ones)."""
    proc = dkha_in_process(*args)
    if check and proc.returncode != 0:
        raise AssertionError(f"dkha {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from sklearn.datasets import load_digits

    d = load_digits()
    X = d.data[:1500] / 8.0 - 1.0
    path = str(tmp_path_factory.mktemp("data") / "digits.zarr")
    ingest_array(X, path, labels=d.target[:1500], chunk_rows=200)
    return path


@pytest.fixture(scope="module")
def embedded_run(store, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("runs") / "embedded")
    _dkha("fit", store, "-o", out, "--algorithm", "kha-smd", "--components", "6", "--sigma",
          "4", "--passes", "2", "--seed", "3", "--evaluate-every", "0", "--quiet", "--block", "64")
    return xr.open_zarr(os.path.join(out, "components.zarr"), consolidated=False).load()


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory):
    """``dask scheduler`` + 2 ``dask worker`` processes on 127.0.0.1; yields the address."""
    address, sched_file, scheduler, workers = start_dask_cluster(
        str(tmp_path_factory.mktemp("cluster")), 2)
    try:
        yield address, sched_file
    finally:
        stop_processes([scheduler, *workers])


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_separate_scheduler_and_workers_give_the_embedded_alpha(store, embedded_run, real_cluster,
                                                               tmp_path):
    address, _ = real_cluster
    assert address.startswith("tcp://127.0.0.1:")
    out = str(tmp_path / "remote")
    _dkha("fit", store, "-o", out, "--algorithm", "kha-smd", "--components", "6", "--sigma", "4",
          "--passes", "2", "--seed", "3", "--evaluate-every", "0", "--quiet", "--block", "64",
          "--scheduler", address)
    remote = xr.open_zarr(os.path.join(out, "components.zarr"), consolidated=False).load()
    assert _rel(remote["alpha"].values, embedded_run["alpha"].values) < 1e-10
    assert _rel(remote["mk"].values, embedded_run["mk"].values) < 1e-12
    # the same run evaluated on the cluster equals a dense numpy computation
    proc = _dkha("evaluate", out, "--json", "--recompute", "--scheduler", address)
    got = json.loads(proc.stdout)
    dense = _dense_evaluation(store, remote)
    for key in ("error", "error_min", "excess"):
        assert abs(got[key] - dense[key]) <= 1e-8 * abs(dense[key]), key


def test_environment_variable_selects_the_cluster(store, embedded_run, real_cluster, tmp_path,
                                                  monkeypatch):
    address, _ = real_cluster
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", address)
    out = str(tmp_path / "envrun")
    _dkha("fit", store, "-o", out, "--algorithm", "kha-smd", "--components", "6", "--sigma", "4",
          "--passes", "2", "--seed", "3", "--evaluate-every", "0", "--quiet", "--block", "64")
    got = xr.open_zarr(os.path.join(out, "components.zarr"), consolidated=False).load()
    assert _rel(got["alpha"].values, embedded_run["alpha"].values) < 1e-10


def test_local_process_cluster_gives_the_embedded_alpha(store, embedded_run, tmp_path):
    out = str(tmp_path / "local2")
    _dkha("fit", store, "-o", out, "--algorithm", "kha-smd", "--components", "6", "--sigma", "4",
          "--passes", "2", "--seed", "3", "--evaluate-every", "0", "--quiet", "--block", "64",
          "--workers", "2")
    got = xr.open_zarr(os.path.join(out, "components.zarr"), consolidated=False).load()
    assert _rel(got["alpha"].values, embedded_run["alpha"].values) < 1e-10


def _dense_evaluation(store_path, ds):
    from dkha.data.store import open_store

    X = open_store(store_path).read()
    sigma = cf.decode_attrs(ds.attrs)["kernel_parameters"]["sigma"]    # (saved as JSON text)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = np.exp(-d2 / (2 * sigma**2))
    l = len(K)
    one = np.full((l, l), 1.0 / l)
    Kc = K - one @ K - K @ one + one @ K @ one
    A = ds["alpha"].values
    C = A @ Kc
    E = np.linalg.norm(Kc - C.T @ C)
    w = np.linalg.eigvalsh(Kc)[::-1][: A.shape[0]]
    Emin = np.sqrt((Kc**2).sum() - (w**2).sum())
    return {"error": E, "error_min": Emin, "excess": E / Emin - 1}


def test_products_are_summed_on_the_worker_processes(store, real_cluster):
    """On the separate worker processes, ``K'V`` comes home one band at a time (``l·k·8`` bytes,
    not a piece per tile) and equals, bit for bit, the straightforward form: every tile's
    pieces computed here and added in the pass's order."""
    from distributed import Client

    from dkha.data.store import open_store
    from dkha.engine.rows import RowEngine
    from dkha.engine.tasks import product_pair
    from dkha.kernels import make_kernel

    address, _ = real_cluster
    ds = open_store(store)
    with Client(address, timeout="30s") as client:
        engine = RowEngine(ds, make_kernel("gaussian", sigma=4.0), client, config.settings())
        V = np.random.default_rng(5).normal(size=(ds.n_samples, 7))
        got = engine.matmat(V)
        g, pairs = engine.tile_groups, engine.tile_pairs()
        assert len(g) >= 3
        want = np.zeros_like(got)
        for i, j in pairs:
            to_i, to_j = product_pair(ds.path, engine.kernel, engine.mk, engine.mkm, g[i], g[j], V)
            want[g[i][0][0]:g[i][-1][1]] += to_i
            if to_j is not None:
                want[g[j][0][0]:g[j][-1][1]] += to_j
        assert np.array_equal(got, want)
        product = [p for p in engine.stats.passes if p["kind"] == "product"][-1]
        assert product["bytes_received"] == ds.n_samples * 7 * 8
        assert product["tasks"] == len(engine.tile_tasks()) and product["reduce_tasks"] == len(g)
