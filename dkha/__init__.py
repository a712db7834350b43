"""dkha: kernel principal components of data sets too large for a kernel matrix.

The Kernel Hebbian Algorithm family (KHA, KHA/t, KHA/et, KHA-SMD) on a Dask row engine.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dkha")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

from dkha import config  # noqa: E402,F401  (registers dkha.* defaults with dask.config)
from dkha.estimator import KernelHebbianPCA, fit_together  # noqa: E402
from dkha.kernels import Kernel, make_kernel  # noqa: E402
from dkha.online import OnlineKernelPCA  # noqa: E402
from dkha.saved import load  # noqa: E402
from dkha.store import DataStore, ingest_array, ingest_images, open_store  # noqa: E402

__all__ = ["KernelHebbianPCA", "OnlineKernelPCA", "load", "fit_together", "Kernel", "make_kernel", "DataStore", "ingest_array",
           "ingest_images", "open_store", "__version__"]
