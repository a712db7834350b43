"""Writing files and zarr directories aside and renaming them into place, so a reader sees the old
version or the new one, never half of one: :func:`write_file_atomically` (and
:func:`write_json_atomically`, strict JSON) for a file, :func:`write_zarr_atomically` for an
xarray dataset (consolidated metadata, then :func:`replace_directory`)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
import warnings

import zarr

from dkha.data import jsontext


@contextlib.contextmanager
def fixed_width_strings():
    """A context in which zarr writes numpy's fixed-width strings (``<U``, what xarray reads back
    as it wrote them: :func:`dkha.data.result.fixed_strings`) without its warning that their
    zarr v3 data type is an extension, not yet in the specification (zarr-python and xarray
    both read it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=zarr.errors.UnstableSpecificationWarning)
        yield


def consolidate(path: str) -> None:
    """Write consolidated metadata, so a plain ``xarray.open_zarr(path)`` opens without warning.

    (zarr warns that consolidated metadata is not yet in the v3 specification; zarr-python and
    xarray both read it.)
    """
    with warnings.catch_warnings(), fixed_width_strings():
        warnings.simplefilter("ignore", category=UserWarning)
        zarr.consolidate_metadata(path)


def aside(target: str) -> str:
    """A unique hidden name beside ``target`` to write it under before the rename
    (``.NAME.<uuid>.tmp``: concurrent writers never share one, and no reader opens it)."""
    head, name = os.path.split(os.path.abspath(target))
    return os.path.join(head, f".{name}.{uuid.uuid4().hex}.tmp")


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

    The store is written aside under a unique temporary name beside ``target`` (:func:`aside`),
    its metadata consolidated (a plain ``xarray.open_zarr`` opens it), and renamed into place
    (:func:`replace_directory`). A failure leaves the old ``target`` as it was and removes the
    temporary (chunks of it that tasks still running elsewhere write after the failure may
    remain, under the temporary's hidden name, which no reader opens). Lazy (dask) variables
    are computed where the current scheduler runs them. Returns ``target``'s path.
    """
    target = os.fspath(target)
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = aside(target)
    try:
        with fixed_width_strings():
            ds.to_zarr(tmp, mode="w", consolidated=False, zarr_format=3)
        consolidate(tmp)
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def fsync_directory(path: str) -> None:
    """Make the entries of directory ``path`` (a rename into it) durable, where the platform and
    file system allow (not on Windows, nor where a directory cannot be fsync'ed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:     # e.g. EINVAL: a file system that does not sync directories
        pass
    finally:
        os.close(fd)


def write_file_atomically(content: str | bytes, target: str | os.PathLike) -> str:
    """Write ``content`` (text as UTF-8) as the file ``target``, replacing one there.

    The file is written beside ``target`` under a unique hidden name (:func:`aside`, created
    exclusively), flushed and fsync'ed, renamed over
    ``target`` (``os.replace``), and the directory fsync'ed where supported. On any failure the
    temporary is removed and the old ``target`` is left as it was. Returns ``target``'s path.
    """
    target = os.fspath(target)
    data = content.encode() if isinstance(content, str) else bytes(content)
    tmp = aside(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_directory(os.path.dirname(tmp))
    return target


def write_json_atomically(obj, target: str | os.PathLike, *, exact: bool = False,
                          **kwargs) -> str:
    """Write ``obj`` as strict JSON (RFC 8259: no bare NaN or Infinity) to the file ``target``
    (:func:`write_file_atomically`). Non-finite floats are ``null`` (not measured:
    :func:`~dkha.data.jsontext.dumps`), or with ``exact`` tagged objects that
    :func:`~dkha.data.jsontext.exact_loads` reads back as the floats they were. ``kwargs`` go to
    ``json.dumps`` (``indent``, ``sort_keys``). Nothing is written where ``obj`` cannot be
    encoded. Returns ``target``'s path."""
    text = (jsontext.exact_dumps if exact else jsontext.dumps)(obj, **kwargs)
    return write_file_atomically(text, target)
