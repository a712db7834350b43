"""A fit's times: the cost model's estimate said as an ETA among the first lines, the times of
timings.json (startup, centering, start state, passes, the rest) adding up to the fit's total, the
report's "wall time of fitting" and the summary's line that total, and a resumed fit's total
keeping the first attempt's seconds. (No timing is asserted beyond "present and adds up".)"""

from __future__ import annotations

import json
import math
import re
import time

from dkha.cli.output import TIMES
from dkha.data import result
from dkha.data.checkpoint import Checkpointer
from dkha.fit.coordinator import PHASES
from dkha.pipeline.report import _number, settings_rows
from tests.processes import dkha_in_process, progress_lines

KRYLOV = {"dkha.dense-bytes": 0}    # the default path's blockwise Krylov, not K' held whole


def _adds_up(t: dict) -> None:
    """The parts of ``total`` are there, none negative, and add up to it."""
    parts = [*PHASES, "stream", "other"]
    assert all(k in t and t[k] >= 0 for k in parts), t
    assert math.isclose(sum(t[k] for k in parts), t["total"], rel_tol=1e-9), t


def test_the_estimate_comes_first_and_the_times_add_up(digits_store, tmp_path):
    run = tmp_path / "run"
    t0 = time.perf_counter()
    p = dkha_in_process("fit", digits_store.path, "-o", str(run), "--components", "3",
                        "--sigma", "4", config=KRYLOV)
    command = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr
    said = [m for _, m in progress_lines(p.stderr)]
    eta = [i for i, m in enumerate(said) if re.fullmatch(
        r"dkha fit: estimate: about \S+ s for the krylov path on \d+ threads "
        r"\(ETA \d\d:\d\d:\d\d\)", m)]
    work = [i for i, m in enumerate(said) if m.startswith(("dkha fit: centering (MK row)",
                                                          "dkha fit: Krylov:"))]
    assert len(eta) == 1 and work and eta[0] < min(work), said
    t = json.loads((run / result.TIMINGS).read_text())
    _adds_up(t)
    assert t["centering"] > 0 and t["startup"] > 0 and t["attempts"] == 1
    assert t["total"] <= command                    # within the command's own seconds
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("time: ")]
    assert len(line) == 1 and line[0].startswith(f"time: {t['total']:.3g} s fitting ("), p.stdout
    assert all(f"{TIMES[k]} {t[k]:.3g} s" in line[0] for k in (*PHASES, "stream", "other"))
    rows = dict(settings_rows(result.load(str(run)), t))
    assert rows["wall time of fitting (s)"] == _number(float(t["total"]))


def test_a_resumed_fit_keeps_the_first_attempts_times(digits_store, tmp_path, monkeypatch):
    """Stopped after its first checkpoint and resumed: the total counts both attempts, the
    first's startup and centering included (before: a resume's centering was its reading of
    the checkpoint, 0.0013 s, and the first attempt's seconds were gone)."""
    from dkha.engine.stop import STOP

    run = str(tmp_path / "run")
    args = ("fit", digits_store.path, "-o", run, "--components", "3", "--sigma", "4",
            "--algorithm", "kha-smd", "--init", "random", "--passes", "3",
            "--checkpoint-every", "1")
    save = Checkpointer.save

    def save_then_stop(self, *a, **k):
        out = save(self, *a, **k)
        STOP.set()
        return out

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "save", save_then_stop)
        stopped = dkha_in_process(*args)
    assert stopped.returncode == 75, stopped.stderr
    first = Checkpointer(run).newest_meta()["times"]
    assert first["attempts"] == 1 and first["centering"] > 0 and first["startup"] > 0
    resumed = dkha_in_process(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    # an ETA among the first lines of both attempts: the passes asked, then the passes left
    # (before: none for a named algorithm)
    for p, passes in ((stopped, r"3 kha-smd passes"), (resumed, r"\S+ kha-smd passes \(resumed\)")):
        said = [m for _, m in progress_lines(p.stderr)]
        eta = [i for i, m in enumerate(said) if re.fullmatch(
            rf"dkha fit: estimate: about \S+ s for {passes} on \d+ threads "
            r"\(ETA \d\d:\d\d:\d\d\)", m)]
        work = [i for i, m in enumerate(said) if m.startswith("dkha fit: kha-smd")]
        assert len(eta) == 1 and (not work or eta[0] < min(work)), said
    t = json.loads((tmp_path / "run" / result.TIMINGS).read_text())
    _adds_up(t)
    assert t["attempts"] == 2
    assert all(t[k] >= first[k] for k in PHASES), (t, first)
    assert t["earlier"] >= sum(first[k] for k in PHASES)
    assert t["total"] >= t["earlier"] + t["startup"] - first["startup"]
    assert "over 2 attempts" in resumed.stdout


def test_a_resumed_krylov_fit_and_an_online_fit_say_an_estimate(digits_store, tmp_path,
                                                                  monkeypatch):
    """A default (Krylov) fit resumed after a product checkpoint says the estimate of the rest
    of its solve; an online fit says it has none (before: neither said anything)."""
    from dkha.engine.stop import STOP

    run = str(tmp_path / "run")
    args = ("fit", digits_store.path, "-o", run, "--components", "3", "--sigma", "4",
            "--checkpoint-every", "1")
    save = Checkpointer.save

    def save_then_stop(self, step, *a, **k):
        out = save(self, step, *a, **k)
        if step > 0:                # a Krylov product's checkpoint, not the settings' (step 0)
            STOP.set()
        return out

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "save", save_then_stop)
        stopped = dkha_in_process(*args, config=KRYLOV)
    assert stopped.returncode == 75, stopped.stderr
    done = Checkpointer(run).newest_meta()["krylov"]["products"]
    resumed = dkha_in_process(*args, "--resume", config=KRYLOV)
    assert resumed.returncode == 0, resumed.stderr
    said = [m for _, m in progress_lines(resumed.stderr)]
    assert [m for m in said if m.startswith("dkha fit: estimate")] and re.fullmatch(
        rf"dkha fit: estimate: about \S+ s for the krylov path resumed after {done} products "
        r"on \d+ threads \(ETA \d\d:\d\d:\d\d\)",
        next(m for m in said if m.startswith("dkha fit: estimate"))), said
    online = dkha_in_process("fit", digits_store.path, "-o", str(tmp_path / "online"),
                             "--algorithm", "on-kha", "--components", "3", "--sigma", "4",
                             "--passes", "1")
    assert online.returncode == 0, online.stderr
    said = [m for _, m in progress_lines(online.stderr)]
    assert [m for m in said if m.startswith("dkha fit: estimate")] == [
        ("dkha fit: estimate: none for on-kha (no cost model for the online algorithms: each "
         "step's cost follows the dictionary it grows; the progress bar gives the time left)")]
