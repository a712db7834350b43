"""The command line's text and responsiveness: ``--version``, ``--help`` and argument errors
without the engine, help for every option with its default, a subcommand's own usage and the
nearest option name on errors, ``-v`` after the subcommand, progress lines in a pipe, and numbers
printed with the precision they have."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from dkha import progress
from dkha.cli.output import errors_text, excess_text, kernel_text, pair_digits
from dkha.cli.parser import build_parser
from dkha.estimators.params import PARAMETERS
from dkha.kernels import make_kernel
from tests.processes import dkha_in_process, other_lines, progress_lines, subprocess_env

ENGINE = ("dask", "distributed", "xarray", "sklearn", "numba", "zarr", "scipy")

#: each command line in turn in one fresh interpreter; after each, the engine's packages loaded
PROBE = """
import json, sys
from dkha.cli import main
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit:
        pass
    sys.stdout.write("\\nDONE\\n")
    sys.stdout.flush()
    sys.stderr.write("\\nLOADED " + json.dumps(sorted({m.split(".")[0] for m in sys.modules}
                                                    & set(json.loads(sys.argv[2])))) + "\\n")
"""
LIGHT = {"version": ["--version"], "help": ["--help"], "fit help": ["fit", "--help"],
         "ingest images help": ["ingest", "images", "--help"], "tune help": ["tune", "--help"],
         "denoise help": ["denoise", "--help"],
         "unknown option": ["fit", "store.zarr", "-o", "run", "--sgima", "3"],
         "missing option": ["fit", "store.zarr"]}


@pytest.fixture(scope="module")
def light_answers():
    """``{name: (engine packages loaded after it, its stdout, its stderr)}`` of the command
    lines of :data:`LIGHT`, run one after the other in one interpreter (an engine package that
    one of them loads stays loaded: the first that loads one is the one reported)."""
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(LIGHT.values())),
                        json.dumps(ENGINE)], env=subprocess_env(), capture_output=True,
                       text=True, timeout=120, check=False)
    parts = p.stderr.split("\nLOADED ")
    assert len(parts) == len(LIGHT) + 1, p.stderr
    loaded = [json.loads(part.split("\n", 1)[0]) for part in parts[1:]]
    # each command line's own output: after the previous one's marker, before its own
    errs = [parts[0]] + [part.split("\n", 1)[1] for part in parts[1:-1]]
    outs = p.stdout.split("\nDONE\n")
    assert len(outs) == len(LIGHT) + 1, p.stdout
    return {name: (loaded[i], outs[i], errs[i]) for i, name in enumerate(LIGHT)}


@pytest.mark.parametrize("name", list(LIGHT))
def test_answers_without_loading_the_engine(light_answers, name):
    loaded, stdout, stderr = light_answers[name]
    assert loaded == [], (loaded, stderr)
    assert stdout or "error:" in stderr


def _actions(parser: argparse.ArgumentParser, name: str = "dkha"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _actions(p, f"{name} {sub}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and \
                action.help != argparse.SUPPRESS:     # (hidden: a deprecated spelling)
            yield name, action


def test_every_option_has_a_help_text_with_its_default():
    actions = list(_actions(build_parser()))
    assert {name for name, _ in actions} >= {"dkha fit", "dkha tune", "dkha ingest images",
                                             "dkha denoise", "dkha evaluate", "dkha run"}
    for name, a in actions:
        what = f"{name} {'/'.join(a.option_strings) or a.dest}"
        assert a.help, f"{what} has no help"
        shown = a.default
        if (a.option_strings and not isinstance(a, argparse._CountAction)
                and shown not in (None, False, argparse.SUPPRESS)):
            assert "default" in a.help, f"{what}: its default {shown!r} is not in {a.help!r}"
    # the default algorithm, from the parameter table
    default = next(p.default for p in PARAMETERS if p.name == "algorithm")
    fit = {a.dest: a for name, a in actions if name == "dkha fit"}
    assert default in fit["algorithm"].help and "default" in fit["algorithm"].help
    images = {a.dest: a.help for name, a in actions if name == "dkha ingest images"}
    assert "default 11" in images["patch"] and "default 2" in images["step"]
    assert "default" in images["chunk_rows"]


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_errors_show_the_subcommands_usage_and_the_nearest_option(capsys):
    err = _error(["fit", "s.zarr", "-o", "run", "--sgima", "3"], capsys)
    assert err.startswith("usage: dkha fit ")
    assert err.strip().endswith("dkha fit: error: unrecognized arguments: --sgima 3; did you mean "
                                "--sigma?")
    err = _error(["ingest", "images", "a.png", "-o", "s.zarr", "--pach", "5"], capsys)
    assert err.startswith("usage: dkha ingest images ") and "did you mean --patch?" in err
    err = _error(["denoise", "run", "a.png", "-o", "b.png", "--preimage", "fixed-piont"], capsys)
    assert err.startswith("usage: dkha denoise ") and "did you mean fixed-point?" in err
    err = _error(["fitt", "s.zarr"], capsys)
    assert err.startswith("usage: dkha ") and "did you mean fit?" in err
    # nothing near: no guess
    err = _error(["fit", "s.zarr", "-o", "run", "--zzzzzz"], capsys)
    assert "did you mean" not in err and "unrecognized arguments: --zzzzzz" in err


def test_verbose_before_and_after_the_subcommand():
    parse = build_parser().parse_args
    assert parse(["fit", "s.zarr", "-o", "run"]).verbose == 0
    assert parse(["fit", "s.zarr", "-o", "run", "-v"]).verbose == 1
    assert parse(["-v", "fit", "s.zarr", "-o", "run", "-vv"]).verbose == 3
    assert parse(["ingest", "images", "a.png", "-o", "s.zarr", "--verbose"]).verbose == 1
    assert not hasattr(parse(["report", "run", "-v"]), "verbose_after")


def test_a_piped_fit_logs_each_phase_with_the_time(digits_store, tmp_path):
    run = str(tmp_path / "run")
    # a command refused while loading, in this process before it: its 'loading' was the phase
    # said last, and the fit's own first line was left out (under CI's xdist, after another test)
    refused = dkha_in_process("fit", str(tmp_path / "missing.zarr"), "-o", str(tmp_path / "r0"))
    assert refused.returncode != 0
    # in this process, its standard error a pipe's (not a terminal)
    p = dkha_in_process("fit", digits_store.path, "-o", run, "--components", "3", "--sigma", "4",
                        "--passes", "1",
                        config={"dkha.mk-cache": False, "dkha.spectrum-cache": False})
    assert p.returncode == 0, p.stderr
    assert other_lines(p.stderr) == []      # every line on stderr is a progress line
    lines = progress_lines(p.stderr)
    seconds = [s for s, _ in lines]
    assert seconds == sorted(seconds)
    phases = ["loading", "checking the data", "running the tasks in this process", "plan: ",
              "centering (MK row): 0/",
              "Nyström landmark rows: 0/", "E_min: the top 3 eigenvalues", "evaluation:",
              "kha-smd: 0/300 steps", "saving the run in"]
    messages = [m for _, m in lines]
    found = [next((i for i, m in enumerate(messages) if m.startswith("dkha fit: " + phase)),
                  None) for phase in phases]
    assert None not in found, dict(zip(phases, found))
    assert found == sorted(found), messages
    assert "saved " in p.stdout


def test_heartbeat_logs_while_a_step_takes_long(caplog):
    caplog.set_level(logging.INFO, logger="dkha.progress")
    with progress.heartbeat(every=0.2):
        with progress.Progress(True, 4, "a slow pass", unit="block") as bar:
            bar.update()
            time.sleep(1.5)                       # one block far longer than the interval
        progress.phase("saving")
        time.sleep(1.0)                           # a phase without progress of its own
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "a slow pass: 0/4 blocks so far in 0 s"
    assert any(m.startswith("a slow pass: 1/4 blocks so far in ") for m in lines[1:])
    assert any(m.startswith("working, ") and m.endswith("s since: saving") for m in lines)
    assert not any(t.name == "dkha-heartbeat" for t in threading.enumerate())


def test_the_krylov_progress_has_no_made_up_total(digits_store, client, caplog, monkeypatch):
    from dkha import KernelHebbianPCA
    from dkha.fit import spectrum

    monkeypatch.setattr(spectrum, "SMALL_DENSE", 0)     # the Krylov solver, not a dense eigh
    caplog.set_level(logging.INFO, logger="dkha.progress")
    KernelHebbianPCA(3, algorithm="krylov", sigma=4.0, client=client, verbose=True,
                     evaluate_every=-1).fit(digits_store)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "dkha.progress" and r.getMessage().startswith("Krylov:")]
    assert lines[0] == "Krylov: 0 products so far in 0 s"
    end = re.fullmatch(r"Krylov: (\d+) products in \d+ s", lines[-1])
    assert end and int(end.group(1)) > 1, lines


def test_numbers_are_printed_with_the_precision_they_have():
    # E and E_min apart by 3.3e-6 relative: printed with the digits that tell them apart
    e_min = 106.29200437
    e = e_min * (1 + 3.261e-6)
    text = errors_text(e, e_min, 3.261e-6, 4e-12)
    shown = re.fullmatch(r"E = (\S+), E_min = (\S+), excess = 3\.261e-06 \(±4\.0e-12\)", text)
    assert shown and shown.group(1) != shown.group(2), text
    assert abs(float(shown.group(1)) / float(shown.group(2)) - 1 - 3.261e-6) < 1e-7
    # below its precision: the digits stop there, and the excess says so
    assert pair_digits(-8.88e-16, 3e-12) == 6
    assert excess_text(-8.88e-16, float("nan")) == "0 (below its precision, ±8.9e-16)"
    assert excess_text(-8.88e-16, 3e-12) == "0 (below its precision, ±3.0e-12)"
    assert excess_text(2e-3, 3e-12) == "2.000e-03 (±3.0e-12)"
    # a median-heuristic sigma: six significant digits, not sixteen
    assert kernel_text(make_kernel("gaussian", sigma=3.0864712345678901)) == \
        "gaussian(sigma=3.08647)"


def test_ctrl_c_asks_the_command_to_stop_as_sigterm_does(capsys):
    """Ctrl-C (SIGINT) sets the stop request, as SIGTERM: the fit checkpoints and exits with 75
    (before, it raised ``KeyboardInterrupt`` wherever the fit was: exit 130, no checkpoint). A
    second Ctrl-C ends the command at once; commands that never check the request (ingest) keep
    Python's Ctrl-C."""
    import os
    import signal

    from dkha.cli.main import _install_stop_handler
    from dkha.engine.stop import STOP

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)        # the handler runs in this thread at the next bytecode

    try:
        _install_stop_handler("fit")
        ctrl_c()
        assert STOP.is_set()
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
        assert "SIGINT: stopping at the next task" in capsys.readouterr().err
        STOP.clear()
        _install_stop_handler("ingest")
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
        assert not STOP.is_set()
    finally:
        STOP.clear()
        for s, h in old.items():
            signal.signal(s, h)


