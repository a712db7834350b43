"""Where work runs: the one place that resolves a Dask client.

Every public function of dkha that computes on the cluster takes one ``client=`` value, resolved
here by :func:`client_for`: a ``distributed.Client`` (used as is), a scheduler address
(``"tcp://HOST:PORT"``), an ``int`` N (a local cluster of N worker processes), a :class:`Where`
(what the command line's ``--scheduler``, ``--scheduler-file``, ``--workers`` and ``--dashboard``
say), or
``None``. Order: an explicit scheduler address → a scheduler file → ``DASK_SCHEDULER_ADDRESS`` →
the active ``distributed.Client`` of this process (the one a user made, as dask-ml uses it) →
a local cluster. The local default is an in-process cluster (threads, no serialisation) sized to
the machine, or, for work on at most ``dkha.inline-samples`` samples (the caller says how many),
no cluster at all: an :class:`~dkha.engine.inline.InlineClient` runs each task in this thread as
it is submitted (a small fit's time went on the cluster's round trips). Either way the fit runs
the same code path as on a real cluster.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from distributed import Client, LocalCluster, default_client
from distributed.diagnostics.plugin import WorkerPlugin
from threadpoolctl import ThreadpoolController

from dkha.config import Settings
from dkha.data.storage import apply_storage_settings, storage_settings, url_protocol
from dkha.engine.budget import workers_of
from dkha.engine.dashboard import DASHBOARD, port_moves, say_dashboard, watching_workers
from dkha.engine.inline import InlineClient
from dkha.errors import ParameterError
from dkha.progress import phase

log = logging.getLogger(__name__)

#: what a failure to reach a TLS scheduler adds
TLS_HINT = ("; a TLS scheduler needs the client certificate settings "
            "(distributed.comm.tls.ca-file, .client.cert, .client.key — see cluster/README.md)")


@dataclass(frozen=True)
class Where:
    """Where to compute, in the command line's terms: a scheduler address, a scheduler file or a
    number of local worker processes (all ``None``: ``DASK_SCHEDULER_ADDRESS``, else in-process).
    ``dashboard``: the address of the dashboard of a cluster started here (``--dashboard``;
    ``None``: none), said in the log as the cluster starts."""

    scheduler: str | None = None
    scheduler_file: str | None = None
    workers: int | None = None
    dashboard: str | None = DASHBOARD


def where_of(client) -> Where | Client:
    """The :class:`Where` that a ``client=`` value names (a ``Client`` is returned as is)."""
    if client is None:
        return Where()
    if isinstance(client, (Where, Client)):
        return client
    if isinstance(client, bool):
        raise ParameterError(f"client must be a distributed.Client, a scheduler address, a number "
                             f"of local workers or None, got {client!r}")
    if isinstance(client, int):
        return Where(workers=client)
    if isinstance(client, (str, os.PathLike)):
        return Where(scheduler=os.fspath(client))
    raise ParameterError(f"client must be a distributed.Client, a scheduler address, a number of "
                         f"local workers or None, got {client!r}")


def names_a_cluster(client=None) -> bool:
    """Whether ``client`` names a cluster of its own (a ``Client``, a scheduler address or file,
    or ``DASK_SCHEDULER_ADDRESS``) rather than local workers that a fit starts itself."""
    w = where_of(client)
    return isinstance(w, Client) or bool(w.scheduler or w.scheduler_file
                                         or os.environ.get("DASK_SCHEDULER_ADDRESS"))


def cluster_stage(client=None, samples: int | None = None, settings: Settings | None = None
                  ) -> str:
    """What :func:`client_for` does for ``client`` and ``samples`` (at most ``settings``'
    ``inline_samples``: inline), as a stage of the work's progress: connecting to a scheduler,
    starting workers, or running inline."""
    if isinstance(client, (InlineClient, Client)):
        return "using the given Dask client"
    w = where_of(client)
    address = w.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if w.scheduler_file and not w.scheduler:    # the file, as client_for, before the environment
        return f"connecting to the Dask scheduler of {w.scheduler_file}"
    if address:
        return f"connecting to the Dask scheduler at {address}"
    if w.workers:
        return f"starting {int(w.workers)} Dask worker processes"
    if _active_client() is not None:
        return "using the running Dask client"
    if (samples is not None and settings is not None
            and samples <= int(settings.inline_samples)):
        return f"running the tasks in this process ({samples} samples: no cluster to start)"
    return "starting the in-process Dask cluster"


@contextlib.contextmanager
def client_for(client=None, samples: int | None = None, *, settings: Settings
               ) -> Iterator[Client | InlineClient]:
    """A ``distributed.Client`` for ``client`` (see the module docstring), closed (with its
    cluster) on exit. An existing ``Client`` (or :class:`InlineClient`) is used as is and left
    open. ``samples``: the samples of the work about to run; at most ``dkha.inline-samples``
    (of ``settings``) of them, where no cluster is named or active, run inline
    (:class:`InlineClient`).
    """
    if isinstance(client, InlineClient):
        yield client
        return
    w = where_of(client)
    if isinstance(w, Client):
        yield w
        return
    scheduler, scheduler_file, workers = w.scheduler, w.scheduler_file, w.workers
    if workers is not None and int(workers) < 1:
        raise ParameterError(f"--workers must be at least 1, got {workers}")
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    if scheduler and scheduler_file:
        raise ParameterError("give either --scheduler or --scheduler-file, not both")
    if not (scheduler_file or address or workers):
        active = _active_client()
        if active is not None:
            yield active
            return
        if samples is not None and samples <= int(settings.inline_samples):
            yield InlineClient()
            return
    if scheduler_file or address:
        if scheduler_file and not os.path.exists(scheduler_file):
            raise ParameterError(f"scheduler file {scheduler_file} does not exist")
        phase(cluster_stage(w))
        try:
            c = (Client(scheduler_file=scheduler_file, timeout=settings.connect_timeout)
                 if scheduler_file else Client(address, timeout=settings.connect_timeout))
        except (OSError, TimeoutError, TypeError, ValueError) as exc:
            where = f"of {scheduler_file}" if scheduler_file else f"at {address}"
            tls = not scheduler_file and str(address).startswith("tls://")
            raise ParameterError(f"cannot reach the Dask scheduler {where}: {exc}"
                                 + (TLS_HINT if tls else "")) from None
        say_dashboard(c)
        close = c.close
    else:
        cluster, moved = _start_local(w, samples, settings)
        c = Client(cluster)
        say_dashboard(c, moved, cluster, w.dashboard)
        close = functools.partial(_close_started, c, cluster, processes=bool(workers))
    try:
        with watching_workers(c):
            yield c
    finally:
        close()


def _start_local(w: Where, samples: int | None, settings: Settings):
    """The local cluster :func:`client_for` starts for ``w``, and whether its dashboard's port
    moved (:func:`~dkha.engine.dashboard.port_moves`)."""
    ncores = os.cpu_count() or 1
    # the level this process gives distributed's loggers (the CLI raises it to ERROR), at least
    # WARNING, goes into the worker processes too
    silence = max(logging.WARNING, logging.getLogger("distributed").getEffectiveLevel())
    phase(cluster_stage(w, samples, settings))
    with port_moves(w.dashboard) as moved:
        if w.workers:
            n = int(w.workers)
            with interrupts_ignored():
                cluster = LocalCluster(n_workers=n, threads_per_worker=max(1, ncores // n),
                                       processes=True, dashboard_address=w.dashboard,
                                       silence_logs=silence, env=_worker_env(settings))
        else:
            # on a GPU host the one worker declares its GPU (dask-cuda's convention, one worker
            # a GPU): device="auto" then computes its tiles there without being told
            gpus = {"GPU": 1} if local_gpus() else {}
            cluster = LocalCluster(n_workers=1, threads_per_worker=ncores, processes=False,
                                   dashboard_address=w.dashboard, silence_logs=silence,
                                   resources=gpus)
    return cluster, moved


def _close_started(client, cluster, *, processes: bool) -> None:
    """Close a cluster dkha started, and its client, quietly: the complaints of its parts that
    another went away are not errors of the run (a worker's heartbeat in flight as the scheduler
    removes it, "Failed to communicate with scheduler during heartbeat" and its traceback; the
    scheduler reporting a finished task to the client that has just closed, "Closed comm …
    while trying to write", at CRITICAL, with a traceback; both seen after a stop).
    distributed's loggers stay silent until the cluster is closed: this process's here, those
    of worker ``processes`` there first (:func:`_quiet_loggers`)."""
    levels = _quiet_loggers()
    try:
        if processes:
            with contextlib.suppress(Exception):
                client.run(_quiet_loggers, on_error="ignore")
        client.close()
        cluster.close()
    finally:
        for name, level in zip(_SHUTDOWN_LOGGERS, levels):
            logging.getLogger(name).setLevel(level)


#: distributed's loggers that speak while a cluster dkha started closes under them
_SHUTDOWN_LOGGERS = ("distributed.worker", "distributed.nanny", "distributed.core",
                     "distributed.scheduler")


def _quiet_loggers() -> list[int]:
    """Silence :data:`_SHUTDOWN_LOGGERS` in this process (above CRITICAL: the scheduler reports
    a message to a client whose comm has closed at CRITICAL); their levels before."""
    loggers = [logging.getLogger(n) for n in _SHUTDOWN_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    return levels


def local_gpus() -> int:
    """The GPUs this process can use: CuPy's device count (0 without CuPy, a driver or a GPU)."""
    try:
        import cupy
    except Exception:  # noqa: BLE001 - no CuPy (or a broken one): no GPU to declare
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - CuPy without a driver or a device
        return 0


def gpu_workers(client) -> list[str]:
    """The workers that declare a ``GPU`` resource (``dask worker --resources GPU=1``, the
    in-process cluster on a GPU host), in address order."""
    workers = workers_of(client)
    return sorted(a for a, w in workers.items()
                  if float((w.get("resources") or {}).get("GPU", 0)) > 0)


def computes_on_gpu(client, device: str) -> bool:
    """Whether kernel tiles on ``client``'s workers run on a GPU for ``device`` (``dkha.device``):
    ``cuda``, or ``auto`` with workers that declare one."""
    return device == "cuda" or (device == "auto" and bool(gpu_workers(client)))


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile, in the main thread: worker processes started meanwhile inherit
    it (Python keeps an ignored SIGINT). A terminal's Ctrl-C reaches the whole process group;
    the workers leave the stop to the coordinator (which checkpoints, then closes them) instead
    of dying under its feet (scatter: "No valid workers found", heartbeat tracebacks)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _active_client():
    """The process's default ``distributed.Client`` if one is running, else None."""
    try:
        c = default_client()
    except ValueError:
        return None
    return c if c.status == "running" else None


def shared(client, *values, broadcast: bool = False) -> list:
    """``values``, arguments that many tasks use, as the cluster should get them: scattered once
    as data (futures, copied to every worker with ``broadcast``), so that no graph carries them
    (10 MB in a graph: distributed's "Sending large graph" warning, and the scheduler's time);
    as they are where no cluster runs the tasks (``client`` None, or tasks run inline)."""
    if client is None or isinstance(client, InlineClient):
        return list(values)
    return client.scatter(list(values), broadcast=broadcast, hash=False)


def shares_process(client) -> bool:
    """Whether the workers of ``client`` are this process (the in-process cluster, or tasks run
    inline): their tasks see this process's memory and settings, nothing is copied."""
    if isinstance(client, InlineClient):
        return True
    address = getattr(getattr(client, "scheduler", None), "address", "") or ""
    return str(address).startswith("inproc://")


def total_threads(client) -> int:
    """The threads of ``client``'s workers, asked afresh (:func:`dkha.engine.budget.workers_of`)."""
    return max(1, sum(w.get("nthreads", 1) for w in workers_of(client).values()))


#: glibc's settings for the kernel blocks (``mallopt``; the same as its ``MALLOC_*_`` variables):
#: blocks up to 512 MiB come from the heap, and up to 256 MiB freed stays there for the next block
HEAP_BLOCKS = {"MALLOC_MMAP_THRESHOLD_": 512 << 20, "MALLOC_TRIM_THRESHOLD_": 256 << 20,
               "MALLOC_TOP_PAD_": 64 << 20}
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}


