"""dkha: kernel principal components of data sets too large for a kernel matrix.

The Kernel Hebbian Algorithm family (KHA, KHA/t, KHA/et, KHA-SMD) on a Dask row engine.

The public names load on first use (PEP 562, as scipy and scikit-image do): ``import dkha``
and the ``dkha`` command start in milliseconds, and the seconds dask, xarray and scikit-learn
take to import come when a name that needs them is first used.
"""

import importlib
from typing import TYPE_CHECKING

from dkha.version import __version__

#: public name -> the module that defines it
_EXPORTS = {
    "KernelHebbianPCA": "dkha.estimators.batch", "fit_together": "dkha.estimators.batch",
    "OnlineKernelPCA": "dkha.estimators.online", "load": "dkha.estimators.saved",
    "tune": "dkha.estimators.tune", "explained_variance": "dkha.runs.variance",
    "Kernel": "dkha.kernels", "make_kernel": "dkha.kernels", "KernelSpec": "dkha.kernels",
    "register_kernel": "dkha.kernels",
    "DataStore": "dkha.data.store", "ingest_array": "dkha.data.ingest",
    "ingest_images": "dkha.data.ingest", "open_store": "dkha.data.store",
    "fit_denoise": "dkha.apply.choose",
}


#: the subpackages, reachable as attributes after a bare ``import dkha`` (``dkha.data.result``)
_SUBPACKAGES = ("apply", "data", "engine", "estimators", "fit", "pipeline", "runs", "solvers")


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value     # once loaded, an ordinary attribute
        return value
    if name in _SUBPACKAGES:     # its modules load on first use too (dkha.lazy)
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'dkha' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


if TYPE_CHECKING:   # what static tools see
    from dkha.apply.choose import fit_denoise
    from dkha.data.ingest import ingest_array, ingest_images
    from dkha.data.store import DataStore, open_store
    from dkha.estimators.batch import KernelHebbianPCA, fit_together
    from dkha.estimators.online import OnlineKernelPCA
    from dkha.estimators.saved import load
    from dkha.estimators.tune import tune
    from dkha.kernels import Kernel, KernelSpec, make_kernel, register_kernel
    from dkha.runs.variance import explained_variance

__all__ = [
    "DataStore",
    "Kernel",
    "KernelHebbianPCA",
    "KernelSpec",
    "OnlineKernelPCA",
    "__version__",
    "explained_variance",
    "fit_denoise",
    "fit_together",
    "ingest_array",
    "ingest_images",
    "load",
    "make_kernel",
    "open_store",
    "register_kernel",
    "tune",
]
