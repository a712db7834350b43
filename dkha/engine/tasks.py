"""The worker side of the row engine: module-level pure functions of blocks and scalars that run
as Dask tasks, and the per-process registries they keep (the chunk cache, the replicas of ``S̃``).

:func:`center_block` is the one centering function (coordinator-math.md §1); every path (fit,
evaluation, transform) goes through it::

    K'[P, J] = K[P, J] - mk[J] - mk[P][:, None] + mkm

Workers read the data store's chunks once and keep them in a per-process cache
(:func:`load_rows`). The replicas of ``S̃[:, J]`` (and ``C̃[:, J]``) for the projections on the
workers (coordinator-math.md §4) live in a per-process registry too, updated by small tasks
pinned to their worker (:func:`replica_build`, :func:`replica_project`, which applies the
coordinator's messages it carries before it projects).
The coordinator's classes that submit these tasks are :mod:`dkha.engine.rows` and
:mod:`dkha.engine.replicas`; nothing here imports them.
"""

from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass, field

import numpy as np
from distributed import get_worker

from dkha import tiles
from dkha.data.store import read_slice
from dkha.engine.budget import FLOOR_BYTES
from dkha.errors import BlockFailedError
from dkha.kernels import Kernel
from dkha.names import config_default
from dkha.solvers.factored import apply_message


def worker_has_gpu() -> bool:
    """Whether this process is a Dask worker that declares a ``GPU`` resource (``dask worker
    --resources GPU=1``): where ``device="auto"`` computes kernel tiles with CuPy."""
    try:
        return float(get_worker().state.total_resources.get("GPU", 0)) > 0
    except ValueError:              # not in a worker
        return False


tiles.set_gpu_probe(worker_has_gpu)


# --- the centering function ---------------------------------------------------------------------


def center_block(K: np.ndarray, mk_rows: np.ndarray, mk_cols: np.ndarray, mkm: float) -> np.ndarray:
    """Center a kernel block in place: ``K - mk_cols[None, :] - mk_rows[:, None] + mkm``.

    For new data, ``mk_rows`` is ``k̄(x) = mean_j k(x, x_j)`` and ``mk_cols`` the training mk.
    """
    K -= mk_cols[None, :]
    K -= (mk_rows - mkm)[:, None]
    return K


# --- per-process chunk cache (worker side) -----------------------------------------------------

_CACHE: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()
_CACHE_BYTES = 0
_CACHE_LOCK = threading.Lock()


class StorePath(str):
    """A store's path as the tasks get it, with the sizes of the per-process caches of the
    processes that read it, resolved at the edge (the worker's caches travel in the task): the
    chunks' (``dkha.cache-bytes``, :func:`load_rows`) and the prepared columns'
    (:func:`column_operands`, a quarter of ``dkha.memory-budget``). A plain path, or rows held
    in this process: the package defaults."""

    cache_bytes: float = float(config_default("cache-bytes"))
    columns_bytes: int = FLOOR_BYTES // 4

    def __new__(cls, path: str, cache_bytes, columns_bytes: int):
        s = super().__new__(cls, path)
        s.cache_bytes, s.columns_bytes = float(cache_bytes), int(columns_bytes)
        return s

    def __reduce__(self):
        return StorePath, (str(self), self.cache_bytes, self.columns_bytes)


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


    arr = np.ascontiguousarray(read_slice(zarr.open_group(path, mode="r")["X"], start, stop, path))
    arr.setflags(write=False)
    limit = float(getattr(path, "cache_bytes", StorePath.cache_bytes))
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = arr
            _CACHE_BYTES += arr.nbytes
            while _CACHE_BYTES > limit and len(_CACHE) > 1:
                _, old = _CACHE.popitem(last=False)
                _CACHE_BYTES -= old.nbytes
    return arr


def store_key(path: str | np.ndarray) -> tuple:
    """What identifies a task source in a per-process cache: a store's path and the identity of
    its ``X`` (:func:`load_rows`), or rows held in memory by the array's identity (the caller
    keeps the array referenced, so its id is not reused)."""
    if isinstance(path, np.ndarray):
        return (id(path), path.__array_interface__["data"][0], path.shape)
    return (path, _store_token(path))


