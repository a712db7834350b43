"""The MK row (the centering, coordinator-math.md §1) on the cluster: exact, by one pass over the
tiles ``I ≤ J``, or estimated from a seeded sample of columns; kept in the data store's cache
(:mod:`dkha.data.centering`) and read back instead of recomputed."""

from __future__ import annotations

import logging
import time

import numpy as np

from dkha.data.centering import centering_key, read_centering, write_centering
from dkha.engine.bandpass import band_pass
from dkha.engine.content import check_finite, content_key
from dkha.engine.tasks import mk_sample_tile, mk_tiles, take_rows, tile_sums
from dkha.errors import ParameterError
from dkha.schedule import Stream, random_stream

log = logging.getLogger(__name__)


def describe_centering(kernel, l: int, center_sample: int | None, seed: int) -> dict:
    """What a centering row is made of (kernel, parameters, method): its cache identity."""
    centering = {"kernel": kernel.name, "parameters": kernel.param_dict, "centering": "exact"}
    if kernel.precision != "float64":      # float64 rows keep their cache keys
        centering["precision"] = kernel.precision
    if center_sample is not None:
        if not 1 <= int(center_sample) <= l:
            raise ParameterError(f"center_sample must lie in 1..{l} (the number of samples), "
                                 f"got {center_sample}")
        centering.update(centering="sample", center_sample=int(center_sample), seed=int(seed))
    return centering


def mk_row(engine, center_sample: int | None, seed: int, cache: bool
           ) -> tuple[np.ndarray, float, dict]:
    """``(mk, mkm, centering)`` of :meth:`dkha.engine.rows.RowEngine.compute_mk`: read from the
    store's cache, or computed (and cached where ``cache``, ``dkha.mk-cache``)."""
    store = engine.store
    centering = describe_centering(engine.kernel, store.n_samples, center_sample, seed)
    key = None
    # (a store held in memory is an array fit's own, removed with the model: nothing to keep)
    if bool(cache) and engine.kernel.cacheable and store.rows is None:
        key = centering_key(store, centering, engine_content_key(engine))
        cached = read_centering(store, key)
        if cached is not None:
            return cached[0], cached[1], dict(centering, cached=True)
    t0 = time.perf_counter()
    mk = (exact_mk_row(engine) if center_sample is None
          else sampled_mk_row(engine, int(center_sample), seed))
    log.info("%s MK row in %.1f s", centering["centering"], time.perf_counter() - t0)
    if center_sample is None:
        engine.stats.mk_pass_seconds = time.perf_counter() - t0
    if not np.isfinite(mk).all():   # X changed in place since ingest recorded it finite?
        # (names the rows)
        check_finite(store, engine.client, recorded=False, settings=engine.settings)
    mkm = float(mk.mean())
    if key is not None:
        write_centering(store, key, mk, mkm)
    return mk, mkm, dict(centering, cached=False)


def engine_content_key(engine) -> str:
    """The content key of the engine's store (its cache keys' ``data``), once per engine: from
    the chunks' CRC32Cs, else digested by its workers (:func:`dkha.engine.content.content_key`)."""
    key = getattr(engine, "_content_key", None)
    if key is None:
        key = content_key(engine.store, engine.client, settings=engine.settings)
        engine._content_key = key
    return key


def exact_mk_row(engine) -> np.ndarray:
    """The exact MK row: one pass over chunk pairs (tiles ``I ≤ J``), the band sums added on
    the workers (from the cached tiles where the engine keeps them)."""
    if engine.bands is not None:        # on GPU workers: one task per band of tiles
        return band_pass(engine, "sums", engine.kernel, what="the MK row (centering) pass",
                         progress="centering (MK row)") / engine.n_samples
    path, groups, client = engine.source, engine.tile_groups, engine.client
    tasks = engine.tile_tasks()

    def submit(k):
        if engine.tile_cache is not None:   # one tile a task
            (i, j), = tasks[k]
            return client.submit(tile_sums, engine.tile_cache.tile(i, j), i == j, pure=False)
        return client.submit(mk_tiles, path, engine.kernel,
                             [(groups[i], groups[j]) for i, j in tasks[k]], pure=False)

    # column sums to band j, row sums (off the diagonal) to band i: the p-th tile's pieces
    # 2p and 2p + 1 of its task's result
    routes = [[piece for p, (i, j) in enumerate(task)
               for piece in [(j, 2 * p)] + ([(i, 2 * p + 1)] if i != j else [])]
              for task in tasks]
    mk = engine.passes.reduced_pass(submit, routes, engine.tile_bounds(), None,
                                    "the MK row (centering) pass", kind="mk",
                                    progress="centering (MK row)", transient=False)
    return mk / engine.n_samples


def sampled_mk_row(engine, n: int, seed: int) -> np.ndarray:
    """The MK row estimated from ``n`` seeded random columns (pieces of ≤ ``dkha.tile-rows``)."""
    store, passes = engine.store, engine.passes
    sample = np.sort(random_stream(seed, Stream.CENTERING_SAMPLE).choice(store.n_samples, size=n,
                                                                         replace=False))
    piece = int(engine.settings.tile_rows)
    # the sampled rows are read by a worker and copied to the others: none read here
    parts = [passes.spread(engine.client.submit(take_rows, engine.source, engine.all_ranges,
                                                sample[a:a + piece], pure=False))
             for a in range(0, n, piece)]
    groups = engine.tile_groups
    tasks = [(band, part) for band in range(len(groups)) for part in parts]
    mk = passes.reduced_pass(
        lambda k: engine.client.submit(mk_sample_tile, engine.source, engine.kernel,
                                       groups[tasks[k][0]], tasks[k][1], pure=False),
        [[(band, None)] for band, _ in tasks], engine.tile_bounds(), None,
        "the sampled MK row", kind="mk",
        progress="centering (MK row from a sample)", transient=False)
    return mk / n
