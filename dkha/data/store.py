"""Data stores: zarr v3 groups holding ``X (sample, feature)`` chunked along ``sample``.

A data store is readable by ``xarray.open_zarr``: variable ``X`` with dimension names
``(sample, feature)``, optional ``label (sample)``, provenance in the group's attributes. Stores
dkha writes carry a CRC32C checksum per chunk (flipped bytes are detected, not read as numbers)
and ``NaN`` as fill value (a missing chunk reads as NaN and is caught by the finiteness check,
never silently read as zeros).

Ingest never holds a whole corpus: arrays are copied chunk by chunk from a memory map, images
are cut into patches one band of patch rows at a time and appended.

A store also caches the centering rows computed on it (:func:`read_centering`,
:func:`write_centering`): sub-group ``centering`` holds one array ``mk (sample)`` per kernel,
parameters and centering method, keyed by a hash of those and of the content of ``X``, so the
``O(l² n)`` MK pass is paid once per data set and kernel.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import dask.array as da
import fsspec
import fsspec.config
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from dkha import config
from dkha.errors import InputError, ParameterError, RunDirectoryError, StoreNotFoundError

log = logging.getLogger(__name__)

FORMAT = "dkha-store"
FORMAT_VERSION = 1


def consolidate(path: str) -> None:
    """Write consolidated metadata, so a plain ``xarray.open_zarr(path)`` opens without warning.

    (zarr warns that consolidated metadata is not yet in the v3 specification; zarr-python and
    xarray both read it.)
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        zarr.consolidate_metadata(path)


def replace_directory(tmp: str, final: str) -> None:
    """Move the finished directory ``tmp`` to ``final`` (replacing one there) by renames.

    A reader sees the old ``final`` or the new one, never a half-written one: the old one is
    renamed aside first and removed after the new one is in place.
    """
    if os.path.lexists(final):
        old = f"{final}.{uuid.uuid4().hex}.old"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _codecs():
    return [ZstdCodec(level=1), Crc32cCodec()]


def _is_url(path: str) -> bool:
    return "://" in str(path)


# --- object storage: fsspec settings per protocol ------------------------------------------------

#: ``--storage-option KEY=VALUE`` settings, applied to the protocol of every store URL dkha opens
_STORAGE_OPTIONS: dict = {}