def heap_blocks(settings: Settings) -> bool:
    """Serve this process's kernel blocks from glibc's heap (``dkha.heap-blocks``, on by default;
    Linux with glibc only; whether it was set).

    A block of ``b × l`` rows (41 MB at ``b = 256``, ``l = 20 000``) is above glibc's largest
    dynamic mmap threshold (32 MiB), so each new block was a fresh mapping whose every page
    faulted on first write, and was unmapped when freed. Kept in the heap, a freed block's pages
    serve the next one: a KHA-SMD pass at l = 20 000 on 2 cores took 3.21–3.25 s instead of
    3.50–3.71 s in float64 and 2.30–2.39 s instead of 2.47–2.80 s in float32
    (``benchmarks/throughput.py``, runs interleaved). The heap returns free memory above 256 MiB
    (``MALLOC_TRIM_THRESHOLD_``): the default fit of 200 000 × 16 peaked at 1.57 GiB
    (``benchmarks/memory_budget.py``; with 1 GiB kept, 1.96 GiB)."""
    if not _heap_blocks_wanted(settings):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(_MALLOPT[k], v) == 1 for k, v in HEAP_BLOCKS.items())
    except (OSError, AttributeError):      # not glibc
        return False


#: what a phase must have dropped for :func:`release_free_heap` to run: a collection of the
#: fit's objects costs ~0.2 s, which every small fit paid twice (scikit-learn's estimator checks,
#: a hundred fits of a few hundred samples, took 97 s instead of ~20)
RELEASE_BYTES = 64 * 2**20


