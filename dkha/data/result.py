"""The components dataset: schema, atomic save, load, and run-directory checks.

``RUN_DIR/components.zarr`` is an xarray dataset:

* ``alpha (component, sample)`` float64 — the coefficient matrix ``A``;
* ``eigenvalue (component)`` — eq. 13 estimates (eigenvalues of ``K'``, not divided by ``l``);
* ``mk (sample)`` and attr ``mkm`` — the centering (attrs ``centering``: ``"exact"``, or
  ``"sample"`` for a row estimated from ``center_sample`` columns);
* history over ``evaluation``: ``error``, ``error_min``, ``excess`` with the coordinates
  ``pass``, ``step`` and ``wall_time`` (seconds of fitting, evaluations excluded) that index
  it (``ds.excess.plot.line(x="pass")``, ``ds.swap_dims(evaluation="pass")``); every history
  variable carries ``long_name`` and ``units`` attrs (:data:`HISTORY_ATTRS`). Runs saved before
  held ``pass``, ``step``, ``wall_time`` as data variables: :func:`load` makes them
  coordinates;
  where entries say which measure they are, the attr ``history_measures`` (one per entry:
  ``"exact"``: eq. 22 against the exact ``E_min``; ``"residual"``: the largest relative residual
  ``‖K'v − θv‖/θ`` after a product of a Krylov solve, with its Ritz values ``ritz_value
  (evaluation, component)``; ``"ritz"``: a KHA pass tracked without ``E_min``,
  :mod:`dkha.fit.track`) and the variables ``residual``, ``captured`` and ``change``. Only the
  figures some entry measured are written (a Krylov fit evaluated by its residual alone has no
  ``error``, ``error_min``, ``excess``); NaN only where an entry is of another measure;
* the backoffs over ``backoff`` (a step guard tripped; the fit rolled back to the start of the
  block and halved its gain): ``backoff_step``, ``backoff_pass`` (of the bad step),
  ``backoff_gain_before``, ``backoff_gain_after`` (the effective η0) — empty when none;
* attrs: algorithm, kernel and its parameters, the hyper-parameters that played a part, seed,
  data store path, n_samples, n_features, centered, dkha version, and CF's ``Conventions``,
  ``title``, ``history``, ``source``; every variable's ``long_name`` and ``units``
  (:mod:`dkha.data.cf`). Saved as every netCDF writer takes them (:func:`save`: dicts and
  lists of strings as JSON text named in ``json_attrs``, ``None`` left out), read back as
  Python values (:func:`load`). The variables along ``sample`` are chunked along ``sample``.

Where the dataset lives (``RUN_DIR/components.zarr``, or a group of the tree of models fitted
together): :mod:`dkha.data.layout`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from dkha.data import cf
from dkha.data.atomic import (
    fixed_width_strings,
    write_json_atomically,
    write_zarr_atomically,
)
from dkha.data.jsontext import dumps
from dkha.data.layout import COMPONENTS, after_change, components_path, save_member, tree_members
from dkha.data.run_attrs import identity_map, saved_value
from dkha.errors import InputError, RunDirectoryError, StoreNotFoundError
from dkha.progress import phase

if TYPE_CHECKING:
    from dkha.data.store import DataStore

HISTORY_FIELDS = ("pass", "step", "error", "error_min", "excess", "wall_time")
#: the history fields that index the evaluations: coordinates along ``evaluation``
HISTORY_COORDS = ("pass", "step", "wall_time")
#: ``long_name`` and ``units`` of the history variables (CF conventions: "1" is dimensionless)
HISTORY_ATTRS = {
    "pass": {"long_name": "pass over the training samples (krylov: K'V products)", "units": "1"},
    "step": {"long_name": "update step (samples presented)", "units": "1"},
    "wall_time": {"long_name": "wall time of fitting (evaluations excluded)", "units": "s"},
    "error": {"long_name": "reconstruction error E(A)", "units": "1"},
    "error_min": {"long_name": "least reconstruction error E_min of r components", "units": "1"},
    "excess": {"long_name": "excess error E/E_min − 1", "units": "1"},
    "ac_index": {"long_name": "AC index (mean |cos| to exact components)", "units": "1"},
    "members": {"long_name": "dictionary members", "units": "1"},
    "explained_variance": {"long_name": "explained variance per component (eq. 23)",
                           "units": "1"},
    "residual": {"long_name": "largest relative residual ‖K'v − θv‖/θ", "units": "1"},
    "captured": {"long_name": "tracked Σθ² of the components' span", "units": "1"},
    "change": {"long_name": "sine of the largest angle the span moved since the previous entry",
               "units": "1"},
    "ritz_value": {"long_name": "Ritz value θ of the component: the Rayleigh quotient of its "
                                "Ritz vector after the Krylov product", "units": "1"},
}
#: history figures with one value per component, saved over ``(evaluation, component)``
HISTORY_COMPONENT_FIELDS = ("ritz_value",)
BACKOFF_FIELDS = ("step", "pass", "gain_before", "gain_after")
#: the figures of entries that are not exact evaluations (NaN where an entry has none):
#: ``residual`` (Krylov: the largest ‖K'v − θv‖/λ_1), ``captured`` and ``change`` (tracked KHA
#: passes, :mod:`dkha.fit.track`)
TRACKED_FIELDS = ("residual", "captured", "change")


def history_dataset(history: list[dict]) -> dict:
    """The history variables over ``evaluation``: the coordinates, and each figure that some
    entry measured (a figure no entry measured is absent, not NaN: a Krylov fit evaluated by
    its residual has no ``error``; NaN only at the entries of another measure, which the
    ``history_measures`` attr names)."""
    data = {}
    fields = HISTORY_FIELDS + (TRACKED_FIELDS if any("measure" in h for h in history) else ())
    for f in fields:
        dtype = np.int64 if f in ("pass", "step") else np.float64
        values = np.array([_number(h.get(f)) for h in history], dtype=dtype)
        if f in HISTORY_COORDS or not history or np.isfinite(values).any():
            data[f] = ("evaluation", values)
    for f in HISTORY_COMPONENT_FIELDS:     # a figure per component: (evaluation, component)
        rows = [h.get(f) for h in history]
        width = max((len(v) for v in rows if v is not None), default=0)
        if width:
            values = np.full((len(rows), width), np.nan)
            for i, v in enumerate(rows):
                if v is not None:
                    values[i, :len(v)] = [_number(x) for x in v]
            data[f] = (("evaluation", "component"), values)
    return data


def _number(v):
    """A history figure as a number: NaN for one not measured (None, as strict JSON holds it)."""
    return np.nan if v is None else v


def backoff_dataset(backoffs: list[dict]) -> dict:
    """The ``backoff_*`` variables of a run's backoffs (:attr:`BatchKHA.backoffs`)."""
    data = {}
    for f in BACKOFF_FIELDS:
        dtype = np.int64 if f in ("step", "pass") else np.float64
        data[f"backoff_{f}"] = ("backoff", np.array([b[f] for b in backoffs], dtype=dtype))
    return data


