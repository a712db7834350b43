"""Kernel functions evaluated blockwise.

One implementation serves fitting, evaluation and transform: every place that needs kernel
values calls :meth:`Kernel.block` on two blocks of samples. A :class:`Kernel` is a small frozen,
picklable value (name and parameters), so it travels to Dask workers as a task argument.

Kernels (``x``, ``y`` row vectors):

* ``gaussian``:   ``exp(-||x - y||² / (2 sigma²))``
* ``laplacian``:  ``exp(-||x - y|| / sigma)`` (the "exponential" kernel)
* ``polynomial``: ``(gamma · x·y + offset) ** degree``; ``degree=1, offset=0, gamma=1`` is the
  dot product
* ``sigmoid``:    ``tanh(gamma · x·y + offset)`` (not positive definite; use with care)
* ``cosine``:     ``x·y / (‖x‖ ‖y‖)`` (0 where a norm is 0)
* ``callable``:   a Python function ``f(x, y, **kernel_params)`` of two samples, evaluated per
  pair on the workers (scikit-learn's ``pairwise_kernels`` with a callable metric: slow)
* ``precomputed``: the data are the rows of a square kernel matrix; the row engine's stores
  carry each row's index as a last column (:func:`precomputed_rows`), so a block is
  ``K[P, J] = rows_P[:, index_J]``

scikit-learn's names (``KernelPCA(kernel=...)``) take scikit-learn's parameters and defaults
(:data:`SKLEARN_DEFAULTS`): ``rbf`` is the gaussian with ``gamma = 1/(2σ²)`` (default
``1/n_features``), ``poly`` is the polynomial with ``gamma`` (default ``1/n_features``),
``coef0`` (dkha's ``offset``, default 1) and ``degree`` (default 3), ``linear`` the dot product,
``sigmoid`` ``tanh(gamma x·y + coef0)`` (default ``gamma = 1/n_features``, ``coef0 = 1``). A
``None`` that needs ``n_features`` is filled by :meth:`Kernel.with_defaults` at fit time.
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
    "polynomial": {"degree": 1, "offset": 0.0, "gamma": 1.0},
    "sigmoid": {"gamma": None, "offset": 1.0},
    "cosine": {},
    "precomputed": {},
    "callable": {"function": None, "kernel_params": ()},
}
#: scikit-learn's defaults under its names (``gamma=None``: ``1/n_features`` at fit time)
SKLEARN_DEFAULTS = {
    "rbf": {"gamma": None},
    "poly": {"degree": 3, "offset": 1.0, "gamma": None},
    "linear": {"degree": 1, "offset": 0.0, "gamma": 1.0},
}
#: kernels that have their own Python block function rather than a compiled tile
PYTHON_KERNELS = ("cosine", "precomputed", "callable")


@dataclass(frozen=True)
class Kernel:
    """A kernel function with its parameters.

    Build one with :func:`make_kernel`, which validates the parameters. ``sigma`` must be set
    (a number) before evaluation; :func:`make_kernel` leaves it ``None`` when the median
    heuristic is to choose it (see :func:`median_distance`), and ``gamma`` ``None`` where
    scikit-learn's ``1/n_features`` is to fill it (:meth:`with_defaults`). A callable kernel's
    function is ``function`` (its name is in the parameters, which stay JSON-able for the saved
    attrs).
    """

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())
    precision: str = "float64"
    device: str = "cpu"
    function: Any = None

    def __getitem__(self, key: str):
        return dict(self.params)[key]

    @property
    def param_dict(self) -> dict[str, Any]:
        p = dict(self.params)
        if "kernel_params" in p:
            p["kernel_params"] = dict(p["kernel_params"])
        return p

    @property
    def cacheable(self) -> bool:
        """Whether values of this kernel may be cached under its name and parameters (a
        callable's are known by its name only, so not)."""
        return self.name != "callable"

    def with_params(self, **updates) -> Kernel:
        p = self.param_dict
        p.update(updates)
        if self.name == "callable":
            p.pop("function")
            return replace(make_kernel(self.function, **p), precision=self.precision,
                           device=self.device)
        return replace(make_kernel(self.name, **p), precision=self.precision, device=self.device)

    def with_defaults(self, n_features: int) -> Kernel:
        """The kernel with scikit-learn's ``gamma = 1/n_features`` where ``gamma`` is ``None``."""
        if "gamma" in dict(self.params) and self["gamma"] is None:
            return self.with_params(gamma=1.0 / int(n_features))
        return self

    def computed_with(self, precision: str | None = None, device: str | None = None) -> Kernel:
        """The same kernel with its tiles computed in ``precision`` on ``device``
        (:mod:`dkha.tiles`; ``None`` keeps the current setting)."""
        precision = self.precision if precision is None else str(precision)
        device = self.device if device is None else str(device)
        tiles.dtype_of(precision)
        tiles.resolve_device(device if device != "auto" else "cpu")
        return replace(self, precision=precision, device=device)

    def tile_spec(self) -> tiles.TileSpec:
        """The kernel as the tile functions of :mod:`dkha.tiles` take it (the polynomial's
        ``gamma`` and the cosine's norms are applied to the inputs, :meth:`_inputs`)."""
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
        if name in ("polynomial", "cosine"):
            degree, offset = (1, 0.0) if name == "cosine" else (self["degree"], self["offset"])
            return tiles.TileSpec(tiles.POLYNOMIAL, degree, offset, 0.0, self.precision,
                                  self.device)
        if name == "sigmoid":
            if self["gamma"] is None:
                raise ParameterError("the sigmoid kernel needs gamma; none was set")
            return tiles.TileSpec(tiles.SIGMOID, self["gamma"], self["offset"], 0.0,
                                  self.precision, self.device)
        raise ParameterError(f"the {name} kernel has no compiled tile")

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        """The rows as the compiled tile takes them: scaled by ``√gamma`` for the polynomial
        (``(γ x·y + c)^d = ((√γ x)·(√γ y) + c)^d``), unit rows for the cosine."""
        if self.name == "polynomial":
            g = self["gamma"]
            if g is None:
                raise ParameterError("the polynomial kernel needs gamma; none was set")
            return X if g == 1.0 else np.asarray(X, dtype=np.float64) * np.sqrt(g)
        if self.name == "cosine":
            X = np.asarray(X, dtype=np.float64)
            norms = np.sqrt(np.einsum("ij,ij->i", X, X))
            return X / np.where(norms > 0, norms, 1.0)[:, None]
        return X

    def tile_inputs(self, X: np.ndarray) -> np.ndarray:
        """The rows as :meth:`tile_spec`'s tiles take them (see :meth:`_inputs`): what a worker
        keeps resident for whole passes (:mod:`dkha.engine.device`)."""
        return self._inputs(X)

    def input_scale(self) -> float | None:
        """``s`` where the feature map is ``Φ(x) = s·x`` (the linear kernel, a polynomial of
        degree 1 without offset: ``s = √gamma``), else None: no input-space vectors."""
        p = dict(self.params)
        if self.name == "polynomial" and p.get("degree") == 1 and not p.get("offset"):
            gamma = p.get("gamma")
            return float(np.sqrt(gamma)) if gamma is not None else None
        return None

    def needs_sigma(self) -> bool:
        return self.name in ("gaussian", "laplacian") and self["sigma"] is None

    def _python_block(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """``k(X[i], Y[j])`` of a precomputed or callable kernel."""
        if self.name == "precomputed":
            X = np.asarray(X, dtype=np.float64)
            Y = np.asarray(Y, dtype=np.float64)
            return np.ascontiguousarray(X[:, Y[:, -1].astype(np.int64)])
        from sklearn.metrics.pairwise import pairwise_kernels

        if self.function is None:
            raise ParameterError(f"the callable kernel {self['function']} is not available "
                                 "here (a saved run keeps its name only); pass the function")
        return np.asarray(pairwise_kernels(np.asarray(X, dtype=np.float64),
                                           np.asarray(Y, dtype=np.float64),
                                           metric=self.function, filter_params=False,
                                           **dict(self["kernel_params"])), dtype=np.float64)

    def block(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Kernel values ``k(X[i], Y[j])`` as an ``len(X) × len(Y)`` float64 array."""
        if self.name in ("precomputed", "callable"):
            return self._python_block(X, Y)
        return tiles.kernel_tile(self.tile_spec(), self._inputs(X), self._inputs(Y))

    def centered_block(self, X: np.ndarray, Y: np.ndarray, mk_rows: np.ndarray,
                       mk_cols: np.ndarray, mkm: float, *, dtype=np.float64) -> np.ndarray:
        """The centered block ``K'[X, Y] = K[X, Y] − mk_cols − mk_rows[:, None] + mkm``, in one
        sweep over the GEMM's output (coordinator-math.md §1; for new data ``mk_rows`` is
        ``k̄(x)``)."""
        if self.name in ("precomputed", "callable"):
            K = self._python_block(X, Y)
            K -= np.asarray(mk_cols)[None, :]
            K -= (np.asarray(mk_rows) - mkm)[:, None]
            return K.astype(dtype, copy=False)
        if not isinstance(Y, tiles.Columns):
            Y = self._inputs(Y)
        return tiles.kernel_tile(self.tile_spec(), self._inputs(X), Y, mk_rows,
                                 mk_cols, mkm, out_dtype=dtype)

    def prepared_columns(self, Y: np.ndarray):
        """``Y`` as :meth:`centered_block` takes it for many row blocks against the same columns
        (:func:`dkha.tiles.prepare_columns`: its norms, precision and shift computed once);
        ``Y`` itself for the precomputed and callable kernels."""
        if self.name in ("precomputed", "callable"):
            return Y
        return tiles.prepare_columns(self.tile_spec(), self._inputs(Y))

    def products(self, X: np.ndarray, Y: np.ndarray, V: np.ndarray | None = None,
                 W: np.ndarray | None = None, mk_rows: np.ndarray | None = None,
                 mk_cols: np.ndarray | None = None, mkm: float = 0.0, *, sums: bool = False):
        """``(T V, Tᵀ W, T 1, Tᵀ 1)`` of the (centered) block ``T = K'[X, Y]`` without writing it
        out (:func:`dkha.tiles.tile_product`)."""
        if self.name in ("precomputed", "callable"):
            T = self._python_block(X, Y)
            if mk_cols is not None:
                T -= np.asarray(mk_cols)[None, :]
            if mk_rows is not None:
                T -= (np.asarray(mk_rows) - mkm)[:, None]
            return (None if V is None else T @ V, None if W is None else T.T @ W,
                    T.sum(axis=1) if sums else None, T.sum(axis=0) if sums else None)
        return tiles.tile_product(self.tile_spec(), self._inputs(X), self._inputs(Y), V, W,
                                  mk_rows, mk_cols, mkm, sums=sums)

    def residuals(self, X: np.ndarray, Y: np.ndarray, Cs: tuple, C_rows: slice, C_cols: slice,
                  mk_rows: np.ndarray, mk_cols: np.ndarray, mkm: float) -> np.ndarray:
        """``[‖T‖², ‖T − C[:, C_rows]ᵀ C[:, C_cols]‖² for C in Cs]`` of the centered block
        ``T = K'[X, Y]`` without writing it out (:func:`dkha.tiles.tile_residuals`)."""
        if self.name in ("precomputed", "callable"):
            T = self.centered_block(X, Y, mk_rows, mk_cols, mkm)
            return np.array([float((T * T).sum())]
                            + [float(((T - C[:, C_rows].T @ C[:, C_cols]) ** 2).sum())
                               for C in Cs])
        return tiles.tile_residuals(self.tile_spec(), self._inputs(X), self._inputs(Y), Cs,
                                    C_rows, C_cols, mk_rows, mk_cols, mkm)

    def diagonal(self, X: np.ndarray) -> np.ndarray:
        """``k(x, x)`` for each row of ``X``."""
        X = np.asarray(X, dtype=np.float64)
        if self.name in ("gaussian", "laplacian"):
            return np.ones(len(X))
        if self.name == "precomputed":
            return X[np.arange(len(X)), X[:, -1].astype(np.int64)]
        if self.name == "callable":
            return np.array([self._python_block(x[None], x[None])[0, 0] for x in X])
        if self.name == "cosine":
            return (np.einsum("ij,ij->i", X, X) > 0).astype(np.float64)
        sq = np.einsum("ij,ij->i", X, X)
        if self.name == "polynomial":
            return (self["gamma"] * sq + self["offset"]) ** self["degree"]
        return np.tanh(self["gamma"] * sq + self["offset"])

    def describe(self) -> str:
        return self.name + "(" + ", ".join(f"{k}={v}" for k, v in self.params) + ")"


def precomputed_rows(K: np.ndarray) -> np.ndarray:
    """The rows of a square kernel matrix as the ``precomputed`` kernel's data: each row with
    its index appended as a last column (so a block needs only its rows)."""
    K = np.asarray(K, dtype=np.float64)
    return np.hstack([K, np.arange(len(K), dtype=np.float64)[:, None]])


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


def make_kernel(name, **params) -> Kernel:
    """A validated :class:`Kernel`.

    ``name``: one of :data:`KERNELS`, an alias (scikit-learn's names among them, with
    scikit-learn's defaults: :data:`SKLEARN_DEFAULTS`), or a callable ``f(x, y, **kernel_params)``.
    ``coef0`` is scikit-learn's name of ``offset``; for the gaussian, ``gamma`` gives
    ``sigma = 1/√(2 gamma)``. Unknown names and parameters, and out-of-range values
    (``sigma <= 0``, a non-integer or negative ``degree``) raise
    :class:`~dkha.errors.ParameterError`. Parameters given as ``None`` take their defaults
    (``sigma=None`` asks for the median-distance heuristic, ``gamma=None`` for ``1/n_features``
    where :meth:`Kernel.with_defaults` is given the data's width).
    """
    params = dict(params)
    if params.get("coef0") is not None:
        if params.get("offset") is not None and params["offset"] != params["coef0"]:
            raise ParameterError("give coef0 or offset (the same parameter), not both")
        params["offset"] = params["coef0"]
    params.pop("coef0", None)
    if callable(name):
        return _callable_kernel(name, params)
    if not isinstance(name, str):
        raise ParameterError("kernel name must be a string or a callable, "
                             f"got {type(name).__name__}")
    asked = name.lower()
    key = KERNEL_ALIASES.get(asked, asked)
    if key not in _PARAMS or key == "callable":
        raise ParameterError(f"unknown kernel {name!r}; choose one of "
                             f"{', '.join(KERNELS + tuple(KERNEL_ALIASES))} or a callable")
    if key == "callable" or params.get("kernel_params") is None:
        params.pop("kernel_params", None)
    else:
        raise ParameterError("kernel_params apply to a callable kernel only; the "
                             f"{key} kernel takes {', '.join(_PARAMS[key]) or 'none'}")
    if key == "gaussian" and params.get("gamma") is not None:
        gamma = float(params.pop("gamma"))
        if params.get("sigma") is not None:
            raise ParameterError("give gamma or sigma for the gaussian kernel, not both "
                                 "(gamma = 1/(2 sigma²))")
        if not (np.isfinite(gamma) and gamma > 0):
            raise ParameterError(f"gamma must be a positive number, got {gamma}")
        params["sigma"] = float(np.sqrt(0.5 / gamma))
    elif key == "gaussian":
        params.pop("gamma", None)
    defaults = dict(_PARAMS[key], **SKLEARN_DEFAULTS.get(asked, {}))
    unknown = sorted(set(params) - set(defaults))
    unknown = [u for u in unknown if params[u] is not None]
    if unknown:
        raise ParameterError(
            f"the {key} kernel takes no parameter {', '.join(unknown)}; "
            f"its parameters are {', '.join(defaults) or 'none'}"
        )
    values = {k: (params.get(k) if params.get(k) is not None else v) for k, v in defaults.items()}
    if key == "gaussian" and values["sigma"] is not None:
        values.pop("gamma", None)        # rbf's gamma=None: 1/n_features unless sigma is given
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
    if "gamma" in values and values["gamma"] is not None:
        values["gamma"] = float(values["gamma"])
        if not np.isfinite(values["gamma"]):
            raise ParameterError("gamma must be finite")
    if key == "sigmoid":
        values["offset"] = float(values["offset"])
        if not np.isfinite(values["offset"]):
            raise ParameterError("offset must be finite")
    return Kernel(key, tuple(values.items()))


def _callable_kernel(function, params: dict) -> Kernel:
    kernel_params = params.pop("kernel_params", None) or {}
    params.pop("function", None)
    extra = sorted(k for k, v in params.items() if v is not None)
    if extra:
        raise ParameterError(f"a callable kernel takes its parameters in kernel_params, not "
                             f"{', '.join(extra)}")
    if not isinstance(kernel_params, dict):
        kernel_params = dict(kernel_params)
    label = (f"{getattr(function, '__module__', '?')}."
             f"{getattr(function, '__qualname__', repr(function))}")
    return Kernel("callable", (("function", label),
                               ("kernel_params", tuple(sorted(kernel_params.items())))),
                  function=function)


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