def load_all_rows(path: str | np.ndarray, n_samples: int) -> np.ndarray:
    """Every row of a store's ``X`` (or the rows held in memory) in one read, not cached here:
    a worker that keeps the whole of ``X`` resident (:mod:`dkha.engine.device`) reads it once."""
    if isinstance(path, np.ndarray):
        return path[:n_samples]
    import zarr

    return np.ascontiguousarray(read_slice(zarr.open_group(path, mode="r")["X"], 0, n_samples,
                                           path))


def clear_cache() -> None:
    global _CACHE_BYTES
    with _CACHE_LOCK:
        _CACHE.clear()
        _CACHE_BYTES = 0
    with _COLUMNS_LOCK:
        _COLUMNS.clear()


# --- worker tasks: module-level pure functions of blocks and scalars ----------------------------


def release(futures) -> None:
    """Let go of tasks that are no longer wanted (a pass or a block stream ended early, e.g. on a
    stop): each future released, as dropping it would, so the scheduler forgets what nothing
    else needs. Not ``cancel``: the scheduler cancels a cancelled task's dependents with it, and
    cancelling one of those dependents afterwards (a band's partial sum whose earlier partials
    the client let go, a block's combined projections) trips its ``assert ts.who_wants`` in
    ``stimulus_cancel``: "Exception while handling op register-client", "Task exception was
    never retrieved" and futures "cancelled for reason: lost dependencies" in the log."""
    for f in futures:
        f.release()


def identity(x):
    return x


def accumulate(partial: np.ndarray | None, *pieces: list) -> np.ndarray:
    """``partial + p₁ + p₂ + …`` added one after the other in the order given (``partial`` None:
    zeros), each piece ``[result, k]`` the ``k``-th item of a task's result (``k`` None: the
    result).

    The band sums of a tile pass (:meth:`dkha.engine.passes.ClusterPasses.reduced_pass`) chain these
    on the workers: a band's pieces are added in the pass's fixed order whatever the grouping
    into tasks, so the sum is the one the coordinator made adding every piece itself, bit for
    bit, and the coordinator receives one band instead of every piece."""
    items = [result if k is None else result[k] for result, k in pieces]
    out = np.zeros(items[0].shape) if partial is None else partial.copy()
    for item in items:
        out += item
    return out



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


