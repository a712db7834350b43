"""A million samples: streaming ingest, KHA-SMD on 10⁶ 11×11 patches, the memory of every
process, and scikit-learn's KernelPCA and Nyström + PCA against dkha after the same wall time.

    python benchmarks/million.py [--samples 1000000] [--steps 10240] [--components 20]
        [--center-sample 2000] [--init-support 256] [--block 64] [--prefetch 2] [--workers N]
        [--kpca-samples 20000] [--nystrom-samples 30000] [--landmarks 2000]
        [--skip-million] [--skip-compare] [--work DIR]

What it prints (each heavy part runs in a child process, so every peak RSS is that part's own):

1. ingest: ``dkha ingest images`` of scikit-image's bundled photographs (11×11 patches on a grid
   of 2 pixels, ``--max-samples``): seconds, samples, peak RSS (the ingest streams: one image
   and a chunk of patches at a time, never all patches).
2. the million fit: the centering row estimated from ``--center-sample`` columns (explicitly
   approximate; the exact MK row is an l²n pass, hours here) with its seconds, the same row read
   back from the store's cache, then ``KernelHebbianPCA(r, "kha-smd", steps=..., init=
   "random:M", center_sample=N, evaluate_every=-1)``: seconds of the whole fit and of the block
   stream, steps per second, and the peak RSS of every process (coordinator, each worker; the
   default in-process cluster is one process) with the total. The largest arrays are blocks of
   ``b × l`` kernel rows; the kernel matrix (8·l² bytes) is never formed.
3. the comparison on seeded subsets of the same patches (exact centering, same sigma and r):
   scikit-learn's KernelPCA (``--kpca-samples``, ARPACK) and Nystroem(``--landmarks``) + PCA
   (``--nystrom-samples``), each in a child process with one BLAS thread: seconds and peak RSS;
   then dkha KHA-SMD (the default in-process cluster) on the same subset for the same wall time
   (its exact MK row, initial ``A K'`` and block stream all counted), and the excess error
   ``E/E_min − 1`` of each: ``E = ‖K' − CᵀC‖_F`` with ``C`` the projections of the training
   samples (dkha's ``A K'``, sklearn's ``fit_transform``), ``E_min`` from dkha's Krylov
   eigenvalues of the subset's ``K'``.

The load average is printed at the start and end (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from _data import HERE, REPO, load_average, peak_rss_mb

PHOTOS = ("camera", "astronaut", "coffee", "chelsea", "rocket", "coins", "moon",
          "hubble_deep_field", "retina", "motorcycle_left", "brick", "grass", "gravel")
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                               "BLIS_NUM_THREADS", "NUMBA_NUM_THREADS")}


def child(mode: str, args: dict, *, env: dict | None = None) -> dict:
    """Run ``mode`` of this script in a child process; its JSON result (last stdout line)."""
    full_env = dict(os.environ,
                    PYTHONPATH=os.pathsep.join([REPO, HERE, os.environ.get("PYTHONPATH", "")]))
    full_env.pop("DASK_SCHEDULER_ADDRESS", None)
    full_env.update(env or {})
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode,
                        "--child-args", json.dumps(args)], env=full_env, capture_output=True,
                       text=True, check=False)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"child {mode} failed with exit {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --- children -------------------------------------------------------------------------------------


def child_ingest(a: dict) -> dict:
    from dkha.cli.main import main

    t0 = time.perf_counter()
    code = main(["ingest", "images", *[f"skimage:{n}" for n in PHOTOS], "-o", a["store"],
                 "--patch", "11", "--step", "2", "--max-samples", str(a["samples"]),
                 "--overwrite"])
    assert code == 0
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": peak_rss_mb()}


def _pid_and_peak() -> tuple[int, float]:
    return os.getpid(), peak_rss_mb()


def child_fit(a: dict) -> dict:
    """The million fit: centering (timed, then from the cache), then KHA-SMD for a fixed number
    of steps; the peak RSS of every process."""
    import dkha
    from dkha import KernelHebbianPCA, config
    from dkha.data.centering import CENTERING_GROUP
    from dkha.data.store import open_store
    from dkha.engine.cluster import blas_threads_for, client_for
    from dkha.engine.rows import RowEngine
    from dkha.kernels import make_kernel

    store = open_store(a["store"])
    kernel = make_kernel("gaussian", sigma=a["sigma"])
    shutil.rmtree(os.path.join(store.path, CENTERING_GROUP), ignore_errors=True)  # time it fresh
    out = {"dkha": dkha.__file__}
    settings = config.settings()
    with client_for(a["workers"], settings=settings) as client, blas_threads_for(client, settings):
        t0 = time.perf_counter()
        RowEngine(store, kernel, client, settings).compute_mk(center_sample=a["center_sample"],
                                                              seed=0)
        out["center_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = RowEngine(store, kernel, client, config.settings())
        again.compute_mk(center_sample=a["center_sample"], seed=0)
        out["center_cached_seconds"] = time.perf_counter() - t0
        out["center_cached"] = again.centering["cached"]
        model = KernelHebbianPCA(a["components"], algorithm="kha-smd", sigma=a["sigma"],
                                 steps=a["steps"], center_sample=a["center_sample"],
                                 init=f"random:{a['init_support']}", evaluate_every=-1,
                                 block_rows=a["block"], prefetch=a["prefetch"], seed=0,
                                 eta0=a["eta0"], mu=a["mu"], client=client)
        t0 = time.perf_counter()
        model.fit(store.path, run_dir=a["run_dir"], overwrite=True)
        out["fit_seconds"] = time.perf_counter() - t0
        out["stream_seconds"] = model.timings_["stream"]
        out["centering_in_fit_seconds"] = model.timings_["centering"]
        out["wait_seconds"] = model.stream_stats_["wait_seconds"]
        out["finite"] = bool(np.isfinite(model.alpha_).all())
        out["eigenvalues"] = [float(v) for v in model.eigenvalues_[:5]]
        scheduler = client.scheduler.address
        out["processes"] = [{"process": f"coordinator (pid {os.getpid()}"
                             + (", scheduler and workers in-process)"
                                if scheduler.startswith("inproc") else ", scheduler)"),
                             "peak_rss_mb": peak_rss_mb()}]
        if not scheduler.startswith("inproc"):     # every other process once (LocalCluster's
            seen = {os.getpid()}                     # nannies live in the coordinator's)
            for kind, nanny in (("worker", False), ("nanny", True)):
                for addr, (pid, mb) in sorted(client.run(_pid_and_peak, nanny=nanny).items()):
                    if pid not in seen:
                        seen.add(pid)
                        out["processes"].append({"process": f"{kind} {addr} (pid {pid})",
                                                 "peak_rss_mb": mb})
    return out


def child_sklearn(a: dict) -> dict:
    """KernelPCA or Nystroem + PCA on a subset store (one BLAS thread: set by the parent)."""
    from dkha.data.store import open_store

    X = open_store(a["store"]).read()
    gamma = 1.0 / (2.0 * a["sigma"] ** 2)
    t0 = time.perf_counter()
    if a["method"] == "kpca":
        from sklearn.decomposition import KernelPCA

        P = KernelPCA(a["components"], kernel="rbf", gamma=gamma, eigen_solver="arpack",
                      random_state=0).fit_transform(X)
    else:
        from sklearn.decomposition import PCA
        from sklearn.kernel_approximation import Nystroem

        Z = Nystroem(kernel="rbf", gamma=gamma, n_components=a["landmarks"],
                     random_state=0).fit_transform(X)
        P = PCA(a["components"], random_state=0).fit_transform(Z)
    seconds = time.perf_counter() - t0
    np.save(a["out"], P)
    from threadpoolctl import threadpool_info

    return {"seconds": seconds, "peak_rss_mb": peak_rss_mb(),
            "blas_threads": sorted({i["num_threads"] for i in threadpool_info()})}


class _Budget(Exception):
    pass


class _Timed:
    """A solver that records ``A`` at the first block boundary after each mark (seconds since
    ``t0``) and stops the run after the last one."""

    def __init__(self, solver, t0: float, marks: list[float]):
        self._solver, self._t0, self._marks, self.snapshots = solver, t0, sorted(marks), []

    def __getattr__(self, name):
        return getattr(self._solver, name)

    def apply_block(self, idx, rows):
        self._solver.apply_block(idx, rows)
        elapsed = time.perf_counter() - self._t0
        while self._marks and elapsed >= self._marks[0]:
            mark = self._marks.pop(0)
            self.snapshots.append((mark, elapsed, self._solver.state.t, np.array(self._solver.A)))
        if not self._marks:
            raise _Budget


def child_compare(a: dict) -> dict:
    """dkha for ``budget`` seconds on a subset (snapshots of A at multiples of it), then the
    excess error of each snapshot and of the baseline's projections."""
    from dkha import config
    from dkha.data.store import open_store
    from dkha.engine.cluster import blas_threads_for, client_for
    from dkha.engine.rows import RowEngine
    from dkha.fit.evaluate import evaluate, top_eigenvalues
    from dkha.fit.kha_stream import run_batches
    from dkha.kernels import make_kernel
    from dkha.solvers.batch import BatchKHA

    store = open_store(a["store"])
    kernel = make_kernel("gaussian", sigma=a["sigma"])
    r, l = a["components"], store.n_samples
    out = {}
    settings = config.settings()
    with client_for(settings=settings) as client, blas_threads_for(client, settings):
        engine = RowEngine(store, kernel, client, settings)
        engine.compute_mk(cache=False)      # warm-up: numba, the chunk cache, the cluster
        engine = RowEngine(store, kernel, client, config.settings())
        t0 = time.perf_counter()
        engine.compute_mk(cache=False)
        solver = _Timed(BatchKHA("kha-smd", r, l, eta0=a["eta0"], mu=a["mu"]), t0,
                        [m * a["budget"] for m in a["multiples"]])
        try:
            run_batches(engine, [solver], n_steps=1000 * l, seed=0, evaluate_every=-1)
        except _Budget:
            pass
        solver_mk = (engine.mk, engine.mkm)
        # the evaluations (not timed) keep the kernel's tiles in memory: Krylov products and
        # residuals without recomputing kernels (--cache-rows)
        engine = RowEngine(store, kernel, client, config.settings(row_cache=True))
        engine.set_mk(*solver_mk)
        t0 = time.perf_counter()
        eig = top_eigenvalues(engine, r, seed=0)
        out["eigenvalue_seconds"] = time.perf_counter() - t0
        out["dkha"] = []
        for mark, elapsed, step, A in solver.snapshots:
            ev = evaluate(engine, A, eig)
            out["dkha"].append({"mark": mark, "seconds": elapsed, "step": step, "passes": step / l,
                                "excess": ev.excess, "error": ev.error, "error_min": ev.error_min})
        P = np.load(a["projections"])
        frob2, res2 = engine.residual(np.ascontiguousarray(P.T))
        emin = np.sqrt(frob2 - np.sum(eig ** 2))
        out["baseline_excess"] = float(np.sqrt(max(res2, 0.0)) / emin - 1.0)
    return out


