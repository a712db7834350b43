"""What one row of the parameter table (:data:`dkha.estimators.params.PARAMETERS`) declares, and
how a value is checked against it: :class:`Param`, the accepted values (:class:`Interval`,
:class:`Options`) and :class:`InvalidParameter`, raised in scikit-learn's wording."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

from dkha.errors import ParameterError

BATCH, ONLINE = "batch", "online"
BOTH = (BATCH, ONLINE)


@dataclass(frozen=True)
class Interval:
    """Numbers of ``kind`` (``Integral`` or ``Real``) between ``left`` and ``right`` (``None``:
    unbounded); ``closed`` is ``"left"``, ``"right"``, ``"both"`` or ``"neither"``."""

    kind: type
    left: float | None
    right: float | None
    closed: str = "neither"

    def __contains__(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, self.kind):
            return False
        if isinstance(value, Real) and not math.isfinite(value):
            return False
        lo_ok = self.left is None or (value >= self.left if self.closed in ("left", "both")
                                      else value > self.left)
        hi_ok = self.right is None or (value <= self.right if self.closed in ("right", "both")
                                       else value < self.right)
        return lo_ok and hi_ok


@dataclass(frozen=True)
class Options:
    """One of ``values``; with ``live``, one of what ``live()`` returns when asked (a registry
    that may grow after import: an algorithm registered by :func:`dkha.algorithms.register`)."""

    values: tuple = ()
    live: Callable[[], tuple] | None = None

    @property
    def choices(self) -> tuple:
        return tuple(self.live()) if self.live is not None else self.values

    def __contains__(self, value) -> bool:
        return value in self.choices


@dataclass(frozen=True)
class Param:
    """One fit parameter.

    name : the estimator's keyword (and attribute).
    default : its default (``None``: chosen at fit time, see the help).
    help : the docstring text (the first sentence is the command line's help unless ``short``).
    accepts : an :class:`Interval`, :class:`Options`, a type or tuple of types, or ``None``
        (validated where it is used, e.g. kernel parameters by :func:`dkha.kernels.make_kernel`).
        ``None`` values are always accepted where the default is ``None``.
    models : the estimators that take it (``"batch"``: :class:`~dkha.KernelHebbianPCA`,
        ``"online"``: :class:`~dkha.estimators.online.OnlineKernelPCA`).
    key : the command line's ``args`` attribute and the pipeline key (default ``name``); two rows
        (one per estimator) may share a key, e.g. ``kernel_gamma``.
    flag : the command-line option (default ``--key`` with dashes); ``None``: not on the
        command line.
    cli : further ``argparse.add_argument`` keywords (``type``, ``metavar``, ``action``,
        ``default``, ``choices``), and ``group`` (the option group's title), ``aliases``,
        ``negative`` (a ``--no-...`` flag), ``exclusive`` (a mutually exclusive group's name).
    shared : models fitted together in one kernel stream must agree on it.
    pipeline : a key of a pipeline's ``[[fit]]`` table.
    doc_type : the type shown in the docstring (default from ``accepts`` and ``default``).
    short : the command line's help.
    none : ``None`` is accepted although the default is not (its meaning in the help).
    saved : the attr of the saved run (``components.zarr``) holding its resolved value: ``True``
        its name, a string another name (kept for runs saved before), ``False`` not saved (the
        kernel's parameters are saved together, see ``kernel_param``; the length as ``n_steps``).
    kernel_param : the kernel's parameter this row sets (a key of
        :attr:`~dkha.kernels.Kernel.param_dict`): saved, as resolved (e.g. the median-distance
        ``sigma``), in the run's one ``kernel_parameters`` attr, and read back from it
        (``coef0``, a keyword of :func:`~dkha.kernels.make_kernel`, is saved as ``offset``).
    identity : part of a run's identity: a run directory or checkpoint holding another value is
        another run (resuming it is refused, writing over it needs ``overwrite``).
    old : the parameter's former name, still accepted with a ``FutureWarning`` as the
        estimator's keyword, the command-line option (hidden from ``--help``) and the pipeline
        key, where no other row of the estimator takes that name; for a row saved under its
        name, also the attr of runs and checkpoints saved before (read, and compared, as it).
    """

    name: str
    default: Any
    help: str
    accepts: Any = None
    models: tuple = BOTH
    key: str | None = None
    flag: str | None = ""
    cli: dict = field(default_factory=dict)
    shared: bool = True
    pipeline: bool = True
    doc_type: str | None = None
    short: str | None = None
    none: bool = False
    saved: bool | str = False
    kernel_param: str | None = None
    identity: bool = False
    old: str | None = None

    @property
    def dest(self) -> str:
        return self.key or self.name

    @property
    def attr(self) -> str | None:
        """The saved run's attr of this parameter (``None``: not saved on its own)."""
        return None if self.saved is False else self.name if self.saved is True else self.saved

    @property
    def former_attr(self) -> str | None:
        """The attr of runs saved before the parameter was renamed (``None``: never renamed)."""
        return self.old if self.saved is True else None

    @property
    def option(self) -> str | None:
        if self.flag is None:
            return None
        return self.flag or "--" + self.dest.replace("_", "-")

    def resolved(self, value):
        """``value`` (accepted) as a typed request holds it: ``None`` as is, else of the row's
        type (a number of its :class:`Interval`'s kind; a ``str`` of options or a ``str`` row,
        a ``bool`` of a ``bool`` row); values of other rows as they are."""
        a = self.accepts
        kind = a.kind if isinstance(a, Interval) else str if isinstance(a, Options) else a
        cast = {Integral: int, Real: float, str: str, bool: bool}.get(kind)
        return value if value is None or cast is None else cast(value)

    def check(self, value, owner: str) -> None:
        """Raise :class:`InvalidParameter` unless ``value`` is accepted, in scikit-learn's words
        with the estimator's class name ``owner`` (``The 'eta0' parameter of KernelHebbianPCA
        must be a float in the range (0.0, inf) or None. Got -1 instead.``)."""
        if value is None and (self.default is None or self.none):
            return
        a = self.accepts
        if a is None:
            return
        if isinstance(a, (Interval, Options)):
            ok = value in a
        else:
            ok = (isinstance(value, a) or a is bool and type(value).__name__ == "bool_")
        if ok:
            return
        allowed = _sklearn_words(a) + (" or None" if self.default is None or self.none else "")
        raise InvalidParameter(f"The {self.name!r} parameter of {owner} must be {allowed}. "
                               f"Got {value!r} instead.")


class InvalidParameter(ParameterError, TypeError):
    """A parameter outside the estimator's table: a :class:`~dkha.errors.ParameterError` (a
    ``ValueError``, one line in the CLI) and a ``TypeError``, as scikit-learn's own error."""


def _sklearn_words(a) -> str:
    """What ``a`` accepts, in scikit-learn's words (``a float in the range (0.0, inf)``, ``a str
    among {'a', 'b'}``, ``an instance of 'bool'``)."""
    if isinstance(a, Interval):
        integral = a.kind is Integral
        fmt = (lambda v: str(int(v))) if integral else (lambda v: str(float(v)))
        lo = "-inf" if a.left is None else fmt(a.left)
        hi = "inf" if a.right is None else fmt(a.right)
        lb = "[" if a.left is not None and a.closed in ("left", "both") else "("
        rb = "]" if a.right is not None and a.closed in ("right", "both") else ")"
        return f"{'an int' if integral else 'a float'} in the range {lb}{lo}, {hi}{rb}"
    if isinstance(a, Options):
        if all(isinstance(v, str) for v in a.choices):
            return "a str among {" + ", ".join(repr(v) for v in sorted(a.choices)) + "}"
        return "one of {" + ", ".join(repr(v) for v in a.choices) + "}"
    types = a if isinstance(a, tuple) else (a,)
    return " or ".join(f"an instance of {t.__name__!r}" for t in types)
