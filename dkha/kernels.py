"""Kernel functions evaluated blockwise.

One implementation serves fitting, evaluation and transform: every place that needs kernel
values calls :meth:`Kernel.block` on two blocks of samples. A :class:`Kernel` is a small frozen,
picklable value (name and parameters), so it travels to Dask workers as a task argument.

Kernels (``x``, ``y`` row vectors):

* ``gaussian``:   ``exp(-||x - y||² / (2 sigma²))``
* ``laplacian``:  ``exp(-||x - y|| / sigma)`` (the "exponential" kernel)
* ``polynomial``: ``(x·y + offset) ** degree``; ``degree=1, offset=0`` is the dot product
* ``sigmoid``:    ``tanh(gamma · x·y + offset)`` (not positive definite; use with care)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dkha import tiles
from dkha.errors import ParameterError
from dkha.names import KERNEL_ALIASES, KERNELS

_PARAMS = {
    "gaussian": {"sigma": None},
    "laplacian": {"sigma": None},
    "polynomial": {"degree": 1, "offset": 0.0},
    "sigmoid": {"gamma": 1.0, "offset": 0.0},
}


@dataclass(frozen=True)
class Kernel:
    """A kernel function with its parameters.

    Build one with :func:`make_kernel`, which validates the parameters. ``sigma`` must be set
    (a number) before evaluation; :func:`make_kernel` leaves it ``None`` when the median
    heuristic is to choose it (see :func:`median_distance`).
    """

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())
    precision: str = "float64"
    device: str = "cpu"

    def __getitem__(self, key: str):
        return dict(self.params)[key]

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def with_params(self, **updates) -> Kernel:
        p = dict(self.params)
        p.update(updates)
        return replace(make_kernel(self.name, **p), precision=self.precision, device=self.device)

    def computed_with(self, precision: str | None = None, device: str | None = None) -> "Kernel":
        """The same kernel with its tiles computed in ``precision`` on ``device``
        (:mod:`dkha.tiles`; ``None`` keeps the current setting)."""
        precision = self.precision if precision is None else str(precision)
        device = self.device if device is None else str(device)
        tiles.dtype_of(precision)
        tiles.resolve_device(device if device != "auto" else "cpu")
        return replace(self, precision=precision, device=device)

    def tile_spec(self) -> tiles.TileSpec:
        """The kernel as the tile functions of :mod:`dkha.tiles` take it."""
        name = self.name
        if name in ("gaussian", "laplacian"):
            sigma = self["sigma"]
            if sigma is None:
                raise ParameterError(f"the {name} kernel needs sigma; none was set")
            if name == "gaussian":
                return tiles.TileSpec(tiles.GAUSSIAN, 1.0 / (2.0 * sigma * sigma), 0.0, 0.0,
                                      self.precision, self.device)
            return tiles.TileSpec(tiles.LAPLACIAN, 1.0 / sigma, 0.0, 0.0, self.precision,
                                  self.device)
        if name == "polynomial":
            return tiles.TileSpec(tiles.POLYNOMIAL, self["degree"], self["offset"], 0.0,
                                  self.precision, self.device)
        return tiles.TileSpec(tiles.SIGMOID, self["gamma"], self["offset"], 0.0, self.precision,
                              self.device)

    def needs_sigma(self) -> bool:
        return self.name in ("gaussian", "laplacian") and self["sigma"] is None

    def block(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Kernel values ``k(X[i], Y[j])`` as an ``len(X) × len(Y)`` float64 array."""
        return tiles.kernel_tile(self.tile_spec(), X, Y)

    def centered_block(self, X: np.ndarray, Y: np.ndarray, mk_rows: np.ndarray,
                       mk_cols: np.ndarray, mkm: float, *, dtype=np.float64) -> np.ndarray:
        """The centered block ``K'[X, Y] = K[X, Y] − mk_cols − mk_rows[:, None] + mkm``, in one
        sweep over the GEMM's output (coordinator-math.md §1; for new data ``mk_rows`` is
        ``k̄(x)``)."""
        return tiles.kernel_tile(self.tile_spec(), X, Y, mk_rows, mk_cols, mkm, out_dtype=dtype)

    def products(self, X: np.ndarray, Y: np.ndarray, V: np.ndarray | None = None,
                 W: np.ndarray | None = None, mk_rows: np.ndarray | None = None,
                 mk_cols: np.ndarray | None = None, mkm: float = 0.0, *, sums: bool = False):
        """``(T V, Tᵀ W, T 1, Tᵀ 1)`` of the (centered) block ``T = K'[X, Y]`` without writing it
        out (:func:`dkha.tiles.tile_product`)."""
        return tiles.tile_product(self.tile_spec(), X, Y, V, W, mk_rows, mk_cols, mkm, sums=sums)

    def residuals(self, X: np.ndarray, Y: np.ndarray, Cs: tuple, C_rows: slice, C_cols: slice,
                  mk_rows: np.ndarray, mk_cols: np.ndarray, mkm: float) -> np.ndarray:
        """``[‖T‖², ‖T − C[:, C_rows]ᵀ C[:, C_cols]‖² for C in Cs]`` of the centered block
        ``T = K'[X, Y]`` without writing it out (:func:`dkha.tiles.tile_residuals`)."""
        return tiles.tile_residuals(self.tile_spec(), X, Y, Cs, C_rows, C_cols, mk_rows, mk_cols,
                                    mkm)

    def diagonal(self, X: np.ndarray) -> np.ndarray:
        """``k(x, x)`` for each row of ``X``."""
        X = np.asarray(X, dtype=np.float64)
        if self.name in ("gaussian", "laplacian"):
            return np.ones(len(X))
        sq = np.einsum("ij,ij->i", X, X)
        if self.name == "polynomial":
            return (sq + self["offset"]) ** self["degree"]
        return np.tanh(self["gamma"] * sq + self["offset"])

    def describe(self) -> str:
        return self.name + "(" + ", ".join(f"{k}={v}" for k, v in self.params) + ")"


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