CHILDREN = {"ingest": child_ingest, "fit": child_fit, "sklearn": child_sklearn,
            "compare": child_compare}


# --- the benchmark --------------------------------------------------------------------------------


def existing(path: str, n: int):
    """The store at ``path`` if it holds ``n`` samples, else ``None``."""
    from dkha.data.store import open_store
    from dkha.errors import DkhaError

    try:
        st = open_store(path)
    except DkhaError:
        return None
    return st if st.n_samples == n else None


def ensure_store(path: str, samples: int) -> None:
    st = existing(path, samples)
    if st is not None and st.attrs.get("max_samples") == samples:
        print(f"ingest: reusing {path} ({samples} samples)")
        return
    res = child("ingest", {"store": path, "samples": samples})
    print(f"ingest: {samples} patches of 11×11 from {len(PHOTOS)} bundled photographs in "
          f"{res['seconds']:.1f} s, peak RSS {res['peak_rss_mb']:.0f} MiB "
          f"(all patches would be {samples * 121 * 8 / 2**20:.0f} MiB)")


def subset_store(big: str, path: str, n: int, seed: int):
    from dkha.data.ingest import ingest_array
    from dkha.data.store import open_store

    st = existing(path, n)
    return st if st is not None else ingest_array(open_store(big).sample(n, seed), path,
                                                  overwrite=True)


