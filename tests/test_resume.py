"""Exact resume: a fit killed at any point and resumed equals the uninterrupted run bit for bit.

Every fit compared bit for bit runs as a ``dkha fit`` process: the uninterrupted references,
the fits that SIGKILL and SIGTERM stop (the exit code under a signal is the process's) and
their resumes. The refusals run the command in this process
(:func:`tests.processes.dkha_in_process`), on a run directory that an in-process fit dying right
after its first checkpoint (:func:`killed_after`) leaves."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import xarray as xr

import dkha.errors
from dkha.data.ingest import ingest_array
from tests.processes import dkha_in_process, subprocess_env

FIT = ["--algorithm", "kha-smd", "--components", "5", "--sigma", "4", "--passes", "8",
       "--seed", "2", "--evaluate-every", "2", "--checkpoint-every", "1", "--block", "32",
       "--quiet"]
# an online algorithm: checkpoints every 300 steps, i.e. mid-pass and between evaluations
ONLINE_FIT = ["--algorithm", "on-kha", "--components", "4", "--sigma", "4", "--nu", "0.05",
              "--passes", "8", "--seed", "3", "--evaluate-every", "2", "--checkpoint-steps",
              "300", "--block", "32", "--quiet"]
# for SIGTERM: 150 blocks a pass and no evaluation until the end, so a stop lands mid-pass
# unless it lands in a pass's last block (then the checkpoint is at the pass end: tried again)
TERM_FIT = ["--algorithm", "kha-smd", "--components", "5", "--sigma", "4", "--passes", "10",
            "--seed", "2", "--evaluate-every", "0", "--checkpoint-every", "1", "--block", "4",
            "--quiet"]
SETTINGS = {"kha-smd": FIT, "on-kha": ONLINE_FIT, "term": TERM_FIT}


def _cmd(*args):
    return [sys.executable, "-m", "dkha.cli", *args]


def _fit(store, run, fit, *extra):
    """``dkha fit STORE -o RUN FIT EXTRA`` in this process (the command's code, as a process
    runs it: 600 digits fit inline); what it did (:class:`tests.processes.Ran`)."""
    return dkha_in_process("fit", store, "-o", run, *fit, *extra)


def _fit_process(store, run, fit, *extra):
    """``dkha fit STORE -o RUN FIT EXTRA`` as a process of its own, to its end."""
    p = subprocess.run(_cmd("fit", store, "-o", run, *fit, *extra), env=subprocess_env(),
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr
    return p


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
def full_runs(store, tmp_path_factory):
    """``get(settings)``: the uninterrupted run's ``(alpha, dataset)``."""
    done = {}

    def get(settings):
        if settings not in done:
            run = str(tmp_path_factory.mktemp("r") / "full")
            _fit_process(store, run, SETTINGS[settings])
            done[settings] = _alpha(run)
        return done[settings]

    return get


def _checkpoint_steps(run):
    d = os.path.join(run, "checkpoints")
    return sorted(n for n in os.listdir(d) if n.startswith("step-")) if os.path.isdir(d) else []


def _newest_step(run) -> int:
    steps = _checkpoint_steps(run)
    return int(steps[-1].split("-")[1]) if steps else 0


def _start(store, run, fit, *, pipe=False, step=1, poll=0.02):
    """Start ``dkha fit`` into ``run`` as a process of its own; return the process once it has
    written a checkpoint at ``step`` or later."""
    out = subprocess.PIPE if pipe else subprocess.DEVNULL
    proc = subprocess.Popen(_cmd("fit", store, "-o", run, *fit), env=subprocess_env(),
                            stdout=out, stderr=out, text=True)
    deadline = time.time() + 300
    while _newest_step(run) < step:
        assert proc.poll() is None, "the fit ended before its checkpoint"
        assert time.time() < deadline
        time.sleep(poll)
    return proc


class Killed(Exception):
    """The in-process stand-in for SIGKILL: raised right after a checkpoint is committed."""


