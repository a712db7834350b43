"""The README's first command, ``dkha demo``: it runs, and its table shows the excess error
(eq. 22) of every pass as a number (a tracked fit has no E_min: the demo asks for the exact
measure, which 1 000 digits make cheap)."""

import itertools
import math
import os
import subprocess
import sys

from processes import dkha_in_process, subprocess_env


def test_demo_prints_the_excess_of_every_pass(tmp_path):
    """In this process (the command's code: the test below runs it as a process)."""
    out = str(tmp_path / "demo")
    p = dkha_in_process("demo", "-o", out, "--passes", "3")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    start = lines.index("pass   excess error E/E_min − 1") + 1
    rows = [line.split() for line in lines[start:start + 4]]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    excess = [float(r[1]) for r in rows]
    assert all(math.isfinite(e) for e in excess), excess     # numbers, not nan
    # real progress from the random start: every pass better, by far (3.4 → 0.03 in 3 passes)
    assert all(b < a for a, b in itertools.pairwise(excess)) and excess[-1] < excess[0] / 10, excess
    assert os.path.isdir(os.path.join(out, "run", "components.zarr"))


def test_demo_writes_nothing_into_the_working_directory(tmp_path):
    """Without -o the demo writes into a new temporary directory, which it names."""
    (tmp_path / "tmp").mkdir()
    p = subprocess.run([sys.executable, "-m", "dkha.cli", "demo", "--passes", "1"],
                       env=dict(subprocess_env(), TMPDIR=str(tmp_path / "tmp")), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["tmp"]
    (made,) = os.listdir(tmp_path / "tmp")
    assert made.startswith("dkha-demo-")
    assert f"saved {tmp_path / 'tmp' / made}/run/components.zarr" in p.stdout
