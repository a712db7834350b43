"""Convergence tracked without E_min (the default evaluation of KHA fits): the Ritz figures
against the dense oracle, no evaluation passes, the best state kept, resumes bit-identical.

Oracles: the dense centered kernel matrix and its ``numpy.linalg.eigh`` (tests/conftest.py);
principal angles by ``scipy.linalg.subspace_angles`` in explicit feature-space coordinates.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from scipy.linalg import subspace_angles

from dkha import KernelHebbianPCA, config
from dkha.fit.track import ritz_values, state_of, tracked
from tests.conftest import centered_kernel_oracle

R, SIGMA = 4, 4.0


@pytest.fixture(scope="module")
def Kc(digits):
    return centered_kernel_oracle(np.array(digits), "gaussian", sigma=SIGMA)[1]


@pytest.fixture()
def tracked_evaluation():
    with dask.config.set({"dkha.evaluation": "tracked"}):
        yield


def features(Kc):
    """``Φ`` (``m × l``) with ``ΦᵀΦ = K'``."""
    w, U = np.linalg.eigh(Kc)
    keep = w > 1e-10 * w.max()
    return np.sqrt(w[keep])[:, None] * U[:, keep].T


def test_ritz_figures_against_the_oracle(Kc, seed):
    rng = np.random.default_rng(seed)
    l = len(Kc)
    w, U = np.linalg.eigh(Kc)
    w, U = w[::-1], U[:, ::-1]
    exact = (U[:, :R] / np.sqrt(w[:R])).T                 # unit components
    np.testing.assert_allclose(ritz_values(exact, exact @ Kc), w[:R], rtol=1e-9)
    assert tracked(exact, exact @ Kc)["captured"] == pytest.approx(np.sum(w[:R] ** 2), rel=1e-9)
    A = exact + 0.02 * rng.standard_normal((R, l)) / np.sqrt(l)
    Phi = features(Kc)
    W = Phi @ A.T                                         # the components in feature space
    Q, _ = np.linalg.qr(W)
    theta = np.linalg.eigvalsh(Q.T @ (Phi @ Phi.T) @ Q)[::-1]
    np.testing.assert_allclose(ritz_values(A, A @ Kc), theta, rtol=1e-8)
    got = tracked(A, A @ Kc, state_of(exact, exact @ Kc))
    assert got["captured"] < np.sum(w[:R] ** 2)           # interlacing: below the optimum
    angle = np.max(subspace_angles(W, Phi @ exact.T))
    assert got["change"] == pytest.approx(np.sin(angle), rel=1e-6)
    assert tracked(A, A @ Kc, state_of(A, A @ Kc))["change"] < 1e-6


def test_tracked_fit_makes_no_evaluation_pass(digits_store, client, Kc, tracked_evaluation):
    model = KernelHebbianPCA(R, algorithm="kha-smd", sigma=SIGMA, passes=3, init="nystrom:60",
                             client=client).fit(digits_store.path)
    kinds = [p["kind"] for p in model.timings_["passes"]]
    assert "residual" not in kinds and kinds.count("product") == 1   # the start's C = A K'
    assert [h["measure"] for h in model.history_] == ["ritz"] * 4
    assert all(np.isnan(h["excess"]) for h in model.history_)
    C = model.alpha_ @ Kc
    end = next(h for h in model.history_ if h["step"] == 3 * len(Kc))
    if "kept_state" not in model.attrs_:
        assert end["captured"] == pytest.approx(np.sum(ritz_values(model.alpha_, C) ** 2),
                                                rel=1e-9)
    captured = [h["captured"] for h in model.history_]
    kept = np.sum(ritz_values(model.alpha_, C) ** 2)
    assert kept == pytest.approx(max(captured), rel=1e-9)   # never worse than its best entry
    assert kept >= captured[0]                              # ... nor than the start


def test_a_worse_end_keeps_the_best_state(digits_store, client, Kc, tracked_evaluation):
    """A gain far too large for the Nyström start's accuracy makes the passes worse than
    the start: the start (the best entry) is the result, and the attrs say so."""
    model = KernelHebbianPCA(R, algorithm="kha", eta0=1.0, sigma=SIGMA, passes=2,
                             init="nystrom:200", client=client).fit(digits_store.path)
    captured = [h["captured"] for h in model.history_]
    assert max(captured[1:]) < captured[0]                   # the passes made it worse ...
    kept = model.attrs_["kept_state"]
    assert kept["pass"] == 0 and kept["captured"] == captured[0]
    assert np.sum(ritz_values(model.alpha_, model.alpha_ @ Kc) ** 2) == pytest.approx(
        captured[0], rel=1e-9)                               # ... and the start was kept


