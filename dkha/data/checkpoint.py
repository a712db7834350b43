"""Checkpoints: the complete state of a fit, written atomically, verified when read.

Layout: ``RUN_DIR/checkpoints/step-<t>/`` holding ``state.npz`` (arrays only, loaded with
``allow_pickle=False``) and ``meta.json`` (step, pass, history, seconds, the run's identifying
attrs and the SHA-256 of ``state.npz``; strict JSON, its NaNs tagged:
:func:`dkha.data.jsontext.exact_dumps`).

Writing: the files go to ``checkpoints/.tmp-<uuid>/``, are flushed and fsync'ed, the directory is
fsync'ed, then renamed to ``step-<t>``: the rename is the only commit point, so a crash mid-write
leaves the previous checkpoint intact (half-written ``.tmp-*`` directories are ignored and
removed by the next write). The newest ``keep`` checkpoints are kept.

Reading: the newest checkpoint whose ``meta.json`` parses and whose ``state.npz`` matches its
checksum; a damaged one is skipped with a warning (the previous good one is used), never read as
numbers.

The solver state is saved exactly as held (for the factored engine: ``S̃``, ``T``, ``C̃``, ``ρ``,
the Gram matrices, ``λ``, the step and fold counters), so a resumed run continues bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from dkha.data import result
from dkha.data.atomic import fsync_directory, replace_directory, write_json_atomically
from dkha.data.jsontext import dumps, exact_loads
from dkha.data.layout import components_path
from dkha.data.run_attrs import identity_map, saved_value
from dkha.errors import (
    DkhaWarning,
    InputError,
    ParameterError,
    RunDirectoryError,
    RunFinished,
    StoreNotFoundError,
)

log = logging.getLogger(__name__)

DIRNAME = "checkpoints"
PREFIX = "step-"
FORMAT_VERSION = 1


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- solver state <-> arrays ---------------------------------------------------------------------

def state_to_arrays(state) -> tuple[dict[str, np.ndarray], dict]:
    """Split a solver state object into arrays and JSON scalars (every attribute, as held, but
    those the state names ``TRANSIENT``)."""
    arrays, scalars = {}, {}
    if hasattr(state, "sync"):      # the factored state's S̃ may have messages queued
        state.sync()
    skip = getattr(state, "TRANSIENT", frozenset())
    for k, v in vars(state).items():
        if k in skip:
            continue
        if isinstance(v, np.ndarray):
            arrays[k] = v
        elif v is None or isinstance(v, (bool, int, float, str, np.integer, np.floating, np.bool_)):
            scalars[k] = v.item() if hasattr(v, "item") else v
        else:
            raise TypeError(f"cannot checkpoint state attribute {k!r} of type {type(v).__name__}")
    return arrays, scalars


def state_from_arrays(cls, arrays: dict[str, np.ndarray], scalars: dict):
    """Rebuild a state object of class ``cls`` from :func:`state_to_arrays`' output."""
    obj = cls.__new__(cls)
    for k, v in scalars.items():
        setattr(obj, k, v)
    for k, v in arrays.items():
        setattr(obj, k, np.array(v, order="C"))
    if hasattr(cls, "forget_values"):  # the factored state's snapshot cache
        obj.forget_values()
    return obj


# --- on disk --------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """One loaded checkpoint."""

    path: str
    step: int
    meta: dict
    arrays: dict[str, np.ndarray]