def sample_coords(path: str) -> dict[str, tuple[str, np.ndarray, dict]]:
    """The coordinates along ``sample`` of a data store (``{name: ("sample", values, attrs)}``,
    empty for stores without provenance), strings as numpy's fixed-width ``str``
    (:func:`fixed_strings`), with their ``long_name`` and ``units``."""
    ds = xr.open_zarr(path)
    out = {}
    for name, var in ds.coords.items():
        if var.dims == ("sample",):
            values = np.asarray(var.values)
            attrs = dict(cf.VARIABLE_ATTRS.get(name, {}), **var.attrs)
            out[name] = ("sample", values if values.dtype.kind in "biuf" else
                         fixed_strings(values), attrs)
    return out


def fixed_strings(values) -> np.ndarray:
    """Strings as numpy's fixed-width ``str`` (``<U``), which xarray saves in zarr and netCDF and
    reads back as ``<U``: zarr's variable-length strings come back as numpy's StringDType,
    which unstacking (the README's ``set_index(...).unstack()``, padding a coordinate with NaN)
    cannot pad."""
    values = np.asarray(values)
    return values.astype(str) if values.size else values.astype("<U1")


def projection_array(C: np.ndarray, store: DataStore | None) -> xr.DataArray:
    """``projection (sample, component)`` from ``C = A K'`` (component × sample), with the
    store's provenance coordinates (image, image_name, row, col; a store written from an array
    has none)."""
    coords = {"component": np.arange(C.shape[0])}
    if store is not None and store.rows is None:
        coords.update(sample_coords(store.path))
    coords["component"] = ("component", coords["component"], cf.VARIABLE_ATTRS["component"])
    return xr.DataArray(np.ascontiguousarray(np.asarray(C, dtype=np.float64).T),
                        dims=("sample", "component"), coords=coords, name="projection")


