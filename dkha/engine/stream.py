"""The block stream: the centered kernel rows of a schedule's blocks, computed ahead of the
coordinator (a bounded FIFO of futures in schedule order), or with the projections on the
workers (coordinator-math.md §4, :mod:`dkha.engine.replicas`)."""

from __future__ import annotations

import collections
import itertools
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from dkha.engine.replicas import WorkerReplicas
from dkha.engine.tasks import ReplicaLostError, release

log = logging.getLogger(__name__)


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


def _block_name(tag, idx: np.ndarray) -> str:
    return f"the block of rows {tag!r} (first sample {idx[0]})"


def stream_rows(engine, blocks):
    """``(tag, index, K'[index, :])`` of :meth:`dkha.engine.rows.RowEngine.stream`, the rows
    computed ``engine.prefetch`` blocks ahead."""
    queue: collections.deque = collections.deque()
    it = iter(blocks)
    seq = 0
    stats = engine.stats
    try:
        while True:
            for tag, idx in _next_blocks(it, engine.prefetch - len(queue)):
                queue.append((tag, idx, engine.submit_rows(idx, priority=-seq)))
                seq += 1
            if not queue:
                return
            tag, idx, futs = queue.popleft()
            t0 = time.perf_counter()
            parts = engine.passes.results(futs, _block_name(tag, idx))
            stats.wait_seconds += time.perf_counter() - t0
            block = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
            # the pieces joined, let go (here and on the workers) before the block is applied:
            # kept until the next block, they were one more block held than the budget counts
            # (the blocks ahead, the one applied, the one before it taking its C̃ update)
            release(futs)
            del parts, futs
            stats.blocks += 1
            stats.rows += len(idx)
            stats.bytes_received += block.nbytes
            yield tag, idx, block
    finally:
        for _, _, futs in queue:
            release(futs)


def stream_projections(engine, blocks, solver, carried=()):
    """The block stream with the projections on the workers (coordinator-math.md §4): a
    :class:`~dkha.engine.replicas.ProjectedBlock` a block, the replicas rebuilt when lost.
    ``carried``: the blocks in flight that the checkpoint resumed from carries
    (:class:`~dkha.engine.replicas.Carried`), the schedule's first."""
    replicas = WorkerReplicas(engine, solver.state)
    queue: collections.deque = collections.deque()    # [tag, index, seq, pending]
    replicas.in_flight = queue
    it = iter(blocks)
    seq = 0
    stats = engine.stats
    solver.attach_replicas(replicas)
    try:
        replicas.build()
        it, seq = _take_up(replicas, queue, it, list(carried))
        while True:
            replicas.rebalance()
            if queue and queue[0][3].epoch != replicas.epoch:     # rebuilt: resubmit all
                _resubmit(replicas, queue)
            for tag, idx in _next_blocks(it, engine.prefetch - len(queue)):
                ahead = [(e[1], e[2]) for e in queue]
                queue.append([tag, idx, seq, replicas.submit(seq, idx, ahead)])
                seq += 1
            if not queue:
                return
            replicas.messages.keep_from = min(e[3].version for e in queue)
            replicas.messages.trim()
            tag, idx, _, pending = queue[0]
            t0 = time.perf_counter()
            try:
                block = replicas.wait_block(pending, what=_block_name(tag, idx))
            except ReplicaLostError as exc:
                replicas.recover(exc)
                continue
            finally:
                stats.wait_seconds += time.perf_counter() - t0
            queue.popleft()
            stats.blocks += 1
            stats.rows += len(idx)
            replicas.held = block
            yield tag, idx, block
    finally:
        for entry in queue:
            replicas.release(entry[3])
        _close_replicas(replicas, solver)


def _take_up(replicas: WorkerReplicas, queue, it, carried: list):
    """Put the ``carried`` blocks in flight again (:meth:`WorkerReplicas.take_up`) where they
    are the schedule's next; returns the rest of the schedule and the next seq."""
    if not carried:
        return it, 0
    first = _next_blocks(it, len(carried))
    if len(first) < len(carried) or any(not np.array_equal(idx, c.index)
                                        for (_, idx), c in zip(first, carried)):
        log.warning("the blocks the checkpoint carries are not the schedule's next: projecting "
                    "them again (equal up to rounding)")
        return itertools.chain(first, it), 0
    for seq, ((tag, idx), c) in enumerate(zip(first, carried)):
        queue.append([tag, idx, seq, replicas.take_up(seq, c)])
    return it, len(carried)


def _resubmit(replicas: WorkerReplicas, queue) -> None:
    """Submit every block in flight again after the replicas were rebuilt."""
    ahead = []
    for entry in queue:
        replicas.release(entry[3])
        entry[3] = replicas.resubmit(entry[3], list(ahead))
        ahead.append((entry[1], entry[2]))


def _close_replicas(replicas: WorkerReplicas, solver) -> None:
    """At the stream's end: ``C̃`` brought home (where the replicas hold it), the solver detached
    and the replicas dropped."""
    try:
        state = solver.state
        if state is replicas.state and state.c_stale:
            state.set_c_tilde(replicas.synchronise())
    except Exception as exc:  # noqa: BLE001 - ending anyway; C stays marked stale
        log.warning("could not bring C̃ home from the worker replicas: %s", exc)
    finally:
        solver.detach_replicas()
        replicas.close()


def _next_blocks(it, room: int) -> list:
    """Up to ``room`` more ``(tag, index)`` of a block stream's schedule (fewer at its end)."""
    return [(tag, np.asarray(idx)) for tag, idx in itertools.islice(it, max(0, room))]
