"""``dkha fit`` again on a run it finished, answered before the engine loads (issue 43).

A scheduler reruns the same ``dkha fit …`` (or ``dkha fit … --resume``) after the fit finished:
the fit itself finds the run finished (:func:`dkha.data.checkpoint.finished`) before any cluster,
but only after loading dask, distributed, xarray and scikit-learn (seconds). So a fit from the
command line that ends well leaves :data:`RECORD` in its run directory: the request (its options
as parsed, but those that only change what is printed), every ``dkha.*`` setting in effect, the
data store's metadata and the saved run's attrs, as digests. The same request later, with the same
settings, on the same store, finding the run's attrs unchanged and no checkpoint, is this run
finished: one line, exit code 0, with nothing but the command line's parser and
``dask.config`` loaded. Anything else (no record, another option, setting or store, a run
changed or replaced since, a checkpoint) goes the fit's own way, which decides as before: this
record only ever answers what the fit would answer, sooner.

The record is written only where the options alone made the run's settings (not where a
``--resume`` repeated settings recorded in a checkpoint) and for one model a run directory.
Pure Python, light: :mod:`json`, :mod:`hashlib` and the configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from dkha import config
from dkha.errors import RunFinished
from dkha.version import __version__

#: the file in a run directory that records the command line that finished it
RECORD = "fit-request.json"
FORMAT = 1
#: the options that change only what the command prints, or how it gets to the same run
_NOT_REQUEST = frozenset({"verbose", "quiet", "json", "resume", "overwrite", "given",
                          "subcommand_parser", "storage_option"})
_COMPONENTS = "components.zarr"     # dkha.data.result.COMPONENTS, without importing xarray
_CHECKPOINTS = "checkpoints"        # dkha.data.checkpoint.DIRNAME (its step-<t> directories)


def request_of(args) -> dict | None:
    """The options of ``dkha fit`` that make its run, as JSON gives them back; ``None`` where
    no record applies (a remote store or run directory, storage options)."""
    if getattr(args, "storage_option", None) or any(
            "://" in str(p) for p in (args.store, args.out)):
        return None
    values = {k: v for k, v in sorted(vars(args).items()) if k not in _NOT_REQUEST}
    return json.loads(json.dumps(values, default=repr))


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _store_digest(store: str) -> str | None:
    """The data store's identity as its metadata says it: its real path, its attrs and ``X``'s
    array metadata (shape, chunks, data type); ``None`` where they cannot be read."""
    group = _read_json(os.path.join(store, "zarr.json"))
    x = _read_json(os.path.join(store, "X", "zarr.json"))
    if group is None or x is None:
        return None
    return _digest([os.path.realpath(store), group.get("attributes"), x])


def _run_digest(run_dir: str) -> str | None:
    """The saved run's attrs (``components.zarr``), or ``None`` where there is none, or where a
    checkpoint is left (a fit not finished, or one to continue)."""
    ck = os.path.join(run_dir, _CHECKPOINTS)
    if os.path.isdir(ck) and any(n.startswith("step-") for n in os.listdir(ck)):
        return None
    group = _read_json(os.path.join(run_dir, _COMPONENTS, "zarr.json"))
    if group is None or "algorithm" not in (group.get("attributes") or {}):
        return None     # (models fitted together: the tree of dkha.data.layout, no quick answer)
    return _digest(group.get("attributes"))


def _settings() -> dict:
    return {k: repr(v) for k, v in dataclasses.asdict(config.settings()).items()}


def _record_of(request: dict, args) -> dict | None:
    store, run = _store_digest(args.store), _run_digest(args.out)
    if store is None or run is None:
        return None
    return {"format": FORMAT, "dkha_version": __version__, "request": request,
            "settings": _settings(), "store": store, "run": run}


def record(request: dict | None, args) -> None:
    """Write :data:`RECORD` in ``args.out`` once ``dkha fit`` with the options ``request``
    (:func:`request_of` before the command ran) finished it (best effort: a run directory
    that cannot take it only loses the quick answer)."""
    rec = None if request is None else _record_of(request, args)
    if rec is None:
        return
    path = os.path.join(args.out, RECORD)
    if _read_json(path) == rec:      # the run's files untouched by a rerun
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(rec, f, sort_keys=True, indent=1)
        os.replace(tmp, path)
    except OSError:
        return


def finished_line(args) -> str | None:
    """The line ``dkha fit`` prints where ``args`` ask again for the run its output directory
    holds, finished (see the module docstring); ``None``: the fit decides."""
    if args.command != "fit" or args.overwrite:
        return None
    request = request_of(args)
    saved = _read_json(os.path.join(args.out, RECORD)) if request is not None else None
    if not saved or saved.get("format") != FORMAT or saved.get("request") != request:
        return None
    if saved.get("run") != _run_digest(args.out) or saved.get("store") != _store_digest(
            args.store):
        return None
    if saved.get("dkha_version") != __version__ or saved.get("settings") != _settings():
        return None
    return str(RunFinished.of(args.out))