@contextlib.contextmanager
def killed_after(saves: int):
    """Fits in this process die (:class:`Killed`) right after their ``saves``-th checkpoint."""
    from dkha.data.checkpoint import Checkpointer

    save, n = Checkpointer.save, [0]

    def save_then_die(self, *args, **kw):
        save(self, *args, **kw)
        n[0] += 1
        if n[0] == saves:
            raise Killed

    Checkpointer.save = save_then_die
    try:
        with pytest.raises(Killed):
            yield
    finally:
        Checkpointer.save = save


def _assert_same_run(ds, ds_ref, algorithm):
    assert list(ds["step"].values) == list(ds_ref["step"].values)   # no gap, no duplicate
    assert list(ds["pass"].values) == list(ds_ref["pass"].values)
    if algorithm == "on-kha":
        for name in ("dictionary", "member_step", "ac_index", "members"):
            assert np.array_equal(ds[name].values, ds_ref[name].values), name
        assert np.array_equal(ds["explained_variance"].values,
                              ds_ref["explained_variance"].values, equal_nan=True)
    else:
        assert np.array_equal(ds["excess"].values, ds_ref["excess"].values)


@pytest.mark.parametrize("algorithm,seed", [("kha-smd", 7), ("on-kha", 8)])
def test_sigkill_at_a_random_moment_then_resume_is_bit_identical(store, full_runs, algorithm,
                                                                 seed, tmp_path):
    fit = SETTINGS[algorithm]
    alpha_ref, ds_ref = full_runs(algorithm)
    run = str(tmp_path / "killed")
    # a random moment after the checkpoint at the end of a random pass of the first 7 (the
    # 8th and the final evaluation and saving take seconds: the fit is never over by then):
    # mid-block, mid-evaluation, mid-way through writing a checkpoint or the result
    rng = np.random.default_rng(seed)
    after = int(rng.integers(1, 8))
    proc = _start(store, run, fit, step=after * 600, poll=0.005)
    time.sleep(float(rng.uniform(0.0, 0.05)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(run, "components.zarr")), "the fit had finished"
    _fit_process(store, run, ("--quiet",), "--resume")     # its settings from the checkpoint
    alpha, ds = _alpha(run)
    assert np.array_equal(alpha, alpha_ref)
    _assert_same_run(ds, ds_ref, algorithm)
    assert not os.path.exists(os.path.join(run, "checkpoints")), "spent checkpoints removed"


def test_sigterm_checkpoints_mid_pass_and_exits_75(store, full_runs, tmp_path):
    alpha_ref, ds_ref = full_runs("term")
    mid_pass = 0
    for trial in range(4):
        run = str(tmp_path / f"term{trial}")
        # at pass 1's checkpoint: 9 passes of 150 blocks are left, no evaluation before the end
        proc = _start(store, run, TERM_FIT, pipe=True, poll=0.005)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=300)
        if proc.returncode == 0:
            continue  # it had finished before the signal came: nothing to resume
        assert proc.returncode == 75, err
        assert "resume" in err and "Traceback" not in err
        last = max(int(n.split("-")[1]) for n in _checkpoint_steps(run))
        assert last > 600, "SIGTERM's checkpoint is the one taken after it, not pass 1's"
        _fit_process(store, run, TERM_FIT, "--resume")
        alpha, ds = _alpha(run)
        assert np.array_equal(alpha, alpha_ref)
        assert list(ds["step"].values) == list(ds_ref["step"].values)
        # a stop in a pass's last block checkpoints at the pass end (legitimately): try again
        if last % 600:
            mid_pass += 1
            break
    assert mid_pass, "SIGTERM's checkpoint is mid-pass, at a block boundary"


def _one_line(ran) -> str:
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    return lines[0]


def test_resume_refuses_other_settings_and_missing_runs(store, tmp_path):
    run = str(tmp_path / "other")
    with killed_after(1):
        _fit(store, run, FIT)
    changed = [a if a != "2" else "3" for a in FIT]  # another seed
    changed[changed.index("--sigma") + 1] = "5"
    ran = _fit(store, run, changed, "--resume")
    assert ran.returncode == 2
    line = _one_line(ran)
    assert "different settings" in line and "seed" in line and "sigma" in line
    # a fresh fit into it without --resume is refused too (nothing lost silently)
    ran = _fit(store, run, FIT)
    assert ran.returncode == 2 and "--resume" in _one_line(ran)
    ran = _fit(store, str(tmp_path / "nothing"), FIT, "--resume")
    assert ran.returncode == 2 and "no run directory" in _one_line(ran)


