"""Modules of a package loaded on first use (PEP 562), as ``scipy.linalg`` after ``import scipy``:
``import dkha; dkha.data.result.load(...)`` works without importing every module up front."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable


def submodules(package: str, path) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for the package ``package`` (its ``__name__``, ``__path__``):
    an attribute that names one of its modules imports it."""
    names = sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))

    def getattr_(name: str):
        if name in names:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(names))

    return getattr_, dir_
