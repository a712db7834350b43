"""Checkpoints: atomic commit under SIGKILL, damaged checkpoints skipped, exact state round trip."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
import time

import numpy as np
import pytest

from dkha.data.checkpoint import Checkpointer, differences, state_from_arrays, state_to_arrays
from dkha.errors import DkhaWarning, InputError, StoreNotFoundError


def write_checkpoints(run: str, ready) -> None:
    """The writer a SIGKILL ends: 2 MB checkpoints, one after the other, from the newest
    committed one on (``ready`` is set once it has read it)."""
    ck = Checkpointer(run, keep=2)
    latest = ck.latest()
    step = 0 if latest is None else latest.step
    rng = np.random.default_rng(step)
    ready.set()
    while True:
        step += 1
        A = np.full((64, 4096), float(step))      # 2 MB: writes take a while
        ck.save(step, {"A": A, "noise": rng.standard_normal(1000)}, {"pass": step})


def test_sigkill_during_writes_never_loses_the_committed_checkpoint(tmp_path):
    """15 writer processes killed at random moments. They are forked by one server process
    (multiprocessing's forkserver, with numpy and the checkpoint module loaded once), so a kill
    costs no interpreter start."""
    run = str(tmp_path / "run")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "dkha.data.checkpoint", "tests.test_checkpoint"])
    rng = np.random.default_rng(0)
    seen = 0
    committed_once = False
    for _ in range(15):
        ready = ctx.Event()
        proc = ctx.Process(target=write_checkpoints, args=(run, ready), daemon=True)
        proc.start()
        assert ready.wait(120), "the writer did not start"
        time.sleep(float(rng.uniform(0.02, 0.5)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        with _no_warning():
            ck = Checkpointer(run).latest()
        if ck is None:
            assert not committed_once
            continue
        committed_once = True
        assert ck.step >= seen, "the step went backwards"
        assert np.all(ck.arrays["A"] == float(ck.step))
        assert ck.meta["pass"] == ck.step
        seen = ck.step
    assert committed_once and seen > 1


class _no_warning:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", DkhaWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def test_damaged_newest_falls_back_to_the_previous(tmp_path):
    ck = Checkpointer(str(tmp_path), keep=3)
    for step in (10, 20, 30):
        ck.save(step, {"A": np.full(100, float(step))}, {"pass": step})
    newest = os.path.join(ck.dir, "step-000000000030", "state.npz")
    data = bytearray(pathlib.Path(newest).read_bytes())
    data[len(data) // 2] ^= 0x01
    pathlib.Path(newest).write_bytes(data)
    with pytest.warns(DkhaWarning, match="damaged"):
        got = ck.latest()
    assert got.step == 20 and np.all(got.arrays["A"] == 20.0)
    # a truncated meta.json is damaged too
    with open(os.path.join(ck.dir, "step-000000000020", "meta.json"), "w") as f:
        f.write("{\"step\": 2")
    with pytest.warns(DkhaWarning):
        assert ck.latest().step == 10
    # all damaged: resume refuses clearly
    os.remove(os.path.join(ck.dir, "step-000000000010", "state.npz"))
    with pytest.warns(DkhaWarning), pytest.raises(InputError, match="every checkpoint is damaged"):
        ck.require_latest()


def test_no_checkpoint_and_no_run_are_clear_errors(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no run directory"):
        Checkpointer(str(tmp_path / "nothing")).require_latest()
    os.makedirs(tmp_path / "empty")
    with pytest.raises(InputError, match="holds no checkpoint"):
        Checkpointer(str(tmp_path / "empty")).require_latest()


def test_keeps_the_newest_and_cleans_half_written(tmp_path):
    ck = Checkpointer(str(tmp_path), keep=2)
    os.makedirs(os.path.join(ck.dir, ".tmp-crashed"))
    for step in (1, 2, 3):
        ck.save(step, {"x": np.arange(3.0)}, {})
    assert sorted(os.listdir(ck.dir)) == ["step-000000000002", "step-000000000003"]


def test_differences_lists_each_changed_setting():
    d = differences({"eta0": 0.2, "seed": 0, "kernel_parameters": {"sigma": 4.0}},
                    {"eta0": 0.1, "seed": 0, "kernel_parameters": {"sigma": 4.0}},
                    ["eta0", "seed", "kernel_parameters"])
    assert d == ["eta0: 0.2 in the checkpoint, 0.1 now"]


@pytest.mark.parametrize("algorithm", ["kha-et", "kha-smd"])
def test_solver_state_round_trip_continues_bit_for_bit(algorithm):
    from dkha.solvers.batch import BatchKHA

    rng = np.random.default_rng(1)
    l, r = 120, 4
    F = rng.standard_normal((l, 10))
    F -= F.mean(0)
    K = F @ F.T / 10.0      # diagonal about 1, as a centered gaussian kernel's (a stable run)
    A = rng.standard_normal((r, l)) / np.sqrt(r * l)

    def solver():
        s = BatchKHA(algorithm, r, l, eta0=0.05, mu=0.1)
        s.start(A, C=A @ K)
        return s

    order = rng.permutation(l)
    a, b = solver(), solver()
    for s in (a, b):
        s.begin_pass()
        for j in range(0, 60, 16):
            P = order[j:j + 16]
            s.apply_block(P, K[P])
    arrays, scalars = state_to_arrays(b.state)
    b.state = state_from_arrays(type(b.state), {k: v.copy() for k, v in arrays.items()}, scalars)
    for s in (a, b):
        for j in range(60, l, 16):
            P = order[j:j + 16]
            s.apply_block(P, K[P])
        s.begin_pass()
        s.apply_block(order[:16], K[order[:16]])
    assert np.array_equal(a.A, b.A)
    if algorithm == "kha-smd":
        assert np.array_equal(a.state.rho, b.state.rho)


def _refuse(name):
    raise ValueError(f"{name} is not strict JSON")


def _strict_json_files(root) -> list[str]:
    """The JSON files under ``root`` (hidden ones too), each parsed by a strict parser (RFC 8259:
    a bare NaN or Infinity raises); their paths relative to ``root``."""
    import json

    found = []
    for d, _, names in os.walk(root):
        for name in names:
            if name.endswith(".json"):
                path = os.path.join(d, name)
                with open(path) as f:
                    json.loads(f.read(), parse_constant=_refuse)
                found.append(os.path.relpath(path, root))
    return found


def test_every_json_file_a_run_writes_is_strict(tmp_path):
    """A default fit and a checkpointed KHA fit (stopped after its second checkpoint, then
    resumed), with dkha's default evaluation (tracked, not the suite's exact one), write only
    strict JSON: the checkpoints' history keeps its NaNs (figures a tracked pass does not
    measure) as tagged objects, read back as NaN."""
    from sklearn.datasets import load_digits

    from dkha.data.ingest import ingest_array
    from tests.processes import dkha_in_process
    from tests.test_resume import FIT, killed_after

    store = str(tmp_path / "digits.zarr")
    ingest_array(load_digits().data[:600] / 8.0 - 1.0, store, chunk_rows=150)
    run = str(tmp_path / "kha")
    default = {"dkha.evaluation": "tracked"}
    with killed_after(2):
        dkha_in_process("fit", store, "-o", run, *FIT, config=default)
    found = _strict_json_files(tmp_path)
    assert sum(f.startswith("kha/checkpoints/") and f.endswith("meta.json") for f in found) == 2
    history = Checkpointer(run).latest().meta["history"]
    assert np.isnan(history[0]["excess"]) and np.isfinite(history[-1]["captured"])
    dkha_in_process("fit", store, "-o", run, *FIT, "--resume", config=default)
    dkha_in_process("fit", store, "-o", str(tmp_path / "default"), "--components", "5",
                    "--quiet", config=default)
    found = _strict_json_files(tmp_path)
    assert {"kha/timings.json", "default/timings.json"} <= set(found)
