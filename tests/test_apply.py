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

from dkha import KernelHebbianPCA
from dkha.apply import clustering, denoise, preimage
from dkha.cli.apply import COMMANDS
from dkha.cli.parser import add_apply_parsers
from dkha.data import result
from dkha.data.ingest import ingest_array, ingest_images
from dkha.data.patches import extract_patches
from dkha.errors import InputError, ParameterError
from dkha.kernels import make_kernel


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


def brute_force_preimage(gamma, X, K, sigma, start):
    """argmin_z ‖Σ_j γ_j Φ(x_j) − Φ(z)‖² by Nelder–Mead from every x_j and from ``start``."""
    def distance2(z):
        return gamma @ K @ gamma - 2.0 * gamma @ gauss(z[None, :], X, sigma)[0] + 1.0

    best = min((minimize(distance2, z0, method="Nelder-Mead",
                         options={"xatol": 1e-11, "fatol": 1e-15, "maxiter": 5000})
                for z0 in np.vstack([X, start[None, :]])), key=lambda o: o.fun)
    return best.x, distance2


# Tolerances of the pre-image methods against the brute-force minimiser (ring of radius 1,
# σ = 0.7, r = 4, test points 0.25 off the ring): fixed point and gradient ascent converge to the
# minimiser itself (measured 1e-8, asserted 1e-6); the conformal map is a one-shot linear solve,
# not a minimiser: measured within 0.10 = 0.15σ of it, asserted 0.2σ, and on average nearer to
# PΦ(x) in feature space than the noisy input.
EXACT_TOL = 1e-6
CONFORMAL_TOL = 0.2


def test_three_preimage_methods_agree_with_brute_force(ring):
    X, Xn = ring
    X, Xn = X + 2.0, Xn + 2.0  # in the positive quadrant: the non-negativity is inactive
    sigma = 0.7
    alpha, mk, mkm, K, _ = exact_kpca(X, sigma, 4)
    beta = project_dense(Xn, X, sigma, alpha, mk, mkm)
    kernel = make_kernel("gaussian", sigma=sigma)
    gamma = preimage.expansion(alpha, beta).dense(alpha)
    got = {name: preimage.preimages(X, kernel, alpha, beta, Xn, method=m, iterations=2000,
                                    tol=1e-10, **kw)
           for name, m, kw in [("fixed-point", "fixed-point", {}), ("gradient", "gradient", {}),
                               ("nonnegative", "gradient", {"nonnegative": True}),
                               ("conformal", "conformal", {})]}
    for name in ("fixed-point", "gradient", "nonnegative"):
        assert got[name].converged.all(), name
    # the conformal map by the paper's linear system X_mᵀ z = P_m γ (η = 0), least squares
    np.testing.assert_allclose(got["conformal"].Z,
                               np.linalg.lstsq(X, X @ X.T @ gamma.T, rcond=None)[0].T, atol=1e-10)
    d_conf, d_noisy = [], []
    for i in range(len(Xn)):
        z_bf, distance2 = brute_force_preimage(gamma[i], X, K, sigma, Xn[i])
        for name in ("fixed-point", "gradient", "nonnegative"):
            np.testing.assert_allclose(got[name].Z[i], z_bf, atol=EXACT_TOL, err_msg=name)
        assert np.linalg.norm(got["conformal"].Z[i] - z_bf) <= CONFORMAL_TOL * sigma
        d_conf.append(distance2(got["conformal"].Z[i]))
        d_noisy.append(distance2(Xn[i]))
        # agreement ⟨PΦ(x), Φ(z)⟩ reported by the gradient method
        kz = gauss(got["gradient"].Z[i][None, :], X, sigma)[0]
        assert got["gradient"].agreement[i] == pytest.approx(gamma[i] @ kz, rel=1e-8)
    assert np.mean(d_conf) < np.mean(d_noisy)  # the rough pre-image is still a better one
    # a fixed step without line search (Honeine's experiments) moves towards the minimiser
    one = preimage.preimages(X, kernel, alpha, beta, Xn, method="gradient", step=0.5,
                             iterations=1)
    assert one.iterations == 1
    assert np.all(np.linalg.norm(one.Z - got["fixed-point"].Z, axis=1)
                  < np.linalg.norm(Xn - got["fixed-point"].Z, axis=1))


