"""The coordinator's end of the passes on GPU workers: a plan from the device, one task per band of
tiles, the bands' results chained on the device (:mod:`dkha.engine.device` is the worker's end).

On a GPU a tile of 24 576 rows is a few milliseconds of work; the CPU's tasks of one tile each
(thousands a pass, each moving its rows to the device and its products back) left the device
idle most of the time (docs/device-check.md: 22–28 s a ``K'V`` pass at l = 10⁶, a quarter of what
the GEMM and the exp allow). Here a pass over the tiles ``I ≤ J`` is one task per band of tiles
(41 at l = 10⁶), pinned round-robin to the GPU workers, each worker's bands added up on its
device in band order (:func:`~dkha.engine.device.combine`, so the same bits every time with the
same workers) and one ``l × k`` result brought home per worker.

The plan (:func:`band_plan`) comes from the device the workers report: the tile side is the
largest that fits a quarter of the device's free memory beside the resident rows, one tile
buffer per stream (``dkha.gpu-streams``), at most ``dkha.gpu-tile-rows``, and small enough that
every stream of every worker has bands to the last wave. Used where the workers compute tiles on a
GPU (``device="cuda"``, or ``"auto"`` with workers that declare a ``GPU`` resource), or wherever
``dkha.band-passes`` is true (with NumPy behind the same functions on CPU workers: the tests).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from dkha.config import Settings
from dkha.engine.budget import workers_of
from dkha.engine.cluster import gpu_workers
from dkha.engine.device import band_task, combine, device_info, to_host
from dkha.engine.tasks import release

log = logging.getLogger(__name__)

#: bands whose results one combine task adds (bounds the results waiting on the device)
FAN_IN = 4
#: the fewest rows of a band
MIN_SIDE = 64


@dataclass(frozen=True)
class BandPlan:
    """The passes' plan on the GPU workers (recorded in a run's ``timings.json`` as ``bands``)."""

    workers: tuple          # worker addresses, in the order bands are dealt to them
    device: dict            # what the first worker reports (kind, name, free and total bytes)
    side: int               # rows of a band, and of its tiles
    n_samples: int
    streams: int            # tasks that use one device at once
    reason: str

    @property
    def bands(self) -> list[tuple[int, int]]:
        return [(a, min(a + self.side, self.n_samples))
                for a in range(0, self.n_samples, self.side)]

    @property
    def tiles(self) -> int:
        b = len(self.bands)
        return b * (b + 1) // 2

    def describe(self) -> str:
        kind = "GPU" if self.device.get("kind") == "cuda" else "CPU (band passes)"
        w = len(self.workers)
        return (f"plan: {w} {kind} worker{'s' if w != 1 else ''} ({self.device.get('name')}, "
                f"{self.device.get('total', 0) / 2**30:.0f} GiB), {self.tiles} tiles of "
                f"{self.side} rows in {len(self.bands)} tasks a pass (one a band), "
                f"{self.streams} streams a device; {self.reason}"
                + (f"; products: {self.device['products']}" if "products" in self.device
                   else ""))

    def as_dict(self) -> dict:
        return dict(asdict(self), bands=len(self.bands), tiles=self.tiles,
                    workers=list(self.workers))


def wants_bands(kernel, client, mode) -> list[str] | None:
    """The workers a pass's bands go to, or None for the tile passes of the CPU: the GPU workers
    where the kernel's device is ``cuda`` (every worker where none declares one) or ``auto``
    (None where none declares one); every worker where ``mode`` (``dkha.band-passes``) is true."""
    if mode is False or not kernel.compiled:      # a NumPy block: the CPU's tile passes
        return None
    gpus = gpu_workers(client)
    everyone = sorted(workers_of(client))
    if mode is True:
        return gpus if gpus and kernel.device != "cpu" else everyone
    if kernel.device == "cuda":
        return gpus or everyone
    if kernel.device == "auto":
        return gpus or None
    return None


def band_side(n_samples: int, n_features: int, itemsize: int, free: int, *, streams: int,
              workers: int, cap: int) -> tuple[int, str]:
    """The rows of a band (and side of its tiles), and what decided it: the largest side whose
    tile (``itemsize`` bytes a value) and a float64 temporary, one of each per stream, fit a
    quarter of the ``free`` device memory left beside the resident rows, at most ``cap``, and
    small enough that every stream of every worker has two bands; at least :data:`MIN_SIDE`,
    a multiple of 256 from 1 024 rows on."""
    resident = n_samples * (n_features * itemsize + 8)
    room = max(0.0, 0.25 * (free - resident))
    by_memory = int(math.sqrt(room / (max(1, streams) * (itemsize + 8))))
    spread = -(-n_samples // (2 * max(1, streams) * max(1, workers)))
    side = max(MIN_SIDE, min(cap, by_memory, spread))
    if side >= 1024:
        side -= side % 256
    limit = min((cap, "the cap"), (by_memory, "a quarter of the free device memory"),
                (spread, "two bands for every stream"))[1]
    return int(min(side, n_samples)), limit


def band_plan(kernel, client, n_samples: int, n_features: int, settings: Settings
              ) -> BandPlan | None:
    """The plan of the band passes for ``kernel`` on ``client``'s workers (module docstring),
    or None where the passes are the CPU's tiles."""
    workers = wants_bands(kernel, client, settings.band_passes)
    if not workers:
        return None
    spec = kernel.tile_spec()
    info = client.submit(device_info, spec.device, spec.code, spec.dtype.name,
                         workers=[workers[0]],
                         allow_other_workers=False, pure=False).result()
    streams = max(1, int(settings.gpu_streams))
    cap = int(settings.gpu_tile_rows if info["kind"] == "cuda" else settings.tile_rows)
    side, limit = band_side(n_samples, n_features, spec.dtype.itemsize, info["free"],
                            streams=streams, workers=len(workers), cap=cap)
    return BandPlan(tuple(workers), info, side, int(n_samples), streams,
                    f"side from {limit}")


