"""How fast the ``dkha`` command answers what needs no engine: ``dkha --version``, ``dkha
--help``, ``dkha fit --help`` and an argument error, beside ``python -c pass`` (the
interpreter's own start) and ``python -c "import dask, distributed, xarray, sklearn"`` (what the
engine costs), in one run: the median wall time of ``--repeat`` runs each, and the modules
``python -X importtime`` says ``dkha --version`` spends most on. Target: under 1 s.

    python benchmarks/cli_latency.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from _data import checkout_env

ENV = checkout_env()
DKHA = [sys.executable, "-m", "dkha.cli"]
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "dkha --version": [*DKHA, "--version"],
    "dkha --help": [*DKHA, "--help"],
    "dkha fit --help": [*DKHA, "fit", "--help"],
    "dkha fit S -o R --sgima 3 (error)": [*DKHA, "fit", "S", "-o", "R", "--sgima", "3"],
    "import dask, distributed, xarray, sklearn": [
        sys.executable, "-c", "import dask.array, distributed, xarray, sklearn.utils"],
}


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def importtime(cmd: list[str], top: int = 6) -> list[tuple[int, str]]:
    """The ``top`` modules by cumulative import microseconds (``-X importtime``)."""
    p = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], env=ENV, capture_output=True,
                       text=True, check=False)
    rows = []
    for line in p.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"median wall seconds of {args.repeat} runs each (machine: {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}):")
    base = None
    for name, cmd in CASES.items():
        wall(cmd)                                   # warm the file cache
        t = statistics.median(wall(cmd) for _ in range(args.repeat))
        base = t if base is None else base
        print(f"  {name:42s} {t:6.3f} s  ({t / base:5.1f}× python -c pass)")
    print("python -X importtime: dkha --version's largest imports (cumulative):")
    for us, name in importtime(CASES["dkha --version"]):
        print(f"  {us / 1000:7.1f} ms  {name.strip()}")


if __name__ == "__main__":
    main()
