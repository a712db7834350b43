"""Kernel functions evaluated blockwise.

One implementation serves fitting, evaluation and transform: every place that needs kernel
values calls :meth:`Kernel.block` on two blocks of samples. A :class:`Kernel` is a small frozen,
picklable value (name, parameters and its :class:`KernelSpec`), so it travels to Dask workers as
a task argument; what differs between kernels is in the spec (:mod:`dkha.kernels.spec`), one a
kernel in one registry: dkha's own in :mod:`dkha.kernels.builtin` (``gaussian``, ``laplacian``,
``polynomial``, ``sigmoid``, ``cosine``, ``precomputed``, and ``callable``, a Python function
``f(x, y, **kernel_params)`` of two samples), others added by :func:`register_kernel` or the
``dkha.kernels`` entry points.

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
from dkha.kernels import builtin
from dkha.kernels.distances import median_distance, squared_distances
from dkha.kernels.spec import (
    KernelSpec,
    kernel_names,
    kernel_spec,
    pairwise,
    register_kernel,
    spec_named,
    spec_of,
)

__all__ = ["KERNELS", "KERNEL_ALIASES", "SKLEARN_DEFAULTS", "SKLEARN_KERNELS", "Kernel",
           "KernelSpec", "kernel_names", "kernel_spec", "make_kernel", "median_distance",
           "pairwise", "precomputed_rows", "register_kernel", "spec_of", "squared_distances"]

_BUILTIN = (builtin.GAUSSIAN, builtin.LAPLACIAN, builtin.POLYNOMIAL, builtin.SIGMOID,
            builtin.COSINE, builtin.PRECOMPUTED)
#: dkha's own kernels by name (:func:`kernel_names` lists the registered ones) and the other
#: names they go by
KERNELS = tuple(s.name for s in _BUILTIN)
KERNEL_ALIASES = {a: s.name for s in _BUILTIN for a in s.aliases}
#: scikit-learn's kernel names (``KernelPCA(kernel=...)``), with its meanings and defaults
SKLEARN_KERNELS = tuple(n for s in _BUILTIN for n in s.sklearn)
#: scikit-learn's defaults under its names (``gamma=None``: ``1/n_features`` at fit time)
SKLEARN_DEFAULTS = {a: dict(d) for s in _BUILTIN for a, d in s.aliases.items() if a in s.sklearn}


@dataclass(frozen=True)
class Kernel:
    """A kernel function with its parameters.

    Build one with :func:`make_kernel`, which validates the parameters. A width (the gaussian's
    ``sigma``) must be set (a number) before evaluation; :func:`make_kernel` leaves it ``None``
    when the median heuristic is to choose it (see :func:`median_distance`,
    :meth:`needs_width`), and ``gamma`` ``None`` where scikit-learn's ``1/n_features`` is to
    fill it (:meth:`with_defaults`). A callable kernel's function is ``function`` (its name is
    in the parameters, which stay JSON-able for the saved attrs). ``spec`` is the kernel's
    :class:`KernelSpec` (the registered one of ``name`` unless given), to which every method
    below dispatches.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())
    precision: str = "float64"
    device: str = "cpu"
    function: Any = None
    spec: KernelSpec = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.spec is None:
            object.__setattr__(self, "spec", spec_named(self.name))

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
        return self.spec.cacheable

    @property
    def compiled(self) -> bool:
        """Whether a compiled tile of :mod:`dkha.tiles` evaluates the kernel (on the CPU or a
        GPU); else its spec's NumPy block, on the CPU (the GPU band passes are not for it)."""
        return self.spec.compiled

    def with_params(self, **updates) -> Kernel:
        p = self.param_dict
        p.update(updates)
        made = make_kernel(self.function if self.function is not None else self.name, **p)
        return replace(made, precision=self.precision, device=self.device)

    def with_defaults(self, n_features: int) -> Kernel:
        """The kernel with scikit-learn's ``gamma = 1/n_features`` where ``gamma`` is ``None``."""
        if "gamma" in dict(self.params) and self["gamma"] is None:
            return self.with_params(gamma=1.0 / int(n_features))
        return self

    def with_width(self, width: float) -> Kernel:
        """The kernel with its width (the spec's ``width`` parameter, e.g. ``sigma``) set."""
        if self.spec.width is None:
            raise ParameterError(f"the {self.name} kernel has no width parameter")
        return self.with_params(**{self.spec.width: float(width)})

    def computed_with(self, precision: str | None = None, device: str | None = None) -> Kernel:
        """The same kernel with its tiles computed in ``precision`` on ``device``
        (:mod:`dkha.tiles`; ``None`` keeps the current setting)."""
        precision = self.precision if precision is None else str(precision)
        device = self.device if device is None else str(device)
        tiles.dtype_of(precision)
        tiles.resolve_device(device if device != "auto" else "cpu")
        return replace(self, precision=precision, device=device)

    def tile_spec(self) -> tiles.TileSpec:
        """The kernel as the tile functions of :mod:`dkha.tiles` take it (the spec's tile code
        and constants; the polynomial's ``gamma`` and the cosine's norms are applied to the
        inputs, :meth:`tile_inputs`)."""
        if not self.spec.compiled:
            raise ParameterError(f"the {self.name} kernel has no compiled tile")
        code, p1, p2, p3 = self.spec.tile(self)
        return tiles.TileSpec(code, p1, p2, p3, self.precision, self.device)

    def tile_inputs(self, X: np.ndarray) -> np.ndarray:
        """The rows as :meth:`tile_spec`'s tiles take them (the spec's ``inputs``: scaled by
        ``√gamma`` for the polynomial, unit rows for the cosine): what a worker keeps resident
        for whole passes (:mod:`dkha.engine.device`)."""
        return X if self.spec.inputs is None else self.spec.inputs(self, X)

    def input_scale(self) -> float | None:
        """``s`` where the feature map is ``Φ(x) = s·x`` (the linear kernel, a polynomial of
        degree 1 without offset: ``s = √gamma``), else None: no input-space vectors."""
        return None if self.spec.input_scale is None else self.spec.input_scale(self)

    def gaussian_sigma(self) -> float | None:
        """``σ`` where ``k(x, y) = exp(−‖x − y‖² / (2σ²))`` (the spec's ``gaussian_width``), else
        None: the fixed-point and gradient pre-images apply where it is set."""
        return None if self.spec.gaussian_width is None else self[self.spec.gaussian_width]

    def needs_width(self) -> bool:
        """Whether the median-distance heuristic is to set the kernel's width."""
        return self.spec.width is not None and self[self.spec.width] is None

    def _python_block(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """``k(X[i], Y[j])`` by the spec's NumPy block (a kernel without a compiled tile)."""
        return np.asarray(self.spec.block(self, X, Y), dtype=np.float64)

    def block(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Kernel values ``k(X[i], Y[j])`` as an ``len(X) × len(Y)`` float64 array."""
        if not self.compiled:
            return self._python_block(X, Y)
        return tiles.kernel_tile(self.tile_spec(), self.tile_inputs(X), self.tile_inputs(Y))

    def centered_block(self, X: np.ndarray, Y: np.ndarray, mk_rows: np.ndarray,
                       mk_cols: np.ndarray, mkm: float, *, dtype=np.float64,
                       out: np.ndarray | None = None) -> np.ndarray:
        """The centered block ``K'[X, Y] = K[X, Y] − mk_cols − mk_rows[:, None] + mkm``, in one
        sweep over the GEMM's output (coordinator-math.md §1; for new data ``mk_rows`` is
        ``k̄(x)``); written into ``out`` (``|X| × |Y|``, of ``dtype``) where given."""
        if not self.compiled:
            K = self._python_block(X, Y)
            K -= np.asarray(mk_cols)[None, :]
            K -= (np.asarray(mk_rows) - mkm)[:, None]
            if out is not None:
                out[...] = K
                return out
            return K.astype(dtype, copy=False)
        if not isinstance(Y, tiles.Columns):
            Y = self.tile_inputs(Y)
        return tiles.kernel_tile(self.tile_spec(), self.tile_inputs(X), Y, mk_rows,
                                 mk_cols, mkm, out_dtype=dtype, out=out)

    def prepared_columns(self, Y: np.ndarray):
        """``Y`` as :meth:`centered_block` takes it for many row blocks against the same columns
        (:func:`dkha.tiles.prepare_columns`: its norms, precision and shift computed once);
        ``Y`` itself for a kernel without a compiled tile."""
        if not self.compiled:
            return Y
        return tiles.prepare_columns(self.tile_spec(), self.tile_inputs(Y))

    def products(self, X: np.ndarray, Y: np.ndarray, V: np.ndarray | None = None,
                 W: np.ndarray | None = None, mk_rows: np.ndarray | None = None,
                 mk_cols: np.ndarray | None = None, mkm: float = 0.0, *, sums: bool = False):
        """``(T V, Tᵀ W, T 1, Tᵀ 1)`` of the (centered) block ``T = K'[X, Y]`` without writing it
        out (:func:`dkha.tiles.tile_product`)."""
        if not self.compiled:
            T = self._python_block(X, Y)
            if mk_cols is not None:
                T -= np.asarray(mk_cols)[None, :]
            if mk_rows is not None:
                T -= (np.asarray(mk_rows) - mkm)[:, None]
            return (None if V is None else T @ V, None if W is None else T.T @ W,
                    T.sum(axis=1) if sums else None, T.sum(axis=0) if sums else None)
        return tiles.tile_product(self.tile_spec(), self.tile_inputs(X), self.tile_inputs(Y),
                                  V, W, mk_rows, mk_cols, mkm, sums=sums)

    def residuals(self, X: np.ndarray, Y: np.ndarray, Cs: tuple, C_rows: slice, C_cols: slice,
                  mk_rows: np.ndarray, mk_cols: np.ndarray, mkm: float) -> np.ndarray:
        """``[‖T‖², ‖T − C[:, C_rows]ᵀ C[:, C_cols]‖² for C in Cs]`` of the centered block
        ``T = K'[X, Y]`` without writing it out (:func:`dkha.tiles.tile_residuals`)."""
        if not self.compiled:
            T = self.centered_block(X, Y, mk_rows, mk_cols, mkm)
            return np.array([float((T * T).sum())]
                            + [float(((T - C[:, C_rows].T @ C[:, C_cols]) ** 2).sum())
                               for C in Cs])
        return tiles.tile_residuals(self.tile_spec(), self.tile_inputs(X), self.tile_inputs(Y),
                                    Cs, C_rows, C_cols, mk_rows, mk_cols, mkm)

    def constant_diagonal(self) -> float | None:
        """``k(x, x)`` where it is the same for every ``x`` (1 for the gaussian), else None."""
        d = self.spec.diagonal
        return None if d is None or callable(d) else float(d)

    def diagonal(self, X: np.ndarray) -> np.ndarray:
        """``k(x, x)`` for each row of ``X``."""
        X = np.asarray(X, dtype=np.float64)
        d = self.spec.diagonal
        if d is None:
            return np.array([self._python_block(x[None], x[None])[0, 0] for x in X])
        if callable(d):
            return np.asarray(d(self, X), dtype=np.float64)
        return np.full(len(X), float(d))

    def describe(self) -> str:
        return self.name + "(" + ", ".join(f"{k}={v}" for k, v in self.params) + ")"


def precomputed_rows(K: np.ndarray) -> np.ndarray:
    """The rows of a square kernel matrix as the ``precomputed`` kernel's data: each row with
    its index appended as a last column (so a block needs only its rows)."""
    K = np.asarray(K, dtype=np.float64)
    return np.hstack([K, np.arange(len(K), dtype=np.float64)[:, None]])


def make_kernel(name, **params) -> Kernel:
    """A validated :class:`Kernel`.

    Parameters
    ----------
    name : str or callable
        A registered kernel (:func:`kernel_names`: dkha's own, :data:`KERNELS`, and those of
        :func:`register_kernel`), an alias (scikit-learn's names among them, with
        scikit-learn's defaults: :data:`SKLEARN_DEFAULTS`), or a callable
        ``f(x, y, **kernel_params)``.
    **params
        The kernel's parameters (its spec's ``params``); ``kernel_params``, a dict of them
        (a callable's keyword arguments). ``coef0`` is scikit-learn's name of ``offset``; for
        the gaussian, ``gamma`` gives ``sigma = 1/√(2 gamma)``. Parameters given as ``None``
        take their defaults (``sigma=None`` asks for the median-distance heuristic,
        ``gamma=None`` for ``1/n_features`` where :meth:`Kernel.with_defaults` is given the
        data's width).

    Returns
    -------
    Kernel
        Unknown names and parameters, and out-of-range values (``sigma <= 0``, a non-integer or
        negative ``degree``) raise :class:`~dkha.errors.ParameterError`.
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
    got = kernel_spec(name)
    if got is None or not got[0].by_name:
        raise ParameterError(f"unknown kernel {name!r}; choose one of "
                             f"{', '.join(kernel_names())} or a callable")
    spec, asked = got
    for key, value in dict(params.pop("kernel_params", None) or {}).items():
        if params.get(key) is not None and params[key] != value:
            raise ParameterError(f"{key} is given twice, as a keyword and in kernel_params")
        params[key] = value
    defaults = spec.defaults(asked)
    unknown = sorted(k for k, v in params.items()
                     if v is not None and k not in defaults and k not in spec.accepts)
    if unknown:
        raise ParameterError(
            f"the {spec.name} kernel takes no parameter {', '.join(unknown)}; "
            f"its parameters are {', '.join(defaults) or 'none'}"
        )
    values = {k: (params.get(k) if params.get(k) is not None else v) for k, v in defaults.items()}
    values.update({k: params[k] for k in spec.accepts
                   if k not in values and params.get(k) is not None})
    if spec.validate is not None:
        values = spec.validate(values)
    for key, check in spec.checks.items():
        if values.get(key) is not None:
            values[key] = check(key, values[key])
    return Kernel(spec.name, tuple(values.items()), spec=spec)


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
                  function=function, spec=builtin.CALLABLE)
