"""Data stores: zarr v3 groups holding ``X (sample, feature)`` chunked along ``sample``.

A data store is readable by ``xarray.open_zarr``: variable ``X`` with dimension names
``(sample, feature)``, optional ``label (sample)``, provenance in the group's attributes. Stores
dkha writes carry a CRC32C checksum per chunk (flipped bytes are detected, not read as numbers)
and ``NaN`` as fill value (a missing chunk reads as NaN and is caught by the finiteness check,
never silently read as zeros).

This module opens and validates stores (:func:`open_store`, :class:`DataStore`). Writing them is
:mod:`dkha.data.writer`, filling them from arrays and images :mod:`dkha.data.ingest`, the cached
centering rows :mod:`dkha.data.centering`, the settings of object stores :mod:`dkha.data.storage`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import fsspec
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from dkha.data.storage import is_url, reach
from dkha.errors import InputError, StoreNotFoundError

FORMAT = "dkha-store"
FORMAT_VERSION = 1
#: the attribute :class:`~dkha.data.writer.StoreWriter` records as it writes ``X``: whether
#: every value is finite
FINITE_ATTR = "x_finite"


def chunk_codecs() -> list:
    """The codecs of every array dkha writes: zstd, then a CRC32C checksum per chunk."""
    return [ZstdCodec(level=1), Crc32cCodec()]


def read_slice(arr: zarr.Array, start: int, stop: int, path: str) -> np.ndarray:
    """``arr[start:stop]`` as float64; a corrupted chunk (checksum mismatch, undecodable bytes)
    raises :class:`InputError` naming the rows, never returns garbage."""
    try:
        return np.asarray(arr[start:stop], dtype=np.float64)
    except (ValueError, RuntimeError, OSError) as exc:
        a, b = _failing_chunk(arr, start, stop)
        raise InputError(f"data store {path}: cannot read rows {a}..{b - 1} of X "
                         f"({exc}); the chunk is corrupted: re-ingest the store") from None


def _failing_chunk(arr: zarr.Array, start: int, stop: int) -> tuple[int, int]:
    """The rows of the first chunk of ``arr[start:stop]`` that cannot be read (the range itself
    where each chunk reads alone): a read across chunks names the chunk to re-ingest."""
    rows = int(arr.chunks[0])
    for c in range(start // rows, -(-stop // rows)):
        a, b = c * rows, min((c + 1) * rows, arr.shape[0])
        try:
            arr[a:b]
        except (ValueError, RuntimeError, OSError):
            return a, b
    return start, stop


@dataclass(frozen=True)
class DataStore:
    """An opened, validated data store.

    Attributes
    ----------
    path : str
        Path or fsspec URL of the zarr group (workers open it by this path).
    n_samples, n_features : int
    chunk_rows : int
        Rows per chunk along ``sample``.
    has_labels : bool
    attrs : dict
        The group's attributes (provenance).
    rows : ndarray or None
        ``X`` itself, held in this process: only for the temporary store an estimator writes
        from an in-memory array for one fit (:func:`held_in_memory`). Reads come from it (the
        same float64 values as the chunks), tasks run in this process take it instead of the
        path, and nothing is cached in the store for later fits (it is removed with the model).
        Not pickled: a copy elsewhere reads the chunks.
    """

    path: str
    n_samples: int
    n_features: int
    chunk_rows: int
    has_labels: bool
    attrs: dict
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict:
        return dict(self.__dict__, rows=None)

    @property
    def n_chunks(self) -> int:
        return -(-self.n_samples // self.chunk_rows)

    def chunk_bounds(self, i: int) -> tuple[int, int]:
        start = i * self.chunk_rows
        return start, min(start + self.chunk_rows, self.n_samples)

    def array(self) -> zarr.Array:
        return zarr.open_group(self.path, mode="r")["X"]

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of ``X`` as float64."""
        stop = self.n_samples if stop is None else stop
        if self.rows is not None:
            return self.rows[start:stop].copy()
        return read_slice(self.array(), start, stop, self.path)

    def read_rows(self, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` (any order) as float64."""
        index = np.asarray(index, dtype=np.int64)
        if self.rows is not None:
            return self.rows[index]
        arr = self.array()
        out = np.empty((len(index), self.n_features))
        chunk_of = index // self.chunk_rows
        for c in np.unique(chunk_of):  # chunk by chunk: a corrupted chunk is named by its rows
            a, b = self.chunk_bounds(int(c))
            sel = chunk_of == c
            out[sel] = read_slice(arr, a, b, self.path)[index[sel] - a]
        return out

    def labels(self) -> np.ndarray | None:
        if not self.has_labels:
            return None
        return np.asarray(zarr.open_group(self.path, mode="r")["label"][:])

    def iter_chunks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(start, stop, X[start:stop])`` chunk by chunk (from :attr:`rows` where held)."""
        arr = self.array() if self.rows is None else None
        for i in range(self.n_chunks):
            a, b = self.chunk_bounds(i)
            yield a, b, self.rows[a:b] if arr is None else read_slice(arr, a, b, self.path)

    @property
    def known_finite(self) -> bool:
        """Whether the store records that every value of ``X`` is finite (written so by dkha)."""
        return self.attrs.get(FINITE_ATTR) is True

    def check_finite(self, recorded: bool = True) -> None:
        """Raise :class:`InputError` naming the first rows that hold NaN or inf (nothing read
        where the store records finite values, :attr:`known_finite`, unless ``recorded`` is
        False)."""
        if recorded and self.known_finite:
            return
        for a, b, X in self.iter_chunks():
            raise_non_finite(self.path, a, b, X)

    def content_files(self) -> list[str]:
        """The files of ``X`` (metadata and chunks) relative to the store, in name order."""
        fs, root = fsspec.core.url_to_fs(self.path)
        root = root.rstrip("/")
        return [name[len(root):] for name in sorted(fs.find(f"{root}/X"))]

    def chunks_checksummed(self) -> bool:
        """Whether every chunk of ``X`` ends in its CRC32C (as dkha writes them)."""
        codecs = getattr(self.array(), "compressors", ())
        return bool(codecs) and isinstance(codecs[-1], Crc32cCodec)

    def content_checksum(self) -> str:
        """The content key of ``X`` (the key of the caches a store keeps): the SHA-256 of its
        metadata and, for each chunk file in name order, its name and CRC32C — the last 4 bytes
        of the stored chunk, so nothing of the values is read — or, where the chunks carry no
        checksum, the SHA-256s of the whole files (:func:`file_digests`). Any change to the data
        changes it; copying the store does not."""
        names = self.content_files()
        if not self.chunks_checksummed():
            return combine_digests(file_digests(self.path, names))
        fs, root = fsspec.core.url_to_fs(self.path)
        root = root.rstrip("/")
        meta = [n for n in names if n.rsplit("/", 1)[-1] == "zarr.json"]
        chunks = [n for n in names if n not in meta]
        tails = fs.cat_ranges([f"{root}{n}" for n in chunks], [-4] * len(chunks),
                              [None] * len(chunks))
        pairs = file_digests(self.path, meta) + [(n, t.hex()) for n, t in zip(chunks, tails)]
        return combine_digests(pairs)

    def sample(self, n: int, seed: int) -> np.ndarray:
        """A seeded random sample of ``min(n, n_samples)`` rows (sorted index order)."""
        rng = np.random.default_rng(seed)
        n = min(n, self.n_samples)
        idx = np.sort(rng.choice(self.n_samples, size=n, replace=False))
        return self.read_rows(idx)


def raise_non_finite(path: str, a: int, b: int, X: np.ndarray) -> None:
    """Raise :class:`InputError` naming the first rows of ``X`` (rows ``a…b − 1`` of a store)
    that hold NaN or inf."""
    bad = ~np.isfinite(X).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad) + a
        raise InputError(
            f"data store {path}: non-finite values (NaN or inf) in {bad.sum()} rows "
            f"of X, first at rows {rows[0]}..{rows[min(len(rows), 5) - 1]} "
            f"(chunk rows {a}..{b - 1}); clean the data or re-ingest it"
        )


def file_digests(path: str, names: list[str]) -> list[tuple[str, str]]:
    """``(name, SHA-256 of its bytes)`` for the files ``names`` of the store at ``path``."""
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    return [(name, hashlib.sha256(fs.cat_file(f"{root}{name}")).hexdigest()) for name in names]


def combine_digests(digests: list[tuple[str, str]]) -> str:
    """One SHA-256 of the files' ``(name, digest)`` pairs, in the order given."""
    digest = hashlib.sha256()
    for name, file_digest in digests:
        digest.update(name.encode())
        digest.update(file_digest.encode())
    return digest.hexdigest()


def held_in_memory(store: DataStore, X: np.ndarray) -> DataStore:
    """``store`` (just written from ``X``) with ``X`` held as its :attr:`~DataStore.rows`:
    read-only, float64, the shape the store has."""
    rows = np.asarray(X, dtype=np.float64)
    if rows.shape != (store.n_samples, store.n_features):
        raise InputError(f"rows of shape {rows.shape} for a store of shape "
                         f"{(store.n_samples, store.n_features)}")
    rows = rows.view()
    rows.setflags(write=False)
    return replace(store, rows=rows)


def open_store(path: str | os.PathLike, *, check_finite: bool = False) -> DataStore:
    """Open and validate a data store.

    Raises :class:`StoreNotFoundError` when nothing is there and :class:`InputError` when it is not
    a usable store: not a zarr group, no ``X``, wrong dims or dtype, empty, bad ``label``.
    """
    path = os.fspath(path)
    if is_url(path):
        if not reach(path, "zarr.json")[2]:
            raise StoreNotFoundError(f"no data store at {path}")
    else:
        if not os.path.exists(path):
            raise StoreNotFoundError(f"no data store at {path}")
        if not os.path.isdir(path):
            raise InputError(f"{path} is a file, not a zarr store (ingest it with `dkha ingest`)")
    try:
        group = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001 - zarr raises several kinds for "not a group"
        raise InputError(f"{path} is not a zarr group ({type(exc).__name__}: {exc})") from None
    if "X" not in group:
        names = sorted(group.keys())
        raise InputError(
            f"data store {path} has no variable X (it holds: {', '.join(names) or 'nothing'}); "
            "create one with `dkha ingest`"
        )
    X = group["X"]
    if not isinstance(X, zarr.Array):
        raise InputError(f"data store {path}: X is a group, not an array")
    if X.ndim != 2:
        raise InputError(f"data store {path}: X must have 2 dims (sample, feature), "
                         f"it has {X.ndim}")
    dims = _dimension_names(X)
    if dims is not None and tuple(dims) != ("sample", "feature"):
        raise InputError(
            f"data store {path}: X has dims {tuple(dims)}, expected ('sample', 'feature')"
        )
    if X.dtype.kind not in "fiu":
        raise InputError(f"data store {path}: X has dtype {X.dtype}; a numeric dtype is required")
    l, n = X.shape
    if l == 0 or n == 0:
        raise InputError(f"data store {path} is empty (X has shape {X.shape})")
    if len(X.chunks) == 2 and X.chunks[1] < n:
        raise InputError(f"data store {path}: X is chunked along feature ({X.chunks}); dkha needs "
                         "chunks along sample only: re-ingest it with `dkha ingest array`")
    if group.attrs.get("format") == FORMAT:
        # dkha writes every chunk (finite data, NaN fill), so an absent chunk means a broken
        # store. Other writers may omit chunks equal to their fill value on purpose; with a NaN
        # fill the finiteness check catches them.
        _check_chunks_present(X, path)
    has_labels = "label" in group
    if has_labels:
        lab = group["label"]
        if not isinstance(lab, zarr.Array) or lab.shape != (l,):
            raise InputError(
                f"data store {path}: label must be a 1-d array of {l} entries, "
                f"got shape {getattr(lab, 'shape', None)}"
            )
    store = DataStore(
        path=path,
        n_samples=int(l),
        n_features=int(n),
        chunk_rows=int(X.chunks[0]),
        has_labels=has_labels,
        attrs=dict(group.attrs),
    )
    if check_finite:
        store.check_finite()
    return store


def _check_chunks_present(X: zarr.Array, path: str) -> None:
    """Refuse a store with chunks missing (they would read back as the fill value)."""
    try:
        have, want = X.nchunks_initialized, X.nchunks
    except Exception:  # noqa: BLE001 - some stores cannot list; NaN fill is caught later
        return
    if have >= want:
        return
    rows = X.chunks[0]
    missing = []
    if not is_url(path):
        for i in range(want):
            key = os.path.join(path, "X", "c", str(i), "0")
            if not os.path.exists(key):
                missing.append(i)
    where = (f"; first missing rows {missing[0] * rows}.."
             f"{min((missing[0] + 1) * rows, X.shape[0]) - 1}" if missing else "")
    raise InputError(f"data store {path} is missing {want - have} of {want} chunks of X{where}; "
                     "it was not completely written: re-ingest it")


def _dimension_names(arr: zarr.Array):
    try:
        names = arr.metadata.dimension_names
    except AttributeError:
        names = None
    if names is None:
        names = arr.attrs.get("_ARRAY_DIMENSIONS")
    return names