def plan_for(engine) -> BandPlan | None:
    """:func:`band_plan` for a row engine (none with its row cache: those tiles are the CPU's),
    logged."""
    if engine.cache_rows:
        return None
    plan = band_plan(engine.kernel, engine.client, engine.n_samples, engine.store.n_features,
                     engine.settings)
    if plan is not None:
        log.debug("%s", plan.describe())
    return plan


def band_residuals(engine, Cs: tuple) -> tuple[float, list[float]]:
    """``‖K'‖²`` and ``‖K' − CᵀC‖²`` for each ``C`` by one band pass in float64
    (:meth:`dkha.engine.rows.RowEngine.residuals` on GPU workers)."""
    tot = band_pass(engine, "residuals", engine.exact_kernel, Cs=Cs,
                    what="the residual pass of an evaluation", progress="evaluation (residuals)")
    return float(tot[0]), [float(v) for v in tot[1:]]


def band_pass(engine, kind: str, kernel, *, V: np.ndarray | None = None, Cs: tuple = (),
              what: str, progress: str) -> np.ndarray:
    """One pass of band tasks (:func:`~dkha.engine.device.band_task`'s ``kind``), its result on
    the coordinator: the summed column/row sums (``"sums"``, a vector of ``l``), ``K' V``
    (``"product"``) or the residual sums (``"residuals"``)."""
    plan: BandPlan = engine.bands
    client, passes, l = engine.client, engine.passes, engine.n_samples
    bands = plan.bands
    mk = None if kind == "sums" else engine.mk_future()
    mkm = 0.0 if kind == "sums" else engine.mkm
    W = plan.workers
    # the pass's operands sent once to the workers that take them (not inside each task)
    Vf = None if V is None else client.scatter(V, workers=list(W), broadcast=len(W) > 1,
                                                hash=False)
    Cf = [client.scatter(C, workers=list(W), broadcast=len(W) > 1, hash=False) for C in Cs]
    if kind == "sums":
        shape = (l,)
    elif kind == "product":
        shape = (l, V.shape[1])
    else:
        shape = (1 + len(Cs),)
    starts = [0 if kind == "residuals" else a for a, _ in bands]
    record = passes.pass_record(what, kind, len(bands), bands=len(bands), side=plan.side,
                                reduce_tasks=0)
    partial: dict = {}
    pending: dict = {w: [] for w in W}
    finals = []
    submitted = []
    t0 = time.perf_counter()
    log.info("%s: %d band tasks on %d worker(s)", what, len(bands), len(W))
    try:
        with passes.progress(progress, len(bands), transient=kind != "sums") as bar:
            for i, (a, b) in enumerate(bands):
                w = W[i % len(W)]
                f = client.submit(band_task, engine.source, kernel, l, a, b, plan.side,
                                  plan.streams, kind, mk, mkm, Vf, Cf or None, workers=[w],
                                  allow_other_workers=False, priority=len(bands) - i, pure=False)
                submitted.append(f)
                pending[w].append((starts[i], f))
            for w in W:         # each worker's bands chained in band order
                group = pending[w]
                for g in range(0, len(group), FAN_IN):
                    part = group[g:g + FAN_IN]
                    partial[w] = client.submit(
                        combine, partial.get(w), shape, tuple(s for s, _ in part),
                        plan.streams, *(f for _, f in part), workers=[w], allow_other_workers=False,
                        priority=len(bands) - g, pure=False)
                    submitted.append(partial[w])
                    record["reduce_tasks"] += 1
                if w in partial:
                    finals.append(client.submit(to_host, partial[w], workers=[w],
                                                allow_other_workers=False, pure=False))
            for f in submitted[:len(bands)]:
                t1 = time.perf_counter()
                passes.settle(f, what)
                record["wait_seconds"] += time.perf_counter() - t1
                bar.update()
            out = np.zeros(shape)
            for f in finals:        # worker by worker, in the plan's order
                t1 = time.perf_counter()
                got = passes.wait(f, what)
                record["wait_seconds"] += time.perf_counter() - t1
                record["bytes_received"] += got.nbytes
                out += got
    except BaseException:       # released, not cancelled: no scheduler tracebacks on a stop
        release(submitted + finals)
        raise
    finally:
        record["wall_seconds"] = time.perf_counter() - t0
        record["busy_seconds"] = max(0.0, record["wall_seconds"] - record["wait_seconds"])
        passes.records.append(record)
    return out