def test_a_worse_end_keeps_the_best_state_under_exact_evaluation(digits_store, client, Kc):
    """The same with the exact evaluation (eq. 22): the state of the lowest error is the result,
    its errors are the summary's, and the history still shows every pass as measured."""
    from dkha.fit.track import result_entry

    with dask.config.set({"dkha.evaluation": "exact"}):
        model = KernelHebbianPCA(R, algorithm="kha", eta0=1.0, sigma=SIGMA, passes=2,
                                 init="nystrom:200", client=client).fit(digits_store.path)
    errors = [h["error"] for h in model.history_]
    assert "measure" not in model.history_[0] and len(errors) == 3
    assert min(errors[1:]) > errors[0]                       # the passes made it worse ...
    C = model.alpha_ @ Kc
    error = np.linalg.norm(Kc - C.T @ C)                     # the dense oracle of eq. 22
    assert error == pytest.approx(errors[0], rel=1e-9)       # ... and the start is the result
    kept = model.attrs_["kept_state"]
    assert kept["pass"] == 0 and kept["error_last"] == errors[-1]
    final = result_entry(model.history_, kept)
    assert final["error"] == kept["error"] == errors[0] and final["step"] == 2 * len(Kc)
    assert final["excess"] == model.history_[0]["excess"]


def test_tracked_resume_is_bit_identical(digits_store, client, tmp_path, monkeypatch,
                                         tracked_evaluation):
    from dkha.data.checkpoint import Checkpointer

    l = digits_store.n_samples
    kw = dict(algorithm="kha-smd", sigma=SIGMA, passes=3, block_rows=40, init="nystrom:60",
              client=client)
    full = KernelHebbianPCA(R, **kw).fit(digits_store, run_dir=str(tmp_path / "full"))

    class Killed(Exception):
        pass

    save = Checkpointer.save

    def save_then_die(self, step, arrays, meta):
        save(self, step, arrays, meta)
        raise Killed

    run = str(tmp_path / "run")
    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with pytest.raises(Killed):
        KernelHebbianPCA(R, **kw).fit(digits_store, run_dir=run, checkpoint_steps=l + 40)
    monkeypatch.setattr(Checkpointer, "save", save)
    resumed = KernelHebbianPCA(R, **kw).fit(digits_store, run_dir=run, resume=True)
    assert np.array_equal(resumed.alpha_, full.alpha_)
    strip = [{k: v for k, v in h.items() if k != "wall_time"} for h in full.history_]
    again = [{k: v for k, v in h.items() if k != "wall_time"} for h in resumed.history_]
    assert len(strip) == len(again) == 4
    for a, b in zip(strip, again):
        assert a["measure"] == b["measure"] == "ritz"
        assert a["captured"] == b["captured"]
        assert a["change"] == b["change"] or (np.isnan(a["change"]) and np.isnan(b["change"]))
    assert resumed.attrs_.get("kept_state") == full.attrs_.get("kept_state")


def test_exact_spectrum_is_cached_in_the_store(digits, client, tmp_path, monkeypatch):
    """E_min's eigenvalues are computed once per data, kernel and centering, kept in the data
    store beside the centering rows and read back (by fewer or as many components)."""
    from dkha.data.ingest import ingest_array
    from dkha.engine.rows import RowEngine
    from dkha.fit import spectrum
    from dkha.kernels import make_kernel

    store = ingest_array(np.array(digits), str(tmp_path / "d.zarr"), chunk_rows=64)
    Kc = centered_kernel_oracle(np.array(digits), "gaussian", sigma=SIGMA)[1]
    w = np.linalg.eigvalsh(Kc)[::-1]
    engine = RowEngine(store, make_kernel("gaussian", sigma=SIGMA), client, config.settings())
    engine.compute_mk()
    np.testing.assert_allclose(spectrum.top_eigenvalues(engine, 6), w[:6], rtol=1e-9)
    assert (tmp_path / "d.zarr" / "spectrum").is_dir()

    def no_solve(*a, **k):
        raise AssertionError("solved again instead of reading the cache")

    monkeypatch.setattr(RowEngine, "dense", no_solve)
    monkeypatch.setattr(spectrum, "krylov_eigenpairs", no_solve)
    np.testing.assert_allclose(spectrum.top_eigenvalues(engine, 4), w[:4], rtol=1e-9)
    other = RowEngine(store, make_kernel("gaussian", sigma=2 * SIGMA), client, config.settings())
    other.compute_mk()
    with pytest.raises(AssertionError, match="solved again"):
        spectrum.top_eigenvalues(other, 4)          # another kernel: not served from the cache
    with pytest.raises(AssertionError, match="solved again"):
        spectrum.top_eigenvalues(engine, 7)         # more than were cached
