"""Bad input: each case is one line on stderr, a non-zero exit, no traceback, nothing written over.

The cases run the ``dkha`` command in this process (:func:`tests.processes.dkha_in_process`:
its output, its warnings and its log records, which a process of its own would print, are all
counted); the unreachable scheduler runs as a process of its own, as a user meets it.

Run as a script to print the table of cases and what the user sees:

    python tests/test_bad_input.py
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import zarr

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # as a script
from dkha import progress
from tests.processes import dkha_in_process, other_lines, subprocess_env

#: an unreachable scheduler is given up on after this long
CONNECT = {"dkha.connect-timeout": "2s"}


def make_fixtures(d: str) -> dict:
    """The files the cases use, made in ``d``."""
    from dkha.data.ingest import ingest_array

    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 4))
    np.save(os.path.join(d, "good.npy"), X)
    bad = X.copy()
    bad[123, 2] = np.nan
    np.save(os.path.join(d, "nan.npy"), bad)
    np.save(os.path.join(d, "inf.npy"), np.where(np.arange(300)[:, None] == 7, np.inf, X))
    np.save(os.path.join(d, "three.npy"), np.zeros((3, 3, 3)))
    np.save(os.path.join(d, "empty.npy"), np.zeros((0, 4)))
    np.save(os.path.join(d, "strings.npy"), np.array([["a", "b"], ["c", "d"]]))
    with open(os.path.join(d, "pickled.npy"), "wb") as f:
        np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    ingest_array(X, os.path.join(d, "good.zarr"), chunk_rows=50)
    for name in ("corrupt.zarr", "missing.zarr"):
        shutil.copytree(os.path.join(d, "good.zarr"), os.path.join(d, name))
    chunk = sorted(glob.glob(os.path.join(d, "corrupt.zarr", "X", "c", "*", "*")))[2]
    data = bytearray(pathlib.Path(chunk).read_bytes())
    data[len(data) // 2] ^= 0xFF
    pathlib.Path(chunk).write_bytes(data)
    os.remove(sorted(glob.glob(os.path.join(d, "missing.zarr", "X", "c", "*", "*")))[3])
    g = zarr.open_group(os.path.join(d, "nox.zarr"), mode="w")
    g.create_array("Y", shape=(10, 2), dtype="f8")
    g = zarr.open_group(os.path.join(d, "dims3.zarr"), mode="w")
    a = g.create_array("X", shape=(4, 3, 2), dtype="f8", dimension_names=["sample", "feature", "z"])
    a[:] = 1.0
    g = zarr.open_group(os.path.join(d, "textx.zarr"), mode="w")
    g.create_array("X", shape=(4, 3), dtype="bool", dimension_names=["sample", "feature"])
    os.makedirs(os.path.join(d, "notzarr"))
    pathlib.Path(d, "afile").write_text("x")
    ran = dkha_in_process("fit", os.path.join(d, "good.zarr"), "-o", os.path.join(d, "run"),
                          "--passes", "1", "--components", "2", "--quiet")
    assert ran.returncode == 0, ran.stderr
    pipeline = '[data]\nkind = "digits"\n[[fit]]\nalgorithm = "kha"\n'
    pathlib.Path(d, "bad.toml").write_text(pipeline + "pases = 3\n")
    pathlib.Path(d, "ok.toml").write_text(pipeline)
    return {"d": d}


#: (what, the command line (split at spaces), what its one line says, what it must not write)
CASES = [
    ("NaN in the data", "ingest array {d}/nan.npy -o {d}/o1.zarr", "non-finite", "o1.zarr"),
    ("inf in the data", "ingest array {d}/inf.npy -o {d}/o2.zarr", "rows starting at 7", "o2.zarr"),
    ("3-d array", "ingest array {d}/three.npy -o {d}/o3.zarr", "2-d", "o3.zarr"),
    ("empty array", "ingest array {d}/empty.npy -o {d}/o4.zarr", "empty", "o4.zarr"),
    ("non-numeric dtype", "ingest array {d}/strings.npy -o {d}/o5.zarr", "not numeric", "o5.zarr"),
    ("pickled .npy (never unpickled)", "ingest array {d}/pickled.npy -o {d}/o6.zarr",
     "not a readable", "o6.zarr"),
    ("missing input file", "ingest array {d}/nothere.npy -o {d}/o7.zarr", "no such file", None),
    ("store does not exist", "fit {d}/nothere.zarr -o {d}/r1", "no data store", "r1"),
    ("store is a file", "fit {d}/afile -o {d}/r2", "is a file", "r2"),
    ("directory that is not zarr", "fit {d}/notzarr -o {d}/r3", "not a zarr group", "r3"),
    ("store without X", "fit {d}/nox.zarr -o {d}/r4", "has no variable X", "r4"),
    ("X with 3 dims", "fit {d}/dims3.zarr -o {d}/r5", "2 dims", "r5"),
    ("X of booleans", "fit {d}/textx.zarr -o {d}/r6", "dtype bool", "r6"),
    ("corrupted chunk (checksum)", "fit {d}/corrupt.zarr -o {d}/r7 --sigma 1", "corrupted", "r7"),
    ("missing chunk", "fit {d}/missing.zarr -o {d}/r8", "missing 1 of 6 chunks", "r8"),
    ("sigma ≤ 0", "fit {d}/good.zarr -o {d}/r10 --sigma 0", "sigma must be a positive", "r10"),
    ("unknown algorithm", "fit {d}/good.zarr -o {d}/r11 --algorithm pca",
     ("unknown --algorithm 'pca'; choose one of auto, kha, kha-t, kha-et, kha-smd, krylov, "
      "on-kha, oo-kha, okpca"), "r11"),
    ("unknown kernel", "fit {d}/good.zarr -o {d}/r12 --kernel chi2",
     "unknown kernel 'chi2'; choose one of gaussian", "r12"),
    ("eta0 ≤ 0", "fit {d}/good.zarr -o {d}/r13 --eta0 -1",
     "'eta0' parameter of KernelHebbianPCA must be a float in the range (0.0, inf)", "r13"),
    ("xi outside [0, 1]", "fit {d}/good.zarr -o {d}/r14 --xi 1.5",
     "'xi' parameter of KernelHebbianPCA must be a float in the range [0.0, 1.0]", "r14"),
    ("--center-sample above l", "fit {d}/good.zarr -o {d}/r18 --center-sample 301",
     "center_sample must be an integer in 1..300", "r18"),
    ("--center-sample with an online algorithm",
     "fit {d}/good.zarr -o {d}/r19 --algorithm on-kha --center-sample 10",
     "applies to the batch algorithms", "r19"),
    ("bad --init", "fit {d}/good.zarr -o {d}/r15 --init nystrom:abc", "init", "r15"),
    ("run dir holds a different run", "fit {d}/good.zarr -o {d}/run --components 3",
     "different run", None),
    ("run dir is a file", "fit {d}/good.zarr -o {d}/afile", "not a directory", None),
    ("run dir inside the input store", "fit {d}/good.zarr -o {d}/good.zarr/run",
     "inside the data store", None),
    ("resume of a run that does not exist", "fit {d}/good.zarr -o {d}/r16 --resume",
     "no run directory", "r16"),
    ("online resume of a run that does not exist",
     "fit {d}/good.zarr -o {d}/r20 --algorithm on-kha --resume",
     "no run directory", "r20"),
    ("resume into a run directory that is a file", "fit {d}/good.zarr -o {d}/afile --resume",
     "is not a directory", None),
    ("a diverging gain (kha --eta0 1000)",
     "fit {d}/good.zarr -o {d}/r21 --algorithm kha --eta0 1000 --passes 1 --on-divergence stop",
     "diverged at step", "r21"),
    # ({d}/run is a finished run: its --resume has nothing to do, exit 0)
    ("resume of a run without checkpoints",
     "fit {d}/good.zarr -o {d}/notzarr --resume --components 2 --passes 1",
     "holds no checkpoint", None),
    ("evaluate a directory that is no run", "evaluate {d}/notzarr",
     "not a dkha run directory", None),
    ("transform writing over its input",
     "transform {d}/run {d}/good.zarr -o {d}/good.zarr --overwrite",
     "input of this transform", None),
    ("transform with other features", "transform {d}/run {d}/dims3.zarr -o {d}/t2.zarr",
     "2 dims", "t2.zarr"),
    ("pipeline file with unknown keys", "run {d}/bad.toml --runs-dir {d}/runs",
     "unknown key pases", None),
    ("unsafe run id", "run {d}/ok.toml --run-id ../escape --runs-dir {d}/runs",
     "unsafe run id", None),
]


#: the case run as a process of its own (what it shows is the process's exit and output)
UNREACHABLE = ("unreachable scheduler", "fit {d}/good.zarr -o {d}/r17 --scheduler tcp://127.0.0.1:1",
               "cannot reach the Dask scheduler", "r17")


def run_case(args, d, *, process=False):
    """``(exit code, stderr as the user sees it)`` of ``dkha ARGS``: in this process, its
    warnings and logged WARNING/ERROR records appended to stderr as a process would print them;
    or (``process``) as a process of its own."""
    argv = [a.format(d=d) for a in args.split()]
    if process:
        p = subprocess.run([sys.executable, "-m", "dkha.cli", *argv],
                           env=subprocess_env(DASK_DKHA__CONNECT_TIMEOUT="2s"),
                           capture_output=True, text=True, timeout=300, check=False)
        return p.returncode, p.stderr
    ran = dkha_in_process(*argv, config=CONNECT)
    shown = [f"{w.category.__name__}: {w.message}" for w in ran.warnings]
    shown += [f"{r.name} {r.levelname}: {r.getMessage()}" for r in ran.records]
    return ran.returncode, ran.stderr + "".join(line + "\n" for line in shown)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return make_fixtures(str(tmp_path_factory.mktemp("bad")))


@pytest.mark.parametrize("what,args,expect,not_written", [*CASES, UNREACHABLE],
                         ids=[c[0] for c in [*CASES, UNREACHABLE]])
def test_bad_input_is_one_line(fixtures, what, args, expect, not_written):
    d = fixtures["d"]
    before = os.path.getmtime(os.path.join(d, "run", "components.zarr", "zarr.json"))
    bars = list(progress._active)
    code, stderr = run_case(args, d, process=what == UNREACHABLE[0])
    assert progress._active == bars, "a refused command left a progress bar open"
    assert code != 0
    if what == UNREACHABLE[0]:
        assert code == 2
    assert "Traceback" not in stderr
    lines = other_lines(stderr)        # (a fit's progress lines come first in a pipe)
    assert len(lines) == 1 and lines[0].startswith("dkha: error:"), stderr
    assert expect in lines[0]
    if not_written:
        assert not os.path.exists(os.path.join(d, not_written))
    # the existing run is never touched by a refused command
    assert os.path.getmtime(os.path.join(d, "run", "components.zarr", "zarr.json")) == before


if __name__ == "__main__":  # print the table for the closing note
    d = tempfile.mkdtemp()
    make_fixtures(d)
    print("| bad input | exit | what the user sees |\n|---|---|---|")
    for what, args, _, _ in [*CASES, UNREACHABLE]:
        code, stderr = run_case(args, d, process=what == UNREACHABLE[0])
        msg = stderr.strip().splitlines()[-1] if stderr.strip() else "(nothing)"
        print(f"| {what} | {code} | `{msg.replace(d, '…').replace('|', '/')}` |")
    shutil.rmtree(d)
