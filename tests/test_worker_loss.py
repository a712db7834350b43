"""Losing a worker process mid-fit changes nothing: its blocks are recomputed in schedule order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from dkha.store import ingest_array

pytestmark = pytest.mark.cluster
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIT = ["--algorithm", "kha-smd", "--components", "6", "--sigma", "4", "--passes", "6",
       "--seed", "1", "--evaluate-every", "-1", "--quiet", "--block", "32", "--prefetch", "6"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    return env


def _start_cluster(d: str, n_workers: int):
    sched_file = os.path.join(d, "scheduler.json")
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                               "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                               sched_file], env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    deadline = time.time() + 60
    while not os.path.exists(sched_file):
        assert time.time() < deadline
        time.sleep(0.2)
    time.sleep(0.3)
    workers = []
    for i in range(n_workers):
        # no nanny: a killed worker stays dead, the others must take its work
        w = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                              sched_file, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                              "--host", "127.0.0.1", "--name", f"w{i}"],
                             env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        workers.append(w)
    from distributed import Client

    with Client(scheduler_file=sched_file, timeout="30s") as c:
        c.wait_for_workers(n_workers, timeout=60)
    return sched_file, procs + workers, workers


def _stop(procs):
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def test_killing_a_worker_mid_fit_leaves_alpha_unchanged(tmp_path):
    from sklearn.datasets import load_digits

    store = str(tmp_path / "d.zarr")
    ingest_array(load_digits().data[:1200] / 8.0 - 1.0, store, chunk_rows=150)
    sched_file, procs, workers = _start_cluster(str(tmp_path), 3)
    try:
        ref = str(tmp_path / "undisturbed")
        subprocess.run([sys.executable, "-m", "dkha.cli", "fit", store, "-o", ref, *FIT,
                        "--scheduler-file", sched_file], env=_env(), check=True, timeout=600)
        run = str(tmp_path / "disturbed")
        fit = subprocess.Popen([sys.executable, "-m", "dkha.cli", "fit", store, "-o", run, *FIT,
                                "--scheduler-file", sched_file, "--checkpoint-every", "1"],
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        ck = os.path.join(run, "checkpoints")
        deadline = time.time() + 300
        while not (os.path.isdir(ck) and any(n.startswith("step-") for n in os.listdir(ck))):
            assert fit.poll() is None, fit.communicate()[1]
            assert time.time() < deadline
            time.sleep(0.05)
        workers[0].send_signal(signal.SIGKILL)  # mid-pass 2, with blocks in flight
        workers[0].wait()
        out, err = fit.communicate(timeout=600)
        assert fit.returncode == 0, err
        a = xr.open_zarr(os.path.join(run, "components.zarr"))["alpha"].values
        b = xr.open_zarr(os.path.join(ref, "components.zarr"))["alpha"].values
        assert np.array_equal(a, b)
    finally:
        _stop(procs)
