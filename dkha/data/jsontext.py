"""JSON text that any strict parser reads (RFC 8259: no bare ``NaN`` or ``Infinity``).

Two encodings of the non-finite floats: :func:`dumps` writes them as ``null`` (a figure not
measured: what results, summaries and state files say), :func:`exact_dumps` as the tagged object
``{"$nonfinite": "NaN"}`` (or ``"Infinity"``, ``"-Infinity"``), which :func:`exact_loads` turns
back into the float, so that a checkpoint's history comes back as it was written and a resumed
fit continues bit for bit.
"""

from __future__ import annotations

import json
import math

import numpy as np

#: the key of the object that stands for a non-finite float in :func:`exact_dumps`' text
NONFINITE = "$nonfinite"


def _plain(o, nonfinite):
    """``o`` as plain Python (numpy scalars and arrays as numbers and lists, tuples as lists),
    each non-finite float replaced by ``nonfinite(value)``, recursively."""
    if isinstance(o, dict):
        return {k: _plain(v, nonfinite) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v, nonfinite) for v in o]
    if isinstance(o, np.ndarray):
        return _plain(o.tolist(), nonfinite)
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return nonfinite(o)
    return o


def dumps(obj, **kwargs) -> str:
    """``obj`` as strict JSON (RFC 8259: no bare NaN or Infinity; non-finite numbers, the
    figures not measured, are null); what is not JSON is written as its ``str``."""
    kwargs.setdefault("default", str)
    return json.dumps(_plain(obj, lambda _: None), allow_nan=False, **kwargs)


def _tag(x: float) -> dict:
    return {NONFINITE: "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")}


def _untag(d: dict):
    if len(d) == 1 and NONFINITE in d:
        return float(d[NONFINITE])
    return d


def exact_dumps(obj, **kwargs) -> str:
    """``obj`` as strict JSON that keeps its non-finite floats, as tagged objects
    (:data:`NONFINITE`); read back with :func:`exact_loads`."""
    kwargs.setdefault("default", str)
    return json.dumps(_plain(obj, _tag), allow_nan=False, **kwargs)


def exact_loads(text: str | bytes):
    """The object :func:`exact_dumps` wrote, its non-finite floats restored (text with bare
    ``NaN``, as files written before were, is read too)."""
    return json.loads(text, object_hook=_untag)
