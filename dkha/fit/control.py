"""The one block driver of the coordinator's loops, batch (:func:`dkha.fit.kha_stream.run_batches`)
and online (:func:`dkha.fit.online.run_online`): the stop event, the checkpoint cadence, the
progress bar and the wall-time accounting.

The loops own their maths and their block streams; between two blocks they call
:meth:`BlockDriver.between_blocks`, which writes a checkpoint when one is due (every
``checkpoint_steps`` steps, at the first block boundary after each multiple) or when
:data:`STOP` is set, and then stops the fit with :class:`~dkha.errors.Interrupted`. The clock
counts the time spent streaming and updating only: :meth:`BlockDriver.paused` leaves out
evaluations and checkpoints (scikit-learn's ``IncrementalPCA.fit`` is one loop of
``partial_fit`` over blocks; dask-ml's ``_partial.fit`` drives any model's blocks the same way).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from dkha.engine.stop import STOP
from dkha.errors import RESUME_HINT, Interrupted
from dkha.progress import Progress


class BlockDriver:
    """Stop, checkpoint cadence, progress and timing for one loop over blocks of steps.

    Parameters
    ----------
    n_steps : int
        The step the fit ends at.
    start_step : int
        The step it starts from (a resumed fit's checkpoint).
    desc : str
        The progress bar's label.
    verbose : bool
        Show a progress bar.
    save : callable ``save(t, pass_end_pending)``, optional
        Writes a checkpoint at step ``t`` (``None``: the fit has no run directory).
    checkpoint_steps : int
        Checkpoint at the first block boundary after every that many steps (0: never by steps).
    seconds : float
        Fit seconds already spent (a resumed fit's).
    """

    def __init__(self, n_steps: int, start_step: int, *, desc: str, verbose: bool,
                 save: Callable[[int, bool], object] | None = None, checkpoint_steps: int = 0,
                 seconds: float = 0.0):
        self.n_steps = int(n_steps)
        self.save = save
        self.checkpoint_steps = int(checkpoint_steps or 0)
        self.seconds = float(seconds)
        self.last_checkpoint = int(start_step)
        self._t0: float | None = None
        self.bar = Progress(verbose, self.n_steps, desc, initial=start_step)

    # -- the clock --
    def start(self) -> None:
        """Start (or restart) counting fit time."""
        self._t0 = time.perf_counter()

    def stop_clock(self) -> None:
        """Add the time since :meth:`start` to :attr:`seconds` and stop counting."""
        if self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave what runs inside (evaluations, checkpoints) out of the fit time."""
        running = self._t0 is not None
        self.stop_clock()
        try:
            yield
        finally:
            if running:
                self.start()

    # -- between blocks --
    def advance(self, steps: int, **postfix) -> None:
        """``steps`` more steps done (the progress bar, with ``postfix`` shown beside it)."""
        if self.bar is not None:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix(**postfix)

    def show(self, **postfix) -> None:
        if self.bar is not None and postfix:
            self.bar.set_postfix(**postfix)

    def checkpoint_due(self, t: int) -> bool:
        every = self.checkpoint_steps
        return every > 0 and t // every > self.last_checkpoint // every

    def between_blocks(self, t: int, pass_number: int, *, pass_end_pending: bool = False,
                       due: bool | None = None) -> None:
        """At step ``t`` (in pass ``pass_number``, counted from 1), between two blocks: write a
        checkpoint if one is due (``due`` overrides the step cadence) or a stop was asked for,
        then stop with :class:`~dkha.errors.Interrupted` if it was. Not at the fit's end."""
        if t >= self.n_steps:
            return
        stopping = STOP.is_set()
        due = self.checkpoint_due(t) if due is None else due
        if not (due or stopping):
            return
        with self.paused():
            if self.save is not None:
                self.save(t, pass_end_pending)
                self.last_checkpoint = t
        if stopping:
            self.stop_clock()
            exc = Interrupted(
                f"stopped at step {t} (pass {pass_number}); " +
                (f"checkpoint written: continue with {RESUME_HINT}"
                 if self.save is not None else
                 "no checkpoint (fit with a run directory to make runs resumable)"))
            exc.checkpointed = True     # nothing more to save (dkha.fit.kha_stream)
            raise exc

    def close(self) -> None:
        self.stop_clock()
        if self.bar is not None:
            self.bar.close()
            self.bar = None
