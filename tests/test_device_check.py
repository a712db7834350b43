"""``benchmarks/device_check.py --dry-run``: the GPU host's prepared run, every step of the GPU
section (issue 40) at toy size here, with NumPy for CuPy and the band passes on the CPU, and the
CPU section's new step (issue 41: the KHA-SMD pass on a fixed subset of blocks at a larger l):
it prints its plan first, runs through without a failed step, and prints the acceptance lines.
The fits at the larger l and the CPU section's scaling table (scaling.py, run whole by its own
README command) are left out here (minutes on 2 shared cores; the full dry run, every step, is
``python benchmarks/device_check.py --dry-run``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_dry_run_passes_and_prints_the_plan(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    env.pop("OUT", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--dry-run",
         "--section", "gpu", "cpu", "--skip", "equality", "stop", "float32", "bigfit",
         "double", "krylov", "scaling",
         "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = out.splitlines()
    assert "plan (dry run" in lines[0] and "plan: gpu" in lines[1] and "plan: cpu" in lines[2]
    assert "FAILED" not in out, out[-4000:]
    for what in ("=== issue 40, GPU: acceptance", "centered K'V (20 columns)",
                 "float32 cupy tiles", "the fit at l = 6000: skipped",
                 "l = 3000, KHA-SMD pass"):
        assert what in out, what
    assert "issue 32, CPU: acceptance" not in out      # the skipped scaling table
    assert (tmp_path / "out" / "figures.json").exists()
