"""dkha: kernel principal components of data sets too large for a kernel matrix.

The Kernel Hebbian Algorithm family (KHA, KHA/t, KHA/et, KHA-SMD) on a Dask row engine.
"""

from dkha import config  # noqa: F401  (registers dkha.* defaults with dask.config)
from dkha.data.store import DataStore, ingest_array, ingest_images, open_store
from dkha.estimators.batch import KernelHebbianPCA, fit_together
from dkha.estimators.online import OnlineKernelPCA
from dkha.estimators.saved import load
from dkha.estimators.tune import tune
from dkha.kernels import Kernel, make_kernel
from dkha.runs.variance import explained_variance
from dkha.version import __version__

__all__ = ["KernelHebbianPCA", "OnlineKernelPCA", "fit_together", "load", "tune", "explained_variance",
           "Kernel", "make_kernel", "DataStore", "ingest_array", "ingest_images", "open_store",
           "__version__"]
