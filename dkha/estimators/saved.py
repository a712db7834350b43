"""``dkha.load(RUN_DIR)``: a saved run back as its fitted estimator."""

from __future__ import annotations

import os

from dkha.data import result
from dkha.estimators.batch import KernelHebbianPCA
from dkha.estimators.online import OnlineKernelPCA


def load(run_dir: str | os.PathLike) -> KernelHebbianPCA | OnlineKernelPCA:
    """The fitted estimator of a run directory, ready to ``transform``, ``inverse_transform``
    and continue: :class:`~dkha.OnlineKernelPCA` (dictionary runs) continues with
    ``partial_fit`` exactly where the run ended; :class:`~dkha.KernelHebbianPCA` continues with
    more passes through ``fit(store, run_dir=RUN_DIR, resume=True)`` (see its ``from_dataset``).

    Parameters
    ----------
    run_dir : str or os.PathLike
        The run directory (holding ``components.zarr``).

    Returns
    -------
    KernelHebbianPCA or OnlineKernelPCA
        The fitted estimator (a batch run's with its ``timings_``).

    Examples
    --------
    >>> import dkha                                  # doctest: +SKIP
    >>> model = dkha.load("runs/digits")             # doctest: +SKIP
    >>> model.transform(X_new)                       # doctest: +SKIP
    """
    ds = result.load(run_dir)
    if "dictionary" in ds:
        return OnlineKernelPCA.from_dataset(ds)
    model = KernelHebbianPCA.from_dataset(ds)
    model.timings_ = result.load_timings(run_dir) or {}
    return model
