"""The scikit-learn contract (check_estimator, clone, Pipeline, GridSearchCV, pickle, set_output,
inverse_transform, partial_fit, dkha.load) and Dask/xarray inputs (lazy transforms)."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

import dkha
from dkha import KernelHebbianPCA, OnlineKernelPCA, schedule

SIGMA = 4.0


def _small(kind):
    if kind == "batch":
        return KernelHebbianPCA(2, algorithm="kha-et", passes=2, sigma=1.0)
    return OnlineKernelPCA(2, sigma=1.0, max_members=20)


@pytest.mark.parametrize("kind", ["batch", "online"])
def test_check_estimator_passes_every_check(kind):
    """scikit-learn's own estimator checks, small settings: every check passes (the array-API
    check is skipped by scikit-learn itself unless SCIPY_ARRAY_API is set)."""
    results = check_estimator(_small(kind), on_fail=None)
    assert len(results) > 40
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results
              if r["status"] == "failed"]
    assert failed == []
    skipped = {r["check_name"] for r in results if r["status"] == "skipped"}
    assert skipped <= {"check_array_api_input"}


def test_clone_params_and_exports():
    model = KernelHebbianPCA(3, algorithm="krylov", sigma=2.0)
    copy = clone(model)
    assert copy is not model and copy.get_params() == model.get_params()
    assert copy.set_params(n_components=5).n_components == 5
    assert dkha.OnlineKernelPCA is OnlineKernelPCA and callable(dkha.load)
    with pytest.raises(ValueError, match="'n_components' parameter of KernelHebbianPCA must be"):
        KernelHebbianPCA(0).fit(np.zeros((5, 2)))
    with pytest.raises(TypeError, match="Sparse data was passed"):
        from scipy import sparse

        OnlineKernelPCA(2).fit(sparse.random(20, 4, density=0.5, format="csr", random_state=0))


def test_krylov_equals_scikit_learn_kernel_pca(digits):
    """The exact solver against scikit-learn's KernelPCA (dense K), up to each component's sign;
    fit_transform (the fit's own projections) equals transform."""
    from sklearn.decomposition import KernelPCA

    X = digits[:150]
    model = KernelHebbianPCA(4, algorithm="krylov", sigma=SIGMA)
    Y = model.fit_transform(X)
    ref = KernelPCA(4, kernel="rbf", gamma=1 / (2 * SIGMA**2),
                    eigen_solver="dense").fit_transform(X)
    signs = np.sign(np.sum(Y * ref, axis=0))
    np.testing.assert_allclose(Y * signs, ref, atol=1e-6)
    np.testing.assert_allclose(model.transform(X), Y, atol=1e-10)


def test_pipeline_gridsearch_on_digits():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X, y = X[:400], y[:400]
    pipe = Pipeline([("scale", StandardScaler()),
                     ("kpca", KernelHebbianPCA(algorithm="krylov")),
                     ("clf", LogisticRegression(max_iter=2000))])
    search = GridSearchCV(pipe, {"kpca__sigma": [4.0, 8.0], "kpca__n_components": [4, 16]},
                          cv=2).fit(X, y)
    assert set(search.best_params_) == {"kpca__sigma", "kpca__n_components"}
    assert search.best_params_["kpca__n_components"] == 16  # more components separate better
    assert search.best_score_ > 0.8
    assert search.score(X, y) > 0.9


@pytest.mark.parametrize("kind", ["batch", "online"])
def test_pickle_round_trip_and_pandas_output(kind, digits):
    model = (KernelHebbianPCA(3, algorithm="kha-et", passes=2, sigma=SIGMA) if kind == "batch"
             else OnlineKernelPCA(3, sigma=SIGMA, nu=0.05)).fit(digits)
    Y = model.transform(digits[:20])
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.transform(digits[:20]), Y)
    frame = clone(model).set_output(transform="pandas").fit(digits).transform(digits[:20])
    prefix = type(model).__name__.lower()
    assert list(frame.columns) == [f"{prefix}{i}" for i in range(3)]
    np.testing.assert_allclose(frame.to_numpy(), Y, atol=1e-12)


