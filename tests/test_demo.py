"""The README's first command, ``dkha demo``: it runs, and its table shows the excess error
(eq. 22) of every pass as a number (a tracked fit has no E_min: the demo asks for the exact
measure, which 1 000 digits make cheap)."""

import os
import subprocess
import sys

from processes import subprocess_env


def test_demo_prints_the_excess_of_every_pass(tmp_path):
    out = str(tmp_path / "demo")
    p = subprocess.run([sys.executable, "-m", "dkha.cli", "demo", "-o", out, "--passes", "3"],
                       env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    start = lines.index("pass   excess error E/E_min − 1") + 1
    rows = [line.split() for line in lines[start:start + 4]]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    excess = [float(r[1]) for r in rows]
    assert all(e == e and abs(e) < 1e-2 for e in excess), excess     # numbers, not nan
    assert os.path.isdir(os.path.join(out, "run", "components.zarr"))
