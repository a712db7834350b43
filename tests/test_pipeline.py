"""Pipelines: validation, idempotent re-runs, the lock, resume after a kill, the report."""

from __future__ import annotations

import html.parser
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from dkha.errors import ParameterError
from dkha.pipeline.runner import PipelineError, load, run_directory, run_lock, safe_id
from tests.processes import dkha_in_process, other_lines, progress_lines, subprocess_env

TINY = """
[pipeline]
name = "tiny"

[data]
kind = "digits"
per_class = 25

[[fit]]
name = "smd"
algorithm = "kha-smd"
components = 5
sigma = 4.0
# a start the passes improve on: the default (249 landmarks of 250 samples) is exact, and from
# it the default gains stop at once (issue 42); the resume tests want every pass
init = "nystrom:20"
passes = {passes}
evaluate_every = 2
checkpoint_every = 1
block_rows = 25

[[fit]]
name = "et"
algorithm = "kha-et"
components = 5
sigma = 4.0
passes = 2

[[apply]]
kind = "cluster"
fit = "smd"
k = 10

[report]
title = "tiny"
"""


def _env():
    return subprocess_env()


def _run_here(args, cwd, monkeypatch):
    """``dkha run ARGS`` in this process, in the directory ``cwd``."""
    monkeypatch.chdir(cwd)
    return dkha_in_process("run", *args)


def _run(args, cwd, check=False, **kw):
    return subprocess.run([sys.executable, "-m", "dkha.cli", "run", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600, check=check, **kw)


def test_unknown_keys_and_sections_are_refused(tmp_path, monkeypatch):
    f = tmp_path / "bad.toml"
    f.write_text(TINY.format(passes=2).replace("components = 5\nsigma = 4.0\npasses = 2",
                                               "components = 5\nsigma = 4.0\npases = 2"))
    with pytest.raises(PipelineError, match="unknown key pases"):
        load(str(f))
    f.write_text(TINY.format(passes=2) + "\n[extra]\nx = 1\n")
    with pytest.raises(PipelineError, match="unknown section extra"):
        load(str(f))
    f.write_text("[data\nkind=")
    with pytest.raises(PipelineError, match="not valid TOML"):
        load(str(f))
    p = _run_here([str(f)], tmp_path, monkeypatch)
    assert p.returncode == 2 and other_lines(p.stderr)[0].startswith("dkha: error:")
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("bad", ["..", "../x", "/abs", "a/b", "", ".hidden", "x" * 101])
def test_unsafe_run_ids_are_refused(bad):
    with pytest.raises(ParameterError, match="unsafe run id"):
        safe_id(bad)


def test_symlink_escape_is_refused(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "evil").symlink_to(tmp_path)
    with pytest.raises(ParameterError, match="outside"):
        run_directory(str(runs), "evil")


def test_run_twice_does_the_work_once_and_writes_a_report(tmp_path, monkeypatch):
    (tmp_path / "p.toml").write_text(TINY.format(passes=3))
    first = _run_here(["p.toml", "--json"], tmp_path, monkeypatch)
    assert first.returncode == 0, first.stderr
    # the stages show as they start and end, without -v
    stages = [ln for _, ln in progress_lines(first.stderr) if ln.startswith("dkha run: stage ")]
    assert stages[:2] == ["dkha run: stage data: running",
                          stages[1]] and stages[1].startswith("dkha run: stage data: done in")
    assert "dkha run: stage fit:smd: running" in stages and stages[-1].startswith(
        "dkha run: stage report: writing")
    summary = json.loads(first.stdout)
    run_dir = summary["run_dir"]
    assert summary["exit_code"] == 0
    assert set(summary["stages"]) == {"data", "fit:smd", "fit:et", "evaluate:smd", "evaluate:et",
                                      "apply:0:cluster"}
    # the figures are the fits' own histories, and the clustering scored against the labels
    ds = xr.open_zarr(os.path.join(run_dir, "fits", "smd", "components.zarr"))
    assert summary["figures"]["smd"]["excess"] == pytest.approx(float(ds["excess"].values[-1]))
    # the fit's seconds: its total as timings.json adds it up (before: its passes' only)
    timings = json.loads(pathlib.Path(run_dir, "fits", "smd", "timings.json").read_text())
    state = json.loads(pathlib.Path(run_dir, "state.json").read_text())
    assert summary["figures"]["smd"]["fit_seconds"] == timings["total"] > timings["stream"]
    assert state["stages"]["fit:smd"]["result"]["fit_seconds"] == timings["total"]
    cluster = summary["figures"]["apply-0-cluster"]
    assert 0 <= cluster["vi"] < cluster["vi_random"]
    mtime = os.path.getmtime(os.path.join(run_dir, "fits", "smd", "components.zarr", "zarr.json"))
    second = _run_here(["p.toml"], tmp_path, monkeypatch)
    assert second.returncode == 0, second.stderr
    log = pathlib.Path(run_dir, "pipeline.log").read_text()
    assert log.count("stage fit:smd: running") == 1
    assert log.count("stage fit:smd: done already, skipped") == 1
    components = os.path.join(run_dir, "fits", "smd", "components.zarr", "zarr.json")
    assert os.path.getmtime(components) == mtime
    # the report: valid HTML, every image embedded and non-empty, the PNG files exist
    page = pathlib.Path(run_dir, "report.html").read_text()
    parser = _Checker()
    parser.feed(page)
    assert parser.images and all(len(src) > 1000 for src in parser.images)
    assert parser.stack == []
    for name in ("convergence.png", "components.png"):
        assert os.path.getsize(os.path.join(run_dir, "report", name)) > 1000


class _Checker(html.parser.HTMLParser):
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self):
        super().__init__()
        self.stack, self.images = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            src = dict(attrs)["src"]
            assert src.startswith("data:image/png;base64,")
            self.images.append(src)
        elif tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"unbalanced </{tag}>"
        self.stack.pop()


