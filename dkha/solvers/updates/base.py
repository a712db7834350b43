"""What an in-block update of the batch KHA family brings: :class:`Update`.

Every batch algorithm (:class:`dkha.algorithms.AlgorithmSpec`) names its ``update``; the solvers
(:mod:`dkha.solvers.batch`, :mod:`dkha.solvers.factored`) look it up in
:data:`dkha.solvers.updates.TABLE` and call only what it brings here. The gains (``η_t``, their
decay, eq. 12's equalisation, backoffs) are the solver's and come into the update as ``eta``;
the update is what one step does with them.

Both engines keep ``A`` (``r×l``, the coefficients of the components over the samples),
``C = A K'`` where the spec keeps it (``keeps_c``), the step count ``t`` and the fields the
update's :attr:`Update.start` adds; the factored engine keeps the stacked state
``S = [A; B…]`` (``stacked·r`` rows) as ``S = T · S̃`` with a lower-triangular ``T``
(coordinator-math.md §3, :class:`dkha.solvers.factored.FactoredState`), so an update served by
it must be of GHA's form: each step ``S ← G S + c e_pᵀ`` with a lower-triangular ``G`` whose
``A`` block is ``M = I − tril(a yᵀ)`` (``y = A k'_p``, ``a`` the step's ``A`` column), and
``C ← M C + a k'_pᵀ`` (eq. 18).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Update:
    """One in-block update, as the solvers call it.

    Attributes
    ----------
    name : str
        What an :class:`~dkha.algorithms.AlgorithmSpec` gives as ``update``.
    reference_step : callable
        ``(st, p, kp, eta, mu, xi) -> (quantity, component) | None``: the per-step oracle form
        (:class:`dkha.solvers.batch.BatchState` ``st`` in place; ``kp = K'[p, :]``, ``eta`` the
        step's gains ``η_t``, ``mu`` the meta-gain as applied, ``xi`` SMD's decay), returning
        :func:`dkha.solvers.reference.guard`'s finding for a bad step, else ``None``.
    block : callable
        ``(st, S, C, rows, Y, U, Kpp, index, eta, mu, xi, start, direct_log)
        -> (stop, fold, fresh, guard, component)``: steps ``start…b-1`` of a block on the
        factored state ``st`` (its ``T``, ``fresh``, ``fold_condition``,
        :meth:`~dkha.solvers.factored.FactoredState.condition_bound` and the fields of
        ``start``), with the contract of :func:`dkha.solvers.updates.gha.kha_block_logged`
        (its parameters and returns; ``direct_log`` of ``1 + direct_vectors·r`` columns).
    stacked : int
        Blocks of ``r`` rows in the factored state ``S`` (1: ``A``; 2: ``[A; B]``, SMD).
    start : callable or None
        ``(r, rho0) -> dict``: the update's own state fields (e.g. SMD's log-gains ``rho``),
        set on a new state of either engine.
    resync : callable or None
        ``(st) -> None`` on the factored state, after :attr:`start` and at each pass start
        (SMD: its Grams from ``C``).
    direct_vectors : int
        Vectors of ``r`` entries a direct step logs (``block``'s ``direct_log``).
    direct_payload : callable or None
        ``(row, r, xi) -> payload``: a direct step's message payload from its ``direct_log``
        row, beginning ``(a, y)`` (its ``M``); ``None`` for an update that takes no direct
        steps.
    direct : callable or None
        ``(X, payload) -> c``: replay a direct step on ``X`` (``X ← G X`` in place, rows of
        ``S̃`` or of projections) and return its column ``c`` (worker replicas,
        :func:`dkha.solvers.factored.apply_message`).
    """

    name: str
    reference_step: Callable
    block: Callable
    stacked: int = 1
    start: Callable | None = None
    resync: Callable | None = None
    direct_vectors: int = 2
    direct_payload: Callable | None = None
    direct: Callable | None = None
