"""A kernel added from outside dkha (issue 34): the Matérn 3/2 kernel
``k = (1 + √3 r/ℓ) exp(−√3 r/ℓ)``, registered here without a compiled tile, fits, transforms,
saves and loads on a cluster of worker processes, against the dense oracle.

The spec's functions are this module's: a Kernel pickled to a worker names its spec by name and
module (:class:`dkha.kernels.KernelSpec`), and a worker process (spawned with this process's
``sys.path``) imports this module, which registers the spec, the first time it unpickles one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.spatial.distance import cdist, pdist

import dkha
from dkha import KernelSpec, algorithms, config, register_kernel
from dkha.errors import ParameterError
from dkha.kernels import make_kernel, squared_distances
from dkha.kernels.spec import kernel_names, positive, require
from tests.processes import (
    dkha_command,
    local_client,
    start_dask_cluster,
    stop_processes,
    subprocess_env,
)

SQRT3 = np.sqrt(3.0)
R = 6


def matern32_block(kernel, X, Y):
    """``(1 + √3 r/ℓ) exp(−√3 r/ℓ)`` of the rows of ``X`` and ``Y`` (``r = ‖x − y‖``)."""
    d2 = squared_distances(np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64),
                           refine_close=True)
    s = np.sqrt(d2) * (SQRT3 / require(kernel, "length_scale"))
    return (1.0 + s) * np.exp(-s)


MATERN32 = register_kernel(KernelSpec(
    "matern32", {"length_scale": None}, "(1 + √3 r/ℓ) exp(−√3 r/ℓ)",
    checks={"length_scale": positive}, aliases={"matern-3/2": {}},
    block=matern32_block, diagonal=1.0, width="length_scale"))


def oracle_kernel(X, Y, ell):
    """The Matérn kernel by scipy's distances, independent of dkha's."""
    s = SQRT3 * cdist(X, Y) / ell
    return (1.0 + s) * np.exp(-s)


def centered(K):
    l = len(K)
    one = np.ones((l, l)) / l
    return K - one @ K - K @ one + one @ K @ one


def test_the_spec_is_a_kernel_of_dkha():
    """The registered name and alias are dkha kernels: parameters checked, width left to the
    median heuristic, a NumPy block (no compiled tile, so no GPU band passes), diagonal 1."""
    assert "matern32" in kernel_names() and "matern-3/2" in kernel_names()
    k = make_kernel("Matern-3/2", kernel_params={"length_scale": 2})
    assert k.name == "matern32" and k.param_dict == {"length_scale": 2.0}
    assert not k.compiled and k.constant_diagonal() == 1.0 and k.cacheable
    assert make_kernel("matern32").needs_width()
    with pytest.raises(ParameterError, match="length_scale must be a positive number"):
        make_kernel("matern32", kernel_params={"length_scale": -1.0})
    with pytest.raises(ParameterError, match="matern32 kernel takes no parameter sigma"):
        make_kernel("matern32", sigma=1.0)
    with pytest.raises(ParameterError, match="has no compiled tile"):
        k.tile_spec()
    with pytest.raises(ParameterError, match="the kernel name 'matern32' is taken"):
        register_kernel(KernelSpec("matern32", {}, block=len))
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(7, 4)), rng.normal(size=(5, 4))
    np.testing.assert_allclose(k.block(X, Y), oracle_kernel(X, Y, 2.0), rtol=1e-13)
    np.testing.assert_array_equal(k.diagonal(X), np.ones(7))


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes (spawned: they import this module to unpickle the spec)."""
    with local_client(2, 1, processes=True) as client:
        yield client


@pytest.fixture(scope="module")
def fitted(cluster, digits_store, seed, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("matern") / "run")
    model = dkha.KernelHebbianPCA(R, kernel="matern32", seed=seed, client=cluster)
    model.fit(digits_store.path, run_dir=run_dir)
    return model, run_dir


