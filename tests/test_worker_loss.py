"""Losing a worker process mid-fit changes nothing: its blocks are recomputed in schedule order;
the log says so in one line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import xarray as xr

from dkha.data.ingest import ingest_array
from tests.processes import reference_and_background_fit, start_dask_cluster, stop_processes

pytestmark = pytest.mark.cluster
FIT = ["--algorithm", "kha-smd", "--components", "6", "--sigma", "4", "--passes", "6",
       "--seed", "1", "--evaluate-every", "-1", "--quiet", "--block", "32", "--prefetch", "6"]


def test_killing_a_worker_mid_fit_leaves_alpha_unchanged(tmp_path):
    from sklearn.datasets import load_digits

    store = str(tmp_path / "d.zarr")      # 8 chunks over 3 workers, 19 blocks a pass
    ingest_array(load_digits().data[:600] / 8.0 - 1.0, store, chunk_rows=75)
    _, sched_file, scheduler, workers = start_dask_cluster(str(tmp_path), 3, nanny=False)
    procs = [scheduler, *workers]
    try:
        ref, run, fit = reference_and_background_fit(store, str(tmp_path), FIT, sched_file)
        ck = os.path.join(run, "checkpoints")
        deadline = time.time() + 300
        while not (os.path.isdir(ck) and any(n.startswith("step-") for n in os.listdir(ck))):
            assert fit.poll() is None, fit.communicate()[1]
            assert time.time() < deadline
            time.sleep(0.05)
        workers[0].send_signal(signal.SIGKILL)  # mid-pass 2, with blocks in flight
        workers[0].wait()
        _out, err = fit.communicate(timeout=600)
        assert fit.returncode == 0, err
        # one line names the lost worker and what happens next, in the log's format
        lost = [ln for ln in err.splitlines() if "lost" in ln]
        assert len(lost) == 1, err
        assert re.fullmatch(r"\d\d:\d\d:\d\d \(\+\d+\.\d s\) dkha fit: warning: worker "
                            r"tcp://127\.0\.0\.1:\d+ \(w0\) lost: .*the work goes on.*",
                            lost[0]), lost
        a = xr.open_zarr(os.path.join(run, "components.zarr"))["alpha"].values
        b = xr.open_zarr(os.path.join(ref, "components.zarr"))["alpha"].values
        assert np.array_equal(a, b)
    finally:
        stop_processes(procs)


@contextlib.contextmanager
def refreshing(client):
    """While inside: a thread doing what the client's periodic callback does (replace its cached
    identity, with no worker listed), as often as it can."""
    stop = threading.Event()

    def refresh():
        while not stop.is_set():
            client.sync(client._update_scheduler_info)

    thread = threading.Thread(target=refresh, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_no_worker_is_said_lost_while_the_client_refreshes_its_cache(caplog, monkeypatch):
    """The watcher asks the scheduler for its workers afresh: the client's periodic update of
    its cached identity (every 2 s, with no worker listed) running all the while makes no
    "lost" line (before, a fit's in-process worker was said lost when a look read the cache
    between the two), and a worker that does leave is said so."""
    import logging

    from distributed import Client, LocalCluster

    from dkha.engine import dashboard

    monkeypatch.setattr(dashboard, "WATCH_EVERY", 0.01)
    caplog.set_level(logging.WARNING, logger="dkha.engine.cluster")
    with LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client, refreshing(client), dashboard.watching_workers(client):
        time.sleep(1.5)
        assert not [r for r in caplog.records if "lost" in r.getMessage()]
        gone = min(cluster.scheduler.workers)
        client.sync(cluster.scheduler.remove_worker, gone, stimulus_id="test")
        time.sleep(0.5)
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == 1 and lost[0].startswith(f"worker {gone} ") and lost[0].endswith(
        "its tasks run again on the 1 workers left; the work goes on"), lost


def test_the_worker_set_is_asked_afresh_as_workers_join_and_leave():
    """What the engine reads of the cluster's workers (their threads, GPUs, memory, the band
    passes' workers, where projections run, whether a pass's input is copied to every worker)
    follows the workers that join and leave, while the client's periodic update of its cached
    identity (no worker listed) runs all the while. Before, each read
    ``Client.scheduler_info()``, which returns that cache: read after the update replaced it,
    a cluster of 2 or 3 workers had none (1 thread, no band worker, "0 worker processes")."""
    from types import SimpleNamespace

    from distributed import Client, LocalCluster

    from dkha.engine.bandpass import wants_bands
    from dkha.engine.budget import Hardware
    from dkha.engine.cluster import total_threads
    from dkha.engine.rows import choose_projections

    compiled = SimpleNamespace(compiled=True, device="cpu")

    def seen(client) -> set:
        """The worker counts each reader gives, over many reads."""
        counts = set()
        for _ in range(20):
            counts |= {total_threads(client), len(wants_bands(compiled, client, True)),
                       len(Hardware.of(client).workers),
                       int(choose_projections("auto", client)[1].split()[0])}
        return counts

    # (threads that talk TCP: not the coordinator's process to the engine, and quick to start)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            refreshing(client):
        assert seen(client) == {2}
        cluster.scale(3)                                  # one joins
        client.wait_for_workers(3, timeout=60)
        assert seen(client) == {3}
        gone = min(cluster.scheduler.workers)             # one leaves
        client.retire_workers([gone], close_workers=True)
        deadline = time.time() + 60
        while len(cluster.scheduler.workers) != 2:
            assert time.time() < deadline
            time.sleep(0.05)
        assert seen(client) == {2}
