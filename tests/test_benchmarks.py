"""``benchmarks/`` as a suite a reader can run: benchmarks/README.md lists every script (and only
those), with a command whose options the script takes; every script answers ``--help`` (its
imports of dkha resolve, its arguments parse); the quick ones run at toy size and print their
figures; the shared helpers of ``benchmarks/_data.py`` measure what they say.

A benchmark broken by a change in dkha (a renamed function, a moved module) fails here."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_"))
#: what other issues cite by name (issue 44): kept, by name
CITED = ("krylov_coordinator", "scaling", "device_check", "throughput", "memory_budget",
         "digits_kpca", "defaults")


def _rows() -> tuple[dict[str, str], set[str]]:
    """The README's kept scripts (name → command) and its removed ones."""
    text = (BENCH / "README.md").read_text()
    kept_text, _, removed_text = text.partition("## Removed")
    kept = {m.group(1): m.group(2) for m in
            re.finditer(r"^\| `(\w+)\.py` \|.*\| `python benchmarks/\1\.py([^`]*)` \|$",
                        kept_text, re.MULTILINE)}
    removed = set(re.findall(r"^\| `(\w+)\.py` \|", removed_text, re.MULTILINE))
    return kept, removed


def _env() -> dict:
    """No PYTHONPATH: a script finds this checkout's dkha itself (through ``_data``)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    return env


def test_readme_lists_every_script_and_only_those():
    kept, removed = _rows()
    assert sorted(kept) == SCRIPTS
    assert not removed & set(SCRIPTS)
    assert set(CITED) <= set(SCRIPTS)


# Each script run as ``python benchmarks/NAME.py --help`` would be from the repository root:
# its folder first on the path and not the root (so it must put this checkout's dkha on the path
# itself), ``__name__ == "__main__"``; all in one process, dkha's modules and ``_data`` dropped
# between scripts so that each imports them as it would alone. Prints {name: [exit code, help
# text]} as JSON.
_HELP_ALL = r"""
import contextlib, io, json, os, runpy, sys
root = os.getcwd()
base = [p for p in sys.path if p not in ("", root)]
out = {}
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m == "_data" or m.split(".")[0] == "dkha"]:
        del sys.modules[m]
    path = f"benchmarks/{name}.py"
    sys.argv[:] = [path, "--help"]
    sys.path[:] = [os.path.join(root, "benchmarks"), *base]
    buf, code = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:  # noqa: BLE001 - reported, with the script's name
        code = f"{type(e).__name__}: {e}"
    out[name] = [code, buf.getvalue()]
print(json.dumps(out))
"""


def test_every_script_answers_help_and_takes_its_readme_command():
    proc = subprocess.run([sys.executable, "-c", _HELP_ALL, *SCRIPTS], cwd=ROOT, env=_env(),
                          check=False,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    broken = {name: code for name, (code, _) in answers.items() if code != 0}
    assert not broken, broken
    kept, _ = _rows()
    for name, command in kept.items():
        options = set(re.findall(r"(?<!\S)(--[a-z][a-z-]*)", command))
        unknown = {o for o in options if o not in answers[name][1]}
        assert not unknown, (name, unknown)


@pytest.mark.parametrize("name, args, printed", [
    ("coordinator_speed", ["--samples", "600", "--components", "3", "--block", "64", "--blocks",
                           "1", "--reference-steps", "2", "--algorithms", "kha,kha-smd"],
     r"kha-smd"),
    ("krylov_coordinator", ["--samples", "3000", "--block", "6", "--components", "3",
                            "--products", "2", "--max-basis", "18"], r"product"),
])
def test_quick_benchmarks_run_at_toy_size(name, args, printed):
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], cwd=ROOT, check=False,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(printed, proc.stdout), proc.stdout[-2000:]


def test_shared_helpers_measure_a_child_and_a_block(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import _data
    finally:
        sys.path.remove(str(BENCH))
    # a child that holds 300 MiB, and its own child that holds 200 MiB more at the same time:
    # the peak of the tree is at least their sum, more than either alone
    hold = "import numpy, subprocess, sys, time; a = numpy.ones({} * 2**17); {}"
    grandchild = hold.format(200, "time.sleep(1.5)")
    parent = hold.format(300, f"subprocess.run([sys.executable, '-c', {grandchild!r}])")
    res = _data.run_watched([sys.executable, "-c", parent], timeout=120)
    assert res["returncode"] == 0
    assert res["peak_mb"] > 480
    assert res["seconds"] >= 1.5 and not res["timed_out"]
    # past its timeout, the command and its child are killed: no sleeper is left behind
    pid_file = tmp_path / "pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); " \
              "time.sleep(120)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper!r}])"
    res = _data.run_watched([sys.executable, "-c", parent], timeout=8)
    assert res["timed_out"] and res["returncode"] != 0 and res["seconds"] < 60
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with _data.timed() as t:
        sum(range(1000))
    assert 0 <= t.seconds < res["seconds"]
    assert _data.ratio("x", 3.0, 2.0) == "x: 3 s / 2 s = 1.5×"
    assert _data.patches(50, patch=5, step=7).shape == (50, 25)
