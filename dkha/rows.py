"""Centered kernel rows and the MK row, computed blockwise on Dask workers.

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
  coordinator then rebuilds every replica from its own state (``C̃[:, J] = S̃_A K'[:, J]``
  recomputed on the workers when needed) and resubmits the blocks in flight, up to
  ``RowEngine.replica_rebuilds`` times per stream. At every pass end each replica of ``S̃`` is
  checked against the coordinator's (:class:`ReplicaDivergedError` if they differ) and ``C̃`` is
  brought home (``r·l`` numbers). Blocks are projected on the version current when they were
  submitted (replicas keep snapshots of ``S̃`` for the blocks in flight), so a run is
  reproducible bit for bit; resuming from a checkpoint reproduces it up to rounding only.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from dkha import config
from dkha.errors import BlockFailedError, ClusterLostError, ParameterError
from dkha.kernels import Kernel
from dkha.store import DataStore

log = logging.getLogger(__name__)

PROJECTIONS = ("coordinator", "workers")


# --- the centering function ---------------------------------------------------------------------


def center_block(K: np.ndarray, mk_rows: np.ndarray, mk_cols: np.ndarray, mkm: float) -> np.ndarray:
    """Center a kernel block in place: ``K - mk_cols[None, :] - mk_rows[:, None] + mkm``.

    For new data, ``mk_rows`` is ``k̄(x) = mean_j k(x, x_j)`` and ``mk_cols`` the training mk.
    """
    K -= mk_cols[None, :]
    K -= (mk_rows - mkm)[:, None]
    return K


# --- per-process chunk cache (worker side) -----------------------------------------------------

_CACHE: "collections.OrderedDict[tuple, np.ndarray]" = collections.OrderedDict()
_CACHE_BYTES = 0
_CACHE_LOCK = threading.Lock()


def _store_token(path: str) -> tuple:
    if "://" in path:
        return ()
    try:
        st = os.stat(os.path.join(path, "X", "zarr.json"))
    except OSError:
        return ()
    return (st.st_ino, st.st_mtime_ns)


def load_rows(path: str | np.ndarray, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a store's ``X`` (one chunk range), cached per process (or of the
    training array itself, when ``path`` is one).

    The cache is an LRU bounded by ``dkha.cache-bytes``; a chunk is read from zarr once per
    process, not once per block. For a local store the key includes the identity of ``X``'s
    metadata file (inode and modification time), so a store written again at the same path
    (``dkha ingest --overwrite`` replaces it by rename) is read afresh by long-lived workers.
    Chunks rewritten in place by another program keep the old rows: call :func:`clear_cache`
    on the workers (``client.run(clear_cache)``).
    """
    global _CACHE_BYTES
    if isinstance(path, np.ndarray):  # training rows held in memory (a model fitted on an array)
        return path[start:stop]
    key = (path, start, stop, _store_token(path))
    with _CACHE_LOCK:
        arr = _CACHE.get(key)
        if arr is not None:
            _CACHE.move_to_end(key)
            return arr
    import zarr

    from dkha.store import read_slice

    arr = np.ascontiguousarray(read_slice(zarr.open_group(path, mode="r")["X"], start, stop, path))
    arr.setflags(write=False)
    limit = float(config.get("cache-bytes"))
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = arr
            _CACHE_BYTES += arr.nbytes
            while _CACHE_BYTES > limit and len(_CACHE) > 1:
                _, old = _CACHE.popitem(last=False)
                _CACHE_BYTES -= old.nbytes
    return arr


def clear_cache() -> None:
    global _CACHE_BYTES
    with _CACHE_LOCK:
        _CACHE.clear()
        _CACHE_BYTES = 0


# --- worker tasks: module-level pure functions of blocks and scalars ----------------------------


def _identity(x):
    return x



def take_rows(path: str, ranges: tuple[tuple[int, int], ...], index: np.ndarray) -> np.ndarray:
    """``X[index]`` gathered from cached chunk ranges (``ranges`` must cover ``index``)."""
    index = np.asarray(index)
    out = np.empty((len(index), 0))
    first = True
    for a, b in ranges:
        sel = (index >= a) & (index < b)
        if not sel.any():
            continue
        chunk = load_rows(path, a, b)
        if first:
            out = np.empty((len(index), chunk.shape[1]))
            first = False
        out[sel] = chunk[index[sel] - a]
    return out


