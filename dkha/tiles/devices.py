"""Where tiles are computed: ``device="cpu"``, ``"cuda"`` (CuPy) or ``"auto"`` (per worker), and
the array module behind each (:func:`array_module`)."""

from __future__ import annotations

import numpy as np

from dkha.errors import ParameterError
from dkha.names import DEVICES


def _no_gpu() -> bool:
    return False


_gpu_probe = _no_gpu      # set by the worker-side tasks (dkha.engine.tasks): this worker's GPU


def set_gpu_probe(probe) -> None:
    """Tell ``device="auto"`` how to ask whether this process is a worker with a ``GPU`` resource
    (a function of no arguments; :mod:`dkha.engine.tasks` installs one reading the Dask worker's
    resources, so this module imports no Dask)."""
    global _gpu_probe
    _gpu_probe = probe


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda``: ``auto`` becomes ``cuda`` on a worker declaring a ``GPU`` resource."""
    if device not in DEVICES:
        raise ParameterError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if _gpu_probe() else "cpu"
    return device


def array_module(device: str):
    """The array module behind ``device``: NumPy for ``cpu``, CuPy for ``cuda``."""
    if resolve_device(device) == "cpu":
        return np
    try:
        import cupy
    except ImportError:
        raise ParameterError("device 'cuda' needs CuPy on the workers: pip install 'dkha[gpu]' "
                             "(or run with --device cpu)") from None
    return cupy


def array_module_of(a):
    """The array module of ``a``: CuPy for a CuPy array, else NumPy."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def to_host(xp, a):
    """``a`` as a NumPy array (copies from the GPU for CuPy)."""
    return a if xp is np else xp.asnumpy(a)