def test_a_second_run_of_the_same_id_is_locked_out(tmp_path):
    (tmp_path / "p.toml").write_text(TINY.format(passes=2))
    run_dir = str(tmp_path / "runs" / "tiny")
    with run_lock(run_dir):
        p = _run(["p.toml"], cwd=tmp_path)
    assert p.returncode == 73 and "another run holds" in p.stderr


def test_killed_mid_fit_then_rerun_resumes(tmp_path):
    # enough passes that the kill, half a second after the first checkpoint, falls mid-fit: a
    # pass of these 250 digits takes about 15 ms (their tasks run inline), so 12 were done by then
    (tmp_path / "p.toml").write_text(TINY.format(passes=150))
    ref = _run(["p.toml", "--run-id", "reference"], cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen([sys.executable, "-m", "dkha.cli", "run", "p.toml", "--run-id",
                             "killed"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ck = tmp_path / "runs" / "killed" / "fits" / "smd" / "checkpoints"
    deadline = time.time() + 300
    while not (ck.is_dir() and any(n.startswith("step-") for n in os.listdir(ck))):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = _run(["p.toml", "--run-id", "killed"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    log = (tmp_path / "runs" / "killed" / "pipeline.log").read_text()
    assert re.search(r"resuming at step \d+", log)
    a = xr.open_zarr(str(tmp_path / "runs" / "killed" / "fits" / "smd" / "components.zarr"))
    b = xr.open_zarr(str(tmp_path / "runs" / "reference" / "fits" / "smd" / "components.zarr"))
    assert np.array_equal(a["alpha"].values, b["alpha"].values)


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(os.path.join(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))), "pipelines")) if n.endswith(".toml")))
def test_shipped_pipelines_are_valid(name):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = load(os.path.join(root, "pipelines", name))
    assert p.fits and p.name == name[:-5]


