"""dkha: kernel principal components of data sets too large for a kernel matrix.

The Kernel Hebbian Algorithm family (KHA, KHA/t, KHA/et, KHA-SMD) on a Dask row engine.
"""

from dkha import config  # noqa: F401  (registers dkha.* defaults with dask.config)
from dkha.version import __version__
from dkha.estimators.batch import KernelHebbianPCA, fit_together
from dkha.kernels import Kernel, make_kernel
from dkha.data.store import DataStore, ingest_array, ingest_images, open_store

__all__ = ["KernelHebbianPCA", "fit_together", "Kernel", "make_kernel", "DataStore", "ingest_array",
           "ingest_images", "open_store", "__version__"]
