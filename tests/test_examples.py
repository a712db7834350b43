"""Every script in examples/ runs to the end on small data (DKHA_EXAMPLE_SMALL=1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import REPO, subprocess_env

EXAMPLES = sorted(f for f in os.listdir(os.path.join(REPO, "examples")) if f.endswith(".py"))


def test_the_gallery_has_its_three_examples():
    assert EXAMPLES == ["plot_cluster_run.py", "plot_digits_estimator.py",
                        "plot_image_patches.py"]


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    (tmp_path / "tmp").mkdir()
    env = subprocess_env(DKHA_EXAMPLE_SMALL="1", MPLBACKEND="Agg", TMPDIR=str(tmp_path / "tmp"))
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", name)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    # its temporary folders removed (Dask's own scratch space aside)
    assert [f for f in os.listdir(tmp_path / "tmp") if f != "dask-scratch-space"] == []
    pngs = [f for f in os.listdir(tmp_path) if f.endswith(".png")]
    if name != "plot_cluster_run.py":
        assert pngs and all(os.path.getsize(tmp_path / f) > 1000 for f in pngs)
    else:
        excess = float(p.stdout.split("excess error after 2 passes: ")[1].split()[0])
        assert 0 < excess < 1 and "Array (3000, 8)" in p.stdout       # measured, not nan
