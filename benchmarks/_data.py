"""Data sets the benchmarks share: image patches of scikit-image's bundled photographs."""

from __future__ import annotations

import os
import resource
import threading
import time

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
