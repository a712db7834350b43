"""dkha: kernel principal components of data sets too large for a kernel matrix.

The Kernel Hebbian Algorithm family (KHA, KHA/t, KHA/et, KHA-SMD) on a Dask row engine.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dkha")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

#: the public names and the modules they live in, imported on first use (PEP 562), so that
#: ``dkha --help`` and the first progress line of ``dkha fit`` do not wait for dask and xarray
_PUBLIC = {"KernelHebbianPCA": "dkha.estimator", "fit_together": "dkha.estimator",
           "Kernel": "dkha.kernels", "make_kernel": "dkha.kernels", "DataStore": "dkha.store",
           "ingest_array": "dkha.store", "ingest_images": "dkha.store", "open_store": "dkha.store",
           # registers dkha.* defaults with dask.config (every module reading them imports it)
           "config": "dkha.config"}


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'dkha' has no attribute {name!r}")
    value = importlib.import_module(module)
    return value if name == "config" else getattr(value, name)


def __dir__():
    return sorted(list(globals()) + list(_PUBLIC))

__all__ = ["KernelHebbianPCA", "fit_together", "Kernel", "make_kernel", "DataStore", "ingest_array",
           "ingest_images", "open_store", "__version__"]
