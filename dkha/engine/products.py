"""The blockwise passes of a row engine over the square tiles ``I ≤ J`` of ``K'``: the products
``K' V`` (evaluation, Krylov), the residuals ``‖K' − CᵀC‖²_F`` and ``K'`` whole, each tile
computed once and used for both of its blocks (``K'[J, I] = K'[I, J]ᵀ``)."""

from __future__ import annotations

import numpy as np

from dkha.engine.bandpass import band_pass, band_residuals
from dkha.engine.tasks import dense_pair, product_tiles, residual_tiles


class TilePasses:
    """The passes over the tiles ``I ≤ J`` of :class:`dkha.engine.rows.RowEngine`, which
    provides the tiles (``tile_groups``, ``tile_cache``, ``memory.tiles_per_task``), the MK row
    (``mk_future``, ``mkm``), the kernels, the GPU band plan (``bands``) and the tasks'
    plumbing (``passes``)."""

    # -- the optional row cache of tiles (dkha.engine.tilecache) --
    def cache_bytes(self) -> int:
        """Bytes of worker memory the tile cache takes (0 without one)."""
        return self.tile_cache.nbytes() if self.tile_cache is not None else 0

    def _tile(self, i: int, j: int):
        return self.tile_cache.tile(i, j) if self.tile_cache is not None else None

    def release_cache(self) -> None:
        """Drop the cached tiles from the workers."""
        if self.tile_cache is not None:
            self.tile_cache.release()

    def tile_pairs(self) -> list[tuple[int, int]]:
        """The tiles ``(i, j)``, ``i ≤ j``, of the blockwise passes, in the passes' order."""
        g = self.tile_groups
        return [(i, j) for i in range(len(g)) for j in range(i, len(g))]

    def tile_tasks(self) -> list[list[tuple[int, int]]]:
        """The tiles of each task of a blockwise pass (:func:`tasks_of`)."""
        return tasks_of(self.tile_pairs(), 1 if self.tile_cache else self.memory.tiles_per_task)

    def tile_bounds(self) -> list[tuple[int, int]]:
        """The row range ``(start, stop)`` of each tile group."""
        return [self._bounds(g) for g in self.tile_groups]

    def _bounds(self, group):
        return group[0][0], group[-1][1]

    def matmat(self, V: np.ndarray, *, exact: bool = False) -> np.ndarray:
        """``K' @ V`` for an ``l × k`` matrix: one blockwise pass over the tiles ``I ≤ J``
        (``exact``: float64 tiles whatever the engine's precision, for E_min)."""
        V = np.ascontiguousarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat(V[:, None], exact=exact)[:, 0]
        mk = self.mk_future()
        kernel = self.exact_kernel if exact else self.kernel
        if self.bands is not None:
            return band_pass(self, "product", kernel, V=V, what="a K' V product pass",
                             progress="product K' V")
        Vf = self.passes.put(V, everywhere=True)
        g, tasks = self.tile_groups, self.tile_tasks()
        # K'[I, J] V[J] to band i, K'[J, I] V[I] (off the diagonal) to band j: piece 2p and
        # 2p + 1 of the task's p-th tile
        return self.passes.reduced_pass(
            lambda k: self.client.submit(product_tiles, self.source, kernel, mk, self.mkm,
                                         [(g[i], g[j]) for i, j in tasks[k]], Vf,
                                         tiles=cached_tiles(self, tasks[k]), pure=False),
            [tile_routes(task) for task in tasks], self.tile_bounds(),
            V.shape[1],
            "a K' V product pass", kind="product", progress="product K' V")

    def residual(self, C: np.ndarray) -> tuple[float, float]:
        """``(‖K'‖²_F, ‖K' − CᵀC‖²_F)`` in one blockwise pass (direct form, no cancellation)."""
        frob2, (res2,) = self.residuals([C])
        return frob2, res2

    def residuals(self, Cs: list[np.ndarray]) -> tuple[float, list[float]]:
        """``‖K'‖²_F`` and ``‖K' − CᵀC‖²_F`` for each ``C`` of ``Cs``, all in one blockwise pass."""
        Cs = tuple(np.ascontiguousarray(C, dtype=np.float64) for C in Cs)
        mk = self.mk_future()
        if self.bands is not None:
            return band_residuals(self, Cs)
        Cf = self.passes.put(Cs, everywhere=True)
        g, tasks = self.tile_groups, self.tile_tasks()
        tot = np.zeros(1 + len(Cs))
        for part in self.passes.ordered_results(
                lambda k: self.client.submit(residual_tiles, self.source, self.exact_kernel, mk,
                                             self.mkm, [(g[i], g[j]) for i, j in tasks[k]], Cf,
                                             tiles=cached_tiles(self, tasks[k]), pure=False),
                len(tasks), "the residual pass of an evaluation", kind="residual",
                progress="evaluation (residuals)"):
            for row in part:        # the tiles' sums in the pass's order, however grouped
                tot += row
        return float(tot[0]), [float(v) for v in tot[1:]]

    def dense(self) -> np.ndarray:
        """``K'`` whole: only for small stores (dense E_min, tests)."""
        return dense_matrix(self)


def tasks_of(pairs: list, per_task: int) -> list[list[tuple[int, int]]]:
    """The tiles of each task of a blockwise pass: ``pairs`` in order, ``per_task`` a task (the
    plan's ``tiles_per_task``; one from the row cache, whose tiles are few)."""
    n = max(1, int(per_task))
    return [pairs[a:a + n] for a in range(0, len(pairs), n)]


def cached_tiles(engine: TilePasses, task) -> list | None:
    """The row cache's tiles of a task's tiles (None without the row cache)."""
    return None if engine.tile_cache is None else [engine._tile(i, j) for i, j in task]


def tile_routes(task: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where the pieces of a task of :func:`~dkha.engine.tasks.product_tiles` (or
    ``mk_tiles``) go: its ``p``-th tile ``(i, j)``'s first piece to band ``i``, its second (off
    the diagonal) to band ``j``."""
    routes = []
    for p, (i, j) in enumerate(task):
        routes.append((i, 2 * p))
        if i != j:
            routes.append((j, 2 * p + 1))
    return routes


def dense_matrix(engine: TilePasses) -> np.ndarray:
    """``K'`` whole from the tiles ``I ≤ J`` (:meth:`TilePasses.dense`)."""
    mk = engine.mk_future()
    g = engine.tile_groups
    pairs = engine.tile_pairs()
    futs = [engine.client.submit(dense_pair, engine.source, engine.exact_kernel, mk, engine.mkm,
                                 g[i], g[j], tile=engine._tile(i, j), pure=False)
            for i, j in pairs]
    out = np.empty((engine.n_samples, engine.n_samples))
    with engine.passes.progress("K' (dense)", len(futs)) as bar:
        for (i, j), fut in zip(pairs, futs):
            K = engine.passes.wait(fut, f"the dense tile ({i}, {j}) of K'")
            a, b = engine._bounds(g[i])
            c, d = engine._bounds(g[j])
            out[a:b, c:d] = K
            out[c:d, a:b] = K.T
            bar.update()
    return out
