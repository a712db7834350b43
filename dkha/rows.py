"""Centered kernel rows and the MK row, computed blockwise on Dask workers.

The centered kernel (coordinator-math.md §1) is never formed whole::

    K'[P, J] = K[P, J] - mk[J] - mk[P][:, None] + mkm

:func:`center_block` is the one centering function; every path (fit, evaluation, transform)
goes through it. :class:`RowEngine` owns the data path on the cluster: workers read the data
store's chunks once and keep them in a per-process cache (:func:`load_rows`), compute the MK row
tile by tile, the centered row blocks of the schedule ahead of the coordinator (a bounded FIFO
of futures in schedule order), and the blockwise products ``K' V`` that evaluation needs.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from dkha import config
from dkha.errors import BlockFailedError, ClusterLostError
from dkha.kernels import Kernel
from dkha.store import DataStore

log = logging.getLogger(__name__)


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


def load_rows(path: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a store's ``X`` (one chunk range), cached per process.

    The cache is an LRU bounded by ``dkha.cache-bytes``; a chunk is read from zarr once per
    process, not once per block.
    """
    global _CACHE_BYTES
    key = (path, start, stop)
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


def mk_tile(path: str, kernel: Kernel, rows_i: tuple, rows_j: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """Column sums (over I) and, for an off-diagonal tile, row sums (over J) of ``K[I, J]``."""
    XI = _group_rows(path, rows_i)
    if rows_i == rows_j:
        return kernel.block(XI, XI).sum(axis=0), None
    K = kernel.block(XI, _group_rows(path, rows_j))
    return K.sum(axis=0), K.sum(axis=1)


def centered_rows(path: str, kernel: Kernel, XP: np.ndarray, mk: np.ndarray, mkm: float,
                  index: np.ndarray, cols: tuple) -> np.ndarray:
    """``K'[index, J]`` for the column group ``J`` (chunk ranges ``cols``)."""
    a, b = cols[0][0], cols[-1][1]
    K = kernel.block(XP, _group_rows(path, cols))
    return center_block(K, mk[index], mk[a:b], mkm)


def _centered_tile(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple):
    a, b = gi[0][0], gi[-1][1]
    c, d = gj[0][0], gj[-1][1]
    XI = _group_rows(path, gi)
    XJ = XI if gi == gj else _group_rows(path, gj)
    return center_block(kernel.block(XI, XJ), mk[a:b], mk[c:d], mkm), (a, b), (c, d)


def product_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                 V: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``K'[I, J] V[J]`` and, off the diagonal, ``K'[J, I] V[I]`` (K' is symmetric)."""
    K, (a, b), (c, d) = _centered_tile(path, kernel, mk, mkm, gi, gj)
    return K @ V[c:d], (None if gi == gj else K.T @ V[a:b])


def residual_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple,
                  C: np.ndarray) -> np.ndarray:
    """``[‖K'[I,J]‖², ‖K'[I,J] − C[:,I]ᵀ C[:,J]‖²]``, doubled off the diagonal (both halves)."""
    K, (a, b), (c, d) = _centered_tile(path, kernel, mk, mkm, gi, gj)
    out = np.empty(2)
    out[0] = np.einsum("ij,ij->", K, K)
    K -= C[:, a:b].T @ C[:, c:d]
    out[1] = np.einsum("ij,ij->", K, K)
    return out if gi == gj else 2.0 * out


def dense_pair(path: str, kernel: Kernel, mk: np.ndarray, mkm: float, gi: tuple, gj: tuple) -> np.ndarray:
    """``K'[I, J]`` (small stores only)."""
    return _centered_tile(path, kernel, mk, mkm, gi, gj)[0]


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


# --- the engine ---------------------------------------------------------------------------------


@dataclass
class StreamStats:
    """What the block stream measured: blocks, rows, seconds waited, bytes received."""

    blocks: int = 0
    rows: int = 0
    wait_seconds: float = 0.0
    bytes_received: int = 0
    history: list = field(default_factory=list)


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
    """

    def __init__(self, store: DataStore, kernel: Kernel, client, *, block_rows: int | None = None,
                 prefetch: int | None = None, column_groups: int | None = None):
        from dkha.cluster import total_threads

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
        self.mk: np.ndarray | None = None
        self.mkm: float | None = None
        self._mk_future = None
        self.stats = StreamStats()

    @property
    def n_samples(self) -> int:
        return self.store.n_samples

    # -- MK row --
    def compute_mk(self) -> tuple[np.ndarray, float]:
        """The MK row ``mk_j = (1/l) Σ_i k(x_i, x_j)`` and ``mkm``: one pass over chunk pairs."""
        path, groups = self.store.path, self.tile_groups
        futures = []
        for i, gi in enumerate(groups):
            for j in range(i, len(groups)):
                futures.append(((i, j), self.client.submit(mk_tile, path, self.kernel, gi, groups[j],
                                                           pure=False)))
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
        mk /= l
        self.set_mk(mk, float(mk.mean()))
        return self.mk, self.mkm

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
        XP = self.client.submit(take_rows, path, self.all_ranges, index, priority=priority, pure=False)
        return [self.client.submit(centered_rows, path, self.kernel, XP, mk, self.mkm, index, cols,
                                   priority=priority, pure=False)
                for cols in self.column_groups]

    def rows(self, index: np.ndarray) -> np.ndarray:
        """``K'[index, :]`` (blocking)."""
        return np.concatenate(self.client.gather(self.submit_rows(np.asarray(index))), axis=1)

    def stream(self, blocks: Iterable[tuple[object, np.ndarray]]
               ) -> Iterator[tuple[object, np.ndarray, np.ndarray]]:
        """``(tag, index, K'[index, :])`` for each ``(tag, index)``, in order, ``prefetch`` ahead.

        A bounded FIFO of futures, refilled before blocking on the oldest, with priorities in
        schedule order; the seconds spent blocking are added to ``stats.wait_seconds``.
        """
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
                                   g[i], g[j], Vf, pure=False) for i, j in pairs]
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
        C = np.ascontiguousarray(C, dtype=np.float64)
        mk = self._need_mk()
        Cf = self.put(C)
        g = self.tile_groups
        futs = [self.client.submit(residual_pair, self.store.path, self.kernel, mk, self.mkm,
                                   g[i], g[j], Cf, pure=False) for i, j in self._pairs()]
        tot = np.zeros(2)
        for f in futs:
            tot += f.result()
        return float(tot[0]), float(tot[1])

    def dense(self) -> np.ndarray:
        """``K'`` whole: only for small stores (dense E_min, tests)."""
        mk = self._need_mk()
        g = self.tile_groups
        pairs = self._pairs()
        futs = [self.client.submit(dense_pair, self.store.path, self.kernel, mk, self.mkm,
                                   g[i], g[j], pure=False) for i, j in pairs]
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
