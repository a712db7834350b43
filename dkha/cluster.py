"""Where work runs: the one place that resolves a Dask client.

Order: an explicit client → an explicit scheduler address → a scheduler file →
``DASK_SCHEDULER_ADDRESS`` → the active ``distributed.Client`` of this process (the one a user
made, as dask-ml uses it) → a local cluster. The local default is an in-process cluster (threads, no serialisation) sized to the
machine; ``workers=N`` asks for a local cluster of N worker processes. Either way the fit runs
the same code path as on a real cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from dkha import config
from dkha.errors import ParameterError

log = logging.getLogger(__name__)


def describe_target(scheduler: str | None = None, scheduler_file: str | None = None,
                    workers: int | None = None) -> str:
    if scheduler:
        return f"scheduler {scheduler}"
    if scheduler_file:
        return f"scheduler file {scheduler_file}"
    if os.environ.get("DASK_SCHEDULER_ADDRESS"):
        return f"scheduler {os.environ['DASK_SCHEDULER_ADDRESS']} (DASK_SCHEDULER_ADDRESS)"
    if workers:
        return f"local cluster of {workers} worker processes"
    return "in-process local cluster"


@contextlib.contextmanager
def client_for(scheduler: str | None = None, scheduler_file: str | None = None,
               workers: int | None = None, client=None) -> Iterator["distributed.Client"]:  # noqa: F821
    """A ``distributed.Client`` for the requested target, closed (with its cluster) on exit.

    An existing ``client`` (given, or the process's active one) is used as is and left open.
    """
    from distributed import Client, LocalCluster

    if client is not None:
        yield client
        return
    if workers is not None and int(workers) < 1:
        raise ParameterError(f"--workers must be at least 1, got {workers}")
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    if scheduler and scheduler_file:
        raise ParameterError("give either --scheduler or --scheduler-file, not both")
    if scheduler_file:
        if not os.path.exists(scheduler_file):
            raise ParameterError(f"scheduler file {scheduler_file} does not exist")
        try:
            c = Client(scheduler_file=scheduler_file, timeout=config.get("connect-timeout"))
        except (OSError, TimeoutError, TypeError, ValueError) as exc:
            raise ParameterError(f"cannot reach the Dask scheduler of {scheduler_file}: {exc}") from None
        try:
            yield c
        finally:
            c.close()
        return
    if address:
        try:
            c = Client(address, timeout=config.get("connect-timeout"))
        except (OSError, TimeoutError, TypeError, ValueError) as exc:
            hint = ""
            if str(address).startswith("tls://"):
                hint = ("; a TLS scheduler needs the client certificate settings "
                        "(distributed.comm.tls.ca-file, .client.cert, .client.key — see cluster/README.md)")
            raise ParameterError(f"cannot reach the Dask scheduler at {address}: {exc}{hint}") from None
        try:
            yield c
        finally:
            c.close()
        return
    if not workers:
        active = _active_client()
        if active is not None:
            yield active
            return
    ncores = os.cpu_count() or 1
    if workers:
        n = int(workers)
        cluster = LocalCluster(n_workers=n, threads_per_worker=max(1, ncores // n), processes=True,
                               dashboard_address=":0", silence_logs=logging.WARNING)
    else:
        cluster = LocalCluster(n_workers=1, threads_per_worker=ncores, processes=False,
                               dashboard_address=":0", silence_logs=logging.WARNING)
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _active_client():
    """The process's default ``distributed.Client`` if one is running, else None."""
    from distributed import default_client

    try:
        c = default_client()
    except ValueError:
        return None
    return c if c.status == "running" else None


def total_threads(client) -> int:
    info = client.scheduler_info()
    return max(1, sum(w.get("nthreads", 1) for w in info.get("workers", {}).values()))


@contextlib.contextmanager
def blas_threads_for(client) -> Iterator[None]:
    """One BLAS thread per Dask thread when the workers share this process.

    The in-process cluster already runs one task per core; OpenBLAS's own threads on top of
    that oversubscribe the cores (measured: a pass at l = 20 000 took 18.0 s with OpenBLAS's
    default threads, 11.4 s with one). Remote and process clusters are left alone.
    """
    address = getattr(getattr(client, "scheduler", None), "address", "") or ""
    if not str(address).startswith("inproc://"):
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
