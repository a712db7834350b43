"""What a user sees of the Dask cluster a ``dkha`` command starts: the dashboard's address in the
log, and ``--performance-report FILE`` (Dask's own HTML report) on fit, transform and run."""

from __future__ import annotations

import re

import pytest

from tests.processes import dkha_in_process, progress_lines

pytest.importorskip("bokeh")        # the test extra holds it: the dashboard and report need it

FIT = ("--components", "3", "--sigma", "4", "--passes", "1")
DASHBOARD = re.compile(r"dkha (\w+): Dask dashboard: http://127\.0\.0\.1:(\d+)/status")


def _dkha(*argv: str, config: dict | None = None):
    """``dkha ARGV`` run in this process (:func:`~tests.processes.dkha_in_process`), asserted to
    succeed with no warning."""
    p = dkha_in_process(*argv, config=config)
    assert p.returncode == 0, p.stderr
    # (bokeh's own loggers do not propagate in a process of its own: the command prints none
    # of their lines; in this one pytest's logging set-up lets them through)
    records = [r.getMessage() for r in p.records if not r.name.startswith("bokeh")]
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