def test_inverse_transform_reconstructs_training_samples(digits):
    """Pre-images of the projections of training digits (many components): much closer to the
    digits than the mean digit is."""
    model = KernelHebbianPCA(30, algorithm="krylov", sigma=SIGMA).fit(digits)
    X = digits[::15]
    Z = model.inverse_transform(model.transform(X))
    assert Z.shape == X.shape
    err = np.linalg.norm(Z - X, axis=1).mean()
    base = np.linalg.norm(X - digits.mean(axis=0), axis=1).mean()
    assert err < 0.5 * base
    online = OnlineKernelPCA(10, sigma=SIGMA, nu=0.05, center=True, steps=900).fit(digits)
    Zo = online.inverse_transform(online.transform(X))
    assert np.linalg.norm(Zo - X, axis=1).mean() < base


def test_online_fit_is_a_loop_over_partial_fit(digits):
    """fit streams blocks in the seeded schedule; partial_fit on the same blocks in that order
    ends in the same state."""
    kw = dict(sigma=SIGMA, nu=0.05, seed=3, block_rows=40)
    fitted = OnlineKernelPCA(4, steps=600, **kw).fit(digits)
    streamed = OnlineKernelPCA(4, **kw)
    for _, _, index in schedule.blocks(3, len(digits), 600, 40):
        streamed.partial_fit(digits[index])
    np.testing.assert_array_equal(streamed.dictionary_, fitted.dictionary_)
    np.testing.assert_allclose(streamed.alpha_, fitted.alpha_, rtol=1e-9, atol=1e-12)


def test_load_returns_fitted_estimators(digits_store, digits, tmp_path):
    batch = KernelHebbianPCA(3, algorithm="kha-et", passes=2, sigma=SIGMA).fit(
        digits_store.path, run_dir=str(tmp_path / "batch"))
    loaded = dkha.load(tmp_path / "batch")
    assert isinstance(loaded, KernelHebbianPCA) and loaded.get_params()["sigma"] == SIGMA
    np.testing.assert_allclose(loaded.transform(digits[:10]), batch.transform(digits[:10]),
                               atol=1e-12)
    assert loaded.inverse_transform(loaded.transform(digits[:2])).shape == (2, 64)
    # online: continue with partial_fit exactly where the saved run ended
    online = OnlineKernelPCA(3, sigma=SIGMA, nu=0.05, steps=200).fit(digits_store.path,
                                                                     run_dir=str(tmp_path / "on"))
    again = dkha.load(tmp_path / "on")
    np.testing.assert_allclose(again.transform(digits[:10]), online.transform(digits[:10]),
                               atol=1e-12)
    online.partial_fit(digits[:50])
    again.partial_fit(digits[:50])
    np.testing.assert_array_equal(again.alpha_, online.alpha_)
    np.testing.assert_array_equal(again.dictionary_, online.dictionary_)