def parse_storage_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` → ``(KEY, VALUE)``, the value read as JSON where it is JSON (``true``,
    ``3``, ``{"region_name": "eu"}``) and as a string otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ParameterError(f"a storage option is KEY=VALUE (e.g. endpoint_url=http://host:9000), "
                             f"got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def set_storage_options(options: dict) -> None:
    """Settings of the file systems of store URLs (fsspec keyword arguments, e.g. s3fs's
    ``endpoint_url``, ``key``, ``secret``, ``anon``), added to what the environment gives
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``FSSPEC_S3_*`` …). They take effect for the
    protocol of each URL opened afterwards, in this process and, through the row engine, on the
    workers (:func:`dkha.engine.cluster.share_storage_options`)."""
    _STORAGE_OPTIONS.update(options)


def url_protocol(path: str) -> str | None:
    """``"s3"`` for ``s3://bucket/x.zarr``; ``None`` for a local path."""
    return str(path).split("://", 1)[0] if _is_url(path) else None


def storage_settings(path: str) -> dict:
    """The fsspec settings this process uses for ``path``'s protocol (empty for local paths);
    ``--storage-option`` settings are merged into fsspec's configuration on first use."""
    protocol = url_protocol(path)
    if protocol is None:
        return {}
    if _STORAGE_OPTIONS:
        fsspec.config.conf.setdefault(protocol, {}).update(_STORAGE_OPTIONS)
    return dict(fsspec.config.conf.get(protocol, {}))


def apply_storage_settings(protocol: str, settings: dict) -> None:
    """Make ``settings`` this process's fsspec defaults for ``protocol`` (run on workers)."""
    fsspec.config.conf.setdefault(protocol, {}).update(settings)


def read_slice(arr: zarr.Array, start: int, stop: int, path: str) -> np.ndarray:
    """``arr[start:stop]`` as float64; a corrupted chunk (checksum mismatch, undecodable bytes)
    raises :class:`InputError` naming the rows, never returns garbage."""
    try:
        return np.asarray(arr[start:stop], dtype=np.float64)
    except (ValueError, RuntimeError, OSError) as exc:
        raise InputError(f"data store {path}: cannot read rows {start}..{stop - 1} of X "
                         f"({exc}); the chunk is corrupted: re-ingest the store") from None


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
    """

    path: str
    n_samples: int
    n_features: int
    chunk_rows: int
    has_labels: bool
    attrs: dict

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
        return read_slice(self.array(), start, stop, self.path)

    def read_rows(self, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` (any order) as float64."""
        index = np.asarray(index, dtype=np.int64)
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
        """``(start, stop, X[start:stop])`` chunk by chunk."""
        arr = self.array()
        for i in range(self.n_chunks):
            a, b = self.chunk_bounds(i)
            yield a, b, read_slice(arr, a, b, self.path)

    def check_finite(self) -> None:
        """Raise :class:`InputError` naming the first rows that hold NaN or inf."""
        for a, b, X in self.iter_chunks():
            bad = ~np.isfinite(X).all(axis=1)
            if bad.any():
                rows = np.flatnonzero(bad) + a
                raise InputError(
                    f"data store {self.path}: non-finite values (NaN or inf) in {bad.sum()} rows "
                    f"of X, first at rows {rows[0]}..{rows[min(len(rows), 5) - 1]} "
                    f"(chunk rows {a}..{b - 1}); clean the data or re-ingest it"
                )

    def content_checksum(self) -> str:
        """SHA-256 of ``X`` as stored: its metadata and the stored bytes of every chunk, file by
        file in name order. Any change to the data changes it; copying the store does not."""
        fs, root = fsspec.core.url_to_fs(self.path)
        root = root.rstrip("/")
        digest = hashlib.sha256()
        for name in sorted(fs.find(f"{root}/X")):
            digest.update(name[len(root):].encode())
            digest.update(fs.cat_file(name))
        return digest.hexdigest()

    def sample(self, n: int, seed: int) -> np.ndarray:
        """A seeded random sample of ``min(n, n_samples)`` rows (sorted index order)."""
        rng = np.random.default_rng(seed)
        n = min(n, self.n_samples)
        idx = np.sort(rng.choice(self.n_samples, size=n, replace=False))
        return self.read_rows(idx)


def open_store(path: str | os.PathLike, *, check_finite: bool = False) -> DataStore:
    """Open and validate a data store.

    Raises :class:`StoreNotFoundError` when nothing is there and :class:`InputError` when it is not
    a usable store: not a zarr group, no ``X``, wrong dims or dtype, empty, bad ``label``.
    """
    path = os.fspath(path)
    if _is_url(path):
        storage_settings(path)
        _check_url_store(path)
    else:
        if not os.path.exists(path):
            raise StoreNotFoundError(f"no data store at {path}")
        if not os.path.isdir(path):
            raise InputError(f"{path} is a file, not a zarr store (ingest it with `dkha ingest`)")
    try:
        group = zarr.open_group(path, mode="r")
    except Exception as exc:  # zarr raises several kinds for "not a group"
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
        raise InputError(f"data store {path}: X must have 2 dims (sample, feature), it has {X.ndim}")
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


def _url_fs(path: str):
    try:
        return fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as exc:
        raise ParameterError(f"cannot open {path}: {exc} (object stores need their fsspec "
                             "package, e.g. s3fs for s3://)") from None


def _check_url_store(path: str) -> None:
    """A one-line error for a store URL that cannot be reached or holds nothing."""
    fs, root = _url_fs(path)
    try:
        found = fs.exists(f"{root.rstrip('/')}/zarr.json")
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many kinds
        raise InputError(f"cannot reach the data store {path}: {type(exc).__name__}: {exc} "
                         "(check the endpoint and credentials: AWS_ENDPOINT_URL, "
                         "AWS_ACCESS_KEY_ID, … or --storage-option KEY=VALUE)") from None
    if not found:
        raise StoreNotFoundError(f"no data store at {path}")


def _check_chunks_present(X: zarr.Array, path: str) -> None:
    """Refuse a store with chunks missing (they would read back as the fill value)."""
    try:
        have, want = X.nchunks_initialized, X.nchunks
    except Exception:  # some stores cannot list; the finiteness check still catches NaN fill
        return
    if have >= want:
        return
    rows = X.chunks[0]
    missing = []
    if not _is_url(path):
        for i in range(want):
            key = os.path.join(path, "X", "c", str(i), "0")
            if not os.path.exists(key):
                missing.append(i)
    where = (f"; first missing rows {missing[0] * rows}..{min((missing[0] + 1) * rows, X.shape[0]) - 1}"
             if missing else "")
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


# --- writing -----------------------------------------------------------------------------------


class StoreWriter:
    """Writes a data store aside and moves it into place on :meth:`commit`.

    Rows are appended in any number of pieces; the target appears only once complete, so a
    reader never sees a half-written store.
    """

    def __init__(self, out: str | os.PathLike, n_features: int, *, chunk_rows: int | None = None,
                 overwrite: bool = False, with_labels: bool = False, label_dtype="i8"):
        self.out = os.fspath(out)
        self.chunk_rows = int(config.get("chunk-rows", chunk_rows))
        if self.chunk_rows < 1:
            raise ParameterError(f"chunk rows must be positive, got {self.chunk_rows}")
        if _is_url(self.out):
            self._open_url(overwrite)
        else:
            self._open_local(overwrite)
        self.X = self.group.create_array(
            "X", shape=(0, n_features), chunks=(self.chunk_rows, n_features), dtype="f8",
            dimension_names=["sample", "feature"], compressors=_codecs(), fill_value=np.nan,
        )
        self.label = None
        if with_labels:
            self.label = self.group.create_array(
                "label", shape=(0,), chunks=(self.chunk_rows,), dtype=label_dtype,
                dimension_names=["sample"], compressors=_codecs(),
            )
        self.n = 0
        self._buf: list[np.ndarray] = []
        self._lbuf: list[np.ndarray] = []
        self._buffered = 0

    def _open_local(self, overwrite: bool) -> None:
        if os.path.lexists(self.out):
            if not overwrite:
                raise RunDirectoryError(f"{self.out} already exists; pass --overwrite to replace it")
            if not os.path.isdir(self.out) or os.path.islink(self.out):
                raise RunDirectoryError(f"{self.out} exists and is not a directory; remove it first")
        parent = os.path.dirname(os.path.abspath(self.out))
        os.makedirs(parent, exist_ok=True)
        self.tmp = os.path.join(parent, f".{os.path.basename(self.out)}.{uuid.uuid4().hex}.tmp")
        self.group = zarr.open_group(self.tmp, mode="w")

    def _open_url(self, overwrite: bool) -> None:
        """Object storage has no atomic rename: the store is written in place, its group
        metadata (with ``format``, which marks a complete dkha store) last, and removed on
        failure. An existing store is removed first (``overwrite``)."""
        storage_settings(self.out)
        fs, root = _url_fs(self.out)
        self.tmp = None
        try:
            exists = fs.exists(root)
        except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many kinds
            raise InputError(f"cannot reach {self.out}: {type(exc).__name__}: {exc} (check the "
                             "endpoint and credentials: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, … or "
                             "--storage-option KEY=VALUE)") from None
        if exists:
            if not overwrite:
                raise RunDirectoryError(f"{self.out} already exists; pass --overwrite to replace it")
            fs.rm(root, recursive=True)
        self.group = zarr.open_group(self.out, mode="w")

    def append(self, X: np.ndarray, labels: np.ndarray | None = None) -> None:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.X.shape[1]:
            raise InputError(f"rows of {X.shape[1] if X.ndim == 2 else X.shape} features appended "
                             f"to a store of {self.X.shape[1]}")
        self._buf.append(X)
        if self.label is not None:
            self._lbuf.append(np.asarray(labels))
        self._buffered += len(X)
        # write whole chunks only, so every chunk is written once
        if self._buffered >= self.chunk_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self._buf:
            return
        X = np.concatenate(self._buf)
        L = np.concatenate(self._lbuf) if self.label is not None else None
        k = len(X) if final else (len(X) // self.chunk_rows) * self.chunk_rows
        if k:
            self.X.resize((self.n + k, self.X.shape[1]))
            self.X[self.n:self.n + k] = X[:k]
            if L is not None:
                self.label.resize((self.n + k,))
                self.label[self.n:self.n + k] = L[:k]
            self.n += k
        self._buf = [X[k:]] if k < len(X) else []
        self._lbuf = [L[k:]] if (L is not None and k < len(X)) else []
        self._buffered = len(X) - k

    def commit(self, attrs: dict, coords: dict | None = None) -> DataStore:
        """Write the last rows, the ``coords`` (xarray coordinates of ``X`` along ``sample``:
        name → ``(dtype, values_of(start, stop))``, written a chunk at a time) and ``attrs``,
        and move the store into place."""
        self._flush(final=True)
        if self.n == 0:
            self.abort()
            raise InputError("nothing to ingest: the input holds no samples")
        for name, (dtype, values_of) in (coords or {}).items():
            arr = self.group.create_array(
                name, shape=(self.n,), chunks=(self.chunk_rows,), dtype=dtype,
                dimension_names=["sample"], compressors=_codecs() if dtype is not str else "auto")
            for a in range(0, self.n, self.chunk_rows):  # a chunk at a time
                b = min(a + self.chunk_rows, self.n)
                arr[a:b] = values_of(a, b)
        if coords:
            self.X.attrs["coordinates"] = " ".join(coords)
        self.group.attrs.update({"format": FORMAT, "format_version": FORMAT_VERSION, **attrs})
        if self.tmp is None:
            consolidate(self.out)
        else:
            consolidate(self.tmp)
            replace_directory(self.tmp, self.out)
        return open_store(self.out)

    def abort(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            fs, root = _url_fs(self.out)
            fs.rm(root, recursive=True)
        except Exception as exc:  # noqa: BLE001 - cleaning up after a failure already raised
            log.warning("could not remove the partly written store %s: %s", self.out, exc)


def _check_matrix(data, name: str) -> None:
    """Refuse what cannot be a store's ``X``: not 2-d, not numeric, or empty."""
    if data.ndim != 2:
        raise InputError(f"{name}: expected a 2-d array (samples × features), got shape {data.shape}")
    if data.dtype.kind not in "fiub":
        raise InputError(f"{name}: dtype {data.dtype} is not numeric")
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise InputError(f"{name} is empty (shape {data.shape})")