def test_a_failing_stage_fails_the_run_and_its_summary(tmp_path, monkeypatch):
    """Not only a user's error: any exception in a stage (here a missing module, as a report
    without matplotlib once raised) makes the run exit non-zero and summary.json say where."""
    from dkha.pipeline import runner as pipeline

    def broken_fit(self, store, fit):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(pipeline.Runner, "fit", broken_fit)
    (tmp_path / "p.toml").write_text(TINY.format(passes=1))
    with pytest.raises(ModuleNotFoundError):
        pipeline.run_file(str(tmp_path / "p.toml"), runs_dir=str(tmp_path / "runs"))
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    assert summary["exit_code"] == 1
    assert summary["failed_stage"] == "fit:smd"
    assert summary["error"] == "ModuleNotFoundError: No module named 'matplotlib'"
    assert summary["stages"]["data"]["done"] is True
    assert summary["stages"]["fit:smd"]["done"] is False


def _refuse(name):
    raise ValueError(f"bare {name} in strict JSON")


def test_state_and_summary_are_strict_json_and_hold_no_unmeasured_figure(tmp_path, client):
    """A tracked fit measures no excess: state.json and summary.json (RFC 8259, no bare NaN)
    say null for it, the run holds no excess variable, and the stage is still done once."""
    import dask

    from dkha.pipeline.runner import run_file

    # nystrom:10: a start the passes improve on (the default one, 79 landmarks of 80 samples, is
    # exact, and the default gains stop at once after pass 1: issue 42), three evaluations
    (tmp_path / "p.toml").write_text(
        '[pipeline]\nname = "strict"\n[data]\nkind = "digits"\nper_class = 8\n'
        '[[fit]]\nname = "smd"\nalgorithm = "kha-smd"\ncomponents = 3\nsigma = 4.0\n'
        'init = "nystrom:10"\npasses = 2\n[report]\ntitle = "strict"\n')
    with dask.config.set({"dkha.evaluation": "tracked"}):
        code, summary = run_file(str(tmp_path / "p.toml"), runs_dir=str(tmp_path / "runs"),
                                 cluster={"client": client})
    assert code == 0, summary
    run_dir = summary["run_dir"]
    for name in ("state.json", "summary.json"):
        with open(os.path.join(run_dir, name)) as f:
            data = json.loads(f.read(), parse_constant=_refuse)
        assert "NaN" not in json.dumps(data)
    ds = xr.open_zarr(os.path.join(run_dir, "fits", "smd", "components.zarr"))
    assert "excess" not in ds and ds["change"].sizes["evaluation"] == 3
    assert summary["figures"]["smd"].get("excess") is None


def test_a_stopped_pipeline_says_to_run_it_again(tmp_path, monkeypatch, caplog):
    """A stop mid-fit (SIGTERM, Ctrl-C) ends a pipeline with 75 and says to run the pipeline
    again (its fit resumes from the checkpoint), not `dkha fit ... --resume`; the stage is
    logged as stopped, not failed (a stop asked for is no error)."""
    from dkha.data.checkpoint import Checkpointer
    from dkha.engine.stop import STOP
    from dkha.errors import Interrupted
    from dkha.pipeline.runner import run_file

    (tmp_path / "p.toml").write_text(TINY.format(passes=4))
    save = Checkpointer.save

    def save_then_stop(self, *args, **kwargs):     # the signal, just after the first checkpoint
        out = save(self, *args, **kwargs)
        STOP.set()
        return out

    monkeypatch.setattr(Checkpointer, "save", save_then_stop)
    path = str(tmp_path / "p.toml")
    caplog.set_level(logging.INFO, logger="dkha.pipeline")
    try:
        with pytest.raises(Interrupted) as stop:
            run_file(path, run_id="stopped", runs_dir=str(tmp_path / "runs"))
    finally:
        STOP.clear()
    assert "checkpoint written: continue with `dkha run " + path + " --run-id stopped`" \
        in str(stop.value)
    assert "dkha fit" not in str(stop.value)
    summary = json.loads((tmp_path / "runs" / "stopped" / "summary.json").read_text())
    assert summary["exit_code"] == 75 and "`dkha run" in summary["error"]
    assert summary["stopped"] is True
    said = [r.getMessage() for r in caplog.records if r.name.startswith("dkha.pipeline")]
    assert any(m.startswith("stage fit") and m.endswith(" stopped") for m in said), said
    assert not [m for m in said if "failed" in m], said
