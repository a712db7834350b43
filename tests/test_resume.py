"""Exact resume: a fit killed at any point and resumed equals the uninterrupted run bit for bit."""

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
from tests.processes import subprocess_env

FIT = ["--algorithm", "kha-smd", "--components", "5", "--sigma", "4", "--passes", "8",
       "--seed", "2", "--evaluate-every", "2", "--checkpoint-every", "1", "--block", "32", "--quiet"]


def _env():
    return subprocess_env()


def _cmd(*args):
    return [sys.executable, "-m", "dkha.cli", *args]


def _alpha(run):
    ds = xr.open_zarr(os.path.join(run, "components.zarr")).load()
    return ds["alpha"].values, ds


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from sklearn.datasets import load_digits

    X = load_digits().data[:600] / 8.0 - 1.0
    path = str(tmp_path_factory.mktemp("d") / "digits.zarr")
    ingest_array(X, path, chunk_rows=150)
    return path


@pytest.fixture(scope="module")
def uninterrupted(store, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("r") / "full")
    subprocess.run(_cmd("fit", store, "-o", run, *FIT), check=True, env=_env(), timeout=300)
    return _alpha(run)


def _checkpoint_steps(run):
    d = os.path.join(run, "checkpoints")
    return sorted(n for n in os.listdir(d) if n.startswith("step-")) if os.path.isdir(d) else []


def test_sigkill_at_a_random_moment_then_resume_is_bit_identical(store, uninterrupted, tmp_path):
    alpha_ref, ds_ref = uninterrupted
    rng = np.random.default_rng(7)
    for trial in range(2):
        run = str(tmp_path / f"killed{trial}")
        proc = subprocess.Popen(_cmd("fit", store, "-o", run, *FIT), env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # wait for the first checkpoint, then kill at a random later moment
        deadline = time.time() + 120
        while not _checkpoint_steps(run):
            assert proc.poll() is None, "the fit ended before its first checkpoint"
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(float(rng.uniform(0.0, 1.5)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if os.path.exists(os.path.join(run, "components.zarr")):
            continue  # it had finished: nothing to resume
        subprocess.run(_cmd("fit", store, "-o", run, *FIT, "--resume"), check=True, env=_env(),
                       timeout=300)
        alpha, ds = _alpha(run)
        assert np.array_equal(alpha, alpha_ref)
        # the history has no gap and no duplicate
        assert list(ds["pass"].values) == list(ds_ref["pass"].values)
        assert np.array_equal(ds["excess"].values, ds_ref["excess"].values)


def test_sigterm_checkpoints_mid_pass_and_exits_75(store, uninterrupted, tmp_path):
    alpha_ref, _ = uninterrupted
    run = str(tmp_path / "term")
    proc = subprocess.Popen(_cmd("fit", store, "-o", run, *FIT), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not _checkpoint_steps(run):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "resume" in err and "Traceback" not in err
    steps = [int(n.split("-")[1]) for n in _checkpoint_steps(run)]
    assert max(steps) % 600 != 0, "SIGTERM's checkpoint is mid-pass, at a block boundary"
    subprocess.run(_cmd("fit", store, "-o", run, *FIT, "--resume"), check=True, env=_env(),
                   timeout=300)
    assert np.array_equal(_alpha(run)[0], alpha_ref)


def test_resume_refuses_other_settings_and_missing_runs(store, tmp_path):
    run = str(tmp_path / "other")
    proc = subprocess.Popen(_cmd("fit", store, "-o", run, *FIT), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not _checkpoint_steps(run):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    changed = [a if a != "2" else "3" for a in FIT]  # another seed
    changed[changed.index("--sigma") + 1] = "5"
    p = subprocess.run(_cmd("fit", store, "-o", run, *changed, "--resume"), env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "different settings" in p.stderr and "seed" in p.stderr and "sigma" in p.stderr
    # a fresh fit into it without --resume is refused too (nothing lost silently)
    p = subprocess.run(_cmd("fit", store, "-o", run, *FIT), env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "--resume" in p.stderr
    p = subprocess.run(_cmd("fit", store, "-o", str(tmp_path / "nothing"), *FIT, "--resume"),
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no run directory" in p.stderr


def test_corrupted_newest_checkpoint_falls_back_and_still_matches(store, uninterrupted, tmp_path):
    alpha_ref, _ = uninterrupted
    run = str(tmp_path / "corrupt")
    proc = subprocess.Popen(_cmd("fit", store, "-o", run, *FIT), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(_checkpoint_steps(run)) < 2:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    newest = os.path.join(run, "checkpoints", _checkpoint_steps(run)[-1], "state.npz")
    data = bytearray(open(newest, "rb").read())
    data[len(data) // 3] ^= 0xFF
    open(newest, "wb").write(bytes(data))
    p = subprocess.run(_cmd("fit", store, "-o", run, *FIT, "--resume"), env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "damaged" in p.stderr
    assert np.array_equal(_alpha(run)[0], alpha_ref)