def test_fit_transform_save_load_on_worker_processes(fitted, cluster, digits, seed):
    """The default (exact) fit equals dense eigh of the centered Matérn matrix; new data's
    projections equal the oracle's; the saved run loads and transforms to the same bits."""
    model, run_dir = fitted
    # a worker that unpickled the kernel imported this module (checked by a function pickled
    # by value, which does not import it)
    workers = cluster.run(lambda: __import__("dkha.kernels.spec", fromlist=["kernel_spec"])
                          .kernel_spec("matern32", plugins=False) is not None)
    assert len(workers) == 2 and any(workers.values())
    ell = float(np.median(pdist(digits)))        # the median heuristic, on all 300 rows
    assert model.kernel_.name == "matern32"
    assert model.kernel_["length_scale"] == pytest.approx(ell, rel=1e-12)
    K = oracle_kernel(digits, digits, ell)
    w, V = np.linalg.eigh(centered(K))
    w, V = w[::-1][:R], V[:, ::-1][:, :R]
    np.testing.assert_allclose(model.eigenvalues_, w, rtol=1e-8)
    # alpha_i = v_i / √λ_i up to sign
    cos = np.abs(np.sum(model.alpha_ * V.T, axis=1)) * np.sqrt(w)
    np.testing.assert_allclose(cos, 1.0, rtol=1e-8)
    np.testing.assert_allclose(model.mk_, K.mean(axis=0), rtol=1e-12)

    rng = np.random.default_rng(seed)
    X_new = digits[rng.choice(len(digits), 40, replace=False)] + 0.1 * rng.normal(size=(40, 64))
    Kx = oracle_kernel(X_new, digits, ell)
    Kx_c = Kx - K.mean(axis=0) - Kx.mean(axis=1)[:, None] + K.mean()
    want = Kx_c @ V / np.sqrt(w)
    got = model.transform(X_new)
    signs = np.sign(np.sum(got * want, axis=0))
    np.testing.assert_allclose(got * signs, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())

    loaded = dkha.load(run_dir)
    assert loaded.kernel_ == model.kernel_ and loaded.kernel_.spec is MATERN32
    assert loaded.get_params()["kernel"] == "matern32"
    assert loaded.get_params()["kernel_params"] == {"length_scale": model.kernel_["length_scale"]}
    np.testing.assert_array_equal(loaded.eigenvalues_, model.eigenvalues_)
    np.testing.assert_array_equal(loaded.transform(X_new), got)
    # lazily, on the worker processes
    import dask.array as da

    lazy = loaded.transform(da.from_array(X_new, chunks=(16, 64))).compute()
    np.testing.assert_allclose(lazy, got, rtol=1e-12, atol=1e-12 * np.abs(got).max())


def test_krylov_on_the_row_engine(cluster, digits_store, digits, seed, fitted):
    """The blockwise exact solver (tasks of kernel blocks on the workers, the NumPy block
    instead of a compiled tile) with a set length scale, against the same oracle; with the
    band passes asked for, which take compiled tiles only, it runs the CPU's tile passes."""
    import dask.config

    from dkha.engine.bandpass import wants_bands

    with dask.config.set({"dkha.band-passes": True}):
        workers = sorted(cluster.scheduler_info()["workers"])
        assert wants_bands(make_kernel("gaussian", sigma=1.0), cluster, True) == workers
        assert wants_bands(make_kernel("matern32", length_scale=6.0), cluster, True) is None
        model = dkha.KernelHebbianPCA(R, kernel="matern32", kernel_params={"length_scale": 6.0},
                                      algorithm=algorithms.KRYLOV, seed=seed, client=cluster)
        model.fit(digits_store.path)
    w = np.linalg.eigvalsh(centered(oracle_kernel(digits, digits, 6.0)))[::-1][:R]
    np.testing.assert_allclose(model.eigenvalues_, w, rtol=1e-8)


