"""The in-block updates of the batch KHA family, by name: one module each, one table.

An update (:class:`~dkha.solvers.updates.base.Update`) is what one step of a batch algorithm
does with its gains: its per-step oracle form, its compiled block loop over the factored state,
its own state fields and, where it takes direct steps, how worker replicas replay them. Each
lives in one module (:mod:`~dkha.solvers.updates.gha`, :mod:`~dkha.solvers.updates.smd`) and
is named in :data:`TABLE`; a spec (:class:`dkha.algorithms.AlgorithmSpec`) names the update
that serves it. A new update is its module, its name here and its algorithm's spec in
:mod:`dkha.algorithms` (or, from outside the package, :func:`register` and
:func:`dkha.algorithms.register`).
"""

from __future__ import annotations

from dkha.errors import ParameterError
from dkha.solvers.updates import gha, smd
from dkha.solvers.updates.base import Update

#: name → update, the batch solvers' only list of what they serve
TABLE: dict[str, Update] = {u.name: u for u in (gha.UPDATE, smd.UPDATE)}


def register(update: Update) -> Update:
    """Add ``update`` to :data:`TABLE` (a new update from outside the package); a name taken is
    refused."""
    if update.name in TABLE:
        raise ParameterError(f"update {update.name!r} is registered already")
    TABLE[update.name] = update
    return update


def names() -> tuple[str, ...]:
    """The updates served, in table order."""
    return tuple(TABLE)


def get(name: str) -> Update:
    """The update called ``name`` (a :class:`ParameterError` naming those served if none)."""
    try:
        return TABLE[name]
    except KeyError:
        raise ParameterError(f"unknown update {name!r}; the batch solvers serve "
                             f"{', '.join(TABLE)}") from None
