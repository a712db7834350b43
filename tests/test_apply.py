"""Applications: pre-images, denoising, spectral clustering and the variation of information.

Oracles: ordinary (linear) PCA for the expansion's centering terms, scipy.optimize over ``z`` for
the fixed-point pre-image, direct entropy sums for VI, dense kernel PCA for the projections.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest
import xarray as xr
from scipy.optimize import minimize
from scipy.spatial.distance import cdist

from dkha import KernelHebbianPCA, result
from dkha.apply import clustering, denoise, preimage
from dkha.apply.cli import COMMANDS, add_parsers
from dkha.errors import InputError, ParameterError
from dkha.kernels import make_kernel
from dkha.store import extract_patches, ingest_array, ingest_images


def gauss(X, Y, sigma):
    """The gaussian kernel matrix by scipy's distances (not dkha's kernels)."""
    return np.exp(-cdist(X, Y, "sqeuclidean") / (2.0 * sigma**2))


def exact_kpca(X, sigma, r):
    """Orthonormal components (alpha = u/√λ), mk, mkm and K of a gaussian kernel, densely."""
    K = gauss(X, X, sigma)
    mk = K.mean(axis=0)
    mkm = mk.mean()
    Kc = K - mk[None, :] - mk[:, None] + mkm
    w, V = np.linalg.eigh(Kc)
    w, V = w[::-1][:r], V[:, ::-1][:, :r]
    return (V / np.sqrt(w)).T, mk, mkm, K, Kc


def project_dense(Xnew, X, sigma, alpha, mk, mkm):
    k = gauss(Xnew, X, sigma)
    return (k - mk[None, :] - k.mean(axis=1)[:, None] + mkm) @ alpha.T


@pytest.fixture(scope="module")
def ring(seed):
    """60 points on a noisy circle, and 6 noisy test points near it."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, 60)
    X = np.c_[np.cos(t), np.sin(t)] + 0.1 * rng.normal(size=(60, 2))
    Xn = X[:6] + 0.25 * rng.normal(size=(6, 2))
    return X, Xn


# --- the expansion and the pre-image ------------------------------------------------------------


