"""What a user sees of the Dask cluster a ``dkha`` command starts or reaches, and of its phases:
the dashboard's address in the log, ``--performance-report FILE`` (Dask's own HTML report) on fit,
transform and run, the phase said true (connecting, not starting; a pipeline's stage), warnings
in the progress lines' format. (A worker lost: tests/test_worker_loss.py; a stop asked for:
tests/test_stop_phases.py, tests/test_pipeline.py.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.processes import PROGRESS_LINE, dkha_in_process, progress_lines, subprocess_env

pytest.importorskip("bokeh")        # the test extra holds it: the dashboard and report need it

FIT = ("--components", "3", "--sigma", "4", "--passes", "1")
#: (another port where 8787 is taken: said in parentheses)
DASHBOARD = re.compile(r"dkha (\w+): Dask dashboard: http://127\.0\.0\.1:(\d+)/status"
                       r"( \(port 8787 was taken\))?")


def _dkha(*argv: str, config: dict | None = None):
    """``dkha ARGV`` run in this process (:func:`~tests.processes.dkha_in_process`), asserted to
    succeed with no warning."""
    p = dkha_in_process(*argv, config=config)
    assert p.returncode == 0, p.stderr
    # (bokeh's own loggers do not propagate in a process of its own: the command prints none
    # of their lines; in this one pytest's logging set-up lets them through); warnings a plain
    # interpreter hides (ResourceWarning: a socket closed by the collector) reach the log here
    # only through dkha_in_process's "always" filter; asyncio's note of a timeout distributed
    # raised in a comm it closed under load (no dkha line, the command succeeded)
    hidden = ("(ResourceWarning at ", "(DeprecationWarning at ", "(PendingDeprecationWarning at ",
              "Future exception was never retrieved")
    records = [r.getMessage() for r in p.records if not r.name.startswith("bokeh")
               and not any(h in r.getMessage() for h in hidden)]
    assert not p.warnings and not records, (p.warnings, records)
    return p


def _dashboards(stderr: str) -> list[str]:
    """The dashboard lines among the progress lines of ``stderr``."""
    return [m for _, m in progress_lines(stderr) if DASHBOARD.fullmatch(m)]


def _is_dask_report(path) -> str:
    """The text of ``path``, asserted to be Dask's performance report (bokeh's page of it)."""
    text = path.read_text()
    assert "<title>Dask Performance Report</title>" in text, text[:300]
    assert "Task Stream" in text
    return text


def test_a_started_cluster_says_its_dashboard(digits_store, tmp_path):
    """A fit on local worker processes names the dashboard of the cluster it starts (one line,
    a page on this host); one on the in-process cluster too; with ``--dashboard none`` it
    starts none and says nothing."""
    p = _dkha("fit", digits_store.path, "-o", str(tmp_path / "run"), *FIT, "--workers", "1")
    lines = _dashboards(p.stderr)
    assert len(lines) == 1 and lines[0].startswith("dkha fit: "), p.stderr
    said = [m for _, m in progress_lines(p.stderr)]
    assert "dkha fit: starting 1 Dask worker processes" in said, said
    cluster = {"dkha.inline-samples": 0}        # no inline run: the in-process cluster
    p = _dkha("fit", digits_store.path, "-o", str(tmp_path / "local"), *FIT, config=cluster)
    assert len(_dashboards(p.stderr)) == 1, p.stderr
    assert "dkha fit: starting the in-process Dask cluster" in p.stderr
    p = _dkha("fit", digits_store.path, "-o", str(tmp_path / "quiet"), *FIT, "--dashboard", "none",
              config=cluster)
    assert "dkha fit: starting the in-process Dask cluster" in p.stderr
    assert _dashboards(p.stderr) == [] and "dashboard" not in p.stderr, p.stderr


def test_performance_report_of_fit_transform_and_run(digits_store, tmp_path):
    """``--performance-report FILE`` writes Dask's report of the command's work, on a cluster
    of its own (with the dashboard's address said) even where the fit would run inline."""
    run, out = tmp_path / "run", tmp_path / "proj.zarr"
    p = _dkha("fit", digits_store.path, "-o", str(run), *FIT, "--performance-report",
              str(tmp_path / "fit.html"))
    assert len(_dashboards(p.stderr)) == 1, p.stderr
    assert f"dkha fit: Dask performance report: {tmp_path / 'fit.html'}" in p.stderr
    text = _is_dask_report(tmp_path / "fit.html")
    assert "product" in text or "mk" in text     # dkha's own tasks in its task stream

    _dkha("transform", str(run), digits_store.path, "-o", str(out), "--performance-report",
          str(tmp_path / "transform.html"))
    _is_dask_report(tmp_path / "transform.html")

    (tmp_path / "p.toml").write_text(PIPELINE)
    _dkha("run", str(tmp_path / "p.toml"), "--runs-dir", str(tmp_path / "runs"),
          "--performance-report", str(tmp_path / "run.html"))
    _is_dask_report(tmp_path / "run.html")


PIPELINE = """
[pipeline]
name = "tiny"

[data]
kind = "digits"
per_class = 20

[[fit]]
name = "smd"
algorithm = "kha-smd"
components = 3
sigma = 4.0
passes = 1

[report]
enabled = false
"""


def test_a_reached_scheduler_is_connected_to_not_started(digits_store, tmp_path,
                                                        in_process_cluster):
    """With ``--scheduler`` the fit says it connects (never that it starts workers, nor a
    dashboard its scheduler does not serve: started with none, its /status page is a 404)."""
    address = in_process_cluster.scheduler_address
    p = _dkha("fit", digits_store.path, "-o", str(tmp_path / "run"), *FIT, "--scheduler",
              address)
    said = [m for _, m in progress_lines(p.stderr)]
    assert f"dkha fit: connecting to the Dask scheduler at {address}" in said, said
    assert not [m for m in said if "starting" in m], said
    assert _dashboards(p.stderr) == [], said


#: a dkha command whose work raises a warning (``dkha evaluate``'s entry replaced), in a process
#: of its own (the console's format is set up as the command starts, on a root logger without
#: handlers: not inside pytest)
WARNS = """
import importlib, sys, warnings
from dkha.cli import main as entry      # (before the submodule dkha.cli.main takes the name)
cli = importlib.import_module("dkha.cli.main")

def warns(args):
    warnings.warn("something odd", UserWarning, stacklevel=1)
    return 0

cli.COMMANDS["evaluate"] = warns
sys.exit(entry(["evaluate", "nowhere"]))
"""


def test_a_warning_is_a_line_in_the_progress_format():
    """A warning raised during a command is one line in the progress lines' format, saying it is
    a warning, with its class and where it was raised (another library's)."""
    p = subprocess.run([sys.executable, "-c", WARNS], env=subprocess_env(), capture_output=True,
                       text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "something odd" in ln]
    assert len(lines) == 1, p.stderr
    assert PROGRESS_LINE.fullmatch(lines[0]), lines
    assert re.search(r" dkha evaluate: warning: something odd \(UserWarning at <string>:\d+\)$",
                     lines[0]), lines


def test_each_pipeline_stage_is_what_the_heartbeat_names(tmp_path, monkeypatch):
    """Each stage of a pipeline, as it begins, becomes what the heartbeat's lines name
    (``working, N s since: stage KEY``), not the last phase of the stage before (a denoise
    stage said "since: component pictures" of the fit before it)."""
    from dkha import progress
    from dkha.pipeline import runner

    marked = []
    monkeypatch.setattr(runner, "mark", lambda desc: (marked.append(desc), progress.mark(desc)))
    (tmp_path / "p.toml").write_text(PIPELINE.replace("enabled = false", "enabled = true"))
    code, summary = runner.run_file(str(tmp_path / "p.toml"), run_id="r",
                                    runs_dir=str(tmp_path / "runs"))
    assert code == 0, summary
    assert "stage fit:smd" in marked
    assert marked == [f"stage {k}" for k in summary["stages"]] + ["stage report"], marked
    progress.phase("component pictures")
    progress.mark("stage denoise:d")
    assert progress._last_event[0] == "stage denoise:d"


def test_the_stage_names_the_scheduler_file_client_for_connects_to(monkeypatch):
    """--scheduler-file with DASK_SCHEDULER_ADDRESS also set: client_for connects to the file's
    scheduler, so the progress line names the file, not the environment's address."""
    from dkha.engine.cluster import Where, cluster_stage

    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:1")
    assert cluster_stage(Where(scheduler_file="s.json")) == \
        "connecting to the Dask scheduler of s.json"
    assert cluster_stage(Where()) == "connecting to the Dask scheduler at tcp://127.0.0.1:1"
