"""Sources of samples for the online algorithms and their prefetched block stream.

A source is a data store (:class:`~dkha.data.store.DataStore`) or an in-memory array
(:class:`ArraySource`) with the same reading interface. :func:`stream_blocks` reads the blocks of
the seeded schedule (:func:`dkha.schedule.blocks`: concatenated random permutations, one per
pass) ahead on a background thread: at most ``prefetch + 1`` blocks of rows are held.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dkha import schedule
from dkha.errors import InputError


class ArraySource:
    """An in-memory array with the reading interface of :class:`~dkha.data.store.DataStore`:
    the rows an estimator validated (scikit-learn's ``validate_data``: 2-d, not empty, finite)."""

    def __init__(self, X: np.ndarray):
        X = np.asarray(X, dtype=np.float64)
        self.X = X
        self.path = None
        self.n_samples, self.n_features = X.shape

    def read_rows(self, index: np.ndarray) -> np.ndarray:
        return self.X[np.asarray(index, dtype=np.int64)]

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.X[start:stop]

    def sample(self, n: int, seed: int) -> np.ndarray:
        return seeded_rows(self.X, n, seed)


def seeded_rows(X: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``X`` itself up to ``n`` rows, else ``n`` of its rows drawn by ``seed``, in order (the
    rows :meth:`DataStore.sample <dkha.data.store.DataStore.sample>` reads)."""
    if len(X) <= n:
        return X
    return X[np.sort(np.random.default_rng(seed).choice(len(X), n, replace=False))]


def read_block(source, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` (schedule order) read in sorted order and put back in schedule order."""
    index = np.asarray(index, dtype=np.int64)
    order = np.argsort(index, kind="stable")
    rows = source.read_rows(index[order])
    out = np.empty_like(rows)
    out[order] = rows
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        where = index[np.flatnonzero(bad)[:5]]
        raise InputError(f"non-finite values (NaN or inf) in samples {', '.join(map(str, where))} "
                         "of the data; clean the data or re-ingest it")
    return out


def stream_blocks(source, seed: int, start_step: int, stop_step: int, block_rows: int,
                  prefetch: int, stats: dict | None = None
                  ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """``(pass_index, first_step, index, rows)`` for steps ``start_step .. stop_step-1``.

    A bounded FIFO of ``prefetch`` read futures on one background thread, refilled before
    blocking on the oldest. ``stats`` (if given) collects ``blocks``, ``rows_read``,
    ``largest_read`` and ``wait_seconds``. An in-memory :class:`ArraySource` has nothing to
    read ahead: each block is taken from it when its turn comes, in this thread (a thread
    handing blocks over cost a small fit more than the reads).
    """
    plan = iter(schedule.blocks(seed, source.n_samples, stop_step, block_rows, start_step))
    pending: collections.deque = collections.deque()
    executor = (None if isinstance(source, ArraySource) else
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="dkha-online-read"))

    def refill():
        nxt = next(plan, None)
        if nxt is not None:
            pending.append((nxt, None if executor is None else
                            executor.submit(read_block, source, nxt[2])))

    try:
        for _ in range(max(1, prefetch)):
            refill()
        while pending:
            (k, first, idx), fut = pending.popleft()
            refill()
            t0 = time.perf_counter()
            rows = read_block(source, idx) if fut is None else fut.result()
            if stats is not None:
                stats["wait_seconds"] = stats.get("wait_seconds", 0.0) + time.perf_counter() - t0
                stats["blocks"] = stats.get("blocks", 0) + 1
                stats["rows_read"] = stats.get("rows_read", 0) + len(idx)
                stats["largest_read"] = max(stats.get("largest_read", 0), len(idx))
            yield k, first, idx, rows
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
