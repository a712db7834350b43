"""ON-KHA, OO-KHA and Honeine's online KPCA: oracles, twins, streaming and the saved schema.

Oracles written out here, independent of dkha's code paths:

* :func:`paper_steps` — the papers' per-step form in dictionary coordinates (Souza Filho & Diniz
  Table I / eqs. 45–60, Honeine eq. 19), with ``K_m⁻¹ κ`` by a dense solve, ``K_m`` grown as in
  eq. 60 and the ON-KHA normalisation by ``K_m Â`` (eq. 47–49);
* :func:`cholesky_steps` — the plain NumPy twin of the compiled ``online_block`` (Cholesky
  coordinates, one sample at a time);
* an explicit degree-2 polynomial feature map for the AC index.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import xarray as xr
from scipy.spatial.distance import cdist

from dkha import schedule
from dkha.data import cf
from dkha.data.ingest import ingest_array
from dkha.errors import ParameterError
from dkha.estimators.online import OnlineKernelPCA
from dkha.fit.ac_index import ACReference
from dkha.kernels import make_kernel
from dkha.runs.transform import project_dictionary as project
from dkha.solvers.online import OnlineKHA, learning_rate

SIGMA = 4.0


@pytest.fixture(scope="module")
def online_digits() -> np.ndarray:
    """90 digits (30 each of 1, 2, 3), pixels ``x/8 − 1``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    idx = np.concatenate([np.flatnonzero(d.target == k)[:30] for k in (1, 2, 3)])
    return d.data[idx] / 8.0 - 1.0


def gaussian(X, Y):
    return np.exp(-cdist(X, Y, "sqeuclidean") / (2.0 * SIGMA**2))