def test_nonnegative_gradient_keeps_pixels_non_negative(ring):
    X, Xn = ring  # around the origin: the unconstrained minimisers have negative coordinates
    alpha, mk, mkm, _, _ = exact_kpca(X, 0.7, 4)
    beta = project_dense(Xn, X, 0.7, alpha, mk, mkm)
    kernel = make_kernel("gaussian", sigma=0.7)
    free = preimage.preimages(X, kernel, alpha, beta, Xn, method="gradient")
    pos = preimage.preimages(X, kernel, alpha, beta, Xn, method="gradient", nonnegative=True)
    assert (free.Z < -0.1).any() and (pos.Z >= 0).all()
    # where the start was positive and the free minimiser too, they agree
    both = (Xn > 0).all(axis=1) & (free.Z > 0).all(axis=1)
    assert both.any()
    np.testing.assert_allclose(pos.Z[both], free.Z[both], atol=1e-5)


def test_dictionary_preimages(ring, seed):
    """Reduced-order pre-images (Honeine eq. 22) of an online run: fixed point and gradient
    equal the brute-force minimiser of ‖γᵀΦ(D) − Φ(z)‖² with γ = Aᵀ G⁻¹ y + β̄ written out;
    the conformal map with η equals the paper's linear system solved by lstsq."""
    from dkha.estimators.online import OnlineKernelPCA

    X, Xn = ring
    sigma = 0.7
    model = OnlineKernelPCA(4, sigma=sigma, steps=3000, center=True, nu=0.05, seed=0,
                            eta0=0.2).fit(X)
    ds = model.to_dataset()
    ds.attrs["store"] = "<array>"
    D, A, bbar = ds["dictionary"].values, ds["alpha"].values, ds["mean_coefficient"].values
    Km = gauss(D, D, sigma)
    y = (gauss(Xn, D, sigma) - Km @ bbar) @ A.T
    gamma = np.linalg.solve(A @ Km @ A.T, y.T).T @ A + bbar
    res = {m: preimage.RunPreimages(ds, None, method=m, iterations=2000, tol=1e-10)(Xn)
           for m in ("fixed-point", "gradient")}
    for i in range(len(Xn)):
        z_bf, _ = brute_force_preimage(gamma[i], D, Km, sigma, Xn[i])
        for m in res:
            np.testing.assert_allclose(res[m].Z[i], z_bf, atol=EXACT_TOL, err_msg=m)
    eta = 1e-3
    conf = preimage.RunPreimages(ds, None, method="conformal", eta=eta)(Xn)
    rhs = (D @ D.T - eta * np.linalg.inv(Km)) @ gamma.T
    np.testing.assert_allclose(conf.Z, np.linalg.lstsq(D, rhs, rcond=None)[0].T, atol=1e-8)


def test_fixed_point_blocks_do_not_matter(ring):
    X, Xn = ring
    alpha, mk, mkm, _, _ = exact_kpca(X, 0.7, 4)
    beta = project_dense(Xn, X, 0.7, alpha, mk, mkm)
    kernel = make_kernel("gaussian", sigma=0.7)
    a = preimage.preimages(X, kernel, alpha, beta, Xn, iterations=30, block=1000)
    b = preimage.preimages(X, kernel, alpha, beta, Xn, iterations=30, block=11)
    np.testing.assert_allclose(a.Z, b.Z, atol=1e-12)


