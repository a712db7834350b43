"""Finishing zarr directories: consolidated metadata, and moving a finished directory into place
by renames, so a reader sees the old version or the new one, never half of one."""

from __future__ import annotations

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
    renamed aside first and removed after the new one is in place.
    """
    if os.path.lexists(final):
        old = f"{final}.{uuid.uuid4().hex}.old"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
