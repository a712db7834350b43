"""The coordinator's end of the worker-side replicas of ``S̃`` and ``C̃`` (coordinator-math.md §4):
it numbers the coordinator's messages, sends them to the replicas in order, submits the blocks'
projection tasks (:mod:`dkha.engine.tasks`) and turns their results into up-to-date projections.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
import uuid
from dataclasses import dataclass

import dask
import numpy as np
from distributed import Client

from dkha.engine.tasks import (
    Carry,
    ReplicaDivergedError,
    ReplicaLostError,
    drop_replicas,
    release,
    replica_build,
    replica_columns,
    replica_project,
    replica_replay,
)
from dkha.errors import ClusterLostError, Interrupted
from dkha.solvers.factored import replay_message

log = logging.getLogger(__name__)


_UPDATE_PRIORITY = 1        # replica updates before any block's tasks (those have priority −seq)
_REBALANCE_SECONDS = 1.0    # how often the replicas look for workers that joined
# a stop asked while waiting on the replicas lets their tasks finish for this long: the fit then
# stops at the next block boundary, with a checkpoint that carries the blocks in flight
_STOP_GRACE_SECONDS = 30.0


@dataclass
class _PendingBlock:
    seq: int
    index: np.ndarray
    version: int            # the version of S̃ the partial projections use
    epoch: int              # the replicas' rebuild it was submitted to
    window_index: np.ndarray    # W ∪ P: the blocks ahead in the FIFO, then this one
    partials: list          # a future per worker thread: its groups' (K'[P, J] S̃_v[:, J]ᵀ,
    #                         K'[P, W ∩ J]) in group order (replica_project)
    groups: list            # the column groups of each of those futures
    offsets: dict           # block seq -> first column of its rows in the window
    carried: np.ndarray | None = None   # its projection carried by a checkpoint (Carried)


@dataclass
class ProjectedBlock:
    """A block whose projections were computed on the workers (coordinator-math.md §4).

    ``projection`` (``b×m``, the column groups' partials summed) is ``K'_P S̃_vᵀ`` for the
    version ``v`` of ``S̃``; ``window`` is ``K'[P, W ∪ P]`` with the columns of block ``s`` from
    ``offsets[s]``: what the coordinator needs to bring it up to date
    (:meth:`Messages.projections`).
    """

    seq: int
    index: np.ndarray
    version: int
    projection: np.ndarray
    window: np.ndarray
    offsets: dict
    window_index: np.ndarray | None = None


@dataclass
class Carried:
    """A block in flight when a checkpoint was written, for the resume to take up where the run
    was (issue 43): ``projection`` is its ``K'_P S̃ᵀ`` computed on the version of ``S̃`` it was
    submitted on and brought up to the checkpoint's by the same messages the run replayed on it,
    so the resumed run replays the rest on the same numbers; ``window_index`` and ``offsets``
    (the window's column of each block carried before it and its own, by their order in the
    checkpoint) make its window again. A resume that projected these blocks on the checkpoint's
    ``S̃`` would differ from the uninterrupted run in the last bits."""

    index: np.ndarray
    projection: np.ndarray
    window_index: np.ndarray
    offsets: dict           # order among the carried blocks -> first column in the window

    @staticmethod
    def to_checkpoint(carried: list) -> tuple[dict, list]:
        """``(arrays, meta)`` for a checkpoint: arrays ``carried.{i}.*``, the offsets as JSON."""
        arrays = {}
        for i, c in enumerate(carried):
            arrays.update({f"carried.{i}.index": c.index, f"carried.{i}.projection": c.projection,
                           f"carried.{i}.window_index": c.window_index})
        return arrays, [sorted([int(k), int(v)] for k, v in c.offsets.items()) for c in carried]

    @staticmethod
    def from_checkpoint(arrays: dict, meta: list | None) -> list:
        """The blocks a checkpoint carries (none in one written without them)."""
        return [Carried(arrays[f"carried.{i}.index"], arrays[f"carried.{i}.projection"],
                        arrays[f"carried.{i}.window_index"], {int(k): int(v) for k, v in offs})
                for i, offs in enumerate(meta or [])]


class Messages:
    """The coordinator's messages to the replicas of one stream, numbered (one per block, one per
    lone fold: the version of ``S̃`` is how many have been recorded), kept while a block in flight
    (submitted on version ``keep_from`` or later) can need them, and the bases from which lost
    replicas are rebuilt exactly: ``(version, S̃, C̃)`` where the coordinator held all of the
    state (the first build, pass ends), oldest first, with the messages since the oldest."""

    def __init__(self, stats):     # stats: the engine's StreamStats
        self.stats = stats
        self.log: collections.deque = collections.deque()     # (version, seq, index, ops)
        self.version = 0        # messages recorded (the coordinator's S̃)
        self.keep_from = 0      # the oldest version a block in flight was submitted on
        self.bases: list = []
        self.history: list = []
        self.applied = -1       # the seq of the last block whose message was recorded

    def record_block(self, block: ProjectedBlock, ops: list) -> None:
        """Record the message of ``block`` (the operations the solver appended to ``ops``)."""
        self.applied = block.seq
        self._record((self.version + 1, block.seq, block.index, tuple(ops)))

    def record_fold(self, F: np.ndarray) -> None:
        """Record a fold of ``T`` into ``S̃`` made outside a block (a pass start)."""
        self._record((self.version + 1, None, None, (("fold", F),)))

    def _record(self, message: tuple) -> None:
        self.version += 1
        self.log.append(message)
        if self.bases:      # messages are never changed once recorded: kept as they are
            self.history.append(message)

    def add_base(self, S: np.ndarray, C: np.ndarray | None) -> None:
        """Keep the state at the current version (all of it at the coordinator) as a base."""
        self.bases.append((self.version, np.array(S), None if C is None else np.array(C)))
        self._trim_bases()

    def exact_base(self) -> tuple | None:
        """``(S̃'s version, S̃, C̃'s version, C̃, the messages since S̃'s)`` to rebuild the replicas
        exactly from, or None where no base is old enough for the blocks in flight."""
        s_base = [b for b in self.bases if b[0] <= self.keep_from]
        if not s_base:
            return None
        (sv, S, _), (cv, _, C) = s_base[-1], self.bases[-1]
        return sv, S, cv, C, [m for m in self.history if m[0] > sv]

    def trim(self) -> None:
        """Forget the messages no block in flight can need (versions ≤ ``keep_from``)."""
        while self.log and self.log[0][0] <= self.keep_from:
            self.log.popleft()
        self._trim_bases()

    def _trim_bases(self) -> None:
        """Forget the bases (and messages) older than the newest one the blocks in flight can
        rebuild from (version ≤ ``keep_from``)."""
        usable = [b[0] for b in self.bases if b[0] <= self.keep_from]
        if usable:
            self.bases = [b for b in self.bases if b[0] >= usable[-1]]
        if self.bases:
            oldest = self.bases[0][0]
            self.history = [m for m in self.history if m[0] > oldest]

    def projections(self, block: ProjectedBlock) -> tuple[np.ndarray, np.ndarray]:
        """``(Y₀ᵀ, K'[P, P])`` for ``block`` on the coordinator's current ``S̃``: its projection
        with every message since its version replayed (coordinator-math.md §4)."""
        off, b = block.offsets[block.seq], len(block.index)
        return self.brought_up(block), np.ascontiguousarray(block.window[:, off:off + b])

    def brought_up(self, block: ProjectedBlock) -> np.ndarray:
        """``Y₀ᵀ`` of ``block`` on the current ``S̃``: its projection, every message since its
        version replayed in order."""
        Y = np.array(block.projection)
        if block.version < self.version:
            if not self.log or self.log[0][0] > block.version + 1:
                raise RuntimeError(f"the messages since version {block.version} are no longer "
                                   f"kept (block {block.seq})")
            for version, seq, index, ops in self.log:
                if version <= block.version:
                    continue
                cols = None
                if seq is not None:
                    if seq not in block.offsets:
                        raise RuntimeError(f"block {block.seq}'s window lacks the columns of "
                                           f"block {seq}")
                    off = block.offsets[seq]
                    cols = block.window[:, off:off + len(index)]
                replay_message(Y, ops, cols)
                self.stats.messages_replayed += 1
        return Y


class WorkerReplicas:
    """The coordinator's end of the worker-side replicas of ``S̃`` and ``C̃`` of one stream.

    Each worker thread holds the replicas of some column groups (a *holder*); a block is one task
    per holder (:func:`~dkha.engine.tasks.replica_project`), which carries the coordinator's
    :attr:`messages` (:class:`Messages`) recorded since the holder's last task, applies them in
    order and returns its groups' partials, summed here in the layout's group order (the same
    bits whichever threads hold which groups). It brings ``C̃`` home, and rebuilds the replicas
    when one is lost. A holder's tasks follow one another (each takes the last as ``after``).
    """

    def __init__(self, engine, state):  # engine: the stream's dkha.engine.rows.RowEngine
        self.engine = engine
        self.client = engine.client
        self.state = state
        self.run_id = uuid.uuid4().hex
        self.epoch = -1
        self.groups = engine.column_groups
        # the chunk ranges as arrays, not tuples of tuples: Dask walks the nested tuples of a
        # task's arguments looking for futures, and these made most of the ~45 nodes it walked
        # per task (a tenth of the coordinator's CPU seconds in a KHA pass)
        self._ranges = np.asarray(engine.all_ranges, dtype=np.int64)
        self._cols = [np.asarray(g, dtype=np.int64) for g in self.groups]
        self.bounds = np.asarray([(g[0][0], g[-1][1]) for g in self.groups], dtype=np.int64)
        self._tasks = itertools.count()
        self.messages = Messages(engine.stats)
        self.holders: list[list[int]] = []     # per worker thread: the groups it holds
        self.sent: list[int] = []       # per holder: the messages sent to its replicas
        self.last: list = []            # per holder: its last task's future(s)
        self.workers: list[str] = []    # per group: its holder's worker
        self.rebuilds = 0
        self._checked = time.monotonic()    # when rebalance last asked who is in the cluster
        self.exact = False      # whether the last build reproduced the lost replicas exactly
        self.in_flight = ()     # the stream's FIFO of [tag, index, seq, pending] (submitted)
        self.held = None        # the ProjectedBlock the stream gave out last

    def _key(self, g: int) -> tuple:
        return (self.run_id, self.epoch, g)

    def _pinned(self, g: int, func, *args, priority: int):
        # keys from a counter under the stream's run id: unique without a uuid4 (an urandom
        # call) per task
        key = f"{func.__name__}-{self.run_id}-{next(self._tasks)}"
        return self.client.submit(func, *args, key=key, workers=[self.workers[g]],
                                  allow_other_workers=False, priority=priority)

    def _holder_tasks(self, func, args: list, priority: int) -> list:
        """One task ``func(keys, *args[h], messages, keep_from, after)`` per holder ``h``: the
        messages recorded since its last task carried (:meth:`_carry`), chained after that task.
        Submitted together (one message to the scheduler, each task restricted to its holder's
        worker) where the client is a cluster's: the scheduler's cost is per submission too."""
        keys = [f"{func.__name__}-{self.run_id}-{next(self._tasks)}" for _ in self.holders]
        calls = [([self._key(g) for g in groups], *args[h], self._carry(h),
                  self.messages.keep_from, self.last[h])
                 for h, groups in enumerate(self.holders)]
        where = {k: [self.workers[groups[0]]] for k, groups in zip(keys, self.holders)}
        self.last = submit_pinned(self.client, func, calls, where, priority)
        return list(self.last)

    def _carry(self, h: int) -> Carry:
        """The messages holder ``h`` has not been sent, marked sent."""
        msgs = tuple(m for m in self.messages.log if m[0] > self.sent[h])
        if msgs:
            assert msgs[0][0] == self.sent[h] + 1, "a message to the replicas was dropped unsent"
            self.engine.stats.bytes_sent += sum(x.nbytes for m in msgs for op in m[3]
                                                for x in op if isinstance(x, np.ndarray))
        self.sent[h] = self.messages.version
        return Carry(msgs)

    # -- replicas --
    def build(self) -> None:
        """(Re)build every replica on the workers present now: exactly as they were, from a
        kept base and the messages since (:func:`replica_replay`), where a base is old enough
        for the blocks in flight; else from the coordinator's state at the current version
        (``C̃ = S̃_A K'`` recomputed on the workers where it lived there: equal up to rounding)."""
        st, eng, msgs = self.state, self.engine, self.messages
        threads = sorted(self.client.nthreads().items())
        if not threads:
            raise ClusterLostError("no Dask workers to hold the replicas of S̃")
        slots = [addr for addr, n in threads for _ in range(max(1, int(n)))]
        self.epoch += 1
        self.workers = [slots[g % len(slots)] for g in range(len(self.groups))]
        self.holders = [list(range(h, len(self.groups), len(slots)))
                        for h in range(min(len(slots), len(self.groups)))]
        self.sent = [msgs.version] * len(self.holders)
        mk = eng.mk_future()
        builds = []
        base = msgs.exact_base()
        self.exact = base is not None
        if self.exact:
            sv, S, cv, C, messages = base
            log.info("replicas of S̃ rebuilt exactly: S̃ from version %d, C̃ from %d, %d messages "
                     "replayed up to %d", sv, cv, len(messages), msgs.version)
            for g, (lo, hi) in enumerate(self.bounds):
                builds.append(self._pinned(
                    g, replica_replay, self._key(g), self._cols[g], sv, S[:, lo:hi], cv,
                    None if C is None else C[:, lo:hi], messages, msgs.keep_from,
                    eng.source, eng.kernel, mk, eng.mkm, self._ranges,
                    priority=_UPDATE_PRIORITY))
            self._built(builds)
            return
        S_A = None
        if st.keeps_c and st.c_stale:                # C̃ is recomputed there: C̃ = S̃_A K'
            S_A = eng.passes.put(np.array(st.S_tilde[:st.r]))
        log.info("replicas of S̃ built from the coordinator's state at version %d%s",
                 msgs.version, " (C̃ recomputed: equal up to rounding)" if S_A is not None else "")
        for g, (lo, hi) in enumerate(self.bounds):
            C = np.array(st.C_tilde[:, lo:hi]) if st.keeps_c and S_A is None else None
            builds.append(self._pinned(
                g, replica_build, self._key(g), self._cols[g], msgs.version,
                np.array(st.S_tilde[:, lo:hi]), C, S_A, eng.source, eng.kernel, mk, eng.mkm,
                self._ranges, priority=_UPDATE_PRIORITY))
        self._built(builds)
        if S_A is None:
            msgs.add_base(st.S_tilde, st.C_tilde if st.keeps_c else None)

    def _built(self, builds: list) -> None:
        """Each holder's next task after its groups' ``builds`` (a future per group)."""
        self.last = [[builds[g] for g in groups] for groups in self.holders]

    def recover(self, exc: ReplicaLostError) -> None:
        """Rebuild after a lost replica, or raise ``exc`` after ``engine.replica_rebuilds``
        rebuilds in a row without a block completing in between (workers that come and go
        during a long fit are survived however often it happens, as long as blocks get done)."""
        if self.rebuilds >= self.engine.replica_rebuilds:
            raise exc
        self.rebuilds += 1
        self.engine.stats.replica_rebuilds += 1
        log.warning("rebuilding the worker replicas of S̃ (%d in a row, at most %d): %s",
                    self.rebuilds, self.engine.replica_rebuilds, exc)
        self.build()

    def rebalance(self) -> bool:
        """Move the replicas onto workers that joined since they were built, where some worker
        holds several groups (e.g. the survivors of a lost worker): every group is then rebuilt
        from the coordinator's state. Called where ``C̃`` is home (pass ends: nothing to
        recompute) or, for states without ``C̃``, at most every ``_REBALANCE_SECONDS``.
        Returns whether it moved them."""
        holders = collections.Counter(self.workers)
        if not holders or max(holders.values()) < 2:
            return False
        now = time.monotonic()
        if self.state.keeps_c:
            if self.state.c_stale:      # mid-pass: C̃ lives on the replicas
                return False
        elif now - self._checked < _REBALANCE_SECONDS:
            return False
        self._checked = now
        joined = sorted(set(self.client.nthreads()) - set(holders))
        if not joined:
            return False
        log.info("moving the replicas of S̃ onto %d joined worker(s): %s", len(joined),
                 ", ".join(joined))
        self.engine.stats.replica_moves += 1
        self.build()
        return True

    def close(self) -> None:
        """Drop the replicas (after the updates in flight, so that none fails)."""
        try:
            last = [f if isinstance(f, list) else [f] for f in self.last]
            self._wait([f for fs in last for f in fs], what="the last replica tasks")
        except Exception as exc:  # noqa: BLE001 - cleanup of a stream that is over
            log.debug("replica updates of run %s did not finish: %s", self.run_id, exc)
        try:
            self.client.run(drop_replicas, self.run_id, on_error="ignore")
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - no cluster: nothing to drop
            log.debug("could not drop the replicas of run %s: %s", self.run_id, exc)

    # -- blocks --
    def submit(self, seq: int, index: np.ndarray, ahead: list) -> _PendingBlock:
        """The tasks of block ``seq`` on the current version; ``ahead``: ``(index, seq)`` of the
        blocks before it in the FIFO, whose columns its window holds."""
        offsets, pos = {}, 0
        for idx, s in ahead:
            offsets[s] = pos
            pos += len(idx)
        offsets[seq] = pos
        window_index = np.concatenate([idx for idx, _ in ahead] + [index])
        return self._submit_at(seq, index, self.messages.version, window_index, offsets)

    def resubmit(self, pending: _PendingBlock, ahead: list) -> _PendingBlock:
        """Block ``pending`` again after a rebuild: on its own version and window where the
        rebuild was exact (the run goes on bit for bit), else as :meth:`submit`."""
        if not self.exact:
            return self.submit(pending.seq, pending.index, ahead)
        return self._submit_at(pending.seq, pending.index, pending.version,
                               pending.window_index, pending.offsets, pending.carried)

    def take_up(self, seq: int, carried: Carried) -> _PendingBlock:
        """Block ``seq`` carried by the checkpoint a stream resumes from (:class:`Carried`), on
        the current version (the checkpoint's): its tasks make its window and keep its kernel
        rows for ``C̃``; its projection is the one carried (``carried.offsets`` by seq here)."""
        return self._submit_at(seq, np.asarray(carried.index), self.messages.version,
                               np.asarray(carried.window_index), carried.offsets,
                               np.asarray(carried.projection, dtype=np.float64))

    def _submit_at(self, seq: int, index: np.ndarray, version: int, window_index: np.ndarray,
                   offsets: dict, carried: np.ndarray | None = None) -> _PendingBlock:
        eng = self.engine
        mk = eng.mk_future()
        keep = bool(self.state.keeps_c)
        partials = self._holder_tasks(
            replica_project, [(eng.source, eng.kernel, mk, eng.mkm, self._ranges,
                               [self._cols[g] for g in groups], index, window_index, version,
                               seq, keep) for groups in self.holders], priority=-seq)
        return _PendingBlock(seq, index, version, self.epoch, window_index, partials,
                             [list(g) for g in self.holders], offsets, carried)

    def release(self, pending: _PendingBlock) -> None:
        """Let go of a block's tasks (:func:`~dkha.engine.tasks.release`), but not a holder's
        last one: its next task takes it as ``after`` (it goes when a later task replaces it)."""
        last = {id(f) for f in self.last}
        release([f for f in pending.partials if id(f) not in last])

    def _wait(self, futures: list, what: str) -> list:
        """The results of ``futures`` (tasks pinned to the replicas' workers):
        :class:`ReplicaLostError` where one of those workers left the cluster meanwhile
        (:meth:`dkha.engine.passes.ClusterPasses.wait_pinned`)."""
        return self.engine.passes.wait_pinned(futures, self.workers, what,
                                              stop_grace=_STOP_GRACE_SECONDS)

    def wait_block(self, pending: _PendingBlock, what: str) -> ProjectedBlock:
        block, nbytes = self._block(pending, what)
        self.rebuilds = 0       # a block got done: the rebuilds so far are survived
        self.engine.stats.bytes_received += nbytes
        return block

    def _block(self, pending: _PendingBlock, what: str) -> tuple[ProjectedBlock, int]:
        parts = by_group(pending.groups, self._wait(pending.partials, what), what)
        nbytes = sum(Y.nbytes + part.nbytes for Y, part in parts)
        Y, window = combine_projections(self.bounds, pending.window_index, parts)
        if pending.carried is not None:
            Y = pending.carried
        return ProjectedBlock(pending.seq, pending.index, pending.version, Y, window,
                              pending.offsets, pending.window_index), nbytes

    # -- checkpoints --
    def checkpoint(self) -> tuple[dict, list] | None:
        """What a checkpoint at a block boundary needs beyond the state, for a resume to go on
        bit for bit: ``C̃`` brought home into the state (the replicas' own bits), and the blocks
        in flight (:class:`Carried`, as ``(arrays, meta)``). None, with a warning, where they
        cannot be had (a replica or the cluster lost, a stop that would not wait): the resume
        then projects those blocks again and recomputes ``C̃``, equal up to rounding."""
        st = self.state
        try:
            if st.keeps_c and st.c_stale:
                st.set_c_tilde(self.synchronise())
            return Carried.to_checkpoint(self.carry())
        except (ReplicaLostError, ClusterLostError, Interrupted) as exc:
            log.warning("the checkpoint carries neither C̃ nor the blocks in flight; a resume "
                        "from it ends equal up to rounding, not bit for bit: %s", exc)
            return None

    def carry(self) -> list[Carried]:
        """The blocks submitted and not yet applied, in order (:class:`Carried`): none where
        the replicas were rebuilt since."""
        msgs, blocks = self.messages, []
        if self.held is not None and self.held.seq > msgs.applied:   # given out, not applied
            blocks.append(self.held)
        for tag, index, _, pending in self.in_flight:
            if pending.epoch != self.epoch:
                return []
            blocks.append(self._block(pending, f"the block of rows {tag!r} (to checkpoint)")[0])
        order = {b.seq: i for i, b in enumerate(blocks)}
        return [Carried(np.asarray(b.index), msgs.brought_up(b), np.asarray(b.window_index),
                        {order[s]: off for s, off in b.offsets.items() if s in order})
                for b in blocks]

    # -- pass ends --
    def synchronise(self) -> np.ndarray | None:
        """Check every replica of ``S̃`` against the coordinator's and return the current ``C̃``
        (``r×l``; ``None`` where ``C`` is not kept). At pass ends and when the stream closes."""
        st, msgs = self.state, self.messages
        while True:
            futures = self._holder_tasks(replica_columns, [(msgs.version,)] * len(self.holders),
                                         priority=_UPDATE_PRIORITY)
            try:
                results = by_group(self.holders, self._wait(futures, "C̃ from the "
                                                                           "replicas"), "C̃")
                break
            except ReplicaLostError as exc:
                self.recover(exc)
        for (lo, hi), (_, squares) in zip(self.bounds, results):
            want = np.einsum("ij,ij->i", st.S_tilde[:, lo:hi], st.S_tilde[:, lo:hi])
            if not np.allclose(squares, want, rtol=1e-9, atol=1e-300):
                raise ReplicaDivergedError(
                    f"the replica of S̃ columns {lo}:{hi} differs from the coordinator's "
                    f"(largest relative difference of row norms "
                    f"{np.max(np.abs(squares - want) / np.maximum(want, 1e-300)):.1e})")
        self.engine.stats.bytes_received += sum(s.nbytes for _, s in results)
        if results[0][0] is None:
            msgs.add_base(st.S_tilde, None)
            return None
        C = np.concatenate([c for c, _ in results], axis=1)
        self.engine.stats.bytes_received += C.nbytes
        msgs.add_base(st.S_tilde, C)
        return C


def combine_projections(bounds, window_index: np.ndarray, results: list
                        ) -> tuple[np.ndarray, np.ndarray]:
    """One block's partial projections summed and its window assembled.

    ``results``: each column group's ``(K'[P, J] S̃[:, J]ᵀ, K'[P, W ∩ J])`` in group order, with
    ``bounds`` their column ranges; summed in that order, the layout's, whatever the cluster.
    """
    if len(results) == 1:       # one group: its window columns are the window, in order
        return results[0][0], results[0][1]
    Y = np.array(results[0][0])
    for part, _ in results[1:]:
        Y += part
    w = np.asarray(window_index)
    window = np.empty((Y.shape[0], len(w)))
    for (lo, hi), (_, part) in zip(bounds, results):
        window[:, (w >= lo) & (w < hi)] = part
    return Y, window


def by_group(holders: list, results: list, what: str) -> list:
    """The holders' ``results`` (a list each, in the order of their groups ``holders``) in group
    order."""
    out = [None] * sum(len(g) for g in holders)
    for groups, result in zip(holders, results):
        if result is None:          # the run was dropped on that worker meanwhile
            raise ReplicaLostError(f"the replicas of groups {groups} are gone ({what})")
        for g, r in zip(groups, result):
            out[g] = r
    return out


def submit_pinned(client, func, calls: list, where: dict, priority: int) -> list:
    """``func(*call)`` for each call, under the keys of ``where`` (key -> its worker, in the
    calls' order), each restricted to its worker: one message to the scheduler where the client
    is a cluster's (``client.map``, the workers a per-key annotation)."""
    keys = list(where)
    if len(calls) > 1 and isinstance(client, Client):
        with dask.annotate(workers=where.get, allow_other_workers=False):
            return client.map(func, *zip(*calls), key=keys, priority=priority, pure=False)
    return [client.submit(func, *call, key=k, workers=where[k], allow_other_workers=False,
                          priority=priority) for k, call in zip(keys, calls)]