class _TaskCounter(dask.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.tasks = 0

    def _pretask(self, key, dsk, state):
        self.tasks += 1


def test_dask_transform_is_lazy_and_equals_eager(digits):
    """200 000 rows: transform builds a graph (no task runs), and its result equals the eager
    transform of the same rows to 1e-12."""
    model = KernelHebbianPCA(3, algorithm="kha-et", passes=2, sigma=SIGMA).fit(digits)
    rng = np.random.default_rng(0)
    base = digits[rng.integers(0, len(digits), 2000)] + 0.01 * rng.standard_normal((2000, 64))
    X = da.concatenate([da.from_array(base, chunks=(2000, 64))] * 100)
    assert X.shape == (200_000, 64)
    with dask.config.set(scheduler="threads"), _TaskCounter() as counter:
        Y = model.transform(X)
        assert isinstance(Y, da.Array) and Y.shape == (200_000, 3)
        assert counter.tasks == 0
        lazy = Y[:2000].compute()
    assert counter.tasks > 0
    np.testing.assert_allclose(lazy, model.transform(base), rtol=0, atol=1e-12)
    eager = model.transform(X.compute(scheduler="threads"))
    assert isinstance(eager, np.ndarray)
    np.testing.assert_allclose(Y.compute(scheduler="threads"), eager, rtol=0, atol=1e-12)


def test_xarray_and_store_inputs_keep_their_kind(digits, digits_store):
    sample = np.arange(len(digits)) * 10
    arr = xr.DataArray(da.from_array(digits, chunks=(64, 64)), dims=("sample", "feature"),
                       coords={"sample": sample, "label": ("sample", np.arange(len(digits)) % 10)})
    model = OnlineKernelPCA(3, sigma=SIGMA, nu=0.05).fit(arr)
    ref = OnlineKernelPCA(3, sigma=SIGMA, nu=0.05).fit(digits)   # the same data eagerly
    np.testing.assert_array_equal(model.alpha_, ref.alpha_)
    out = model.transform(arr)
    assert isinstance(out, xr.DataArray) and out.dims == ("sample", "component")
    assert isinstance(out.data, da.Array)
    np.testing.assert_array_equal(out["sample"].values, sample)
    assert "label" in out.coords
    np.testing.assert_allclose(out.values, ref.transform(digits), atol=1e-12)
    # a Dataset's X, and a store path: lazy DataArrays too
    ds_out = model.transform(xr.Dataset({"X": arr}))
    np.testing.assert_allclose(ds_out.values, out.values, atol=0)
    from_store = model.transform(digits_store.path)
    assert isinstance(from_store.data, da.Array)
    np.testing.assert_allclose(from_store.values, out.values, atol=1e-12)
    # a batch model fitted on a dask array equals one fitted on the numpy array; the array is
    # written blockwise into the store, never gathered whole here
    from unittest import mock

    with mock.patch.object(da.Array, "__array__", side_effect=AssertionError("gathered")):
        lazy_fit = KernelHebbianPCA(3, algorithm="kha-et", passes=1, sigma=SIGMA).fit(
            da.from_array(digits, chunks=(100, 64)))
    eager_fit = KernelHebbianPCA(3, algorithm="kha-et", passes=1, sigma=SIGMA).fit(digits)
    np.testing.assert_allclose(lazy_fit.alpha_, eager_fit.alpha_, atol=1e-12)


# --- scikit-learn's KernelPCA behaviours (issue 24's bugs); scikit-learn's own test file is
# ported in tests/test_sklearn_kernel_pca_port.py ------------------------------------------------


def test_fit_keeps_a_copy_of_the_training_array():
    """copy_X (scikit-learn's default): changing X after fit does not change transform."""
    X = np.random.default_rng(0).random((10, 10))
    model = KernelHebbianPCA(3, algorithm="krylov", kernel="rbf").fit(X)
    assert model.X_fit_ is not X
    before = model.transform(X.copy())
    X_copy = X.copy()
    X[:, 0] = 666
    np.testing.assert_array_equal(model.transform(X_copy), before)
    shared = KernelHebbianPCA(3, algorithm="krylov", kernel="rbf", copy_X=False).fit(X_copy)
    assert shared.X_fit_ is X_copy


@pytest.mark.parametrize("algorithm", ["krylov", "kha-smd"])
def test_rank_deficient_kernel_gives_null_components(algorithm):
    """A linear kernel on 2 features asked for 6 components: scikit-learn's eigenvalues and
    projections, the 4 null components with eigenvalue 0 and projections 0 (no 1/√1e-14
    blow-up), a warning naming the remedy; remove_zero_eig drops them."""
    from sklearn.datasets import make_circles
    from sklearn.decomposition import KernelPCA

    X, _ = make_circles(n_samples=300, factor=0.3, noise=0.05, random_state=0)
    with pytest.warns(dkha.errors.NullComponentWarning, match="remove_zero_eig"):
        model = KernelHebbianPCA(6, kernel="linear", algorithm=algorithm).fit(X)
    ref = KernelPCA(6, kernel="linear", eigen_solver="dense").fit(X)
    np.testing.assert_allclose(model.eigenvalues_[:2], ref.eigenvalues_[:2], rtol=1e-9)
    np.testing.assert_array_equal(model.eigenvalues_[2:], 0.0)
    Y = model.transform(X[:50])
    np.testing.assert_allclose(Y[:, :2], ref.transform(X[:50])[:, :2], atol=1e-8)
    np.testing.assert_array_equal(Y[:, 2:], 0.0)
    dropped = KernelHebbianPCA(6, kernel="linear", algorithm=algorithm,
                               remove_zero_eig=True).fit(X)
    assert dropped.transform(X[:5]).shape == (5, 2)


def test_an_exact_fit_from_landmarks_of_a_lower_rank_solves_for_every_component():
    """The exact solver from a Nyström start whose landmarks span fewer dimensions than the
    components asked (6 landmarks drawn from 295 equal samples and 5 others: rank 1 or 2
    against 4 components): the start is padded with random vectors and the eigenvalues are
    scikit-learn's. Before, the fit was refused, its message suggesting algorithm='krylov' to a
    krylov fit."""
    from sklearn.decomposition import KernelPCA

    X = np.vstack([np.zeros((295, 3)), np.random.default_rng(0).normal(size=(5, 3))])
    ref = KernelPCA(4, kernel="rbf", eigen_solver="dense").fit(X)
    for seed in (0, 2):     # landmarks spanning 1 and 2 dimensions
        model = KernelHebbianPCA(4, algorithm="krylov", init="nystrom:6", kernel="rbf",
                                 seed=seed).fit(X)
        np.testing.assert_allclose(model.eigenvalues_, ref.eigenvalues_, rtol=1e-9)
        np.testing.assert_allclose(np.abs(model.transform(X[-5:])),
                                   np.abs(ref.transform(X[-5:])), atol=1e-8)


def test_signs_do_not_depend_on_the_seed(digits):
    """The sign convention (scikit-learn's svd_flip on the eigenvectors): three seeds, one
    output, equal to scikit-learn's own (signs included)."""
    from sklearn.decomposition import KernelPCA

    X = digits      # 300 samples: LOBPCG from each seed's random start
    outs = [KernelHebbianPCA(4, algorithm="krylov", kernel="rbf", gamma=0.02,
                             random_state=s).fit(X).transform(X[:20]) for s in (0, 1, 2)]
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-6)
    np.testing.assert_allclose(outs[2], outs[0], atol=1e-6)
    ref = KernelPCA(4, kernel="rbf", gamma=0.02, eigen_solver="dense").fit(X).transform(X[:20])
    np.testing.assert_allclose(outs[0], ref, atol=1e-6)


