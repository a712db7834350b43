"""Progress from the first second: what a fit shows outside a terminal (log lines), the krylov
summary's wording and the excess printed clipped at 0 with its precision."""

from __future__ import annotations

import logging
import re

import dask.config
import numpy as np

from dkha import KernelHebbianPCA, progress
from dkha.cli.main import main
from dkha.cli.output import excess_precision, excess_text
from tests.processes import progress_lines


def test_progress_logs_start_periodic_and_end_lines_outside_a_terminal(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="dkha.progress")
    now = [0.0]
    monkeypatch.setattr(progress, "_clock", lambda: now[0])
    bar = progress.Progress(True, 10, "centering (MK row)", unit="tile")
    for seconds in (4.0, 11.0, 12.0):      # a line once 10 s passed since the last one
        now[0] = seconds
        bar.update(2)
    now[0] = 30.0
    bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["centering (MK row): 0/10 tiles so far in 0 s",
                     "centering (MK row): 4/10 tiles so far in 11 s",
                     "centering (MK row): 6/10 tiles in 30 s"]
    caplog.clear()
    with progress.Progress(False, 3, "hidden") as quiet:
        quiet.update(3)
    with progress.Progress(True, 3, "a short pass", transient=True) as short:
        short.update(3)
    assert caplog.records == []


def test_a_verbose_fit_shows_each_phase(digits_store, client, caplog):
    caplog.set_level(logging.INFO, logger="dkha.progress")
    with dask.config.set({"dkha.mk-cache": False}):     # the MK row computed, not read back
        KernelHebbianPCA(3, algorithm="kha-et", sigma=4.0, passes=1, client=client,
                         verbose=True).fit(digits_store)
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("centering (MK row): 0/") for m in lines)
    assert any(m.startswith("kha-et: 0/300 steps") for m in lines)
    assert any(m.startswith("kha-et: 300/300 steps in") for m in lines)


def test_excess_is_printed_clipped_at_zero_with_its_precision():
    assert excess_text(-2.3e-9, 1e-14) == "0 (below its precision, ±2.3e-09)"
    assert excess_text(1.5e-3, 2e-12) == "1.500e-03 (±2.0e-12)"
    # ε √l ‖K'‖²_F / E_min², with ‖K'‖²_F = E_min² + Σλ²
    p = excess_precision(2.0, [3.0, 1.0], 400)
    assert np.isclose(p, np.finfo(float).eps * 20 * (4 + 10) / 4)


def test_krylov_summary_counts_its_products(digits_store, client, capsys, tmp_path):
    assert main(["fit", digits_store.path, "-o", str(tmp_path / "k"), "--algorithm", "krylov",
                 "--components", "3", "--sigma", "4", "--quiet",
                 "--scheduler", client.scheduler.address]) == 0
    out = capsys.readouterr().out
    products = re.search(r"after (\d+) Krylov products: .* excess = (\S+)", out)
    assert products and int(products.group(1)) > 1, out
    assert not products.group(2).startswith("-"), out
    # dkha evaluate says the excess the way dkha fit does (never a negative round-off)
    assert main(["evaluate", str(tmp_path / "k"), "--scheduler", client.scheduler.address]) == 0
    out = capsys.readouterr().out
    excess = re.search(r"^excess = (.*)$", out, re.MULTILINE).group(1)
    assert re.fullmatch(r"0 \(below its precision, ±\S+\)|\d\.\d{3}e-\d\d \(±\S+\)", excess), out
    # dkha evaluate --exact and dkha cluster say what they do while they run (standard error,
    # outside a terminal: progress lines)
    from dkha.cli import progress_shown
    from dkha.cli.main import run
    from dkha.cli.parser import build_parser

    def dkha(argv):         # the command as `dkha` runs it: its progress shown
        args = build_parser().parse_args(argv)
        with progress_shown(args):
            return run(args)

    assert dkha(["evaluate", str(tmp_path / "k"), "--exact", "--json",
                 "--scheduler", client.scheduler.address]) == 0
    err = [ln for _, ln in progress_lines(capsys.readouterr().err)]
    assert "dkha evaluate: evaluation: E(A), E_min and the excess error (eq. 22)" in err, err
    assert dkha(["cluster", str(tmp_path / "k"), "--k", "3", "-o", str(tmp_path / "c.zarr"),
                 "--scheduler", client.scheduler.address]) == 0
    err = [ln for _, ln in progress_lines(capsys.readouterr().err)]
    assert "dkha cluster: k-means: 3 clusters of 300 samples, 10 starts" in err, err


def test_bars_count_whole_units_with_their_names(monkeypatch, capsys):
    """In a terminal: ``3 products``, not tqdm's ``3.00product``; ``patches`` as the plural."""
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    with progress.Progress(True, None, "Krylov", unit="product") as bar:
        bar.update(3)
    with progress.Progress(True, 40, "denoise", unit="patch") as bar:
        bar.update(40)
    err = capsys.readouterr().err
    assert "Krylov: 3 products [" in err and "40/40" in err, err
    assert not re.search(r"\d\.\d\d(product|patch|stage)(?!/s)", err), err
    assert progress.plural("patch") == "patches" and progress.plural("tile") == "tiles"
