"""The cache of centering rows in a data store.

A store caches the centering rows computed on it (:func:`read_centering`,
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

import numpy as np
import zarr

from dkha.data.atomic import aside, replace_directory
from dkha.data.storage import is_url
from dkha.data.store import DataStore, chunk_codecs

log = logging.getLogger(__name__)

CENTERING_GROUP = "centering"


def centering_key(store: DataStore, description: dict, checksum: str | None = None
                  ) -> tuple[str, dict]:
    """The cache entry name and identity of a centering row of ``store``.

    ``description`` names the kernel, its parameters and the centering method (JSON values);
    the identity adds the data's shape and its content key (``checksum``, default
    :meth:`DataStore.content_checksum`), and the name is a hash of the identity's canonical JSON.
    """
    identity = json.loads(json.dumps(
        {"data": checksum or store.content_checksum(), "n_samples": store.n_samples,
         "n_features": store.n_features, **description},
        sort_keys=True, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    name = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    return name, identity


def values_checksum(values) -> str:
    """The SHA-256 of ``values`` as little-endian float64: a cache entry's check of its values
    (a centering row's ``mk`` then ``mkm``, a spectrum's eigenvalues)."""
    return hashlib.sha256(np.ascontiguousarray(values, dtype="<f8").tobytes()).hexdigest()


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
        if values_checksum(np.append(mk, mkm)) != attrs.get("sha256"):
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
    if is_url(store.path):
        log.warning("the centering row is not cached in %s: stores at URLs are read-only to dkha",
                    store.path)
        return False
    group_dir = os.path.join(store.path, CENTERING_GROUP)
    if not os.access(store.path, os.W_OK) or (os.path.isdir(group_dir)
                                               and not os.access(group_dir, os.W_OK)):
        log.warning("the centering row is not cached: the data store %s is read-only (it is "
                    "computed again by every fit)", store.path)
        return False
    tmp = aside(os.path.join(group_dir, name))
    try:
        zarr.open_group(group_dir, mode="a")
        arr = zarr.create_array(tmp, shape=(store.n_samples,), dtype="f8",
                                chunks=(min(store.n_samples, 1 << 20),), compressors=chunk_codecs(),
                                fill_value=np.nan, dimension_names=["sample"])
        arr[:] = mk
        arr.attrs.update({"identity": identity, "mkm": float(mkm),
                          "sha256": values_checksum(np.append(mk, mkm))})
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