def ingest_array(src: str | os.PathLike | np.ndarray, out: str | os.PathLike, *,
                 labels: str | os.PathLike | np.ndarray | None = None,
                 chunk_rows: int | None = None, overwrite: bool = False) -> DataStore:
    """Copy a 2-d array (``.npy`` file or in-memory array) into a data store.

    ``.npy`` files are memory-mapped and copied chunk by chunk. Non-finite values are refused
    (the row range is named) and nothing is written.
    """
    name = "<array>"
    if isinstance(src, np.ndarray):
        data = src
    else:
        name = os.fspath(src)
        data = _load_npy(name, mmap=True)
    _check_matrix(data, name)
    lab = None
    if labels is not None:
        lab = labels if isinstance(labels, np.ndarray) else _load_npy(labels)
        if lab.shape != (data.shape[0],):
            raise InputError(f"labels must have shape ({data.shape[0]},), got {lab.shape}")
    writer = StoreWriter(out, data.shape[1], chunk_rows=chunk_rows, overwrite=overwrite,
                         with_labels=lab is not None,
                         label_dtype=lab.dtype if lab is not None else "i8")
    try:
        step = writer.chunk_rows
        for a in range(0, data.shape[0], step):
            block = np.asarray(data[a:a + step], dtype=np.float64)
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                rows = np.flatnonzero(bad) + a
                raise InputError(f"{name}: non-finite values (NaN or inf) in rows starting at "
                                 f"{rows[0]} ({bad.sum()} rows in {a}..{a + len(block) - 1})")
            writer.append(block, None if lab is None else lab[a:a + step])
        return writer.commit({"source": {"kind": "array", "path": name, "shape": list(data.shape),
                                         "dtype": str(data.dtype)}})
    except BaseException:
        writer.abort()
        raise


