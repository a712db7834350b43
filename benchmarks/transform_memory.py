"""Does `dkha transform` stay within the fit's memory? Peak RSS of every process (the command
and its Dask workers) of `dkha fit` of ``--samples`` image patches, then of `dkha transform` of
``--new`` other patches with that run, with this checkout's dkha and, for the transform, with
another checkout's (``--before DIR``, e.g. a worktree of the commit before the fix) in the same
run: their ratio is what counts (the machine may be loaded: the load average is printed).

Before the fix a transform task held the kernel rows of its whole chunk of new samples against
every training sample (``engine.tasks.project_rows``: a chunk of 2 048 new rows against
100 000 training rows is 1.6 GB, a thread): 15 876 patches on a 100 000 run peaked at 3.66 GB,
twice the fit's. It now holds ``engine.tasks.PROJECTION_BYTES`` (64 MiB) of them at a time.

At the reported size, 2 worker processes, 2 shared cores (load 28 to 9), 2026-11-28::

    python benchmarks/transform_memory.py --samples 100000 --new 15876 \
        --fit-args '--algorithm krylov --tol 1e6'

    dkha fit:       peak    2279 MiB, 1414.0 s
    dkha transform (this  ): peak    1284 MiB,  264.7 s; 0.56 × the fit's

``--tol 1e6`` stops the Krylov fit after its first product: the default fit (two hours and more
on that loaded machine) holds more — stopped by SIGTERM after its first product (1589 s), it
had peaked at 3250 MiB (the coordinator 1.6 GB of it), so the transform is at most 0.40 × the
default fit's peak there.

    python benchmarks/transform_memory.py [--samples 20000] [--new 6000] [--workers 2]
                                          [--before /path/to/other/checkout]
                                          [--fit-args '--algorithm krylov --tol 1e6']
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile

from _data import REPO, checkout_env, load_average, patch_store, patches, run_watched

from dkha.data.ingest import ingest_array


def dkha(args: list[str], checkout: str = REPO) -> dict:
    ran = run_watched([sys.executable, "-m", "dkha.cli", *args], env=checkout_env(checkout),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if ran["returncode"] != 0:
        sys.exit(f"dkha {' '.join(args)} failed:\n{ran['stderr'][-3000:]}")
    return ran


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000, help="training patches")
    ap.add_argument("--new", type=int, default=6000, help="patches to transform")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of each command")
    ap.add_argument("--before", help="another checkout whose transform runs beside this one's")
    ap.add_argument("--fit-args", default="",
                    help="more arguments of the fit, e.g. '--algorithm krylov --tol 1e6' (one "
                         "Krylov product: the fit's peak is then a lower bound of the default's, "
                         "where the default fit takes too long on a loaded machine)")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="dkha-transform-memory-")
    train = patch_store(os.path.join(work, f"train-{a.samples}.zarr"), a.samples)
    new_path = os.path.join(work, f"new-{a.new}.zarr")
    # other patches: those after the training ones
    ingest_array(patches(a.samples + a.new)[a.samples:], new_path, overwrite=True)
    run = os.path.join(work, "run")
    where = ["--workers", str(a.workers)]
    print(f"load {load_average()}; {a.samples} training patches × {train.n_features}, "
          f"{a.new} new, {a.workers} worker processes")
    fit_cmd = ["fit", train.path, "-o", run, "--overwrite", *where, *shlex.split(a.fit_args)]
    print("dkha " + shlex.join(fit_cmd), flush=True)
    fit = dkha(fit_cmd)
    print(f"load {load_average()}")
    print(f"dkha fit:       peak {fit['peak_mb']:7.0f} MiB, {fit['seconds']:6.1f} s")
    results = {}
    for name, checkout in (("this", REPO), ("before", a.before)):
        if checkout is None:
            continue
        out = os.path.join(work, f"projected-{name}.zarr")
        cmd = ["transform", run, new_path, "-o", out, "--overwrite", *where]
        print(f"dkha {shlex.join(cmd)}   ({name}: {checkout})", flush=True)
        results[name] = dkha(cmd, checkout)
        r = results[name]
        print(f"load {load_average()}")
        print(f"dkha transform ({name:6s}): peak {r['peak_mb']:7.0f} MiB, {r['seconds']:6.1f} s; "
              f"{r['peak_mb'] / fit['peak_mb']:.2f} × the fit's")
    if "before" in results:
        print(f"transform peak, this / before: "
              f"{results['this']['peak_mb'] / results['before']['peak_mb']:.2f}")


if __name__ == "__main__":
    main()
