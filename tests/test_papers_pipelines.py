"""Issue 42: the reproduction pipelines report what they promise, and no pass is thrown away in
silence.

* ``pipelines/digits-kpca.toml`` (Schraudolph et al.'s Figure 1) and ``pipelines/online-ac.toml``
  (Souza Filho & Diniz's Figure 1), shrunk to seconds (fewer samples, passes and steps; the
  files' own settings otherwise): ``summary.json`` holds the excess ``E/E_min − 1`` of every pass
  of the four KHA fits (``E_min`` checked against dense ``eigh``) and the AC index along the stream
  of the three online fits with the paper's figures beside them; the report shows them.
* A fit that keeps an earlier state than its last says so, with the reason and what to try, in
  the summary line, the saved run's attrs, the report and a pipeline's ``summary.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np
import pytest
import xarray as xr

from dkha.data import cf
from dkha.fit.track import FLUCTUATED, GAINS_TOO_LARGE, NOISE_FLOOR, kept_reason
from tests.processes import dkha_in_process

PIPELINES = pathlib.Path(__file__).resolve().parent.parent / "pipelines"


def shrunk(name: str, **replace: str) -> str:
    """The pipeline file ``name`` with each ``key = value`` line of ``replace`` set anew."""
    text = (PIPELINES / name).read_text()
    for key, value in replace.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n, key
    return text


def run_pipeline(tmp_path, text: str) -> tuple[dict, str]:
    f = tmp_path / "p.toml"
    f.write_text(text)
    ran = dkha_in_process("run", str(f), "--runs-dir", str(tmp_path / "runs"))
    assert ran.returncode == 0, ran.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    with open(run_dir / "summary.json") as fh:
        return json.load(fh), str(run_dir)


def centered_gram(X, sigma):
    from scipy.spatial.distance import cdist

    K = np.exp(-cdist(X, X, "sqeuclidean") / (2 * sigma**2))
    J = np.eye(len(X)) - 1.0 / len(X)
    return J @ K @ J


def test_digits_kpca_pipeline_holds_the_excess_of_every_pass(tmp_path):
    summary, run_dir = run_pipeline(tmp_path, shrunk(
        "digits-kpca.toml", per_class="20", passes="3", components="4", checkpoint_every="1"))
    figures = summary["figures"]
    assert set(figures) == {"kha", "kha-t", "kha-et", "kha-smd"}
    from sklearn.datasets import load_digits

    d = load_digits()
    X = np.concatenate([d.data[d.target == k][:20] for k in range(10)]) / 8.0 - 1.0
    w = np.linalg.eigvalsh(centered_gram(X, 4.0))[::-1]
    e_min = np.sqrt(np.sum(w[4:] ** 2))                    # eq. 22's minimum: dense eigh
    for name, f in figures.items():
        per_pass = f["excess_per_pass"]
        assert list(per_pass) == ["0", "1", "2", "3"]       # the start and every pass
        ds = xr.open_zarr(os.path.join(run_dir, "fits", name, "components.zarr")).load()
        assert ds.attrs["init"] == "random"                 # the paper's start
        np.testing.assert_allclose(ds["error_min"].values, e_min, rtol=1e-8)
        np.testing.assert_allclose([per_pass[str(p)] for p in range(4)],
                                   ds["error"].values / e_min - 1, rtol=1e-8)
        assert per_pass["3"] < per_pass["0"]                # the passes improve on the start
    page = pathlib.Path(run_dir, "report.html").read_text()
    assert "excess error E/E_min − 1 by pass" in page and "convergence.png" not in page
    assert os.path.exists(os.path.join(run_dir, "report", "convergence.png"))


def test_online_ac_pipeline_holds_the_ac_index_along_the_stream(tmp_path):
    text = shrunk("online-ac.toml", steps="600", evaluate_every="200", checkpoint_steps="0")
    text = text.replace("digits = [1, 2, 3]", "digits = [1, 2, 3]\nper_class = 40")
    summary, run_dir = run_pipeline(tmp_path, text)
    figures = summary["figures"]
    assert set(figures) == {"on-kha", "oo-kha", "okpca"}
    paper = {"on-kha": 0.7891, "oo-kha": 0.5974, "okpca": 0.4887}
    for name, f in figures.items():
        ds = xr.open_zarr(os.path.join(run_dir, "fits", name, "components.zarr")).load()
        assert ds.attrs["algorithm"] == name                # the named algorithm ran
        assert list(f["ac_index_per_step"]) == ["200", "400", "600"]
        np.testing.assert_array_equal(list(f["ac_index_per_step"].values()),
                                      ds["ac_index"].values)
        assert max(f["ac_index_per_step"].values()) < 0.99  # not the exact solution
        assert f["paper"] == {"50000": paper[name]} and "Table II" in f["paper_source"]
    page = pathlib.Path(run_dir, "report.html").read_text()
    assert "AC index by step" in page and "on-kha (paper)" in page


# --- no pass thrown away in silence ----------------------------------------------------------

KEEPS = ["--algorithm", "kha", "--eta0", "1.0", "--components", "4", "--sigma", "4",
         "--passes", "2", "--init", "nystrom:100"]


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory):
    from sklearn.datasets import load_digits

    from dkha.data.ingest import ingest_array

    d = load_digits()
    X = np.concatenate([d.data[d.target == k][:20] for k in range(10)]) / 8.0 - 1.0
    return ingest_array(X, str(tmp_path_factory.mktemp("d") / "d.zarr")).path


def test_a_kept_state_is_said_everywhere_with_its_reason(digits_store, tmp_path):
    """A gain far too large for the Nyström start: both passes end worse than the start, which
    is the result; the summary line, the run's attrs, the report and a pipeline's summary.json
    say so, why, and what to try."""
    run = str(tmp_path / "run")
    ran = dkha_in_process("fit", digits_store, "-o", run, *KEEPS)
    assert ran.returncode == 0, ran.stderr
    attrs = cf.decode_attrs(xr.open_zarr(os.path.join(run, "components.zarr")).attrs)
    assert attrs["kept_state"]["pass"] == 0       # (saved as JSON text: netCDF takes no dict)
    reason = attrs["kept_reason"]
    assert isinstance(reason, str) and reason.startswith(GAINS_TOO_LARGE)
    assert "try a smaller eta0" in reason
    assert f"kept the state of pass 0, not the last: {reason}" in ran.stdout
    assert dkha_in_process("report", run).returncode == 0
    page = pathlib.Path(run, "report.html").read_text()
    assert "state kept (not the last)" in page and GAINS_TOO_LARGE in page

    toml = tmp_path / "keeps.toml"
    toml.write_text(f'[pipeline]\nname = "keeps"\n[data]\nkind = "store"\npath = "{digits_store}"\n'
                    '[[fit]]\nname = "kha"\nalgorithm = "kha"\neta0 = 1.0\ncomponents = 4\n'
                    'sigma = 4.0\npasses = 2\ninit = "nystrom:100"\n')
    ran = dkha_in_process("run", str(toml), "--runs-dir", str(tmp_path / "runs"))
    assert ran.returncode == 0, ran.stderr
    summary = json.loads((tmp_path / "runs" / "keeps" / "summary.json").read_text())
    assert summary["figures"]["kha"]["kept_pass"] == 0
    assert summary["figures"]["kha"]["kept_reason"] == reason
    page = (tmp_path / "runs" / "keeps" / "report.html").read_text()
    assert "Fits that kept an earlier state than their last" in page


def test_the_kept_figures_give_the_kept_states_own_errors():
    """A pipeline's ``excess`` is its fit's last evaluation; where an earlier state is the
    result, its own exact excess and error come beside ``kept_pass`` (a tracked state has
    none: its figures are Ritz values)."""
    from dkha.fit.track import kept_figures

    exact = {"kept_state": {"step": 41000, "pass": 41, "error": 26.37, "error_min": 25.52,
                            "excess": 0.0334, "error_last": 26.86}, "kept_reason": "why"}
    assert kept_figures(exact) == {"kept_pass": 41, "kept_excess": 0.0334, "kept_error": 26.37,
                                   "kept_reason": "why"}
    tracked = {"kept_state": {"pass": 0, "step": 0, "captured": 10.0, "captured_last": 9.0},
               "kept_reason": "why"}
    assert kept_figures(tracked) == {"kept_pass": 0, "kept_reason": "why"}
    assert kept_figures({}) == {}


def test_the_reasons_tell_the_noise_floor_from_gains_too_large():
    kept = {"pass": 0, "step": 0, "captured": 10.0, "captured_last": 9.0}
    warm_default = kept_reason(kept, {"init": "nystrom:640", "eta0": None})
    assert warm_default.startswith(NOISE_FLOOR) and "krylov" in warm_default
    asked = kept_reason(kept, {"init": "nystrom:640", "eta0": 1.0})
    assert asked.startswith(GAINS_TOO_LARGE) and "leave eta0 unset" in asked
    random = kept_reason(kept, {"init": "random", "eta0": None})
    assert random.startswith(GAINS_TOO_LARGE) and "leave eta0 unset" not in random
    later = kept_reason({"pass": 41, "step": 41000, "error": 26.37, "error_last": 26.86},
                        {"init": "random", "eta0": 0.05})
    assert later.startswith(FLUCTUATED) and "26.37" in later and "26.86" in later


@pytest.mark.parametrize("evaluation", ["exact", "tracked"])
def test_default_gains_stop_at_once_from_a_start_already_exact(digits_store, tmp_path,
                                                              evaluation):
    """200 digits: the default Nyström start (199 landmarks of 200 samples) is the exact
    solution (dense eigh: its error is E_min, its Σθ² is Σλ²). KHA-SMD at the default gains for
    it stops after its first pass and keeps the start, saying so in the summary line and the
    run's attrs; from a start of 40 landmarks the same default gains improve on it and every
    pass runs. Both with the exact evaluation (E, eq. 22) and the tracked one (Σθ²)."""
    import dask
    from sklearn.datasets import load_digits

    d = load_digits()
    X = np.concatenate([d.data[d.target == k][:20] for k in range(10)]) / 8.0 - 1.0
    w = np.linalg.eigvalsh(centered_gram(X, 4.0))[::-1]
    if evaluation == "exact":       # a lower figure is better: E ≥ E_min
        figure, best, sign = "error", float(np.sqrt(np.sum(w[4:] ** 2))), -1.0
    else:                           # a higher one: Σθ² ≤ Σλ²
        figure, best, sign = "captured", float(np.sum(w[:4] ** 2)), 1.0
    fit = ["--algorithm", "kha-smd", "--components", "4", "--sigma", "4", "--passes", "4"]
    with dask.config.set({"dkha.evaluation": evaluation}):
        ran = dkha_in_process("fit", digits_store, "-o", str(tmp_path / "exact-start"), *fit)
        coarse = dkha_in_process("fit", digits_store, "-o", str(tmp_path / "coarse-start"),
                                 *fit, "--init", "nystrom:40")
    assert ran.returncode == 0, ran.stderr
    ds = xr.open_zarr(str(tmp_path / "exact-start" / "components.zarr")).load()
    ds.attrs = cf.decode_attrs(ds.attrs)        # (dicts saved as JSON text: netCDF takes none)
    assert ds.attrs["init"] == "nystrom:199"
    assert list(ds["pass"].values) == [0, 1]                # one pass, then the stop
    assert ds[figure].values[0] == pytest.approx(best, rel=1e-9)
    kept, reason = ds.attrs["kept_state"], ds.attrs["kept_reason"]
    assert kept["pass"] == 0 and kept["stopped_after"] == 1
    assert kept[figure] == ds[figure].values[0]             # the start is the result
    assert reason.startswith(NOISE_FLOOR) and "stopped at once, after pass 1" in reason
    assert "already as good as these passes can make it" in reason and "eta0" in reason
    assert f"kept the state of pass 0, not the last: {reason}" in ran.stdout

    assert coarse.returncode == 0, coarse.stderr
    ds = xr.open_zarr(str(tmp_path / "coarse-start" / "components.zarr")).load()
    assert list(ds["pass"].values) == [0, 1, 2, 3, 4]       # no stop
    gap = sign * (best - ds[figure].values)                 # ≥ 0: how far from the exact
    assert np.all(gap >= -1e-9 * best)
    assert gap[0] > gap[1] > gap[4] and gap[4] < 0.98 * gap[0]  # the passes improve on it
    assert "kept_state" not in ds.attrs and "kept the state" not in coarse.stdout


def test_default_gains_stop_at_once_where_the_start_cannot_be_improved():
    """Standardized breast-cancer data: from the default Nyström start, the first pass of
    KHA-SMD at the default gains does not improve on the start. The fit stops there and keeps
    the start, saying the start is at the noise floor; the same gain given by hand runs every
    pass (and says the gains were too large for the start)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    from dkha import KernelHebbianPCA

    X = StandardScaler().fit_transform(load_breast_cancer().data)
    model = KernelHebbianPCA(8, algorithm="kha-smd", passes=4).fit(X)
    assert [h["pass"] for h in model.history_] == [0, 1]
    kept = model.attrs_["kept_state"]
    assert kept["pass"] == 0 and kept["stopped_after"] == 1
    assert model.attrs_["kept_reason"].startswith(NOISE_FLOOR)
    assert "stopped at once, after pass 1" in model.attrs_["kept_reason"]
    first = model.history_[0]
    figure = "captured" if "captured" in first else "error"
    assert kept[figure] == first[figure]                    # the start is the result
    asked = KernelHebbianPCA(8, algorithm="kha-smd", passes=4,
                             eta0=model.attrs_["eta0_applied"]).fit(X)
    assert [h["pass"] for h in asked.history_] == [0, 1, 2, 3, 4]
    assert asked.attrs_["kept_state"]["pass"] == 0
    assert asked.attrs_["kept_reason"].startswith(GAINS_TOO_LARGE)
