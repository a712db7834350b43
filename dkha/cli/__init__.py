"""The ``dkha`` command. :func:`main` says what it starts before it loads the command line
(:mod:`dkha.cli.main`: dask, distributed, xarray and scikit-learn take seconds to import), so a
long job shows itself from its first second."""

import importlib
import sys


def announce(argv: list[str]) -> None:
    """``dkha fit``'s first progress line, before the modules load and the workers start: in a
    terminal unless ``--quiet``, and with ``-v``."""
    words = [a for a in argv if not a.startswith("-")]
    verbose = any(a.startswith("-v") or a == "--verbose" for a in argv)
    if words[:1] == ["fit"] and "--quiet" not in argv and (verbose or sys.stderr.isatty()):
        print("dkha fit: loading, then starting the Dask workers", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run ``dkha`` with ``argv`` (``sys.argv[1:]`` by default); returns the exit code."""
    announce(sys.argv[1:] if argv is None else argv)
    return importlib.import_module("dkha.cli.main").main(argv)


__all__ = ["main"]
