"""What a saved run says about itself in the words plain xarray and the CF conventions use: each
variable's ``long_name`` and ``units`` (:data:`VARIABLE_ATTRS`), the dataset's ``Conventions``,
``title``, ``history`` and ``source`` (:func:`dataset_attrs`), and attrs every netCDF writer
takes (:func:`encode_attrs`, read back by :func:`decode_attrs`).

netCDF attributes are strings, numbers or flat arrays of numbers: a run's dict attrs
(``kernel_parameters``, ``path_estimates``, ``kept_state``, an online run's ``state_scalars``)
and lists of strings (``history_measures``) are saved as JSON text and named, blank-separated,
in the attr :data:`JSON_ATTRS`; an attr whose value is ``None`` (a setting left to resolve to
nothing: ``eta0`` from the start, no ``tol``, ``center_sample`` for the exact centering) is not
written, and reads back as ``None``. :func:`dkha.data.result.load` decodes them; runs saved
before held them as zarr's JSON attrs, which need no decoding.

Pure Python and numpy.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping

import numpy as np

from dkha.version import __version__

#: the CF version the runs follow
CONVENTIONS = "CF-1.11"
#: the attr naming the attrs saved as JSON text (blank-separated)
JSON_ATTRS = "json_attrs"

#: ``long_name`` and ``units`` (CF: ``"1"`` is dimensionless) of a run's variables and
#: coordinates, where the variable does not say otherwise
VARIABLE_ATTRS = {
    "alpha": {"long_name": "coefficients of the components over the centered mapped training "
                           "samples: component i = sum_j alpha[i, j] Phi'(x_j)", "units": "1"},
    "eigenvalue": {"long_name": "eigenvalue of the centered kernel matrix K' (eq. 13, not "
                                "divided by the number of samples)", "units": "1"},
    "mk": {"long_name": "centering row: the mean of each column of the kernel matrix K",
           "units": "1"},
    "projection": {"long_name": "projection of the training sample on the component "
                                "(C = A K', the final pass's)", "units": "1"},
    "component_image": {"long_name": "picture of the component (pre-image)", "units": "1"},
    "component": {"long_name": "component, by decreasing eigenvalue", "units": "1"},
    "image": {"long_name": "index of the image the patch was cut from", "units": "1"},
    "image_name": {"long_name": "name of the image the patch was cut from"},
    "row": {"long_name": "row of the patch on its image's patch grid (a grid index, 0 at the "
                         "top: the patch's top edge is at pixel row step * row)", "units": "1"},
    "col": {"long_name": "column of the patch on its image's patch grid (a grid index, 0 at "
                         "the left: the patch's left edge is at pixel column step * col)",
            "units": "1"},
    "patch_row": {"long_name": "pixel row of the picture, counted up from its bottom edge (the "
                               "array's first row, the picture's top, is the largest)",
                  "units": "1"},
    "patch_col": {"long_name": "pixel column of the picture, counted from its left edge",
                  "units": "1"},
    "backoff_step": {"long_name": "step at which a step guard tripped", "units": "1"},
    "backoff_pass": {"long_name": "pass of the step at which a step guard tripped",
                     "units": "1"},
    "backoff_gain_before": {"long_name": "effective base gain eta0 before the backoff",
                            "units": "1"},
    "backoff_gain_after": {"long_name": "effective base gain eta0 after the backoff (halved)",
                           "units": "1"},
    "dictionary": {"long_name": "dictionary members (training samples kept by the online "
                                "algorithm)", "units": "1"},
    "member_index": {"long_name": "sample index of the dictionary member in the stream",
                     "units": "1"},
    "member_step": {"long_name": "step at which the member joined the dictionary", "units": "1"},
    "mean_coefficient": {"long_name": "running mean in the dictionary's span (centering)",
                         "units": "1"},
}


def with_variable_attrs(ds):
    """``ds`` (an xarray dataset) with :data:`VARIABLE_ATTRS` on each variable that has none of
    its own under that key (a new object; the arrays are not copied)."""
    ds = ds.copy(deep=False)
    for name, attrs in VARIABLE_ATTRS.items():
        if name in ds.variables:
            var = ds.variables[name]
            var.attrs.update({k: v for k, v in attrs.items() if k not in var.attrs})
    return ds


def stamped(what: str) -> str:
    """A CF ``history`` line: now (UTC, ISO 8601), this dkha, ``what`` it did."""
    now = datetime.datetime.now(datetime.UTC)
    return f"{now.strftime('%Y-%m-%dT%H:%M:%SZ')} dkha {__version__}: {what}"


def history_line(attrs: Mapping) -> str:
    """The CF ``history`` line of a fit: when, which dkha, what ran on what."""
    ran = attrs.get("algorithm", "?")
    path = attrs.get("path")
    if path and path != ran:
        ran = f"{ran} ({path})"
    return stamped(f"fit {ran}, {attrs.get('n_components', '?')} components of "
                   f"{attrs.get('n_samples', '?')} samples of {attrs.get('store', '?')}")


def dataset_attrs(attrs: Mapping) -> dict:
    """The run's global attrs: ``Conventions``, ``title``, ``source`` and ``history`` (kept
    where ``attrs`` hold them, e.g. the history line written once when the fit ended), then
    ``attrs``."""
    title = (f"dkha kernel principal components: {attrs.get('algorithm', '?')}, "
             f"{attrs.get('n_components', '?')} components of {attrs.get('store', '?')}")
    return {"Conventions": CONVENTIONS, "title": title, "source": f"dkha {__version__}",
            "history": history_line(attrs), **attrs}


def _netcdf_value(v) -> bool:
    """Whether a netCDF attribute holds ``v`` as it is: a string, a finite number, or a
    non-empty flat list of finite numbers."""
    if isinstance(v, str):
        return True
    if isinstance(v, (bool, np.bool_)):
        return False
    if isinstance(v, (int, np.integer)):
        return -2**31 <= int(v) < 2**31
    if isinstance(v, (float, np.floating)):
        return math.isfinite(float(v))
    if isinstance(v, (list, tuple)) and v:
        return all(not isinstance(x, (bool, np.bool_)) and isinstance(x, (int, float, np.number))
                   and math.isfinite(float(x)) for x in v)
    return False


def encode_attrs(attrs: Mapping) -> dict:
    """``attrs`` as every netCDF writer takes them: ``None`` left out, strings, numbers and flat
    lists of numbers as they are, anything else (dicts, lists of strings, booleans) as JSON text
    named in :data:`JSON_ATTRS`. Encoding encoded attrs changes nothing."""
    out, as_json = {}, set(str(attrs.get(JSON_ATTRS, "")).split())
    for k, v in attrs.items():
        if v is None or k == JSON_ATTRS:
            continue
        if (k in as_json and isinstance(v, str)) or _netcdf_value(v):   # (already JSON text)
            out[k] = v
        else:
            out[k] = json.dumps(v, allow_nan=False, separators=(",", ":"))
            as_json.add(k)
    as_json &= set(out)
    if as_json:
        out[JSON_ATTRS] = " ".join(sorted(as_json))
    return out


def decode_attrs(attrs: Mapping) -> dict:
    """The attrs :func:`encode_attrs` wrote, their JSON text read back (a run saved before, with
    no :data:`JSON_ATTRS`, as it is)."""
    as_json = set(str(attrs.get(JSON_ATTRS, "")).split())
    out = {}
    for k, v in attrs.items():
        if k == JSON_ATTRS:
            continue
        out[k] = json.loads(v) if k in as_json and isinstance(v, str) else v
    return out
