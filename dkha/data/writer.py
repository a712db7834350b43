"""Writing data stores: rows appended in pieces, the store moved into place once complete."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import zarr

from dkha import config
from dkha.data import cf
from dkha.data.atomic import aside, consolidate, fixed_width_strings, replace_directory
from dkha.data.storage import is_url, reach, url_fs
from dkha.data.store import (
    FINITE_ATTR,
    FORMAT,
    FORMAT_VERSION,
    DataStore,
    chunk_codecs,
    open_store,
)
from dkha.errors import InputError, ParameterError, RunDirectoryError

log = logging.getLogger(__name__)


class StoreWriter:
    """Writes a data store aside and moves it into place on :meth:`commit`.

    Rows are appended in any number of pieces; the target appears only once complete, so a
    reader never sees a half-written store. Whether every value is finite is recorded as the rows
    go by (:data:`~dkha.data.store.FINITE_ATTR`), so a fit does not read all of ``X`` to check it.
    """

    def __init__(self, out: str | os.PathLike, n_features: int, *, chunk_rows: int | None = None,
                 overwrite: bool = False, with_labels: bool = False, label_dtype="i8"):
        self.out = os.fspath(out)
        self.chunk_rows = int(config.settings(chunk_rows=chunk_rows).chunk_rows)
        if self.chunk_rows < 1:
            raise ParameterError(f"chunk rows must be positive, got {self.chunk_rows}")
        if is_url(self.out):
            self._open_url(overwrite)
        else:
            self._open_local(overwrite)
        self.X = self.group.create_array(
            "X", shape=(0, n_features), chunks=(self.chunk_rows, n_features), dtype="f8",
            dimension_names=["sample", "feature"], compressors=chunk_codecs(), fill_value=np.nan,
        )
        self.label = None
        if with_labels:
            self.label = self.group.create_array(
                "label", shape=(0,), chunks=(self.chunk_rows,), dtype=label_dtype,
                dimension_names=["sample"], compressors=chunk_codecs(),
            )
        self.n = 0
        self._buf: list[np.ndarray] = []
        self._lbuf: list[np.ndarray] = []
        self._buffered = 0
        self._finite = True

    def _open_local(self, overwrite: bool) -> None:
        if os.path.lexists(self.out):
            if not overwrite:
                raise RunDirectoryError(f"{self.out} already exists; "
                                        "pass --overwrite to replace it")
            if not os.path.isdir(self.out) or os.path.islink(self.out):
                raise RunDirectoryError(f"{self.out} exists and is not a directory; "
                                        "remove it first")
        parent = os.path.dirname(os.path.abspath(self.out))
        os.makedirs(parent, exist_ok=True)
        self.tmp = aside(self.out)
        self.group = zarr.open_group(self.tmp, mode="w")

    def _open_url(self, overwrite: bool) -> None:
        """Object storage has no atomic rename: the store is written in place, its group
        metadata (with ``format``, which marks a complete dkha store) last, and removed on
        failure. An existing store is removed first (``overwrite``)."""
        fs, root, exists = reach(self.out)
        self.tmp = None
        if exists:
            if not overwrite:
                raise RunDirectoryError(f"{self.out} already exists; "
                                        "pass --overwrite to replace it")
            fs.rm(root, recursive=True)
        self.group = zarr.open_group(self.out, mode="w")

    @property
    def rows_appended(self) -> int:
        """Rows appended so far (written, and buffered until a chunk is whole)."""
        return self.n + self._buffered

    def append(self, X: np.ndarray, labels: np.ndarray | None = None) -> None:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.X.shape[1]:
            raise InputError(f"rows of {X.shape[1] if X.ndim == 2 else X.shape} features appended "
                             f"to a store of {self.X.shape[1]}")
        self._buf.append(X)
        self._finite = self._finite and bool(np.isfinite(X).all())
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
            self._write_coord(name, dtype, values_of)
        if coords:
            self.X.attrs["coordinates"] = " ".join(coords)
        # one metadata write (attrs.update writes the group's metadata once per key)
        self.group.update_attributes({"format": FORMAT, "format_version": FORMAT_VERSION,
                                      **attrs, FINITE_ATTR: self._finite})
        if self.tmp is None:
            consolidate(self.out)
        else:
            consolidate(self.tmp)
            replace_directory(self.tmp, self.out)
        return open_store(self.out)

    def _write_coord(self, name: str, dtype, values_of) -> None:
        """The coordinate ``name`` along ``sample``, a chunk at a time, with its ``long_name``
        and ``units``; strings as numpy's fixed-width ``<U``, which xarray reads back so
        (zarr's variable-length strings come back as StringDType, which unstacking cannot
        pad)."""
        with fixed_width_strings():
            arr = self.group.create_array(
                name, shape=(self.n,), chunks=(self.chunk_rows,), dtype=dtype,
                dimension_names=["sample"],
                compressors=chunk_codecs() if dtype is not str else "auto",
                attributes=dict(cf.VARIABLE_ATTRS.get(name, {})))
            for a in range(0, self.n, self.chunk_rows):
                b = min(a + self.chunk_rows, self.n)
                arr[a:b] = values_of(a, b)

    def abort(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            fs, root = url_fs(self.out)
            fs.rm(root, recursive=True)
        except Exception as exc:  # noqa: BLE001 - cleaning up after a failure already raised
            log.warning("could not remove the partly written store %s: %s", self.out, exc)
