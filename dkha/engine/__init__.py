"""Dask: where work runs, worker-side tasks, the row engine, the worker replicas."""

from dkha.lazy import submodules as _submodules

__getattr__, __dir__ = _submodules(__name__, __path__)