def group_rows(path: str, ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    parts = [load_rows(path, a, b) for a, b in ranges]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _kernel_tile(path: str, kernel: Kernel, gi: tuple, gj: tuple) -> np.ndarray:
    """The uncentered tile ``K[I, J]`` for chunk-range groups ``I`` and ``J`` (a new array)."""
    XI = group_rows(path, gi)
    return kernel.block(XI, XI if gi == gj else group_rows(path, gj))


def mk_tile(path: str, kernel: Kernel, rows_i: tuple,
            rows_j: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """Column sums (over I) and, for an off-diagonal tile, row sums (over J) of ``K[I, J]``
    (summed while each panel of the tile is in cache: the tile is never written out)."""
    XI = group_rows(path, rows_i)
    XJ = XI if rows_i == rows_j else group_rows(path, rows_j)
    _, _, rowsum, colsum = kernel.products(XI, XJ, sums=True)
    return colsum, (None if rows_i == rows_j else rowsum)


def diagonal_rows(path: str, kernel: Kernel, ranges: tuple) -> np.ndarray:
    """``k(x, x)`` for the rows of the chunk ranges ``ranges``."""
    return kernel.diagonal(group_rows(path, ranges))


def mk_sample_tile(path: str, kernel: Kernel, rows_i: tuple, XS: np.ndarray) -> np.ndarray:
    """Row sums of ``K[I, S]`` for the sampled samples ``XS`` (the estimated MK row)."""
    return kernel.products(group_rows(path, rows_i), XS, sums=True)[2]


def block_rows(path: str, ranges: tuple[tuple[int, int], ...], kernel: Kernel, mk: np.ndarray,
               mkm: float, index: np.ndarray, cols: tuple) -> np.ndarray:
    """``K'[index, J]`` for the column group ``J`` (chunk ranges ``cols``): ``X[index]`` taken
    from the chunk ranges ``ranges`` (:func:`take_rows`), one GEMM and one fused sweep
    (:mod:`dkha.tiles`), in the kernel's precision (float32 rows: half the bytes, and the
    coordinator's block GEMMs in float32, its state in float64)."""
    return _centered_rows(take_rows(path, ranges, index), path, kernel, mk, mkm, index, cols)


def _centered_rows(XP: np.ndarray, path: str, kernel: Kernel, mk: np.ndarray, mkm: float,
                   index: np.ndarray, cols: tuple, out: np.ndarray | None = None) -> np.ndarray:
    return kernel.centered_block(XP, column_operands(path, kernel, cols), mk[index],
                                 mk[cols[0][0]:cols[-1][1]], mkm, dtype=kernel.precision, out=out)


def grouped_block_rows(path: str, ranges: tuple[tuple[int, int], ...], kernel: Kernel,
                       mk: np.ndarray, mkm: float, index: np.ndarray, groups: tuple) -> np.ndarray:
    """``K'[index, J]`` for ``J`` the consecutive column groups ``groups`` in one task, one tile
    a group as :func:`block_rows` computes it, written into its columns of the block: float32
    tiles shift by their column group's mean, so a block keeps the layout's groups (the fit's
    bits) while the cluster decides how many tasks compute it (one, where the blocks in flight
    keep every thread busy: no task a piece, no join, no array a piece)."""
    XP = take_rows(path, ranges, index)
    if len(groups) == 1:
        return _centered_rows(XP, path, kernel, mk, mkm, index, groups[0])
    a0 = groups[0][0][0]
    out = np.empty((len(index), groups[-1][-1][1] - a0), dtype=kernel.precision)
    for g in groups:
        _centered_rows(XP, path, kernel, mk, mkm, index, g, out[:, g[0][0] - a0:g[-1][1] - a0])
    return out


@dataclass
class _Held:
    """Prepared columns of rows held in memory, with the array they came from."""

    columns: object
    source: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.columns.nbytes


_COLUMNS: collections.OrderedDict = collections.OrderedDict()
_COLUMNS_LOCK = threading.Lock()
#: column blocks kept prepared per process (a stream uses one per column group of its worker:
#: up to the layout's 16 on one worker thread, ``budget.LAYOUT_THREADS``), together at most a
#: quarter of ``dkha.memory-budget`` (larger ones are prepared for each block)
COLUMNS_KEPT = 16


def column_operands(path: str | np.ndarray, kernel: Kernel, cols: tuple):
    """The rows of column group ``cols`` prepared for the kernel's tiles
    (:meth:`~dkha.kernels.Kernel.prepared_columns`), kept per process (in at most the path's
    ``columns_bytes``, :class:`StorePath`) for the next block of the stream: every block's tile
    is against the same columns, and joining their chunks, their norms and (float32) their
    shift and cast cost ``O(|J| n)`` a block — 0.5 s of a pass at l = 20 000. The same numbers
    as preparing them each time."""
    try:
        # the ranges as plain ints: a stream's groups come as arrays, which do not hash
        key = (store_key(path), tuple((int(a), int(b)) for a, b in cols), kernel)
        hash(key)
    except TypeError:       # a kernel with unhashable parameters: prepared each time
        return kernel.prepared_columns(group_rows(path, cols))
    with _COLUMNS_LOCK:
        got = _COLUMNS.get(key)
        if got is not None:
            _COLUMNS.move_to_end(key)
            return got.columns if isinstance(got, _Held) else got
    got = kernel.prepared_columns(group_rows(path, cols))
    limit = int(getattr(path, "columns_bytes", StorePath.columns_bytes))
    if getattr(got, "nbytes", limit + 1) > limit:
        return got
    with _COLUMNS_LOCK:
        # an array source is kept referenced with its columns: its id is not reused meanwhile
        _COLUMNS[key] = got if not isinstance(path, np.ndarray) else _Held(got, path)
        while len(_COLUMNS) > COLUMNS_KEPT or sum(c.nbytes for c in _COLUMNS.values()) > limit:
            _COLUMNS.popitem(last=False)
    return got


def _centered_tile(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                   tile: np.ndarray | None = None):
    """``K'[I, J]``, computed, or centered from a copy of the cached tile ``K[I, J]``."""
    a, b = gi[0][0], gi[-1][1]
    c, d = gj[0][0], gj[-1][1]
    if tile is not None:
        return center_block(np.array(tile), mk[a:b], mk[c:d], mkm), (a, b), (c, d)
    XI = group_rows(path, gi)
    XJ = XI if gi == gj else group_rows(path, gj)
    return kernel.centered_block(XI, XJ, mk[a:b], mk[c:d], mkm), (a, b), (c, d)


def product_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                 V: np.ndarray, tile: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """``K'[I, J] V[J]`` and, off the diagonal, ``K'[J, I] V[I]`` (K' is symmetric).

    From a cached tile the centering is applied to the products, not the tile (no copy):
    ``K'[I, J] V[J] = K V[J] − 1 (mk[J]ᵀ V[J]) − (mk[I] − mkm) (1ᵀ V[J])``.
    """
    a, b = gi[0][0], gi[-1][1]
    c, d = gj[0][0], gj[-1][1]
    if tile is None:        # fused: each panel of K'[I, J] multiplied while it is in cache
        XI = group_rows(path, gi)
        XJ = XI if gi == gj else group_rows(path, gj)
        to_i, to_j, _, _ = kernel.products(XI, XJ, V[c:d], None if gi == gj else V[a:b],
                                           mk[a:b], mk[c:d], mkm)
        return to_i, to_j

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
    if tile is None:        # fused: each panel of K'[I, J] reduced while it is in cache
        a, b = gi[0][0], gi[-1][1]
        c, d = gj[0][0], gj[-1][1]
        XI = group_rows(path, gi)
        XJ = XI if gi == gj else group_rows(path, gj)
        out = kernel.residuals(XI, XJ, Cs, slice(a, b), slice(c, d), mk[a:b], mk[c:d], mkm)
        return out if gi == gj else 2.0 * out
    K, (a, b), (c, d) = _centered_tile(path, kernel, mk, mkm, gi, gj, tile)
    out = np.empty(1 + len(Cs))
    out[0] = np.einsum("ij,ij->", K, K)
    R = np.empty_like(K) if len(Cs) > 1 else K
    for m, C in enumerate(Cs):
        np.subtract(K, C[:, a:b].T @ C[:, c:d], out=R)
        out[1 + m] = np.einsum("ij,ij->", R, R)
    return out if gi == gj else 2.0 * out


def product_tiles(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, pairs: list,
                  V: np.ndarray, tiles: list | None = None) -> tuple:
    """:func:`product_pair` of each tile ``(gi, gj)`` of ``pairs`` in turn, their results one
    after the other (``2 · len(pairs)`` items): a task of several tiles gives the pieces one
    task per tile gives, so the band sums, added in the pass's order, do not depend on how the
    tiles were grouped into tasks (:mod:`dkha.engine.budget`'s ``tiles_per_task``)."""
    out: list = []
    for k, (gi, gj) in enumerate(pairs):
        out.extend(product_pair(path, kernel, mk, mkm, gi, gj, V,
                                tile=None if tiles is None else tiles[k]))
    return tuple(out)


def mk_tiles(path: str, kernel: Kernel, pairs: list) -> tuple:
    """:func:`mk_tile` of each tile ``(rows_i, rows_j)`` of ``pairs`` in turn, their results one
    after the other (as :func:`product_tiles`)."""
    out: list = []
    for rows_i, rows_j in pairs:
        out.extend(mk_tile(path, kernel, rows_i, rows_j))
    return tuple(out)


def residual_tiles(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, pairs: list,
                   Cs: tuple, tiles: list | None = None) -> np.ndarray:
    """:func:`residual_pair` of each tile of ``pairs``, one row each (the coordinator adds the
    rows in the pass's order)."""
    return np.stack([residual_pair(path, kernel, mk, mkm, gi, gj, Cs,
                                   tile=None if tiles is None else tiles[k])
                     for k, (gi, gj) in enumerate(pairs)])


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


#: bytes of the kernel rows of new samples a projection task holds at once (a block of the new
#: samples' rows against every training sample: the centering needs each row whole)
PROJECTION_BYTES = 64 * 2**20


def project_rows(path: str, kernel: Kernel, Xnew: np.ndarray, mk: np.ndarray, mkm: float,
                 groups: tuple, alpha: np.ndarray) -> np.ndarray:
    """Projections ``alpha · k'(x)`` of new samples on the components (sample × component),
    :data:`PROJECTION_BYTES` of kernel rows at a time: before, a task held the kernel rows of
    all its samples (a chunk of 2 048 new samples against 100 000 training ones: 1.6 GB a
    thread)."""
    l = len(mk)
    out = np.zeros((len(Xnew), alpha.shape[0]))
    step = max(1, PROJECTION_BYTES // (8 * max(1, l)))
    for a in range(0, len(Xnew), step):
        X = Xnew[a:a + step]
        Ks = [kernel.block(X, group_rows(path, cols)) for cols in groups]
        kbar = sum(K.sum(axis=1) for K in Ks) / l
        for cols, K in zip(groups, Ks):
            c, d = cols[0][0], cols[-1][1]
            out[a:a + step] += center_block(K, kbar, mk[c:d], mkm) @ alpha[:, c:d].T
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
    XJ = group_rows(path, cols)
    out = np.zeros((d - c, S_A.shape[0]))
    for a, b in ranges:
        X = load_rows(path, a, b)
        for i in range(a, b, rows_per_tile):
            k = min(i + rows_per_tile, b)
            out += kernel.products(X[i - a:k - a], XJ, W=S_A[:, i:k].T, mk_rows=mk[i:k],
                                   mk_cols=mk[c:d], mkm=mkm)[1]
    return out.T


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
    rep = _Replica(int(cols[0][0]), int(cols[-1][1]), int(version), {int(version): S}, C, {})
    with _REPLICAS_LOCK:
        for old in [k for k in _REPLICAS if k[0] == key[0] and k[2] == key[2] and k[1] < key[1]]:
            del _REPLICAS[old]
        _REPLICAS[key] = rep
    return int(version)


def _needs_kernel(rep: _Replica, seq: int | None, ops) -> bool:
    """Whether message ``ops`` of block ``seq`` updates ``C̃`` (and so needs ``K'[P, J]``)."""
    return rep.C is not None and seq is not None and any(op[0] in ("c", "direct") for op in ops)


def _apply(rep: _Replica, version: int, index, ops, K, keep_from: int) -> None:
    """Message ``version`` applied to ``rep`` (at ``version − 1``; under its lock): a new
    snapshot of ``S̃``, ``C̃`` in place; snapshots older than ``keep_from`` dropped."""
    S = np.array(rep.snapshots[rep.version])          # copy on write: snapshots stay valid
    apply_message(S, rep.C, rep.lo, rep.hi, index, ops, K)
    S.setflags(write=False)
    rep.snapshots[version] = S
    rep.version = version
    for v in [v for v in rep.snapshots if v < keep_from and v != version]:
        del rep.snapshots[v]


@dataclass(frozen=True)
class Carry:
    """The coordinator's messages ``(version, seq, index, ops)`` a task carries to replicas, in
    order: one object, which Dask neither walks nor reads as tasks."""

    messages: tuple = ()


def _caught_up(keys: list, carry: Carry, keep_from: int, what: str) -> list | None:
    """The replicas ``keys`` of one worker thread, each brought up to the last message ``carry``
    holds: those it has not applied yet, in order, each the one after its version. None where
    their run has ended here."""
    reps = []
    for key in keys:
        rep = _replica(key, what)
        if rep is None:
            return None
        with rep.lock:
            for version, seq, index, ops in (m for m in carry.messages if m[0] > rep.version):
                if rep.version != version - 1:
                    raise ReplicaLostError(f"the replica of column group {key[2]} is at version "
                                           f"{rep.version}; message {version} needs {version - 1}")
                K = rep.blocks.pop(seq, None) if _needs_kernel(rep, seq, ops) else None
                if K is None and _needs_kernel(rep, seq, ops):
                    raise ReplicaLostError(f"the replica of column group {key[2]} lacks the "
                                           f"kernel block of block {seq} for message {version}")
                _apply(rep, version, index, ops, K, keep_from)
        reps.append(rep)
    return reps


def replica_replay(key: tuple, cols: tuple, s_version: int, S: np.ndarray, c_version: int,
                   C: np.ndarray | None, messages: list, keep_from: int, path: str, kernel: Kernel,
                   mk: np.ndarray, mkm: float, ranges: tuple) -> int:
    """Rebuild the replica ``key`` exactly from bases the coordinator kept: ``S̃[:, J]`` as it
    was at ``s_version`` and ``C̃[:, J]`` at ``c_version ≥ s_version`` (``None``: not kept), then
    every message since, in order, with the kernel blocks ``K'[P, J]`` recomputed as
    :func:`replica_project` computed them (the same function of the same data: the same numbers).
    The replica ends where the lost one was, bit for bit, with the snapshots of ``S̃`` from
    ``keep_from`` on (the blocks in flight resubmit on their own versions). Returns its version.
    """
    replica_build(key, cols, s_version, S, None)
    rep = _REPLICAS[key]
    with rep.lock:
        for v, _, index, ops in (m for m in messages if m[0] <= c_version):
            _apply(rep, v, index, ops, None, keep_from)     # S̃ alone, up to C̃'s base
        if C is not None:
            rep.C = np.array(C, dtype=np.float64, order="C")
        for v, seq, index, ops in (m for m in messages if m[0] > c_version):
            K = None
            if _needs_kernel(rep, seq, ops):
                K = block_rows(path, ranges, kernel, mk, mkm, index, cols)
            _apply(rep, v, index, ops, K, keep_from)
        return rep.version


def replica_project(keys: list, path: str, kernel: Kernel, mk: np.ndarray, mkm: float,
                    ranges: tuple, cols: list, index: np.ndarray, window_index: np.ndarray,
                    version: int, seq: int, keep: bool, messages: Carry, keep_from: int, after
                    ) -> list | None:
    """The one task of a block for the column groups of one worker thread (their replicas
    ``keys``, chunk ranges ``cols``): the coordinator's ``messages`` since this thread's last
    task applied first (:func:`_catch_up`; ``after``, that task's future, only orders them),
    then for each group ``J``, in order, ``K'[P, J] S̃_v[:, J]ᵀ`` (``b×m``) on the replica's
    snapshot of version ``v = version`` and the window columns that fall in ``J``: ``K'[P, w]``
    for the entries ``w`` of ``window_index`` in ``J``, in their order. The coordinator sums the
    groups' partials in the layout's group order, whichever threads computed them.

    With ``keep``, ``K'[P, J]`` stays with the replica for the ``C̃`` update of block ``seq``.
    """
    reps = _caught_up(keys, messages, keep_from, f"the projections of block {seq}")
    if reps is None:
        return None
    window_index = np.asarray(window_index)
    out = []
    for key, rep, c in zip(keys, reps, cols):
        K = block_rows(path, ranges, kernel, mk, mkm, index, c)
        lo, hi = c[0][0], c[-1][1]
        in_group = window_index[(window_index >= lo) & (window_index < hi)]
        with rep.lock:
            S = rep.snapshots.get(version)
            if S is None:
                raise ReplicaLostError(f"the replica of column group {key[2]} no longer holds "
                                       f"version {version} (now at {rep.version})")
            if keep:
                rep.blocks[seq] = K
        out.append((K @ S.T, K[:, in_group - lo]))           # snapshots are immutable: no lock
    return out


def replica_columns(keys: list, version: int, messages: Carry, keep_from: int, after
                    ) -> list | None:
    """For each replica ``keys`` of one worker thread, brought up to ``version`` by the carried
    ``messages``: ``C̃[:, J]`` (a copy; None where not kept) and the row sums of squares of
    ``S̃[:, J]``."""
    reps = _caught_up(keys, messages, keep_from, f"C̃ at version {version}")
    if reps is None:
        return None
    out = []
    for key, rep in zip(keys, reps):
        with rep.lock:
            if rep.version != version:
                raise ReplicaLostError(f"the replica of column group {key[2]} is at version "
                                       f"{rep.version}, not {version}")
            S = rep.snapshots[version]
            C = None if rep.C is None else np.array(rep.C)
        out.append((C, np.einsum("ij,ij->i", S, S)))
    return out


def drop_replicas(run_id: str) -> int:
    """Drop every replica of run ``run_id`` in this process; returns how many."""
    with _REPLICAS_LOCK:
        _DROPPED.append(run_id)
        keys = [k for k in _REPLICAS if k[0] == run_id]
        for k in keys:
            del _REPLICAS[k]
    return len(keys)
