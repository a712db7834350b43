"""The row cache: the kernel kept on the workers as its upper-triangle tiles ``K[I, J]``,
``I ≤ J``, computed once; later row blocks, products ``K' V`` and residuals read them instead of
recomputing kernels (``dkha.row-cache``, ``--cache-rows``)."""

from __future__ import annotations

import numpy as np

from dkha.engine.budget import workers_of
from dkha.engine.tasks import assemble_rows, kernel_tile, release, tile_take
from dkha.errors import ParameterError
from dkha.kernels import Kernel


class TileCache:
    """The cached tiles of one store and kernel on a Dask cluster.

    Parameters
    ----------
    client : distributed.Client
    path : str
        The data store the workers read.
    kernel : Kernel
        The kernel the tiles hold (float64: the cache serves the exact evaluation too).
    groups : tuple
        The tile groups (chunk ranges, :attr:`dkha.engine.rows.RowEngine.tile_groups`).
    """

    def __init__(self, client, path: str, kernel: Kernel, groups: tuple):
        self.client = client
        self.path = path
        self.kernel = kernel
        self.groups = groups
        self.bounds = [(g[0][0], g[-1][1]) for g in groups]
        self._tiles: dict | None = None

    def nbytes(self) -> int:
        """Bytes of worker memory the tile cache takes (upper triangle, diagonal tiles whole)."""
        b = [hi - lo for lo, hi in self.bounds]
        return 8 * sum(b[i] * b[j] for i in range(len(b)) for j in range(i, len(b)))

    def check_memory(self) -> None:
        """Refuse a cache over half of the workers' memory (:class:`ParameterError`)."""
        import psutil

        workers = workers_of(self.client).values()
        limits = [w.get("memory_limit") or 0 for w in workers]
        total = sum(m if m else psutil.virtual_memory().total for m in limits) or 1
        need = self.nbytes()
        if need > 0.5 * total:
            raise ParameterError(
                f"the row cache needs {need / 2**30:.1f} GiB of worker memory (the kernel's upper "
                f"triangle at l = {self.bounds[-1][1]}) but the workers have "
                f"{total / 2**30:.1f} GiB; run without --cache-rows (kernels are then recomputed "
                "each pass) or on more workers")

    def futures(self) -> dict:
        """The cached tiles ``{(i, j): future of K[I, J]}``, ``i ≤ j``, submitted on first use."""
        if self._tiles is None:
            g = self.groups
            self._tiles = {(i, j): self.client.submit(kernel_tile, self.path, self.kernel, g[i],
                                                      g[j], pure=False)
                           for i in range(len(g)) for j in range(i, len(g))}
        return self._tiles

    def tile(self, i: int, j: int):
        """The future of the cached tile ``K[I, J]``, ``i ≤ j``."""
        return self.futures()[(i, j)]

    def release(self) -> None:
        """Drop the cached tiles from the workers."""
        if self._tiles is not None:
            release(list(self._tiles.values()))
            self._tiles = None

    def submit_rows(self, index: np.ndarray, mk, mkm: float, priority: int):
        """``K'[index, :]`` assembled from the cached tiles: one take per tile the block meets."""
        bounds = self.bounds
        starts = np.array([a for a, _ in bounds])
        group = np.searchsorted(starts, index, side="right") - 1
        pieces, places = [], []
        for (i, j), tile in self.futures().items():
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
        return self.client.submit(assemble_rows, pieces, places, index, mk, mkm,
                                  priority=priority, pure=False)
