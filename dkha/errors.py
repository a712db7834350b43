"""Errors a user can cause, and dkha's warning class.

Each is a subclass of the builtin a Python user expects (``ValueError``, ``FileNotFoundError``,
...), so ``except ValueError`` keeps working, and the CLI turns any :class:`DkhaError` into one
line and a non-zero exit code.
"""

from __future__ import annotations


class DkhaError(Exception):
    """Base class of the errors a user can cause (bad input, bad parameters, bad paths)."""

    exit_code = 2


class InputError(DkhaError, ValueError):
    """The data store or an input file is unusable (missing variable, NaN, wrong dims...)."""


class ParameterError(DkhaError, ValueError):
    """A parameter is out of range or unknown."""


class StoreNotFoundError(DkhaError, FileNotFoundError):
    """A path that should exist does not."""


class RunDirectoryError(DkhaError, FileExistsError):
    """The output directory holds something else (a different run, a file)."""


class NumericalError(DkhaError, FloatingPointError):
    """The iteration produced non-finite values or diverged."""

    exit_code = 3


class BlockFailedError(DkhaError, RuntimeError):
    """A block of kernel rows killed every worker it was sent to (distributed's KilledWorker)."""

    exit_code = 4


#: how a stopped or interrupted fit is continued, as the messages of resumable errors (exit
#: code 75) say it; a pipeline says ``dkha run PIPELINE`` instead
RESUME_HINT = "`dkha fit ... --resume`"


class ClusterLostError(DkhaError, ConnectionError):
    """The Dask scheduler went away mid-fit. Resumable: the last checkpoint is kept."""

    exit_code = 75  # EX_TEMPFAIL: try again (``dkha fit ... --resume``)


class Interrupted(DkhaError):
    """The fit was asked to stop (SIGTERM / SIGINT) and wrote a checkpoint. Resumable."""

    exit_code = 75


class RunFinished(DkhaError):
    """The run directory holds this run, finished, with the same settings and data: nothing to
    do (``dkha fit`` again, or ``--resume`` of a finished run). Not a failure: exit code 0, so
    a scheduler's retry of a finished fit succeeds."""

    exit_code = 0

    @classmethod
    def of(cls, run_dir: str) -> RunFinished:
        """The one line of a finished run in ``run_dir``."""
        return cls(f"{run_dir} holds this run, finished: nothing to do (pass --overwrite to fit "
                   "it again)")


class DkhaWarning(UserWarning):
    """Warnings dkha itself emits (tests turn them into errors)."""


class NullComponentWarning(DkhaWarning):
    """Components beyond the rank of the centered kernel matrix are null (eigenvalue 0)."""


class DictionaryWarning(DkhaWarning):
    """An online fit's dictionary holds fewer members than components."""
