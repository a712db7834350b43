"""The coordinator's loop of the online algorithms: the seeded schedule's blocks of samples
(:func:`dkha.data.sources.stream_blocks`, read ahead on a background thread) applied to an
:class:`~dkha.solvers.online.OnlineKHA`, a history entry every ``every`` steps, under the one
block driver (:class:`dkha.fit.control.BlockDriver`: stop, checkpoints, progress, timing)."""

from __future__ import annotations

from typing import Callable

import dask.config
import numpy as np
from threadpoolctl import threadpool_limits

from dkha.data.sources import stream_blocks
from dkha.fit.control import BlockDriver


def coordinator_threads():
    """Limit BLAS threads while streaming (``dkha.online-blas-threads``, default 1).

    The per-block products are small (``b × m``); on a shared or busy machine several BLAS
    threads made them ten times slower here, not faster.
    """
    return threadpool_limits(limits=int(dask.config.get("dkha.online-blas-threads", default=1)),
                             user_api="blas")


def run_online(solver, source, driver: BlockDriver, *, seed: int, n_steps: int, every: int,
               block_rows: int, prefetch: int, stats: dict, record: Callable[[], dict]) -> None:
    """Stream steps ``solver.state.step .. n_steps - 1`` of the schedule of ``seed`` over
    ``source`` into ``solver``, calling ``record()`` (which returns the history entry) after
    every ``every`` steps and at the end; between blocks the driver checkpoints and stops."""
    l = source.n_samples
    start = solver.state.step
    with coordinator_threads():
        while start < n_steps:
            stop = min(n_steps, (start // every + 1) * every)
            driver.start()
            for _, _, idx, rows in stream_blocks(source, seed, start, stop, block_rows,
                                                 prefetch, stats):
                solver.apply_block(rows, idx)
                driver.advance(len(idx))
                t = solver.state.step
                if t < stop:  # a segment's end checkpoints after its history entry
                    driver.between_blocks(t, t // l + 1)
            driver.stop_clock()
            start = stop
            entry = record()
            if np.isfinite(entry["ac_index"]):
                driver.show(ac=f"{entry['ac_index']:.3f}", members=entry["members"])
            driver.between_blocks(stop, stop // l + 1)