def test_corrupted_newest_checkpoint_falls_back_and_still_matches(store, full_runs, tmp_path):
    alpha_ref, _ = full_runs("kha-smd")
    run = str(tmp_path / "corrupt")
    proc = _start(store, run, FIT, step=1200)      # two checkpoints
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    newest = os.path.join(run, "checkpoints", _checkpoint_steps(run)[-1], "state.npz")
    data = bytearray(pathlib.Path(newest).read_bytes())
    data[len(data) // 3] ^= 0xFF
    pathlib.Path(newest).write_bytes(data)
    p = _fit_process(store, run, FIT, "--resume")
    assert "damaged" in p.stderr
    assert np.array_equal(_alpha(run)[0], alpha_ref)


def test_online_sigterm_exits_75_and_resume_refuses_other_settings(store, full_runs, tmp_path):
    alpha_ref, ds_ref = full_runs("on-kha")
    run = str(tmp_path / "term")
    proc = _start(store, run, ONLINE_FIT, pipe=True)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    assert "resume" in err and "Traceback" not in err
    assert not os.path.exists(os.path.join(run, "components.zarr"))
    changed = list(ONLINE_FIT)
    changed[changed.index("--nu") + 1] = "0.1"
    changed[changed.index("--block") + 1] = "64"
    ran = _fit(store, run, changed, "--resume")
    assert ran.returncode == 2, ran.stderr
    line = _one_line(ran)
    assert "different settings" in line and "nu: 0.05" in line and "block_rows: 32" in line
    _fit_process(store, run, ("--quiet",), "--resume")     # a bare resume: its own settings
    alpha, ds = _alpha(run)
    assert np.array_equal(alpha, alpha_ref)
    assert np.array_equal(ds["dictionary"].values, ds_ref["dictionary"].values)
    assert list(ds["step"].values) == list(ds_ref["step"].values)
    ran = _fit(store, str(tmp_path / "nothing"), ONLINE_FIT, "--resume")
    assert ran.returncode == 2 and "no run directory" in _one_line(ran)


def test_checkpoint_right_after_a_pass_resumes_with_that_pass_evaluated(digits_store, client,
                                                                         tmp_path, monkeypatch):
    """A checkpoint written between a pass's last block and its end-of-pass work (evaluation,
    eigenvalue refresh) — by --checkpoint-steps or SIGTERM — resumes that work first."""
    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer

    l = digits_store.n_samples
    # a start the passes improve on (the default one, 299 landmarks of 300 samples, is exact:
    # at the default gains the fit stops after pass 1, issue 42); every pass is wanted here
    kw = dict(algorithm="kha-et", sigma=4.0, passes=3, block_rows=40, evaluate_every=1,
              init="nystrom:60", client=client)
    full = KernelHebbianPCA(3, **kw).fit(digits_store, run_dir=str(tmp_path / "full"))

    class Killed(Exception):
        pass

    save = Checkpointer.save

    def save_then_die(self, step, arrays, meta):
        save(self, step, arrays, meta)
        assert step == l and meta["pass_end_pending"]
        raise Killed

    run = str(tmp_path / "run")
    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with pytest.raises(Killed):
        KernelHebbianPCA(3, **kw).fit(digits_store, run_dir=run, checkpoint_steps=l)
    monkeypatch.setattr(Checkpointer, "save", save)
    resumed = KernelHebbianPCA(3, **kw).fit(digits_store, run_dir=run, resume=True)
    assert np.array_equal(resumed.alpha_, full.alpha_)
    assert [h["pass"] for h in resumed.history_] == [h["pass"] for h in full.history_] \
        == [0, 1, 2, 3]
    assert [h["excess"] for h in resumed.history_] == [h["excess"] for h in full.history_]


def test_a_resumable_save_continues_bit_identical(digits_store, client, tmp_path):
    """``save(RUN, resumable=True)`` writes the run and its final state as its one checkpoint
    (through the fit's own writer, :func:`dkha.fit.run_dir.write_run`): a fit with more passes
    resumed from it equals the uninterrupted fit bit for bit. A fit that keeps no solver state
    (the default's exact paths) is refused in one line."""
    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer
    from dkha.errors import ParameterError

    # a start the passes improve on (the default one, 299 landmarks of 300 samples, is exact:
    # at the default gains the fit stops after pass 1, issue 42)
    kw = dict(algorithm="kha-smd", sigma=4.0, block_rows=40, evaluate_every=1,
              init="nystrom:60", client=client)
    full = KernelHebbianPCA(3, passes=3, **kw).fit(digits_store)
    run = str(tmp_path / "run")
    KernelHebbianPCA(3, passes=2, **kw).fit(digits_store).save(run, resumable=True)
    assert Checkpointer(run).steps() == [2 * digits_store.n_samples]
    resumed = KernelHebbianPCA(3, passes=3, **kw).fit(digits_store, run_dir=run, resume=True)
    assert np.array_equal(resumed.alpha_, full.alpha_)
    assert [h["excess"] for h in resumed.history_] == [h["excess"] for h in full.history_]
    assert Checkpointer(run).steps() == []          # spent once the run is written
    exact = KernelHebbianPCA(3, sigma=4.0).fit(digits_store)
    with pytest.raises(ParameterError, match=r"resumable=True\) needs a fit of the KHA"):
        exact.save(str(tmp_path / "exact"), resumable=True)


# the default fit's Krylov path on the in-process cluster (3 000 samples: above
# dkha.inline-samples), its products cut into 210 tiles so that each lasts a while
KRYLOV_ENV = {"DASK_DKHA__DENSE_BYTES": "1e6", "DASK_DKHA__TILE_ROWS": "150"}


def _wait_for_step(proc, run, step):
    """Wait until ``run`` holds a checkpoint at ``step`` or later (or ``proc`` ended)."""
    deadline = time.time() + 300
    while proc.poll() is None:
        steps = [int(n.split("-")[1]) for n in _checkpoint_steps(run)]
        if steps and max(steps) >= step:
            return
        assert time.time() < deadline, "no checkpoint"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def krylov_store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("k") / "x.zarr")
    ingest_array(np.random.default_rng(4).normal(size=(3000, 16)), path, chunk_rows=500)
    return path


