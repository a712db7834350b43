"""Kernels: blocks against per-pair formulas, diagonals, validation, the median heuristic."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from dkha.errors import ParameterError
from dkha.kernels import Kernel, make_kernel, median_distance


def pair_value(name: str, p: dict, x: np.ndarray, y: np.ndarray) -> float:
    """``k(x, y)`` for one pair, written out with Python scalars."""
    if name == "gaussian":
        return math.exp(-sum((a - b) ** 2 for a, b in zip(x, y)) / (2 * p["sigma"] ** 2))
    if name == "laplacian":
        return math.exp(-math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y))) / p["sigma"])
    dot = sum(a * b for a, b in zip(x, y))
    if name == "polynomial":
        return (dot + p["offset"]) ** p["degree"]
    if name == "sigmoid":
        return math.tanh(p["gamma"] * dot + p["offset"])
    raise AssertionError(name)


CASES = [
    ("gaussian", {"sigma": 1.7}),
    ("gaussian", {"sigma": 0.4}),
    ("laplacian", {"sigma": 2.5}),
    ("polynomial", {"degree": 1, "offset": 0.0}),
    ("polynomial", {"degree": 3, "offset": 1.5}),
    ("sigmoid", {"gamma": 0.2, "offset": -0.3}),
]


@pytest.fixture
def blocks(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(7, 5)), rng.normal(size=(4, 5))


@pytest.mark.parametrize("name,params", CASES)
def test_block_matches_per_pair_formula(name, params, blocks):
    X, Y = blocks
    k = make_kernel(name, **params)
    got = k.block(X, Y)
    want = np.array([[pair_value(name, params, x, y) for y in Y] for x in X])
    assert got.shape == (7, 4) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13 * np.abs(want).max())
    # the block of (Y, X) is the transpose
    np.testing.assert_allclose(k.block(Y, X), want.T, rtol=1e-12, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize("name,params", CASES)
def test_diagonal(name, params, blocks):
    X = blocks[0] * 3.0  # norms well above 1, where rounding in ||x-y||² shows
    k = make_kernel(name, **params)
    want = np.array([pair_value(name, params, x, x) for x in X])
    np.testing.assert_allclose(k.diagonal(X), want, rtol=1e-13, atol=1e-15)
    # the diagonal of the square block agrees (the laplacian's sqrt amplifies rounding most)
    np.testing.assert_allclose(np.diag(k.block(X, X)), want, rtol=1e-12, atol=1e-13)


def test_laplacian_near_coincident_points(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(6, 40)) * 4.0
    Y = X + 1e-5 * rng.normal(size=X.shape)
    k = make_kernel("laplacian", sigma=3.0)
    want = np.array([[pair_value("laplacian", {"sigma": 3.0}, x, y) for y in Y] for x in X])
    np.testing.assert_allclose(k.block(X, Y), want, rtol=1e-12)


def test_integer_and_float32_inputs_are_float64():
    X = np.arange(6, dtype=np.int32).reshape(3, 2)
    k = make_kernel("polynomial", degree=2, offset=1.0)
    got = k.block(X, X.astype(np.float32))
    want = (X.astype(float) @ X.T.astype(float) + 1.0) ** 2
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, want)


def test_aliases_and_defaults():
    assert make_kernel("rbf", sigma=2) == make_kernel("gaussian", sigma=2.0)
    assert make_kernel("exponential", sigma=1).name == "laplacian"
    lin = make_kernel("linear")
    assert lin.name == "polynomial" and lin["degree"] == 1 and lin["offset"] == 0.0
    # scikit-learn's defaults under its names: gamma = 1/n_features at fit time, coef0 = 1
    sig = make_kernel("SIGMOID")
    assert sig["gamma"] is None and sig["offset"] == 1.0
    assert sig.with_defaults(4)["gamma"] == 0.25
    poly = make_kernel("poly").with_defaults(8)
    assert (poly["degree"], poly["offset"], poly["gamma"]) == (3, 1.0, 0.125)
    assert make_kernel("polynomial")["gamma"] == 1.0
    assert make_kernel("rbf", gamma=2.0) == make_kernel("gaussian", sigma=0.5)
    assert make_kernel("rbf").with_defaults(2) == make_kernel("gaussian", sigma=1.0)
    assert make_kernel("poly", coef0=2.0)["offset"] == 2.0
    # a kernel travels to workers as a task argument
    k = make_kernel("gaussian", sigma=1.25)
    k2 = pickle.loads(pickle.dumps(k))
    assert k2 == k and k2["sigma"] == 1.25
    assert k.with_params(sigma=3.0)["sigma"] == 3.0 and k["sigma"] == 1.25


@pytest.mark.parametrize("sigma", [0, 0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["gaussian", "laplacian"])
def test_sigma_must_be_positive(name, sigma):
    with pytest.raises(ParameterError, match="sigma"):
        make_kernel(name, sigma=sigma)


def test_unknown_kernel():
    with pytest.raises(ParameterError, match="unknown kernel 'chi2'") as e:
        make_kernel("chi2")
    assert "gaussian" in str(e.value)  # lists the choices
    with pytest.raises(ParameterError):
        make_kernel(3)


@pytest.mark.parametrize("name,params,bad", [
    ("gaussian", {"sigma": 1.0, "degree": 2}, "degree"),
    ("polynomial", {"sigma": 1.0}, "sigma"),
    ("sigmoid", {"width": 1.0}, "width"),
])
def test_unknown_parameter(name, params, bad):
    with pytest.raises(ParameterError, match=f"no parameter {bad}"):
        make_kernel(name, **params)


@pytest.mark.parametrize("name,params", [
    ("rbf", {"gamma": 0.3}), ("poly", {}), ("poly", {"gamma": 0.2, "coef0": -1.0, "degree": 2}),
    ("linear", {}), ("sigmoid", {}), ("sigmoid", {"gamma": 0.05, "coef0": 0.5}), ("cosine", {}),
])
def test_scikit_learn_kernels_equal_pairwise_kernels(name, params, blocks):
    """scikit-learn's kernel names, parameters and defaults (gamma = 1/n_features): blocks and
    diagonals equal its pairwise_kernels."""
    from sklearn.metrics.pairwise import pairwise_kernels

    X, Y = blocks
    X = np.vstack([X, np.zeros(X.shape[1])])     # the cosine of a zero row is 0, as scikit-learn's
    k = make_kernel(name, **params).with_defaults(X.shape[1])
    want = pairwise_kernels(X, Y, metric=name, filter_params=True, **params)
    np.testing.assert_allclose(k.block(X, Y), want, rtol=1e-12, atol=1e-14)
    diag = np.diag(pairwise_kernels(X, X, metric=name, filter_params=True, **params))
    np.testing.assert_allclose(k.diagonal(X), diag, rtol=1e-12, atol=1e-14)


def test_callable_and_precomputed_kernels(blocks):
    """A callable runs per pair with its kernel_params; a precomputed kernel's rows carry their
    index, so a block of rows against training rows picks the columns."""
    from dkha.kernels import precomputed_rows

    X, Y = blocks

    def chi(x, y, scale=1.0):
        return scale * np.minimum(x, y).sum()

    k = make_kernel(chi, kernel_params={"scale": 2.0})
    want = np.array([[2.0 * np.minimum(x, y).sum() for y in Y] for x in X])
    np.testing.assert_allclose(k.block(X, Y), want, rtol=1e-14)
    np.testing.assert_allclose(k.diagonal(X), 2.0 * np.maximum(X, X).sum(axis=1), rtol=1e-14)
    assert not k.cacheable and k.with_params(kernel_params={"scale": 1.0}).function is chi
    K = X @ X.T
    rows = precomputed_rows(K)
    pre = make_kernel("precomputed")
    np.testing.assert_array_equal(pre.block(rows[:3], rows[2:]), K[:3, 2:])
    np.testing.assert_array_equal(pre.block(K[:2], rows), K[:2])      # new rows: K(x, X_train)
    np.testing.assert_array_equal(pre.diagonal(rows), np.diag(K))
    # kernel_params of a named kernel are its parameters (a registered kernel's have no
    # keyword of their own), checked as keywords are
    assert make_kernel("rbf", kernel_params={"gamma": 0.5}) == make_kernel("rbf", gamma=0.5)
    with pytest.raises(ParameterError, match="gaussian kernel takes no parameter a; its "
                                             "parameters are sigma, gamma"):
        make_kernel("rbf", kernel_params={"a": 1})
    with pytest.raises(ParameterError, match="gamma is given twice"):
        make_kernel("rbf", gamma=0.1, kernel_params={"gamma": 0.5})


@pytest.mark.parametrize("degree", [0, -2, 1.5, 2.0001])
def test_bad_degree(degree):
    with pytest.raises(ParameterError, match="degree"):
        make_kernel("polynomial", degree=degree)


def test_integral_float_degree_accepted():
    k = make_kernel("polynomial", degree=2.0)
    assert k["degree"] == 2 and isinstance(k["degree"], int)


def test_sigma_none_needs_heuristic():
    k = make_kernel("gaussian")
    assert k.needs_width()
    with pytest.raises(ParameterError, match="needs sigma"):
        k.block(np.zeros((2, 2)), np.zeros((2, 2)))
    assert not make_kernel("gaussian", sigma=1.0).needs_width()
    assert not make_kernel("polynomial").needs_width()


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_median_distance_matches_direct(seed, n):
    rng = np.random.default_rng(seed + n)
    X = rng.normal(size=(n, 3)) * 2.0 + 5.0
    dists = sorted(
        math.sqrt(sum((a - b) ** 2 for a, b in zip(X[i], X[j])))
        for i in range(n) for j in range(i + 1, n)
    )
    m = len(dists)
    want = dists[m // 2] if m % 2 else 0.5 * (dists[m // 2 - 1] + dists[m // 2])
    assert median_distance(X) == pytest.approx(want, rel=1e-12)


def test_median_distance_needs_two_distinct_samples():
    with pytest.raises(ParameterError, match="two samples"):
        median_distance(np.ones((1, 4)))
    with pytest.raises(ParameterError, match="zero"):
        median_distance(np.ones((5, 4)))


def test_kernel_is_frozen():
    k = make_kernel("gaussian", sigma=1.0)
    assert isinstance(k, Kernel)
    with pytest.raises(AttributeError):
        k.name = "laplacian"