@pytest.mark.parametrize("kernel, n, asked", [("rbf", 30, 40), ("linear", 300, 6)])
def test_components_beyond_the_rank_are_held_null_whatever_the_path(tmp_path, kernel, n, asked):
    """``dkha fit`` asked for more components than ``K'`` has rank: the run holds
    ``min(asked, l − 1)`` components whatever path fitted them (30 samples: a Nyström start,
    then Krylov's dense eigh, which finds 27 where the start's rcond saw rank 25; 300: the
    dense path), the null ones with eigenvalue, coefficients and projections 0; the others are
    numpy's eigenvalues of the centered kernel matrix. The summary counts what the run holds,
    the warning speaks of the run (not of the estimator's view and its ``remove_zero_eig``), and
    where ``E_min = 0`` the excess is not printed as ``inf``. Before, the 30-sample run held 25
    components while its attrs said 29 and the summary 30, and printed ``excess = inf``."""
    import numpy as np
    import xarray as xr
    from sklearn.datasets import make_circles

    from dkha.data.ingest import ingest_array

    X = make_circles(n_samples=300, factor=0.3, noise=0.05, random_state=0)[0][:n]
    np.save(tmp_path / "x.npy", X)
    store = ingest_array(str(tmp_path / "x.npy"), str(tmp_path / "x.zarr"))
    run = str(tmp_path / "run")
    p = dkha_in_process("fit", store.path, "-o", run, "--components", str(asked),
                        "--kernel", kernel)
    assert p.returncode == 0, p.stderr
    held = min(asked, n - 1)
    ds = xr.open_zarr(os.path.join(run, "components.zarr"))
    assert ds.sizes["component"] == held and ds.attrs["n_components"] == held
    # the oracle: numpy's eigenvalues of the centered kernel matrix
    K = X @ X.T if kernel == "linear" else np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1))
    J = np.eye(n) - 1.0 / n
    w = np.linalg.eigvalsh(J @ K @ J)[::-1][:held]
    lam = ds["eigenvalue"].values
    real = lam > 0
    rank = int(real.sum())
    assert 2 <= rank < held
    np.testing.assert_allclose(lam[real], w[:rank], rtol=1e-7, atol=1e-13 * w[0])  # ε‖K'‖
    # null exactly where numpy's eigenvalues are round-off (scikit-learn's clip, 1e-12 of the
    # largest): the exact path finds what the Nyström start's rcond missed
    assert rank == int(np.sum(w > 1e-12 * w[0]))
    assert not ds["alpha"].values[~real].any() and not ds["projection"].values[:, ~real].any()
    assert f": {held} components of {n} samples" in p.stdout, p.stdout
    said = "\n".join([str(w.message) for w in p.warnings] + [r.getMessage() for r in p.records])
    assert (f"K' has rank {rank}: {held - rank} of the run's {held} components are null"
            in said and f"ask for {rank} components" in said), said
    assert "remove_zero_eig" not in said
    assert "excess = inf" not in p.stdout, p.stdout
    if kernel == "rbf":     # the whole spectrum held: E_min = 0, no ratio to print
        assert "excess = n/a (E_min = 0" in p.stdout, p.stdout
    # the run's top eigenvalues cover its components (those beyond the rank 0): E_min from them
    p = dkha_in_process("evaluate", run)
    assert p.returncode == 0 and "E_min  = not computed" not in p.stdout, p.stdout + p.stderr


