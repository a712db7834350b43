"""The cache of exact spectra in a data store, beside its centering rows.

``E_min`` (the denominator of the excess error) needs the exact top eigenvalues of ``K'``:
as costly as solving the problem exactly. Whoever computes them (``dkha evaluate --exact``, a
fit with a ``tol`` on the excess, a test) keeps them in the store's sub-group ``spectrum``, one
entry per kernel, parameters and centering (keyed like the centering rows, with the content of
``X``), holding the top ``k`` eigenvalues and ``‖K'‖²_F``; any later fit or evaluation asking for
``r ≤ k`` of them reads them back instead of recomputing.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from dkha.data.atomic import write_json_atomically
from dkha.data.centering import centering_key, values_checksum
from dkha.data.jsontext import exact_loads
from dkha.data.store import DataStore

log = logging.getLogger(__name__)

SPECTRUM_GROUP = "spectrum"


def spectrum_key(store: DataStore, centering: dict, checksum: str | None = None
                 ) -> tuple[str, dict]:
    """The entry name and identity of the spectrum of ``K'`` for the kernel and centering
    ``centering`` describes (:attr:`dkha.engine.rows.RowEngine.centering`, less ``cached``;
    ``checksum``: the store's content key, :func:`~dkha.data.centering.centering_key`)."""
    description = {k: v for k, v in centering.items() if k != "cached"}
    return centering_key(store, dict(description, what="spectrum"), checksum)


def read_spectrum(store: DataStore, key: tuple[str, dict], r: int) -> np.ndarray | None:
    """The cached top ``r`` eigenvalues of entry ``key`` (descending), or ``None`` (no entry,
    fewer than ``r`` values, another identity, or a checksum that does not match: logged)."""
    name, identity = key
    if "://" in store.path:
        return None
    path = os.path.join(store.path, SPECTRUM_GROUP, name + ".json")
    try:
        with open(path) as f:
            entry = exact_loads(f.read())
    except (OSError, ValueError):
        return None
    values = np.asarray(entry.get("eigenvalues", []), dtype=np.float64)
    if entry.get("identity") != identity or entry.get("sha256") != values_checksum(values):
        log.warning("ignoring the cached spectrum %s (written for other data or damaged)", path)
        return None
    if len(values) < r:
        return None
    log.info("top %d eigenvalues of K' read from the cache %s", r, path)
    return values[:r].copy()


def write_spectrum(store: DataStore, key: tuple[str, dict], eigenvalues: np.ndarray) -> bool:
    """Keep ``eigenvalues`` (the exact top ones of ``K'``, descending) as entry ``key``, unless
    the entry already holds as many; ``False`` where the store cannot be written."""
    name, identity = key
    if "://" in store.path:
        return False
    values = np.asarray(eigenvalues, dtype=np.float64)
    have = read_spectrum(store, key, len(values))
    if have is not None:
        return True
    group = os.path.join(store.path, SPECTRUM_GROUP)
    try:
        os.makedirs(group, exist_ok=True)
        write_json_atomically({"identity": identity, "eigenvalues": values,
                               "sha256": values_checksum(values)},
                              os.path.join(group, name + ".json"), exact=True)
    except OSError as exc:
        log.warning("the spectrum is not cached in %s (%s)", store.path, exc)
        return False
    log.info("top %d eigenvalues of K' cached in %s", len(values), group)
    return True