def test_expansion_matches_linear_pca(seed):
    """With the linear kernel Φ(x) = x: Σ_j γ_j x_j must equal ordinary PCA's m + V Vᵀ (x − m)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(30, 5)) * np.array([3.0, 2.0, 1.0, 0.5, 0.1])
    Xn = rng.normal(size=(4, 5))
    r = 2
    m = X.mean(axis=0)
    Xc = X - m
    K = X @ X.T
    mk = K.mean(axis=0)
    Kc = K - mk[None, :] - mk[:, None] + mk.mean()
    w, U = np.linalg.eigh(Kc)
    alpha = (U[:, ::-1][:, :r] / np.sqrt(w[::-1][:r])).T
    kn = Xn @ X.T
    beta = (kn - mk[None, :] - kn.mean(axis=1)[:, None] + mk.mean()) @ alpha.T
    gamma = preimage.expansion(alpha, beta).dense(alpha)
    V = np.linalg.svd(Xc, full_matrices=False)[2][:r].T  # principal directions
    expected = m + (Xn - m) @ V @ V.T
    np.testing.assert_allclose(gamma @ X, expected, atol=1e-10)
    # the centering terms make γ sum to one: the mean is reproduced exactly
    np.testing.assert_allclose(gamma.sum(axis=1), 1.0, atol=1e-12)


def test_expansion_gram_makes_projection_basis_free(ring, seed):
    """Mixed, unnormalised components with their Gram matrix give the orthogonal projection."""
    X, Xn = ring
    alpha, mk, mkm, _, Kc = exact_kpca(X, 0.7, 4)
    beta = project_dense(Xn, X, 0.7, alpha, mk, mkm)
    M = np.random.default_rng(seed).normal(size=(4, 4)) + 3 * np.eye(4)
    alpha2 = M @ alpha
    beta2 = project_dense(Xn, X, 0.7, alpha2, mk, mkm)
    gram = alpha2 @ Kc @ alpha2.T
    g1 = preimage.expansion(alpha, beta).dense(alpha)
    g2 = preimage.expansion(alpha2, beta2, gram=gram).dense(alpha2)
    np.testing.assert_allclose(g2, g1, atol=1e-9)
    assert not np.allclose(preimage.expansion(alpha2, beta2).dense(alpha2), g1, atol=1e-3)


def test_fixed_point_matches_brute_force_minimisation(ring):
    """The fixed point is the minimiser of ‖PΦ(x) − Φ(z)‖² found by scipy from the same start."""
    X, Xn = ring
    sigma = 0.7
    alpha, mk, mkm, K, _ = exact_kpca(X, sigma, 4)
    beta = project_dense(Xn, X, sigma, alpha, mk, mkm)
    kernel = make_kernel("gaussian", sigma=sigma)
    res = preimage.preimages(X, kernel, alpha, beta, Xn, iterations=1000, tol=1e-12, block=7)
    assert res.converged.all() and not res.undefined.any()
    gamma = preimage.expansion(alpha, beta).dense(alpha)
    for i in range(len(Xn)):
        def distance2(z, g=gamma[i]):
            # ‖Σ_j γ_j Φ(x_j) − Φ(z)‖² with the oracle kernel, k(z, z) = 1
            kz = gauss(z[None, :], X, sigma)[0]
            return g @ K @ g - 2.0 * g @ kz + 1.0

        opt = minimize(distance2, Xn[i], method="Nelder-Mead",
                       options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 5000})
        np.testing.assert_allclose(res.Z[i], opt.x, atol=1e-5)
        assert distance2(res.Z[i]) <= opt.fun + 1e-12
        # the reported agreement is ⟨PΦ(x), Φ(z)⟩
        kz = gauss(res.Z[i][None, :], X, sigma)[0]
        np.testing.assert_allclose(res.agreement[i], gamma[i] @ kz, rtol=1e-8)


def test_fixed_point_blocks_do_not_matter(ring):
    X, Xn = ring
    alpha, mk, mkm, _, _ = exact_kpca(X, 0.7, 4)
    beta = project_dense(Xn, X, 0.7, alpha, mk, mkm)
    kernel = make_kernel("gaussian", sigma=0.7)
    a = preimage.preimages(X, kernel, alpha, beta, Xn, iterations=30, block=1000)
    b = preimage.preimages(X, kernel, alpha, beta, Xn, iterations=30, block=11)
    np.testing.assert_allclose(a.Z, b.Z, atol=1e-12)


def test_preimage_needs_gaussian_kernel(ring):
    X, Xn = ring
    alpha, mk, mkm, _, _ = exact_kpca(X, 0.7, 2)
    with pytest.raises(ParameterError, match="gaussian"):
        preimage.preimages(X, make_kernel("laplacian", sigma=1.0), alpha, np.zeros((6, 2)), Xn)
    with pytest.raises(InputError, match="components"):
        preimage.expansion(alpha, np.zeros((6, 3)))
    with pytest.raises(ParameterError, match="iterations"):
        preimage.fixed_point(lambda Z, e: None, preimage.expansion(alpha, np.zeros((6, 2))), Xn,
                             iterations=-1)


# --- denoising ----------------------------------------------------------------------------------


def test_patch_positions_cover_the_image():
    np.testing.assert_array_equal(denoise.patch_positions(15, 11, 2), [0, 2, 4])
    np.testing.assert_array_equal(denoise.patch_positions(16, 11, 2), [0, 2, 4, 5])
    np.testing.assert_array_equal(denoise.patch_positions(11, 11, 3), [0])
    with pytest.raises(InputError, match="smaller"):
        denoise.patch_positions(10, 11, 2)


def test_snr_formula():
    clean = np.array([[1.0, 2.0], [3.0, 4.0]])
    x = clean + np.array([[0.1, -0.1], [0.0, 0.2]])
    assert denoise.snr(clean, x) == pytest.approx(10 * np.log10(30.0 / 0.06))
    assert denoise.snr(clean, clean) == np.inf


@pytest.fixture(scope="module")
def photo(seed):
    """A 44×44 piece of the camera photograph, the same plus gaussian noise σ = 0.1 (clipped to
    [0, 1], as a saved photograph would be, so reading it back does not rescale it)."""
    from skimage.transform import resize

    from dkha.store import read_grey_image

    camera = resize(read_grey_image("skimage:camera"), (256, 256), anti_aliasing=True)
    clean = camera[70:114, 100:144]
    noisy = np.clip(clean + 0.1 * np.random.default_rng(seed).normal(size=clean.shape), 0, 1)
    return clean, noisy.astype(np.float32).astype(np.float64)


@pytest.fixture(scope="module")
def photo_run(photo, client, tmp_path_factory):
    """KHA-SMD (r = 20, 10 passes, σ = 2× the median patch distance) on the noisy patches.

    On these 289 patches exact kernel PCA denoises from 13.6 to 17.8 dB; the default gains leave
    20 components far from converged after 10 passes (excess error ~1), η0 = μ = 1 reach 7e-2.
    """
    from skimage.io import imsave

    from dkha.kernels import median_distance

    _, noisy = photo
    base = tmp_path_factory.mktemp("photo")
    tif = str(base / "noisy.tif")
    imsave(tif, noisy.astype(np.float32), check_contrast=False)
    store = ingest_images([tif], base / "noisy.zarr", patch=11, step=2, chunk_rows=128)
    sigma = 2.0 * median_distance(store.read())
    run_dir = str(base / "run")
    KernelHebbianPCA(20, algorithm="kha-smd", sigma=sigma, passes=10, eta0=1.0, mu=1.0, seed=0,
                     client=client, evaluate_every=-1).fit(store.path, run_dir=run_dir)
    return run_dir, tif, store


def test_denoise_raises_snr(photo, photo_run, client):
    clean, noisy = photo
    run_dir, _, store = photo_run
    res = denoise.denoise_image(run_dir, noisy, reference=clean, client=client, block=150)
    assert res.image.shape == noisy.shape
    assert res.n_patches == len(denoise.patch_positions(44, 11, 2)) ** 2 == 18 ** 2
    assert res.converged == res.n_patches and res.undefined == 0
    assert res.snr_noisy == pytest.approx(denoise.snr(clean, noisy), abs=1e-4)
    assert res.snr_denoised > res.snr_noisy + 3.0
    # the engine path (blocks of patches, sums on the workers) agrees with the in-memory one
    ds = result.load(run_dir)
    P = extract_patches(res.noisy, 11, 2)[:20]
    from dkha.transform import project

    beta = project(ds, P, client=client)
    ref = preimage.preimages(store.read(), make_kernel("gaussian", **ds.attrs["kernel_parameters"]),
                             ds["alpha"].values, beta, P, block=50)
    res2 = denoise.denoise_image(ds, res.noisy, client=client, block=7)
    assert res2.snr_noisy is None
    np.testing.assert_allclose(res2.image, res.image, atol=1e-8)
    # top-left patch position: rebuild the pixel (0, 0), covered by that patch only
    assert res.image[0, 0] == pytest.approx(np.clip(ref.Z[0, 0], 0, 1), abs=1e-6)


def test_denoise_refuses_bad_runs(photo, client, tmp_path):
    _, noisy = photo
    X = extract_patches(noisy, 11, 2)[:60]
    st = ingest_array(X, tmp_path / "arr.zarr")
    KernelHebbianPCA(2, algorithm="kha", sigma=3.0, passes=1, client=client,
                     evaluate_every=-1).fit(st.path, run_dir=str(tmp_path / "arr_run"))
    with pytest.raises(InputError, match="patch"):
        denoise.denoise_image(str(tmp_path / "arr_run"), noisy, client=client)
    KernelHebbianPCA(2, algorithm="kha", kernel="laplacian", sigma=3.0, passes=1, client=client,
                     evaluate_every=-1).fit(st.path, run_dir=str(tmp_path / "lap_run"))
    with pytest.raises(ParameterError, match="gaussian"):
        denoise.denoise_image(str(tmp_path / "lap_run"), noisy, client=client)


# --- variation of information and clustering ----------------------------------------------------


def vi_direct(a, b):
    """H(X|Y) + H(Y|X) by explicit sums over the conditional distributions."""
    a, b = np.asarray(a), np.asarray(b)
    n = len(a)

    def cond(x, y):
        h = 0.0
        for v in np.unique(y):
            sel = y == v
            p_y = sel.sum() / n
            _, counts = np.unique(x[sel], return_counts=True)
            q = counts / counts.sum()
            h -= p_y * np.sum(q * np.log(q))
        return h

    return cond(a, b) + cond(b, a)


def test_variation_of_information(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 5, 200)
    b = (a + (rng.random(200) < 0.3) * rng.integers(0, 5, 200)) % 7
    assert clustering.variation_of_information(a, b) == pytest.approx(vi_direct(a, b), rel=1e-12)
    assert clustering.variation_of_information(a, b) == pytest.approx(
        clustering.variation_of_information(b, a), rel=1e-12)
    # identical partitions under renaming: 0
    renamed = (3 * a + 11) % 17
    assert clustering.variation_of_information(a, renamed) == pytest.approx(0.0, abs=1e-12)
    # independent partitions (a product design): H(X) + H(Y)
    i = np.arange(60)
    x, y = i // 12, i % 12
    assert clustering.variation_of_information(x, y) == pytest.approx(np.log(5) + np.log(12))
    assert clustering.entropy(x) == pytest.approx(np.log(5))
    # one cluster against two halves: ln 2
    vi = clustering.variation_of_information([0, 0, 1, 1], [7, 7, 7, 7])
    assert vi == pytest.approx(np.log(2))
    with pytest.raises(InputError):
        clustering.variation_of_information([0, 1], [0, 1, 2])


@pytest.fixture(scope="module")
def blobs_run(client, seed, tmp_path_factory):
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n_samples=150, centers=3, n_features=4, cluster_std=0.5,
                      center_box=(-8, 8), random_state=seed % 2**31)
    base = tmp_path_factory.mktemp("blobs")
    st = ingest_array(X, base / "blobs.zarr", labels=y, chunk_rows=64)
    run_dir = str(base / "run")
    KernelHebbianPCA(3, algorithm="kha-smd", sigma=3.0, passes=10, seed=0, client=client,
                     evaluate_every=-1).fit(st.path, run_dir=run_dir)
    return run_dir, X, y


def test_spectral_clustering_recovers_blobs(blobs_run, client):
    run_dir, X, y = blobs_run
    res = clustering.cluster_run(run_dir, 3, client=client)
    assert res.vi == pytest.approx(0.0, abs=1e-12)
    assert res.vi_random > 1.5  # two balanced 3-way labellings, independent: about 2 ln 3
    assert res.entropy_labels == pytest.approx(np.log(3), abs=0.01)
    # the same from exact kernel PCA
    alpha, mk, mkm, _, Kc = exact_kpca(X, 3.0, 3)
    clusters = clustering.spectral_clustering((alpha @ Kc).T, 3, seed=1)
    assert clustering.variation_of_information(y, clusters) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ParameterError):
        clustering.spectral_clustering((alpha @ Kc).T, 3, scale="nonsense")


def test_spectral_embedding_rows_are_unit():
    Y = clustering.spectral_embedding(np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]]))
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), [1.0, 0.0, 1.0])


# --- the commands -------------------------------------------------------------------------------


def run_command(argv):
    parser = argparse.ArgumentParser(prog="dkha")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return COMMANDS[args.command](args)


def test_cluster_command(blobs_run, tmp_path, capsys):
    run_dir, _, y = blobs_run
    out = str(tmp_path / "labels.zarr")
    assert run_command(["cluster", run_dir, "--k", "3", "-o", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["vi"] == pytest.approx(0.0, abs=1e-12) and summary["vi_random"] > 1.5
    ds = xr.open_zarr(out, consolidated=False)
    assert ds["cluster"].dims == ("sample",) and ds.sizes["sample"] == len(y)
    vi = clustering.variation_of_information(ds["cluster"].values, y)
    assert vi == pytest.approx(0.0, abs=1e-12)
    from dkha.errors import RunDirectoryError

    with pytest.raises(RunDirectoryError):
        run_command(["cluster", run_dir, "--k", "3", "-o", out])


def test_denoise_command(photo, photo_run, tmp_path, capsys):
    from skimage.io import imsave

    clean, _ = photo
    run_dir, tif, _ = photo_run
    ref = str(tmp_path / "clean.tif")
    imsave(ref, clean.astype(np.float32), check_contrast=False)
    out = str(tmp_path / "clean_out.png")
    assert run_command(["denoise", run_dir, tif, "-o", out, "--reference", ref, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["snr_denoised"] > summary["snr_noisy"] + 3.0
    assert os.path.exists(out)
    from dkha.store import read_grey_image

    assert read_grey_image(out).shape == clean.shape
