"""Finishing zarr directories: consolidated metadata, and moving a finished directory into place
by renames, so a reader sees the old version or the new one, never half of one
(:func:`write_zarr_atomically` does all of it for an xarray dataset)."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
import warnings

import zarr


def consolidate(path: str) -> None:
    """Write consolidated metadata, so a plain ``xarray.open_zarr(path)`` opens without warning.

    (zarr warns that consolidated metadata is not yet in the v3 specification; zarr-python and
    xarray both read it.)
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        zarr.consolidate_metadata(path)


def replace_directory(tmp: str, final: str) -> None:
    """Move the finished directory ``tmp`` to ``final`` (replacing one there) by renames.

    A reader sees the old ``final`` or the new one, never a half-written one: the old one is
    renamed aside first and removed after the new one is in place. Two writers replacing the same
    ``final`` at once both succeed, the later rename winning (one that finds ``final`` put back
    between its two renames tries again).
    """
    while True:
        old = None
        if os.path.lexists(final):
            old = f"{final}.{uuid.uuid4().hex}.old"
            try:
                os.replace(final, old)
            except FileNotFoundError:       # another writer moved it aside meanwhile
                continue
        try:
            os.replace(tmp, final)
        except OSError as exc:
            # another writer's directory arrived meanwhile: ours replaces it on the next round
            raced = exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and os.path.lexists(final)
            if old is not None and not raced:
                os.replace(old, final)      # put the old one back
            elif old is not None:
                shutil.rmtree(old, ignore_errors=True)
            if raced:
                continue
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return


def write_zarr_atomically(ds, target: str | os.PathLike) -> str:
    """Write the xarray dataset ``ds`` as the zarr store ``target``, replacing one there.

    The store is written aside under a unique temporary name beside ``target``
    (``.NAME.<uuid>.tmp``: concurrent writers never share one), its metadata consolidated (a
    plain ``xarray.open_zarr`` opens it), and renamed into place (:func:`replace_directory`). A
    failure leaves the old ``target`` as it was and removes the temporary (chunks of it that
    tasks still running elsewhere write after the failure may remain, under the temporary's
    hidden name, which no reader opens). Lazy (dask) variables are computed where the current
    scheduler runs them. Returns ``target``'s path.
    """
    target = os.fspath(target)
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    try:
        ds.to_zarr(tmp, mode="w", consolidated=False, zarr_format=3)
        consolidate(tmp)
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
