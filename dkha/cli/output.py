"""What the ``dkha`` command prints besides its results' files: progress lines outside a
terminal (timestamped, with the seconds since the command started) and numbers with the
precision they have (the excess error clipped at its rounding, ``E`` beside ``E_min`` with the
digits that tell them apart, kernel parameters without 16 digits of noise).

Light on purpose (no numpy): the command's first line comes from here before the engine loads.
"""

from __future__ import annotations

import logging
import math
import sys
import time

from dkha.errors import DkhaWarning

#: when the command started (its lines give the seconds since)
START = time.time()


class LineFormatter(logging.Formatter):
    """``HH:MM:SS (+S.S s) dkha CMD: message``: the clock and the seconds since the command
    started, so that a log file shows when each phase began and how long it took."""

    def __init__(self, command: str):
        super().__init__(f"%(asctime)s (+%(elapsed).1f s) dkha {command}: %(message)s",
                         datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.elapsed = record.created - START
        return super().format(record)


class LogFormatter(LineFormatter):
    """The command's log lines in the progress lines' format (:class:`LineFormatter`), a
    warning or an error saying so (``… dkha fit: warning: …``); with ``names`` (``-vv``) the
    logger's name too."""

    def __init__(self, command: str, names: bool = False):
        super().__init__(command)
        self.names = names

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        head, sep, message = line.partition(": ")
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        name = f"[{record.name}] " if self.names else ""
        return f"{head}{sep}{level}{name}{message}"


def log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the command: a warning as a log line (WARNING of
    ``dkha.warnings``: the format of the rest, :class:`LogFormatter`); dkha's own by their
    message, another's with its class and where it was raised."""
    text = str(message)
    if not issubclass(category, DkhaWarning):
        text += f" ({category.__name__} at {filename}:{lineno})"
    logging.getLogger("dkha.warnings").warning("%s", text)


def progress_lines(command: str) -> logging.Handler:
    """A handler showing progress lines (INFO of ``dkha.progress``) on standard error."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)
    handler.setFormatter(LineFormatter(command))
    return handler


def excess_precision(error_min: float | None, top_eigenvalues, n_samples: int) -> float:
    """How far rounding can move an evaluated excess ``E/E_min − 1``: ``E_min² = ‖K'‖²_F −
    Σλ²`` cancels, so its relative error is about ``ε √l ‖K'‖²_F / E_min²`` (``ε`` the machine
    epsilon, ``√l`` the growth of blockwise sums). NaN where it cannot be said."""
    if not error_min or top_eigenvalues is None:
        return float("nan")
    frob2 = error_min ** 2 + math.fsum(float(v) ** 2 for v in top_eigenvalues)
    return sys.float_info.epsilon * math.sqrt(n_samples) * frob2 / error_min ** 2


def excess_text(excess: float | None, precision: float) -> str:
    """The excess clipped at 0, with its precision (a negative excess is rounding): what both
    ``dkha fit`` and ``dkha evaluate`` print."""
    if excess is None:
        return "n/a"
    if excess == math.inf:      # E_min = 0: E/E_min is no number; E itself says how far off
        return "n/a (E_min = 0: the top components span all of K')"
    known = not math.isnan(precision)
    precision = max(precision, -excess) if known else -excess
    if excess <= precision:
        return f"0 (below its precision, ±{precision:.1e})" if precision > 0 else "0"
    return f"{excess:.3e}" + (f" (±{precision:.1e})" if precision > 0 and known else "")


def pair_digits(excess: float | None, precision: float = float("nan")) -> int:
    """Significant digits that show ``E`` and ``E_min = E / (1 + excess)`` apart: two more than
    the digits they share, at least 6, and none below the excess's precision (there both are
    printed alike, and the excess says ``0 (below its precision)``)."""
    digits = 6
    if excess is not None and excess > 0 and math.isfinite(excess):
        digits = max(digits, math.ceil(-math.log10(excess)) + 2)
    if not math.isnan(precision) and precision > 0:
        digits = min(digits, max(6, math.floor(-math.log10(precision)) + 1))
    return min(digits, 17)


def errors_text(error: float, error_min: float, excess: float | None, precision: float) -> str:
    """``E = …, E_min = …, excess = …`` with the digits that tell ``E`` from ``E_min``."""
    d = pair_digits(excess, precision)
    return (f"E = {error:.{d}g}, E_min = {error_min:.{d}g}, "
            f"excess = {excess_text(excess, precision)}")


def number(value) -> str:
    """A parameter as a person reads it: floats to 6 significant digits (a median-heuristic σ
    is not known to 16), everything else as it is."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def kernel_text(kernel) -> str:
    """``gaussian(sigma=3.21455)``: a :class:`~dkha.kernels.Kernel` for people (its
    ``describe()`` keeps every digit, for the run's records)."""
    return kernel.name + "(" + ", ".join(f"{k}={number(v)}" for k, v in kernel.params) + ")"


#: a fit's times (timings.json) the summary says, with what each covers; they add up to total
TIMES = {"startup": "startup (the data checked, the path planned, the cluster)",
         "centering": "centering", "init": "start state", "stream": "passes",
         "other": "evaluations, checkpoints and the end", "total": "total"}


def times_line(timings: dict | None, now: float | None = None) -> str | None:
    """One line of a fit's times: each part of ``total`` (:data:`TIMES`; over the attempts of a
    resumed fit), and the command's seconds so far beside it (its imports and the saving are
    the difference). None without ``total``."""
    if not timings or "total" not in timings:
        return None
    parts = "; ".join(f"{TIMES[k]} {timings[k]:.3g} s" for k in TIMES
                      if k != "total" and k in timings)
    attempts = int(timings.get("attempts", 1))
    over = f" over {attempts} attempts" if attempts > 1 else ""
    command = (time.time() if now is None else now) - START
    return (f"time: {timings['total']:.3g} s fitting{over} ({parts}); the command so far "
            f"{command:.3g} s")