def test_output_width_follows_the_fit_not_the_parameter():
    """set_params(n_components=k) after fit: the feature names and pandas output keep the
    fitted width until the next fit."""
    X = np.random.default_rng(1).random((30, 4))
    model = KernelHebbianPCA(3, algorithm="krylov", kernel="rbf").fit(X)
    model.set_params(n_components=5)
    assert list(model.get_feature_names_out()) == [f"kernelhebbianpca{i}" for i in range(3)]
    frame = model.set_output(transform="pandas").transform(X[:4])
    assert frame.shape == (4, 3)
    assert model.fit(X).transform(X[:4]).shape == (4, 5)


def test_online_dictionary_holds_as_many_members_as_components():
    """Two tight clusters, r = 2: the default ν would admit one member (both components the
    same, equal eigenvalues); below r members any independent sample joins. Data spanning
    fewer dimensions than components: a warning naming the remedy."""
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(0.0, 0.01, (50, 3)), rng.normal(1.0, 0.01, (50, 3))])
    model = OnlineKernelPCA(2, sigma=1.0, center=True).fit(X)
    assert len(model.dictionary_) >= 2
    Y = model.transform(X)
    assert abs(np.corrcoef(Y[:, 0], Y[:, 1])[0, 1]) < 0.99      # not one component twice
    flat = np.column_stack([X[:, 0], 2 * X[:, 0]])               # rank 1 for a linear kernel
    with pytest.warns(dkha.errors.DictionaryWarning, match="ask for at most 1 components"):
        OnlineKernelPCA(2, kernel="linear").fit(flat)


def test_online_partial_fit_as_incremental_pca():
    """IncrementalPCA's rules: a first batch smaller than the components is refused; changing
    n_components between calls raises; fit on small data streams at least MIN_STEPS samples."""
    from dkha.estimators.online import MIN_STEPS

    X = np.random.default_rng(4).normal(size=(40, 3))
    with pytest.raises(ValueError, match="n_components=3 must be less or equal to the batch"):
        OnlineKernelPCA(3, sigma=1.0).partial_fit(X[:2])
    model = OnlineKernelPCA(3, sigma=1.0).partial_fit(X)
    model.set_params(n_components=2)
    with pytest.raises(ValueError, match="changed from 3 to 2"):
        model.partial_fit(X)
    assert OnlineKernelPCA(2, sigma=1.0).fit(X).n_samples_seen_ == MIN_STEPS