def compare(name: str, args, sigma: float, big: str, n: int, method: str) -> None:
    store = subset_store(big, os.path.join(args.work, f"subset-{n}.zarr"), n, seed=n)
    out = os.path.join(args.work, f"{method}-{n}.npy")
    base = child("sklearn", {"store": store.path, "sigma": sigma, "components": args.components,
                             "method": method, "landmarks": args.landmarks, "out": out},
                 env=ONE_THREAD)
    budget = base["seconds"]
    res = child("compare", {"store": store.path, "sigma": sigma, "components": args.components,
                            "budget": budget, "multiples": args.multiples, "eta0": args.eta0,
                            "mu": args.mu, "projections": out})
    print(f"\n{name}, l = {n}: {budget:.1f} s, peak RSS {base['peak_rss_mb']:.0f} MiB "
          f"(BLAS threads {base['blas_threads']}), "
          f"excess E/E_min − 1 = {res['baseline_excess']:.3e}")
    for s in res["dkha"]:
        tag = " ← same wall time" if s["mark"] == budget else ""
        print(f"  dkha kha-smd after {s['seconds']:7.1f} s ({s['passes']:.2f} passes): excess "
              f"{s['excess']:.3e}{tag}")
    print(f"  (E_min from dkha's Krylov eigenvalues, {res['eigenvalue_seconds']:.0f} s; "
          f"load {load_average()})")


