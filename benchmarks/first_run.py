"""A first run that does not stall: `dkha demo` right after `pip install .`, then again.

The README's first command, as a user runs it: a fresh virtual environment, ``pip install .``
of this checkout (timed: the build compiles the coordinator's numba loops into the wheel's cache,
``build_backend/dkha_build.py``), then ``dkha demo`` twice. Prints the wall seconds of each run
and their ratio (target: first ≤ 1.5× second).

``--empty-cache`` instead runs ``dkha demo`` of this checkout with ``NUMBA_CACHE_DIR`` pointed at
an empty folder (what a wheel built on another machine, or an editable install, meets: the first
run compiles), then again; ``--compare`` adds that pair with the compile-ahead thread off
(``DASK_DKHA__COMPILE_AHEAD=false``).

    python benchmarks/first_run.py [--empty-cache [--compare]]
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


def demo(cache_dir: str | None, extra_env: dict, python: str = sys.executable) -> float:
    out = tempfile.mkdtemp(prefix="dkha-demo-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    if cache_dir is None:           # the installed dkha, its own cache
        env.pop("PYTHONPATH", None)
    else:                           # this checkout, an empty cache
        env.update(PYTHONPATH=ROOT, NUMBA_CACHE_DIR=cache_dir)
    env.update(extra_env)
    t0 = time.perf_counter()
    p = subprocess.run([python, "-m", "dkha.cli", "demo", "-o", out], env=env, cwd=out,
                       capture_output=True, text=True, check=False)
    secs = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    if p.returncode:
        raise SystemExit(f"dkha demo failed:\n{p.stdout[-1000:]}\n{p.stderr[-2000:]}")
    return secs


def show(label: str, first: float, second: float) -> None:
    print(f"{label:34s} first {first:6.1f} s   second {second:6.1f} s   ratio {first / second:4.2f}"
          + ("  (≤ 1.5: met)" if first <= 1.5 * second else "  (> 1.5: NOT met)"), flush=True)


def pair(label: str, extra_env: dict) -> tuple[float, float]:
    cache = tempfile.mkdtemp(prefix="dkha-numba-cache-")
    try:
        first = demo(cache, extra_env)
        second = demo(cache, extra_env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    show(label, first, second)
    return first, second


def installed() -> tuple[float, float]:
    """``pip install .`` into a fresh virtual environment, then ``dkha demo`` twice there."""
    venv = tempfile.mkdtemp(prefix="dkha-first-run-venv-")
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        t0 = time.perf_counter()
        p = subprocess.run([python, "-m", "pip", "install", "-q", ROOT], capture_output=True,
                           text=True, check=False)
        if p.returncode:
            raise SystemExit(f"pip install . failed:\n{p.stderr[-2000:]}")
        shipped = sum(name.endswith(".nbi") for _, _, files in os.walk(venv) for name in files)
        print(f"pip install . (fresh venv): {time.perf_counter() - t0:.1f} s; the wheel's numba "
              f"cache: {shipped} functions", flush=True)
        first, second = demo(None, {}, python), demo(None, {}, python)
    finally:
        shutil.rmtree(venv, ignore_errors=True)
    show("dkha demo after pip install .", first, second)
    return first, second


def main() -> int:
    from _data import load_average

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--empty-cache", action="store_true",
                    help="this checkout with an empty NUMBA_CACHE_DIR instead of pip install .")
    ap.add_argument("--compare", action="store_true",
                    help="with --empty-cache: also without the compile-ahead thread")
    args = ap.parse_args()
    if not args.empty_cache:
        print(f"load {load_average()}; `pip install .` in a fresh venv, then `dkha demo` twice")
        installed()
        print(f"load {load_average()}")
        return 0
    print(f"load {load_average()}; `dkha demo` with an empty NUMBA_CACHE_DIR, then the same again")
    pair("empty cache, compile ahead (default)", {})
    if args.compare:
        pair("compile ahead off", {"DASK_DKHA__COMPILE_AHEAD": "false"})
    print(f"load {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
