"""Progress of long work: a tqdm bar in a terminal, a periodic log line otherwise.

Whether anything is shown is the caller's choice (the CLI, ``verbose=`` in the API): a
:class:`Progress` made with ``verbose=False`` does nothing. With ``verbose=True`` it is a tqdm bar
when standard error is a terminal, else a log line (INFO, logger ``dkha.progress``) when it starts
and then every :data:`LOG_EVERY` seconds, so that a log file or a pipe also shows that work goes
on. ``transient`` progress (one pass of many, e.g. a Krylov product) leaves no bar behind and
logs only while it lasts longer than :data:`LOG_EVERY`.
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)

LOG_EVERY = 10.0     # seconds between log lines when standard error is not a terminal
_clock = time.perf_counter


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):     # closed or replaced stderr
        return False


class Progress:
    """``update(n)`` as work is done; ``set_postfix(**values)``; ``close()`` (or ``with``)."""

    def __init__(self, verbose: bool, total: int | None, desc: str, *, unit: str = "step",
                 transient: bool = False, initial: int = 0):
        self.desc, self.total, self.unit, self.transient = desc, total, unit, transient
        self.n = int(initial)
        self.postfix: dict = {}
        self._bar = None
        self._log = False
        self._t0 = self._last = _clock()
        if not verbose:
            return
        if _terminal():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True,
                             leave=not transient, initial=initial)
        else:
            self._log = True
            if not transient:
                self._line()

    def _line(self, done: bool = False) -> None:
        seconds = _clock() - self._t0
        of = f"/{self.total}" if self.total else ""
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        log.info("%s: %s%s %ss%s in %.0f s%s", self.desc, self.n, of, self.unit,
                 "" if done else " so far", seconds, extra)
        self._last = _clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._log and _clock() - self._last >= LOG_EVERY:
            self._line()

    def describe(self, desc: str) -> None:
        """Name what is being done now (a stage of a longer task)."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description_str(desc)
        elif self._log:
            log.info("%s", desc)
            self._last = _clock()

    def set_postfix(self, **values) -> None:
        self.postfix.update(values)
        if self._bar is not None:
            self._bar.set_postfix(**values)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._log:
            if not self.transient or _clock() - self._t0 >= LOG_EVERY:
                self._line(done=True)
            self._log = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
