"""Distances between rows: the GEMM expansion of ``‖x − y‖²`` and the median-distance
heuristic of a kernel's width."""

from __future__ import annotations

import numpy as np

from dkha.errors import ParameterError


def squared_distances(X: np.ndarray, Y: np.ndarray, *, refine_close: bool = False) -> np.ndarray:
    """``||X[i] - Y[j]||²``, by the GEMM expansion, clipped at zero.

    The expansion's rounding error is about ``eps·(||x||² + ||y||²)``, which a square root turns
    into ``~sqrt(eps)·||x||`` for (near-)coincident pairs (``k(x, x)`` of the laplacian came out as
    ``1 − 1e-7``). ``refine_close`` recomputes the pairs closer than ``1e-6`` of that scale from
    their differences.
    """
    xx = np.einsum("ij,ij->i", X, X)
    yy = np.einsum("ij,ij->i", Y, Y)
    d2 = X @ Y.T
    d2 *= -2.0
    d2 += xx[:, None]
    d2 += yy[None, :]
    np.maximum(d2, 0.0, out=d2)
    if refine_close and d2.size:
        i, j = np.nonzero(d2 <= 1e-6 * (xx.max() + yy.max()))
        for s in range(0, len(i), 4096):
            diff = X[i[s:s + 4096]] - Y[j[s:s + 4096]]
            d2[i[s:s + 4096], j[s:s + 4096]] = np.einsum("ij,ij->i", diff, diff)
    return d2


def median_distance(X: np.ndarray) -> float:
    """Median of the pairwise Euclidean distances between distinct rows of ``X``.

    The median-distance heuristic for ``sigma``; callers pass a seeded random sample of the data
    (``dkha.median-sample`` rows) so the cost is bounded.
    """
    X = np.asarray(X, dtype=np.float64)
    if len(X) < 2:
        raise ParameterError("the median-distance heuristic needs at least two samples")
    d2 = squared_distances(X, X, refine_close=True)
    iu = np.triu_indices(len(X), k=1)
    # the median of the distances: sqrt(median(d²)) differs when the number of pairs is even
    med = float(np.median(np.sqrt(d2[iu])))
    if not med > 0:
        raise ParameterError(
            "the median distance between samples is zero (duplicate samples?); set the kernel's "
            "width (sigma) explicitly"
        )
    return med