def make_kernel(name: str, **params) -> Kernel:
    """A validated :class:`Kernel`.

    Unknown names and parameters, and out-of-range values (``sigma <= 0``, a non-integer or
    negative ``degree``) raise :class:`~dkha.errors.ParameterError`. Parameters given as ``None``
    take their defaults (``sigma=None`` asks for the median-distance heuristic).
    """
    if not isinstance(name, str):
        raise ParameterError(f"kernel name must be a string, got {type(name).__name__}")
    key = KERNEL_ALIASES.get(name.lower(), name.lower())
    if key not in _PARAMS:
        raise ParameterError(f"unknown kernel {name!r}; choose one of {', '.join(KERNELS)}")
    defaults = _PARAMS[key]
    unknown = sorted(set(params) - set(defaults))
    unknown = [u for u in unknown if params[u] is not None]
    if unknown:
        raise ParameterError(
            f"the {key} kernel takes no parameter {', '.join(unknown)}; "
            f"its parameters are {', '.join(defaults)}"
        )
    values = {k: (params.get(k) if params.get(k) is not None else v) for k, v in defaults.items()}
    if key in ("gaussian", "laplacian"):
        s = values["sigma"]
        if s is not None:
            s = float(s)
            if not np.isfinite(s) or s <= 0:
                raise ParameterError(f"sigma must be a positive number, got {s}")
            values["sigma"] = s
    elif key == "polynomial":
        d = values["degree"]
        if float(d) != int(d) or int(d) < 1:
            raise ParameterError(f"degree must be a positive integer, got {d}")
        values["degree"] = int(d)
        values["offset"] = float(values["offset"])
        if not np.isfinite(values["offset"]):
            raise ParameterError("offset must be finite")
    else:
        values["gamma"] = float(values["gamma"])
        values["offset"] = float(values["offset"])
        if not (np.isfinite(values["gamma"]) and np.isfinite(values["offset"])):
            raise ParameterError("gamma and offset must be finite")
    return Kernel(key, tuple(values.items()))


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
            "the median distance between samples is zero (duplicate samples?); set sigma explicitly"
        )
    return med
