"""The ``dkha`` command: ``main`` parses the arguments and runs one subcommand."""

from dkha.cli.main import main

__all__ = ["main"]