def ingest_dask(X, out: str | os.PathLike, *, chunk_rows: int | None = None,
                overwrite: bool = False) -> DataStore:
    """Write a 2-d dask array into a data store blockwise: the chunks are computed and written
    where Dask runs them (the workers, under a distributed client); nothing is gathered here."""
    _check_matrix(X, "<dask array>")
    writer = StoreWriter(out, X.shape[1], chunk_rows=chunk_rows, overwrite=overwrite)
    try:
        writer.X.resize(X.shape)
        da.store(X.astype(np.float64).rechunk((writer.chunk_rows, X.shape[1])), writer.X,
                 lock=False)
        writer.n = int(X.shape[0])
        return writer.commit({"source": {"kind": "dask", "shape": list(X.shape),
                                         "dtype": str(X.dtype)}})
    except BaseException:
        writer.abort()
        raise


BUNDLED_PREFIX = "skimage:"


def read_grey_image(path: str) -> np.ndarray:
    """A grey-scale image as float64 in [0, 1].

    ``skimage:NAME`` names one of scikit-image's bundled photographs (e.g. ``skimage:camera``).
    Colour images are converted with ``skimage.color.rgb2gray``; an alpha channel is dropped.
    """
    import skimage.color
    import skimage.data
    import skimage.io
    import skimage.util

    if path.startswith(BUNDLED_PREFIX):
        name = path[len(BUNDLED_PREFIX):]
        fn = getattr(skimage.data, name, None)
        if fn is None or not callable(fn):
            raise InputError(f"scikit-image has no bundled image {name!r}")
        img = fn()
    else:
        if not os.path.exists(path):
            raise StoreNotFoundError(f"no such image: {path}")
        try:
            img = skimage.io.imread(path)
        except Exception as exc:
            raise InputError(f"cannot read image {path}: {exc}") from None
    img = np.asarray(img)
    if img.ndim == 3:
        if img.shape[2] == 4:
            img = img[..., :3]
        if img.shape[2] == 3:
            img = skimage.color.rgb2gray(img)
        elif img.shape[2] == 1:
            img = img[..., 0]
        else:
            raise InputError(f"image {path} has {img.shape[2]} channels; expected grey, RGB or RGBA")
    elif img.ndim != 2:
        raise InputError(f"image {path} has shape {img.shape}; expected a 2-d picture")
    img = skimage.util.img_as_float64(img)
    if img.min() < 0 or img.max() > 1:  # float images outside [0, 1]: rescale
        lo, hi = float(img.min()), float(img.max())
        img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    return img