def sequence(X, seed, n_steps):
    """The samples in fit's order: concatenated per-pass permutations."""
    l = len(X)
    order = np.concatenate([schedule.pass_permutation(seed, k, l) for k in range(-(-n_steps // l))])
    return order[:n_steps]


def a_init_for(seed, r):
    return 0.1 * schedule.init_generator(seed).standard_normal(r)


# --- the oracles ---------------------------------------------------------------------------------


def paper_steps(Xs, algorithm, r, *, nu, eta0, gamma=None, tau=None, center=False,
                max_members=10**9, a_init):
    """The papers' form: ``A`` is ``m × r`` over the dictionary, ``β = K_m⁻¹ κ`` by a solve."""
    D, A, K = [], None, None
    beta_bar, count = None, 0
    for s, x in enumerate(Xs):
        kxx = 1.0
        if not D:
            # the first sample only initialises (Table I, step 1)
            D, K, A = [x], np.array([[kxx]]), a_init[None, :].copy()
            beta_bar, count = np.ones(1), 1  # its own coordinate β = [1]
            continue
        kap = gaussian(np.array(D), x[None, :])[:, 0]
        beta = np.linalg.solve(K, kap)
        eps2 = kxx - kap @ beta
        # below r members any independent sample joins (r components need r members)
        if (eps2 >= nu or (len(D) < r and eps2 > 1e-10 * kxx)) and len(D) < max_members:
            D.append(x)
            K = np.block([[K, kap[:, None]], [kap[None, :], np.array([[kxx]])]])  # eq. 60
            A = np.vstack([A, np.zeros((1, r))])  # eq. 58
            beta = np.zeros(len(D))
            beta[-1] = 1.0  # eq. 55
            kap = np.append(kap, kxx)
            beta_bar = np.append(beta_bar, 0.0)
        if center:
            count += 1
            beta_bar = beta_bar + (beta - beta_bar) / count
            coord = beta - beta_bar
            y = A.T @ (K @ coord)  # Aᵀ (κ − K_m β̄)
        else:
            coord = beta
            y = A.T @ kap  # eq. 45
        eta = eta0 * gamma**s if tau is None else eta0 / (1.0 + s / tau)
        yy = np.outer(y, y)
        if algorithm == "okpca":
            M = np.triu(yy)  # eq. 53
        else:
            M = 2.0 * np.triu(yy) - np.diag(np.diag(yy))  # eq. 50
        A = A + eta * (np.outer(coord, y) - A @ M)  # eq. 46 / 52 / Honeine 19
        if algorithm == "on-kha":
            P = K @ A  # eq. 47
            A = A / np.sqrt(np.einsum("ij,ij->j", A, P))  # eqs. 48–49
    return {"alpha": A.T, "dictionary": np.array(D), "mean": beta_bar if center else None,
            "K": K}


def cholesky_steps(Xs, algorithm, r, *, nu, eta0, gamma=None, tau=None, center=False,
                   a_init):
    """The NumPy twin of ``online_block``: ``(B, c) = (Lᵀ A, L⁻¹ κ)``, one sample at a time."""
    D, L, B = [], np.zeros((0, 0)), np.zeros((r, 0))
    cbar, count = np.zeros(0), 0
    for s, x in enumerate(Xs):
        m = len(D)
        kap = gaussian(np.array(D), x[None, :])[:, 0] if m else np.zeros(0)
        c = np.linalg.solve(L, kap) if m else np.zeros(0)  # forward substitution
        eps2 = 1.0 - c @ c
        initialising = False
        if eps2 >= nu or (m < r and eps2 > 1e-10):
            d = np.sqrt(eps2)
            L = np.block([[L, np.zeros((m, 1))], [c[None, :], np.array([[d]])]])
            B = np.hstack([B, (d * a_init if m == 0 else np.zeros(r))[:, None]])
            c = np.append(c, d)
            cbar = np.append(cbar, 0.0)
            D.append(x)
            initialising = m == 0
        if center:
            count += 1
            cbar = cbar + (c - cbar) / count
            u = c - cbar
        else:
            u = c
        if initialising:
            continue
        eta = learning_rate(s, eta0, gamma, tau)
        y = B @ u
        yy = np.outer(y, y)
        M = np.triu(yy) if algorithm == "okpca" else 2.0 * np.triu(yy) - np.diag(np.diag(yy))
        B = B + eta * (np.outer(y, u) - M.T @ B)
        if algorithm == "on-kha":
            B = B / np.linalg.norm(B, axis=1, keepdims=True)
    return {"B": B, "L": L, "cbar": cbar, "dictionary": np.array(D)}


def run_solver(Xs, algorithm, r, *, nu, eta0, gamma=None, tau=None, center=False, a_init,
               block_rows=16, max_members=10**6, on_divergence="stop"):
    solver = OnlineKHA(algorithm, r, Xs.shape[1], make_kernel("gaussian", sigma=SIGMA), nu=nu,
                       max_members=max_members, eta0=eta0, gamma=gamma, tau=tau, center=center,
                       a_init=a_init, on_divergence=on_divergence)
    for a in range(0, len(Xs), block_rows):
        solver.apply_block(Xs[a:a + block_rows], np.arange(a, min(a + block_rows, len(Xs))))
    return solver


# --- each update against the straightforward per-step formulas ----------------------------------

CASES = list(itertools.product(("on-kha", "oo-kha", "okpca"), (False, True), ("gamma", "tau")))


@pytest.mark.parametrize("algorithm,center,rate", CASES)
def test_updates_match_the_papers_per_step_form(online_digits, algorithm, center, rate):
    """Compiled Cholesky-coordinate loop == the papers' dictionary-coordinate steps."""
    seed, r, n_steps = 3, 5, 240
    Xs = online_digits[sequence(online_digits, seed, n_steps)]
    rates = {"gamma": {"gamma": 0.999}, "tau": {"tau": 50.0}}[rate]
    a0 = a_init_for(seed, r)
    # nu = 0.3 keeps about half of the samples: both "join" and "project" steps occur, members
    # join within blocks and at block starts (blocks of 16)
    ref = paper_steps(Xs, algorithm, r, nu=0.3, eta0=0.05, center=center, a_init=a0, **rates)
    solver = run_solver(Xs, algorithm, r, nu=0.3, eta0=0.05, center=center, a_init=a0, **rates)
    m = solver.n_members
    assert 10 < m < 80
    np.testing.assert_array_equal(solver.dictionary(), ref["dictionary"])
    np.testing.assert_allclose(solver.alpha(), ref["alpha"], rtol=1e-8, atol=1e-9)
    if center:
        np.testing.assert_allclose(solver.mean_coefficients(), ref["mean"], rtol=1e-8, atol=1e-10)
    if algorithm == "on-kha":
        np.testing.assert_allclose(solver.component_norms(), 1.0, rtol=1e-12)


@pytest.mark.parametrize("algorithm,center", [("on-kha", True), ("okpca", False)])
def test_compiled_block_matches_its_numpy_twin(online_digits, algorithm, center):
    seed, r, n_steps = 5, 4, 200
    Xs = online_digits[sequence(online_digits, seed, n_steps)]
    a0 = a_init_for(seed, r)
    twin = cholesky_steps(Xs, algorithm, r, nu=0.2, eta0=0.1, gamma=0.998, center=center,
                          a_init=a0)
    solver = run_solver(Xs, algorithm, r, nu=0.2, eta0=0.1, gamma=0.998, center=center,
                        a_init=a0, block_rows=37)
    st = solver.state
    m = st.m
    np.testing.assert_allclose(st.L[:m, :m], twin["L"], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(st.B[:, :m], twin["B"], rtol=1e-10, atol=1e-12)
    if center:
        np.testing.assert_allclose(st.cbar[:m], twin["cbar"], rtol=1e-12, atol=1e-13)


def test_first_sample_only_initialises_and_rate_is_applied_before_use(online_digits):
    r = 3
    a0 = a_init_for(0, r)
    solver = run_solver(online_digits[:1], "oo-kha", r, nu=1e-3, eta0=0.05, gamma=0.9, a_init=a0)
    np.testing.assert_allclose(solver.alpha()[:, 0], a0)  # untouched: no update at step 0
    assert solver.state.step == 1
    assert learning_rate(1, 0.05, 0.9, None) == pytest.approx(0.05 * 0.9)
    assert learning_rate(10, 2.0, None, 5.0) == pytest.approx(2.0 / 3.0)


def test_cholesky_dictionary_matches_direct_inverse(online_digits):
    """``L Lᵀ = K_m`` and ``L⁻ᵀL⁻¹κ = K_m⁻¹κ``; the ALD residuals agree with the direct form."""
    Xs = online_digits[sequence(online_digits, 1, 400)]
    # one block of 400 rows: the solver works through it in slices of COMPUTE_ROWS
    solver = run_solver(Xs, "on-kha", 4, nu=1e-3, eta0=0.05, gamma=0.9999, a_init=a_init_for(1, 4),
                        block_rows=400)
    ref = paper_steps(Xs, "on-kha", 4, nu=1e-3, eta0=0.05, gamma=0.9999, a_init=a_init_for(1, 4))
    np.testing.assert_allclose(solver.alpha(), ref["alpha"], rtol=1e-7, atol=1e-8)
    st = solver.state
    m = st.m
    assert m > 60
    D = solver.dictionary()
    Km = gaussian(D, D)
    L = st.L[:m, :m]
    np.testing.assert_allclose(L @ L.T, Km, atol=1e-12)
    kap = gaussian(D, online_digits[:10])
    beta_direct = np.linalg.inv(Km) @ kap
    c = np.linalg.solve(L, kap)
    beta_chol = np.linalg.solve(L.T, c)
    np.testing.assert_allclose(beta_chol, beta_direct, rtol=1e-6, atol=1e-8)
    eps2_direct = 1.0 - np.einsum("ij,ij->j", kap, beta_direct)
    np.testing.assert_allclose(1.0 - np.einsum("ij,ij->j", c, c), eps2_direct, atol=1e-9)
    # every member was ν away from the span of the earlier ones (the ALD criterion held)
    assert np.all(np.diag(L) ** 2 >= 1e-3 - 1e-12)


def test_max_members_caps_the_dictionary(online_digits):
    Xs = online_digits[sequence(online_digits, 2, 300)]
    solver = run_solver(Xs, "okpca", 3, nu=1e-3, eta0=0.05, gamma=0.9999,
                        a_init=a_init_for(2, 3), max_members=7)
    assert solver.n_members == 7
    ref = paper_steps(Xs, "okpca", 3, nu=1e-3, eta0=0.05, gamma=0.9999, a_init=a_init_for(2, 3),
                      max_members=7)
    np.testing.assert_allclose(solver.alpha(), ref["alpha"], rtol=1e-8, atol=1e-10)


# --- the AC index --------------------------------------------------------------------------------


def quadratic_features(X):
    """Explicit map of ``(x·y + 1)²``: ``[1, √2 x_i, x_i², √2 x_i x_j (i<j)]``."""
    n = X.shape[1]
    cols = [np.ones(len(X))] + [np.sqrt(2) * X[:, i] for i in range(n)]
    cols += [X[:, i] ** 2 for i in range(n)]
    cols += [np.sqrt(2) * X[:, i] * X[:, j] for i in range(n) for j in range(i + 1, n)]
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("centered", [False, True])
def test_ac_index_matches_the_feature_space_cosines(centered):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    D = np.vstack([X[:4], rng.normal(size=(3, 3))])  # members in and out of the reference set
    r = 3
    alpha = rng.normal(size=(r, len(D)))
    kernel = make_kernel("polynomial", degree=2, offset=1.0)
    F, FD = quadratic_features(X), quadratic_features(D)
    np.testing.assert_allclose(FD @ F.T, kernel.block(D, X), rtol=1e-12, atol=1e-13)
    if centered:
        F = F - F.mean(axis=0)
    # reference principal axes: eigenvectors of the feature-space (second-moment) matrix
    w, V = np.linalg.eigh(F.T @ F)
    V = V[:, np.argsort(w)[::-1][:r]]
    W = alpha @ FD  # the online components, explicitly
    cos = np.abs(np.einsum("ij,ji->i", W, V)) / np.linalg.norm(W, axis=1)
    ref = ACReference.from_data(X, kernel, r, centered=centered)
    np.testing.assert_allclose(ref.cosines(alpha, D), cos, rtol=1e-8)
    assert ref.score(alpha, D) == pytest.approx(cos.mean(), rel=1e-8)
    # the exact components themselves score 1
    assert ACReference.from_data(X, kernel, r, centered=centered).score(
        ref.coefficients, X) == pytest.approx(1.0, abs=1e-10)


# --- the estimator ------------------------------------------------------------------------------


def test_partial_fit_in_batches_equals_fit(online_digits):
    seed, n_steps = 7, 500
    kw = dict(algorithm="on-kha", sigma=SIGMA, eta0=0.05, gamma=0.9995, nu=0.05, seed=seed,
              block_rows=32, center=True)
    fitted = OnlineKernelPCA(4, steps=n_steps, **kw).fit(online_digits)
    seq = online_digits[sequence(online_digits, seed, n_steps)]
    streamed = OnlineKernelPCA(4, **kw)
    # the first batch holds at least n_components samples (IncrementalPCA's rule), then any
    for a, b in [(0, 4), (4, 5), (5, 50), (50, 333), (333, 500)]:
        streamed.partial_fit(seq[a:b])
    assert streamed.n_samples_seen_ == n_steps
    np.testing.assert_array_equal(streamed.dictionary_, fitted.dictionary_)
    np.testing.assert_array_equal(streamed.member_step_, fitted.member_step_)
    np.testing.assert_allclose(streamed.alpha_, fitted.alpha_, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(streamed.mean_coefficient_, fitted.mean_coefficient_, atol=1e-12)
    # fit records store rows, partial_fit stream positions
    np.testing.assert_array_equal(online_digits[fitted.member_index_], fitted.dictionary_)
    np.testing.assert_array_equal(seq[streamed.member_index_], streamed.dictionary_)


@pytest.mark.parametrize("center", [False, True])
def test_transform_matches_the_direct_formula(online_digits, center, tmp_path):
    model = OnlineKernelPCA(5, algorithm="oo-kha", sigma=SIGMA, nu=0.1, steps=300, seed=1,
                            center=center).fit(online_digits)
    Xnew = online_digits[::7] + 0.05
    Y = model.transform(Xnew)
    assert Y.shape == (len(Xnew), 5)
    D, alpha, bbar = model.dictionary_, model.alpha_, model.mean_coefficient_
    direct = (gaussian(Xnew, D) - (gaussian(D, D) @ bbar)[None, :]) @ alpha.T
    np.testing.assert_allclose(Y, direct, rtol=1e-9, atol=1e-11)
    assert np.any(bbar != 0) == center
    np.testing.assert_allclose(project(model.to_dataset(), Xnew), Y, rtol=1e-9, atol=1e-11)


def test_fit_streams_the_store_in_blocks_and_saves(online_digits, tmp_path):
    store = ingest_array(online_digits, tmp_path / "d.zarr", chunk_rows=16)
    kw = dict(algorithm="okpca", sigma=SIGMA, tau=1000.0, nu=1e-3, steps=400, seed=4,
              block_rows=24, prefetch=2, evaluate_every=150)
    model = OnlineKernelPCA(6, **kw).fit(str(store.path), run_dir=str(tmp_path / "run"),
                                         ac_reference=True)
    stats = model.stream_stats_
    assert stats["largest_read"] == 24 and stats["rows_read"] == 400
    in_memory = OnlineKernelPCA(6, **kw).fit(online_digits)
    np.testing.assert_allclose(model.alpha_, in_memory.alpha_, rtol=1e-12, atol=1e-14)

    ds = xr.open_zarr(tmp_path / "run" / "components.zarr", consolidated=False)
    m = model.dictionary_.shape[0]
    assert ds["alpha"].dims == ("component", "member") and ds["alpha"].shape == (6, m)
    assert ds["dictionary"].shape == (m, online_digits.shape[1])
    assert ds["member_index"].dims == ("member",)
    assert ds["eigenvalue"].dims == ("component",) and np.all(ds["eigenvalue"].values > 0)
    for name in ("pass", "step", "wall_time", "ac_index", "members"):
        assert ds[name].dims == ("evaluation",)
    np.testing.assert_array_equal(ds["step"].values, [150, 300, 400])
    # no kernel matrix to evaluate against: the errors were not measured, and are not there
    assert not {"error", "error_min", "excess"} & set(ds.variables)
    assert np.all((ds["ac_index"].values > 0) & (ds["ac_index"].values <= 1))
    a = cf.decode_attrs(ds.attrs)       # dicts and booleans saved as JSON text (netCDF)
    assert a["algorithm"] == "okpca" and a["tau"] == 1000.0
    assert "gain_decay" not in a and a["centered"] is False     # None: not written
    assert a["kernel"] == "gaussian" and a["kernel_parameters"] == {"sigma": SIGMA}
    assert "sigma" not in a   # saved once, in kernel_parameters
    assert a["n_samples"] == 90 and a["n_features"] == 64
    assert a["seed"] == 4 and a["nu"] == 1e-3
    assert a["store"].endswith("d.zarr") and "dkha_version" in a
    np.testing.assert_allclose(ds["ac_index"].values[-1], model.ac_index(), rtol=1e-12)


def test_on_kha_converges_towards_exact_kpca(online_digits):
    """A short run: ON-KHA's AC rises and beats OKHA's (Table II's ordering)."""
    ref = ACReference.from_data(online_digits, make_kernel("gaussian", sigma=SIGMA), 4)
    ac = {}
    for alg in ("on-kha", "okpca"):
        m = OnlineKernelPCA(4, algorithm=alg, sigma=SIGMA, steps=6000, seed=0, evaluate_every=2000)
        ac[alg] = [h["ac_index"] for h in m.fit(online_digits, ac_reference=ref).history_]
    assert ac["on-kha"][-1] > 0.9
    assert ac["on-kha"][-1] > ac["okpca"][-1]
    assert ac["on-kha"][-1] > ac["on-kha"][0]


@pytest.mark.parametrize("kw,match", [
    ({"algorithm": "kha"}, "The 'algorithm' parameter of OnlineKernelPCA must be a str among"),
    ({"gain_decay": 0.99, "tau": 10.0}, "not both"),
    ({"gain_decay": 1.5},
     r"'gain_decay' parameter of OnlineKernelPCA must be .* range \(0.0, 1.0\]"),
    ({"nu": 0.0}, r"'nu' parameter of OnlineKernelPCA must be a float in the range \(0.0, inf\)"),
    ({"eta0": -1}, "'eta0' parameter of OnlineKernelPCA must be a float in the range"),
    ({"tau": 0}, "'tau' parameter of OnlineKernelPCA must be a float in the range"),
    ({"max_members": 2}, "at least n_components"),
    ({"steps": 0}, r"'steps' parameter of OnlineKernelPCA must be an int in the range \[1, inf\)"),
])
def test_parameters_are_validated(online_digits, kw, match):
    with pytest.raises(ParameterError, match=match):
        OnlineKernelPCA(3, sigma=SIGMA, **kw).fit(online_digits)


def test_transform_before_fit_is_refused():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match="This OnlineKernelPCA instance is not fitted yet"):
        OnlineKernelPCA(2).transform(np.zeros((1, 2)))


def test_gamma_is_renamed_gain_decay(online_digits, tmp_path):
    """The old spelling of the gain decay (``gamma``) still works, with a FutureWarning, as the
    keyword, the command-line option and the pipeline key; a run saved under the old attr name
    loads with its decay."""
    from dkha.estimators.params import ONLINE, estimator_kwargs
    from dkha.estimators.saved import load

    kw = dict(sigma=SIGMA, nu=0.2, eta0=0.1, steps=120, block_rows=16, seed=1)
    new = OnlineKernelPCA(4, gain_decay=0.99, **kw).fit(online_digits)
    with pytest.warns(FutureWarning, match=r"gamma=\.\.\.\) is now gain_decay"):
        old = OnlineKernelPCA(4, gamma=0.99, **kw)
    assert old.get_params()["gain_decay"] == 0.99 and "gamma" not in old.get_params()
    np.testing.assert_array_equal(old.fit(online_digits).alpha_, new.alpha_)
    # a faster decay moves less: the value reached the solver
    slower = OnlineKernelPCA(4, gain_decay=0.5, **kw).fit(online_digits)
    assert not np.allclose(slower.alpha_, new.alpha_)
    with pytest.warns(FutureWarning, match="--gamma is now --gain-decay"):
        assert estimator_kwargs({"gamma": 0.9}, ONLINE, "on-kha") == {"gain_decay": 0.9}
    with pytest.warns(FutureWarning, match="key gamma is now gain_decay"):
        assert estimator_kwargs({"gamma": 0.9}, ONLINE, "on-kha", where="") == {"gain_decay": 0.9}
    with pytest.warns(FutureWarning), pytest.raises(ParameterError, match="not both"):
        estimator_kwargs({"gamma": 0.9, "gain_decay": 0.8}, ONLINE, "on-kha")
    # a run saved before the rename: attr gamma
    new.save(str(tmp_path / "run"))
    ds = xr.open_zarr(str(tmp_path / "run" / "components.zarr"))
    attrs = cf.decode_attrs(ds.attrs)      # zarr's JSON attrs, as runs saved before held
    attrs["gamma"] = attrs.pop("gain_decay")
    attrs.update(attrs["kernel_parameters"])      # kept at the top level too back then
    ds.attrs = attrs
    ds.to_zarr(str(tmp_path / "old" / "components.zarr"), mode="w")
    old = load(str(tmp_path / "old"))
    assert old.gain_decay == 0.99 and old.sigma == SIGMA


class Stopped(Exception):
    pass


def test_a_checkpoint_written_before_the_renames_resumes(online_digits, tmp_path, monkeypatch):
    """A checkpoint of a run saved with the attr ``gamma`` (the gain decay before its rename)
    and the kernel's parameters at the top level too resumes as the same run, bit for bit; a
    different gain decay is still refused, naming it."""
    import json
    import os

    from dkha.data.checkpoint import Checkpointer

    kw = dict(sigma=SIGMA, nu=0.2, eta0=0.1, gain_decay=0.99, steps=240, block_rows=16, seed=1)
    full = OnlineKernelPCA(4, **kw).fit(online_digits, run_dir=str(tmp_path / "full"))
    run = str(tmp_path / "run")
    save = Checkpointer.save

    def save_then_stop(self, step, arrays, meta):
        save(self, step, arrays, meta)
        raise Stopped

    monkeypatch.setattr(Checkpointer, "save", save_then_stop)
    with pytest.raises(Stopped):
        OnlineKernelPCA(4, **kw).fit(online_digits, run_dir=run, checkpoint_every=64)
    monkeypatch.setattr(Checkpointer, "save", save)
    ck = Checkpointer(run).latest()
    assert 0 < ck.step < 240
    meta_path = os.path.join(ck.path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    attrs = meta["attrs"]
    attrs["gamma"] = attrs.pop("gain_decay")
    attrs.update(attrs["kernel_parameters"])
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(ParameterError, match="gain_decay: 0.99 in the checkpoint, 0.5 now"):
        OnlineKernelPCA(4, **dict(kw, gain_decay=0.5)).fit(online_digits, run_dir=run,
                                                           resume=True)
    resumed = OnlineKernelPCA(4, **kw).fit(online_digits, run_dir=run, resume=True)
    np.testing.assert_array_equal(resumed.alpha_, full.alpha_)
    np.testing.assert_array_equal(resumed.dictionary_, full.dictionary_)


def test_eigenvalue_samples_sets_the_sample_the_eigenvalues_are_measured_on(online_digits,
                                                                              tmp_path):
    """A table option end to end: keyword, saved attr, load, and the value acting: the
    eigenvalues are the variance along each unit component over that many seeded rows (the
    direct formula on the same rows), and the whole data gives other values."""
    from dkha.data.sources import ArraySource
    from dkha.estimators.params import ONLINE, estimator_kwargs
    from dkha.estimators.saved import load

    kw = dict(sigma=SIGMA, nu=0.2, eta0=0.1, steps=120, block_rows=16, seed=4)
    model = OnlineKernelPCA(4, eigenvalue_samples=30, **kw).fit(online_digits)
    rows = ArraySource(online_digits).sample(30, 4)
    D, A = model.dictionary_, model.alpha_
    Km = gaussian(D, D)
    Y = (gaussian(rows, D) - Km @ model.mean_coefficient_) @ A.T     # w_iᵀ(Φ(x) − μ)
    norms2 = np.einsum("iq,qp,ip->i", A, Km, A)                        # ‖w_i‖²
    np.testing.assert_allclose(model.eigenvalues_, (Y ** 2).mean(axis=0) / norms2, rtol=1e-9)
    whole = OnlineKernelPCA(4, **kw).fit(online_digits)
    np.testing.assert_array_equal(whole.alpha_, model.alpha_)     # the fit itself is the same
    assert not np.allclose(whole.eigenvalues_, model.eigenvalues_)
    model.save(str(tmp_path / "run"))
    assert load(str(tmp_path / "run")).eigenvalue_samples == 30
    assert estimator_kwargs({"eigenvalue_samples": 30}, ONLINE, "on-kha") == {
        "eigenvalue_samples": 30}


def test_partial_fit_is_exact_kpca_while_the_dictionary_spans_what_it_saw(seed):
    """Every sample joins (tiny nu): partial_fit's projections are those of exact kernel PCA of
    the samples seen (dense eigh of the centered Gram matrix), call after call. The first sample
    outside the span (max_members reached) ends it: the streaming updates go on from there."""
    from scipy.spatial.distance import cdist

    X = np.random.default_rng(seed).normal(size=(40, 5))
    sigma = 2.0

    def dense_projections(Xs, r):
        K = np.exp(-cdist(Xs, Xs, "sqeuclidean") / (2 * sigma ** 2))
        J = np.eye(len(Xs)) - 1.0 / len(Xs)
        w, V = np.linalg.eigh(J @ K @ J)
        return V[:, ::-1][:, :r] * np.sqrt(w[::-1][:r])

    model = OnlineKernelPCA(3, kernel="gaussian", sigma=sigma, nu=1e-12, center=True,
                            max_members=30)
    for a, b in ((0, 6), (6, 7), (7, 20), (20, 30)):
        model.partial_fit(X[a:b])
        got, want = model.transform(X[:b]), dense_projections(X[:b], 3)
        np.testing.assert_allclose(np.abs(got), np.abs(want), atol=1e-8)
    assert model.solver_.exact is not None
    saved = OnlineKernelPCA.from_dataset(model.to_dataset())    # the sums travel with the run
    before = model.transform(X[:30])
    model.partial_fit(X[30:])       # past max_members: outside the span, streaming from here
    np.testing.assert_array_equal(saved.partial_fit(X[30:]).transform(X), model.transform(X))
    assert model.solver_.exact is None and model.dictionary_.shape[0] == 30
    after = model.transform(X[:30])
    assert 0 < np.abs(after - before).max() < 0.5 * np.abs(before).max()