def test_default_krylov_fit_stopped_by_each_signal_resumes_bit_identical(krylov_store,
                                                                         tmp_path):
    """SIGINT, SIGTERM and SIGKILL, each mid-product of the default fit's Krylov solve on a
    real (in-process) cluster, each followed by a bare ``--resume``: the result is the
    uninterrupted run's, bit for bit. Checkpoints (asked for here at every product) leave the
    exact solver in place: before, ``--checkpoint-every`` made the default fit KHA-SMD."""
    import re

    import dask

    from dkha import KernelHebbianPCA
    from dkha.cli.fit import cmd_fit
    from dkha.cli.parser import build_parser
    from dkha.errors import ParameterError
    from tests.processes import other_lines

    store = krylov_store
    env = subprocess_env(**KRYLOV_ENV)
    with dask.config.set({"dkha.dense-bytes": 1e6, "dkha.tile-rows": 150}):
        ref = KernelHebbianPCA(8).fit(store)      # the uninterrupted run, in this process
    assert ref.attrs_["path"] == "krylov" and ref.history_[-1]["pass"] >= 4
    run = str(tmp_path / "run")
    args = [store, "-o", run]
    proc = subprocess.Popen(_cmd("fit", *args, "--components", "8", "--checkpoint-every", "1",
                                 "--quiet"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    done = 0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        _wait_for_step(proc, run, done + 1)     # a product ended: the signal lands in the next
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
            done = max(int(n.split("-")[1]) for n in _checkpoint_steps(run))
        else:
            assert proc.returncode == 75, err
            stop = re.search(r"stopped during a K' V product pass after (\d+) Krylov products; "
                             r"checkpoint written: continue with `dkha fit \.\.\. --resume`$",
                             err.strip().splitlines()[-1])
            assert stop, err
            assert len(other_lines(err)) == 2, err      # the signal's line, the stop's line
            done = int(stop.group(1))
            assert f"step-{done:012d}" in _checkpoint_steps(run)
        if sig == signal.SIGINT:    # an option given that disagrees with the run is refused
            with pytest.raises(ParameterError, match="n_components: 8 in the checkpoint, 5 now"):
                cmd_fit(build_parser().parse_args(["fit", *args, "--resume", "-r", "5"]))
        if sig != signal.SIGKILL:
            proc = subprocess.Popen(_cmd("fit", *args, "--resume"), env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with dask.config.set({"dkha.dense-bytes": 1e6, "dkha.tile-rows": 150}):     # to the end
        assert cmd_fit(build_parser().parse_args(["fit", *args, "--resume", "--quiet"])) == 0
    alpha, ds = _alpha(run)
    assert ds.attrs["path"] == "krylov" and ds.attrs["algorithm"] == "auto"
    assert np.array_equal(alpha, ref.alpha_)
    assert np.array_equal(ds["eigenvalue"].values, ref.eigenvalues_)
    assert [int(p) for p in ds["pass"].values] == [h["pass"] for h in ref.history_]
    assert not os.path.exists(os.path.join(run, "checkpoints")), "spent checkpoints removed"


def test_default_dense_fit_stopped_then_resumed_is_bit_identical(digits_store, tmp_path,
                                                                 monkeypatch):
    """The default's dense path stops within a Lanczos product (before, it ran to its end) and
    resumes from the settings it wrote before any work (it keeps no partial state: the
    resume starts it again, to the same bits); the resume keeps the dense path."""
    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer
    from dkha.engine.stop import STOP
    from dkha.errors import Interrupted
    from dkha.fit import dense

    full = KernelHebbianPCA(5, sigma=4.0).fit(digits_store)
    assert full.attrs_["path"] == "dense"
    check_stop = dense.check_stop

    def stop_in_lanczos(what):      # the signal, while Lanczos runs
        if "Lanczos" in what:
            STOP.set()
        check_stop(what)

    monkeypatch.setattr(dense, "check_stop", stop_in_lanczos)
    run = str(tmp_path / "run")
    try:
        with pytest.raises(Interrupted, match=r"Lanczos.*continue with `dkha fit \.\.\. --resume`"):
            KernelHebbianPCA(5, sigma=4.0).fit(digits_store, run_dir=run)
    finally:
        STOP.clear()
    monkeypatch.setattr(dense, "check_stop", check_stop)
    ck = Checkpointer(run).latest()
    assert ck.step == 0 and ck.meta["plan"]["path"] == "dense" and not ck.arrays
    resumed = KernelHebbianPCA(5, sigma=4.0).fit(digits_store, run_dir=run, resume=True)
    assert resumed.attrs_["path"] == "dense"
    assert np.array_equal(resumed.alpha_, full.alpha_)
    assert not os.path.exists(os.path.join(run, "checkpoints"))


def test_ctrl_c_to_the_process_group_stops_a_fit_on_worker_processes_cleanly(krylov_store,
                                                                             tmp_path):
    """A terminal's Ctrl-C reaches every process of its group: the worker processes dkha starts
    (``--workers``) ignore it and leave the stop to the coordinator, which checkpoints and exits
    with 75. Before, the workers died of it and the product's next scatter raised
    "TimeoutError: No valid workers found" (exit 1, a traceback)."""
    from tests.processes import other_lines

    for trial in range(3):
        run = str(tmp_path / f"run{trial}")
        proc = subprocess.Popen(_cmd("fit", krylov_store, "-o", run, "--components", "8",
                                     "--workers", "2", "--quiet"),
                                env=subprocess_env(**KRYLOV_ENV), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        _wait_for_step(proc, run, 1)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        if proc.returncode == 0 and "Traceback" not in err:
            continue        # its last product had ended before the signal: nothing to stop
        assert proc.returncode == 75, err
        assert "Krylov products; checkpoint written" in err and len(other_lines(err)) == 2, err
        break
    else:
        pytest.fail("every fit had ended before its Ctrl-C")


def test_a_default_fit_that_fails_for_good_leaves_no_checkpoint(digits_store, tmp_path,
                                                                 monkeypatch):
    """The exact paths write their settings before any work (so that a stop resumes); a fit
    that then fails for good (not a stop) takes them away: its run directory holds nothing to
    resume, and a fit into it again is not refused as an unfinished run."""
    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer
    from dkha.fit import coordinator

    def broken(*args, **kwargs):
        raise ValueError("There are significant negative eigenvalues")

    monkeypatch.setattr(coordinator, "dense_fit", broken)
    run = str(tmp_path / "run")
    with pytest.raises(ValueError, match="negative eigenvalues"):
        KernelHebbianPCA(3, sigma=4.0).fit(digits_store, run_dir=run)
    assert Checkpointer(run).steps() == []
    monkeypatch.undo()
    assert KernelHebbianPCA(3, sigma=4.0).fit(digits_store, run_dir=run).attrs_["path"] == "dense"


def test_a_resume_on_other_workers_and_memory_ends_bit_identical(krylov_store, tmp_path):
    """The layout (tile grid, column groups, one BLAS thread) is the run's, not the cluster's
    (issue 43): a default fit on 1 worker process of the machine's cores, stopped after its
    first Krylov product, resumed on 2 worker processes of one thread and 2 GiB each, ends
    with the bits of the uninterrupted fit in this process (the suite's in-process cluster, 2
    threads), whose tile grid is not given (no ``dkha.tile-rows``: the layout's rule). Before,
    the grid followed the threads and the coordinator's BLAS its cores."""
    import dask
    from distributed import Client, LocalCluster

    from dkha import KernelHebbianPCA
    from dkha.cli.fit import cmd_fit
    from dkha.cli.parser import build_parser
    from dkha.data.checkpoint import Checkpointer

    dense = {"dkha.dense-bytes": 1e6}
    with dask.config.set(dense):
        ref = KernelHebbianPCA(8).fit(krylov_store)
    assert ref.attrs_["path"] == "krylov" and ref.history_[-1]["pass"] >= 3
    run = str(tmp_path / "run")
    args = [krylov_store, "-o", run]
    proc = subprocess.Popen(_cmd("fit", *args, "--components", "8", "--checkpoint-every", "1",
                                 "--workers", "1", "--quiet"),
                            env=subprocess_env(DASK_DKHA__DENSE_BYTES="1e6"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(proc, run, 1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    layout = Checkpointer(run).newest_meta()["layout"]
    assert layout["blas_threads"] == 1 and layout["bands"] > 1
    with dask.config.set(dense), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="2GiB",
                         dashboard_address=None) as cluster, Client(cluster) as c:
        assert cmd_fit(build_parser().parse_args(
            ["fit", *args, "--resume", "--quiet", "--scheduler", cluster.scheduler_address])) == 0
        assert len(c.scheduler_info()["workers"]) == 2
    alpha, ds = _alpha(run)
    assert np.array_equal(alpha, ref.alpha_)
    assert np.array_equal(ds["eigenvalue"].values, ref.eigenvalues_)


def _kha_store(tmp_path) -> str:
    store = str(tmp_path / "x.zarr")      # 10 chunks: 1, 2, 4 or 5 column groups
    ingest_array(np.random.default_rng(4).normal(size=(1000, 8)), store, chunk_rows=100)
    return store


def test_a_kha_fit_with_worker_projections_has_the_same_bits_on_any_cluster(tmp_path):
    """Worker projections add a block's pieces column group by column group, so the groups are
    the fit's arithmetic, now the layout's (:func:`dkha.engine.budget.layout_column_groups`),
    not the cluster's (issue 43): a KHA-SMD fit on 1 thread, on 2 threads in-process and on 2
    worker processes of 3 threads ends with the same bits. Before, the column groups were the
    cluster's threads (1, 2 and 6) and the fits differed in the last bits."""
    from distributed import Client, LocalCluster

    from dkha import KernelHebbianPCA

    store = _kha_store(tmp_path)
    alphas = []
    for workers, threads, processes in ((1, 1, False), (1, 2, False), (2, 3, True)):
        with LocalCluster(n_workers=workers, threads_per_worker=threads, processes=processes,
                          dashboard_address=None) as cluster, Client(cluster) as c:
            alphas.append(KernelHebbianPCA(4, algorithm="kha-smd", passes=2, sigma=3.0,
                                           block_rows=50, init="random", projections="workers",
                                           client=c).fit(store).alpha_)
    assert np.array_equal(alphas[1], alphas[0]) and np.array_equal(alphas[2], alphas[0])


def test_a_float32_kha_resume_on_other_threads_ends_bit_identical(tmp_path, monkeypatch):
    """float32 tiles shift by their column block's mean, so the row blocks' column groups are
    the fit's arithmetic, now the layout's (issue 43). A float32 KHA-SMD fit on an in-process
    cluster of 2 threads, killed after its first pass's checkpoint, resumed on 2 worker
    processes of 3 threads and 2 GiB each, ends with the bits of the uninterrupted fit on 1
    thread. Before, the row blocks were grouped by the cluster's threads ÷ prefetch (1, 1 and
    2 groups): the resume differed in the last bits."""
    from distributed import Client, LocalCluster

    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer

    store = _kha_store(tmp_path)
    params = dict(n_components=4, algorithm="kha-smd", passes=2, sigma=3.0, block_rows=50,
                  init="random", projections="coordinator", precision="float32")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        ref = KernelHebbianPCA(**params, client=c).fit(store)
    run = str(tmp_path / "run")
    save = Checkpointer.save

    def save_then_die(self, step, arrays, meta):    # killed as the first pass's checkpoint ends
        path = save(self, step, arrays, meta)
        if step > 0:
            raise Killed
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as c, \
            pytest.raises(Killed):
        KernelHebbianPCA(**params, client=c).fit(store, run_dir=run, checkpoint_every=1)
    monkeypatch.setattr(Checkpointer, "save", save)
    assert Checkpointer(run).steps()[0] == 1000     # the first pass's end
    with LocalCluster(n_workers=2, threads_per_worker=3, processes=True, memory_limit="2GiB",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        KernelHebbianPCA(**params, client=c).fit(store, run_dir=run, resume=True,
                                                 checkpoint_every=1)
    alpha, _ = _alpha(run)
    assert np.array_equal(alpha, ref.alpha_)


def test_a_kha_fit_with_worker_projections_stopped_mid_pass_resumes_bit_identical(tmp_path):
    """Worker projections of a block are computed ahead, on the version of ``S̃`` of their
    submission, and brought up to date by the coordinator's messages; ``C̃`` lives on the
    replicas during a pass. A KHA-SMD fit on 2 worker processes (no evaluation between passes:
    the second pass starts from the replicas' ``C̃``), killed at its checkpoint inside its first
    pass, and again at its first pass's end, resumed on the same cluster and on 3 workers of
    2 GiB, ends with the bits of the uninterrupted fit. Before, a resume projected the blocks
    that were in flight on the checkpoint's ``S̃`` and recomputed ``C̃ = S̃_A K'``: the fits
    differed by about 1e-15."""
    import shutil

    from distributed import Client, LocalCluster

    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer

    store = str(tmp_path / "x.zarr")      # 10 chunks, 10 blocks a pass, 4 of them in flight
    ingest_array(np.random.default_rng(4).normal(size=(400, 8)), store, chunk_rows=40)
    params = dict(n_components=4, algorithm="kha-smd", passes=2, sigma=3.0, block_rows=40,
                  init="random", projections="workers", evaluate_every=0)
    runs = {step: str(tmp_path / f"run{step}") for step in (120, 400)}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        ref = KernelHebbianPCA(**params, client=c).fit(store)
        for step, run in runs.items():     # inside the first pass; at its end
            with killed_after(1):
                KernelHebbianPCA(**params, client=c).fit(store, run_dir=run,
                                                         checkpoint_steps=step)
            assert Checkpointer(run).steps() == [step]
            shutil.copytree(run, run + "-other")
            KernelHebbianPCA(**params, client=c).fit(store, run_dir=run, resume=True)
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, memory_limit="2GiB",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        for run in runs.values():
            KernelHebbianPCA(**params, client=c).fit(store, run_dir=run + "-other", resume=True)
    for run in runs.values():
        for where in (run, run + "-other"):
            alpha, _ = _alpha(where)
            assert np.array_equal(alpha, ref.alpha_), (where, np.abs(alpha - ref.alpha_).max())


def test_a_worker_projection_resume_keeps_the_recorded_prefetch(tmp_path):
    """The blocks a fit computes ahead decide the ``S̃`` each block is projected on, so the
    prefetch is recorded in the layout: a KHA-SMD fit with worker projections, planned 1 ahead
    (a stream budget of 3 blocks, as small workers at a large ``l`` give), killed inside its
    first pass and resumed where the plan would give 4 ahead (the default budget), ends with
    the uninterrupted fit's bits. Before, the resume planned 4 ahead and differed in the last
    bits."""
    import dask
    from distributed import Client, LocalCluster

    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer

    store = str(tmp_path / "x.zarr")
    ingest_array(np.random.default_rng(5).normal(size=(400, 8)), store, chunk_rows=40)
    params = dict(n_components=4, algorithm="kha-smd", passes=2, sigma=3.0, block_rows=40,
                  init="random", projections="workers", evaluate_every=0)
    run = str(tmp_path / "run")
    small = {"dkha.memory-budget": 3 * 8 * 40 * 400}       # (1 + 2) blocks of 40 × 400
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        with dask.config.set(small):
            ref = KernelHebbianPCA(**params, client=c).fit(store)
            assert ref.timings_["memory"]["prefetch"] == 1
            with killed_after(1):
                KernelHebbianPCA(**params, client=c).fit(store, run_dir=run,
                                                         checkpoint_steps=120)
        assert Checkpointer(run).newest_meta()["layout"]["prefetch"] == 1
        resumed = KernelHebbianPCA(**params, client=c).fit(store, run_dir=run, resume=True)
    assert resumed.timings_["memory"]["prefetch"] == 1
    alpha, _ = _alpha(run)
    assert np.array_equal(alpha, ref.alpha_), np.abs(alpha - ref.alpha_).max()


def test_a_kha_fit_beyond_the_rank_resumes_bit_identical(tmp_path):
    """A KHA-SMD fit asked for more components than ``K'`` has rank (40 of 30 samples on two
    circles: the Nyström start finds rank 25) fits those its start found; killed after its
    first pass's checkpoint and resumed, it ends with the uninterrupted fit's bits and holds
    ``l − 1`` components, the null ones 0. Before, the resume built its solver for the 29
    asked and failed on the checkpoint's 25 ("could not broadcast … (25,) into (29,)")."""
    from sklearn.datasets import make_circles

    from dkha import KernelHebbianPCA
    from dkha.data.checkpoint import Checkpointer

    X = make_circles(n_samples=300, factor=0.3, noise=0.05, random_state=0)[0][:30]
    store = str(tmp_path / "c.zarr")
    ingest_array(X, store)
    params = dict(n_components=40, algorithm="kha-smd", passes=3, kernel="rbf", eta0=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dkha.errors.NullComponentWarning)
        ref = KernelHebbianPCA(**params).fit(store)
        run = str(tmp_path / "run")
        with killed_after(1):       # right after the first pass's checkpoint
            KernelHebbianPCA(**params).fit(store, run_dir=run, checkpoint_every=1)
        assert Checkpointer(run).steps()[0] == 30
        KernelHebbianPCA(**params).fit(store, run_dir=run, resume=True, checkpoint_every=1)
    alpha, ds = _alpha(run)
    assert ds.sizes["component"] == 29 and ref.null_components_ == 4
    assert np.array_equal(alpha, ref.alpha_[:29])
    assert not alpha[25:].any() and np.all(ds["eigenvalue"].values[25:] == 0)