def test_preimage_methods_refuse_kernels_and_options_they_do_not_take(ring):
    X, Xn = ring
    alpha, _mk, _mkm, _, _ = exact_kpca(X, 0.7, 2)
    lap = make_kernel("laplacian", sigma=1.0)
    for method in ("fixed-point", "gradient"):
        with pytest.raises(ParameterError, match=f"{method} pre-image .* needs a gaussian kernel; "
                                                 "this run used laplacian"):
            preimage.preimages(X, lap, alpha, np.zeros((6, 2)), Xn, method=method)
    # the conformal map applies to any kernel, and is the default where the others do not
    assert preimage.check_method(None, lap) == "conformal"
    res = preimage.preimages(X, lap, alpha, np.zeros((6, 2)), Xn)
    np.testing.assert_allclose(res.Z, np.broadcast_to(X.mean(axis=0), Xn.shape), atol=1e-12)
    gauss_k = make_kernel("gaussian", sigma=0.7)
    assert preimage.check_method(None, gauss_k) == "fixed-point"
    with pytest.raises(ParameterError, match="unknown pre-image method 'newton'"):
        preimage.check_method("newton", gauss_k)
    with pytest.raises(ParameterError, match="--eta applies to the conformal"):
        preimage.preimages(X, gauss_k, alpha, np.zeros((6, 2)), Xn, eta=1.0)
    with pytest.raises(ParameterError, match="--step and --nonnegative apply to the gradient"):
        preimage.preimages(X, gauss_k, alpha, np.zeros((6, 2)), Xn, nonnegative=True)
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

    from dkha.data.patches import read_grey_image

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
    from skimage.metrics import peak_signal_noise_ratio

    assert res.data_range == 1.0
    assert res.psnr_noisy == pytest.approx(peak_signal_noise_ratio(clean, noisy, data_range=1),
                                           rel=1e-12)
    assert res.psnr_denoised == pytest.approx(
        peak_signal_noise_ratio(clean, res.image, data_range=1), rel=1e-12)
    assert res.snr_denoised > res.snr_noisy + 3.0
    # the engine path (blocks of patches, sums on the workers) agrees with the in-memory one
    ds = result.load(run_dir)
    P = extract_patches(res.noisy, 11, 2)[:20]
    from dkha.runs.transform import project

    beta = project(ds, P, client=client)
    ref = preimage.preimages(store.read(), make_kernel("gaussian", **ds.attrs["kernel_parameters"]),
                             ds["alpha"].values, beta, P, block=50)
    res2 = denoise.denoise_image(ds, res.noisy, client=client, block=7)
    assert res2.snr_noisy is None
    np.testing.assert_allclose(res2.image, res.image, atol=1e-8)
    # top-left patch position: rebuild the pixel (0, 0), covered by that patch only
    assert res.image[0, 0] == pytest.approx(np.clip(ref.Z[0, 0], 0, 1), abs=1e-6)


def test_run_preimages_on_the_cluster_match_in_memory(photo, photo_run, client):
    """Conformal (moments on the workers) and gradient (sums on the workers) through a batch
    run's store equal the in-memory pre-images; the image denoises with each method."""
    clean, noisy = photo
    run_dir, _, store = photo_run
    ds = result.load(run_dir)
    P = extract_patches(noisy, 11, 2)[:25]
    from dkha.runs.transform import project

    beta = project(ds, P, client=client)
    kernel = make_kernel("gaussian", **ds.attrs["kernel_parameters"])
    for method in ("conformal", "gradient"):
        got = preimage.RunPreimages(ds, client, method=method)(P)
        ref = preimage.preimages(store.read(), kernel, ds["alpha"].values, beta, P,
                                 method=method, block=50)
        np.testing.assert_allclose(got.Z, ref.Z, atol=1e-8, err_msg=method)
        res = denoise.denoise_image(run_dir, noisy, reference=clean, client=client,
                                    method=method)
        assert res.method == method and res.snr_denoised > res.snr_noisy + 1.0, method
    with pytest.raises(ParameterError, match="eta > 0 needs K_m"):
        preimage.RunPreimages(ds, client, method="conformal", eta=1.0)


