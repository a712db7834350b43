"""Recovery instead of failure: a step guard that trips rolls the fit back to the start of its
block, halves the gain, records the event and goes on (``on_divergence="backoff"``, the default).

Oracles: the paper's per-step form (tests/test_solvers.py's literal transcriptions) run with the
gains the recorded backoffs imply — ``η0 · 2^-k`` from each rollback point on, and for KHA-SMD the
log-gains above ``ρ0`` set back to ``ρ0`` there; the stop mode's error for where the first bad
step lies; and, for resume, the uninterrupted run (bit for bit).
"""

from __future__ import annotations

import json
import logging
import os
import warnings

import numpy as np
import pytest
import xarray as xr

from dkha import KernelHebbianPCA, fit_together, schedule
from dkha.cli.main import main
from dkha.data.checkpoint import Checkpointer
from dkha.errors import NumericalError
from dkha.estimators.online import OnlineKernelPCA
from dkha.solvers.batch import BatchKHA, BlockStart, initial_coefficients
from tests.test_guards import XI, R
from tests.test_guards import fit as guarded_fit
from tests.test_solvers import (
    eigenvalue_estimates,
    et_gain,
    paper_kha_step,
    paper_smd_step,
    rel_err,
)

SIGMA = 4.0


@pytest.fixture(scope="module")
def kc(digits_subset, dense_centered):
    X, _ = digits_subset(10)
    return dense_centered(X, "gaussian", sigma=SIGMA)[1]


def solver_fit(Kc, algorithm, engine, *, eta0, mu=0.2, on_divergence="backoff"):
    return guarded_fit(Kc, algorithm, engine, eta0=eta0, mu=mu, passes=2,
                       on_divergence=on_divergence)


def paper_fit_with_backoffs(Kc, algorithm, eta0, mu, passes, backoffs):
    """The paper's steps with the gains the backoffs imply (the oracle)."""
    l = len(Kc)
    A = initial_coefficients(R, l, schedule.init_generator(0))
    B, rho = np.zeros_like(A), np.zeros(R)
    factor, pending = 1.0, list(backoffs)
    for t in range(passes * l):
        k, pos = divmod(t, l)
        if pos == 0:
            lam = eigenvalue_estimates(A, Kc)
        while pending and pending[0]["rolled_back_to"] == t:
            pending.pop(0)
            factor *= 0.5
            rho = np.minimum(rho, 0.0)
        p = schedule.pass_permutation(0, k, l)[pos]
        if algorithm == "kha":
            A = paper_kha_step(A, Kc, p, np.full(R, eta0 * factor))
        elif algorithm == "kha-et":
            A = paper_kha_step(A, Kc, p, et_gain(lam, t, l, eta0) * factor)
        else:
            A, B, rho, _ = paper_smd_step(A, B, rho, Kc, p, et_gain(lam, t, l, eta0) * factor,
                                          mu, XI)
    assert not pending
    return A


@pytest.mark.parametrize("algorithm,eta0,mu", [("kha", 5.0, 0.0), ("kha-et", 20.0, 0.0),
                                               ("kha-smd", 0.2, 50.0)])
def test_batch_backoff_recovers_with_the_halved_gains(kc, algorithm, eta0, mu):
    with pytest.raises(NumericalError) as stopped:
        solver_fit(kc, algorithm, "factored", eta0=eta0, mu=mu, on_divergence="stop")
    first_bad = int(str(stopped.value).split("at step ")[1].split(" ")[0])
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # the reference engine's overflows
        for engine in ("factored", "reference"):
            runs[engine] = solver_fit(kc, algorithm, engine, eta0=eta0, mu=mu)
    fac, ref = runs["factored"], runs["reference"]
    assert fac.backoffs and fac.backoffs[0]["step"] == first_bad
    assert fac.backoffs[0]["gain_before"] == eta0 and fac.backoffs[0]["gain_after"] == eta0 / 2
    strip = [{k: v for k, v in b.items() if k != "reason"} for b in fac.backoffs]
    assert strip == [{k: v for k, v in b.items() if k != "reason"} for b in ref.backoffs]
    assert fac.state.gain_factor == 0.5 ** len(fac.backoffs)
    want = paper_fit_with_backoffs(kc, algorithm, eta0, mu, 2, fac.backoffs)
    for s in (fac, ref):     # (rounding grows at gains this close to the edge)
        assert np.isfinite(s.A).all() and rel_err(s.A, want) < 1e-6