def release_free_heap(dropped: int | None = None) -> bool:
    """Give the memory a phase has dropped back to the system: what only the cycle collector
    frees (kernel blocks of a finished stream were seen held for minutes, until a collection),
    then glibc's ``malloc_trim(0)`` (Linux with glibc only; returns whether it ran). With
    :func:`heap_blocks` the heap keeps what it frees below the 256 MiB trim threshold, and a freed
    array below arrays allocated after it stays resident whatever its size: the Nyström start's
    landmark rows (335 × 200 000 float64, 511 MiB) stayed in the fit's memory for its whole
    block stream. Called between phases where they dropped ``dropped`` bytes, at least
    :data:`RELEASE_BYTES` (None: whatever they dropped); no numbers change."""
    if dropped is not None and dropped < RELEASE_BYTES:
        return False
    gc.collect()
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):      # not glibc
        return False


def _heap_blocks_wanted(settings: Settings) -> bool:
    return bool(settings.heap_blocks) and sys.platform.startswith("linux")


def _worker_env(settings: Settings) -> dict:
    """The environment of the worker processes dkha starts (:func:`heap_blocks` there too)."""
    return {k: str(v) for k, v in HEAP_BLOCKS.items()} if _heap_blocks_wanted(settings) else {}


@contextlib.contextmanager
def blas_threads_for(client, settings: Settings, gpu: bool = False, threads: int = 1
                     ) -> Iterator[None]:
    """``threads`` BLAS threads (the fit's :class:`~dkha.engine.budget.Layout`: one) for the
    coordinator's arithmetic meanwhile and on every worker process of ``client``; this
    process's kernel blocks from the heap (:func:`heap_blocks`).

    OpenBLAS's GEMM and LAPACK give other bits on another number of threads (a 500 × 500 by
    500 × 3 000 product, an ``eigh`` of 100 × 100), so a fit's bits followed the coordinator's
    cores on a cluster of worker processes (one thread in-process): the same store fitted on 2
    by-hand workers and in-process differed by 5e-14 (issue 43). One thread also keeps the
    in-process cluster's tasks from oversubscribing the cores (a pass at l = 20 000 took 18.0 s
    with OpenBLAS's default threads, 11.4 s with one). Worker processes get the same limit
    (:class:`BlasThreads`; a nanny's workers have it from ``distributed`` already). With tiles
    on a GPU the coordinator's BLAS is left alone (its bits are the device's).
    """
    heap_blocks(settings)
    if gpu:
        yield
        return
    if not shares_process(client):
        with contextlib.suppress(Exception):      # placement of a setting: the fit runs without
            client.register_plugin(BlasThreads(threads), name=BlasThreads.name)
    with blas_limit(threads):
        yield


