"""Running the coordinator's tasks on the Dask cluster: the plumbing every pass of the row engine
goes through.

:class:`ClusterPasses` waits for tasks while checking the stop request
(:func:`dkha.engine.stop.check_stop`: :class:`~dkha.errors.Interrupted` within a second of it),
turns cluster failures into dkha's errors (a task that killed its workers:
:class:`~dkha.errors.BlockFailedError`; a lost scheduler: :class:`~dkha.errors.ClusterLostError`),
places a pass's inputs, and runs whole passes of tasks with a bounded number in flight — their
results in order (:meth:`ClusterPasses.ordered_results`) or summed by bands on the workers
(:meth:`ClusterPasses.reduced_pass`) — recording each pass (tasks, wall, waiting and busy seconds,
bytes received) and showing its progress. It knows nothing of kernels: what the tasks compute is
:mod:`dkha.engine.rows`' business.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Iterator

import numpy as np
from distributed import wait as wait_for

from dkha.engine.budget import workers_of
from dkha.engine.cluster import shares_process, total_threads
from dkha.engine.stop import check_stop
from dkha.engine.tasks import ReplicaLostError, accumulate, identity, release
from dkha.errors import RESUME_HINT, BlockFailedError, ClusterLostError
from dkha.progress import Progress

log = logging.getLogger(__name__)

_STOP_POLL_SECONDS = 0.5    # waiting on a task: check the stop request this often
_PINNED_POLL_SECONDS = 1.0  # waiting on pinned tasks: check this often that their workers live
#: at most this many bytes of tile results wait on the workers for a band sum of a reduced
#: pass (:meth:`ClusterPasses.reduced_pass`), besides the tasks in flight
REDUCE_HOLD_BYTES = 256 * 2**20


class ClusterPasses:
    """The coordinator's tasks on one Dask client: waits with stop checks, errors translated,
    passes of tasks with a bounded number in flight.

    Parameters
    ----------
    client : distributed.Client
    records : list
        Where each pass's record goes (the row engine's ``stats.passes``).
    tasks_in_flight : int, optional
        ``dkha.tasks-in-flight`` (:attr:`tasks_in_flight`).

    Attributes
    ----------
    verbose : bool
        Show the progress of whole passes by tile (:class:`dkha.progress.Progress`);
        ``pass_label`` names the pass in progress (e.g. ``"Krylov product 3"``).
    """

    def __init__(self, client, records: list, tasks_in_flight: int | None = None):
        self.client = client
        self.records = records
        self._in_flight = tasks_in_flight
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

    def progress(self, desc: str, total: int, transient: bool = True) -> Progress:
        """A progress bar of ``total`` tiles, labelled by the pass in progress or ``desc``."""
        return Progress(self.verbose, total, self.pass_label or desc, unit="tile",
                        transient=transient)

    def gather(self, futures, what: str = "a block"):
        """``client.gather`` that turns cluster failures into dkha's errors.

        A task that killed every worker it ran on → :class:`BlockFailedError` naming ``what``;
        a lost scheduler → :class:`ClusterLostError` (exit code 75: resumable).
        """
        from distributed import KilledWorker
        from distributed.comm.core import CommClosedError

        dropped = cancelled(futures)
        if dropped is not None:
            raise BlockFailedError(f"the Dask scheduler cancelled {what} ({dropped}); the last "
                                   "checkpoint is kept")
        try:
            return self.client.gather(futures)
        except KilledWorker as exc:
            raise BlockFailedError(f"{what} killed every worker it was sent to ({exc}); "
                                   "the last checkpoint is kept") from None
        except (CommClosedError, OSError, TimeoutError) as exc:
            if self.client.status in ("running",) and not isinstance(exc, CommClosedError):
                raise
            raise ClusterLostError(f"lost the Dask scheduler while computing {what} ({exc}); "
                                   f"resume with {RESUME_HINT}") from None

    def put(self, array: np.ndarray, everywhere: bool = False):
        """A future holding ``array`` that the cluster can rebuild if the worker holding it dies.

        (Scattered data cannot be recomputed; a task that returns the array can. A pass's input,
        ``everywhere``, is scattered to every worker of other processes instead: a copy on
        each survives the loss of any. Workers in this process get every array scattered.)

        ``everywhere``: copied to every worker before it is used, for the input of a whole tile
        pass. Dask sends a task only to the workers that hold one of its inputs, so the tiles of
        a pass whose inputs sit on one worker all queue there until work stealing moves some
        (measured: the other of 2 workers idle for 0.8 s of a 0.9 s ``K'V`` pass); with a copy
        on every worker, each tile goes to the least busy one.
        """
        if everywhere or shares_process(self.client):
            # as data, never inside a task's graph (a K'V pass's V at l = 50 000: 12 MB,
            # "Sending large graph" in every product's log, and the scheduler's time per pass):
            # a pass's input (V, the C of the residuals) to every worker, so losing one leaves
            # the others'; workers in this process have nothing to rebuild (they live and die
            # with it)
            return self.client.scatter([array], broadcast=everywhere, hash=False)[0]
        return self.client.submit(identity, array, pure=False)

    def spread(self, future):
        """``future``'s result copied to every worker (:meth:`put`'s ``everywhere``)."""
        if len(workers_of(self.client)) > 1:
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
        n = self._in_flight
        return max(1, int(n) if n is not None else 4 * total_threads(self.client))

    def settle(self, future, what: str) -> None:
        """Wait for a task without fetching its result (:meth:`wait`'s stop checks; its error,
        if it failed, raised as :meth:`gather` raises it)."""
        while True:
            check_stop(what)
            if future.done():       # finished already (or run inline): nothing to wait for
                break
            try:
                wait_for(future, timeout=_STOP_POLL_SECONDS)
                break
            except TimeoutError:
                continue
        if future.status != "finished":
            self.gather([future], what=what)

    def wait(self, future, what: str):
        """The result of one task, checking the stop request while waiting
        (:func:`dkha.engine.stop.check_stop`: :class:`~dkha.errors.Interrupted` within a
        second of it)."""
        self.settle(future, what)
        return self.gather([future], what=what)[0]

    def results(self, futures, what: str) -> list:
        """The results of ``futures``, in order, each waited for as :meth:`wait` waits."""
        return [self.wait(future, what) for future in futures]

    def wait_pinned(self, futures: list, workers: list, what: str, *,
                    stop_grace: float = 0.0) -> list:
        """The results of ``futures`` (tasks pinned to ``workers``), checking every
        ``_PINNED_POLL_SECONDS`` that those workers are still in the cluster (also while a result
        is fetched: a result held by a worker that dies is recomputed, and a task pinned to a gone
        worker would wait for ever): :class:`ReplicaLostError` when one left, or when the
        scheduler cancelled one of them (its chain of tasks on the replicas is broken: what it
        carried may not have reached them). A stop is obeyed once ``stop_grace`` seconds of the
        wait have passed."""
        out = []
        stoppable_at = time.monotonic() + stop_grace
        for f in futures:
            while True:
                dropped = cancelled([f])
                if dropped is not None:
                    raise ReplicaLostError(f"the Dask scheduler cancelled a task of {what} on the "
                                           f"replicas of S̃ ({dropped})")
                try:
                    out.append(f.result(timeout=_PINNED_POLL_SECONDS))
                    break
                except TimeoutError:
                    if time.monotonic() >= stoppable_at:
                        check_stop(what)
                    alive = set(self.client.nthreads())
                    gone = sorted({w for w in workers if w not in alive})
                    if gone:
                        raise ReplicaLostError(f"worker {', '.join(gone)} holding replicas of S̃ "
                                               f"left the cluster while computing {what}") from None
                except Exception:  # noqa: BLE001 - the task failed: gather raises it, named
                    if cancelled([f]) is not None:  # meanwhile (distributed's sync then
                        continue                    # fails with UnboundLocalError): as above
                    out.append(self.gather([f], what=what)[0])
                    break
        return out

    def pass_record(self, what: str, kind: str, n: int, **extra) -> dict:
        """A pass's record (what, kind, tasks, wall, waiting and bytes received), filled in as
        it runs and appended to :attr:`records` when it ends."""
        return {"what": what, "kind": kind, "tasks": n, "wall_seconds": 0.0,
                "wait_seconds": 0.0, "bytes_received": 0, **extra}

    def _windowed(self, submit, n: int, what: str, record: dict) -> Iterator:
        """The futures of ``submit(0) … submit(n − 1)`` in order, at most
        :attr:`tasks_in_flight` submitted at once, each yielded for the caller to wait on (and to
        add its waiting to the record). The record of the pass gets its wall and busy seconds and
        joins ``stats.passes``; the tasks still in flight when it ends early are released
        (:func:`~dkha.engine.tasks.release`)."""
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
            release(pending)
            record["wall_seconds"] = time.perf_counter() - start
            record["busy_seconds"] = max(0.0, record["wall_seconds"] - record["wait_seconds"])
            self.records.append(record)

    def ordered_results(self, submit, n: int, what: str, *, kind: str = "tiles",
                        progress: str | None = None, transient: bool = True) -> Iterator:
        """The results of ``submit(0) … submit(n − 1)`` (each returns a future), in that order,
        with at most :attr:`tasks_in_flight` submitted at once and the stop request checked
        between tasks: a pass's memory is bounded by the tasks in flight, and a stop ends it
        within a task's time (the tasks in flight are released). ``progress``: the label of its
        progress bar (``what`` when not given); ``kind``: the pass's kind in its record
        (``mk``, ``product``, ``residual``)."""
        record = self.pass_record(what, kind, n)
        with self.progress(progress or what, n, transient=transient) as bar:
            for future in self._windowed(submit, n, what, record):
                t0 = time.perf_counter()
                result = self.wait(future, what)
                record["wait_seconds"] += time.perf_counter() - t0
                record["bytes_received"] += result_bytes(result)
                yield result
                bar.update()

    def reduced_pass(self, submit, routes: list, bands: list, width: int | None, what: str, *,
                     kind: str, progress: str | None = None, transient: bool = True
                     ) -> np.ndarray:
        """The band sums of a tile pass, added on the workers: ``out[band] = Σ pieces`` over the
        pieces routed to each band, in the pass's order.

        ``submit(k)`` returns the future of task ``k``'s result and ``routes[k]`` lists its
        pieces as ``(band, item)``: item ``item`` of the result (``None``: the result) is added
        to the rows ``bands[band]`` (``(start, stop)``, the bands covering ``0 … l``) of the
        ``l × width`` output
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
        l = max(stop for _, stop in bands)
        left = collections.Counter(band for route in routes for band, _ in route)
        fan_in = max(1, REDUCE_HOLD_BYTES // (2 * l * (width or 1) * 8))
        record = self.pass_record(what, kind, len(routes), fan_in=fan_in, reduce_tasks=0)
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
            record["bytes_received"] += result_bytes(part)
            a, b = bands[band]
            out[a:b] = part

        start = time.perf_counter()
        try:
            with self.progress(progress or what, len(routes), transient=transient) as bar:
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
            release([*partial.values(), *(f for _, f in finals)])
            record["wall_seconds"] = time.perf_counter() - start     # the last bands included
            record["busy_seconds"] = max(0.0, record["wall_seconds"] - record["wait_seconds"])
        return out


def result_bytes(result) -> int:
    """Bytes of the arrays in a task's result (an array, or a tuple of arrays and ``None``)."""
    if isinstance(result, np.ndarray):
        return result.nbytes
    if isinstance(result, (tuple, list)):
        return sum(result_bytes(x) for x in result)
    return 8


def cancelled(futures) -> str | None:
    """Why the first of ``futures`` that Dask cancelled was cancelled (its state's error: the
    scheduler's reason, e.g. "lost dependencies"), or None where none was. distributed raises a
    cancelled future's error as ``asyncio.CancelledError``, which its synchronous ``result`` and
    ``gather`` do not catch: they fail with ``UnboundLocalError: ... 'result'`` instead."""
    for f in futures:
        if getattr(f, "status", None) == "cancelled":
            return str(getattr(getattr(f, "_state", None), "exception", None) or "cancelled")
    return None