@pytest.mark.parametrize("algorithm", ["kha", "kha-smd"])
@pytest.mark.parametrize("limit", ["at once", "mid-block", "none"])
def test_a_rollback_gives_the_blocks_start_back_bit_for_bit(kc, algorithm, limit, monkeypatch):
    """The copy a backoff rolls back to holds ``S̃`` by the block's columns where ``T`` is not the
    identity (a block's steps change only those until a fold), and takes all of it at the
    block's first fold: after steps alone, and after a fold at every step and the direct steps
    that follow folds (a limit just above 1), the rollback gives back every array of the state
    at the block's start exactly (a fold at the block's first step, then direct steps; a fold
    after some of its steps; no fold)."""
    l = len(kc)
    solver = BatchKHA(algorithm, R, l, eta0=0.5, mu=0.2, xi=XI, engine="factored")
    A = initial_coefficients(R, l, schedule.init_generator(0))
    solver.start(A, C=A @ kc if solver.needs_projection else None)
    blocks = [idx for _, _, idx in schedule.blocks(0, l, l, 16)]
    solver.begin_pass()
    solver.apply_block(blocks[0], kc[blocks[0]])
    st = solver.state
    st.sync()
    assert not st.fresh
    cond = np.linalg.cond(st.T, 1)
    st.fold_condition = {"at once": 1.0 + 1e-9, "mid-block": cond * 1.02, "none": 1e12}[limit]
    changed = []        # whether the block had changed its columns at each fold
    before_fold = BlockStart.before_fold
    monkeypatch.setattr(BlockStart, "before_fold", lambda self, st: (
        changed.append(int((np.take(st.S_tilde, blocks[1], axis=1) != self.columns[1]).any())),
        before_fold(self, st)))
    skip = st.TRANSIENT | {"fold_condition"}
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v)
              for k, v in vars(st).items() if k not in skip}
    start, folds = solver._block_start, st.folds
    start.save(st, index=blocks[1])
    assert start.columns is not None and "S_tilde" not in start.saved     # by its columns
    solver._apply_block(blocks[1], kc[blocks[1]])
    st.sync()
    assert (st.folds > folds) == (limit != "none")
    assert changed[:1] == {"at once": [0], "mid-block": [1], "none": []}[limit]   # its first
    assert not np.array_equal(st.S_tilde, before["S_tilde"]) and st.t == before["t"] + 16
    start.restore(gain_factor=before["gain_factor"])
    start.release()
    st.sync()
    assert "block_start" not in vars(st)
    for k, v in before.items():
        got = vars(st)[k]
        if isinstance(v, np.ndarray):
            assert np.array_equal(got, v), k
        else:
            assert got == v, k


def test_backoff_gives_up_after_its_limit(kc):
    """A gain that no halving can save within the limit still ends in a clear error."""
    with pytest.raises(NumericalError, match="after 30 backoffs"):
        solver_fit(kc, "kha", "factored", eta0=1e12)


# --- whole fits: history, saved run, kill + resume across a backoff -------------------------------

BLOCK = 8     # small blocks: the backoffs of kha-t at eta0 = 7 roll back to a block start past 0


def make(client, seed, algorithm="kha-t", eta0=7.0, **kw):
    return KernelHebbianPCA(5, algorithm=algorithm, eta0=eta0, sigma=SIGMA, passes=3, seed=seed,
                            block_rows=BLOCK, client=client, **kw)


class Killed(Exception):
    pass


def kill_at_checkpoint(monkeypatch, at_step: int = 0, models: int = 1):
    """Make the first checkpoint (of all ``models``) at or after ``at_step`` the last thing a
    fit does."""
    save = Checkpointer.save
    saved = []

    def save_then_die(self, step, arrays, meta):
        save(self, step, arrays, meta)
        saved.append(step)
        if step >= at_step and saved.count(step) == models:
            raise Killed

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    return lambda: monkeypatch.setattr(Checkpointer, "save", save)


@pytest.fixture(scope="module")
def diverging(digits_store, client, seed, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("b") / "full")
    return make(client, seed).fit(digits_store, run_dir=run), run


