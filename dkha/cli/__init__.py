"""The ``dkha`` command. :func:`main` parses the command line with a parser that loads nothing
heavy (:mod:`dkha.cli.parser`): ``--version``, ``--help`` and argument errors answer at once.
Only a command that runs loads the engine (:mod:`dkha.cli.main`: dask, distributed, xarray and
scikit-learn take seconds to import), and a long one says so first, so that it shows itself from
its first second: a line in a terminal, and outside one (a pipe, a log file) timestamped lines
at the start of each phase and at least every :data:`~dkha.progress.LOG_EVERY` seconds. A fit
again on the run it finished answers before anything loads (:mod:`dkha.cli.rerun`)."""

import contextlib
import importlib
import logging
import sys

from dkha import progress
from dkha.cli.output import progress_lines
from dkha.cli.parser import build_parser
from dkha.progress import heartbeat, phase

#: the commands that show their progress (outside a terminal as log lines on standard error):
#: every one that may run for more than a few seconds
PROGRESS_COMMANDS = ("fit", "tune", "run", "evaluate", "transform", "maps", "report", "denoise",
                     "superresolve", "cluster", "ingest")
LOADING = "loading"


def shows_progress(args) -> bool:
    """Whether the command ``args`` describe shows its progress (unless ``--quiet``)."""
    return args.command in PROGRESS_COMMANDS and not getattr(args, "quiet", False)


@contextlib.contextmanager
def progress_shown(args):
    """While the command runs: its first line, and outside a terminal its progress as log lines
    on standard error (``dkha.progress``, and ``dkha.pipeline``'s stages for ``dkha run``) with
    a :func:`~dkha.progress.heartbeat`."""
    if not shows_progress(args):
        yield
        return
    if sys.stderr.isatty():     # progress bars (tqdm)
        print(f"dkha {args.command}: {LOADING}", file=sys.stderr, flush=True)
        progress.NOTICES_SHOWN[0] = True
        try:
            yield
        finally:
            progress.NOTICES_SHOWN[0] = False
        return
    progress.new_command()
    handler = progress_lines(args.command)
    logger = logging.getLogger("dkha.progress")
    level = logger.level
    logger.setLevel(logging.INFO)
    if args.verbose == 0:       # with -v the root logger's handler shows them
        logger.addHandler(handler)
    else:                       # (once it is set up, after loading)
        print(handler.format(logging.makeLogRecord({"msg": LOADING})), file=sys.stderr,
              flush=True)
    try:
        with heartbeat():
            if args.verbose == 0:
                phase(LOADING)
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run ``dkha`` with ``argv`` (``sys.argv[1:]`` by default); returns the exit code."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    # a fit again on the run it finished: answered before loading (dkha.cli.rerun: dask.config)
    done = (importlib.import_module("dkha.cli.rerun").finished_line(args)
            if args.command == "fit" else None)
    if done is not None:
        print(done)
        return 0
    with progress_shown(args):
        return importlib.import_module("dkha.cli.main").run(args)


__all__ = ["main"]