def patch_grid(shape: tuple[int, int], patch: int, step: int) -> tuple[int, int]:
    """Number of patch positions (rows, cols) on the grid of an image of ``shape``."""
    return (shape[0] - patch) // step + 1, (shape[1] - patch) // step + 1


def _patch_windows(img: np.ndarray, patch: int, step: int) -> np.ndarray:
    """The ``grid rows × grid cols × patch × patch`` view of an image's patches (no copy)."""
    from skimage.util import view_as_windows

    if img.shape[0] < patch or img.shape[1] < patch:
        raise InputError(f"image of shape {img.shape} is smaller than a {patch}×{patch} patch")
    return view_as_windows(np.ascontiguousarray(img), (patch, patch), step=step)


def extract_patches(img: np.ndarray, patch: int, step: int) -> np.ndarray:
    """Patches of ``patch×patch`` pixels on a grid of ``step``, row-major, as rows."""
    return _patch_windows(img, patch, step).reshape(-1, patch * patch)


def patch_bands(img: np.ndarray, patch: int, step: int, rows: int) -> Iterator[np.ndarray]:
    """:func:`extract_patches` in pieces of whole grid rows, about ``rows`` patches each (at
    least one grid row): an image's patches are never all held at once."""
    win = _patch_windows(img, patch, step)
    per_band = max(1, rows // win.shape[1])
    for a in range(0, win.shape[0], per_band):
        yield win[a:a + per_band].reshape(-1, patch * patch)


def ingest_images(paths: Sequence, out: str | os.PathLike, *, patch: int = 11, step: int = 2,
                  chunk_rows: int | None = None, max_samples: int | None = None,
                  seed: int = 0, overwrite: bool = False) -> DataStore:
    """Cut grey-scale images into patches and store them as samples.

    Each image is read, converted to grey in [0, 1], cut into ``patch×patch`` patches on a grid
    of ``step`` pixels, and appended a band of grid rows at a time (memory: one image and one
    chunk of patches). ``max_samples`` keeps that many patches spread over all the images: a
    seeded (``seed``) uniform sample of the grid positions of every image, in raster order
    (the first ``N`` patches would be the top rows of the first image — e.g. camera's sky).
    Attrs record, per image, its path, shape, the patch grid and the range of samples it
    produced (and with ``max_samples``, how many of its positions were drawn), so patches can
    be put back. An item may also be a 2-d array or a ``.npy`` file of one: taken as grey values
    as they are (no rescaling — a noisy image keeps values outside [0, 1]).
    """
    if patch < 1 or step < 1:
        raise ParameterError(f"patch and step must be positive, got patch={patch}, step={step}")
    if max_samples is not None and max_samples < 1:
        raise ParameterError(f"max_samples must be positive, got {max_samples}")
    if paths is None or len(paths) == 0:
        raise InputError("no images given")
    keep = None        # per image: the sorted positions (raster order) of its kept patches
    if max_samples is not None:
        sizes = [int(np.prod(patch_grid(_grey_values(p, i)[0].shape, patch, step)))
                 for i, p in enumerate(paths)]
        if max_samples < sum(sizes):
            drawn = np.sort(np.random.default_rng([int(seed), 5]).choice(
                sum(sizes), size=int(max_samples), replace=False))
            starts = np.cumsum([0] + sizes)
            keep = [drawn[(drawn >= a) & (drawn < b)] - a for a, b in zip(starts, starts[1:])]
    writer = StoreWriter(out, patch * patch, chunk_rows=chunk_rows, overwrite=overwrite)
    images = []
    try:
        for i, p in enumerate(paths):
            first = writer.n + writer._buffered
            img, name = _grey_values(p, i)
            position = 0
            for band in patch_bands(img, patch, step, writer.chunk_rows):
                if keep is not None:
                    chosen = keep[i][(keep[i] >= position) & (keep[i] < position + len(band))]
                    position += len(band)
                    band = band[chosen - (position - len(band))]
                if len(band):
                    writer.append(band)
            images.append({"path": name, "shape": list(img.shape),
                           "grid": list(patch_grid(img.shape, patch, step)),
                           "first_sample": first, "n_samples": writer.n + writer._buffered - first})
            log.info("ingested %s: %d patches", name, images[-1]["n_samples"])
        attrs = {"source": {"kind": "images", "images": images}, "patch": patch, "step": step,
                 "scaling": "grey, [0, 1] (skimage img_as_float)"}
        if max_samples is not None:
            attrs["max_samples"] = int(max_samples)
            attrs["sample"] = ({"kind": "seeded uniform sample of the patch positions",
                                "seed": int(seed)} if keep is not None else "all patches")
        return writer.commit(attrs, coords=patch_coords(images, keep))
    except BaseException:
        writer.abort()
        raise


def patch_coords(images: list[dict], keep: list[np.ndarray] | None = None) -> dict:
    """Where each patch came from, from the ``images`` entries of a patch store's attrs: the
    image's index and name, and the patch's row and column on that image's patch grid, as
    :meth:`StoreWriter.commit` coordinates (computed for one range of samples at a time).
    ``keep``: per image, the sorted raster positions of the patches kept (``--max-samples``)."""
    first = np.array([im["first_sample"] for im in images], dtype=np.int64)
    cols = np.array([im["grid"][1] for im in images], dtype=np.int64)
    names = np.array([im["path"] for im in images], dtype=object)
    raster = None if keep is None else np.concatenate(keep).astype(np.int64)

    def image(a, b):
        return np.searchsorted(first, np.arange(a, b), side="right") - 1

    def position(a, b):
        i = image(a, b)
        k = np.arange(a, b) - first[i] if raster is None else raster[a:b]
        return i, k, cols[i]

    def row(a, b):
        _, k, c = position(a, b)
        return (k // c).astype(np.int32)

    def col(a, b):
        _, k, c = position(a, b)
        return (k % c).astype(np.int32)

    return {"image": (np.int32, lambda a, b: image(a, b).astype(np.int32)),
            "image_name": (str, lambda a, b: names[image(a, b)].astype(str)),
            "row": (np.int32, row), "col": (np.int32, col)}


def _load_npy(path, what: str = "file", mmap: bool = False) -> np.ndarray:
    """A ``.npy`` array (never unpickled; memory-mapped with ``mmap``), or a one-line error."""
    name = os.fspath(path)
    if not os.path.exists(name):
        raise StoreNotFoundError(f"no such {what}: {name}")
    try:
        return np.load(name, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as exc:
        raise InputError(f"{name} is not a readable .npy array ({exc})") from None


def _grey_values(item, i: int) -> tuple[np.ndarray, str]:
    """An image item of :func:`ingest_images` as a 2-d float array, and its name."""
    if isinstance(item, np.ndarray) or (isinstance(item, (str, os.PathLike))
                                        and os.fspath(item).endswith(".npy")):
        name = f"<array {i}>" if isinstance(item, np.ndarray) else os.fspath(item)
        img = np.asarray(item if isinstance(item, np.ndarray) else _load_npy(name, "image"),
                         dtype=np.float64)
        if img.ndim != 2:
            raise InputError(f"image {name} has shape {img.shape}; expected a 2-d grey picture")
        if not np.isfinite(img).all():
            raise InputError(f"image {name} holds NaN or inf")
        return img, name
    return read_grey_image(str(item)), str(item)


# --- cached centering rows ------------------------------------------------------------------------

CENTERING_GROUP = "centering"


def centering_key(store: DataStore, description: dict) -> tuple[str, dict]:
    """The cache entry name and identity of a centering row of ``store``.

    ``description`` names the kernel, its parameters and the centering method (JSON values);
    the identity adds the data's shape and :meth:`DataStore.content_checksum`, and the name is a
    hash of the identity's canonical JSON.
    """
    identity = json.loads(json.dumps(
        {"data": store.content_checksum(), "n_samples": store.n_samples,
         "n_features": store.n_features, **description},
        sort_keys=True, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    name = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    return name, identity


def _row_checksum(mk: np.ndarray, mkm: float) -> str:
    return hashlib.sha256(np.ascontiguousarray(mk, dtype="<f8").tobytes()
                          + np.float64(mkm).tobytes()).hexdigest()


def read_centering(store: DataStore, key: tuple[str, dict]) -> tuple[np.ndarray, float] | None:
    """The cached ``(mk, mkm)`` of entry ``key`` (:func:`centering_key`), or ``None``.

    An entry is used only if its identity equals ``key``'s, its shape is ``(n_samples,)`` and its
    values match the checksum written with them; otherwise it is ignored (and logged).
    """
    name, identity = key
    where = f"{store.path.rstrip('/')}/{CENTERING_GROUP}/{name}"
    try:
        arr = zarr.open_array(where, mode="r")
    except Exception:  # noqa: BLE001 - no such entry (zarr raises several kinds)
        return None
    attrs = dict(arr.attrs)
    try:
        if attrs.get("identity") != identity:
            raise ValueError("it was written for other data or another kernel")
        if arr.shape != (store.n_samples,):
            raise ValueError(f"its shape is {arr.shape}, the store holds {store.n_samples} samples")
        mk = np.asarray(arr[:], dtype=np.float64)
        mkm = float(attrs["mkm"])
        if _row_checksum(mk, mkm) != attrs.get("sha256"):
            raise ValueError("its values do not match their checksum")
    except Exception as exc:  # noqa: BLE001 - a damaged entry is recomputed, never used
        log.warning("ignoring the cached centering row %s (%s); computing it again", where, exc)
        return None
    log.info("centering row read from the cache %s", where)
    return mk, mkm


def write_centering(store: DataStore, key: tuple[str, dict], mk: np.ndarray, mkm: float) -> bool:
    """Save ``(mk, mkm)`` as entry ``key`` in the store (written aside, then renamed into place).

    Entries of other data contents (stale: ``X`` changed since) are removed. Returns ``False``,
    with a logged warning, where the store cannot be written (read-only, or an object-store URL,
    where a rename is not atomic): the row is then used but not kept.
    """
    name, identity = key
    if _is_url(store.path):
        log.warning("the centering row is not cached in %s: stores at URLs are read-only to dkha",
                    store.path)
        return False
    group_dir = os.path.join(store.path, CENTERING_GROUP)
    if not os.access(store.path, os.W_OK) or (os.path.isdir(group_dir)
                                               and not os.access(group_dir, os.W_OK)):
        log.warning("the centering row is not cached: the data store %s is read-only (it is "
                    "computed again by every fit)", store.path)
        return False
    tmp = os.path.join(group_dir, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        zarr.open_group(group_dir, mode="a")
        arr = zarr.create_array(tmp, shape=(store.n_samples,), dtype="f8",
                                chunks=(min(store.n_samples, 1 << 20),), compressors=_codecs(),
                                fill_value=np.nan, dimension_names=["sample"])
        arr[:] = mk
        arr.attrs.update({"identity": identity, "mkm": float(mkm),
                          "sha256": _row_checksum(mk, mkm)})
        replace_directory(tmp, os.path.join(group_dir, name))
        for entry in os.listdir(group_dir):
            path = os.path.join(group_dir, entry)
            if entry in (name, "zarr.json") or entry.startswith(".") or not os.path.isdir(path):
                continue    # (".…tmp": another writer's entry in the making)
            try:
                other = dict(zarr.open_array(path, mode="r").attrs).get("identity", {})
            except Exception:  # noqa: BLE001 - a leftover temporary or a broken entry
                other = {}
            if other.get("data") != identity["data"]:
                shutil.rmtree(path, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning("the centering row is not cached in %s (%s); it is computed again by every "
                    "fit", store.path, exc)
        return False
    log.info("centering row cached in %s", os.path.join(group_dir, name))
    return True


def iter_blocks(n: int, size: int) -> Iterable[tuple[int, int]]:
    for a in range(0, n, size):
        yield a, min(a + size, n)