def test_batch_fit_records_its_backoffs_and_saves_them(diverging):
    model, run = diverging
    b = model.backoffs_
    # each backoff rolls back to the start of the block its bad step lies in
    assert len(b) >= 2 and any(x["rolled_back_to"] > 0 for x in b)
    assert all(x["rolled_back_to"] == x["step"] // BLOCK * BLOCK for x in b)
    assert np.isfinite(model.alpha_).all() and model.history_[-1]["excess"] < 0.5
    ds = xr.open_zarr(os.path.join(run, "components.zarr")).load()
    assert ds["backoff_step"].values.tolist() == [x["step"] for x in b]
    assert ds["backoff_gain_after"].values.tolist() == [x["gain_after"] for x in b]


def test_batch_kill_and_resume_across_a_backoff_is_bit_identical(digits_store, client, seed,
                                                                 diverging, tmp_path,
                                                                 monkeypatch):
    full, _ = diverging
    run = str(tmp_path / "run")
    after = max(x["step"] for x in full.backoffs_) // BLOCK * BLOCK + BLOCK  # past the last one
    restore = kill_at_checkpoint(monkeypatch, after)
    with pytest.raises(Killed):        # after the backoffs: the halved gain is in the checkpoint
        make(client, seed).fit(digits_store, run_dir=run, checkpoint_steps=BLOCK)
    restore()
    ck = Checkpointer(run).latest()
    assert ck.step == after and ck.meta["backoffs"] == full.backoffs_
    assert ck.meta["state_scalars"]["gain_factor"] == 0.5 ** len(full.backoffs_)
    resumed = make(client, seed).fit(digits_store, run_dir=run, resume=True)
    np.testing.assert_array_equal(resumed.alpha_, full.alpha_)
    assert resumed.backoffs_ == full.backoffs_
    assert [h["excess"] for h in resumed.history_] == [h["excess"] for h in full.history_]


def test_many_models_back_off_each_on_its_own(digits_store, client, seed, diverging, tmp_path,
                                             monkeypatch):
    """In one stream the diverging models back off alone: every model ends as fitted alone,
    also after a kill and resume across the backoffs."""
    full, _ = diverging
    specs = [("kha-t", 7.0), ("kha-et", 0.2), ("kha-smd", 1e3)]
    together = fit_together([make(client, seed, a, e) for a, e in specs], digits_store)
    alone_smd = make(client, seed, "kha-smd", 1e3).fit(digits_store)
    assert together[1].backoffs_ == [] and len(alone_smd.backoffs_) > 0
    for m, alone in ((together[0], full), (together[2], alone_smd)):
        np.testing.assert_array_equal(m.alpha_, alone.alpha_)
        assert m.backoffs_ == alone.backoffs_
    runs = [str(tmp_path / a) for a, _ in specs]
    restore = kill_at_checkpoint(monkeypatch, models=3)     # at step 8, before any backoff
    with pytest.raises(Killed):
        fit_together([make(client, seed, a, e) for a, e in specs], digits_store, run_dirs=runs,
                     checkpoint_steps=BLOCK)
    restore()
    resumed = fit_together([make(client, seed, a, e) for a, e in specs], digits_store,
                           run_dirs=runs, resume=True)
    for m, ref in zip(resumed, together):
        np.testing.assert_array_equal(m.alpha_, ref.alpha_)
        assert m.backoffs_ == ref.backoffs_


# --- online ------------------------------------------------------------------------------------

ONLINE = dict(algorithm="oo-kha", sigma=SIGMA, nu=0.05, eta0=50.0, gain_decay=1.0, steps=600,
              block_rows=32, evaluate_every=300)


def test_online_backoff_recovers_and_resumes_bit_identically(digits, tmp_path, monkeypatch):
    full = OnlineKernelPCA(4, **ONLINE).fit(digits, run_dir=str(tmp_path / "full"))
    b = full.backoffs_
    assert len(b) >= 2 and b[-1]["rolled_back_to"] > 64, "a backoff after the checkpoint"
    assert [x["gain_after"] for x in b] == [50.0 * 0.5 ** (i + 1) for i in range(len(b))]
    assert np.isfinite(full.alpha_).all()
    with pytest.raises(NumericalError, match=f"diverged at step {b[0]['step']}"):
        OnlineKernelPCA(4, on_divergence="stop", **ONLINE).fit(digits)
    # the same stream at the step size the backoffs ended with, from the last rollback on,
    # takes no further backoff: the recovered run is an ordinary one from there
    run = str(tmp_path / "run")
    restore = kill_at_checkpoint(monkeypatch)
    with pytest.raises(Killed):
        OnlineKernelPCA(4, **ONLINE).fit(digits, run_dir=run, checkpoint_every=64)
    restore()
    ck = Checkpointer(run).latest()
    assert 0 < len(ck.meta["backoffs"]) < len(b)
    resumed = OnlineKernelPCA(4, **ONLINE).fit(digits, run_dir=run, resume=True)
    np.testing.assert_array_equal(resumed.alpha_, full.alpha_)
    np.testing.assert_array_equal(resumed.dictionary_, full.dictionary_)
    assert resumed.backoffs_ == full.backoffs_
    ds = xr.open_zarr(os.path.join(run, "components.zarr")).load()
    assert ds["backoff_step"].values.tolist() == [x["step"] for x in b]


# --- the CLI: default backoff, --on-divergence stop, tune's table --------------------------------

def test_cli_backoff_by_default_stop_on_request_and_tune_reports_once(
        digits_store, client, seed, tmp_path, capsys, caplog):
    common = ["--components", "4", "--sigma", str(SIGMA), "--seed", str(seed), "--block",
              str(BLOCK), "--quiet", "--scheduler", client.scheduler.address]
    fit = ["fit", digits_store.path, "--algorithm", "kha", "--eta0", "20", "--passes", "1",
           *common]
    assert main([*fit, "-o", str(tmp_path / "a")]) == 0
    assert "diverged and backed off" in capsys.readouterr().out
    assert main([*fit, "-o", str(tmp_path / "b"), "--on-divergence", "stop"]) == 3
    assert "kha diverged at step" in capsys.readouterr().err
    caplog.set_level(logging.INFO, logger="dkha")
    caplog.clear()
    tune = ["tune", digits_store.path, "--algorithm", "kha", "--eta0", "0.05,20", "--passes",
            "1", *common]
    assert main([*tune, "-o", str(tmp_path / "t1"), "--on-divergence", "stop"]) == 0
    table = capsys.readouterr().out
    assert table.count("diverged") == 1
    assert main([*tune, "-o", str(tmp_path / "t2"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["grid"]
    assert rows[0]["backoffs"] == 0 and rows[1]["backoffs"] > 0 and rows[1]["excess"] is not None
    # the table reports them; the log holds them at INFO, never as warnings
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and "diverged" in r.getMessage()]
