"""Declarative pipelines: one TOML file per experiment, run as an idempotent scheduled job.

    dkha run pipelines/digits-kpca.toml [--run-id ID] [--runs-dir runs] [--scheduler ADDR]

Stages, in order: ``data`` (ingest) → ``fit`` (one or several algorithms) → ``evaluate`` →
``apply`` (denoise, cluster) → ``report``. Each run lives in ``RUNS_DIR/RUN_ID/``:

* ``state.json``  which stages are done, with a hash of each stage's settings: re-running the
  same file skips finished stages; a stage whose settings changed runs again (and so do the
  stages after it); an interrupted fit resumes from its checkpoint;
* ``.lock``       an exclusive ``flock`` held for the whole run (a second run of the same id exits
  with code 73 at once; the lock dies with its process, so a killed run never blocks the next);
* ``pipeline.log``, ``summary.json`` (machine-readable: stages, figures, exit code),
  ``report.html`` (self-contained) and ``report/*.png``.

A ``[[fit]]`` table takes ``name``, ``algorithm`` and the fit parameters of the command line
(:mod:`dkha.estimators.params`): ``passes`` count passes and ``steps``, ``checkpoint_steps``
single-sample steps for every algorithm; ``checkpoint_every`` counts passes (of an online fit:
still steps, with a FutureWarning); ``evaluate_every`` is the estimator's (passes for batch,
steps for online algorithms; :func:`dkha.estimators.factory.estimator_for`).

Exit codes: 0 done; 2 bad pipeline file or input; 3 a fit diverged; 4 a block killed its
workers; 73 another run holds the lock; 75 interrupted or lost the cluster — run again to resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
import tomllib
import warnings
from dataclasses import dataclass, field

import dask.config
import numpy as np

from dkha import algorithms
from dkha.apply.clustering import cluster_run, save_clusters
from dkha.apply.denoise import denoise_image, save_image
from dkha.data import result
from dkha.data.atomic import write_json_atomically
from dkha.data.checkpoint import Checkpointer
from dkha.data.ingest import ingest_array, ingest_images
from dkha.data.patches import read_grey_image
from dkha.data.store import open_store
from dkha.errors import RESUME_HINT, DkhaError, InputError, Interrupted, ParameterError
from dkha.estimators.factory import estimator_for, fit_run
from dkha.estimators.params import pipeline_keys
from dkha.fit.track import kept_figures, result_entry
from dkha.pipeline.report import write_report
from dkha.progress import mark

log = logging.getLogger(__name__)

EXIT_LOCKED = 73

# -- the schema: every key a pipeline file may hold ------------------------------------------------

PIPELINE_KEYS = {"name", "description"}
DATA_KEYS = {"kind", "path", "labels", "paths", "patch", "step", "chunk_rows", "per_class",
             "digits", "noise", "size", "seed", "scale"}
DATA_KINDS = ("digits", "array", "images", "store")
#: a [[fit]] table's keys beside the fit parameters: its name, and its checkpoints (every
#: checkpoint_every passes or checkpoint_steps steps, as the command line's options)
FIT_RUN_KEYS = {"name", "checkpoint_every", "checkpoint_steps"}
#: a [[fit]] table: the keys above and the fit parameters (from the one table)
FIT_KEYS = FIT_RUN_KEYS | pipeline_keys()
#: [evaluate]: ``enabled``; ``ac_index`` (the online fits' reference, True: exact KPCA of the
#: data); ``exact``: every evaluation of the batch fits exact (eq. 22 with E_min, the papers'
#: excess E/E_min − 1; ``dkha.evaluation: exact`` while they fit), not tracked
EVALUATE_KEYS = {"enabled", "ac_index", "exact"}
APPLY_KEYS = {"kind", "fit", "k", "seed", "iterations", "exact"}
APPLY_KINDS = ("denoise", "cluster")
#: [report]: ``paper``, a table of the figures a paper reports beside the fits' own:
#: ``source`` (a line naming them) and, per fit name, ``{step or pass = value}`` of the figure the
#: fit measures (the AC index of an online fit, the excess of a batch one)
REPORT_KEYS = {"enabled", "title", "components", "paper"}
TOP_KEYS = {"pipeline": PIPELINE_KEYS, "data": DATA_KEYS, "fit": FIT_KEYS,
            "evaluate": EVALUATE_KEYS, "apply": APPLY_KEYS, "report": REPORT_KEYS}

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class PipelineError(InputError):
    """A pipeline file that cannot be run as written."""


class LockedError(DkhaError):
    exit_code = EXIT_LOCKED


@dataclass
class Pipeline:
    path: str
    name: str
    data: dict
    fits: list[dict]
    evaluate: dict
    apply: list[dict]
    report: dict
    raw: dict = field(repr=False, default_factory=dict)


def _check_keys(where: str, table, allowed: set) -> None:
    if not isinstance(table, dict):
        raise PipelineError(f"{where} must be a table, got {type(table).__name__}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PipelineError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def safe_id(run_id: str) -> str:
    """A run id usable as one directory name: letters, digits, '.', '_', '-'; no '..'."""
    if not isinstance(run_id, str) or not _SAFE_ID.match(run_id) or ".." in run_id:
        raise ParameterError(f"unsafe run id {run_id!r}: use letters, digits, '.', '_' and '-' "
                             "(no '/', no '..', at most 100 characters)")
    return run_id


def load(path: str) -> Pipeline:
    """Read and validate a pipeline file (unknown keys and bad values are errors)."""
    if not os.path.exists(path):
        raise PipelineError(f"no pipeline file at {path}")
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise PipelineError(f"{path}: unknown section{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(unknown)}; allowed: {', '.join(TOP_KEYS)}")
    head = raw.get("pipeline", {})
    _check_keys("[pipeline]", head, PIPELINE_KEYS)
    name = head.get("name") or os.path.splitext(os.path.basename(path))[0]
    safe_id(name)
    data = raw.get("data")
    if data is None:
        raise PipelineError(f"{path}: a [data] section is required")
    _check_keys("[data]", data, DATA_KEYS)
    if data.get("kind") not in DATA_KINDS:
        raise PipelineError(f"[data] kind must be one of {', '.join(DATA_KINDS)}, "
                            f"got {data.get('kind')!r}")
    fits = raw.get("fit", [])
    if isinstance(fits, dict):
        fits = [fits]
    if not fits:
        raise PipelineError(f"{path}: at least one [[fit]] is required")
    names = set()
    for i, f in enumerate(fits):
        _check_keys(f"[[fit]] #{i + 1}", f, FIT_KEYS)
        if "algorithm" not in f:
            raise PipelineError(f"[[fit]] #{i + 1} needs an algorithm")
        f.setdefault("name", f["algorithm"])
        safe_id(f["name"])
        if f["name"] in names:
            raise PipelineError(f"two [[fit]] sections are named {f['name']!r}; give each a name")
        names.add(f["name"])
    ev = raw.get("evaluate", {})
    _check_keys("[evaluate]", ev, EVALUATE_KEYS)
    apply = raw.get("apply", [])
    if isinstance(apply, dict):
        apply = [apply]
    for i, a in enumerate(apply):
        _check_keys(f"[[apply]] #{i + 1}", a, APPLY_KEYS)
        if a.get("kind") not in APPLY_KINDS:
            raise PipelineError(f"[[apply]] #{i + 1}: kind must be one of {', '.join(APPLY_KINDS)}")
        if a.get("fit", fits[0]["name"]) not in names:
            raise PipelineError(f"[[apply]] #{i + 1}: no [[fit]] named {a.get('fit')!r}")
        a.setdefault("fit", fits[0]["name"])
    rep = raw.get("report", {})
    _check_keys("[report]", rep, REPORT_KEYS)
    return Pipeline(path=os.path.abspath(path), name=name, data=data, fits=fits, evaluate=ev,
                    apply=apply, report=rep, raw=raw)


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def run_lock(run_dir: str):
    """An exclusive, non-blocking ``flock`` on ``RUN_DIR/.lock`` for the duration."""
    import fcntl

    os.makedirs(run_dir, exist_ok=True)
    fd = os.open(os.path.join(run_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"another run holds {run_dir} (its .lock is taken); "
                              "wait for it to finish") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def run_directory(runs_dir: str, run_id: str) -> str:
    """``RUNS_DIR/RUN_ID``, refusing ids and symlinks that would escape ``RUNS_DIR``."""
    safe_id(run_id)
    os.makedirs(runs_dir, exist_ok=True)
    root = os.path.realpath(runs_dir)
    run_dir = os.path.join(runs_dir, run_id)
    real = os.path.realpath(run_dir)
    if os.path.dirname(real) != root:
        raise ParameterError(f"run directory {run_dir} resolves to {real}, outside {root} "
                             "(a symlink?); refusing to write there")
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        raise ParameterError(f"{run_dir} exists and is not a directory")
    return run_dir


class Runner:
    """Runs a :class:`Pipeline` in its run directory, stage by stage, skipping finished ones."""

    def __init__(self, pipeline: Pipeline, run_dir: str, *, cluster: dict | None = None,
                 verbose: bool = False):
        self.p = pipeline
        self.run_dir = run_dir
        self.cluster = cluster or {}
        self.verbose = verbose
        self.state_path = os.path.join(run_dir, "state.json")
        self.state = self._read_state()
        self.figures: dict = self.state.setdefault("figures", {})
        self._invalid = False
        self.current_stage: str | None = None

    # -- state --
    def _read_state(self) -> dict:
        if os.path.exists(self.state_path):
            try:
                with open(self.state_path) as f:
                    return json.load(f)
            except (OSError, ValueError):
                log.warning("state.json unreadable; running every stage again")
        return {"stages": {}, "figures": {}}

    def _write_state(self) -> None:
        write_json_atomically(self.state, self.state_path, indent=1)

    def _stage(self, key: str, settings, fn):
        h = _hash(settings)
        done = self.state["stages"].get(key)
        if done and done.get("hash") == h and done.get("done") and not self._invalid:
            log.info("stage %s: done already, skipped", key)
            return done.get("result")
        if done and done.get("hash") != h:
            self._invalid = True  # later stages depend on this one: run them again too
        log.info("stage %s: running", key)
        mark(f"stage {key}")      # what the heartbeat names until the stage says more
        self.current_stage = key
        t0 = time.perf_counter()
        self.state["stages"][key] = {"hash": h, "done": False, "started": time.time()}
        self._write_state()
        res = fn()
        seconds = time.perf_counter() - t0
        log.info("stage %s: done in %.1f s", key, seconds)
        self.state["stages"][key] = {"hash": h, "done": True, "seconds": seconds,
                                     "result": res}
        self._write_state()
        return res

    # -- stages --
    def run(self) -> dict:
        store = self._stage("data", self.p.data, self.ingest)
        for f in self.p.fits:
            self._stage(f"fit:{f['name']}", {"fit": f, "data": self.p.data},
                        lambda f=f: self.fit(store, f))
        if self.p.evaluate.get("enabled", True):
            for f in self.p.fits:
                self._stage(f"evaluate:{f['name']}",
                            {"fit": f, "paper": self.p.report.get("paper", {}).get(f["name"])},
                            lambda f=f: self.evaluate(f))
        for i, a in enumerate(self.p.apply):
            self._stage(f"apply:{i}:{a['kind']}", {"apply": a, "fit": self._fit(a["fit"])},
                        lambda a=a, i=i: self.apply(a, i))
        if self.p.report.get("enabled", True):
            self.current_stage = "report"
            log.info("stage report: writing %s", os.path.join(self.run_dir, "report.html"))
            mark("stage report")
            write_report(self)  # cheap: always rewritten
        self.current_stage = None
        return self.state

    def _fit(self, name: str) -> dict:
        return next(f for f in self.p.fits if f["name"] == name)

    def fit_dir(self, name: str) -> str:
        return os.path.join(self.run_dir, "fits", name)

    def ingest(self) -> dict:
        d = self.p.data
        kind = d["kind"]
        out = os.path.join(self.run_dir, "data", "store.zarr")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        info: dict = {"store": out}
        if kind == "store":
            st = open_store(self._path(d["path"]), check_finite=True)
            info["store"] = st.path
        elif kind == "array":
            st = ingest_array(self._path(d["path"]), out, overwrite=True,
                              labels=self._path(d["labels"]) if "labels" in d else None,
                              chunk_rows=d.get("chunk_rows"), patch=d.get("patch"),
                              step=d.get("step"))
        elif kind == "digits":
            from sklearn.datasets import load_digits

            dg = load_digits()
            keep = d.get("digits", list(range(10)))
            per = d.get("per_class")
            idx = np.concatenate([np.flatnonzero(dg.target == k)[:per] for k in keep])
            scale = d.get("scale", "x/8-1")
            X = dg.data[idx] / 8.0 - 1.0 if scale == "x/8-1" else dg.data[idx] / 16.0
            st = ingest_array(X, out, labels=dg.target[idx], overwrite=True,
                              chunk_rows=d.get("chunk_rows", 256))
        else:  # images, optionally resized and with added gaussian noise (the denoising task)
            st, extra = self._ingest_images(d, out)
            info.update(extra)
        info.update({"n_samples": st.n_samples, "n_features": st.n_features})
        return info

    def _ingest_images(self, d: dict, out: str):
        import skimage.transform


        paths = d.get("paths") or [d["path"]]
        noise = float(d.get("noise", 0.0))
        size = d.get("size")
        rng = np.random.default_rng(d.get("seed", 0))
        files, extra = [], {"clean": [], "noisy": []}
        for i, p in enumerate(paths):
            img = read_grey_image(p if p.startswith("skimage:") else self._path(p))
            if size:
                img = skimage.transform.resize(img, (size, size), anti_aliasing=True)
            clean = os.path.join(self.run_dir, "data", f"clean-{i}.npy")
            np.save(clean, img)
            save_image(img, clean[:-4] + ".png")
            extra["clean"].append(clean)
            if noise > 0:
                img = img + noise * rng.standard_normal(img.shape)
                noisy = os.path.join(self.run_dir, "data", f"noisy-{i}.npy")
                np.save(noisy, img)
                save_image(np.clip(img, 0, 1), noisy[:-4] + ".png")
                extra["noisy"].append(noisy)
                files.append(noisy)
            else:
                files.append(clean)
        # .npy files: the noisy values as they are (no rescaling to [0, 1])
        st = ingest_images(files, out, patch=int(d.get("patch", 11)), step=int(d.get("step", 2)),
                           chunk_rows=d.get("chunk_rows"), overwrite=True)
        return st, extra

    def _path(self, p: str) -> str:
        """Paths in a pipeline file are relative to the file."""
        if os.path.isabs(p) or "://" in p:
            return p
        return os.path.join(os.path.dirname(self.p.path), p)

    def fit(self, store: dict, f: dict) -> dict:
        run = self.fit_dir(f["name"])
        values = {k: v for k, v in f.items() if k not in FIT_RUN_KEYS}
        resume = Checkpointer(run).latest() is not None
        online = algorithms.family(f["algorithm"], option="algorithm") == algorithms.ONLINE
        model = estimator_for(f["algorithm"], values, store=store["store"], where="",
                              verbose=self.verbose, **({} if online else self.cluster))
        every, steps = f.get("checkpoint_every"), f.get("checkpoint_steps")
        if online and every is not None:    # its former meaning in pipelines: steps
            warnings.warn(f"[[fit]] {f['name']}: checkpoint_every of an online fit counts steps "
                          "in pipelines (passes on the command line); write checkpoint_steps "
                          "(checkpoint_every will count passes)", FutureWarning, stacklevel=2)
            every, steps = None, steps or every
        exact = {"dkha.evaluation": "exact"} if self.p.evaluate.get("exact") else {}
        with dask.config.set(exact):
            fit_run(model, store["store"], run, overwrite=not resume, resume=resume,
                    checkpoint_every=every, checkpoint_steps=steps,
                    ac_reference=self.p.evaluate.get("ac_index", True))
        if online:
            ds = model.to_dataset()
            res = {"run_dir": run, "members": int(ds.sizes.get("member", 0)),
                   "backoffs": len(model.backoffs_)}
            if "ac_index" in ds and ds.sizes.get("evaluation", 0):
                res["ac_index"] = float(ds["ac_index"].values[-1])
            return res
        kept = model.attrs_.get("kept_state")
        last = result_entry(model.history_, kept)
        # the fit's total (timings.json: startup, centering, start, passes, the rest, earlier
        # attempts'), not only its passes' (the history's wall time)
        total = (getattr(model, "timings_", None) or {}).get("total", last.get("wall_time"))
        return {"run_dir": run, "excess": last.get("excess"), "pass": last.get("pass"),
                "fit_seconds": total, "backoffs": len(model.backoffs_),
                **kept_figures(model.attrs_)}

    def evaluate(self, f: dict) -> dict:
        """The fit's figures for ``summary.json``: its last evaluation, its seconds
        (``fit_seconds``: timings.json's total), the state it kept and why
        (:func:`kept_figures`), and every evaluation along the way (:func:`along`)."""
        ds = result.load(self.fit_dir(f["name"]))
        out = {}
        for key in ("pass", "excess", "error", "error_min", "ac_index", "wall_time"):
            if key in ds and ds.sizes.get("evaluation", 0):
                v = ds[key].values[-1]
                out[key] = None if not np.isfinite(v) else float(v)
        timings = result.load_timings(self.fit_dir(f["name"])) or {}
        if "total" in timings:      # the fit's seconds as timings.json adds them up
            out["fit_seconds"] = float(timings["total"])
        out.update(kept_figures(ds.attrs), **along(ds),
                   **paper_figures(self.p.report, f["name"]))
        self.figures[f["name"]] = out
        return out

    def apply(self, a: dict, i: int) -> dict:
        run = self.fit_dir(a["fit"])
        if a["kind"] == "cluster":
            res = cluster_run(run, int(a.get("k", 10)), seed=int(a.get("seed", 0)), **self.cluster)
            save_clusters(res, os.path.join(self.run_dir, f"apply-{i}-clusters.zarr"),
                          overwrite=True)
            out = {k: v for k, v in res.summary().items() if v is not None}
        else:
            data = self.state["stages"]["data"]["result"]
            if not data.get("noisy"):
                raise PipelineError("[[apply]] denoise needs [data] kind = \"images\" "
                                    "with noise > 0")
            res = denoise_image(run, np.load(data["noisy"][0]), reference=np.load(data["clean"][0]),
                                iterations=a.get("iterations"), **self.cluster)
            png = os.path.join(self.run_dir, f"apply-{i}-denoised.png")
            save_image(np.clip(res.image, 0, 1), png)
            out = {"image": png, **{k: v for k, v in res.summary().items()
                                    if isinstance(v, (int, float, str)) or v is None}}
        self.figures[f"apply-{i}-{a['kind']}"] = out
        return out


def along(ds) -> dict:
    """Every evaluation of a run, as lists: ``excess_per_pass`` (``{pass: E/E_min − 1}`` of
    the exact evaluations, the paper's measure), ``ac_index_per_step`` (``{step: AC}`` of an
    online run); only those the run measured."""
    out = {}
    if not ds.sizes.get("evaluation", 0):
        return out
    for var, axis, key in (("excess", "pass", "excess_per_pass"),
                           ("ac_index", "step", "ac_index_per_step")):
        if var in ds and np.isfinite(ds[var].values).any():
            out[key] = {str(int(x)): (float(v) if np.isfinite(v) else None)
                        for x, v in zip(ds[axis].values, ds[var].values)}
    return out


def paper_figures(report: dict, name: str) -> dict:
    """The paper's figures for the fit ``name`` from ``[report] paper`` (``paper``: ``{step or
    pass: value}``, ``paper_source``); nothing where the file gives none."""
    paper = report.get("paper") or {}
    if not isinstance(paper.get(name), dict):
        return {}
    return {"paper": {str(k): float(v) for k, v in paper[name].items()},
            "paper_source": str(paper.get("source", "the paper"))}


def _exit_code(exc: BaseException) -> int:
    """The exit code a failed pipeline reports: a user's error its own, an interrupt 130, any
    other failure (a bug, a missing module) 1."""
    if isinstance(exc, DkhaError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    return 1


def _continued_by_rerun(exc: BaseException, path: str, run_id: str | None) -> BaseException:
    """A resumable error (exit code 75: stopped, lost the cluster) says how the pipeline goes
    on: running it again (its fit resumes from the checkpoint), not ``dkha fit ... --resume``."""
    if not isinstance(exc, DkhaError) or exc.exit_code != 75:
        return exc
    again = f"`dkha run {path}" + (f" --run-id {run_id}" if run_id else "") + "`"
    text = str(exc)
    text = (text.replace(RESUME_HINT, again) if RESUME_HINT in text
            else f"{text}; continue with {again}")
    return type(exc)(text)


def run_file(path: str, *, run_id: str | None = None, runs_dir: str = "runs",
             cluster: dict | None = None, verbose: bool = False) -> tuple[int, dict]:
    """Run a pipeline file; returns ``(exit code, summary)``. Writes ``summary.json`` always."""
    p = load(path)
    run_dir = run_directory(runs_dir, run_id or p.name)
    os.makedirs(run_dir, exist_ok=True)
    summary = {"pipeline": p.path, "run_id": run_id or p.name, "run_dir": os.path.abspath(run_dir),
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    handler = logging.FileHandler(os.path.join(run_dir, "pipeline.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    pkg = logging.getLogger("dkha")
    pkg.addHandler(handler)
    old_level = pkg.level
    pkg.setLevel(min(old_level or logging.INFO, logging.INFO))
    code = 0
    try:
        with run_lock(run_dir):
            runner = Runner(p, run_dir, cluster=cluster, verbose=verbose)
            try:
                state = runner.run()
                summary["stages"] = {k: {"done": v.get("done"), "seconds": v.get("seconds")}
                                     for k, v in state["stages"].items()}
                summary["figures"] = runner.figures
            except BaseException as caught:
                # any failure, not only a user's error, must show in the exit code and summary
                exc = _continued_by_rerun(caught, path, run_id)
                code = _exit_code(exc)
                summary["error"] = str(exc) if isinstance(exc, DkhaError) else \
                    f"{type(exc).__name__}: {exc}"
                summary["failed_stage"] = runner.current_stage
                summary["stages"] = {k: {"done": v.get("done"), "seconds": v.get("seconds")}
                                     for k, v in runner.state["stages"].items()}
                if isinstance(exc, Interrupted):    # a stop asked for: not a failure
                    summary["stopped"] = True
                    log.info("stage %s stopped", runner.current_stage)
                else:
                    log.error("stage %s failed: %s", runner.current_stage, summary["error"])
                if exc is caught:
                    raise
                raise exc from None
            finally:
                summary["exit_code"] = code
                summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                write_json_atomically(summary, os.path.join(run_dir, "summary.json"), indent=1)
    finally:
        pkg.removeHandler(handler)
        handler.close()
        pkg.setLevel(old_level)
    return code, summary
