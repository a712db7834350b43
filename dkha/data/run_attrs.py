"""A saved run's attrs (``components.zarr``, a checkpoint's ``meta["attrs"]``) as later dkha
versions read them: an attr saved under a former name, and the identifying attrs of a run.

Earlier runs kept the kernel's parameters twice, in ``kernel_parameters`` and at the top level
(``sigma``, ``degree``, ``offset``, ``gamma``); the top-level copies are no longer written nor
read. A top-level kernel parameter could overwrite an attr of the same name, which is
why a former name that is also a kernel parameter of the run gives no value (:func:`saved_value`).

Pure Python: the estimators' parameter table (which says the former names) imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def saved_value(attrs: Mapping, key: str, former: str | None = None):
    """``attrs[key]`` (``None`` where absent). A run saved before ``key`` had its name holds it
    as ``former`` — unless ``former`` is also one of the run's kernel parameters, which runs
    saved before kept at the top level too, over it: then ``None`` (the default)."""
    if key in attrs or former is None or former not in attrs:
        return attrs.get(key)
    if former in attrs.get("kernel_parameters", {}):
        return None
    return attrs[former]


def identity_map(keys: Iterable[str] | Mapping[str, str | None]) -> dict[str, str | None]:
    """The identifying attrs as ``{attr: former name or None}`` (a plain list of names: none
    renamed)."""
    return dict(keys) if isinstance(keys, Mapping) else dict.fromkeys(keys)
