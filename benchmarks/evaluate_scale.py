"""`dkha evaluate` at scale: against dense float64 at l = 5 000, and at l = 50 000 without K'.

Prints, for each size: E(A), E_min and the excess from `dkha evaluate`, the dense reference
(l = 5 000 only) with the relative differences, wall time and the peak RSS of the evaluating
process. A dense K' at l = 50 000 would take 20 GB.

    python benchmarks/evaluate_scale.py [--sizes 5000 50000] [--workdir /tmp/dkha-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import patch_store

from dkha import KernelHebbianPCA


def dense_reference(X, sigma, A):
    d2 = np.maximum((X * X).sum(1)[:, None] + (X * X).sum(1)[None, :] - 2 * X @ X.T, 0)
    K = np.exp(-d2 / (2 * sigma**2))
    mk = K.mean(0)
    Kc = K - mk[None, :] - mk[:, None] + mk.mean()
    C = A @ Kc
    E = np.linalg.norm(Kc - C.T @ C)
    w = np.linalg.eigvalsh(Kc)[::-1][: A.shape[0]]
    Emin = np.sqrt((Kc**2).sum() - (w**2).sum())
    return {"error": E, "error_min": Emin, "excess": E / Emin - 1}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 50000])
    ap.add_argument("--workdir", default="/tmp/dkha-bench")
    ap.add_argument("--components", type=int, default=20)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    for l in args.sizes:
        store = patch_store(os.path.join(args.workdir, f"patches-{l}.zarr"), l)
        run = os.path.join(args.workdir, f"eval-run-{l}")
        model = KernelHebbianPCA(args.components, algorithm="kha-t", sigma=3.0, eta0=0.5,
                                 steps=1024, evaluate_every=-1, seed=0)
        model.fit(store.path, run_dir=run, overwrite=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c",
                               ("import resource, sys; from dkha.cli.main import main; "
                                "rc = main(sys.argv[1:]); print('PEAK', resource.getrusage("
                                "resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"),
                               "evaluate", run, "--json", "--recompute"],
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode:
            print(proc.stderr)
            raise SystemExit(proc.returncode)
        lines = proc.stdout.strip().splitlines()
        got = json.loads(lines[0])
        peak = int(lines[-1].split()[1]) / 1024
        print(f"l = {l}: dkha evaluate  E = {got['error']:.12g}  E_min = {got['error_min']:.12g}  "
              f"excess = {got['excess']:.6e}  ({wall:.1f} s, peak RSS {peak:.0f} MiB; "
              f"a dense K' would be {l * l * 8 / 2**30:.1f} GiB)")
        if l <= 8000:
            ref = dense_reference(store.read(), model.kernel_["sigma"], model.alpha_)
            rel = {k: abs(got[k] - ref[k]) / abs(ref[k]) for k in ref}
            print(f"          dense float64 E = {ref['error']:.12g}  "
                  f"E_min = {ref['error_min']:.12g}  excess = {ref['excess']:.6e}")
            print("          relative differences: "
                  + ", ".join(f"{k} {v:.1e}" for k, v in rel.items()))


if __name__ == "__main__":
    main()