def main() -> None:
    from dkha import config
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=10_240)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--center-sample", type=int, default=2000)
    ap.add_argument("--init-support", type=int, default=256)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None,
                    help="a local cluster of N worker processes (default: in-process)")
    ap.add_argument("--kpca-samples", type=int, default=20_000)
    ap.add_argument("--nystrom-samples", type=int, default=30_000)
    ap.add_argument("--landmarks", type=int, default=2000)
    ap.add_argument("--multiples", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.5, 1.0, 2.0], help="dkha snapshots at these multiples of the "
                    "baseline's seconds (default 0.5,1,2)")
    ap.add_argument("--eta0", type=float, default=0.02,
                    help="KHA-SMD's eta0 for every dkha fit (the default 0.2, and 0.05, diverged "
                         "on these patches with r = 20: eq. 12 gains ‖λ‖/λ_i·η0 exceed 1)")
    ap.add_argument("--mu", type=float, default=0.02)
    ap.add_argument("--skip-million", action="store_true")
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument("--work", default=os.path.join(REPO, ".bench-million"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-args", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](json.loads(args.child_args))))
        return

    import dkha
    from dkha.data.store import open_store
    from dkha.estimators.batch import resolve_kernel

    print(f"dkha from {dkha.__file__}; {os.cpu_count()} cores; load {load_average()}")
    os.makedirs(args.work, exist_ok=True)
    big = os.path.join(args.work, f"patches-{args.samples}.zarr")
    ensure_store(big, args.samples)
    sigma = resolve_kernel(open_store(big), "gaussian", 0, config.settings())["sigma"]
    print(f"gaussian kernel, sigma = {sigma:.4f} (median distance of 1000 seeded samples)")

    if not args.skip_million:
        l, b = args.samples, args.block
        res = child("fit", {"store": big, "sigma": sigma, "components": args.components,
                            "steps": args.steps, "center_sample": args.center_sample,
                            "init_support": args.init_support, "block": b,
                            "prefetch": args.prefetch, "workers": args.workers,
                            "eta0": args.eta0, "mu": args.mu,
                            "run_dir": os.path.join(args.work, "run-million")})
        print(f"\nmillion fit (dkha from {res['dkha']}): l = {l}, r = {args.components}, "
              f"kha-smd (eta0 {args.eta0}, mu {args.mu}), {args.steps} steps, blocks of {b}, "
              f"prefetch {args.prefetch}, " + (f"{args.workers} worker processes"
                                               if args.workers else "in-process cluster"))
        print(f"  centering: APPROXIMATE, MK row from a sample of {args.center_sample} columns "
              f"(--center-sample): {res['center_seconds']:.1f} s; read back from the store's "
              f"cache: {res['center_cached_seconds']:.2f} s (cached: {res['center_cached']})")
        print(f"  fit: {res['fit_seconds']:.1f} s in all (store check, centering from the cache "
              f"{res['centering_in_fit_seconds']:.1f} s, start from {args.init_support} kernel "
              f"rows, save), block stream {res['stream_seconds']:.1f} s (waiting for blocks "
              f"{res['wait_seconds']:.1f} s)")
        print(f"  steps per second: {args.steps / res['stream_seconds']:.1f} in the stream, "
              f"{args.steps / res['fit_seconds']:.1f} overall; alpha finite: {res['finite']}")
        total = 0.0
        for p in res["processes"]:
            print(f"  peak RSS {p['peak_rss_mb']:8.0f} MiB  {p['process']}")
            total += p["peak_rss_mb"]
        print(f"  peak RSS total {total:.0f} MiB = {total / 1024:.2f} GiB (limit 8 GB = 7.45 GiB: "
              f"{'under' if total * 2**20 < 8e9 else 'OVER'})")
        print(f"  largest arrays: blocks of {b}×{l} kernel rows = {b * l * 8 / 2**20:.0f} MiB; "
              f"the kernel matrix would be {8 * l * l / 1e12:.1f} TB (never formed)")
        print(f"  load {load_average()}")

    if not args.skip_compare:
        compare("scikit-learn KernelPCA (ARPACK, 1 BLAS thread)", args, sigma, big,
                args.kpca_samples, "kpca")
        compare(f"scikit-learn Nystroem ({args.landmarks} landmarks) + PCA (1 BLAS thread)", args,
                sigma, big, args.nystrom_samples, "nystrom")
    print(f"\nload at the end {load_average()}")


if __name__ == "__main__":
    main()
