"""Where scikit-learn stops: exact kernel PCA by scikit-learn and by dkha's default, side by side.

For 11×11 grey patches of six bundled scikit-image photographs (a seeded random subset of all
their patches on a grid of step 2, so every size mixes all six), n = 121, r = 20, a gaussian
kernel with σ the median distance (dkha's heuristic, computed once here and given to every
method), at each ``--sizes`` (default 5 000, 20 000, 50 000 and 113 270), in one run:

* ``sklearn-exact``: scikit-learn ``KernelPCA(20, kernel="rbf")`` (its default
  ``eigen_solver="auto"``: the dense ``eigh`` here), ``sklearn-arpack`` and
  ``sklearn-randomized`` the same with ``eigen_solver="arpack"`` / ``"randomized"``
  (``random_state=0``), each fitted in a child process on the array; skipped where the kernel
  matrix they all hold cannot fit in this machine's memory (said so), stopped after
  ``--timeout`` seconds (said so);
* ``sklearn-nystroem``: ``Nystroem(n_components=2000)`` + ``PCA(20)``;
* ``dkha-estimator``: ``KernelHebbianPCA(20).fit(X)`` — dkha's default in process, as a
  scikit-learn user would call it;
* ``dkha-fit``: the command ``dkha fit DATA -o RUN --components 20`` (a subprocess, from
  ``python -m dkha.cli``: interpreter start and imports included);
* ``dkha-krylov``: ``dkha fit DATA -o RUN --components 20 --algorithm krylov --tol 1e-6``.

Each method runs in its own process tree; its wall seconds and the peak of the summed resident
memory of the whole tree (``_data.run_watched``: Dask workers included) are measured
here. Accuracy comes from an independent check, two plain NumPy passes over ``K'`` in blocks
of rows (nothing of dkha's evaluation): each method's training projections ``Y`` (``l × r``)
give unit vectors ``v_i = Y_i / ‖Y_i‖``; the check reports the largest relative residual
``‖K'v_i − λ_i v_i‖ / λ_i`` (``λ_i = v_iᵀ K' v_i``) and the excess error ``E(A)/E_min − 1`` of
eq. 22 with ``C = Yᵀ`` (``E(A)² = ‖K'‖² − 2 tr(C K' Cᵀ) + ‖C Cᵀ‖²``) and
``E_min² = ‖K'‖² − Σ θ_i²``, ``θ`` the Rayleigh–Ritz values of the best subspace any method
found (≤ the exact top eigenvalues, equal to them to the squared residual of an exact method).

    python benchmarks/where_sklearn_stops.py [--sizes 5000,20000] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SIZES = (5000, 20000, 50000, 113270)
PHOTOS = ("camera", "moon", "coins", "astronaut", "coffee", "chelsea")
R = 20
#: scikit-learn's KernelPCA by each of its eigensolvers (all on the dense l × l kernel matrix):
#: its default (``auto``: dense ``eigh`` for 20 of l ≥ 200 samples) and the two a user who
#: knows them picks for a few components of many samples
SOLVERS = {"sklearn-exact": "auto", "sklearn-arpack": "arpack",
           "sklearn-randomized": "randomized"}
METHODS = (*SOLVERS, "sklearn-nystroem", "dkha-estimator", "dkha-fit", "dkha-krylov")

CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    import numpy as np
    method, xfile, store, sigma, out = json.loads(sys.argv[1])
    SOLVERS = {solvers!r}
    X = np.load(xfile)
    t0 = time.perf_counter()
    if method in SOLVERS:
        from sklearn.decomposition import KernelPCA
        m = KernelPCA({r}, kernel="rbf", gamma=1.0 / (2 * sigma * sigma),
                      eigen_solver=SOLVERS[method], random_state=0).fit(X)
        Y = m.eigenvectors_ * np.sqrt(m.eigenvalues_)
    elif method == "sklearn-nystroem":
        from sklearn.decomposition import PCA
        from sklearn.kernel_approximation import Nystroem
        Z = Nystroem(gamma=1.0 / (2 * sigma * sigma), n_components=2000,
                     random_state=0).fit_transform(X)
        Y = PCA({r}, random_state=0).fit_transform(Z)
    elif method == "dkha-estimator":
        from dkha import KernelHebbianPCA
        m = KernelHebbianPCA({r}, sigma=sigma).fit(X)
        Y = m.projection_.values
    seconds = time.perf_counter() - t0
    np.save(out, np.asarray(Y, dtype=np.float64))
    print(json.dumps({{"seconds": seconds}}))
""")


