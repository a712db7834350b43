"""Issue 42: a named online algorithm runs its paper's update from the first sample.

On 90 digits with ``ν = 1e-3`` every sample joins the dictionary, so every sample lies in its
span: the estimator's default ``auto`` is the exact kernel PCA of what it saw there, and a fit
naming ON-KHA, OO-KHA or Honeine's online KPCA must still give the papers' per-step updates
(:func:`tests.test_online.paper_steps`, the papers' equations in dictionary coordinates, written
out in the tests) — through ``OnlineKernelPCA(algorithm=...).fit`` and through ``dkha fit``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr

from dkha import algorithms
from dkha.data.ingest import ingest_array
from dkha.estimators.online import OnlineKernelPCA
from tests.processes import dkha_in_process
from tests.test_online import SIGMA, a_init_for, paper_steps, sequence

R, SEED, STEPS, NU, ETA0, GAMMA = 4, 3, 60, 1e-3, 0.05, 0.999


@pytest.fixture(scope="module")
def digits90() -> np.ndarray:
    from sklearn.datasets import load_digits

    d = load_digits()
    idx = np.concatenate([np.flatnonzero(d.target == k)[:30] for k in (1, 2, 3)])
    return d.data[idx] / 8.0 - 1.0


def reference(X, algorithm):
    Xs = X[sequence(X, SEED, STEPS)]
    return paper_steps(Xs, algorithm, R, nu=NU, eta0=ETA0, gamma=GAMMA, a_init=a_init_for(SEED, R))


def gram(X):
    from scipy.spatial.distance import cdist

    return np.exp(-cdist(X, X, "sqeuclidean") / (2 * SIGMA**2))


@pytest.mark.parametrize("algorithm", ["on-kha", "oo-kha", "okpca"])
def test_a_named_algorithm_runs_its_update_from_the_first_sample(digits90, algorithm):
    ref = reference(digits90, algorithm)
    assert len(ref["dictionary"]) > 50      # every sample joined: all in the span
    model = OnlineKernelPCA(R, algorithm=algorithm, sigma=SIGMA, eta0=ETA0, gain_decay=GAMMA,
                            nu=NU, steps=STEPS, seed=SEED).fit(digits90)
    np.testing.assert_array_equal(model.dictionary_, ref["dictionary"])
    np.testing.assert_allclose(model.alpha_, ref["alpha"], rtol=1e-8, atol=1e-9)
    assert model.attrs_["algorithm"] == algorithm


def test_dkha_fit_runs_on_kha_by_its_update(digits90, tmp_path):
    store = ingest_array(digits90, str(tmp_path / "d.zarr"))
    run = str(tmp_path / "run")
    ran = dkha_in_process("fit", store.path, "-o", run, "--algorithm", "on-kha", "--components",
                          str(R), "--sigma", str(SIGMA), "--eta0", str(ETA0), "--gain-decay",
                          str(GAMMA), "--nu", str(NU), "--steps", str(STEPS), "--seed",
                          str(SEED), "--quiet")
    assert ran.returncode == 0, ran.stderr
    ds = xr.open_zarr(os.path.join(run, "components.zarr")).load()
    ref = reference(digits90, "on-kha")
    assert ds.attrs["algorithm"] == "on-kha"
    np.testing.assert_array_equal(ds["dictionary"].values, ref["dictionary"])
    np.testing.assert_allclose(ds["alpha"].values, ref["alpha"], rtol=1e-8, atol=1e-9)


def test_auto_is_exact_in_the_span_and_saved_as_auto(digits90, tmp_path):
    model = OnlineKernelPCA(R, sigma=SIGMA, eta0=ETA0, gain_decay=GAMMA, nu=NU, steps=STEPS,
                            seed=SEED).fit(digits90)
    assert model.algorithm == algorithms.AUTO == model.attrs_["algorithm"]
    D = model.dictionary_           # every sample seen (60 distinct ones) joined
    assert len(D) == STEPS
    K = gram(D)
    w, V = np.linalg.eigh(K)
    ref = V[:, ::-1][:, :R] / np.sqrt(w[::-1][:R])       # unit components, dense eigh
    cos = np.abs(np.einsum("ij,jk,ik->i", model.alpha_, K, ref.T))
    np.testing.assert_allclose(cos, 1.0, atol=1e-8)
    model.save(str(tmp_path / "auto"))
    import dkha

    back = dkha.load(str(tmp_path / "auto"))
    assert back.algorithm == algorithms.AUTO and back.solver_.exact is not None


def test_a_run_saved_exact_by_an_older_dkha_loads_as_what_it_meant(digits90, tmp_path):
    """A run saved when ``on-kha`` started exact in the span (its state holds the exact sums)
    loads as ``auto``, which is what it ran, and continues exact."""
    model = OnlineKernelPCA(R, sigma=SIGMA, nu=NU, steps=STEPS, seed=SEED).fit(digits90)
    ds = model.to_dataset()
    ds.attrs["algorithm"] = "on-kha"      # what an older dkha saved for the same run
    import dkha
    from dkha.data.result import load
    from dkha.fit.run_dir import write_run

    write_run(str(tmp_path / "old"), ds, None)
    back = dkha.load(str(tmp_path / "old"))
    assert back.algorithm == algorithms.AUTO and back.attrs_["algorithm"] == algorithms.AUTO
    assert back.solver_.exact is not None
    np.testing.assert_allclose(back.alpha_, model.alpha_, rtol=1e-12, atol=1e-14)
    assert load(str(tmp_path / "old")).attrs["algorithm"] == "on-kha"


def test_online_auto_is_registered_for_the_online_family_only():
    assert algorithms.names(algorithms.ONLINE)[0] == algorithms.AUTO
    assert algorithms.spec(algorithms.AUTO, family=algorithms.ONLINE).exact_span
    assert algorithms.family(algorithms.AUTO) == algorithms.DEFAULT    # dkha fit's auto: batch
    assert not any(algorithms.spec(a).exact_span for a in algorithms.names(algorithms.ONLINE)
                   if a != algorithms.AUTO)
