"""Progress of long work: a tqdm bar in a terminal, a periodic log line otherwise.

Whether anything is shown is the caller's choice (the CLI, ``verbose=`` in the API): a
:class:`Progress` made with ``verbose=False`` does nothing. With ``verbose=True`` it is a tqdm bar
when standard error is a terminal, else a log line (INFO, logger ``dkha.progress``) when it starts
and then every :data:`LOG_EVERY` seconds, so that a log file or a pipe also shows that work goes
on. ``transient`` progress (one pass of many, e.g. a Krylov product) leaves no bar behind and
logs only while it lasts longer than :data:`LOG_EVERY`; transient progress without a total
(stages of one task) logs the name of each stage as it begins.

:func:`announce` shows one line among the work's first (the fit's plan), :func:`phase` logs the
start of a phase of the work (an evaluation, saving the run) on the same logger, and
:func:`heartbeat` (the ``dkha`` command, outside a terminal) keeps a line coming at least every
:data:`LOG_EVERY` seconds while one task runs for longer: the innermost progress's state, or the
phase going on."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Self

log = logging.getLogger(__name__)

LOG_EVERY = 10.0     # seconds between log lines when standard error is not a terminal
_clock = time.perf_counter

#: the progress shown as log lines now, innermost last; the clock of the last line logged; what
#: began or ended last (a phase, a progress) and when
_active: list[Progress] = []
_last_line = [0.0]
_last_event: list = [None, 0.0]


def _logged(message: str, *, event: bool = True) -> None:
    log.info("%s", message)
    _last_line[0] = _clock()
    if event:
        _last_event[:] = [message, _last_line[0]]


def phase(desc: str) -> None:
    """Say that a phase of the work begins (one log line, INFO on ``dkha.progress``); nothing
    where it is the phase said last (a stage that named it already)."""
    if desc != _last_event[0]:
        _logged(desc)


def new_command() -> None:
    """A command begins: no phase said yet (the first of a command run after another in this
    process is said, even where it is the one the other said last)."""
    _last_event[:] = [None, 0.0]


def mark(desc: str) -> None:
    """What is going on now, for the :func:`heartbeat`'s lines, where another line said it (a
    pipeline's stage); no line of its own."""
    _last_event[:] = [desc, _clock()]


#: whether :func:`notice` writes above the bars (the ``dkha`` command in a terminal)
NOTICES_SHOWN = [False]


def notice(line: str) -> None:
    """A line the user needs whatever the progress shows (the dashboard's address): on
    standard error above the bars where the ``dkha`` command shows bars, else a progress log
    line."""
    if NOTICES_SHOWN[0] and _terminal():
        from tqdm.auto import tqdm

        tqdm.write(line, file=sys.stderr)
    else:
        _logged(line, event=False)


def announce(line: str, verbose: bool) -> None:
    """One line among the work's first (e.g. the fit's plan): with ``verbose`` on standard error
    above the bars in a terminal, else as a progress log line; without, an INFO log line."""
    if verbose and _terminal():
        from tqdm.auto import tqdm

        tqdm.write(line, file=sys.stderr)
    elif verbose:
        _logged(line)
    else:
        logging.getLogger("dkha").info("%s", line)


def _beat(every: float) -> None:
    """One heartbeat line if none was logged for ``every`` seconds."""
    if _clock() - _last_line[0] < every:
        return
    innermost = _active[-1:]      # (a copy: the work's thread opens and closes them)
    if innermost:
        innermost[0]._line()
    elif _last_event[0] is not None:
        _logged(f"working, {_clock() - _last_event[1]:.0f} s since: {_last_event[0]}",
                event=False)


@contextlib.contextmanager
def heartbeat(every: float = LOG_EVERY) -> Iterator[None]:
    """While it lasts, a thread logs a line whenever none came for ``every`` seconds (the
    progress of a pass whose blocks each take longer, a phase without progress of its own)."""
    done = threading.Event()
    _last_line[0] = _clock()
    poll = min(0.25, every / 8)

    def run():
        while not done.wait(poll):
            # a line after 80 % of ``every`` without one: a margin for a busy machine (the
            # thread waits for the interpreter while the work holds it)
            _beat(0.8 * every)

    thread = threading.Thread(target=run, name="dkha-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):     # closed or replaced stderr
        return False


def plural(unit: str) -> str:
    """``product`` → ``products``, ``patch`` → ``patches``."""
    return unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")


#: totals from which a bar counts in k, M (1.50M/3.00M steps); below, whole numbers
SCALED_FROM = 100_000


def bar_format(total: int | None, unit: str) -> dict:
    """tqdm's options for a count of ``unit``: whole numbers (``3 products``, not
    ``3.00product``), scaled only for large totals; without a total, the count and the unit's
    plural (tqdm's own format glues the unit to a fractional count)."""
    if total is None:
        return {"bar_format": f"{{desc}}: {{n_fmt}} {plural(unit)} [{{elapsed}}{{postfix}}]"}
    return {"unit_scale": total >= SCALED_FROM}


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

            self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial,
                             leave=not transient, **bar_format(total, unit))
        else:
            self._log = True
            _active.append(self)
            if not transient:
                self._line()
            elif total is None:     # stages, each named as it begins
                self.describe(desc)

    def _line(self, done: bool = False) -> None:
        seconds = _clock() - self._t0
        of = f"/{self.total}" if self.total else ""
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        _logged(f"{self.desc}: {self.n}{of} {plural(self.unit)}{'' if done else ' so far'} in "
                f"{seconds:.0f} s{extra}", event=done or self.n == 0)
        self._last = _clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._log and _clock() - max(self._last, _last_line[0]) >= LOG_EVERY:
            self._line()

    def describe(self, desc: str) -> None:
        """Name what is being done now (a stage of a longer task)."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description_str(desc)
        elif self._log:
            _logged(desc)
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
            if self in _active:
                _active.remove(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
