"""What a fit learns of ``X`` before its passes, found where ``X`` is read: whether its values
are finite, its content key (the centering cache's), and statistics of a seeded sample (the
median distance of σ's heuristic, the default plan's probe rate).

A store written by dkha records at ingest that its values are finite
(:class:`dkha.data.writer.StoreWriter`; a row changed in place later shows in the MK row, and
the workers then name it), and its chunks end in their CRC32C: the content key digests those
(4 bytes a chunk), not the values. For other stores, and for the samples, the tasks here run on
the cluster's workers, in parallel, so the coordinator reads nothing of ``X`` (before, it read all
of it serially, up to twice, before a worker read anything). Where the workers are this process
(the in-process cluster, tasks run inline) or no cluster exists yet (a local one a fit starts
after its plan), reading here is what a worker would do.
"""

from __future__ import annotations

import contextlib

import zarr
from distributed import Client

from dkha.config import Settings
from dkha.data.store import (
    DataStore,
    combine_digests,
    file_digests,
    open_store,
    raise_non_finite,
    read_slice,
)
from dkha.engine.cluster import (
    client_for,
    names_a_cluster,
    share_storage_options,
    shares_process,
    total_threads,
)


def remote(client) -> bool:
    """Whether ``client`` is a connected client whose workers are other processes."""
    return isinstance(client, Client) and not shares_process(client)


@contextlib.contextmanager
def _workers_of(client, path: str, settings: Settings):
    """A client of the workers that would read the store at ``path``: ``client`` where it is
    connected, the cluster the user named (reached now with ``settings``, closed after), else
    None (read in this process)."""
    with contextlib.ExitStack() as reached:
        if not isinstance(client, Client):
            if client is None or not names_a_cluster(client):
                yield None
                return
            client = reached.enter_context(client_for(client, settings=settings))
        if remote(client):
            share_storage_options(client, path)
            yield client
        else:
            yield None


def _split(items: list, parts: int) -> list[list]:
    per = max(1, -(-len(items) // max(1, parts)))
    return [items[i:i + per] for i in range(0, len(items), per)]


# --- worker tasks ----------------------------------------------------------------------------


def finite_task(path: str, ranges: list[tuple[int, int]]) -> None:
    """Raise :class:`~dkha.errors.InputError` naming the first non-finite rows of ``ranges``."""
    X = zarr.open_group(path, mode="r")["X"]
    for a, b in ranges:
        raise_non_finite(path, a, b, read_slice(X, a, b, path))


def sample_task(path: str, n: int, seed: int, fn, args: tuple):
    """``fn(store.sample(n, seed), *args)`` on the store at ``path``."""
    return fn(open_store(path).sample(n, seed), *args)


# --- the coordinator's side ----------------------------------------------------------------------


def check_finite(store: DataStore, client, recorded: bool = True, *, settings: Settings
                 ) -> None:
    """:meth:`DataStore.check_finite` (``recorded``: trusting the store's record), on the
    workers of ``client`` where they are other processes and the rows are read."""
    if (recorded and store.known_finite) or store.rows is not None:
        store.check_finite(recorded)
        return
    with _workers_of(client, store.path, settings) as c:
        if c is None:
            store.check_finite(recorded)
            return
        chunks = [store.chunk_bounds(i) for i in range(store.n_chunks)]
        futures = [c.submit(finite_task, store.path, part, pure=False)
                   for part in _split(chunks, 4 * total_threads(c))]
        c.gather(futures)


def content_key(store: DataStore, client, *, settings: Settings) -> str:
    """:meth:`DataStore.content_checksum`: from the chunks' CRC32Cs here (4 bytes a chunk), or,
    where the chunks carry none, their files digested on the workers of ``client`` where they
    are other processes."""
    if store.chunks_checksummed():
        return store.content_checksum()
    with _workers_of(client, store.path, settings) as c:
        if c is None:
            return store.content_checksum()
        names = store.content_files()
        futures = [c.submit(file_digests, store.path, part, pure=False)
                   for part in _split(names, 4 * total_threads(c))]
        return combine_digests([d for part in c.gather(futures) for d in part])


def on_sample(store, client, n: int, seed: int, fn, *args, settings: Settings):
    """``fn(store.sample(n, seed), *args)``: on a worker of ``client`` where the workers are other
    processes (the sample is read there, only ``fn``'s value comes back), else here."""
    path = getattr(store, "path", None)
    if not isinstance(path, str) or getattr(store, "rows", None) is not None:
        return fn(store.sample(n, seed), *args)
    with _workers_of(client, store.path, settings) as c:
        if c is None:
            return fn(store.sample(n, seed), *args)
        return c.submit(sample_task, path, n, seed, fn, args, pure=False).result()