def photo_patches(l: int, seed: int = 0) -> np.ndarray:
    """``l`` patches drawn (seeded, without replacement) from all 11×11 patches of
    :data:`PHOTOS` on a grid of step 2."""
    from dkha.data.patches import extract_patches, read_grey_image

    pool = np.concatenate([extract_patches(read_grey_image(f"skimage:{p}"), 11, 2)
                           for p in PHOTOS])
    pick = np.sort(np.random.default_rng(seed).choice(len(pool), size=l, replace=False))
    return np.ascontiguousarray(pool[pick], dtype=np.float64)


def gaussian_rows(Xa: np.ndarray, X: np.ndarray, sq: np.ndarray, sigma: float) -> np.ndarray:
    """Plain NumPy ``k(x_a, x_j)`` for a block of rows ``Xa`` against all ``X``."""
    D = (Xa * Xa).sum(1)[:, None] + sq[None, :] - 2.0 * (Xa @ X.T)
    np.maximum(D, 0.0, out=D)
    D *= -1.0 / (2.0 * sigma * sigma)
    return np.exp(D, out=D)


def check(X: np.ndarray, sigma: float, Ys: dict, block: int = 512) -> dict:
    """The independent check (module docstring) of every method's projections ``Ys``."""
    l = len(X)
    sq = (X * X).sum(1)
    mk = np.zeros(l)
    for a in range(0, l, block):                      # pass 1: the centering row
        mk[a:a + block] = gaussian_rows(X[a:a + block], X, sq, sigma).mean(axis=1)
    mkm = mk.mean()
    names = list(Ys)
    Vs = {k: Y / np.linalg.norm(Y, axis=0) for k, Y in Ys.items()}
    stack = np.hstack([np.hstack([Vs[k], Ys[k]]) for k in names])   # [V, Cᵀ] per method
    KS = np.zeros_like(stack)
    frob2 = 0.0
    for a in range(0, l, block):                      # pass 2: K' [V, Cᵀ] and ‖K'‖²
        Kc = gaussian_rows(X[a:a + block], X, sq, sigma)
        Kc -= mk[None, :]
        Kc -= mk[a:a + block, None]
        Kc += mkm
        KS[a:a + block] = Kc @ stack
        frob2 += float(np.einsum("ij,ij->", Kc, Kc))
    out, ritz = {}, {}
    for i, k in enumerate(names):
        V, C = Vs[k], Ys[k].T
        KV = KS[:, 2 * R * i:2 * R * i + R]
        KC = KS[:, 2 * R * i + R:2 * R * (i + 1)]
        lam = np.einsum("ij,ij->j", V, KV)
        res = np.linalg.norm(KV - V * lam, axis=0) / np.abs(lam)
        Q, Rm = np.linalg.qr(V)                       # Rayleigh–Ritz on span(V)
        KQ = np.linalg.solve(Rm.T, KV.T).T
        ritz[k] = float(np.sum(np.linalg.eigvalsh(0.5 * (Q.T @ KQ + KQ.T @ Q)) ** 2))
        err2 = frob2 - 2.0 * float(np.einsum("ij,ji->", C, KC)) + float(np.sum((C @ C.T) ** 2))
        out[k] = {"residual_max": float(res.max()), "residual_median": float(np.median(res)),
                  "err2": err2}
    emin2 = frob2 - max(ritz.values())
    for k in names:
        e = np.sqrt(max(out[k].pop("err2"), 0.0))
        out[k]["excess"] = float(e / np.sqrt(emin2) - 1.0)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="comma-separated sample counts (default all: %(default)s)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds before a method is stopped (default %(default)s)")
    ap.add_argument("--workdir", default=None, help="where the data stores and runs go")
    args = ap.parse_args(argv)
    from _data import load_average, run_watched

    from dkha import config
    from dkha.data.ingest import ingest_array
    from dkha.kernels import median_distance

    sizes = [int(s) for s in args.sizes.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    work = args.workdir or tempfile.mkdtemp(prefix="where-sklearn-stops-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = CHILD.format(root=ROOT, r=R, solvers=SOLVERS)
    print(f"# where scikit-learn stops: r = {R}, 11×11 patches of {', '.join(PHOTOS)}; "
          f"load {load_average()}; memory {psutil.virtual_memory().total / 2**30:.1f} GiB; "
          f"work dir {work}", flush=True)
    rows = []
    for l in sizes:
        X = photo_patches(l)
        xfile = os.path.join(work, f"X{l}.npy")
        np.save(xfile, X)
        store = os.path.join(work, f"patches{l}.zarr")
        st = ingest_array(X, store, overwrite=True)
        sigma = float(median_distance(st.sample(int(config.settings().median_sample), 0)))
        Ys, res = {}, {}
        for m in methods:
            out = os.path.join(work, f"Y-{m}-{l}.npy")
            if m in SOLVERS:
                need = 3 * 8.0 * l * l      # K, its centered copy, the eigensolver's workspace
                if need > 0.8 * psutil.virtual_memory().available:
                    res[m] = {"note": f"skipped: the kernel matrix needs ~{need / 2**30:.0f} GiB, "
                                      f"{psutil.virtual_memory().available / 2**30:.0f} GiB free"}
                    print(f"l={l} {m}: {res[m]['note']}", flush=True)
                    continue
            if m.startswith("sklearn") or m == "dkha-estimator":
                cmd = [sys.executable, "-c", child, json.dumps([m, xfile, store, sigma, out])]
            else:
                run = os.path.join(work, f"run-{m}-{l}")
                cmd = [sys.executable, "-m", "dkha.cli", "fit", store, "-o", run, "--components",
                       str(R), "--overwrite"]
                if m == "dkha-krylov":
                    cmd += ["--algorithm", "krylov", "--tol", "1e-6", "--sigma", repr(sigma)]
            r = run_watched(cmd, env=env, timeout=args.timeout, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
            note = ""
            if r["timed_out"]:
                note = f"stopped after {args.timeout:.0f} s"
            elif r["returncode"] != 0:
                tail = (r["stderr"].strip().splitlines() or ["?"])[-1]
                note = f"failed (exit {r['returncode']}): {tail[:120]}"
            elif m.startswith("dkha-") and m != "dkha-estimator":
                import xarray as xr
                ds = xr.open_zarr(os.path.join(run, "components.zarr"), consolidated=False)
                Y = ds["projection"].values
                np.save(out, Y)
                a = ds.attrs
                got = a.get("kernel_parameters", {}).get("sigma")
                if got is not None and abs(float(got) - sigma) > 1e-12 * sigma:
                    note = f"sigma {got} (here {sigma})"
                note = (note + " " + (f"path {a['path']}" if "path" in a else "")).strip()
            if not note or note.startswith(("path", "sigma")):
                Ys[m] = np.load(out)
            res[m] = {"wall": r["seconds"], "peak_mib": r["peak_mb"], "note": note}
            print(f"l={l} {m}: {r['seconds']:.1f} s, peak {r['peak_mb']:.0f} MiB {note}",
                  flush=True)
        if Ys:
            t0 = time.perf_counter()
            acc = check(X, sigma, Ys)
            print(f"l={l}: independent check in {time.perf_counter() - t0:.0f} s", flush=True)
            for m, a in acc.items():
                res[m].update(a)
        base = res.get("sklearn-exact", {}).get("wall")
        for m in methods:
            if m in res:
                rows.append({"l": l, "method": m, **res[m],
                             "vs_sklearn": (res[m]["wall"] / base if base and "wall" in res[m]
                                            else None)})
        print_table([row for row in rows if row["l"] == l])
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n## all sizes")
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    print(f"{'l':>7} {'method':<17} {'wall s':>8} {'× sklearn':>9} {'peak MiB':>9} "
          f"{'max resid':>10} {'excess':>10}  note")
    for r in rows:
        def f(k, fmt, r=r):
            return format(r[k], fmt) if r.get(k) is not None else "—"
        print(f"{r['l']:>7} {r['method']:<17} {f('wall', '8.1f'):>8} {f('vs_sklearn', '9.2f'):>9} "
              f"{f('peak_mib', '9.0f'):>9} {f('residual_max', '10.1e'):>10} "
              f"{f('excess', '10.1e'):>10}  {r.get('note', '')}", flush=True)


if __name__ == "__main__":
    main()
