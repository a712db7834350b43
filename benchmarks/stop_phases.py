"""SIGTERM during each long phase of a large fit: seconds to the exit (code 75) and peak memory.

On ``--samples`` × ``--features`` random samples (default 200 000 × 16), runs ``dkha fit``
(``--steps 4000 --evaluate-every 0``) and ``dkha evaluate --variance`` and sends SIGTERM once
each phase has started (``-v`` logs it, after ``--delay`` seconds more): the MK row, the Nyström
rows (``--init nystrom:M``), the end-of-fit evaluation, the exact Krylov solver's products and the
explained variance. Prints, per phase, the exit code, the seconds from the signal to the exit,
and the peak resident memory of the command and all its child processes (sampled every 0.1 s).

    python benchmarks/stop_phases.py --samples 200000 --features 16

The first fit's MK row is cached in the store, so later phases start sooner.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
from _data import checkout_env, peak_rss_watch


def stop_during(args, phase_line, delay, occurrence=1, env=None):
    from tests.processes import dkha_command, subprocess_env

    proc = subprocess.Popen(dkha_command("-v", *args), env=subprocess_env(**(env or {})),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak: list = []
    watch = peak_rss_watch(proc.pid, peak)
    sent, seen, last = None, 0, ""
    timer = None
    for line in proc.stderr:
        last = line.strip() or last
        if sent is None and timer is None and phase_line in line:
            seen += 1
            if seen == occurrence:
                def fire():
                    nonlocal sent
                    sent = time.perf_counter()
                    proc.send_signal(signal.SIGTERM)
                timer = threading.Timer(delay, fire)
                timer.start()
    proc.wait()
    watch.join()
    seconds = time.perf_counter() - sent if sent else float("nan")
    return proc.returncode, seconds, peak[0] if peak else 0, last


def main():
    from dkha.data.ingest import ingest_array

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--delay", type=float, default=5.0, help="seconds into a phase to stop it")
    ap.add_argument("--workdir", default="/tmp/dkha-stop")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    l = args.samples
    store = os.path.join(args.workdir, f"random-{l}x{args.features}.zarr")
    if not os.path.exists(store):
        ingest_array(np.random.default_rng(0).random((l, args.features)), store)
    run = os.path.join(args.workdir, "run")
    fit = ["fit", store, "-o", run, "--overwrite", "--components", "8", "--sigma", "0.5",
           "--seed", "0"]
    # a finished run first (its MK row is cached in the store; the variance is taken on it)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dkha.cli", *fit, "--steps", "4000", "--block", "32",
                    "--evaluate-every", "-1", "--quiet"], check=True,
                   env=checkout_env())
    print(f"a fit of 4000 steps without evaluation (MK pass included): "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    vrun = os.path.join(args.workdir, "finished")
    if os.path.exists(vrun):
        import shutil

        shutil.rmtree(vrun)
    os.replace(run, vrun)
    phases = [
        ("MK row", fit + ["--steps", "4000", "--evaluate-every", "0"],
         "the MK row (centering) pass:", 1),
        ("Nyström rows", fit + ["--steps", "4000", "--init", "nystrom:500", "--block", "32"],
         "Nyström landmark rows:", 1),
        ("end-of-fit evaluation", fit + ["--steps", "4000", "--evaluate-every", "0", "--block",
                                          "32", "--checkpoint-every", "1"],
         "evaluating at l =", 1),
        ("Krylov products", fit + ["--algorithm", "krylov"], "a K' V product pass:", 1),
    ]
    print(f"l = {l} × {args.features} random samples, SIGTERM {args.delay:g} s into each phase; "
          f"{os.cpu_count()} cores (shared machine)", flush=True)
    for name, cmd, line, occ in phases:
        env = {"DASK_DKHA__MK_CACHE": "false"} if name == "MK row" else None
        rc, secs, peak, last = stop_during(cmd, line, args.delay, occ, env)
        print(f"{name:24s} exit {rc}  {secs:5.1f} s after SIGTERM  peak {peak / 2**30:5.2f} GiB  "
              f"| {last}", flush=True)
    rc, secs, peak, last = stop_during(["evaluate", vrun, "--variance"], "a K' V product pass:",
                                       args.delay)
    print(f"{'explained variance':24s} exit {rc}  {secs:5.1f} s after SIGTERM  peak "
          f"{peak / 2**30:5.2f} GiB  | {last}", flush=True)


if __name__ == "__main__":
    main()