@pytest.mark.slow
def test_cli_finds_a_kernel_by_its_entry_point(tmp_path, digits_store):
    """``dkha fit --kernel matern32 --kernel-params length_scale=5.5`` in a fresh process: the
    kernel of an installed package's ``dkha.kernels`` entry point (here a dist-info on the path
    naming this module's spec), against dense eigh; an unknown name lists the registered ones."""
    dist = tmp_path / "site" / "dkha_matern-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dkha-matern\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[dkha.kernels]\nmatern32 = test_kernel_registry:MATERN32\n")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), tests_dir, env["PYTHONPATH"]])
    run = str(tmp_path / "run")
    out = subprocess.run(dkha_command("fit", digits_store.path, "-o", run, "--kernel",
                                      "matern32", "--kernel-params", "length_scale=5.5",
                                      "--components", str(R)),
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    model = dkha.load(run)
    assert model.kernel_.name == "matern32" and model.kernel_.spec is MATERN32
    assert model.kernel_.param_dict == {"length_scale": 5.5}
    X = digits_store.read_rows(np.arange(digits_store.n_samples))
    w = np.linalg.eigvalsh(centered(oracle_kernel(X, X, 5.5)))
    np.testing.assert_allclose(model.eigenvalues_, w[::-1][:R], rtol=1e-8)
    bad = subprocess.run(dkha_command("fit", digits_store.path, "-o", str(tmp_path / "other"),
                                      "--kernel", "matern52"),
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode != 0 and "unknown kernel 'matern52'" in bad.stderr
    assert "matern32" in bad.stderr          # the registered kernels are the choices
    bad = subprocess.run(dkha_command("fit", digits_store.path, "-o", str(tmp_path / "other"),
                                      "--kernel", "matern32", "--kernel-params", "length_scale"),
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and "expected NAME=VALUE" in bad.stderr


SCRIPT = '''
import json, sys
import numpy as np
from distributed import Client
import dkha
from dkha.kernels import squared_distances


def block(kernel, X, Y):
    d2 = squared_distances(np.asarray(X, dtype=float), np.asarray(Y, dtype=float))
    return 1.0 / (1.0 + d2 / kernel["scale"] ** 2)


dkha.register_kernel(dkha.KernelSpec("cauchy", {"scale": 1.0}, block=block, diagonal=1.0))

if __name__ == "__main__":
    X = np.load(sys.argv[1])
    with Client(scheduler_file=sys.argv[4]) as client:
        model = dkha.KernelHebbianPCA(int(sys.argv[2]), kernel="cauchy",
                                      kernel_params={"scale": 3.0}, algorithm=sys.argv[3],
                                      client=client).fit(X)
        print(json.dumps(model.eigenvalues_.tolist()))
'''


@pytest.mark.slow
def test_a_kernel_registered_by_a_script_reaches_dask_workers(tmp_path, digits):
    """A spec registered by a script (``__main__``, which a ``dask worker`` process cannot
    import) travels to the workers by value: a Cauchy kernel ``1/(1 + ‖x − y‖²/s²)`` fitted
    on two of them against dense eigh."""
    (tmp_path / "script.py").write_text(SCRIPT)
    np.save(tmp_path / "X.npy", digits)
    _, sched_file, scheduler, workers = start_dask_cluster(str(tmp_path), 2)
    try:
        out = subprocess.run([sys.executable, str(tmp_path / "script.py"),
                              str(tmp_path / "X.npy"), str(R), algorithms.KRYLOV, sched_file],
                             cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                             timeout=300, check=False)
    finally:
        stop_processes([scheduler, *workers])
    assert out.returncode == 0, out.stderr
    K = 1.0 / (1.0 + cdist(digits, digits, "sqeuclidean") / 9.0)
    w = np.linalg.eigvalsh(centered(K))[::-1][:R]
    np.testing.assert_allclose(json.loads(out.stdout.strip().splitlines()[-1]), w, rtol=1e-8)


def test_the_online_estimator_takes_its_parameters(tmp_path, digits):
    """OnlineKernelPCA fits with the registered kernel and its kernel_params, saves and loads
    them (the parameters read back into kernel_params) and transforms to the same bits."""
    model = dkha.OnlineKernelPCA(4, kernel="matern32", kernel_params={"length_scale": 5.5},
                                 seed=1).fit(digits)
    assert model.kernel_.param_dict == {"length_scale": 5.5}
    model.save(str(tmp_path / "run"))
    loaded = dkha.load(str(tmp_path / "run"))
    assert loaded.get_params()["kernel_params"] == {"length_scale": 5.5}
    assert loaded.kernel_ == model.kernel_
    np.testing.assert_array_equal(loaded.transform(digits[:20]), model.transform(digits[:20]))


# --- what sets a kernel apart outside dkha.kernels is a field of its spec (issue 34) ----------


def heat_block(kernel, X, Y):
    """The gaussian ``exp(−‖x − y‖² / (2σ²))`` by NumPy, as a kernel of another name."""
    d2 = squared_distances(np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64))
    return np.exp(d2 / (-2.0 * require(kernel, "sigma") ** 2))


def gram_block(kernel, X, Y):
    """A block of a square kernel matrix whose rows carry their index last."""
    return np.ascontiguousarray(np.asarray(X)[:, np.asarray(Y)[:, -1].astype(np.int64)])


HEAT = register_kernel(KernelSpec(
    "heat", {"sigma": None}, "exp(-||x - y||² / (2 sigma²))", checks={"sigma": positive},
    block=heat_block, diagonal=1.0, width="sigma", widen_on_patches=True,
    gaussian_width="sigma"))
GRAM = register_kernel(KernelSpec("gram", {}, "K[x, y]", block=gram_block, pairwise=True))


def test_a_registered_kernel_takes_the_gaussians_behaviour_from_its_spec(digits, seed):
    """The patch width, the fixed-point and gradient pre-images and scikit-learn's ``gamma_``
    follow the spec's fields, not the name ``gaussian``: a gaussian registered as ``heat``
    gets them (the gaussian's values), the Matérn kernel, without them, does not."""
    from types import SimpleNamespace

    from dkha.apply.preimage import check_method, default_method, preimages
    from dkha.estimators.sklearn_view import sklearn_gamma
    from dkha.fit.coordinator import resolve_kernel
    from dkha.kernels import median_distance

    X = np.asarray(digits[:120], dtype=np.float64)
    patches = SimpleNamespace(n_features=X.shape[1], attrs={"patch": [8, 8]},
                              sample=lambda n, s: X)
    median = median_distance(X)
    assert resolve_kernel(patches, "heat", seed, config.settings())["sigma"] == 3.0 * median
    assert resolve_kernel(patches, "gaussian", seed, config.settings())["sigma"] == 3.0 * median
    assert resolve_kernel(patches, "matern32", seed, config.settings())["length_scale"] == median

    heat, gaussian = make_kernel("heat", sigma=2.5), make_kernel("gaussian", sigma=2.5)
    matern = make_kernel("matern32", length_scale=2.5)
    assert default_method(heat) == "fixed-point" and default_method(matern) == "conformal"
    assert check_method("gradient", heat) == "gradient"
    with pytest.raises(ParameterError, match="needs a gaussian kernel"):
        check_method("fixed-point", matern)
    # the fixed point of heat is the gaussian's (the oracle: the built-in's compiled tile)
    K = centered(gaussian.block(X, X))
    w, V = np.linalg.eigh(K)
    alpha = (V[:, ::-1][:, :5] / np.sqrt(w[::-1][:5])).T
    y = (alpha @ K)[:, :10].T
    got = [preimages(X, k, alpha, y, X[:10], iterations=20).Z for k in (heat, gaussian)]
    np.testing.assert_allclose(got[0], got[1], rtol=1e-9, atol=1e-12)

    def gamma_(name, kernel):
        return sklearn_gamma(SimpleNamespace(kernel=name, kernel_=kernel, gamma=None,
                                             n_features_in_=64))
    assert gamma_("heat", heat) == 0.5 / 2.5**2 == gamma_("gaussian", gaussian)
    assert gamma_("matern32", matern) == 1 / 64
    assert gamma_("rbf", make_kernel("rbf").with_defaults(64)) == 1 / 64


def test_a_registered_pairwise_kernel_takes_the_kernel_matrix(digits, seed):
    """A spec with ``pairwise`` is fitted from the square kernel matrix as ``precomputed`` is
    (same projections), and refused where ``precomputed`` is."""
    from dkha.estimators.batch import KernelHebbianPCA
    from dkha.estimators.online import OnlineKernelPCA

    X = np.asarray(digits[:150], dtype=np.float64)
    K = make_kernel("gaussian", sigma=3.0).block(X, X)
    fits = [KernelHebbianPCA(4, kernel=name, seed=seed).fit(K) for name in ("gram", "precomputed")]
    assert fits[0].__sklearn_tags__().input_tags.pairwise
    np.testing.assert_allclose(np.abs(fits[0].transform(K[:20])),
                               np.abs(fits[1].transform(K[:20])), rtol=1e-9, atol=1e-9)
    lam = np.linalg.eigvalsh(centered(K))[::-1][:4] / len(K)
    np.testing.assert_allclose(np.sort(fits[0].eigenvalues_)[::-1] / len(K), lam, rtol=1e-6)
    with pytest.raises(ParameterError, match="precomputed"):
        KernelHebbianPCA(4, kernel="gram", fit_inverse_transform=True).fit(K)
    with pytest.raises(ParameterError, match="cannot take a precomputed"):
        OnlineKernelPCA(4, kernel="gram").fit(K)
