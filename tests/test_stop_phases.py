"""SIGTERM during every long phase ends the command with exit code 75 at the phase's next task
boundary: the MK row, the Nyström rows, an evaluation (the C and residual passes, E_min's Krylov
products), the products of the exact Krylov solver, and the explained variance.

Small data, cut into many small tiles (``DASK_DKHA__TILE_ROWS``) so that every phase lasts a
few seconds; the signal is sent when ``-v`` logs that the phase has started, and the exit
message must name that phase (a phase that ended before the signal would name another).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from dkha.data.ingest import ingest_array
from tests.processes import dkha_command, dkha_in_process, subprocess_env

pytestmark = pytest.mark.slow
SLICED = {"DASK_DKHA__TILE_ROWS": "40", "DASK_DKHA__MK_CACHE": "false",
          "DASK_DKHA__DENSE_EIGH_LIMIT": "100"}
#: the same settings for a command run in this process
SLICED_CONFIG = {"dkha.tile-rows": 40, "dkha.mk-cache": False, "dkha.dense-eigh-limit": 100}
BASE = ["--components", "4", "--sigma", "3", "--seed", "0"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("stop") / "x.zarr")
    ingest_array(np.random.default_rng(5).normal(size=(1200, 8)), path, chunk_rows=40)
    return path


def _stop_during(args, phase_line: str, *, occurrence: int = 1, env=None):
    """Run ``dkha ARGS``, send SIGTERM once ``phase_line`` has appeared ``occurrence`` times in
    its log; ``(exit code, seconds from the signal to the exit, stderr)``."""
    proc = subprocess.Popen(dkha_command("-v", *args), env=subprocess_env(**SLICED, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, sent = [], []
    out_lines = []
    drain = threading.Thread(target=lambda: out_lines.extend(proc.stdout), daemon=True)
    drain.start()
    seen = 0
    for line in proc.stderr:
        lines.append(line)
        if not sent and phase_line in line:
            seen += 1
            if seen == occurrence:
                proc.send_signal(signal.SIGTERM)
                sent.append(time.perf_counter())
    proc.wait(timeout=600)
    stderr = "".join(lines)
    assert sent, f"the phase {phase_line!r} never started:\n{stderr}"
    seconds = time.perf_counter() - sent[0]
    print(f"{phase_line}: exit {proc.returncode} {seconds:.1f} s after SIGTERM")
    return proc.returncode, seconds, stderr


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_stop_during_the_mk_row(store, tmp_path):
    rc, _, err = _stop_during(["fit", store, "-o", str(tmp_path / "run"), *BASE, "--passes", "1"],
                              "the MK row (centering) pass:")
    assert rc == 75, err
    assert _last_line(err) == "dkha: stopped during the MK row (centering) pass"


def test_stop_during_the_nystrom_rows(store, tmp_path):
    rc, _, err = _stop_during(["fit", store, "-o", str(tmp_path / "run"), *BASE, "--passes", "1",
                               "--init", "nystrom:600", "--block", "2", "--prefetch", "1"],
                              "Nyström landmark rows:")
    assert rc == 75, err
    assert "stopped during the block of rows" in _last_line(err)


def test_stop_during_the_final_evaluation_checkpoints_and_resumes(store, tmp_path):
    run = str(tmp_path / "run")
    fit = ["fit", store, "-o", run, *BASE, "--steps", "480", "--block", "48",
           "--evaluate-every", "0", "--checkpoint-every", "1"]
    rc, _, err = _stop_during(fit, "the residual pass of an evaluation:")
    assert rc == 75, err
    last = _last_line(err)
    assert "stopped during the residual pass of an evaluation at step 480" in last
    assert "checkpoint written" in last
    steps = [int(n[5:]) for n in os.listdir(os.path.join(run, "checkpoints"))
             if n.startswith("step-") and n[5:].isdigit()]
    assert max(steps) == 480
    res = dkha_in_process(*fit, "--resume", config=SLICED_CONFIG)
    assert res.returncode == 0, res.stderr
    import xarray as xr

    hist = xr.open_zarr(os.path.join(run, "components.zarr"))
    assert int(hist["step"].values[-1]) == 480 and np.isfinite(hist["excess"].values[-1])


def test_stop_during_the_krylov_products(store, tmp_path):
    rc, _, err = _stop_during(["fit", store, "-o", str(tmp_path / "run"), *BASE,
                               "--algorithm", "krylov"], "a K' V product pass:", occurrence=2)
    assert rc == 75, err
    assert "stopped during a K' V product pass" in _last_line(err)


def test_stop_during_the_explained_variance(store, tmp_path):
    run = str(tmp_path / "run")
    made = dkha_in_process("fit", store, "-o", run, *BASE, "--steps", "96", "--block", "48",
                           "--evaluate-every", "-1", "--init", "random:100", config=SLICED_CONFIG)
    assert made.returncode == 0, made.stderr
    # --exact: E_min by Krylov products (evaluation is tracked unless asked), not from the
    # store's spectrum cache that an earlier test of this module may have filled
    rc, _, err = _stop_during(["evaluate", run, "--variance", "--exact"], "a K' V product pass:",
                              env={"DASK_DKHA__SPECTRUM_CACHE": "false"})
    assert rc == 75, err
    assert "stopped during a K' V product pass" in _last_line(err)
