"""dkha's own kernels, each a :class:`~dkha.kernels.spec.KernelSpec` (``x``, ``y`` row vectors):

* ``gaussian``:   ``exp(-||x - y||² / (2 sigma²))`` (scikit-learn's ``rbf``: ``gamma``)
* ``laplacian``:  ``exp(-||x - y|| / sigma)`` (the "exponential" kernel)
* ``polynomial``: ``(gamma · x·y + offset) ** degree``; ``degree=1, offset=0, gamma=1`` is the
  dot product (``dot``, ``linear``; scikit-learn's ``poly``)
* ``sigmoid``:    ``tanh(gamma · x·y + offset)`` (not positive definite; use with care)
* ``cosine``:     ``x·y / (‖x‖ ‖y‖)`` (0 where a norm is 0)
* ``precomputed``: the data are the rows of a square kernel matrix, each with its index as a
  last column (:func:`dkha.kernels.precomputed_rows`), so a block is
  ``K[P, J] = rows_P[:, index_J]``
* ``callable``:   a Python function ``f(x, y, **kernel_params)`` of two samples, evaluated per
  pair (scikit-learn's ``pairwise_kernels`` with a callable metric: slow); made from the
  function, not by name

The first five are compiled tiles of :mod:`dkha.tiles` (the cosine is the polynomial of unit
rows); the last two are NumPy blocks.
"""

from __future__ import annotations

import numpy as np

from dkha import tiles
from dkha.errors import ParameterError
from dkha.kernels.spec import (
    KernelSpec,
    finite,
    positive,
    positive_integer,
    register_kernel,
    require,
)


def _gaussian_gamma(values: dict) -> dict:
    """scikit-learn's ``gamma`` as the gaussian's ``sigma = 1/√(2 gamma)``; ``rbf``'s
    ``gamma=None`` (``1/n_features`` at fit time) is dropped once ``sigma`` is set."""
    if values.get("gamma") is not None:
        gamma = values.pop("gamma")
        if values.get("sigma") is not None:
            raise ParameterError("give gamma or sigma for the gaussian kernel, not both "
                                 "(gamma = 1/(2 sigma²))")
        values["sigma"] = float(np.sqrt(0.5 / positive("gamma", gamma)))
    elif values.get("sigma") is not None:
        values.pop("gamma", None)
    return values


def _gaussian_tile(kernel):
    sigma = require(kernel, "sigma")
    return tiles.GAUSSIAN, 1.0 / (2.0 * sigma * sigma), 0.0, 0.0


def _laplacian_tile(kernel):
    return tiles.LAPLACIAN, 1.0 / require(kernel, "sigma"), 0.0, 0.0


def _polynomial_tile(kernel):
    return tiles.POLYNOMIAL, kernel["degree"], kernel["offset"], 0.0


def _scaled_rows(kernel, X: np.ndarray) -> np.ndarray:
    """The rows scaled by ``√gamma``: ``(γ x·y + c)^d = ((√γ x)·(√γ y) + c)^d``."""
    g = require(kernel, "gamma")
    return X if g == 1.0 else np.asarray(X, dtype=np.float64) * np.sqrt(g)


def _squared_norms(X: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", X, X)


def _polynomial_diagonal(kernel, X: np.ndarray) -> np.ndarray:
    return (kernel["gamma"] * _squared_norms(X) + kernel["offset"]) ** kernel["degree"]


def _linear_scale(kernel) -> float | None:
    """``√gamma`` of a polynomial of degree 1 without offset: ``Φ(x) = √γ x``."""
    p = dict(kernel.params)
    if p.get("degree") == 1 and not p.get("offset"):
        gamma = p.get("gamma")
        return float(np.sqrt(gamma)) if gamma is not None else None
    return None


def _sigmoid_tile(kernel):
    return tiles.SIGMOID, require(kernel, "gamma"), kernel["offset"], 0.0


def _sigmoid_diagonal(kernel, X: np.ndarray) -> np.ndarray:
    return np.tanh(kernel["gamma"] * _squared_norms(X) + kernel["offset"])


def _cosine_tile(kernel):
    return tiles.POLYNOMIAL, 1, 0.0, 0.0


def _unit_rows(kernel, X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    norms = np.sqrt(_squared_norms(X))
    return X / np.where(norms > 0, norms, 1.0)[:, None]


def _cosine_diagonal(kernel, X: np.ndarray) -> np.ndarray:
    return (_squared_norms(X) > 0).astype(np.float64)


def _precomputed_block(kernel, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    return np.ascontiguousarray(X[:, Y[:, -1].astype(np.int64)])


def _precomputed_diagonal(kernel, X: np.ndarray) -> np.ndarray:
    return X[np.arange(len(X)), X[:, -1].astype(np.int64)]


def _callable_block(kernel, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    from sklearn.metrics.pairwise import pairwise_kernels

    if kernel.function is None:
        raise ParameterError(f"the callable kernel {kernel['function']} is not available "
                             "here (a saved run keeps its name only); pass the function")
    return np.asarray(pairwise_kernels(np.asarray(X, dtype=np.float64),
                                       np.asarray(Y, dtype=np.float64),
                                       metric=kernel.function, filter_params=False,
                                       **dict(kernel["kernel_params"])), dtype=np.float64)


GAUSSIAN = register_kernel(KernelSpec(
    "gaussian", {"sigma": None}, "exp(-||x - y||² / (2 sigma²))",
    checks={"sigma": positive}, validate=_gaussian_gamma, accepts=("gamma",),
    aliases={"rbf": {"gamma": None}}, sklearn=("rbf",),
    tile=_gaussian_tile, diagonal=1.0, width="sigma", widen_on_patches=True,
    gaussian_width="sigma"))
LAPLACIAN = register_kernel(KernelSpec(
    "laplacian", {"sigma": None}, "exp(-||x - y|| / sigma)",
    checks={"sigma": positive}, aliases={"exponential": {}},
    tile=_laplacian_tile, diagonal=1.0, width="sigma"))
POLYNOMIAL = register_kernel(KernelSpec(
    "polynomial", {"degree": 1, "offset": 0.0, "gamma": 1.0}, "(gamma x·y + offset)^degree",
    checks={"degree": positive_integer, "offset": finite, "gamma": finite},
    aliases={"dot": {}, "linear": {"degree": 1, "offset": 0.0, "gamma": 1.0},
             "poly": {"degree": 3, "offset": 1.0, "gamma": None}},
    sklearn=("linear", "poly"), tile=_polynomial_tile, inputs=_scaled_rows,
    diagonal=_polynomial_diagonal, input_scale=_linear_scale))
SIGMOID = register_kernel(KernelSpec(
    "sigmoid", {"gamma": None, "offset": 1.0}, "tanh(gamma x·y + offset)",
    checks={"gamma": finite, "offset": finite}, sklearn=("sigmoid",),
    tile=_sigmoid_tile, diagonal=_sigmoid_diagonal))
COSINE = register_kernel(KernelSpec(
    "cosine", {}, "x·y / (‖x‖ ‖y‖)", sklearn=("cosine",),
    tile=_cosine_tile, inputs=_unit_rows, diagonal=_cosine_diagonal))
PRECOMPUTED = register_kernel(KernelSpec(
    "precomputed", {}, "K[x, y] of a square kernel matrix", sklearn=("precomputed",),
    block=_precomputed_block, diagonal=_precomputed_diagonal, pairwise=True))
CALLABLE = register_kernel(KernelSpec(
    "callable", {"function": None, "kernel_params": ()}, "f(x, y, **kernel_params)",
    block=_callable_block, cacheable=False, by_name=False))