class BlasThreads(WorkerPlugin):
    """A worker plugin: the worker process's BLAS threads limited to ``threads`` (present
    workers and every one that joins later), so that its tiles' bits do not follow its cores."""

    name = "dkha-blas-threads"

    def __init__(self, threads: int = 1):
        self.threads = int(threads)

    def setup(self, worker=None) -> None:
        blas_limit(self.threads)      # kept: the worker process computes only tasks


_CONTROLLER: list = []


def blas_limit(threads: int):
    """``threadpoolctl``'s limit of the BLAS threads to ``threads`` (a context manager), from
    one controller made on first use: making one lists the process's loaded libraries, 10 ms
    that every small fit paid twice."""
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=int(threads), user_api="blas")


class StorageSettings(WorkerPlugin):
    """A worker plugin: one protocol's fsspec settings, applied on every worker as it starts
    (those present when registered and every one that joins later)."""

    def __init__(self, protocol: str, settings: dict):
        self.protocol = protocol
        self.settings = settings
        self.name = f"dkha-storage-{protocol}"

    def setup(self, worker=None) -> None:
        apply_storage_settings(self.protocol, self.settings)


def share_storage_options(client, path: str) -> None:
    """Give the workers this process's fsspec settings for the protocol of a store URL
    (``--storage-option``, ``FSSPEC_<PROTOCOL>_*``), present and future workers alike, so they
    read the store's chunks themselves. Nothing to do for a local path or without settings
    (the workers' own environment — ``AWS_ENDPOINT_URL``, credentials — then applies)."""
    protocol = url_protocol(path)
    settings = storage_settings(path) if protocol else {}
    if not settings:
        return
    if shares_process(client):
        return      # the workers are this process: they use its settings already
    plugin = StorageSettings(protocol, settings)
    client.register_plugin(plugin, name=plugin.name)
    log.info("%s settings (%s) sent to the workers", protocol, ", ".join(sorted(settings)))
