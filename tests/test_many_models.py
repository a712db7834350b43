"""Many models, one kernel stream: fit_together, `dkha fit --algorithm a,b,c`, `dkha tune`.

Oracles: each model fitted alone (its coefficients must be equal bit for bit), and the dense
``K'`` (numpy.linalg.eigh) for the shared evaluations.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xarray as xr

from dkha import KernelHebbianPCA, fit_together
from dkha.cli.main import main
from dkha.errors import Interrupted, NumericalError, ParameterError
from dkha.estimators.batch import run_names
from dkha.fit import control
from dkha.fit.track import result_entry
from dkha.solvers.batch import BatchKHA

R, SIGMA, PASSES, BLOCK = 5, 4.0, 3, 37
GAINS = {"kha-t": {"eta0": 0.5}, "kha-et": {"eta0": 0.2}, "kha-smd": {"eta0": 0.2, "mu": 0.3}}


def make(client, seed, algorithm, passes=PASSES, **kw):
    return KernelHebbianPCA(R, algorithm=algorithm, sigma=SIGMA, passes=passes, seed=seed,
                            block_rows=BLOCK, client=client, **{**GAINS.get(algorithm, {}), **kw})


@pytest.fixture(scope="module")
def apart(digits_store, client, seed):
    return {a: make(client, seed, a).fit(digits_store) for a in GAINS}


@pytest.fixture(scope="module")
def together(digits_store, client, seed):
    return fit_together([make(client, seed, a) for a in GAINS], digits_store)


def test_together_equals_apart_bit_for_bit(apart, together):
    for m in together:
        alone = apart[m.algorithm]
        np.testing.assert_array_equal(m.alpha_, alone.alpha_)
        np.testing.assert_allclose(m.eigenvalues_, alone.eigenvalues_, rtol=1e-12)
        assert [h["step"] for h in m.history_] == [h["step"] for h in alone.history_]
        np.testing.assert_allclose([h["excess"] for h in m.history_],
                                   [h["excess"] for h in alone.history_], rtol=1e-9, atol=1e-13)
    # the models really differ (a shared stream did not make them one): their passes' errors.
    # (Their results may not: the start is exact at l = 300, and a fit whose passes end worse
    # keeps its best state, here the start.)
    errors = [[h["error"] for h in m.history_[1:]] for m in together]
    assert not np.allclose(errors[0], errors[2]) and not np.allclose(errors[1], errors[2])


def test_tracked_evaluations_together_equal_apart(digits_store, client, seed):
    """With the tracked evaluation (dkha's default) each model fitted together has the history
    it has alone, its start (pass 0, from the one shared start) included: a model beside
    another lost its pass-0 entry (the shared start's C served only the first), so its kept
    state and its stop at once (issue 42) never compared a pass with the start."""
    import dask

    kw = {"init": "nystrom:60"}
    with dask.config.set({"dkha.evaluation": "tracked"}):
        alone = [make(client, seed, a, **kw).fit(digits_store) for a in ("kha-t", "kha-smd")]
        both = fit_together([make(client, seed, a, **kw) for a in ("kha-t", "kha-smd")],
                            digits_store)
    for m, a in zip(both, alone):
        assert [h["pass"] for h in m.history_] == list(range(PASSES + 1))
        assert [h["pass"] for h in m.history_] == [h["pass"] for h in a.history_]
        np.testing.assert_allclose([h["captured"] for h in m.history_],
                                   [h["captured"] for h in a.history_], rtol=1e-12)
        np.testing.assert_array_equal(m.alpha_, a.alpha_)
    assert both[0].history_[0]["captured"] == both[1].history_[0]["captured"]


def test_shared_evaluations_match_dense(together, digits, dense_centered):
    """Every model's evaluations (one pass for all their C, one for all residuals) against the
    dense K': E = ‖K' − CᵀC‖_F with C = A K', E_min from eigh."""
    Kc = dense_centered(np.array(digits), "gaussian", sigma=SIGMA)[1]
    lam = np.linalg.eigvalsh(Kc)[::-1][:R]
    e_min = np.sqrt(np.sum(Kc**2) - np.sum(lam**2))
    for m in together:
        C = m.alpha_ @ Kc
        e = np.linalg.norm(Kc - C.T @ C)
        last = result_entry(m.history_, m.attrs_.get("kept_state"))     # the result's errors
        np.testing.assert_allclose(last["error"], e, rtol=1e-10)
        np.testing.assert_allclose(last["error_min"], e_min, rtol=1e-10)
        np.testing.assert_allclose(last["excess"], e / e_min - 1, rtol=1e-8, atol=1e-13)
        # eq. 13 estimates from the shared final projections
        np.testing.assert_allclose(m.eigenvalues_, np.linalg.norm(C, axis=1)
                                   / np.linalg.norm(m.alpha_, axis=1), rtol=1e-10)


def test_diverged_model_is_set_aside(digits_store, client, seed, apart):
    models = [make(client, seed, "kha-t"),
              make(client, seed, "kha-smd", eta0=1e4, on_divergence="stop")]
    fit_together(models, digits_store, skip_diverged=True)
    assert models[0].failure_ is None and "diverged" in models[1].failure_
    np.testing.assert_array_equal(models[0].alpha_, apart["kha-t"].alpha_)
    assert not hasattr(models[1], "alpha_")
    with pytest.raises(NumericalError, match="1 of 2 models diverged"):
        fit_together([make(client, seed, "kha-t", passes=1),
                      make(client, seed, "kha-smd", eta0=1e4, passes=1, on_divergence="stop")],
                     digits_store)


def test_settings_that_shape_the_stream_must_agree(digits_store, client, seed):
    with pytest.raises(ParameterError, match="must agree on seed"):
        fit_together([make(client, seed, "kha-t"), make(client, seed + 1, "kha-et")], digits_store)
    with pytest.raises(ParameterError, match="must agree on n_components"):
        fit_together([make(client, seed, "kha-t"),
                      KernelHebbianPCA(R + 1, algorithm="kha-et", sigma=SIGMA, passes=PASSES,
                                       seed=seed, block_rows=BLOCK, client=client)], digits_store)
    assert run_names([make(None, 0, "kha-t"), make(None, 0, "kha-smd", eta0=0.1),
                      make(None, 0, "kha-smd", eta0=0.2)]) == [
        "kha-t", "kha-smd-eta0=0.1", "kha-smd-eta0=0.2"]
    with pytest.raises(ParameterError, match="asked for twice"):
        run_names([make(None, 0, "kha-et"), make(None, 0, "kha-et")])


def test_stop_then_resume_together_is_bit_identical(digits_store, client, seed, together,
                                                    tmp_path, monkeypatch):
    """SIGTERM's STOP mid-pass checkpoints every model at the same step; resuming all of them
    ends where the uninterrupted shared fit (= each fit alone) ends."""
    runs = [str(tmp_path / a) for a in GAINS]
    calls = {"n": 0}
    original = BatchKHA.apply_block

    def counting(self, index, rows):
        original(self, index, rows)
        calls["n"] += 1
        if calls["n"] == 3 * 11 + 2:        # mid-pass 2, after the 2nd model's block
            control.STOP.set()

    monkeypatch.setattr(BatchKHA, "apply_block", counting)
    try:
        with pytest.raises(Interrupted):
            fit_together([make(client, seed, a) for a in GAINS], digits_store, run_dirs=runs,
                         checkpoint_every=1)
    finally:
        control.STOP.clear()
    monkeypatch.setattr(BatchKHA, "apply_block", original)
    steps = {max(os.listdir(os.path.join(r, "checkpoints"))) for r in runs}
    assert len(steps) == 1
    resumed = fit_together([make(client, seed, a) for a in GAINS], digits_store, run_dirs=runs,
                           resume=True)
    for m, ref, run in zip(resumed, together, runs):
        np.testing.assert_array_equal(m.alpha_, ref.alpha_)
        assert not os.path.exists(os.path.join(run, "checkpoints"))


def test_cli_fit_lists_and_tune(digits_store, client, seed, tmp_path, capsys):
    scheduler = client.scheduler.address
    common = ["--components", str(R), "--sigma", str(SIGMA), "--seed", str(seed),
              "--block", str(BLOCK), "--quiet", "--scheduler", scheduler]
    out = str(tmp_path / "fit")
    assert main(["fit", digits_store.path, "-o", out, "--algorithm", "kha-t,kha-smd,kha-smd",
                 "--eta0", "0.5,0.2,0.1", "--mu", "0.3", "--passes", "2", *common]) == 0
    # one zarr group tree, a group per model; each model's directory keeps its timings
    assert sorted(os.listdir(out)) == ["components.zarr", "kha-smd-eta0=0.1", "kha-smd-eta0=0.2",
                                       "kha-t"]
    ds = xr.open_zarr(os.path.join(out, "components.zarr"), group="kha-smd-eta0=0.1")
    assert (ds.attrs["algorithm"], ds.attrs["eta0"], ds.attrs["mu"]) == ("kha-smd", 0.1, 0.3)
    assert main(["evaluate", os.path.join(out, "kha-t"), "--json", "--scheduler", scheduler]) == 0

    tune_dir = str(tmp_path / "tune")
    capsys.readouterr()
    assert main(["tune", digits_store.path, "-o", tune_dir, "--eta0", "0.1,0.2,1e4",
                 "--mu", "0.1,0.5", "--passes", "2", "--json", *common]) == 0
    summary = json.loads(capsys.readouterr().out)
    with open(os.path.join(tune_dir, "tune.json")) as f:
        assert summary == json.load(f)
    grid = summary["grid"]
    # eta0 = 1e4 diverged, backed off (tests/test_backoff.py) and was scored like the others
    assert len(grid) == 6 and [r["backoffs"] > 0 for r in grid] == [False] * 4 + [True] * 2
    assert all(r["excess"] is not None for r in grid)
    scored = [r for r in grid if r["excess"] is not None]
    best = min(scored, key=lambda r: r["excess"])
    chosen = summary["best"]["kha-smd"]
    assert (chosen["eta0"], chosen["mu"], chosen["excess"]) == (best["eta0"], best["mu"],
                                                                best["excess"])
    # the kept run continues (--resume with more passes) exactly as a longer fit alone
    gains = ["--algorithm", "kha-smd", "--eta0", str(chosen["eta0"]), "--mu", str(chosen["mu"])]
    assert main(["fit", digits_store.path, "-o", chosen["run_dir"], *gains, "--passes", "3",
                 "--evaluate-every", "0", "--resume", *common]) == 0
    # (evaluated as the tuned run was, at the end only: a fit keeps its best evaluated state, and
    # a fit evaluated at its start too would keep that exact start here)
    alone = make(client, seed, "kha-smd", eta0=chosen["eta0"], mu=chosen["mu"],
                 evaluate_every=0).fit(digits_store)
    continued = xr.open_zarr(os.path.join(chosen["run_dir"], "components.zarr")).load()
    np.testing.assert_array_equal(continued["alpha"].values, alone.alpha_)
    np.testing.assert_allclose(continued["excess"].values[-1], alone.history_[-1]["excess"],
                               rtol=1e-9)
    # a TUNE_DIR that holds something is refused, one line, before any work
    assert main(["tune", digits_store.path, "-o", tune_dir, "--eta0", "0.1", *common]) == 2
    assert "not empty" in capsys.readouterr().err


def test_a_model_stopped_early_resumes_beside_one_still_running(digits_store, client, seed,
                                                                tmp_path, monkeypatch):
    """Two models on one stream, one stopped by its ``tol`` at its start while the other runs
    on: the stopped model's checkpoints stay at its stopping step, so a stop in pass 3 and a
    resume must take each model's own newest checkpoint (not ask for a common step the stopped
    model never reached) and end as the uninterrupted fit ends."""
    def models():
        return [make(client, seed, "kha-smd", passes=4, tol=1e6),
                make(client, seed, "kha-et", passes=4)]

    full = fit_together(models(), digits_store)
    assert [h["pass"] for h in full[0].history_][-1] == 0     # stopped by its tol at once
    assert [h["pass"] for h in full[1].history_][-1] == 4
    runs = [str(tmp_path / "smd"), str(tmp_path / "et")]
    l = digits_store.n_samples
    calls = {"n": 0}
    original = BatchKHA.apply_block

    def counting(self, index, rows):
        original(self, index, rows)
        calls["n"] += 1
        if self.state.t > 2 * l + 2 * BLOCK:        # mid-pass 3
            control.STOP.set()

    monkeypatch.setattr(BatchKHA, "apply_block", counting)
    try:
        with pytest.raises(Interrupted):
            fit_together(models(), digits_store, run_dirs=runs, checkpoint_every=1)
    finally:
        control.STOP.clear()
    monkeypatch.setattr(BatchKHA, "apply_block", original)
    resumed = fit_together(models(), digits_store, run_dirs=runs, resume=True)
    for m, ref in zip(resumed, full):
        np.testing.assert_array_equal(m.alpha_, ref.alpha_)
        assert [h["pass"] for h in m.history_] == [h["pass"] for h in ref.history_]
