"""The row engine's plan from the hardware: block rows and prefetch of the batch stream, tile side
and tasks of the blockwise passes, from what the cluster's workers report.

Two memories bound a fit. The coordinator holds the blocks of centered kernel rows it streams
(``b × l``, ``prefetch`` computed ahead and one more being applied, with its copy joined from the
column groups, or the block before it while that block's ``C̃`` update finishes beside it); the
workers hold the tiles of the MK row and product passes while they compute them. So:

* the **stream's budget** is ``dkha.memory-budget`` where set, else :data:`STREAM_BYTES`
  (512 MiB: with the fit's own state and the process beside them, the default fit of
  200 000 × 16 samples stays within 1.5 GiB of all processes; 1 GiB of blocks took it to
  2.3 GiB), lowered to a quarter of the workers' memory limits where they report less, and
  ``(prefetch + 2) · b · l · 8 ≤ budget`` — ``b`` at most ``dkha.block-rows`` (256) and at least
  :data:`MIN_BLOCK_ROWS`, ``prefetch`` at most ``dkha.prefetch`` (4), lowered only when ``b`` is
  at its least. The block rows decide the steps' grouping, so they follow the configured budget
  alone (never the cluster): a run resumes with the same blocks, bit for bit, on any cluster;
* the **workers' budget** is ``dkha.memory-budget`` where set (lowered as above), else a quarter
  of the memory limits the workers report, at least :data:`FLOOR_BYTES` (the floor for small
  machines and for clusters that report none).

The tiles ``I ≤ J`` of the blockwise passes are the fit's arithmetic: a band of ``K' V`` is the sum
of its tiles' products in the pass's order, the MK row the sum of their column sums, so the grid
is a :class:`Layout` — planned for :data:`LAYOUT_THREADS` threads and :data:`FLOOR_BYTES`
whatever the cluster (``dkha.memory-budget`` where set), recorded in the run's checkpoints and
reused by a resume — and the cluster only decides how many tiles a task computes
(``tiles_per_task``: about ``dkha.tiles-per-thread`` tasks a thread), so a fit ends with the same
bits on any number of workers, threads or memory (issue 43). Where the workers' memory cannot
hold a thread's tile of the layout (a quarter of a worker's memory limit over its threads), the
grid is planned again for the cluster and the plan says so (``layout_reason``). The grid's rule,
for the layout's threads (a task takes several tiles where a thread would get more than
``dkha.tiles-per-thread`` of them, at most the entries of a tile of ``dkha.tile-rows``): the pass's
last wave is what
leaves threads idle (at l = 50 000, 91 tiles of 4 096 rows for 16 workers kept them busy 55 % of the
pass), so there are enough tiles for ``dkha.tiles-per-thread`` (16) per thread, counting the ``n``
diagonal tiles (computed once, half the work) as halves: ``n² / 2 ≥ 16 · threads`` bands (the idle
time of the last wave is then about half a tile per thread, 3 % of the pass; each task also costs
the coordinator and the scheduler a few milliseconds, so fewer per thread can be faster where the
tiles are short). No more than that where the tiles can be larger: the side is at most
``dkha.tile-rows`` (16 384: a task of about 2.7·10⁸ kernel entries, one to three seconds of one
thread, so a stop or a slow worker costs seconds), and at most what the workers' budget gives each
thread: a fused tile task holds its two row ranges and their prepared copies (``4 · t · n · 8``
bytes) and one panel of the tile (``≥ 64`` rows, :mod:`dkha.tiles`), never the tile itself.

With worker projections the prefetch is the fit's arithmetic too (a block is projected on the
``S̃`` of its submission, ``prefetch`` blocks ahead), so it is recorded in the :class:`Layout` and
a resume reuses it where it fits the stream's budget (where it does not, the plan lowers it and
says so). A block size or prefetch given as an argument is used as given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from dask.utils import parse_bytes

from dkha.config import Settings
from dkha.errors import ParameterError

#: the fewest rows of a block the budget may choose (a block is one task per column group; below
#: this the tasks' overhead outweighs their kernels)
MIN_BLOCK_ROWS = 16
#: the fewest rows a side of a tile of the blockwise passes (below, a task's scheduling costs
#: more than its kernels)
MIN_TILE_ROWS = 64
#: the budget where ``dkha.memory-budget`` is not set and the workers report no more: the tiles'
#: (their layout, the workers' floor) and the Nyström start's (its landmark rows fill half)
FLOOR_BYTES = 2**30
#: the stream's budget where ``dkha.memory-budget`` is not set: the blocks in flight (module
#: docstring). Below :data:`FLOOR_BYTES`, which the tiles keep (their layout is the bits of the
#: blockwise passes); the blocks' rows follow it from l = 43 691 (256 rows, 4 ahead, fill it)
STREAM_BYTES = 2**29
#: the worker threads the tile grid (:class:`Layout`) is planned for, whatever the cluster: the
#: passes' tasks take several tiles on fewer threads (``tiles_per_task``), one on more
LAYOUT_THREADS = 16
#: the least rows a panel of a fused tile holds (:func:`dkha.tiles.cpu.panel_rows`)
PANEL_ROWS = 64


@dataclass(frozen=True)
class WorkerSpec:
    """One Dask worker as the scheduler reports it."""

    threads: int
    memory: int | None        # bytes (its memory limit), None where it reports none
    kind: str = "cpu"         # "gpu" for a worker declaring a GPU resource


def _size(n: float) -> str:
    gib = n / 2**30
    return (f"{gib:.0f} GiB" if gib >= 10 else f"{gib:.3g} GiB" if gib >= 1 else
            f"{n / 2**20:.0f} MiB")


def _count(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def workers_of(client) -> dict:
    """The workers of ``client``'s scheduler, asked afresh: what every reader of the cluster's
    worker set uses (threads, GPUs, memory, the band passes' workers, the watcher). (Not
    ``Client.scheduler_info()``: it fetches into the client's cached identity and returns that,
    which the client's periodic update (every 2 s) replaces with one that lists no worker; read
    after it, a fit's cluster seemed to have lost its only worker ("worker inproc://… (0) lost:
    no worker is left" in a fit that went on), or to have none: 1 thread, "0 worker
    processes".)"""
    if getattr(client, "scheduler", None) is not None and not client.asynchronous:
        return dict(client.sync(client.scheduler.identity, n_workers=-1).get("workers", {}))
    return dict(client.scheduler_info().get("workers", {}))


@dataclass(frozen=True)
class Hardware:
    """What the cluster's workers have: their threads, memory limits and kind."""

    workers: tuple[WorkerSpec, ...] = ()

    @classmethod
    def of(cls, client) -> Hardware:
        """The workers of ``client``'s scheduler, asked afresh (none where it cannot be asked)."""
        if client is None:
            return cls()
        try:
            workers = workers_of(client).values()
        except Exception:  # noqa: BLE001 - no scheduler information: nothing reported
            return cls()
        specs = []
        for w in workers:
            gpus = float((w.get("resources") or {}).get("GPU", 0) or 0)
            memory = int(w.get("memory_limit") or 0) or None
            specs.append(WorkerSpec(max(1, int(w.get("nthreads", 1) or 1)), memory,
                                    "gpu" if gpus > 0 else "cpu"))
        return cls(tuple(specs))

    @classmethod
    def described(cls, workers: int, threads: int, memory: int | None) -> Hardware:
        """``workers`` CPU workers sharing ``threads`` threads and ``memory`` bytes evenly."""
        each = None if memory is None else memory // workers
        return cls(tuple(WorkerSpec(max(1, threads // workers), each) for _ in range(workers)))

    @property
    def threads(self) -> int:
        return max(1, sum(w.threads for w in self.workers))

    @property
    def memory(self) -> int | None:
        """The workers' memory limits summed (None unless every worker reports one)."""
        if not self.workers or any(w.memory is None for w in self.workers):
            return None
        return sum(w.memory for w in self.workers)

    def describe(self) -> str:
        n = len(self.workers)
        if not n:
            return f"{self.threads} thread (no workers reported)"
        memory = self.memory
        held = f"({_size(memory)})" if memory else "(memory not reported)"
        cpus = [w for w in self.workers if w.kind == "cpu"]
        gpus = n - len(cpus)
        parts = []
        if gpus:
            parts.append(f"{gpus} GPU worker{'s' if gpus != 1 else ''}")
        if cpus:
            threads = sum(w.threads for w in cpus)
            parts.append(f"{threads} CPU thread{'s' if threads != 1 else ''} in {len(cpus)} "
                         f"worker{'s' if len(cpus) != 1 else ''}")
        return f"{', '.join(parts)} {held}"


@dataclass(frozen=True)
class Layout:
    """What a fit's bits are a function of beyond its data and settings: the tile grid of the
    blockwise passes (``bands`` row ranges), the column groups of the row blocks, the BLAS
    threads of the coordinator's and the tasks' arithmetic and the blocks computed ahead (worker
    projections project a block on the ``S̃`` of its submission; None: an older run's, not
    recorded). Made once at the start of a fit
    (:func:`memory_plan`), recorded in its checkpoints (:meth:`as_dict`) and reused by a resume
    on any cluster."""

    bands: int
    column_groups: int
    blas_threads: int = 1
    prefetch: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Layout | None:
        """The layout a checkpoint records (None: none recorded, an older dkha's run)."""
        if not d:
            return None
        ahead = d.get("prefetch")
        return cls(int(d["bands"]), int(d["column_groups"]), int(d.get("blas_threads", 1)),
                   None if ahead is None else int(ahead))


def layout_column_groups(prefetch: int) -> int:
    """The column groups of the row blocks where ``dkha.column-groups`` is not set: enough for
    :data:`LAYOUT_THREADS` threads with ``prefetch`` blocks in flight (``prefetch × groups ≥
    threads``), whatever the cluster. Worker projections add a block's pieces group by group
    and float32 tiles shift by their column block's mean, so the groups are the fit's
    arithmetic: before, they were the cluster's threads, and a fit of those kinds changed its
    bits with the machine (issue 43)."""
    return -(-LAYOUT_THREADS // max(1, int(prefetch)))


@dataclass(frozen=True)
class MemoryPlan:
    """What a row engine holds and runs at once, from the hardware (module docstring): printed
    among a fit's first lines (:meth:`describe`) and recorded in its ``timings.json`` as
    ``memory`` (:meth:`as_dict`)."""

    budget: int          # bytes: the stream's budget (blocks in flight)
    block_rows: int
    prefetch: int
    tile_rows: int
    reason: str          # what decided the stream's budget
    worker_budget: int = FLOOR_BYTES    # bytes: what the tiles may hold on the workers
    worker_reason: str = ""
    bands: int = 1                      # row ranges of the tiles: bands (bands + 1) / 2 tiles I ≤ J
    tiles_per_task: int = 1
    device: str = "cpu"                 # where the workers compute the tiles
    hardware: Hardware = field(default_factory=Hardware)
    #: how the tile grid was made: planned for LAYOUT_THREADS, recorded by the run, or planned
    #: again for a cluster whose memory does not hold the layout's tiles
    layout_reason: str = "planned"

    @property
    def tiles(self) -> int:
        """Tiles ``I ≤ J`` of a blockwise pass."""
        return self.bands * (self.bands + 1) // 2

    @property
    def tasks(self) -> int:
        """Tasks of a blockwise pass (besides the band sums' additions)."""
        return -(-self.tiles // max(1, self.tiles_per_task))

    def with_tiles(self, groups) -> MemoryPlan:
        """The plan with the tile groups (of row ranges) the engine made, e.g. the row cache's."""
        side = max(g[-1][1] - g[0][0] for g in groups)
        return replace(self, bands=len(groups), tile_rows=int(side), tiles_per_task=1)

    def describe(self) -> str:
        """One line: ``plan: 16 CPU threads in 1 worker (128 GiB), 1 953 tiles of 16 384 rows in
        1 953 tasks, blocks of 256 rows, 4 ahead (1 GiB), tiles within 32 GiB (…)``."""
        return (f"plan: {self.hardware.describe()}, {_count(self.tiles)} tiles of "
                f"{_count(self.tile_rows)} rows ({self.layout_reason}) in "
                f"{_count(self.tasks)} tasks, blocks of "
                f"{self.block_rows} rows, {self.prefetch} ahead ({_size(self.budget)}: "
                f"{self.reason}), tiles within {_size(self.worker_budget)} "
                f"({self.worker_reason})")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["hardware"] = {"threads": self.hardware.threads, "memory": self.hardware.memory,
                         "workers": [asdict(w) for w in self.hardware.workers]}
        d["tiles"], d["tasks"] = self.tiles, self.tasks
        return d


def user_budget(settings: Settings) -> int | None:
    """``dkha.memory-budget`` in bytes (a number or a string such as ``"1GiB"``); None where it
    is not set."""
    value = settings.memory_budget
    if value is None:
        return None
    try:
        budget = int(parse_bytes(value) if isinstance(value, str) else value)
    except (TypeError, ValueError):
        budget = 0
    if budget <= 0:
        raise ParameterError("dkha.memory-budget must be a positive size such as 1GiB, "
                             f"got {value!r}")
    return budget


def configured_budget(settings: Settings) -> int:
    """The budget of what the coordinator holds: ``dkha.memory-budget``, or :data:`FLOOR_BYTES`
    where it is not set."""
    budget = user_budget(settings)
    return FLOOR_BYTES if budget is None else budget


def stream_budget(settings: Settings) -> int:
    """The budget of the blocks in flight: ``dkha.memory-budget``, or :data:`STREAM_BYTES`
    where it is not set."""
    budget = user_budget(settings)
    return STREAM_BYTES if budget is None else budget


def block_rows_for(n_samples: int, settings: Settings, block_rows: int | None = None) -> int:
    """Rows per block of the batch stream: ``block_rows`` when given, else the most (up to
    ``dkha.block-rows``) whose blocks in flight fit the stream's configured budget (module
    docstring, :func:`stream_budget`)."""
    if block_rows is not None:
        return int(block_rows)
    cap = int(settings.block_rows)
    prefetch = max(1, int(settings.prefetch))
    fit = stream_budget(settings) // ((prefetch + 2) * 8 * max(1, n_samples))
    return int(max(min(cap, MIN_BLOCK_ROWS), min(cap, fit)))


def tile_bands(n_samples: int, threads: int, n_features: int, budget: int, settings: Settings
               ) -> int:
    """Bands of rows for the tiles ``I ≤ J`` of the blockwise passes (module docstring): at least
    enough for ``dkha.tiles-per-thread`` tiles a thread (``n² / 2``, the diagonal's halves), a side
    at most ``dkha.tile-rows`` and what ``budget`` gives each thread, at least
    :data:`MIN_TILE_ROWS` rows a side."""
    l, threads = max(1, n_samples), max(1, threads)
    per_thread = max(1, int(settings.tiles_per_thread))
    n = 1
    while n * n < 2 * per_thread * threads:
        n += 1
    per_row = 8 * (4 * max(1, n_features) + PANEL_ROWS)
    side = min(int(settings.tile_rows), budget // (threads * per_row))
    n = max(n, -(-l // max(1, side)))
    return max(1, min(n, l // MIN_TILE_ROWS))


def tile_task_bytes(n_samples: int, bands: int, n_features: int) -> int:
    """Bytes a fused tile task of the grid of ``bands`` holds (module docstring)."""
    return -(-max(1, n_samples) // max(1, bands)) * 8 * (4 * max(1, n_features) + PANEL_ROWS)


def layout_bands(n_samples: int, n_features: int, settings: Settings, hardware: Hardware,
                 recorded: Layout | None = None) -> tuple[int, str]:
    """``(bands, how)``: the tile grid of a fit, the same on any cluster (module docstring):
    ``recorded`` (a resume's), else planned for :data:`LAYOUT_THREADS` threads within
    ``dkha.memory-budget`` or :data:`FLOOR_BYTES`; planned again for ``hardware`` where a
    worker's quarter of its memory limit cannot hold a tile task per thread."""
    if recorded is not None:
        bands, how = recorded.bands, "the run's recorded layout"
    else:
        budget = user_budget(settings) or FLOOR_BYTES
        bands = tile_bands(n_samples, LAYOUT_THREADS, n_features, budget, settings)
        how = f"layout for {LAYOUT_THREADS} threads"
    need = tile_task_bytes(n_samples, bands, n_features)
    short = [w for w in hardware.workers if w.memory and w.memory // 4 < need * w.threads]
    if short and user_budget(settings) is None:
        w = short[0]
        bands = max(bands, tile_bands(n_samples, hardware.threads, n_features,
                                      max(1, hardware.memory or 0) // 4, settings))
        how = (f"planned again: a worker of {w.threads} threads and {_size(w.memory)} cannot "
               f"hold {w.threads} tiles of the layout ({_size(need)} each); the bits differ "
               "from the layout's")
    return bands, how


def memory_plan(n_samples: int, settings: Settings, client=None, *, threads: int | None = None,
                n_features: int = 1, block_rows: int | None = None,
                prefetch: int | None = None, hardware: Hardware | None = None,
                layout: Layout | None = None) -> MemoryPlan:
    """The plan for a row engine over ``n_samples`` samples of ``n_features`` on the workers of
    ``client`` (or the described ``hardware``; ``threads``: where given, instead of theirs);
    ``layout``: the tile grid a resumed run recorded (:func:`layout_bands`)."""
    hardware = Hardware.of(client) if hardware is None else hardware
    threads = hardware.threads if threads is None else max(1, int(threads))
    asked = user_budget(settings)
    quarter = None if hardware.memory is None else hardware.memory // 4
    budget = stream_budget(settings)
    reason = "dkha.memory-budget" if asked is not None else "the stream's default"
    if quarter is not None and quarter < budget:
        budget, reason = quarter, "a quarter of the workers' memory"
    if asked is not None:
        worker_budget, worker_reason = budget, reason
    elif quarter is not None and quarter > FLOOR_BYTES:
        worker_budget, worker_reason = quarter, "a quarter of the workers' memory"
    else:
        worker_budget, worker_reason = FLOOR_BYTES, ("the floor: the workers report no memory"
                                                     if quarter is None else "the floor")
    b = block_rows_for(n_samples, settings, block_rows)
    block_bytes = 8 * b * max(1, n_samples)
    bands, how = layout_bands(n_samples, n_features, settings, hardware, layout)
    fits = max(1, budget // block_bytes - 2)
    if prefetch is not None:
        ahead = max(1, int(prefetch))
    elif layout is not None and layout.prefetch is not None:
        ahead = min(layout.prefetch, fits)
        if ahead < layout.prefetch:
            how += (f"; {layout.prefetch} blocks ahead, as recorded, do not fit "
                    f"{_size(budget)}: {ahead} ahead, and worker projections' bits differ from "
                    "the layout's")
    else:
        ahead = min(max(1, int(settings.prefetch)), fits)
    tiles = bands * (bands + 1) // 2
    # about dkha.tiles-per-thread tasks a thread, a task at most a tile of dkha.tile-rows
    side = -(-max(1, n_samples) // bands)
    per_task = max(1, min(tiles // (max(1, int(settings.tiles_per_thread)) * threads),
                          (int(settings.tile_rows) // side) ** 2))
    return MemoryPlan(budget=int(budget), block_rows=b, prefetch=ahead,
                      tile_rows=-(-max(1, n_samples) // bands), reason=reason,
                      worker_budget=int(worker_budget), worker_reason=worker_reason,
                      bands=bands, tiles_per_task=per_task, hardware=hardware,
                      layout_reason=how)