def _group_rows(path: str, ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    parts = [load_rows(path, a, b) for a, b in ranges]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _kernel_tile(path: str, kernel: Kernel, gi: tuple, gj: tuple) -> np.ndarray:
    """The uncentered tile ``K[I, J]`` for chunk-range groups ``I`` and ``J`` (a new array)."""
    XI = _group_rows(path, gi)
    return kernel.block(XI, XI if gi == gj else _group_rows(path, gj))


def mk_tile(path: str, kernel: Kernel, rows_i: tuple, rows_j: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """Column sums (over I) and, for an off-diagonal tile, row sums (over J) of ``K[I, J]``."""
    return tile_sums(_kernel_tile(path, kernel, rows_i, rows_j), rows_i == rows_j)


def mk_sample_tile(path: str, kernel: Kernel, rows_i: tuple, XS: np.ndarray) -> np.ndarray:
    """Row sums of ``K[I, S]`` for the sampled samples ``XS`` (the estimated MK row)."""
    return kernel.block(_group_rows(path, rows_i), XS).sum(axis=1)


def centered_rows(path: str, kernel: Kernel, XP: np.ndarray, mk: np.ndarray, mkm: float,
                  index: np.ndarray, cols: tuple) -> np.ndarray:
    """``K'[index, J]`` for the column group ``J`` (chunk ranges ``cols``)."""
    a, b = cols[0][0], cols[-1][1]
    K = kernel.block(XP, _group_rows(path, cols))
    return center_block(K, mk[index], mk[a:b], mkm)


def _centered_tile(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                   tile: np.ndarray | None = None):
    """``K'[I, J]``, computed, or centered from a copy of the cached tile ``K[I, J]``."""
    a, b = gi[0][0], gi[-1][1]
    c, d = gj[0][0], gj[-1][1]
    K = np.array(tile) if tile is not None else _kernel_tile(path, kernel, gi, gj)
    return center_block(K, mk[a:b], mk[c:d], mkm), (a, b), (c, d)


def product_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                 V: np.ndarray, tile: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``K'[I, J] V[J]`` and, off the diagonal, ``K'[J, I] V[I]`` (K' is symmetric).

    From a cached tile the centering is applied to the products, not the tile (no copy):
    ``K'[I, J] V[J] = K V[J] − 1 (mk[J]ᵀ V[J]) − (mk[I] − mkm) (1ᵀ V[J])``.
    """
    if tile is None:
        K, (a, b), (c, d) = _centered_tile(path, kernel, mk, mkm, gi, gj)
        return K @ V[c:d], (None if gi == gj else K.T @ V[a:b])
    a, b = gi[0][0], gi[-1][1]
    c, d = gj[0][0], gj[-1][1]

    def centered(K, mk_out, V_in, mk_in):
        out = K @ V_in
        out -= mk_in @ V_in
        out -= np.outer(mk_out - mkm, V_in.sum(axis=0))
        return out

    to_i = centered(tile, mk[a:b], V[c:d], mk[c:d])
    return to_i, (None if gi == gj else centered(tile.T, mk[c:d], V[a:b], mk[a:b]))


def residual_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                  Cs: tuple, tile: np.ndarray | None = None) -> np.ndarray:
    """``[‖K'[I,J]‖², ‖K'[I,J] − C[:,I]ᵀ C[:,J]‖² for each C of Cs]``, doubled off the diagonal
    (both halves)."""
    K, (a, b), (c, d) = _centered_tile(path, kernel, mk, mkm, gi, gj, tile)
    out = np.empty(1 + len(Cs))
    out[0] = np.einsum("ij,ij->", K, K)
    R = np.empty_like(K) if len(Cs) > 1 else K
    for m, C in enumerate(Cs):
        np.subtract(K, C[:, a:b].T @ C[:, c:d], out=R)
        out[1 + m] = np.einsum("ij,ij->", R, R)
    return out if gi == gj else 2.0 * out


def dense_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
               tile: np.ndarray | None = None) -> np.ndarray:
    """``K'[I, J]`` (small stores only)."""
    return _centered_tile(path, kernel, mk, mkm, gi, gj, tile)[0]


# --- the kernel tile cache (worker side): uncentered tiles K[I, J], I ≤ J, kept as task results ---


def kernel_tile(path: str, kernel: Kernel, gi: tuple, gj: tuple) -> np.ndarray:
    """The uncentered tile ``K[I, J]`` (read-only: the cache hands it to many tasks)."""
    K = _kernel_tile(path, kernel, gi, gj)
    K.setflags(write=False)
    return K


def tile_sums(K: np.ndarray, diagonal: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Column sums and, off the diagonal, row sums of a tile ``K[I, J]`` (the MK row's parts)."""
    return K.sum(axis=0), (None if diagonal else K.sum(axis=1))


def tile_take(K: np.ndarray, rows_i: np.ndarray, rows_j: np.ndarray | None
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A block's rows from a cached tile ``K[I, J]``: ``K[rows_i, :]`` (rows of the block in
    ``I``) and, off the diagonal, ``K[:, rows_j]ᵀ = K[J-rows, I]`` (rows of the block in ``J``)."""
    a = K[rows_i] if len(rows_i) else None
    b = np.ascontiguousarray(K[:, rows_j].T) if rows_j is not None and len(rows_j) else None
    return a, b


def assemble_rows(pieces: list, places: list, index: np.ndarray, mk: np.ndarray, mkm: float
                  ) -> np.ndarray:
    """``K'[index, :]`` from :func:`tile_take` pieces; ``places[k]`` is ``(positions, c, d)``
    for each non-empty piece in order: its rows go to ``out[positions, c:d]``."""
    out = np.empty((len(index), len(mk)))
    flat = [p for pair in pieces for p in pair if p is not None]
    for piece, (pos, c, d) in zip(flat, places):
        out[pos, c:d] = piece
    return center_block(out, mk[index], mk, mkm)


def project_rows(path: str, kernel: Kernel, Xnew: np.ndarray, mk: np.ndarray, mkm: float,
                 groups: tuple, alpha: np.ndarray) -> np.ndarray:
    """Projections ``alpha · k'(x)`` of new samples on the components (sample × component)."""
    l = len(mk)
    Ks = [kernel.block(Xnew, _group_rows(path, cols)) for cols in groups]
    kbar = sum(K.sum(axis=1) for K in Ks) / l
    out = np.zeros((len(Xnew), alpha.shape[0]))
    for cols, K in zip(groups, Ks):
        c, d = cols[0][0], cols[-1][1]
        out += center_block(K, kbar, mk[c:d], mkm) @ alpha[:, c:d].T
    return out


# --- worker-side replicas of S̃ and C̃ (coordinator-math.md §4) ---------------------------------


class ReplicaLostError(BlockFailedError):
    """A worker-side replica of ``S̃`` is gone or not at the version a task needs (its worker
    died, restarted or left), or a worker holding one left the cluster."""


class ReplicaDivergedError(BlockFailedError):
    """A replica of ``S̃`` no longer equals the coordinator's: blocks were projected on wrong
    values. Not recoverable: the fit stops (the last checkpoint is kept)."""


@dataclass
class _Replica:
    lo: int
    hi: int
    version: int
    snapshots: dict        # version -> S̃[:, lo:hi] at that version (read-only once made)
    C: np.ndarray | None   # C̃[:, lo:hi] at `version`
    blocks: dict           # block seq -> K'[P, lo:hi], kept for the C̃ updates of its message
    lock: threading.Lock = field(default_factory=threading.Lock)


_REPLICAS: dict[tuple[str, int, int], _Replica] = {}
_REPLICAS_LOCK = threading.Lock()
_DROPPED: collections.deque = collections.deque(maxlen=64)   # runs ended here: late tasks no-op


def _replica(key: tuple, what: str) -> _Replica | None:
    """The replica ``key``; ``None`` if its run has ended in this process (a task cancelled
    too late: its result is not used); raises :class:`ReplicaLostError` if it is missing."""
    rep = _REPLICAS.get(key)
    if rep is None:
        if key[0] in _DROPPED:
            return None
        raise ReplicaLostError(f"the replica of column group {key[2]} (run {key[0][:8]}, "
                               f"rebuild {key[1]}) is not on this worker, needed for {what}: "
                               "its worker died or restarted")
    return rep


def _c_columns(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, ranges: tuple,
               cols: tuple, S_A: np.ndarray, rows_per_tile: int = 1024) -> np.ndarray:
    """``S_A K'[:, J]`` for the column group ``J`` (chunk ranges ``cols``), tile by tile."""
    c, d = cols[0][0], cols[-1][1]
    XJ = _group_rows(path, cols)
    out = np.zeros((S_A.shape[0], d - c))
    for a, b in ranges:
        X = load_rows(path, a, b)
        for i in range(a, b, rows_per_tile):
            k = min(i + rows_per_tile, b)
            K = center_block(kernel.block(X[i - a:k - a], XJ), mk[i:k], mk[c:d], mkm)
            out += S_A[:, i:k] @ K
    return out


def replica_build(key: tuple, cols: tuple, version: int, S: np.ndarray, C: np.ndarray | None,
                  S_A: np.ndarray | None = None, path: str | None = None,
                  kernel: Kernel | None = None, mk: np.ndarray | None = None,
                  mkm: float | None = None, ranges: tuple | None = None) -> int:
    """Make the replica ``key = (run, rebuild, group)`` of ``S̃[:, J]`` (and ``C̃[:, J]``).

    ``C̃[:, J]`` is ``C`` when given, else computed as ``S_A K'[:, J]`` when ``S_A`` (``S̃``'s
    ``A`` rows, all columns) is given, else not kept. Replicas of earlier rebuilds of the same
    run and group in this process are dropped. Returns ``version``.
    """
    S = np.array(S, dtype=np.float64, order="C")          # never alias the caller's arrays
    S.setflags(write=False)
    if C is not None:
        C = np.array(C, dtype=np.float64, order="C")
    elif S_A is not None:
        C = _c_columns(path, kernel, mk, mkm, ranges, cols, S_A)
    rep = _Replica(cols[0][0], cols[-1][1], int(version), {int(version): S}, C, {})
    with _REPLICAS_LOCK:
        for old in [k for k in _REPLICAS if k[0] == key[0] and k[2] == key[2] and k[1] < key[1]]:
            del _REPLICAS[old]
        _REPLICAS[key] = rep
    return int(version)


def replica_update(key: tuple, version: int, seq: int | None, index: np.ndarray | None, ops: tuple,
                   keep_from: int, after: int) -> int:
    """Apply message ``version`` (the operations ``ops`` of block ``seq``, or a lone fold) to the
    replica, which must be at ``version - 1``. ``after``, the previous update's result, only
    orders the updates. Snapshots of ``S̃`` older than ``keep_from`` are dropped."""
    from dkha.solvers.factored import apply_message

    rep = _replica(key, f"message {version}")
    if rep is None:
        return version
    with rep.lock:
        if rep.version != version - 1:
            raise ReplicaLostError(f"the replica of column group {key[2]} is at version "
                                   f"{rep.version}; message {version} needs {version - 1}")
        K = None
        if rep.C is not None and seq is not None and any(op[0] in ("c", "direct") for op in ops):
            K = rep.blocks.pop(seq, None)
            if K is None:
                raise ReplicaLostError(f"the replica of column group {key[2]} lacks the kernel "
                                       f"block of block {seq} for message {version}")
        S = np.array(rep.snapshots[rep.version])          # copy on write: snapshots stay valid
        apply_message(S, rep.C, rep.lo, rep.hi, index, ops, K)
        S.setflags(write=False)
        rep.snapshots[version] = S
        rep.version = version
        for v in [v for v in rep.snapshots if v < keep_from and v != version]:
            del rep.snapshots[v]
    return version


def replica_project(key: tuple, path: str, kernel: Kernel, mk: np.ndarray, mkm: float,
                    ranges: tuple, cols: tuple, index: np.ndarray, window_index: np.ndarray,
                    version: int, seq: int, keep: bool, after: int
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """``K'[P, J] S̃_v[:, J]ᵀ`` (``b×m``) on the replica's snapshot of version ``v = version``, and
    the window columns that fall in ``J``: ``K'[P, w]`` for the entries ``w`` of
    ``window_index`` in ``J``, in their order.

    With ``keep``, ``K'[P, J]`` stays with the replica for the ``C̃`` update of block ``seq``.
    """
    K = centered_rows(path, kernel, take_rows(path, ranges, index), mk, mkm, index, cols)
    lo, hi = cols[0][0], cols[-1][1]
    window_index = np.asarray(window_index)
    in_group = window_index[(window_index >= lo) & (window_index < hi)]
    rep = _replica(key, f"the projections of block {seq}")
    if rep is None:
        return None
    with rep.lock:
        S = rep.snapshots.get(version)
        if S is None:
            raise ReplicaLostError(f"the replica of column group {key[2]} no longer holds "
                                   f"version {version} (now at {rep.version})")
        if keep:
            rep.blocks[seq] = K
    return K @ S.T, K[:, in_group - lo]                  # snapshots are immutable: no lock


def replica_columns(key: tuple, version: int, after: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``C̃[:, J]`` (a copy) at ``version``, and the row sums of squares of ``S̃[:, J]``."""
    rep = _replica(key, f"C̃ at version {version}")
    if rep is None:
        return None, np.zeros(0)
    with rep.lock:
        if rep.version != version:
            raise ReplicaLostError(f"the replica of column group {key[2]} is at version "
                                   f"{rep.version}, not {version}")
        S = rep.snapshots[version]
        C = None if rep.C is None else np.array(rep.C)
    return C, np.einsum("ij,ij->i", S, S)


def drop_replicas(run_id: str) -> int:
    """Drop every replica of run ``run_id`` in this process; returns how many."""
    with _REPLICAS_LOCK:
        _DROPPED.append(run_id)
        keys = [k for k in _REPLICAS if k[0] == run_id]
        for k in keys:
            del _REPLICAS[k]
    return len(keys)


# --- the engine ---------------------------------------------------------------------------------


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


class RowEngine:
    """Kernel rows of one data store and kernel, on a Dask cluster.

    Parameters
    ----------
    store : DataStore
    kernel : Kernel
        With all parameters set (``sigma`` resolved).
    client : distributed.Client
    block_rows, prefetch, column_groups : int, optional
        Default from ``dkha.block-rows``, ``dkha.prefetch``, ``dkha.column-groups``.
    projections : {"coordinator", "workers"}, optional
        Where a batch solver's block projections are computed (module docstring); default
        ``dkha.projections``.
    cache_rows : bool, optional
        Keep the kernel on the workers (default ``dkha.row-cache``): the upper-triangle tiles
        ``K[I, J]``, ``I ≤ J``, are computed once (the MK row comes from their sums) and every
        later row block, product ``K' V`` and residual reads them instead of recomputing kernels.
        Needs about ``4·l²`` bytes of worker memory (refused above half of what the workers
        have). Row mode only: worker-side projections compute their own rows.

    Attributes
    ----------
    replica_rebuilds : int
        How many times one stream may rebuild lost worker replicas before it fails (3).
    """

    replica_rebuilds = 3

    def __init__(self, store: DataStore, kernel: Kernel, client, *, block_rows: int | None = None,
                 prefetch: int | None = None, column_groups: int | None = None,
                 projections: str | None = None, cache_rows: bool | None = None):
        from dkha.cluster import total_threads

        self.projections = str(config.get("projections", projections))
        if self.projections not in PROJECTIONS:
            raise ParameterError(f"unknown projections {self.projections!r}; choose one of "
                                 f"{', '.join(PROJECTIONS)}")
        self.store = store
        self.kernel = kernel
        self.client = client
        self.block_rows = int(config.get("block-rows", block_rows))
        self.prefetch = max(1, int(config.get("prefetch", prefetch)))
        ng = config.get("column-groups", column_groups)
        if ng is None:
            ng = total_threads(client)
        self.column_groups = _groups_of_chunks(store, int(ng))
        self.all_ranges = tuple(r for g in self.column_groups for r in g)
        # square tiles for the MK row and evaluation: at most dkha.tile-rows rows a side, and
        # enough of them to keep every thread busy
        tile_rows = int(config.get("tile-rows"))
        threads = total_threads(client)
        n_tiles = max(2 * threads, -(-store.n_samples // tile_rows))
        self.tile_groups = _groups_of_chunks(store, n_tiles, max_rows=tile_rows)
        self.cache_rows = bool(config.get("row-cache", cache_rows))
        self._tiles: dict | None = None
        if self.cache_rows:
            # fewer, larger tiles: a row block takes one piece from each tile it meets, so the
            # tasks per block grow with the tile count; about 4 tiles a thread keeps all busy
            self.tile_groups = _groups_of_chunks(store, max(1, int(np.ceil(np.sqrt(8 * threads)))))
            self._check_cache_memory()
        self.mk: np.ndarray | None = None
        self.mkm: float | None = None
        self._mk_future = None
        self.stats = StreamStats()

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
            self._tiles = {(i, j): self.client.submit(kernel_tile, path, self.kernel, g[i], g[j],
                                                      pure=False)
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
        ``X`` (:func:`dkha.store.centering_key`), and read back instead of recomputed.
        ``self.centering`` describes the row in use.
        """
        from dkha.store import centering_key, read_centering, write_centering

        l = self.n_samples
        centering = {"kernel": self.kernel.name, "parameters": self.kernel.param_dict,
                     "centering": "exact"}
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
        self.set_mk(mk, float(mk.mean()))
        self.centering = dict(centering, cached=False)
        if key is not None:
            write_centering(self.store, key, self.mk, self.mkm)
        return self.mk, self.mkm

    def _mk_pass(self) -> np.ndarray:
        """The exact MK row: one pass over chunk pairs (tiles ``I ≤ J``)."""
        path, groups = self.store.path, self.tile_groups
        futures = []
        for i, gi in enumerate(groups):
            for j in range(i, len(groups)):
                if self.cache_rows:
                    fut = self.client.submit(tile_sums, self._tile(i, j), i == j, pure=False)
                else:
                    fut = self.client.submit(mk_tile, path, self.kernel, gi, groups[j], pure=False)
                futures.append(((i, j), fut))
        l = self.n_samples
        mk = np.zeros(l)
        bounds = [(g[0][0], g[-1][1]) for g in groups]
        for (i, j), fut in futures:
            colsum, rowsum = fut.result()
            a, b = bounds[j]
            mk[a:b] += colsum
            if rowsum is not None:
                c, d = bounds[i]
                mk[c:d] += rowsum
        return mk / l

    def _mk_sample(self, n: int, seed: int) -> np.ndarray:
        """The MK row estimated from ``n`` seeded random columns (pieces of ≤ ``dkha.tile-rows``)."""
        l = self.n_samples
        sample = np.sort(np.random.default_rng([int(seed), 4]).choice(l, size=n, replace=False))
        piece = int(config.get("tile-rows"))
        parts = [self.put(self.store.read_rows(sample[a:a + piece])) for a in range(0, n, piece)]
        groups = self.tile_groups
        futures = [[self.client.submit(mk_sample_tile, self.store.path, self.kernel, g, part,
                                       pure=False) for part in parts] for g in groups]
        mk = np.zeros(l)
        for g, futs in zip(groups, futures):      # fixed order: reproducible sums
            a, b = g[0][0], g[-1][1]
            for fut in futs:
                mk[a:b] += fut.result()
        return mk / n

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

    def put(self, array: np.ndarray):
        """A future holding ``array`` that the cluster can rebuild if the worker holding it dies.

        (Scattered data cannot be recomputed; a task that returns the array can.)
        """
        return self.client.submit(_identity, array, pure=False)

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
            from dkha.solvers.factored import FactoredState

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
        exhausted = False
        try:
            while True:
                while not exhausted and len(queue) < self.prefetch:
                    try:
                        tag, idx = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    idx = np.asarray(idx)
                    queue.append((tag, idx, self.submit_rows(idx, priority=-seq)))
                    seq += 1
                if not queue:
                    return
                tag, idx, futs = queue.popleft()
                t0 = time.perf_counter()
                parts = self.gather(futs, what=f"the block of rows {tag!r} (first sample {idx[0]})")
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
        exhausted = False
        solver.attach_replicas(replicas)
        try:
            replicas.build()
            while True:
                replicas.flush()
                if queue and queue[0][3].epoch != replicas.epoch:     # rebuilt: resubmit all
                    ahead = []
                    for entry in queue:
                        entry[3].cancel()
                        entry[3] = replicas.submit(entry[2], entry[1], list(ahead))
                        ahead.append((entry[1], entry[2]))
                while not exhausted and len(queue) < self.prefetch:
                    try:
                        tag, idx = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    idx = np.asarray(idx)
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

    def matmat(self, V: np.ndarray) -> np.ndarray:
        """``K' @ V`` for an ``l × k`` matrix: one blockwise pass over the tiles ``I ≤ J``."""
        V = np.ascontiguousarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat(V[:, None])[:, 0]
        mk = self._need_mk()
        Vf = self.put(V)
        g = self.tile_groups
        pairs = self._pairs()
        futs = [self.client.submit(product_pair, self.store.path, self.kernel, mk, self.mkm,
                                   g[i], g[j], Vf, tile=self._tile(i, j), pure=False)
                for i, j in pairs]
        out = np.zeros((self.n_samples, V.shape[1]))
        for (i, j), fut in zip(pairs, futs):  # fixed order: reproducible sums
            to_i, to_j = fut.result()
            a, b = self._bounds(g[i])
            out[a:b] += to_i
            if to_j is not None:
                c, d = self._bounds(g[j])
                out[c:d] += to_j
        return out

    def residual(self, C: np.ndarray) -> tuple[float, float]:
        """``(‖K'‖²_F, ‖K' − CᵀC‖²_F)`` in one blockwise pass (direct form, no cancellation)."""
        frob2, (res2,) = self.residuals([C])
        return frob2, res2

    def residuals(self, Cs: list[np.ndarray]) -> tuple[float, list[float]]:
        """``‖K'‖²_F`` and ``‖K' − CᵀC‖²_F`` for each ``C`` of ``Cs``, all in one blockwise pass."""
        Cs = tuple(np.ascontiguousarray(C, dtype=np.float64) for C in Cs)
        mk = self._need_mk()
        Cf = self.put(Cs)
        g = self.tile_groups
        futs = [self.client.submit(residual_pair, self.store.path, self.kernel, mk, self.mkm,
                                   g[i], g[j], Cf, tile=self._tile(i, j), pure=False)
                for i, j in self._pairs()]
        tot = np.zeros(1 + len(Cs))
        for f in futs:
            tot += f.result()
        return float(tot[0]), [float(v) for v in tot[1:]]

    def dense(self) -> np.ndarray:
        """``K'`` whole: only for small stores (dense E_min, tests)."""
        mk = self._need_mk()
        g = self.tile_groups
        pairs = self._pairs()
        futs = [self.client.submit(dense_pair, self.store.path, self.kernel, mk, self.mkm,
                                   g[i], g[j], tile=self._tile(i, j), pure=False) for i, j in pairs]
        out = np.empty((self.n_samples, self.n_samples))
        for (i, j), fut in zip(pairs, futs):
            K = fut.result()
            a, b = self._bounds(g[i])
            c, d = self._bounds(g[j])
            out[a:b, c:d] = K
            out[c:d, a:b] = K.T
        return out

    def transform(self, Xnew: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        mk = self._need_mk()
        return self.client.submit(project_rows, self.store.path, self.kernel, Xnew, mk, self.mkm,
                                  self.column_groups, alpha, pure=False).result()


# --- the coordinator's end of the replicas -------------------------------------------------------

_UPDATE_PRIORITY = 1        # replica updates before any block's tasks (those have priority −seq)
_POLL_SECONDS = 2.0         # waiting on pinned tasks: check this often that their workers live


@dataclass
class _PendingBlock:
    seq: int
    index: np.ndarray
    version: int            # the version of S̃ the partial projections use
    epoch: int              # the replicas' rebuild it was submitted to
    window_index: np.ndarray    # W ∪ P: the blocks ahead in the FIFO, then this one
    partials: list          # futures of (K'[P, J] S̃_v[:, J]ᵀ, K'[P, W ∩ J]), one per group
    offsets: dict           # block seq -> first column of its rows in the window

    def cancel(self) -> None:
        for f in self.partials:
            f.cancel()


@dataclass
class ProjectedBlock:
    """A block whose projections were computed on the workers (coordinator-math.md §4).

    ``partials`` (one ``b×m`` array per column group) sum to ``K'_P S̃_vᵀ`` for the version ``v``
    of ``S̃``; ``window`` is ``K'[P, W ∪ P]`` with the columns of block ``s`` from
    ``offsets[s]``: what the coordinator needs to bring the sum up to date
    (:meth:`WorkerReplicas.projections`).
    """

    seq: int
    index: np.ndarray
    version: int
    partials: list
    window: np.ndarray
    offsets: dict


class WorkerReplicas:
    """The coordinator's end of the worker-side replicas of ``S̃`` and ``C̃`` of one stream.

    It numbers the coordinator's messages (one per block, one per lone fold: the version of
    ``S̃`` is how many have been recorded), sends them to every replica in order, submits the
    blocks' tasks, turns their results into up-to-date projections, brings ``C̃`` home, and
    rebuilds the replicas when one is lost.
    """

    def __init__(self, engine: RowEngine, state):
        self.engine = engine
        self.client = engine.client
        self.state = state
        self.run_id = uuid.uuid4().hex
        self.epoch = -1
        self.groups = engine.column_groups
        self.bounds = [(g[0][0], g[-1][1]) for g in self.groups]
        self.log: collections.deque = collections.deque()     # (version, seq, index, ops)
        self.version = 0        # messages recorded (the coordinator's S̃)
        self.sent = 0           # messages sent to the replicas
        self.keep_from = 0      # the oldest version a block in flight was submitted on
        self.updates: list = []     # per group: the future of its latest build or update
        self.workers: list[str] = []
        self.rebuilds = 0

    def _key(self, g: int) -> tuple:
        return (self.run_id, self.epoch, g)

    def _pinned(self, g: int, func, *args, priority: int):
        return self.client.submit(func, *args, workers=[self.workers[g]],
                                  allow_other_workers=False, priority=priority, pure=False)

    # -- replicas --
    def build(self) -> None:
        """(Re)build every replica from the coordinator's state, on the workers present now."""
        st, eng = self.state, self.engine
        threads = sorted(self.client.nthreads().items())
        if not threads:
            raise ClusterLostError("no Dask workers to hold the replicas of S̃")
        slots = [addr for addr, n in threads for _ in range(max(1, int(n)))]
        self.epoch += 1
        self.workers = [slots[g % len(slots)] for g in range(len(self.groups))]
        S_A = None
        if st.keeps_c and st.c_stale:                # C̃ is recomputed there: C̃ = S̃_A K'
            S_A = eng.put(np.array(st.S_tilde[:st.r]))
        mk = eng._need_mk()
        self.updates = []
        for g, (lo, hi) in enumerate(self.bounds):
            C = np.array(st.C_tilde[:, lo:hi]) if st.keeps_c and S_A is None else None
            self.updates.append(self._pinned(
                g, replica_build, self._key(g), self.groups[g], self.version,
                np.array(st.S_tilde[:, lo:hi]), C, S_A, eng.store.path, eng.kernel, mk, eng.mkm,
                eng.all_ranges, priority=_UPDATE_PRIORITY))
        self.sent = self.version

    def recover(self, exc: ReplicaLostError) -> None:
        """Rebuild after a lost replica, or raise ``exc`` once the rebuilds are used up."""
        if self.rebuilds >= self.engine.replica_rebuilds:
            raise exc
        self.rebuilds += 1
        self.engine.stats.replica_rebuilds += 1
        log.warning("rebuilding the worker replicas of S̃ (%d of at most %d): %s", self.rebuilds,
                    self.engine.replica_rebuilds, exc)
        self.build()

    def close(self) -> None:
        """Drop the replicas (after the updates in flight, so that none fails)."""
        try:
            self._wait(list(self.updates), what="the last replica updates")
        except Exception as exc:  # noqa: BLE001 - cleanup of a stream that is over
            log.debug("replica updates of run %s did not finish: %s", self.run_id, exc)
        try:
            self.client.run(drop_replicas, self.run_id, on_error="ignore")
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - no cluster: nothing to drop
            log.debug("could not drop the replicas of run %s: %s", self.run_id, exc)

    # -- messages --
    def record_block(self, block: ProjectedBlock, ops: list) -> None:
        """Record the message of ``block`` (the operations the solver appended to ``ops``)."""
        self.version += 1
        self.log.append((self.version, block.seq, block.index, tuple(ops)))

    def record_fold(self, F: np.ndarray) -> None:
        """Record a fold of ``T`` into ``S̃`` made outside a block (a pass start)."""
        self.version += 1
        self.log.append((self.version, None, None, (("fold", F),)))

    def flush(self) -> None:
        """Send the recorded messages to every replica, in order."""
        for version, seq, index, ops in self.log:
            if version <= self.sent:
                continue
            nbytes = sum(x.nbytes for op in ops for x in op if isinstance(x, np.ndarray))
            for g in range(len(self.groups)):
                self.updates[g] = self._pinned(g, replica_update, self._key(g), version, seq,
                                               index, ops, self.keep_from, self.updates[g],
                                               priority=_UPDATE_PRIORITY)
            self.engine.stats.bytes_sent += nbytes * len(self.groups)
            self.sent = version

    def trim(self) -> None:
        """Forget the messages no block in flight can need (versions ≤ ``keep_from``)."""
        while self.log and self.log[0][0] <= self.keep_from:
            self.log.popleft()

    # -- blocks --
    def submit(self, seq: int, index: np.ndarray, ahead: list) -> _PendingBlock:
        """The tasks of block ``seq`` on the current version; ``ahead``: ``(index, seq)`` of the
        blocks before it in the FIFO, whose columns its window holds."""
        eng = self.engine
        assert self.sent == self.version, "flush before submitting"
        mk = eng._need_mk()
        offsets, pos = {}, 0
        for idx, s in ahead:
            offsets[s] = pos
            pos += len(idx)
        offsets[seq] = pos
        window_index = np.concatenate([idx for idx, _ in ahead] + [index])
        keep = bool(self.state.keeps_c)
        partials = [self._pinned(g, replica_project, self._key(g), eng.store.path, eng.kernel,
                                 mk, eng.mkm, eng.all_ranges, cols, index, window_index,
                                 self.version, seq, keep, self.updates[g], priority=-seq)
                    for g, cols in enumerate(self.groups)]
        return _PendingBlock(seq, index, self.version, self.epoch, window_index, partials, offsets)

    def _wait(self, futures: list, what: str) -> list:
        """Gather ``futures`` (tasks pinned to the replicas' workers), checking every
        ``_POLL_SECONDS`` that those workers are still in the cluster."""
        for f in futures:
            while not f.done():
                try:
                    f.result(timeout=_POLL_SECONDS)
                except TimeoutError:
                    if f.done():
                        break
                    alive = set(self.client.nthreads())
                    gone = sorted({w for w in self.workers if w not in alive})
                    if gone:
                        raise ReplicaLostError(f"worker {', '.join(gone)} holding replicas of S̃ "
                                               f"left the cluster while computing {what}") from None
                except Exception:  # noqa: BLE001 - done with an error: gather raises it, named
                    break
        return self.engine.gather(futures, what=what)

    def wait_block(self, pending: _PendingBlock, what: str) -> ProjectedBlock:
        results = self._wait(pending.partials, what)
        w = pending.window_index
        window = np.empty((len(pending.index), len(w)))
        for (lo, hi), (Y, part) in zip(self.bounds, results):
            window[:, (w >= lo) & (w < hi)] = part
        self.engine.stats.bytes_received += sum(Y.nbytes + part.nbytes for Y, part in results)
        return ProjectedBlock(pending.seq, pending.index, pending.version,
                              [Y for Y, _ in results], window, pending.offsets)

    def projections(self, block: ProjectedBlock) -> tuple[np.ndarray, np.ndarray]:
        """``(Y₀ᵀ, K'[P, P])`` for ``block`` on the coordinator's current ``S̃``: the partials
        summed, then every message since their version replayed (coordinator-math.md §4)."""
        from dkha.solvers.factored import replay_message

        Y = np.array(block.partials[0])
        for part in block.partials[1:]:
            Y += part
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
                self.engine.stats.messages_replayed += 1
        off, b = block.offsets[block.seq], len(block.index)
        return Y, np.ascontiguousarray(block.window[:, off:off + b])

    # -- pass ends --
    def synchronise(self) -> np.ndarray | None:
        """Check every replica of ``S̃`` against the coordinator's and return the current ``C̃``
        (``r×l``; ``None`` where ``C`` is not kept). At pass ends and when the stream closes."""
        st = self.state
        while True:
            self.flush()
            futures = [self._pinned(g, replica_columns, self._key(g), self.version,
                                    self.updates[g], priority=_UPDATE_PRIORITY)
                       for g in range(len(self.groups))]
            try:
                results = self._wait(futures, what="C̃ from the replicas")
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
            return None
        C = np.concatenate([c for c, _ in results], axis=1)
        self.engine.stats.bytes_received += C.nbytes
        return C
