"""The user's main paths timed for two checkouts of dkha in one run: does a change (a
restructuring, say) leave every figure within noise of the code before it?

Each case runs in its own subprocess with ``PYTHONPATH`` at a checkout, the checkouts
interleaved (base, head, base, head, ...) so that load on a shared machine hits both alike;
the fastest of ``--repeat`` counts. Cases:

* ``fit-default``: ``dkha fit STORE -o RUN --components 20`` (``algorithm="auto"``: the exact
  top components by the cost model's path) on ``--samples`` 11×11 patches of bundled
  photographs;
* ``fit-kha-smd``: the same store, ``--algorithm kha-smd --passes 2 --components 8``;
* ``small-fits``: 20 ``KernelHebbianPCA(4).fit`` of 300 × 5 gaussian data and a ``transform``
  each (scikit-learn users' grid searches: per-fit overhead);
* ``online``: ``OnlineKernelPCA(8).fit`` of 2 000 patches.

Prints seconds per case for each checkout and the ratio head / base, the load average before
and after, and whether the two default fits' eigenvalues agree (max relative difference).

    python benchmarks/checkouts.py --base /path/to/old/checkout [--head .] [--samples 20000]
                                   [--repeat 2] [--cases fit-default online ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SMALL = """
import time, numpy as np
from dkha import KernelHebbianPCA
X = np.random.default_rng(0).normal(size=(300, 5))
t0 = time.perf_counter()
for i in range(20):
    KernelHebbianPCA(4, sigma=2.0, seed=i).fit(X).transform(X)
print(time.perf_counter() - t0)
"""

ONLINE = """
import sys, time, numpy as np
from dkha import OnlineKernelPCA
from dkha.data.store import open_store
X = np.asarray(open_store(sys.argv[1]).read_rows(np.arange(2000)), dtype=np.float64)
t0 = time.perf_counter()
OnlineKernelPCA(8, seed=0).fit(X)
print(time.perf_counter() - t0)
"""


def _run(checkout: str, args: list[str], *, timed_inside: bool = False) -> float:
    env = dict(os.environ, PYTHONPATH=checkout, PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *args], env=env, cwd=checkout, check=True,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return float(out.stdout.strip().splitlines()[-1]) if timed_inside else wall


def _eigenvalues(run: str) -> list[float]:
    import xarray as xr

    with xr.open_zarr(os.path.join(run, "components.zarr")) as ds:
        return [float(v) for v in ds["eigenvalue"].values]


def cases(store: str, tmp: str, name: str):
    cli = ["-m", "dkha.cli"]
    yield "fit-default", lambda co: _run(co, cli + ["fit", store, "-o", f"{tmp}/{name}-default",
                                                    "--components", "20", "--overwrite"])
    yield "fit-kha-smd", lambda co: _run(co, cli + ["fit", store, "-o", f"{tmp}/{name}-smd",
                                                    "--algorithm", "kha-smd", "--passes", "2",
                                                    "--components", "8", "--overwrite"])
    yield "small-fits", lambda co: _run(co, ["-c", SMALL], timed_inside=True)
    yield "online", lambda co: _run(co, ["-c", ONLINE, store], timed_inside=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the checkout to compare against")
    ap.add_argument("--head", default=HERE, help="the checkout under test (default: this one)")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cases", nargs="+", help="only these cases (default: every one)")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="dkha-checkouts-")
    try:
        store = os.path.join(tmp, "patches.zarr")
        subprocess.run([sys.executable, "-m", "dkha.cli", "ingest", "images", "-o", store,
                        "--max-samples", str(a.samples), "skimage:camera", "skimage:coins",
                        "skimage:moon"], env=dict(os.environ, PYTHONPATH=a.head), check=True,
                       capture_output=True)
        print(f"load before: {os.getloadavg()[0]:.2f}; {a.samples} patches; "
              f"base {a.base}; head {a.head}")
        checkouts = {"base": a.base, "head": a.head}
        times: dict[str, dict[str, list[float]]] = {}
        labels = [label for label, _ in cases(store, tmp, "") if label in (a.cases or [label])]
        for _ in range(a.repeat):
            for label in labels:
                for side, co in checkouts.items():
                    run_case = dict(cases(store, tmp, side))[label]
                    times.setdefault(label, {}).setdefault(side, []).append(run_case(co))
        print(f"{'case':<14}{'base s':>10}{'head s':>10}{'head/base':>11}")
        for label, t in times.items():
            b, h = min(t["base"]), min(t["head"])
            print(f"{label:<14}{b:>10.2f}{h:>10.2f}{h / b:>11.3f}")
        if "fit-default" in labels:
            eb, eh = _eigenvalues(f"{tmp}/base-default"), _eigenvalues(f"{tmp}/head-default")
            diff = max(abs(x - y) / abs(x) for x, y in zip(eb, eh))
            print(f"default fit eigenvalues, max relative difference head vs base: {diff:.2e}")
        print(f"load after: {os.getloadavg()[0]:.2f}")
        print(json.dumps({k: {s: min(v) for s, v in t.items()} for k, t in times.items()}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
