"""The coordinator's row engine: centered kernel rows and the MK row, computed blockwise on Dask
workers by the tasks of :mod:`dkha.engine.tasks`.

The centered kernel (coordinator-math.md §1) is never formed whole::

    K'[P, J] = K[P, J] - mk[J] - mk[P][:, None] + mkm

:func:`center_block` is the one centering function; every path (fit, evaluation, transform)
goes through it. :class:`RowEngine` owns the data path on the cluster: workers read the data
store's chunks once and keep them in a per-process cache (:func:`load_rows`), compute the MK row
tile by tile, the centered row blocks of the schedule ahead of the coordinator (a bounded FIFO
of futures in schedule order, :mod:`dkha.engine.stream`), and the blockwise products ``K' V``
that evaluation needs (:class:`~dkha.engine.products.TilePasses`). Every task it submits is
waited for through :mod:`dkha.engine.passes` (stop checks, cluster errors translated, passes
with a bounded number of tasks in flight); the optional row cache is
:mod:`dkha.engine.tilecache`.

Where the block projections ``Y₀ = S̃ K'_Pᵀ`` of the batch solvers are computed is the engine's
``projections`` setting (``dkha.projections``):

* ``"coordinator"``: workers ship the kernel rows ``K'[P, :]`` (``b·l`` numbers a block) and the
  coordinator multiplies;
* ``"workers"`` (coordinator-math.md §4): the worker thread holding column group ``J`` keeps a
  replica of ``S̃[:, J]`` (and ``C̃[:, J]``) in a per-process registry (like the chunk cache); a
  block is one task per such thread, pinned to it, which applies the coordinator's messages since
  its last task in order (it carries them) and returns, for each group ``J`` it holds, the partial
  projections ``K'[P, J] S̃[:, J]ᵀ`` (added on the coordinator in the layout's group order) and its
  part of ``K'[P, W ∪ P]`` (columns of the kernel block
  it computed anyway) for the window ``W`` of blocks ahead in the FIFO, with which the coordinator
  brings the projections (computed on the version of ``S̃`` current when the block was submitted) up
  to date: ``(2r·groups + |W| + b)·b`` numbers a block. Replicas are versioned: a task that finds
  its replica missing or at the wrong version raises :class:`ReplicaLostError`, and so does a wait
  on a worker that left the cluster; the coordinator then rebuilds every replica exactly, from the
  ``S̃`` and ``C̃`` it kept at the last pass end (or the stream's start) and the messages since,
  replayed with the kernel blocks recomputed (:func:`~dkha.engine.tasks.replica_replay`; from its
  current state, ``C̃[:, J] = S̃_A K'[:, J]`` recomputed, where it kept none, e.g. resumed
  mid-pass), and resubmits the blocks in flight on their own versions, up to
  ``RowEngine.replica_rebuilds`` times in a row (without a block completing in between). At every
  pass end each replica of ``S̃`` is checked against the coordinator's
  (:class:`ReplicaDivergedError` if they differ) and ``C̃`` is brought home (``r·l`` numbers).
  Blocks are projected on the version current when they were submitted (replicas keep snapshots of
  ``S̃`` for the blocks in flight), so a run is reproducible bit for bit; resuming from a checkpoint
  reproduces it up to rounding only."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from collections.abc import Iterable, Iterator

import numpy as np

from dkha.config import Settings
from dkha.data.store import DataStore
from dkha.engine.bandpass import BandPlan, plan_for
from dkha.engine.budget import (
    LAYOUT_THREADS,
    Layout,
    configured_budget,
    layout_column_groups,
    memory_plan,
    workers_of,
)
from dkha.engine.cluster import share_storage_options, shares_process, total_threads
from dkha.engine.held import held
from dkha.engine.inline import InlineClient
from dkha.engine.mkrow import mk_row
from dkha.engine.passes import ClusterPasses
from dkha.engine.products import TilePasses
from dkha.engine.replicas import ProjectedBlock
from dkha.engine.stream import StreamStats, stream_projections, stream_rows
from dkha.engine.tasks import (
    StorePath,
    center_block,
    clear_cache,
    diagonal_rows,
    grouped_block_rows,
    load_rows,
    project_rows,
)
from dkha.engine.tilecache import TileCache
from dkha.errors import ParameterError
from dkha.kernels import Kernel
from dkha.solvers.factored import FactoredState

log = logging.getLogger(__name__)

PROJECTIONS = ("auto", "coordinator", "workers")


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
    if shares_process(client):
        return "coordinator", "the workers share the coordinator's process"
    address = str(getattr(getattr(client, "scheduler", None), "address", "") or "")
    n = len(workers_of(client))
    return "workers", (f"{n} worker process{'es' if n != 1 else ''} at {address}: projections "
                       "travel instead of kernel rows")


__all__ = ["PROJECTIONS", "ProjectedBlock", "RowEngine", "StreamStats", "array_engine",
           "center_block", "clear_cache", "load_rows", "project_rows"]


def task_source(store: DataStore, client, settings: Settings):
    """What the tasks read a store's rows from: its rows held in this process
    (:attr:`~dkha.data.store.DataStore.rows`) where the workers are this process (nothing to
    copy, no chunk to read back), else its path, with the size of the workers' chunk cache
    (:class:`~dkha.engine.tasks.StorePath`)."""
    if store.rows is not None and shares_process(client):
        # tasks of an in-process cluster are pickled: the rows as a key (dkha.engine.held)
        return store.rows if isinstance(client, InlineClient) else held(store.rows)
    if isinstance(store.path, str):
        return StorePath(store.path, settings.cache_bytes, configured_budget(settings) // 4)
    return store.path


def _groups_of_chunks(store: DataStore, n_groups: int, max_rows: int | None = None
                      ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Consecutive chunk ranges split into about ``n_groups`` groups (each at least one chunk,
    at most ``max_rows`` rows unless a single chunk is larger)."""
    chunks = tuple(store.chunk_bounds(i) for i in range(store.n_chunks))
    most = None if max_rows is None else max(1, max_rows // store.chunk_rows)
    return _runs(chunks, n_groups, most)


def _runs(items: tuple, n: int, most: int | None = None) -> tuple[tuple, ...]:
    """``items`` in about ``n`` runs of consecutive items (each at least one, at most ``most``
    where given)."""
    per = -(-len(items) // max(1, min(n, len(items))))
    if most is not None:
        per = max(1, min(per, most))
    return tuple(items[i:i + per] for i in range(0, len(items), per))


def _tile_ranges(l: int, bands: int) -> tuple[tuple[tuple[int, int]], ...]:
    """``bands`` equal row ranges (one a group) for the square tiles ``I ≤ J`` of the blockwise
    passes (how many: :func:`dkha.engine.budget.tile_bands`). Ranges need not follow the
    store's chunks (a worker reads and caches any row range), so a store of few large chunks
    still spreads over every worker."""
    cuts = [round(k * l / bands) for k in range(bands + 1)]
    return tuple(((a, b),) for a, b in itertools.pairwise(cuts) if b > a)


class RowEngine(TilePasses):
    """Kernel rows of one data store and kernel, on a Dask cluster.

    Parameters
    ----------
    store : DataStore
    kernel : Kernel
        With all parameters set (``sigma`` resolved).
    client : distributed.Client
    settings : dkha.config.Settings
        The ``dkha.*`` settings of the fit (:func:`dkha.config.settings`), of which:
        ``column_groups`` (None: the layout's, not the cluster's); ``projections``, where the
        block projections are computed (module docstring; ``auto``: :func:`choose_projections`,
        the choice and its reason in ``projections`` and ``projections_reason``);
        ``row_cache``, keep the kernel on the workers: the upper-triangle tiles ``K[I, J]``,
        ``I ≤ J``, are computed once (the MK row comes from their sums) and every later row
        block, product ``K' V`` and residual reads them instead of recomputing kernels (about
        ``4·l²`` bytes of worker memory, refused above half of what the workers have; row mode
        only: worker-side projections compute their own rows); ``precision``, the kernel
        tiles' (float32 runs the distance GEMM and the fused sweep in single precision,
        :mod:`dkha.tiles`; rows, products and everything the coordinator accumulates stay
        float64); ``device``, where the workers compute kernel tiles (``cuda`` with CuPy,
        ``dkha[gpu]``; ``auto`` on the workers that declare a ``GPU`` resource).
    block_rows, prefetch : int, optional
        Default: from ``dkha.memory-budget`` (at most ``dkha.block-rows``, ``dkha.prefetch``),
        the tiles from the workers' threads and memory
        (:func:`dkha.engine.budget.memory_plan`, the plan in :attr:`memory`).
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
        (:class:`dkha.progress.Progress`); :meth:`labelled` names the pass in progress (e.g.
        ``"Krylov product 3"``). Set by the estimators' ``verbose=``.
    passes : ClusterPasses
        The tasks' plumbing (:mod:`dkha.engine.passes`): waits, errors, passes, their records
        in ``stats.passes``.
    """

    replica_rebuilds = 3

    def __init__(self, store: DataStore, kernel: Kernel, client, settings: Settings, *,
                 block_rows: int | None = None, prefetch: int | None = None, models: int = 1,
                 layout: Layout | None = None):
        if isinstance(store.path, str):
            share_storage_options(client, store.path)
        self.settings = settings
        requested = str(settings.projections)
        if requested not in PROJECTIONS:
            raise ParameterError(f"unknown projections {requested!r}; choose one of "
                                 f"{', '.join(PROJECTIONS)}")
        self.store = store
        self.kernel = kernel.computed_with(str(settings.precision), str(settings.device))
        # evaluation (E(A), E_min) and the row cache stay float64 whatever the precision: E_min² =
        # ‖K'‖² − Σλ² cancels, and float32 tiles moved E_min by 1.6e-5 on the digits
        self.exact_kernel = self.kernel.computed_with(precision="float64")
        self.client = client
        threads = total_threads(client)
        self.memory = memory_plan(store.n_samples, settings, client, threads=threads,
                                  prefetch=prefetch, n_features=store.n_features,
                                  block_rows=block_rows, layout=layout)
        self.block_rows, self.prefetch = self.memory.block_rows, self.memory.prefetch
        grouped = settings.column_groups is not None
        ng = layout.column_groups if layout else settings.column_groups or layout_column_groups(
            self.prefetch)
        self.column_groups = _groups_of_chunks(store, int(ng))
        self.all_ranges = tuple(r for g in self.column_groups for r in g)
        # square tiles for the MK row and evaluation (dkha.engine.budget)
        self.tile_groups = _tile_ranges(store.n_samples, self.memory.bands)
        self.cache_rows = bool(settings.row_cache)
        self.tile_cache: TileCache | None = None
        if self.cache_rows:
            # fewer, larger tiles: a row block takes one piece from each tile it meets, so the
            # tasks per block grow with the tile count; about 4 tiles a thread keeps all busy
            self.tile_groups = _groups_of_chunks(store, int(np.ceil(np.sqrt(8 * LAYOUT_THREADS))))
            self.tile_cache = TileCache(client, self.source, self.exact_kernel,
                                        self.tile_groups)
            self.tile_cache.check_memory()
            self.memory = self.memory.with_tiles(self.tile_groups)
        # what the bits follow, recorded in the checkpoints, given back on a resume
        self.layout = Layout(len(self.tile_groups), int(ng), prefetch=self.prefetch)
        self.projections, self.projections_reason = choose_projections(
            requested, client, self.cache_rows, models)
        # the row stream's tasks, each a run of column groups, unless the groups are set: fewer
        # where the blocks in flight keep every thread busy (no join of b·l numbers: 0.9 s of 7 s
        # a pass at l = 20 000, 2 cores); float32 rows shift by their column group's mean, so
        # their tasks take the layout's groups whole, each tiled on its own
        self.row_groups = tuple((g,) for g in self.column_groups)
        if not grouped:
            tasks = -(-threads // self.prefetch)
            self.row_groups = _runs(self.column_groups, tasks) if self.kernel.precision \
                == "float32" else tuple((g,) for g in _groups_of_chunks(store, tasks))
        self.mk: np.ndarray | None = None
        self.mkm: float | None = None
        self._mk_future = None
        self._bands: BandPlan | bool | None = None
        self.stats = StreamStats()
        self.passes = ClusterPasses(client, self.stats.passes, settings.tasks_in_flight)

    @property
    def bands(self) -> BandPlan | None:
        """The plan of the band passes on GPU workers (:mod:`dkha.engine.bandpass`), or None."""
        if self._bands is None:
            self._bands = plan_for(self) or False
        return self._bands or None

    @functools.cached_property
    def source(self):   # what the tasks read the training rows from (task_source), one object
        return task_source(self.store, self.client, self.settings)

    @property
    def verbose(self) -> bool:
        return self.passes.verbose

    @verbose.setter
    def verbose(self, value) -> None:
        self.passes.verbose = value

    def labelled(self, label: str):
        """Name the passes made meanwhile (their progress shows ``label``)."""
        return self.passes.labelled(label)

    @property
    def n_samples(self) -> int:
        return self.store.n_samples

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
        ``X`` (:func:`dkha.data.centering.centering_key`), and read back instead of recomputed
        (:func:`dkha.engine.mkrow.mk_row`). ``self.centering`` describes the row in use.
        """
        mk, mkm, self.centering = mk_row(self, center_sample, seed,
                                         self.settings.mk_cache if cache is None else cache)
        self.set_mk(mk, mkm)
        return self.mk, self.mkm

    def centered_diagonal(self) -> np.ndarray:
        """``K'[p, p] = k(x_p, x_p) − 2 mk_p + mkm`` for every sample: ``‖Φ'(x_p)‖²``.

        Where ``k(x, x)`` is constant (1 for the gaussian and laplacian kernels) it needs no
        data; otherwise one task per column group reads its chunks (``O(l n)``, no kernel
        rows)."""
        self.mk_future()
        constant = self.kernel.constant_diagonal()
        if constant is not None:
            diagonal = np.full(self.n_samples, constant)
        else:
            futures = [self.client.submit(diagonal_rows, self.source, self.kernel, g,
                                          pure=False) for g in self.column_groups]
            diagonal = np.concatenate(self.passes.results(futures, "the kernel's diagonal"))
        return diagonal - 2.0 * self.mk + self.mkm

    def set_mk(self, mk: np.ndarray, mkm: float) -> None:
        self.mk = np.asarray(mk, dtype=np.float64)
        self.mkm = float(mkm)
        self._mk_future = self.passes.put(self.mk)

    def mk_future(self):
        """The future of the MK row on the cluster (computed first where there is none yet; put
        there again where Dask dropped it, e.g. scattered data lost with its worker)."""
        if self.mk is None:
            self.compute_mk()
        elif getattr(self._mk_future, "status", None) in ("cancelled", "lost"):
            log.warning("the MK row's copy on the cluster was %s: putting it there again",
                        self._mk_future.status)
            self._mk_future = self.passes.put(self.mk)
        return self._mk_future

    # -- centered row blocks --
    def submit_rows(self, index: np.ndarray, priority: int = 0):
        """Futures of ``K'[index, J]`` for each column group ``J`` (in column order): one task
        each, which takes ``X[index]`` itself (a task costs the scheduler ~4 ms, a block 40 ms)."""
        mk = self.mk_future()
        if self.cache_rows:
            return [self.tile_cache.submit_rows(np.asarray(index), mk, self.mkm, priority)]
        return [self.client.submit(grouped_block_rows, self.source, self.all_ranges, self.kernel,
                                   mk, self.mkm, index, groups, priority=priority, pure=False)
                for groups in self.row_groups]

    def rows(self, index: np.ndarray) -> np.ndarray:
        """``K'[index, :]`` (blocking)."""
        index = np.asarray(index)
        parts = self.passes.results(self.submit_rows(index), f"the rows of {len(index)} samples")
        return np.concatenate(parts, axis=1)

    def stream(self, blocks: Iterable[tuple[object, np.ndarray]], solver=None, carried=()
               ) -> Iterator[tuple[object, np.ndarray, object]]:
        """``(tag, index, K'[index, :])`` for each ``(tag, index)``, in order, ``prefetch`` ahead.

        A bounded FIFO of futures, refilled before blocking on the oldest, with priorities in
        schedule order; the seconds spent blocking are added to ``stats.wait_seconds``.

        With ``solver`` (a :class:`~dkha.solvers.batch.BatchKHA` that has started) and
        ``projections="workers"``, a factored solver gets a :class:`ProjectedBlock` instead of
        the kernel rows (pass it to ``solver.apply_block`` as is); the solver is attached to the
        replicas for the stream's lifetime, and its ``C̃`` is brought home when the stream ends.
        ``carried``: the blocks in flight a checkpoint carries, taken up by that stream
        (:class:`~dkha.engine.replicas.Carried`).
        """
        if solver is not None:
            state = solver.state
            if self.projections == "workers" and isinstance(state, FactoredState):
                return stream_projections(self, blocks, solver, carried)
            if isinstance(state, FactoredState) and state.c_stale:
                # e.g. resumed from a state saved mid-pass with C̃ on the replicas: C̃ = S̃_A K'
                state.set_c_tilde(self.matmat(state.S_tilde[:solver.r].T).T)
        return stream_rows(self, blocks)

    def transform(self, Xnew: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """The projections ``K'(Xnew, X) α`` of new samples (one task, on a worker)."""
        mk = self.mk_future()
        future = self.client.submit(project_rows, self.source, self.kernel, Xnew, mk, self.mkm,
                                    self.column_groups, alpha, pure=False)
        return self.passes.wait(future, f"the projection of {len(Xnew)} new samples")


def array_engine(X: np.ndarray, kernel: Kernel, client, settings: Settings) -> RowEngine:
    """A row engine over rows held in memory, with the kernel **uncentered**: its
    :meth:`~RowEngine.matmat` is ``K(X, X) V``, the same blockwise pass over the tiles ``I ≤ J``
    (on the workers, never forming ``l × l``) as the fit's ``K' V``.

    ``X`` goes to the cluster once, copied to every worker (:meth:`ClusterPasses.put`); the
    tasks take it in place of a store path (:func:`~dkha.engine.tasks.load_rows` slices an
    array), and the MK row is zero (``K' = K − 0 − 0 + 0``). For small in-memory problems of the
    coordinator (the learned pre-image's kernel of the projections), not for training data."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    l = len(X)
    engine = RowEngine(DataStore("", l, X.shape[1], max(1, l), False, {}), kernel, client,
                       dataclasses.replace(settings, row_cache=False, projections="coordinator",
                                           column_groups=1))
    engine.store = dataclasses.replace(engine.store, path=engine.passes.put(X, everywhere=True))
    engine.__dict__.pop("source", None)     # the tasks' source follows the new store
    engine.set_mk(np.zeros(l), 0.0)
    engine.centering = {"method": "none"}
    return engine
