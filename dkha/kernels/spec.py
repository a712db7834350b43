"""What a kernel is to dkha: one :class:`KernelSpec` per kernel, in one registry.

A spec carries everything that differs between kernels (as xarray's backend entrypoints carry
what differs between file formats): its parameters and their defaults, their checks, the other
names it goes by (scikit-learn's among them, with their defaults), the compiled tile that
evaluates it (:mod:`dkha.tiles`) and the transform of the rows before it, or else a NumPy block
function, its diagonal ``k(x, x)``, the parameter the median-distance heuristic sets, the
input-space scale of a linear kernel, whether its values may be cached by name, and what the
rest of dkha does differently for it (the width on image patches, the gaussian pre-images,
scikit-learn's ``gamma_``, a kernel matrix as the data). :class:`dkha.kernels.Kernel`
dispatches every evaluation to its spec; nothing else asks which kernel it is.

A kernel is added by :func:`register_kernel` (``dkha.register_kernel``), from any module; a
kernel of an installed package is found through the entry point group ``dkha.kernels`` (each
entry point names a :class:`KernelSpec`), loaded the first time a name is not registered.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dkha.errors import ParameterError

#: the entry point group of kernels from other packages (each names a :class:`KernelSpec`)
ENTRY_POINT_GROUP = "dkha.kernels"


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """A kernel's behaviour: what :class:`~dkha.kernels.Kernel` and
    :func:`~dkha.kernels.make_kernel` ask of it.

    Functions take the :class:`~dkha.kernels.Kernel` (its parameters by ``kernel["name"]``)
    first. A spec travels to the workers inside each kernel value, its functions pickled by
    reference: define them at module level in a module the workers can import (which
    registers the spec when it is imported).

    Parameters
    ----------
    name : str
        The kernel's name (lower case), saved in a run's ``kernel`` attr.
    params : mapping
        Its parameters and their defaults, in order (``None``: set later, by the median
        heuristic for ``width``, by scikit-learn's ``1/n_features`` for ``gamma``,
        :meth:`~dkha.kernels.Kernel.with_defaults`). Saved as the run's ``kernel_parameters``.
    formula : str
        ``k(x, y)`` in words, for the documentation and error messages.
    checks : mapping
        Parameter name → ``check(name, value) -> value``: validates a set (not-``None``) value
        and returns it converted (:func:`positive`, :func:`finite`, :func:`positive_integer`).
    validate : callable, optional
        ``validate(values) -> values`` across parameters, before the checks (the gaussian turns
        scikit-learn's ``gamma`` into ``sigma``).
    accepts : tuple of str
        Parameters taken beside ``params`` for ``validate`` to translate (the gaussian's
        ``gamma``).
    aliases : mapping
        Other names of the kernel → the defaults they change (``{"rbf": {"gamma": None}}``).
    sklearn : tuple of str
        The names (its own or aliases) under which scikit-learn's ``KernelPCA`` knows it, with
        scikit-learn's meaning and defaults.
    tile : callable, optional
        ``tile(kernel) -> (code, p1, p2, p3)``: the compiled tile of :mod:`dkha.tiles` that
        evaluates the kernel on the rows ``inputs`` gives (code ``GAUSSIAN``, ``LAPLACIAN``,
        ``POLYNOMIAL`` or ``SIGMOID`` and its constants). ``None``: ``block`` evaluates it.
    inputs : callable, optional
        ``inputs(kernel, X) -> X'``: the rows as the tile takes them (the polynomial's
        ``√gamma``, the cosine's unit rows); ``None``: the rows themselves.
    block : callable, optional
        ``block(kernel, X, Y) -> K``: a new float64 ``len(X) × len(Y)`` array of
        ``k(X[i], Y[j])``, for a kernel without a compiled tile (NumPy on the CPU, whatever
        the kernel's ``device``; :func:`~dkha.kernels.squared_distances` gives ``‖x − y‖²``).
    diagonal : callable, float or None
        ``k(x, x)``: ``diagonal(kernel, X) -> d`` per row, a number where it is constant (no
        data read for it), ``None``: from ``block`` row by row.
    width : str, optional
        The parameter the median-distance heuristic sets where it is ``None``
        (:func:`~dkha.kernels.median_distance`).
    input_scale : callable, optional
        ``input_scale(kernel) -> s | None``: ``s`` where the feature map is ``Φ(x) = s·x`` (a
        linear kernel: input-space vectors exist), else ``None``.
    cacheable : bool
        Whether its values may be cached under its name and parameters.
    by_name : bool
        Whether :func:`~dkha.kernels.make_kernel` takes it by name (not the ``callable``
        kernel, made from a function, whose parameters are the function's name and keywords).
    widen_on_patches : bool
        Whether the median-distance ``width`` is multiplied by ``dkha.patch-sigma-factor`` (3)
        on image patches (the gaussian: the width that keeps patch denoising level with linear
        patch PCA, :func:`dkha.fit.coordinator.resolve_kernel`).
    gaussian_width : str, optional
        The parameter ``σ`` where ``k(x, y) = exp(−‖x − y‖² / (2σ²))``: the fixed-point and
        gradient pre-images (:mod:`dkha.apply.preimage`) apply, the fixed point by default
        (else the conformal pre-image), and scikit-learn's ``gamma_`` is ``1/(2σ²)``
        (:meth:`dkha.kernels.Kernel.gaussian_sigma`).
    pairwise : bool
        Whether the data are the rows of a square kernel matrix (``precomputed``): the
        estimators take the matrix as ``X`` and append each row's index
        (:func:`~dkha.kernels.precomputed_rows`), scikit-learn's ``pairwise`` tag is set, and
        neither an online fit nor a learned pre-image takes it.
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    formula: str = ""
    checks: Mapping[str, Callable] = field(default_factory=dict)
    validate: Callable | None = None
    accepts: tuple[str, ...] = ()
    aliases: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sklearn: tuple[str, ...] = ()
    tile: Callable | None = None
    inputs: Callable | None = None
    block: Callable | None = None
    diagonal: Callable | float | None = None
    width: str | None = None
    input_scale: Callable | None = None
    cacheable: bool = True
    by_name: bool = True
    widen_on_patches: bool = False
    gaussian_width: str | None = None
    pairwise: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or self.name != self.name.lower():
            raise ParameterError(f"a kernel's name is a non-empty lower-case string, got "
                                 f"{self.name!r}")
        if (self.tile is None) == (self.block is None):
            raise ParameterError(f"the {self.name} kernel needs a compiled tile or a block "
                                 "function (one of them)")
        for what, param in (("width", self.width), ("gaussian width", self.gaussian_width)):
            if param is not None and param not in self.params:
                raise ParameterError(f"the {self.name} kernel's {what} {param!r} is not one of "
                                     f"its parameters ({', '.join(self.params) or 'none'})")
        unknown = sorted(set(self.checks) - set(self.params) - set(self.accepts))
        if unknown:
            raise ParameterError(f"the {self.name} kernel checks parameters it does not take: "
                                 f"{', '.join(unknown)}")

    def __reduce_ex__(self, protocol):
        # a registered spec travels by name and module: the receiving process imports the
        # module (which registers it) where it has none of that name yet; one of a script
        # (__main__, which a worker cannot import), of no module, or not registered travels
        # by value
        with _LOCK:
            origin = _ORIGIN.get(self.name) if _SPECS.get(self.name) is self else None
        if origin in sys.modules and origin != "__main__":
            return _registered_spec, (self.name, origin)
        return super().__reduce_ex__(protocol)

    @property
    def compiled(self) -> bool:
        """Whether a compiled tile evaluates it (else its NumPy ``block``)."""
        return self.tile is not None

    def defaults(self, asked: str) -> dict[str, Any]:
        """Its parameters' defaults under the name ``asked`` (an alias may change them)."""
        return dict(self.params, **self.aliases.get(asked, {}))


# --- checks of one parameter's value ---------------------------------------------------------


def positive(name: str, value) -> float:
    """``value`` as a positive finite float."""
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ParameterError(f"{name} must be a positive number, got {v}")
    return v


def finite(name: str, value) -> float:
    """``value`` as a finite float."""
    v = float(value)
    if not math.isfinite(v):
        raise ParameterError(f"{name} must be finite")
    return v


def positive_integer(name: str, value) -> int:
    """``value`` as a positive int (``2.0`` is 2)."""
    if float(value) != int(value) or int(value) < 1:
        raise ParameterError(f"{name} must be a positive integer, got {value}")
    return int(value)


def require(kernel, name: str):
    """The kernel's parameter ``name``, which evaluation needs set."""
    value = kernel[name]
    if value is None:
        raise ParameterError(f"the {kernel.name} kernel needs {name}; none was set")
    return value


# --- the registry ------------------------------------------------------------------------------

_SPECS: dict[str, KernelSpec] = {}
_ALIASES: dict[str, str] = {}
_ORIGIN: dict[str, str] = {}
_LOCK = threading.RLock()
_PLUGINS_LOADED = False


def register_kernel(spec: KernelSpec) -> KernelSpec:
    """Make ``spec`` a kernel of dkha: ``make_kernel(spec.name, ...)``, the estimators'
    ``kernel=`` and ``dkha fit --kernel`` take its name (and aliases) from then on, in this
    process and in every worker process that imports the module that registers it.

    Registering a name again from the module that registered it (the module imported anew)
    replaces the spec; a name or alias another module registered is refused.

    Returns
    -------
    KernelSpec
        ``spec`` (so that ``MATERN = register_kernel(KernelSpec(...))`` reads as a definition).
    """
    if not isinstance(spec, KernelSpec):
        raise ParameterError(f"register_kernel takes a KernelSpec, got {type(spec).__name__}")
    origin = _origin_of(spec)
    with _LOCK:
        for name in (spec.name, *spec.aliases):
            owner = _ALIASES.get(name, name if name in _SPECS else None)
            if owner is not None and _ORIGIN[owner] != origin:
                raise ParameterError(f"the kernel name {name!r} is taken (by {_ORIGIN[owner]}'s "
                                     f"{owner} kernel)")
        old = _SPECS.get(spec.name)
        for alias in (old.aliases if old is not None else ()):
            _ALIASES.pop(alias, None)
        _SPECS[spec.name] = spec
        _ORIGIN[spec.name] = origin
        _ALIASES.update(dict.fromkeys(spec.aliases, spec.name))
    return spec


def _origin_of(spec: KernelSpec) -> str:
    """The module that defines the spec's functions (where its workers find it)."""
    fn = spec.tile or spec.block
    while isinstance(getattr(fn, "func", None), Callable):      # functools.partial
        fn = fn.func
    return getattr(fn, "__module__", None) or "?"


def kernel_spec(name: str, *, plugins: bool = True) -> tuple[KernelSpec, str] | None:
    """``(spec, asked)`` of a kernel name or alias (any case), or None where none is
    registered (after loading the ``dkha.kernels`` entry points where ``plugins``)."""
    asked = name.lower()
    with _LOCK:
        key = _ALIASES.get(asked, asked)
        spec = _SPECS.get(key)
    if spec is None and plugins and load_plugins():
        return kernel_spec(name, plugins=False)
    return None if spec is None else (spec, asked)


def _registered_spec(name: str, origin: str) -> KernelSpec:
    """The spec registered as ``name`` in this process, importing ``origin`` (the module that
    registered it where it was pickled) where it is not yet."""
    got = kernel_spec(name, plugins=False)
    if got is None or got[0].name != name:
        importlib.import_module(origin)
        got = kernel_spec(name)
    if got is None or got[0].name != name:
        raise ParameterError(f"the {name} kernel is not registered in this process (importing "
                             f"{origin}, which registered it elsewhere, did not)")
    return got[0]


def spec_of(kernel) -> KernelSpec | None:
    """The registered spec a kernel argument names (a name or alias, any case); ``None`` for a
    callable, or a name none registers."""
    got = kernel_spec(kernel) if isinstance(kernel, str) else None
    return None if got is None else got[0]


def pairwise(kernel) -> bool:
    """Whether a kernel argument (a name, or a callable) names a kernel whose data are the rows
    of a square kernel matrix (its spec's ``pairwise``: ``precomputed``)."""
    spec = spec_of(kernel)
    return spec is not None and spec.pairwise


def spec_named(name: str) -> KernelSpec:
    """The registered spec called ``name`` (a kernel value's own name, never an alias)."""
    got = kernel_spec(name)
    if got is None or got[0].name != name:
        raise ParameterError(f"unknown kernel {name!r}; choose one of {', '.join(kernel_names())}"
                             " or a callable")
    return got[0]


def kernel_names(*, aliases: bool = True, plugins: bool = True) -> tuple[str, ...]:
    """The names :func:`~dkha.kernels.make_kernel` takes: the kernels (in the order they were
    registered), then their aliases (those of the ``dkha.kernels`` entry points loaded first
    where ``plugins``)."""
    if plugins:
        load_plugins()
    with _LOCK:
        names = [n for n, s in _SPECS.items() if s.by_name]
        if aliases:
            names += [a for a, n in _ALIASES.items() if _SPECS[n].by_name]
    return tuple(names)


def load_plugins() -> bool:
    """Register the kernels of the ``dkha.kernels`` entry points (once a process); True where
    this call loaded any."""
    global _PLUGINS_LOADED
    with _LOCK:
        if _PLUGINS_LOADED:
            return False
        _PLUGINS_LOADED = True
    from importlib.metadata import entry_points

    found = False
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = ep.load()
        except Exception as e:      # a broken plugin, named
            raise ParameterError(f"the kernel entry point {ep.name} = {ep.value} does not "
                                 f"load: {type(e).__name__}: {e}") from e
        if not isinstance(spec, KernelSpec):
            raise ParameterError(f"the kernel entry point {ep.name} = {ep.value} is not a "
                                 f"KernelSpec (a {type(spec).__name__})")
        with _LOCK:
            if _SPECS.get(spec.name) is not spec:
                register_kernel(spec)
        found = True
    return found