class Checkpointer:
    """Writes and finds the checkpoints of one run directory."""

    def __init__(self, run_dir: str, keep: int = 2):
        self.run_dir = os.fspath(run_dir)
        self.dir = os.path.join(self.run_dir, DIRNAME)
        self.keep = max(1, int(keep))

    def save(self, step: int, arrays: dict[str, np.ndarray], meta: dict) -> str:
        """Write a checkpoint for ``step`` atomically; returns its path."""
        os.makedirs(self.dir, exist_ok=True)
        for name in os.listdir(self.dir):  # leftovers of a crash mid-write
            if name.startswith(".tmp-"):
                shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)
        tmp = os.path.join(self.dir, f".tmp-{uuid.uuid4().hex}")
        os.makedirs(tmp)
        npz = os.path.join(tmp, "state.npz")
        with open(npz, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        meta = dict(meta, step=int(step), format_version=FORMAT_VERSION, sha256=_sha256(npz))
        write_json_atomically(meta, os.path.join(tmp, "meta.json"), exact=True)
        fsync_directory(tmp)
        final = os.path.join(self.dir, f"{PREFIX}{int(step):012d}")
        replace_directory(tmp, final)  # the same step again (a re-run) replaces it
        fsync_directory(self.dir)
        self._prune()
        log.info("checkpoint at step %d: %s", step, final)
        return final

    def _committed(self) -> list[str]:
        if not os.path.isdir(self.dir):
            return []
        names = [n for n in os.listdir(self.dir)
                 if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()]
        return sorted(names, reverse=True)

    def steps(self) -> list[int]:
        """The steps of the committed checkpoints, newest first."""
        return [int(n[len(PREFIX):]) for n in self._committed()]

    def _prune(self) -> None:
        for name in self._committed()[self.keep:]:
            shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)

    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint, skipping damaged ones (with a warning); None if none."""
        for name in self._committed():
            path = os.path.join(self.dir, name)
            try:
                return self._load(path)
            except (OSError, ValueError, KeyError) as exc:
                warnings.warn(f"checkpoint {path} is damaged ({exc}); trying an older one",
                              DkhaWarning, stacklevel=2)
        return None

    def _load(self, path: str) -> Checkpoint:
        with open(os.path.join(path, "meta.json")) as f:
            meta = exact_loads(f.read())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format version {meta.get('format_version')}")
        npz = os.path.join(path, "state.npz")
        if _sha256(npz) != meta["sha256"]:
            raise ValueError("state.npz does not match its checksum")
        with np.load(npz, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return Checkpoint(path=path, step=int(meta["step"]), meta=meta, arrays=arrays)

    def newest_meta(self) -> dict | None:
        """The ``meta.json`` of the newest checkpoint whose meta parses (its arrays neither read
        nor verified: :meth:`latest` does that), or None: what a run asked for, cheaply."""
        for name in self._committed():
            try:
                with open(os.path.join(self.dir, name, "meta.json")) as f:
                    return exact_loads(f.read())
            except (OSError, ValueError):
                continue
        return None

    def at_step(self, step: int) -> Checkpoint | None:
        """The valid checkpoint written at ``step`` (one of the ``keep`` newest), or None."""
        path = os.path.join(self.dir, f"{PREFIX}{int(step):012d}")
        try:
            return self._load(path) if os.path.isdir(path) else None
        except (OSError, ValueError, KeyError):
            return None

    def require_latest(self) -> Checkpoint:
        """:meth:`latest`, or a clear error when the run has no usable checkpoint."""
        if not os.path.isdir(self.run_dir):
            raise StoreNotFoundError(f"cannot resume: no run directory at {self.run_dir}")
        ck = self.latest()
        if ck is None:
            if self._committed():
                raise InputError(f"cannot resume {self.run_dir}: every checkpoint is damaged; "
                                 "start again without --resume (with --overwrite)")
            if os.path.isdir(components_path(self.run_dir)):
                raise InputError(f"cannot resume {self.run_dir}: it holds no checkpoint, its "
                                 f"fit is complete ({result.COMPONENTS}); fit again with "
                                 "--overwrite to replace it")
            raise InputError(f"cannot resume {self.run_dir}: it holds no checkpoint (fit with "
                             "--checkpoint-every N or --checkpoint-steps N to write them)")
        return ck

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def open_fit(run_dir: str | None, attrs: dict, *, overwrite: bool, resume: bool,
             checkpoint_every: int = 0, exact: dict | None = None, identity=(),
             resume_identity=None, repeat: Mapping = MappingProxyType({})
             ) -> tuple[Checkpointer | None, Checkpoint | None, Mapping]:
    """Prepare ``run_dir`` for a fit: returns ``(checkpointer, checkpoint, meta)``.

    ``checkpointer`` is ``None`` without a run directory; ``checkpoint`` the one to resume from
    (``resume``), whose saved ``attrs`` (the run's identifying keys: ``resume_identity``,
    default ``identity`` and the data's shape; ``identity`` is what tells runs apart, with
    the former names of renamed attrs, :func:`dkha.estimators.params.identity_attrs`) and ``exact``
    settings (those a bit-identical continuation also needs, e.g. the block size) must equal the
    current ones, else the resume is refused listing the differences. Without ``resume`` a
    directory holding a different run, or checkpoints of an unfinished one, is refused unless
    ``overwrite`` (then the checkpoints are removed). ``meta`` (read-only: the attrs, the exact
    settings and what a bare resume ``repeat``-s) goes into every checkpoint written.
    """
    if checkpoint_every and int(checkpoint_every) < 0:
        raise ParameterError(f"checkpoint_every must be a positive number, got {checkpoint_every}")
    if (checkpoint_every or resume) and run_dir is None:
        raise ParameterError("checkpoints and --resume need a run directory")
    attrs = result.jsonable(attrs)
    exact = result.jsonable(exact or {})
    meta = MappingProxyType({"attrs": attrs, "exact": exact, **repeat})
    if run_dir is None:
        return None, None, meta
    checkpointer = Checkpointer(run_dir)
    if resume:
        if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
            raise RunDirectoryError(f"cannot resume: {run_dir} is not a directory")
        finished(run_dir, checkpointer, attrs, identity)
        ck = checkpointer.require_latest()
        keys = resume_identity if resume_identity is not None else \
            {**identity_map(identity), "n_samples": None, "n_features": None}
        diffs = differences(ck.meta.get("attrs", {}), attrs, keys)
        diffs += differences(ck.meta.get("exact", {}), exact, tuple(exact))
        if diffs:
            raise ParameterError(f"cannot resume {run_dir} with different settings or data: "
                                 + "; ".join(diffs))
        return checkpointer, ck, meta
    result.check_run_dir(run_dir, attrs, overwrite, identity)
    if checkpointer.latest() is not None:
        if not overwrite:
            raise RunDirectoryError(
                f"{run_dir} holds checkpoints of an unfinished run; pass --resume to "
                "continue it or --overwrite to start over")
        checkpointer.clear()
    return checkpointer, None, meta


def finished(run_dir: str, checkpointer: Checkpointer, attrs: dict, identity) -> None:
    """Raise :class:`~dkha.errors.RunFinished` where a resume finds the run complete: its
    ``components.zarr`` saved, no checkpoint left, the same identifying attrs (a different run
    there is refused as a fit without ``--resume`` refuses it, pointing at ``--overwrite``)."""
    if checkpointer._committed():      # a checkpoint (even a damaged one): resumed as before
        return
    if not os.path.isdir(components_path(run_dir)):
        return
    result.check_run_dir(run_dir, attrs, False, identity)
    raise RunFinished.of(run_dir)


def differences(saved: dict, current: dict, keys) -> list[str]:
    """``key: saved → current`` for each identifying attr that differs (``keys``: names, or
    ``{name: former name}`` for attrs an older checkpoint holds under another name)."""
    out = []
    for k, former in identity_map(keys).items():
        a, b = saved_value(saved, k, former), current.get(k)
        if dumps(a, sort_keys=True) != dumps(b, sort_keys=True):
            out.append(f"{k}: {a!r} in the checkpoint, {b!r} now")
    return out
