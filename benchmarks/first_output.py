"""Progress from the first second: when does ``dkha fit`` first show something, and how long is
it silent at most?

On ``--samples`` 11×11 patches of camera (step 3, the patches spread over the image by
``ingest --max-samples``), ``dkha fit STORE -o RUN --components 16 --passes P`` runs

* in a pseudo-terminal (where it draws progress bars): the first output, the first bar of the
  centering pass (the MK row, recomputed: the store's centering cache is off) and of the steps;
  stopped there;
* without ``-v``, its standard error in a pipe (where it logs progress lines, as under cron or
  ``| tee log``), to the end: the first line, the same marks, and the largest gap between two
  lines (the issue's target: the first line within 2 s, one at least every 10 s).

With ``--baseline DIR`` the same is measured for the dkha checkout in ``DIR`` (e.g.
``/work/main``), in the same run.

    python benchmarks/first_output.py [--samples 5000] [--passes 2] [--baseline /work/main]
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time

from _data import REPO, checkout_env

MARKS = {"centering": (b"centering", b"MK row"), "steps": (b"kha-smd:", b"kha-smd pass 0")}


def watch(checkout: str, store: str, run: str, terminal: bool, limit: float,
          passes: int) -> dict:
    """Seconds to the first output and to each of :data:`MARKS`; in a terminal the fit is stopped
    after them, in a pipe it runs to its end and the largest gap between lines is measured."""
    env = checkout_env(checkout, DASK_DKHA__MK_CACHE="false")
    cmd = [sys.executable, "-m", "dkha.cli", "fit", store, "-o", run, "--components", "16",
           "--passes", str(passes), "--overwrite"]
    if terminal:
        master, slave = pty.openpty()
        # a terminal 120 columns wide (a new pty is 0×0: tqdm would draw empty bars)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=slave, stderr=slave, cwd=checkout)
        os.close(slave)
        fd = master
    else:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=checkout)
        fd = proc.stdout.fileno()
    seen, out, lines = {}, b"", []      # lines: (seconds, text) as each line arrived
    try:
        while time.perf_counter() - t0 < limit:
            if terminal and len(seen) == 1 + len(MARKS):
                break
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            now = time.perf_counter() - t0
            done = out.count(b"\n")
            out += chunk
            lines += [(now, ln) for ln in out.decode(errors="replace").split("\n")[done:-1]]
            seen.setdefault("first output", now)
            for name, words in MARKS.items():
                if name not in seen and any(w in out for w in words):
                    seen[name] = now
        seen["end"] = time.perf_counter() - t0
    finally:
        proc.kill()
        proc.wait()
        if terminal:
            os.close(fd)
    first_line = out.replace(b"\r", b"\n").decode(errors="replace").strip().splitlines()
    seen["first line"] = first_line[0][:100] if first_line else ""
    if not terminal:
        times = [0.0] + [t for t, _ in lines] + [seen["end"]]
        gaps = [(b - a, i) for i, (a, b) in enumerate(itertools.pairwise(times))]
        gap, i = max(gaps)
        seen["largest gap"] = gap
        seen["gap after"] = lines[i - 1][1][:100] if 0 < i <= len(lines) else (
            "the start" if i == 0 else "the last line")
        seen["lines"] = len(lines)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--baseline", help="another dkha checkout to measure in the same run")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds to wait for each run")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="dkha-first-output-")
    try:
        store = os.path.join(work, "camera.zarr")
        subprocess.run([sys.executable, "-m", "dkha.cli", "ingest", "images", "skimage:camera",
                        "-o", store, "--patch", "11", "--step", "3", "--max-samples",
                        str(args.samples)], check=True, env=checkout_env(),
                       stdout=subprocess.DEVNULL)
        print(f"dkha fit {args.samples} camera patches (11×11) --components 16 --passes "
              f"{args.passes}; seconds from the start of the process (machine: "
              f"{os.cpu_count()} cores):")
        checkouts = [("this checkout", REPO)] + ([("baseline", args.baseline)]
                                                 if args.baseline else [])
        for label, checkout in checkouts:
            for terminal in (True, False):
                seen = watch(checkout, store, os.path.join(work, "run"), terminal, args.limit,
                             args.passes)
                marks = ", ".join(f"{k} {seen[k]:.2f} s" if k in seen else f"{k} not within "
                                  f"{args.limit:.0f} s" for k in ("first output", *MARKS))
                where = "terminal (bars)" if terminal else "pipe, no -v (lines)"
                print(f"  {label:13s} {where:22s} {marks}")
                print(f"  {'':13s} {'':22s} first line: {seen['first line']!r}")
                if not terminal:
                    print(f"  {'':13s} {'':22s} {seen['lines']} lines in {seen['end']:.1f} s; "
                          f"largest gap between lines {seen['largest gap']:.1f} s (after "
                          f"{seen['gap after']!r})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
