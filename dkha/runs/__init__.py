"""A saved run (batch or dictionary), opened once: transform, explained variance."""

from dkha.lazy import submodules as _submodules

__getattr__, __dir__ = _submodules(__name__, __path__)