def test_a_finished_fit_run_again_or_resumed_has_nothing_to_do(digits_store, tmp_path,
                                                               monkeypatch):
    """A scheduler reruns ``dkha fit …`` and ``dkha fit … --resume`` after the fit finished
    (issue 43): each exits 0 with one line, starting no cluster and fitting nothing (the
    cluster's and the fit's entries are made to fail, and the saved run is untouched); other
    settings are refused in one line pointing at ``--overwrite``. Before, the rerun fitted
    again and the ``--resume`` exited 2."""
    from dkha.engine import cluster
    from dkha.fit import coordinator

    run = str(tmp_path / "run")
    fit = ["fit", digits_store.path, "-o", run, "--algorithm", "krylov", "--components", "3",
           "--sigma", "4", "--quiet"]
    assert dkha_in_process(*fit).returncode == 0
    saved = os.path.join(run, "components.zarr", "zarr.json")
    before = (os.stat(saved).st_mtime_ns, pathlib.Path(saved).read_bytes())

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for a finished run")

    monkeypatch.setattr(coordinator, "client_for", no_cluster)
    monkeypatch.setattr(cluster, "LocalCluster", no_cluster)
    monkeypatch.setattr(coordinator, "_on_cluster", no_cluster)
    for _ in range(3):
        for extra in ([], ["--resume"]):
            p = dkha_in_process(*fit, *extra)
            assert p.returncode == 0, p.stderr
            assert p.stdout.strip() == (f"{run} holds this run, finished: nothing to do (pass "
                                        "--overwrite to fit it again)"), p.stdout
    assert (os.stat(saved).st_mtime_ns, pathlib.Path(saved).read_bytes()) == before
    for extra in ([], ["--resume"]):
        p = dkha_in_process(*["5" if a == "3" else a for a in fit], *extra)
        assert p.returncode == 2 and "pass --overwrite to replace it" in p.stderr, p.stderr
        assert "n_components: 3 there, 5 now" in p.stderr
