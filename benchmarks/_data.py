"""What the benchmarks share: this checkout's dkha, the data they run on, timing, memory, ratios.

Every script in ``benchmarks/`` is run as ``python benchmarks/NAME.py`` from the repository root
(its folder is then first on ``sys.path``) and imports this module before dkha, so that

* ``REPO``: this checkout's dkha is the one imported (put first on ``sys.path`` here), and
  :func:`checkout_env` gives child processes the same (``PYTHONPATH`` at a checkout);
* :func:`patches` / :func:`patch_store`: 11×11 grey patches of scikit-image's bundled
  photographs, the data most figures use (a store is reused when it already matches);
* :func:`timed` / :func:`best_of`: wall seconds of a block, the fastest of several runs;
* :func:`peak_rss_mb` (this process), :func:`peak_rss_watch` / :func:`run_watched` (a command
  and all its child processes, sampled every 0.1 s): peak resident memory;
* :func:`load_average` and :func:`ratio`: what every printed figure stands beside — figures of
  a shared machine move with its load, so a script prints ratios of what it measured in one run.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if sys.path[:1] != [REPO]:
    sys.path.insert(0, REPO)     # this checkout's dkha, not an installed copy

import numpy as np
import psutil

from dkha.data.ingest import ingest_array
from dkha.data.patches import extract_patches, read_grey_image
from dkha.data.store import open_store

PHOTOS = ("camera", "moon", "coins", "astronaut", "coffee", "chelsea", "rocket", "brick", "grass",
          "gravel")


def patches(n_samples: int, *, patch: int = 11, step: int = 2, photos=PHOTOS) -> np.ndarray:
    """The first ``n_samples`` ``patch×patch`` patches (grid of ``step``) of the photographs."""
    out, have = [], 0
    for name in photos:
        P = extract_patches(read_grey_image(f"skimage:{name}"), patch, step)
        out.append(P[: n_samples - have])
        have += len(out[-1])
        if have >= n_samples:
            return np.concatenate(out)
    raise ValueError(f"only {have} patches available; lower step")


def patch_store(path: str, n_samples: int, *, chunk_rows: int = 2048, **kw):
    """A data store of ``n_samples`` patches at ``path`` (reused when it already matches)."""
    if os.path.exists(path):
        try:
            st = open_store(path)
            if st.n_samples == n_samples:
                return st
        except Exception:  # noqa: BLE001, S110 - a broken store is written again below
            pass
    return ingest_array(patches(n_samples, **kw), path, chunk_rows=chunk_rows, overwrite=True)


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident memory of this process (or its finished children), in MiB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024.0


def load_average() -> str:
    """The load average (the machine may be shared) and the core count, for a benchmark's log."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def peak_rss_watch(pid: int, out: list) -> threading.Thread:
    """Sample the RSS of ``pid`` and its children until it exits; the maximum goes to ``out``."""
    def run():
        peak = 0
        try:
            proc = psutil.Process(pid)
            while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                rss = proc.memory_info().rss
                for child in proc.children(recursive=True):
                    try:
                        rss += child.memory_info().rss
                    except psutil.Error:
                        pass
                peak = max(peak, rss)
                time.sleep(0.1)
        except psutil.Error:
            pass
        out.append(peak)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def run_watched(cmd: list[str], *, env: dict | None = None, timeout: float | None = None,
                **popen) -> dict:
    """Run ``cmd`` to its end, or for ``timeout`` seconds (then it and all its child processes
    are killed: ``timed_out``): ``returncode``, wall ``seconds``, ``stdout``, ``stderr`` and
    ``peak_mb``, the peak of the summed resident memory of it and all its child processes (a
    Dask cluster's workers too)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, **popen)
    peak: list = []
    watcher = peak_rss_watch(proc.pid, peak)
    timed_out = False
    try:
        out = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(psutil.Error):
            for p in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        out = proc.communicate()
    seconds = time.perf_counter() - t0
    watcher.join()
    return {"returncode": proc.returncode, "seconds": seconds, "peak_mb": peak[0] / 2**20,
            "stdout": out[0], "stderr": out[1], "timed_out": timed_out}


def checkout_env(checkout: str = REPO, **extra) -> dict:
    """The environment of a child process that imports dkha from ``checkout`` (default: this
    one), with ``extra`` variables set (``DASK_DKHA__...`` settings, say)."""
    return dict(os.environ, PYTHONPATH=checkout, **extra)


class Timer:
    """Wall seconds of a ``with timed() as t:`` block, in ``t.seconds`` once it ends."""

    seconds = float("nan")


@contextlib.contextmanager
def timed():
    """``with timed() as t: ...`` then ``t.seconds``: the block's wall time (perf_counter)."""
    t, t0 = Timer(), time.perf_counter()
    try:
        yield t
    finally:
        t.seconds = time.perf_counter() - t0


def best_of(fn, repeat: int = 3) -> float:
    """The fastest wall seconds of ``repeat`` calls of ``fn()`` (load only ever slows a run)."""
    best = float("inf")
    for _ in range(repeat):
        with timed() as t:
            fn()
        best = min(best, t.seconds)
    return best


def ratio(label: str, new: float, old: float, *, unit: str = "s") -> str:
    """One printed line of two figures measured in the same run and their ratio ``new / old``."""
    return f"{label}: {new:.3g} {unit} / {old:.3g} {unit} = {new / old:.3g}×"
