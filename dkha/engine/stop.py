"""The stop request: set (by the CLI's SIGTERM and SIGINT handler, or by a program embedding
dkha) to make every long phase end at its next task boundary.

Fits check it between blocks and checkpoint (:class:`dkha.fit.control.BlockDriver`); the row
engine checks it while waiting for every task of every blockwise pass — the MK row, Nyström
rows, the ``K' V`` products of Krylov and of E_min, the residual pass of an evaluation, the
projections of the explained variance — and raises :class:`~dkha.errors.Interrupted` (exit
code 75); the dense path checks it between its row blocks and Lanczos products, and the Krylov
solve writes its last product boundary first (:class:`dkha.fit.krylov.KrylovCheckpoints`).
"""

from __future__ import annotations

import threading

from dkha.errors import Interrupted

#: set to ask the running phase to stop at its next task boundary
STOP = threading.Event()


def check_stop(what: str) -> None:
    """Raise :class:`~dkha.errors.Interrupted` naming ``what`` was stopped, if a stop was asked."""
    if STOP.is_set():
        raise Interrupted(f"stopped during {what}")
