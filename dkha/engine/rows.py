"""The coordinator's row engine: centered kernel rows and the MK row, computed blockwise on Dask
workers by the tasks of :mod:`dkha.engine.tasks`.

The centered kernel (coordinator-math.md §1) is never formed whole::

    K'[P, J] = K[P, J] - mk[J] - mk[P][:, None] + mkm

:func:`center_block` is the one centering function; every path (fit, evaluation, transform)
goes through it. :class:`RowEngine` owns the data path on the cluster: workers read the data
store's chunks once and keep them in a per-process cache (:func:`load_rows`), compute the MK row
tile by tile, the centered row blocks of the schedule ahead of the coordinator (a bounded FIFO
of futures in schedule order), and the blockwise products ``K' V`` that evaluation needs.

Where the block projections ``Y₀ = S̃ K'_Pᵀ`` of the batch solvers are computed is the engine's
``projections`` setting (``dkha.projections``):

* ``"coordinator"``: workers ship the kernel rows ``K'[P, :]`` (``b·l`` numbers a block) and the
  coordinator multiplies;
* ``"workers"`` (coordinator-math.md §4): the worker holding column group ``J`` keeps a replica of
  ``S̃[:, J]`` (and ``C̃[:, J]``) in a per-process registry (like the chunk cache), updated by
  small tasks pinned to it that replay the coordinator's messages in order, and returns the
  partial projections ``K'[P, J] S̃[:, J]ᵀ`` and its part of ``K'[P, W ∪ P]`` (columns of the
  kernel block it computed anyway) for the window ``W`` of blocks ahead in the FIFO, with which
  the coordinator brings the projections (computed on the version of ``S̃`` current when the
  block was submitted) up to date: ``(2r·groups + |W| + b)·b`` numbers a block. Replicas are
  versioned: a task that finds its replica missing or at the wrong version raises
  :class:`ReplicaLostError`, and so does a wait on a worker that left the cluster; the
  coordinator then rebuilds every replica exactly, from the ``S̃`` and ``C̃`` it kept at the
  last pass end (or the stream's start) and the messages since, replayed with the kernel blocks
  recomputed (:func:`~dkha.engine.tasks.replica_replay`; from its current state, ``C̃[:, J] =
  S̃_A K'[:, J]`` recomputed, where it kept none, e.g. resumed mid-pass), and resubmits the
  blocks in flight on their own versions, up to ``RowEngine.replica_rebuilds`` times in a row (without a block completing in between). At every pass end each replica of ``S̃`` is
  checked against the coordinator's (:class:`ReplicaDivergedError` if they differ) and ``C̃`` is
  brought home (``r·l`` numbers). Blocks are projected on the version current when they were
  submitted (replicas keep snapshots of ``S̃`` for the blocks in flight), so a run is
  reproducible bit for bit; resuming from a checkpoint reproduces it up to rounding only.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
from distributed import wait as wait_for

from dkha import config
from dkha.data.centering import centering_key, read_centering, write_centering
from dkha.data.store import DataStore
from dkha.engine.budget import memory_plan
from dkha.engine.cluster import share_storage_options, total_threads
from dkha.engine.replicas import ProjectedBlock, WorkerReplicas
from dkha.engine.stop import check_stop
from dkha.engine.tasks import (
    ReplicaLostError,
    accumulate,
    assemble_rows,
    center_block,
    centered_rows,
    clear_cache,
    dense_pair,
    diagonal_rows,
    identity,
    kernel_tile,
    load_rows,
    mk_sample_tile,
    mk_tile,
    product_pair,
    project_rows,
    residual_pair,
    take_rows,
    tile_sums,
    tile_take,
)
from dkha.errors import BlockFailedError, ClusterLostError, ParameterError
from dkha.kernels import Kernel
from dkha.progress import Progress
from dkha.solvers.factored import FactoredState

log = logging.getLogger(__name__)

PROJECTIONS = ("auto", "coordinator", "workers")
_STOP_POLL_SECONDS = 0.5    # waiting on a task: check the stop request this often
#: at most this many bytes of tile results wait on the workers for a band sum of a reduced
#: pass (:meth:`RowEngine.reduced_pass`), besides the tasks in flight
REDUCE_HOLD_BYTES = 256 * 2**20


def choose_projections(requested: str, client, cache_rows: bool = False,
                       models: int = 1) -> tuple[str, str]:
    """Where a batch solver's block projections are computed, and why.

    ``auto`` chooses from the cluster: on the workers (coordinator-math.md §4) when they are
    other processes than the coordinator, where each block's kernel rows (``b·l`` numbers) would
    otherwise travel to it and the coordinator would multiply them itself; on the coordinator
    when the workers share its process (the rows are not copied, and the replicas' messages only
    add work), when the row cache serves the rows, or when ``models`` models share the stream
    (replicas follow one model).
    """
    if requested != "auto":
        return requested, f"asked for ({requested})"
    if models > 1:
        return "coordinator", "several models share one stream"
    if cache_rows:
        return "coordinator", "the row cache serves kernel rows to the coordinator"
    address = str(getattr(getattr(client, "scheduler", None), "address", "") or "")
    if address.startswith("inproc://"):
        return "coordinator", "the workers share the coordinator's process"
    n = len(client.scheduler_info().get("workers", {}))
    return "workers", (f"{n} worker process{'es' if n != 1 else ''} at {address}: projections "
                       "travel instead of kernel rows")


__all__ = ["PROJECTIONS", "ProjectedBlock", "RowEngine", "StreamStats", "center_block",
           "clear_cache", "load_rows", "project_rows"]


@dataclass
class StreamStats:
    """What the block stream measured: blocks, rows, seconds waited, bytes received from the
    workers (kernel rows, or projections, windows and ``C̃``), bytes of messages sent to replicas,
    messages replayed on stale projections, and replica rebuilds."""

    blocks: int = 0
    rows: int = 0
    wait_seconds: float = 0.0
    bytes_received: int = 0
    history: list = field(default_factory=list)
    bytes_sent: int = 0
    messages_replayed: int = 0
    replica_rebuilds: int = 0
    #: replicas moved onto workers that joined (:meth:`WorkerReplicas.rebalance`)
    replica_moves: int = 0
    #: seconds of this engine's exact MK pass (one pass over the tiles I ≤ J), if it made one
    mk_pass_seconds: float | None = None
    #: one entry per tile pass (MK row, K'V, residuals): what, tasks, wall and waiting seconds
    #: of the coordinator, bytes of results it received
    passes: list = field(default_factory=list)


def _groups_of_chunks(store: DataStore, n_groups: int, max_rows: int | None = None
                      ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Consecutive chunk ranges split into about ``n_groups`` groups (each at least one chunk,
    at most ``max_rows`` rows unless a single chunk is larger)."""
    chunks = [store.chunk_bounds(i) for i in range(store.n_chunks)]
    n_groups = max(1, min(n_groups, len(chunks)))
    per = -(-len(chunks) // n_groups)
    if max_rows is not None:
        per = max(1, min(per, max_rows // store.chunk_rows))
    return tuple(tuple(chunks[i:i + per]) for i in range(0, len(chunks), per))


#: the fewest rows a side of a tile of the blockwise passes (below, a task's scheduling costs
#: more than its kernels)
MIN_TILE_ROWS = 64


def _tile_ranges(l: int, threads: int, max_rows: int) -> tuple[tuple[tuple[int, int]], ...]:
    """Equal row ranges (one a group) for the square tiles ``I ≤ J`` of the blockwise passes:
    at most ``max_rows`` a side, and enough tiles for about four per thread (``n(n+1)/2 ≥
    4·threads``: the diagonal tiles cost half, so fewer leave threads idle at a pass's end), but
    no side under :data:`MIN_TILE_ROWS`. Ranges need not follow the store's chunks (a worker
    reads and caches any row range), so a store of few large chunks still spreads over every
    worker."""
    n = -(-l // max_rows)
    while n * (n + 1) // 2 < 4 * threads:
        n += 1
    n = max(1, min(n, l // MIN_TILE_ROWS))
    cuts = [round(k * l / n) for k in range(n + 1)]
    return tuple(((a, b),) for a, b in zip(cuts[:-1], cuts[1:]) if b > a)


class RowEngine:
    """Kernel rows of one data store and kernel, on a Dask cluster.

    Parameters
    ----------
    store : DataStore
    kernel : Kernel
        With all parameters set (``sigma`` resolved).
    client : distributed.Client
    block_rows, prefetch, column_groups : int, optional
        Default: block rows and prefetch from ``dkha.memory-budget`` (at most ``dkha.block-rows``,
        ``dkha.prefetch``; :func:`dkha.engine.budget.memory_plan`, the plan in :attr:`memory`),
        ``dkha.column-groups``.
    projections : {"auto", "coordinator", "workers"}, optional
        Where a batch solver's block projections are computed (module docstring); default
        ``dkha.projections`` (``auto``: :func:`choose_projections`, the choice and its reason
        in ``projections`` and ``projections_reason``).
    cache_rows : bool, optional
        Keep the kernel on the workers (default ``dkha.row-cache``): the upper-triangle tiles
        ``K[I, J]``, ``I ≤ J``, are computed once (the MK row comes from their sums) and every
        later row block, product ``K' V`` and residual reads them instead of recomputing kernels.
        Needs about ``4·l²`` bytes of worker memory (refused above half of what the workers
        have). Row mode only: worker-side projections compute their own rows.
    precision : {"float64", "float32"}, optional
        The kernel tiles' precision (``dkha.precision``, default float64): float32 runs the
        distance GEMM and the fused sweep in single precision (:mod:`dkha.tiles`); rows, products
        and everything the coordinator accumulates stay float64.
    device : {"cpu", "cuda", "auto"}, optional
        Where the workers compute kernel tiles (``dkha.device``, default cpu): ``cuda`` with CuPy
        (``dkha[gpu]``), ``auto`` on the workers that declare a ``GPU`` resource.
    models : int, optional
        How many models share the block stream (1): with several, ``auto`` projections stay on
        the coordinator (worker replicas follow one model).

    Attributes
    ----------
    replica_rebuilds : int
        How many times in a row (no block completing in between) a stream may rebuild lost
        worker replicas before it fails (3).
    verbose : bool
        Show the progress of whole passes (the MK row, products ``K' V``, residuals) by tile
        (:class:`dkha.progress.Progress`); ``pass_label`` names the pass in progress (e.g.
        ``"Krylov product 3"``). Set by the estimators' ``verbose=``.
    """

    replica_rebuilds = 3

    def __init__(self, store: DataStore, kernel: Kernel, client, *, block_rows: int | None = None,
                 prefetch: int | None = None, column_groups: int | None = None,
                 projections: str | None = None, cache_rows: bool | None = None,
                 precision: str | None = None, device: str | None = None, models: int = 1):
        share_storage_options(client, store.path)
        requested = str(config.get("projections", projections))
        if requested not in PROJECTIONS:
            raise ParameterError(f"unknown projections {requested!r}; choose one of "
                                 f"{', '.join(PROJECTIONS)}")
        self.store = store
        self.kernel = kernel.computed_with(str(config.get("precision", precision)),
                                           str(config.get("device", device)))
        # evaluation (E(A), E_min) and the row cache stay float64 whatever the precision: E_min² =
        # ‖K'‖² − Σλ² cancels, and float32 tiles moved E_min by 1.6e-5 on the digits
        self.exact_kernel = self.kernel.computed_with(precision="float64")
        self.client = client
        threads = total_threads(client)
        # block rows, prefetch and tile side from dkha.memory-budget (dkha.engine.budget)
        self.memory = memory_plan(store.n_samples, client, threads=threads,
                                  block_rows=block_rows, prefetch=prefetch)
        self.block_rows, self.prefetch = self.memory.block_rows, self.memory.prefetch
        ng = config.get("column-groups", column_groups)
        if ng is None:
            ng = total_threads(client)
        self.column_groups = _groups_of_chunks(store, int(ng))
        self.all_ranges = tuple(r for g in self.column_groups for r in g)
        # square tiles for the MK row and evaluation: at most dkha.tile-rows rows a side, and
        # enough of them to keep every thread busy
        self.tile_groups = _tile_ranges(store.n_samples, threads, self.memory.tile_rows)
        self.cache_rows = bool(config.get("row-cache", cache_rows))
        self._tiles: dict | None = None
        if self.cache_rows:
            # fewer, larger tiles: a row block takes one piece from each tile it meets, so the
            # tasks per block grow with the tile count; about 4 tiles a thread keeps all busy
            self.tile_groups = _groups_of_chunks(store, max(1, int(np.ceil(np.sqrt(8 * threads)))))
            self._check_cache_memory()
        self.projections, self.projections_reason = choose_projections(
            requested, client, self.cache_rows, models)
        self.mk: np.ndarray | None = None
        self.mkm: float | None = None
        self._mk_future = None
        self.stats = StreamStats()
        self.verbose = False
        self.pass_label: str | None = None

    @contextlib.contextmanager
    def labelled(self, label: str):
        """Name the passes made meanwhile (their progress shows ``label``)."""
        old, self.pass_label = self.pass_label, label
        try:
            yield self
        finally:
            self.pass_label = old

    def _tiles_progress(self, desc: str, total: int, transient: bool = True) -> Progress:
        return Progress(self.verbose, total, self.pass_label or desc, unit="tile",
                        transient=transient)

    @property
    def n_samples(self) -> int:
        return self.store.n_samples

    # -- the kernel tile cache --
    def cache_bytes(self) -> int:
        """Bytes of worker memory the tile cache takes (upper triangle, diagonal tiles whole)."""
        b = [g[-1][1] - g[0][0] for g in self.tile_groups]
        return 8 * sum(b[i] * b[j] for i in range(len(b)) for j in range(i, len(b)))

    def _check_cache_memory(self) -> None:
        import psutil

        workers = self.client.scheduler_info().get("workers", {}).values()
        limits = [w.get("memory_limit") or 0 for w in workers]
        total = sum(m if m else psutil.virtual_memory().total for m in limits) or 1
        need = self.cache_bytes()
        if need > 0.5 * total:
            raise ParameterError(
                f"the row cache needs {need / 2**30:.1f} GiB of worker memory (the kernel's upper "
                f"triangle at l = {self.n_samples}) but the workers have {total / 2**30:.1f} GiB; "
                "run without --cache-rows (kernels are then recomputed each pass) or on more workers")

    def _tile_futures(self) -> dict:
        """The cached tiles ``{(i, j): future of K[I, J]}``, ``i ≤ j``, submitted on first use."""
        if self._tiles is None:
            path, g = self.store.path, self.tile_groups
            self._tiles = {(i, j): self.client.submit(kernel_tile, path, self.exact_kernel, g[i],
                                                      g[j], pure=False)
                           for i in range(len(g)) for j in range(i, len(g))}
        return self._tiles

    def _tile(self, i: int, j: int):
        return self._tile_futures()[(i, j)] if self.cache_rows else None

    def release_cache(self) -> None:
        """Drop the cached tiles from the workers."""
        if self._tiles is not None:
            self.client.cancel(list(self._tiles.values()))
            self._tiles = None

    # -- MK row --
    centering: dict | None = None   # what compute_mk made the row in use: method, parameters

    def compute_mk(self, *, center_sample: int | None = None, seed: int = 0,
                   cache: bool | None = None) -> tuple[np.ndarray, float]:
        """The MK row ``mk_j = (1/l) Σ_i k(x_i, x_j)`` and ``mkm = (1/l) Σ_j mk_j``.

        Exact by default: one pass over the tiles ``I ≤ J`` (``O(l² n)``). With
        ``center_sample=N``, an explicitly approximate row from a seeded sample ``S`` of ``N``
        columns, ``mk_j ≈ (1/N) Σ_{i∈S} k(x_i, x_j)`` (``O(l N n)``; at ``N = l`` it is the exact
        row up to rounding). Either row is cached in the data store (``cache``, default
        ``dkha.mk-cache``), keyed by the kernel, its parameters, the method and the content of
        ``X`` (:func:`dkha.data.centering.centering_key`), and read back instead of recomputed.
        ``self.centering`` describes the row in use.
        """
        l = self.n_samples
        centering = {"kernel": self.kernel.name, "parameters": self.kernel.param_dict,
                     "centering": "exact"}
        if self.kernel.precision != "float64":      # float64 rows keep their cache keys
            centering["precision"] = self.kernel.precision
        if center_sample is not None:
            if not 1 <= int(center_sample) <= l:
                raise ParameterError(f"center_sample must lie in 1..{l} (the number of samples), "
                                     f"got {center_sample}")
            centering.update(centering="sample", center_sample=int(center_sample), seed=int(seed))
        key = None
        if bool(config.get("mk-cache", cache)):
            key = centering_key(self.store, centering)
            cached = read_centering(self.store, key)
            if cached is not None:
                self.set_mk(*cached)
                self.centering = dict(centering, cached=True)
                return self.mk, self.mkm
        t0 = time.perf_counter()
        mk = self._mk_pass() if center_sample is None else self._mk_sample(int(center_sample), seed)
        log.info("%s MK row in %.1f s", centering["centering"], time.perf_counter() - t0)
        if center_sample is None:
            self.stats.mk_pass_seconds = time.perf_counter() - t0
        self.set_mk(mk, float(mk.mean()))
        self.centering = dict(centering, cached=False)
        if key is not None:
            write_centering(self.store, key, self.mk, self.mkm)
        return self.mk, self.mkm

    def _mk_pass(self) -> np.ndarray:
        """The exact MK row: one pass over chunk pairs (tiles ``I ≤ J``)."""
        path, groups = self.store.path, self.tile_groups
        pairs = self._pairs()

        def submit(k):
            i, j = pairs[k]
            if self.cache_rows:
                return self.client.submit(tile_sums, self._tile(i, j), i == j, pure=False)
            return self.client.submit(mk_tile, path, self.kernel, groups[i], groups[j], pure=False)

        # column sums to band j, row sums (off the diagonal) to band i
        routes = [[(j, 0)] + ([(i, 1)] if i != j else []) for i, j in pairs]
        mk = self.reduced_pass(submit, routes, None, "the MK row (centering) pass", kind="mk",
                               progress="centering (MK row)", transient=False)
        return mk / self.n_samples

    def _mk_sample(self, n: int, seed: int) -> np.ndarray:
        """The MK row estimated from ``n`` seeded random columns (pieces of ≤ ``dkha.tile-rows``)."""
        l = self.n_samples
        sample = np.sort(np.random.default_rng([int(seed), 4]).choice(l, size=n, replace=False))
        piece = int(config.get("tile-rows"))
        parts = [self.put(self.store.read_rows(sample[a:a + piece]), everywhere=True)
                 for a in range(0, n, piece)]
        groups = self.tile_groups
        tasks = [(band, part) for band in range(len(groups)) for part in parts]
        mk = self.reduced_pass(
            lambda k: self.client.submit(mk_sample_tile, self.store.path, self.kernel,
                                         groups[tasks[k][0]], tasks[k][1], pure=False),
            [[(band, None)] for band, _ in tasks], None, "the sampled MK row", kind="mk",
            progress="centering (MK row from a sample)", transient=False)
        return mk / n

    def centered_diagonal(self) -> np.ndarray:
        """``K'[p, p] = k(x_p, x_p) − 2 mk_p + mkm`` for every sample: ``‖Φ'(x_p)‖²``.

        For the gaussian and laplacian kernels ``k(x, x) = 1`` needs no data; otherwise one task
        per column group reads its chunks (``O(l n)``, no kernel rows)."""
        self._need_mk()
        if self.kernel.name in ("gaussian", "laplacian"):
            diagonal = np.ones(self.n_samples)
        else:
            futures = [self.client.submit(diagonal_rows, self.store.path, self.kernel, g,
                                          pure=False) for g in self.column_groups]
            diagonal = np.concatenate(self.gather(futures, "the kernel's diagonal"))
        return diagonal - 2.0 * self.mk + self.mkm

    def set_mk(self, mk: np.ndarray, mkm: float) -> None:
        self.mk = np.asarray(mk, dtype=np.float64)
        self.mkm = float(mkm)
        self._mk_future = self.put(self.mk)

    def gather(self, futures, what: str = "a block"):
        """``client.gather`` that turns cluster failures into dkha's errors.

        A task that killed every worker it ran on → :class:`BlockFailedError` naming ``what``;
        a lost scheduler → :class:`ClusterLostError` (exit code 75: resumable).
        """
        from distributed import KilledWorker
        from distributed.comm.core import CommClosedError

        try:
            return self.client.gather(futures)
        except KilledWorker as exc:
            raise BlockFailedError(f"{what} killed every worker it was sent to ({exc}); "
                                   "the last checkpoint is kept") from None
        except (CommClosedError, OSError, TimeoutError) as exc:
            if self.client.status in ("running",) and not isinstance(exc, CommClosedError):
                raise
            raise ClusterLostError(f"lost the Dask scheduler while computing {what} ({exc}); "
                                   "resume with `dkha fit ... --resume`") from None

    def put(self, array: np.ndarray, everywhere: bool = False):
        """A future holding ``array`` that the cluster can rebuild if the worker holding it dies.

        (Scattered data cannot be recomputed; a task that returns the array can.)

        ``everywhere``: copied to every worker before it is used, for the input of a whole tile
        pass. Dask sends a task only to the workers that hold one of its inputs, so the tiles of
        a pass whose inputs sit on one worker all queue there until work stealing moves some
        (measured: the other of 2 workers idle for 0.8 s of a 0.9 s ``K'V`` pass); with a copy
        on every worker, each tile goes to the least busy one.
        """
        future = self.client.submit(identity, array, pure=False)
        if everywhere and len(self.client.scheduler_info().get("workers", {})) > 1:
            try:
                self.client.replicate([future])
            except Exception as exc:  # noqa: BLE001 - placement only: the pass runs without it
                log.debug("could not copy a pass's input to every worker: %s", exc)
        return future

    @property
    def tasks_in_flight(self) -> int:
        """Tasks of a blockwise pass submitted at once (``dkha.tasks-in-flight``; default four
        per worker thread): enough to keep every thread busy, and the bound on the results a
        pass holds at a time."""
        n = config.get("tasks-in-flight")
        return max(1, int(n) if n is not None else 4 * total_threads(self.client))

    def wait(self, future, what: str):
        """The result of one task, checking the stop request while waiting
        (:func:`dkha.engine.stop.check_stop`: :class:`~dkha.errors.Interrupted` within a
        second of it)."""
        self.settle(future, what)
        return self.gather([future], what=what)[0]

    def ordered_results(self, submit, n: int, what: str, *, kind: str = "tiles",
                        progress: str | None = None, transient: bool = True) -> Iterator:
        """The results of ``submit(0) … submit(n − 1)`` (each returns a future), in that order,
        with at most :attr:`tasks_in_flight` submitted at once and the stop request checked
        between tasks: a pass's memory is bounded by the tasks in flight, and a stop ends it
        within a task's time (the tasks in flight are cancelled). ``progress``: the label of its
        progress bar (``what`` when not given); ``kind``: the pass's kind in its record
        (``mk``, ``product``, ``residual``)."""
        record = self._pass_record(what, kind, n)
        with self._tiles_progress(progress or what, n, transient=transient) as bar:
            for future in self._windowed(submit, n, what, record):
                t0 = time.perf_counter()
                result = self.wait(future, what)
                record["wait_seconds"] += time.perf_counter() - t0
                record["bytes_received"] += _nbytes(result)
                yield result
                bar.update()

    def reduced_pass(self, submit, routes: list, width: int | None, what: str, *,
                     kind: str, progress: str | None = None, transient: bool = True
                     ) -> np.ndarray:
        """The band sums of a tile pass, added on the workers: ``out[band] = Σ pieces`` over the
        pieces routed to each band, in the pass's order.

        ``submit(k)`` returns the future of task ``k``'s result and ``routes[k]`` lists its
        pieces as ``(band, item)``: item ``item`` of the result (``None``: the result) is added
        to the rows of tile group ``band`` (:attr:`tile_groups`) of the ``l × width`` output
        (``width`` None: a vector of ``l``). Tasks are submitted as in
        :meth:`ordered_results` (at most :attr:`tasks_in_flight` at once, the stop request
        checked between tasks). As its pieces are submitted, each band's are summed by a chain of
        :func:`~dkha.engine.tasks.accumulate` tasks, each adding the next
        ``fan_in`` pieces to the band's partial sum in order: the same additions in the same
        order as adding every piece on the coordinator, so the same bits whatever the cluster
        did, and the coordinator receives each band once (``l × width`` numbers a pass instead of
        one piece per tile). ``fan_in`` bounds what waits on the workers: a band's group holds
        the results of up to ``fan_in`` rows of tiles, so it is the most that keep
        :data:`REDUCE_HOLD_BYTES` of results (a row of tiles' results is ``2 · l · width``
        numbers); the pass's record gives it and the number of add tasks.
        """
        l = self.n_samples
        bands = [self._bounds(g) for g in self.tile_groups]
        left = collections.Counter(band for route in routes for band, _ in route)
        fan_in = max(1, REDUCE_HOLD_BYTES // (2 * l * (width or 1) * 8))
        record = self._pass_record(what, kind, len(routes), fan_in=fan_in, reduce_tasks=0)
        groups: dict = collections.defaultdict(list)
        partial: dict = {}
        finals: collections.deque = collections.deque()
        out = np.zeros(l if width is None else (l, width))

        def submit_and_route(k):
            future = submit(k)
            for band, item in routes[k]:
                groups[band].append([future, item])
                left[band] -= 1
                if len(groups[band]) >= fan_in or left[band] == 0:
                    partial[band] = self.client.submit(accumulate, partial.get(band),
                                                       *groups.pop(band), pure=False)
                    record["reduce_tasks"] += 1
                    if left[band] == 0:
                        finals.append((band, partial.pop(band)))
            return future

        def take(band, future):
            t0 = time.perf_counter()
            part = self.wait(future, what)
            record["wait_seconds"] += time.perf_counter() - t0
            record["bytes_received"] += _nbytes(part)
            a, b = bands[band]
            out[a:b] = part

        start = time.perf_counter()
        try:
            with self._tiles_progress(progress or what, len(routes), transient=transient) as bar:
                for future in self._windowed(submit_and_route, len(routes), what, record):
                    t0 = time.perf_counter()
                    self.settle(future, what)
                    record["wait_seconds"] += time.perf_counter() - t0
                    bar.update()
                    while finals and finals[0][1].done():
                        take(*finals.popleft())
            while finals:
                take(*finals.popleft())
        finally:
            for f in [*partial.values(), *(f for _, f in finals)]:
                f.cancel()
            record["wall_seconds"] = time.perf_counter() - start     # the last bands included
            record["busy_seconds"] = max(0.0, record["wall_seconds"] - record["wait_seconds"])
        return out

    def settle(self, future, what: str) -> None:
        """Wait for a task without fetching its result (:meth:`wait`'s stop checks; its error,
        if it failed, raised as :meth:`gather` raises it)."""
        while True:
            check_stop(what)
            try:
                wait_for(future, timeout=_STOP_POLL_SECONDS)
                break
            except TimeoutError:
                continue
        if future.status != "finished":
            self.gather([future], what=what)

    def _pass_record(self, what: str, kind: str, n: int, **extra) -> dict:
        return {"what": what, "kind": kind, "tasks": n, "wall_seconds": 0.0,
                "wait_seconds": 0.0, "bytes_received": 0, **extra}

    def _windowed(self, submit, n: int, what: str, record: dict) -> Iterator:
        """The futures of ``submit(0) … submit(n − 1)`` in order, at most
        :attr:`tasks_in_flight` submitted at once, each yielded for the caller to wait on (and to
        add its waiting to the record). The record of the pass gets its wall and busy seconds and
        joins ``stats.passes``; the tasks still in flight when it ends early are cancelled."""
        window = self.tasks_in_flight
        log.info("%s: %d tasks, at most %d at a time", what, n, window)
        pending: collections.deque = collections.deque()
        nxt = 0
        start = time.perf_counter()
        try:
            while nxt < n or pending:
                while nxt < n and len(pending) < window:
                    pending.append(submit(nxt))
                    nxt += 1
                yield pending.popleft()
        finally:
            for f in pending:
                f.cancel()
            record["wall_seconds"] = time.perf_counter() - start
            record["busy_seconds"] = max(0.0, record["wall_seconds"] - record["wait_seconds"])
            self.stats.passes.append(record)

    def _need_mk(self):
        if self.mk is None:
            self.compute_mk()
        return self._mk_future

    # -- centered row blocks --
    def submit_rows(self, index: np.ndarray, priority: int = 0):
        """Futures of ``K'[index, J]`` for each column group ``J`` (in column order)."""
        mk = self._need_mk()
        path = self.store.path
        if self.cache_rows:
            return [self._submit_cached_rows(np.asarray(index), mk, priority)]
        XP = self.client.submit(take_rows, path, self.all_ranges, index, priority=priority, pure=False)
        return [self.client.submit(centered_rows, path, self.kernel, XP, mk, self.mkm, index, cols,
                                   priority=priority, pure=False)
                for cols in self.column_groups]

    def _submit_cached_rows(self, index: np.ndarray, mk, priority: int):
        """``K'[index, :]`` assembled from the cached tiles: one take per tile the block meets."""
        bounds = [self._bounds(g) for g in self.tile_groups]
        starts = np.array([a for a, _ in bounds])
        group = np.searchsorted(starts, index, side="right") - 1
        pieces, places = [], []
        for (i, j), tile in self._tile_futures().items():
            in_i = np.flatnonzero(group == i)
            in_j = np.flatnonzero(group == j) if i != j else None
            if not len(in_i) and (in_j is None or not len(in_j)):
                continue
            pieces.append(self.client.submit(tile_take, tile, index[in_i] - bounds[i][0],
                                             None if in_j is None else index[in_j] - bounds[j][0],
                                             priority=priority, pure=False))
            if len(in_i):
                places.append((in_i, *bounds[j]))
            if in_j is not None and len(in_j):
                places.append((in_j, *bounds[i]))
        return self.client.submit(assemble_rows, pieces, places, index, mk, self.mkm,
                                  priority=priority, pure=False)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """``K'[index, :]`` (blocking)."""
        return np.concatenate(self.client.gather(self.submit_rows(np.asarray(index))), axis=1)

    def stream(self, blocks: Iterable[tuple[object, np.ndarray]], solver=None
               ) -> Iterator[tuple[object, np.ndarray, object]]:
        """``(tag, index, K'[index, :])`` for each ``(tag, index)``, in order, ``prefetch`` ahead.

        A bounded FIFO of futures, refilled before blocking on the oldest, with priorities in
        schedule order; the seconds spent blocking are added to ``stats.wait_seconds``.

        With ``solver`` (a :class:`~dkha.solvers.batch.BatchKHA` that has started) and
        ``projections="workers"``, a factored solver gets a :class:`ProjectedBlock` instead of
        the kernel rows (pass it to ``solver.apply_block`` as is); the solver is attached to the
        replicas for the stream's lifetime, and its ``C̃`` is brought home when the stream ends.
        """
        if solver is not None:
            state = solver.state
            if self.projections == "workers" and isinstance(state, FactoredState):
                return self._stream_projections(blocks, solver)
            if isinstance(state, FactoredState) and state.c_stale:
                # e.g. resumed from a state saved mid-pass with C̃ on the replicas: C̃ = S̃_A K'
                state.set_c_tilde(self.matmat(state.S_tilde[:solver.r].T).T)
        return self._stream_rows(blocks)

    def _stream_rows(self, blocks):
        queue: collections.deque = collections.deque()
        it = iter(blocks)
        seq = 0
        try:
            while True:
                for tag, idx in _next_blocks(it, self.prefetch - len(queue)):
                    queue.append((tag, idx, self.submit_rows(idx, priority=-seq)))
                    seq += 1
                if not queue:
                    return
                tag, idx, futs = queue.popleft()
                t0 = time.perf_counter()
                what = f"the block of rows {tag!r} (first sample {idx[0]})"
                parts = [self.wait(f, what) for f in futs]
                self.stats.wait_seconds += time.perf_counter() - t0
                block = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
                self.stats.blocks += 1
                self.stats.rows += len(idx)
                self.stats.bytes_received += block.nbytes
                yield tag, idx, block
        finally:
            for _, _, futs in queue:
                for f in futs:
                    f.cancel()

    def _stream_projections(self, blocks, solver):
        """The block stream with the projections on the workers (coordinator-math.md §4)."""
        replicas = WorkerReplicas(self, solver.state)
        queue: collections.deque = collections.deque()    # [tag, index, seq, pending]
        it = iter(blocks)
        seq = 0
        solver.attach_replicas(replicas)
        try:
            replicas.build()
            while True:
                replicas.flush()
                replicas.rebalance()
                if queue and queue[0][3].epoch != replicas.epoch:     # rebuilt: resubmit all
                    ahead = []
                    for entry in queue:
                        entry[3].cancel()
                        entry[3] = replicas.resubmit(entry[3], list(ahead))
                        ahead.append((entry[1], entry[2]))
                for tag, idx in _next_blocks(it, self.prefetch - len(queue)):
                    ahead = [(e[1], e[2]) for e in queue]
                    queue.append([tag, idx, seq, replicas.submit(seq, idx, ahead)])
                    seq += 1
                if not queue:
                    return
                replicas.keep_from = min(e[3].version for e in queue)
                replicas.trim()
                tag, idx, _, pending = queue[0]
                t0 = time.perf_counter()
                try:
                    block = replicas.wait_block(
                        pending, what=f"the block of rows {tag!r} (first sample {idx[0]})")
                except ReplicaLostError as exc:
                    replicas.recover(exc)
                    continue
                finally:
                    self.stats.wait_seconds += time.perf_counter() - t0
                queue.popleft()
                self.stats.blocks += 1
                self.stats.rows += len(idx)
                yield tag, idx, block
        finally:
            for entry in queue:
                entry[3].cancel()
            try:
                state = solver.state
                if state is replicas.state and state.c_stale:
                    state.set_c_tilde(replicas.synchronise())
            except Exception as exc:  # noqa: BLE001 - ending anyway; C stays marked stale
                log.warning("could not bring C̃ home from the worker replicas: %s", exc)
            finally:
                solver.detach_replicas()
                replicas.close()

    # -- blockwise products for evaluation (symmetric tiles I ≤ J) --
    def _pairs(self):
        g = self.tile_groups
        return [(i, j) for i in range(len(g)) for j in range(i, len(g))]

    def _bounds(self, group):
        return group[0][0], group[-1][1]

    def matmat(self, V: np.ndarray, *, exact: bool = False) -> np.ndarray:
        """``K' @ V`` for an ``l × k`` matrix: one blockwise pass over the tiles ``I ≤ J``
        (``exact``: float64 tiles whatever the engine's precision, for E_min)."""
        V = np.ascontiguousarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat(V[:, None], exact=exact)[:, 0]
        mk = self._need_mk()
        Vf = self.put(V, everywhere=True)
        g = self.tile_groups
        pairs = self._pairs()
        kernel = self.exact_kernel if exact else self.kernel
        # K'[I, J] V[J] to band i, K'[J, I] V[I] (off the diagonal) to band j
        return self.reduced_pass(
            lambda k: self.client.submit(product_pair, self.store.path, kernel, mk, self.mkm,
                                         g[pairs[k][0]], g[pairs[k][1]], Vf,
                                         tile=self._tile(*pairs[k]), pure=False),
            [[(i, 0)] + ([(j, 1)] if i != j else []) for i, j in pairs], V.shape[1],
            "a K' V product pass", kind="product", progress="product K' V")

    def residual(self, C: np.ndarray) -> tuple[float, float]:
        """``(‖K'‖²_F, ‖K' − CᵀC‖²_F)`` in one blockwise pass (direct form, no cancellation)."""
        frob2, (res2,) = self.residuals([C])
        return frob2, res2

    def residuals(self, Cs: list[np.ndarray]) -> tuple[float, list[float]]:
        """``‖K'‖²_F`` and ``‖K' − CᵀC‖²_F`` for each ``C`` of ``Cs``, all in one blockwise pass."""
        Cs = tuple(np.ascontiguousarray(C, dtype=np.float64) for C in Cs)
        mk = self._need_mk()
        Cf = self.put(Cs, everywhere=True)
        g = self.tile_groups
        pairs = self._pairs()
        tot = np.zeros(1 + len(Cs))
        for part in self.ordered_results(
                lambda k: self.client.submit(residual_pair, self.store.path, self.exact_kernel, mk,
                                             self.mkm, g[pairs[k][0]], g[pairs[k][1]], Cf,
                                             tile=self._tile(*pairs[k]), pure=False),
                len(pairs), "the residual pass of an evaluation", kind="residual",
                progress="evaluation (residuals)"):
            tot += part
        return float(tot[0]), [float(v) for v in tot[1:]]

    def dense(self) -> np.ndarray:
        """``K'`` whole: only for small stores (dense E_min, tests)."""
        mk = self._need_mk()
        g = self.tile_groups
        pairs = self._pairs()
        futs = [self.client.submit(dense_pair, self.store.path, self.exact_kernel, mk, self.mkm,
                                   g[i], g[j], tile=self._tile(i, j), pure=False) for i, j in pairs]
        out = np.empty((self.n_samples, self.n_samples))
        with self._tiles_progress("K' (dense)", len(futs)) as bar:
            for (i, j), fut in zip(pairs, futs):
                K = fut.result()
                a, b = self._bounds(g[i])
                c, d = self._bounds(g[j])
                out[a:b, c:d] = K
                out[c:d, a:b] = K.T
                bar.update()
        return out

    def transform(self, Xnew: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        mk = self._need_mk()
        return self.client.submit(project_rows, self.store.path, self.kernel, Xnew, mk, self.mkm,
                                  self.column_groups, alpha, pure=False).result()


def _next_blocks(it, room: int) -> list:
    """Up to ``room`` more ``(tag, index)`` of a block stream's schedule (fewer at its end)."""
    return [(tag, np.asarray(idx)) for tag, idx in itertools.islice(it, max(0, room))]


def _nbytes(result) -> int:
    """Bytes of the arrays in a task's result (an array, or a tuple of arrays and ``None``)."""
    if isinstance(result, np.ndarray):
        return result.nbytes
    if isinstance(result, (tuple, list)):
        return sum(_nbytes(x) for x in result)
    return 8