def test_superresolve(photo, photo_run, client, tmp_path, capsys):
    """×2 from a 22×22 block-mean image: the windows of the replicated image mapped back by the
    in-memory fixed point (pixel (0, 0) is covered by the first window only); PSNR by its
    formula; the command writes a 44×44 image."""
    from dkha.apply import superresolve as sr

    clean, _ = photo
    run_dir, _, store = photo_run
    low = sr.downscale(clean, 2)
    np.testing.assert_allclose(low[0, 0], clean[:2, :2].mean())
    up = sr.upscale(low, 2)
    np.testing.assert_array_equal(up[:2, :2], np.full((2, 2), low[0, 0]))
    res = sr.superresolve(run_dir, low, factor=2, reference=clean, client=client, block=100)
    assert res.image.shape == clean.shape and res.converged == res.n_patches == 18**2
    assert res.psnr_upscaled == pytest.approx(-10 * np.log10(np.mean((clean - up) ** 2)))
    ds = result.load(run_dir)
    from dkha.runs.transform import project

    P = up[:11, :11].reshape(1, -1)
    ref = preimage.preimages(store.read(), make_kernel("gaussian", **ds.attrs["kernel_parameters"]),
                             ds["alpha"].values, project(ds, P, client=client), P)
    assert res.image[0, 0] == pytest.approx(np.clip(ref.Z[0, 0], 0, 1), abs=1e-6)
    bil = sr.superresolve(run_dir, low, factor=2, upscaling="bilinear", step=3, client=client)
    assert bil.step == 3 and bil.psnr is None and bil.image.shape == clean.shape
    from skimage.io import imsave

    out = str(tmp_path / "high.npy")
    imsave(tmp_path / "low.tif", low.astype(np.float32), check_contrast=False)
    assert run_command(["superresolve", run_dir, str(tmp_path / "low.tif"), "--factor", "2",
                        "-o", out, "--json", "--workers", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "fixed-point" and summary["factor"] == 2
    np.testing.assert_allclose(np.load(out), res.image, atol=1e-5)  # input saved as float32
    with pytest.raises(ParameterError, match="unknown upscaling"):
        sr.superresolve(run_dir, low, factor=2, upscaling="nearest", client=client)


def test_denoise_store_of_vectors(client, tmp_path, seed, capsys):
    """A store of noisy vectors denoised blockwise (one task per chunk) equals the in-memory
    pre-images of each sample, for a batch run and for a dictionary run; the command dispatches
    on a store and prints the MSE before and after."""
    from dkha.estimators.online import OnlineKernelPCA

    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    t = rng.uniform(0, 2 * np.pi, 210)
    clean = np.c_[np.cos(t), np.sin(t)] @ Q.T
    noisy = clean + 0.1 * rng.standard_normal(clean.shape)
    train = ingest_array(noisy[:150], tmp_path / "train.zarr", chunk_rows=40)
    ingest_array(noisy[150:], tmp_path / "noisy.zarr", chunk_rows=25, labels=np.arange(60))
    ingest_array(clean[150:], tmp_path / "clean.zarr", chunk_rows=25)
    sigma = 1.0
    alpha, mk, mkm, _, _ = exact_kpca(noisy[:150], sigma, 4)
    ds = result.build_dataset(alpha, np.zeros(4), [], {
        "algorithm": "exact", "kernel": "gaussian", "kernel_parameters": {"sigma": sigma},
        "store": str(train.path), "n_samples": 150, "n_features": 6}, mk=mk, mkm=mkm)
    run_dir = str(tmp_path / "run")
    result.save(ds, run_dir)
    out = str(tmp_path / "den.zarr")
    summary = denoise.denoise_store(run_dir, str(tmp_path / "noisy.zarr"), out, client=client)
    assert summary["chunks"] == 3 and summary["method"] == "fixed-point"
    got = xr.open_zarr(out)
    beta = project_dense(noisy[150:], noisy[:150], sigma, alpha, mk, mkm)
    kernel = make_kernel("gaussian", sigma=sigma)
    ref = preimage.preimages(noisy[:150], kernel, alpha, beta, noisy[150:])
    np.testing.assert_allclose(got["X"].values, ref.Z, atol=1e-8)
    np.testing.assert_array_equal(got["label"].values, np.arange(60))
    assert denoise.store_mse(str(tmp_path / "clean.zarr"), out) < 0.5 * np.mean(
        (noisy[150:] - clean[150:]) ** 2)
    conf = denoise.denoise_store(run_dir, str(tmp_path / "noisy.zarr"), out, client=client,
                                 method="conformal", overwrite=True)
    assert conf["method"] == "conformal"
    np.testing.assert_allclose(xr.open_zarr(out)["X"].values,
                               preimage.preimages(noisy[:150], kernel, alpha, beta, noisy[150:],
                                                  method="conformal").Z, atol=1e-10)
    # a dictionary run: the tasks rebuild RunPreimages from the small dataset
    OnlineKernelPCA(3, sigma=sigma, steps=600, center=True, nu=0.05).fit(
        train, run_dir=str(tmp_path / "online"))
    ods = result.load(str(tmp_path / "online"))
    denoise.denoise_store(ods, str(tmp_path / "noisy.zarr"), out, client=client, method="gradient",
                          overwrite=True)
    np.testing.assert_allclose(xr.open_zarr(out)["X"].values,
                               preimage.RunPreimages(ods, None, method="gradient")(noisy[150:]).Z,
                               atol=1e-10)
    # the command: a directory input is a store of vectors
    out2 = str(tmp_path / "den2.zarr")
    assert run_command(["denoise", run_dir, str(tmp_path / "noisy.zarr"), "-o", out2,
                        "--reference", str(tmp_path / "clean.zarr"), "--json",
                        "--workers", "1"]) == 0
    s2 = json.loads(capsys.readouterr().out)
    assert s2["mse_denoised"] == pytest.approx(float(np.mean((ref.Z - clean[150:]) ** 2)),
                                               rel=1e-8)
    from dkha.errors import RunDirectoryError

    with pytest.raises(RunDirectoryError, match="already exists"):
        denoise.denoise_store(run_dir, str(tmp_path / "noisy.zarr"), out2, client=client)
    with pytest.raises(RunDirectoryError, match="input of this denoising"):
        denoise.denoise_store(run_dir, str(tmp_path / "noisy.zarr"), str(tmp_path / "noisy.zarr"),
                              client=client, overwrite=True)


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
        denoise.denoise_image(str(tmp_path / "lap_run"), noisy, client=client,
                              method="fixed-point")


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
    alpha, _mk, _mkm, _, Kc = exact_kpca(X, 3.0, 3)
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
    add_apply_parsers(parser.add_subparsers(dest="command", required=True))
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
    from dkha.data.patches import read_grey_image

    assert read_grey_image(out).shape == clean.shape
    out2 = str(tmp_path / "clean_gradient.png")
    assert run_command(["denoise", run_dir, tif, "-o", out2, "--reference", ref, "--json",
                        "--preimage", "gradient", "--nonnegative"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "gradient" and summary["snr_denoised"] > summary["snr_noisy"] + 3
    assert run_command(["denoise", run_dir, tif, "-o", str(tmp_path / "t.png"), "--reference",
                        ref, "--preimage", "gradient", "--nonnegative"]) == 0
    text = capsys.readouterr().out
    assert (f"denoised: SNR {summary['snr_denoised']:.2f} dB, PSNR {summary['psnr_denoised']:.2f} "
            "dB") in text and "PSNR with the data range 1 as its peak" in text
    with pytest.raises(ParameterError, match="--eta applies to the conformal pre-image"):
        run_command(["denoise", run_dir, tif, "-o", str(tmp_path / "x.png"),
                     "--preimage", "fixed-point", "--eta", "1"])
    assert not os.path.exists(tmp_path / "x.png")


def test_array_of_patches_declared_with_patch_is_a_patch_store(photo, photo_run, client,
                                                               tmp_path):
    """`dkha ingest array X.npy --patch 11` records the geometry: the fit gets what a fit on the
    same patches ingested from the image gets (σ = 3× the median distance, component pictures),
    and maps and denoising take the run, equal to the image store's run's."""
    from dkha.cli.main import main
    from dkha.data.store import open_store
    from dkha.runs.maps import response_maps

    _, noisy = photo
    _, tif, _ = photo_run
    npy = str(tmp_path / "patches.npy")
    np.save(npy, extract_patches(noisy, 11, 2))
    assert main(["ingest", "array", npy, "-o", str(tmp_path / "arr.zarr"), "--patch", "11"]) == 0
    arr = open_store(str(tmp_path / "arr.zarr"))
    assert (arr.attrs["patch"], arr.attrs["step"]) == (11, 2)
    img = ingest_images([tif], tmp_path / "img.zarr", patch=11, step=2)
    np.testing.assert_array_equal(arr.read(), img.read())
    runs = {}
    for name, st in (("arr", arr), ("img", img)):
        runs[name] = str(tmp_path / f"{name}_run")
        KernelHebbianPCA(3, seed=0, client=client).fit(st.path, run_dir=runs[name])
    a, b = result.load(runs["arr"]), result.load(runs["img"])
    assert a.attrs["kernel_parameters"] == b.attrs["kernel_parameters"]
    from dkha.kernels import median_distance

    assert a.attrs["kernel_parameters"]["sigma"] == pytest.approx(
        3.0 * median_distance(arr.sample(2000, 0)), rel=1e-12)
    assert a["component_image"].shape == (3, 11, 11)
    np.testing.assert_allclose(a["component_image"].values, b["component_image"].values,
                               atol=1e-8)
    np.testing.assert_allclose(response_maps(a, [noisy], client=client).values,
                               response_maps(b, [noisy], client=client).values, atol=1e-10)
    np.testing.assert_allclose(denoise.denoise_image(a, noisy, client=client).image,
                               denoise.denoise_image(b, noisy, client=client).image, atol=1e-8)
    with pytest.raises(InputError, match="not 10×10 patches"):
        ingest_array(npy, tmp_path / "bad.zarr", patch=10)
    assert not os.path.exists(tmp_path / "bad.zarr")


def test_cluster_reuses_the_runs_projections_and_says_what_it_does(blobs_run, client, caplog):
    """The run's saved projections are the embedding (no pass over the kernel: an unreachable
    scheduler is never contacted), clustered as the projections computed anew are; without
    them one pass on the cluster computes them. Each phase is logged."""
    import logging

    from dkha.fit.evaluate import projections

    run_dir, _, _ = blobs_run
    ds = result.load(run_dir)
    with caplog.at_level(logging.INFO, logger="dkha.progress"):
        res = clustering.cluster_run(run_dir, 3, client="tcp://127.0.0.1:9")
    assert "spectral embedding: the run's saved projections" in caplog.text
    assert "k-means: 3 clusters of 150 samples, 10 starts" in caplog.text
    from dkha.runs.run import Run

    run = Run(ds)
    C = projections(run.engine(client), run.alpha)
    np.testing.assert_allclose(ds["projection"].values, C.T, rtol=1e-8, atol=1e-10)
    again = clustering.cluster_run(ds.drop_vars("projection"), 3, client=client)
    np.testing.assert_array_equal(res.clusters, again.clusters)
    assert res.vi == pytest.approx(0.0, abs=1e-12)


def test_one_application_imports_no_other():
    """A fit's component pictures (``dkha.apply.pictures``, imported by every ``dkha fit``) do
    not import the denoiser's choice, whose modules cost seconds at every command's start; the
    package's names still load on first use."""
    import subprocess
    import sys

    code = ("import sys, dkha.apply.pictures, dkha.apply as a; "
            "print('dkha.apply.choose' in sys.modules, 'dkha.apply.clustering' in sys.modules); "
            "print(a.fit_denoise.__module__, a.spectral_clustering.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert out.stdout.split("\n")[:2] == ["False False", "dkha.apply.choose dkha.apply.clustering"]
