"""A first run that does not stall: `dkha demo` in a fresh numba cache, then again.

Runs `dkha demo` (this checkout, as a child process) with ``NUMBA_CACHE_DIR`` pointed at an empty
temporary folder — the "first run" compiles the solver's loops and writes them to that cache —
then again with the same folder (the "second run" loads them). Prints the wall seconds of each
and their ratio (target: first ≤ 1.5× second). ``--compare`` repeats the pair with the compile-
ahead thread off (``DASK_DKHA__COMPILE_AHEAD=false``) to show what it saves.

    python benchmarks/first_run.py [--compare]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]


def demo(cache_dir: str, extra_env: dict) -> float:
    out = tempfile.mkdtemp(prefix="dkha-demo-")
    env = dict(os.environ, PYTHONPATH=ROOT, NUMBA_CACHE_DIR=cache_dir, **extra_env)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "dkha.cli", "demo", "-o", out], env=env,
                       capture_output=True, text=True)
    secs = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    if p.returncode:
        raise SystemExit(f"dkha demo failed:\n{p.stdout[-1000:]}\n{p.stderr[-2000:]}")
    return secs


def pair(label: str, extra_env: dict) -> tuple[float, float]:
    cache = tempfile.mkdtemp(prefix="dkha-numba-cache-")
    try:
        first = demo(cache, extra_env)
        second = demo(cache, extra_env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{label:28s} first {first:6.1f} s   second {second:6.1f} s   ratio {first / second:4.2f}"
          + ("  (≤ 1.5: met)" if first <= 1.5 * second else "  (> 1.5: NOT met)"), flush=True)
    return first, second


def main() -> int:
    from _data import load_average

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="store_true",
                    help="also without the compile-ahead thread")
    args = ap.parse_args()
    print(f"load {load_average()}; `dkha demo` with an empty NUMBA_CACHE_DIR, then the same again")
    pair("compile ahead (default)", {})
    if args.compare:
        pair("compile ahead off", {"DASK_DKHA__COMPILE_AHEAD": "false"})
    print(f"load {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