def with_history_coords(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with ``pass``, ``step``, ``wall_time`` as coordinates along ``evaluation`` and the
    history's ``long_name``/``units`` attrs (runs saved before held them as data variables)."""
    ds = ds.set_coords([c for c in HISTORY_COORDS if c in ds.data_vars])
    for name, attrs in HISTORY_ATTRS.items():
        if name in ds.variables and ds[name].dims[:1] == ("evaluation",):
            ds[name].attrs.update({k: v for k, v in attrs.items() if k not in ds[name].attrs})
    return ds


def history_of(ds: xr.Dataset) -> list[dict]:
    """The history entries of a saved run (every variable and coordinate over ``evaluation``)."""
    names = [k for k, v in ds.variables.items() if v.dims and v.dims[0] == "evaluation"]
    out = []
    for i in range(ds.sizes.get("evaluation", 0)):
        entry = {}
        for k in names:
            v = ds[k].values[i]
            entry[k] = v.copy() if np.ndim(v) else v.item()
        measures = ds.attrs.get("history_measures")
        if measures is not None and i < len(measures):
            entry["measure"] = measures[i]
        out.append(entry)
    return out


#: bytes of a chunk of the variables along ``sample`` (``alpha``, ``projection``, ``mk``): a
#: reader of some samples reads a few chunks, each with every component
SAMPLE_CHUNK_BYTES = 4 * 2**20


def sample_chunks(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with its variables along ``sample`` chunked along ``sample`` only (every component
    in each chunk; :data:`SAMPLE_CHUNK_BYTES`), as saved."""
    for name, var in ds.variables.items():
        if "sample" in var.dims and var.ndim <= 2 and name not in ds.dims:
            width = max(1, int(np.prod([n for d, n in var.sizes.items() if d != "sample"])))
            rows = max(1, min(var.sizes["sample"], SAMPLE_CHUNK_BYTES // (8 * width)))
            var.encoding["chunks"] = tuple(rows if d == "sample" else n
                                           for d, n in var.sizes.items())
    return ds


def build_dataset(alpha: np.ndarray, eigenvalue: np.ndarray, history: list[dict], attrs: dict,
                  *, mk: np.ndarray | None = None, mkm: float | None = None,
                  member_dim: str = "sample", extra: dict | None = None,
                  backoffs: list[dict] = ()) -> xr.Dataset:
    """A run's ``components.zarr`` dataset (the module docstring), every variable with its
    ``long_name`` and ``units`` and the run's global attrs (:func:`dkha.data.cf.dataset_attrs`:
    ``Conventions``, ``title``, ``history``); its attrs as Python values (dicts, ``None``),
    encoded for netCDF when saved (:func:`save`)."""
    data = {"alpha": (("component", member_dim), np.asarray(alpha, dtype=np.float64)),
            "eigenvalue": ("component", np.asarray(eigenvalue, dtype=np.float64))}
    if mk is not None:
        data["mk"] = ("sample", np.asarray(mk, dtype=np.float64))
    data.update(history_dataset(history))
    data.update(backoff_dataset(list(backoffs)))
    if extra:
        data.update(extra)
    ds = with_history_coords(xr.Dataset(data, coords={"component": np.arange(alpha.shape[0])}))
    attrs = dict(attrs)
    if any("measure" in h for h in history):
        attrs["history_measures"] = [str(h.get("measure", "exact")) for h in history]
    if mkm is not None:
        attrs["mkm"] = float(mkm)
    ds = sample_chunks(cf.with_variable_attrs(ds))
    ds.attrs.update(jsonable(cf.dataset_attrs(attrs)))
    return ds


def jsonable(d: dict) -> dict:
    """``d`` as strict JSON would give it back (numpy scalars as numbers, tuples as lists,
    NaN and infinities as None: not measured)."""
    return json.loads(dumps(d))


def check_run_dir(run_dir: str, attrs: dict, overwrite: bool, identity) -> None:
    """Refuse a run directory that is a file, or that holds a different run (unless overwrite):
    one whose attrs differ in a key of ``identity`` (the estimators' parameter table says
    which, with their former names: :func:`dkha.estimators.params.identity_attrs`)."""
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        raise RunDirectoryError(f"{run_dir} exists and is not a directory")
    comp = components_path(run_dir)
    if overwrite or not os.path.exists(comp):
        return
    try:
        old = cf.decode_attrs(xr.open_zarr(comp, consolidated=False).attrs)
    except Exception:  # noqa: BLE001 - unreadable in any way: refused in one line
        raise RunDirectoryError(
            f"{run_dir} holds a components.zarr dkha cannot read; pass --overwrite to replace it"
        ) from None
    new = jsonable(attrs)
    saved = {k: saved_value(old, k, former) for k, former in identity_map(identity).items()}
    diffs = [k for k in saved if saved[k] != new.get(k)]
    if diffs:
        detail = ", ".join(f"{k}: {saved[k]!r} there, {new.get(k)!r} now" for k in diffs[:4])
        raise RunDirectoryError(
            f"{run_dir} already holds a different run ({detail}); pass --overwrite to replace it"
        )


def save(ds: xr.Dataset, run_dir: str, *, member: bool = False) -> str:
    """Write ``ds`` as ``RUN_DIR/components.zarr`` atomically (aside, then rename), its attrs
    as every netCDF writer takes them (:func:`dkha.data.cf.encode_attrs`; :func:`load` reads
    them back); ``member``: as the group of a model fitted together in its parent's tree
    (:mod:`dkha.data.layout`)."""
    phase(f"saving the run in {run_dir}")
    if member:
        return save_member(encoded(ds), run_dir)
    return write_zarr_atomically(encoded(ds), os.path.join(run_dir, COMPONENTS))


def encoded(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` (not copied but for its attrs) with its attrs encoded for netCDF
    (:func:`dkha.data.cf.encode_attrs`): what plain xarray takes to ``to_netcdf``."""
    out = ds.copy(deep=False)
    out.attrs = cf.encode_attrs(ds.attrs)
    return out


def add_variable(run_dir: str, var: xr.DataArray) -> None:
    """Add the variable ``var`` (named, along the run's dimensions) to the saved run in
    ``run_dir``: its array is written beside the others, then the metadata consolidated again
    (a reader sees the run without it, or with it whole)."""
    path = components_path(run_dir)
    with xr.open_zarr(path) as saved:     # appending writes the group's attrs: the run's
        ds = xr.Dataset({var.name: var}).drop_vars([c for c in var.coords if c in saved.variables])
        ds.attrs = dict(saved.attrs)
    with fixed_width_strings():
        ds.to_zarr(path, mode="a", consolidated=False, zarr_format=3)
    after_change(path)


TIMINGS = "timings.json"


def save_timings(timings: dict, run_dir: str) -> str:
    """Write a fit's ``timings_`` (seconds, per-pass records) as ``RUN_DIR/timings.json``."""
    return write_json_atomically(timings, os.path.join(run_dir, TIMINGS), indent=1)


def load_timings(run_dir: str) -> dict | None:
    """The ``timings.json`` of a run directory (``None`` when the run has none)."""
    path = os.path.join(os.fspath(run_dir), TIMINGS)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def load(run_dir: str) -> xr.Dataset:
    """The components dataset of a run directory, loaded into memory."""
    run_dir = os.fspath(run_dir)
    if not os.path.exists(run_dir):
        raise StoreNotFoundError(f"no run directory at {run_dir}")
    comp = components_path(run_dir)
    if not os.path.isdir(comp):
        raise InputError(f"{run_dir} is not a dkha run directory (no {COMPONENTS}); "
                         "fit one with `dkha fit`")
    models = tree_members(comp)
    if models:
        raise InputError(f"{run_dir} holds {len(models)} models fitted together "
                         f"({', '.join(models)}): load one, e.g. "
                         f"{os.path.join(run_dir, models[0])} (all of them: "
                         f"xarray.open_datatree({comp!r}, engine='zarr'))")
    try:
        # read here, not through dask: no graph for the cluster (27 kB for a small run)
        ds = xr.open_zarr(comp, consolidated=False, chunks=None).load()
    except Exception as exc:  # noqa: BLE001 - unreadable in any way: one line
        raise InputError(f"cannot read {comp}: {exc}") from None
    if "alpha" not in ds:
        raise InputError(f"{comp} has no alpha variable; it was not written by dkha")
    ds.attrs = cf.decode_attrs(ds.attrs)
    return objects_for_strings(with_history_coords(ds))


def objects_for_strings(ds):
    """``ds`` with its string coordinates as Python objects (zarr gives numpy's StringDType,
    which cannot be padded with NaN: unstacking patches of images of different sizes needs
    that)."""
    strings = {k: v.astype(object) for k, v in ds.coords.items() if v.dtype.kind == "T"}
    return ds.assign_coords(strings) if strings else ds
