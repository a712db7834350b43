"""The figures a 2-core machine cannot show — GPU passes, 16-core scaling — from one prepared run.

On the GPU host (CuPy, numba, scikit-learn, scikit-image and xarray there; dask, distributed,
zarr and their needs carried as wheels in ``.whl``, see below; dkha from this checkout), in the
repository root::

    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site
    PYTHONUNBUFFERED=1 python3 benchmarks/device_check.py --section gpu cpu --skip stop equality \
        --workers 1 16      # 8 minutes at most, the setup included

Here, every step at toy size (no GPU: the band passes with NumPy behind them, two workers)::

    python benchmarks/device_check.py --dry-run

The wheels (Python 3.12, x86-64), once, here::

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl dask distributed zarr numcodecs donfig crc32c \
        google-crc32c tornado tblib zict partd locket

Sections (each under its own time budget, ``--budget`` and ``--cpu-budget`` seconds; a step that
would not fit is skipped with a line saying so, a step that fails prints its error and the next
one runs). ``nvidia-smi dmon`` samples the GPU's SM utilisation once a second throughout, and each
phase prints its mean and median.

``gpu`` (issues 32 and 40), as a user runs it — a ``dkha`` command on PATH, the default
in-process cluster (which declares the host's GPU):

A. ``dkha ingest array`` of ``--equal-samples`` (20 000) and ``--gpu-samples`` (10⁶) 11×11 patches
   of scikit-image's photographs;
B. ``dkha fit STORE -o RUN --components 20 --device cuda``, first at 20 000 (it compiles; beside
   it ``--device cpu``, eigenvalues compared), then at 10⁶ timed as typed (target ≤ 60 s), and
   again with ``--precision float32`` (the fused Triton kernel where it serves: the plan says);
C. an independent check of the 10⁶ fit: ``‖K'v − λv‖/λ`` of each component by a plain float64
   CuPy loop over all ``l²`` values (its own MK row; no dkha code), target ≤ 1e-6;
E. (``--skip stop`` leaves it out) SIGTERM to ``dkha fit`` 4 s into its work;
D. dkha's MK and centered ``K'V`` (20 columns) passes at 10⁶ — float32 by the Triton kernel,
   float32 by the CuPy tiles (``DKHA_TRITON=0``), float64 — each against the float64 pass
   (target ≤ 1e-5) and beside a plain CuPy loop (cuBLAS GEMM, one elementwise exp, a GEMM with
   ``V``, all ``l²`` values) in the same run, target ≤ 3 s;
F. the fit at 2·10⁶ where the section's time left allows it (else a line: skipped), and the time
   projected for 10⁷ (a K'V pass × (l ratio)² × the passes; target ≤ 60 min, not pass/fail);
   SM utilisation of each fit from ``nvidia-smi dmon`` (target ≥ 80 %).

``cpu`` (issue 41) — ``benchmarks/scaling.py`` at ``--cpu-samples`` (50 000) with ``--workers``
(1 2 4 8 16) single-threaded worker processes: the MK pass, a ``K'V`` pass and a KHA-SMD pass
(``--kha-steps``; projections on the workers), each with the coordinator's CPU seconds and the
speed-up the model ``T(P) = C + W/P`` predicts beside the measured one, and the host's ceiling
for that many single-threaded processes of the same work without Dask (``--ceiling``); then at
``--cpu-big-samples`` (200 000) a KHA-SMD pass on a fixed subset of its blocks
(``--cpu-big-steps``), 1 worker against the most. Either section runs alone (``--section``).

The run's plan is printed first; The acceptance lines are printed at the end of each section.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE]
if not os.environ.get("DKHA_DEVICE_CHECK_INSTALLED"):
    sys.path.insert(0, REPO)     # this checkout's dkha unless the carried wheel is asked for

import numpy as np

T0 = time.perf_counter()
FIGURES: dict = {}


def say(*parts):
    print(f"[{time.perf_counter() - T0:6.1f} s]", *parts, flush=True)


class Budget:
    """Seconds left for a section; a step that would not fit is skipped."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def allows(self, seconds: float, what: str) -> bool:
        if self.left() >= seconds:
            return True
        say(f"SKIPPED {what}: needs ~{seconds:.0f} s, {self.left():.0f} s left in the section")
        return False


def step(name):
    """Run a step; print its error (not raise), so the next step still runs."""
    def wrap(fn):
        def run(*a, **k):
            say(f"--- {name}")
            try:
                return fn(*a, **k)
            except Exception:  # noqa: BLE001 - a device check reports every failure and goes on
                say(f"FAILED {name}:\n" + traceback.format_exc())
                FIGURES.setdefault("failed", []).append(name)
                return None
        return run
    return wrap


def environment(device: str):
    import dask
    import distributed
    import numba
    import zarr

    import dkha
    say(f"python {sys.version.split()[0]}, numpy {np.__version__}, numba {numba.__version__}, "
        f"dask {dask.__version__}, distributed {distributed.__version__}, zarr {zarr.__version__},"
        f" dkha {getattr(dkha, '__version__', '?')} from {os.path.dirname(dkha.__file__)}, "
        f"{os.cpu_count()} cores")
    if device == "cuda":
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(0)
        free, total = cupy.cuda.runtime.memGetInfo()
        say(f"GPU: {props['name'].decode()}, {props['multiProcessorCount']} SMs, "
            f"{total / 2**30:.0f} GiB ({free / 2**30:.0f} free), CuPy {cupy.__version__}")


def sigma_of(X: np.ndarray, seed: int = 0) -> float:
    """The median distance of 2 000 sampled pairs (the usual gaussian width)."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(X), (2, 2000))
    return float(np.median(np.linalg.norm(X[i] - X[j], axis=1)))


# --- gpu ---------------------------------------------------------------------------------------


class Dmon:
    """``nvidia-smi dmon`` (SM and memory utilisation, once a second) in the background; each
    phase of the check is marked by its wall-clock span and summarised from the samples in it."""

    def __init__(self, path: str):
        self.path, self.proc, self.phases = path, None, []
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-o", "T"],
                                         stdout=open(path, "w"),  # noqa: SIM115 - dmon's log
                                         stderr=subprocess.DEVNULL)
        except OSError:
            say("nvidia-smi not found: no utilisation figures")

    def mark(self, name: str, began: float, ended: float) -> None:
        self.phases.append((name, began, ended))

    def samples(self):
        """``(epoch seconds, sm %, mem %)`` of each line of dmon's log."""
        out, day = [], time.strftime("%Y-%m-%d")
        try:
            with open(self.path) as f:
                lines = f.read().splitlines()
        except OSError:
            return out
        for line in lines:
            parts = line.split()
            if len(parts) < 4 or line.startswith("#"):
                continue
            try:
                t = time.mktime(time.strptime(f"{day} {parts[0]}", "%Y-%m-%d %H:%M:%S"))
                out.append((t, float(parts[2]), float(parts[3])))
            except ValueError:
                continue
        return out

    def report(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        got = self.samples()
        FIGURES["dmon"] = {}
        for name, a, b in self.phases:
            sm = [s for t, s, _ in got if a <= t <= b]
            if not sm:
                say(f"dmon {name}: no samples")
                continue
            mean, med = float(np.mean(sm)), float(np.median(sm))
            FIGURES["dmon"][name] = {"sm_mean": mean, "sm_median": med, "samples": len(sm)}
            say(f"dmon {name}: SM utilisation mean {mean:.0f} %, median {med:.0f} % over "
                f"{len(sm)} s (samples: {' '.join(f'{x:.0f}' for x in sm[:40])})")


def dkha_launcher(workdir: str) -> str:
    """A ``dkha`` command on PATH as ``pip install`` makes it (``dkha.cli:main``), for this
    checkout (or the installed dkha): the command a user types."""
    bindir = os.path.join(workdir, "bin")
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, "dkha")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from dkha.cli import main; "
                f"sys.exit(main())' \"$@\"\n")
    os.chmod(path, 0o755)
    pp = [p for p in (os.environ.get("PYTHONPATH"),) if p]
    if not os.environ.get("DKHA_DEVICE_CHECK_INSTALLED"):
        pp.insert(0, REPO)
    os.environ["PYTHONPATH"] = os.pathsep.join(pp)
    os.environ["PATH"] = bindir + os.pathsep + os.environ["PATH"]
    return path


def run_command(args: list[str], what: str, timeout: float, env=None) -> tuple[float, str]:
    """Run a command, print its output's last lines; ``(seconds, stderr)``."""
    say("$ " + " ".join(args))
    t = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    s = time.perf_counter() - t
    for line in (p.stdout + p.stderr).strip().splitlines()[-25:]:
        say("  | " + line)
    say(f"{what}: exit {p.returncode} in {s:.1f} s")
    if p.returncode:
        raise RuntimeError(f"{what} exited {p.returncode}")
    return s, p.stderr


@step("A. the data: l 11×11 photo patches, `dkha ingest array`")
def ingest(workdir: str, l: int):
    from _data import patches

    path = os.path.join(workdir, f"patches-{l}.zarr")
    t = time.perf_counter()
    X = patches(l, step=1 if l > 400_000 else 2)
    npy = os.path.join(workdir, f"patches-{l}.npy")
    np.save(npy, X)
    say(f"{l} patches made in {time.perf_counter() - t:.1f} s")
    run_command(["dkha", "ingest", "array", npy, "-o", path, "--overwrite"], "ingest", 300)
    os.remove(npy)
    return path


def run_summary(run: str) -> dict:
    """The saved run's eigenvalues, coefficients, width and timings."""
    import xarray as xr

    ds = xr.open_zarr(os.path.join(run, "components.zarr"))
    with open(os.path.join(run, "timings.json")) as f:
        timings = json.load(f)
    params = ds.attrs.get("kernel_parameters")
    params = json.loads(params) if isinstance(params, str) else (params or {})
    return {"alpha": np.asarray(ds["alpha"].values, dtype=np.float64),
            "eigenvalue": np.asarray(ds["eigenvalue"].values, dtype=np.float64),
            "sigma": float(params.get("sigma", ds.attrs.get("sigma", np.nan))),
            "timings": timings, "attrs": dict(ds.attrs)}


@step("B. `dkha fit STORE -o RUN --components 20 --device DEVICE` (the default: exact)")
def user_fit(store: str, run: str, device: str, dmon: Dmon, name: str, timeout: float,
             extra: tuple = ()):
    a = time.time()
    s, _ = run_command(["dkha", "fit", store, "-o", run, "--components", "20", "--device",
                          device, *extra, "--overwrite"], f"dkha fit ({name})", timeout)
    dmon.mark(name, a, time.time())
    got = run_summary(run)
    passes = got["timings"].get("passes", [])
    say(f"{name}: {s:.1f} s wall; passes: "
        + ", ".join(f"{p.get('kind')} {p.get('wall_seconds', 0):.2f} s ({p.get('tasks')} tasks)"
                    for p in passes))
    say(f"{name}: plan {json.dumps(got['timings'].get('bands') or got['timings'].get('memory'))}")
    FIGURES.setdefault("fits", {})[name] = {
        "seconds": s, "passes": [(p.get("kind"), p.get("wall_seconds")) for p in passes],
        "eigenvalues": got["eigenvalue"].tolist()}
    return got


#: the plain CuPy loop beside dkha's passes: cuBLAS GEMM, one fused elementwise exp, a GEMM with
#: V, tiles of 8 192 × 131 072, the whole matrix (no symmetry), no dkha code
PLAIN_ROWS, PLAIN_COLS = 8192, 131072


def plain_loop(xp, X, V, sigma: float, dtype) -> tuple[np.ndarray, float]:
    """``K [V, 1]`` (uncentered, every value) by a plain loop; ``(result float64, seconds)``."""
    l = len(X)
    Xd = xp.asarray(X, dtype=dtype)
    nrm = xp.asarray(np.einsum("ij,ij->i", X, X), dtype=dtype)
    W = xp.asarray(np.hstack([V, np.ones((l, 1))]), dtype=dtype)
    out = xp.zeros((l, W.shape[1]), dtype=xp.float64)
    make = getattr(xp, "ElementwiseKernel", None)
    kern = None if make is None else make("T g, T xi, T yj, T s", "T k",
                                          "k = exp(-s * max(xi + yj - 2 * g, (T)0))",
                                          "plain_gaussian")
    s = 1.0 / (2.0 * sigma * sigma)
    sync = (lambda: xp.cuda.Device().synchronize()) if xp is not np else (lambda: None)
    sync()
    t = time.perf_counter()
    for a in range(0, l, PLAIN_ROWS):
        A = Xd[a:a + PLAIN_ROWS]
        acc = xp.zeros((len(A), W.shape[1]), dtype=dtype)
        for c in range(0, l, PLAIN_COLS):
            G = A @ Xd[c:c + PLAIN_COLS].T
            if kern is not None:
                kern(G, nrm[a:a + PLAIN_ROWS, None], nrm[None, c:c + PLAIN_COLS], dtype(s), G)
            else:
                G = np.exp(-s * np.maximum(nrm[a:a + len(A), None] + nrm[None, c:c + len(G[0])]
                                           - 2 * G, 0))
            acc += G @ W[c:c + PLAIN_COLS]
        out[a:a + len(A)] = acc
    sync()
    return tiles_host(xp, out), time.perf_counter() - t


def tiles_host(xp, a):
    return a if xp is np else xp.asnumpy(a)


@step("C. independent check: ‖K'v − λv‖/λ by a plain float64 loop (no dkha code)")
def independent_check(xp, store: str, fit: dict, dmon: Dmon):
    import zarr

    X = np.asarray(zarr.open_group(store, mode="r")["X"][:], dtype=np.float64)
    lam, alpha = fit["eigenvalue"], fit["alpha"]
    V = (alpha * np.sqrt(lam)[:, None]).T            # v_i = √λ_i alpha_i
    a = time.time()
    KW, s = plain_loop(xp, X, V, fit["sigma"], np.float64)
    dmon.mark("plain float64 loop", a, time.time())
    l = len(X)
    mk = KW[:, -1] / l
    mkm = mk.mean()
    KV = KW[:, :-1]
    # K' V = K V − 1 (mkᵀ V) − mk (1ᵀ V) + mkm 1 (1ᵀ V)
    KcV = KV - (mk @ V)[None, :] - np.outer(mk - mkm, V.sum(axis=0))
    res = np.linalg.norm(KcV - V * lam, axis=0) / lam
    say(f"plain float64 loop over all {l}² values: {s:.1f} s; ‖K'v − λv‖/λ max {res.max():.1e} "
        f"(≤ 1e-6: {'yes' if res.max() <= 1e-6 else 'NO'}); each: "
        f"{np.array2string(res, precision=1, max_line_width=200)}")
    FIGURES["independent"] = {"seconds_float64": s, "residual_max": float(res.max()),
                              "residuals": res.tolist()}


@step("D. dkha's passes (MK, K'V with 20 columns) beside the plain float32 loop")
def dkha_passes(xp, device: str, store_path: str, sigma: float, dmon: Dmon, r: int = 20):
    from distributed import Client, LocalCluster

    from dkha import config
    from dkha.data.store import open_store
    from dkha.engine.cluster import local_gpus
    from dkha.engine.rows import RowEngine
    from dkha.kernels import make_kernel
    from dkha.tiles import triton_gaussian

    store = open_store(store_path)
    l = store.n_samples
    V = np.random.default_rng(0).standard_normal((l, r))
    gpus = {"GPU": 1} if local_gpus() else {}
    rows = {}
    with LocalCluster(n_workers=1, threads_per_worker=os.cpu_count(), processes=False,
                      resources=gpus, dashboard_address=":0", silence_logs=40) as c, \
            Client(c) as cl:
        kernel = make_kernel("gaussian", sigma=sigma)
        mk = None
        for precision, fused in (("float32", "1"), ("float32", "0"), ("float64", "1")):
            label = precision + (" cupy tiles" if fused == "0" else "")
            os.environ["DKHA_TRITON"] = fused       # the fused kernel where it serves, or not
            triton_gaussian.usable.cache_clear()
            eng = RowEngine(store, kernel, cl, config.settings(precision=precision, device=device))
            if eng.bands is not None:
                say(eng.bands.describe())
            a = time.time()
            t = time.perf_counter()
            got_mk = eng.compute_mk(cache=False)
            mk_s = time.perf_counter() - t
            dmon.mark(f"dkha MK pass {label}", a, time.time())
            if mk is None:
                mk = got_mk
            eng.set_mk(*mk)
            eng.matmat(V)       # once first: the rows read and made resident
            a = time.time()
            t = time.perf_counter()
            KV = eng.matmat(V)
            kv_s = time.perf_counter() - t
            dmon.mark(f"dkha K'V pass {label}", a, time.time())
            rows[label] = {"mk_s": mk_s, "kv_s": kv_s, "KV": KV,
                           "products": (eng.bands.device.get("products") if eng.bands else None)}
            say(f"dkha {label}: MK pass {mk_s:.2f} s, K'V pass ({r} columns) {kv_s:.2f} s "
                f"(rows already resident; products: {rows[label]['products']})")
        os.environ.pop("DKHA_TRITON", None)
        triton_gaussian.usable.cache_clear()
    X = np.asarray(load_all(store_path), dtype=np.float64)
    a = time.time()
    KW, plain32 = plain_loop(xp, X, V, sigma, np.float32)
    dmon.mark("plain float32 loop", a, time.time())
    m, mkm = mk
    KcV = KW[:, :-1] - (m @ V)[None, :] - np.outer(m - mkm, V.sum(axis=0))
    if "float64" in rows:
        ref = rows["float64"]["KV"]
        diffs = {k: float(np.abs(row["KV"] - ref).max() / np.abs(ref).max())
                 for k, row in rows.items() if k != "float64"}
        diffs["plain float32 loop"] = float(np.abs(KcV - ref).max() / np.abs(ref).max())
        say("K'V against dkha's float64 pass, max rel diff: "
            + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        FIGURES["float32_rel_diff"] = diffs
    for precision, row in rows.items():
        say(f"dkha {precision} K'V: plain loop "
            f"{plain32:.2f} s, dkha {row['kv_s']:.2f} s: dkha {plain32 / row['kv_s']:.2f}× "
            f"faster (target ≥ 2×)")
        row.pop("KV")
    FIGURES["passes"] = {"plain_float32_s": plain32, **rows}


@step("E. a quiet stop: SIGTERM to `dkha fit` mid-pass")
def quiet_stop(store: str, run: str, device: str, after: float = 4.0):
    """SIGTERM ``after`` seconds after the fit printed its plan (in its first pass): what it
    prints besides its progress lines, and its exit code (75: resumable)."""
    import signal
    import threading

    args = ["dkha", "fit", store, "-o", run, "--components", "20", "--device", device,
            "--overwrite"]
    say("$ " + " ".join(args) + f"   (SIGTERM {after:.0f} s after its plan line)")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list = []
    seen = threading.Event()

    def read():
        for line in p.stderr:
            lines.append(line.rstrip("\n"))
            if "plan:" in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen.wait(120)
    time.sleep(after)
    p.send_signal(signal.SIGTERM)
    t = time.perf_counter()
    out = p.stdout.read()
    rc = p.wait(120)
    reader.join(10)
    progress = re.compile(r"^\d\d:\d\d:\d\d \(\+")
    other = [ln for ln in lines + out.splitlines() if ln.strip() and not progress.match(ln)]
    say(f"exit {rc} {time.perf_counter() - t:.1f} s after SIGTERM; lines other than progress "
        f"({len(other)}):")
    for ln in other[:30]:
        say("  | " + ln)
    tracebacks = sum("Traceback" in ln or "AssertionError" in ln for ln in other)
    FIGURES["quiet_stop"] = {"exit": rc, "other_lines": len(other), "tracebacks": tracebacks}


def load_all(store_path: str) -> np.ndarray:
    import zarr
    return zarr.open_group(store_path, mode="r")["X"][:]


def gpu_section(args, budget):
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:    # the GPU's band passes with NumPy behind them
        os.environ["DASK_DKHA__BAND_PASSES"] = "True"
        xp = np
    else:
        import cupy as xp
    try:
        environment(device)
    except Exception:  # noqa: BLE001 - the versions are for the log; the steps say what fails
        say("environment: " + traceback.format_exc(limit=2))
    os.makedirs(args.workdir, exist_ok=True)
    dkha_launcher(args.workdir)
    dmon = Dmon(os.path.join(args.out or args.workdir, "dmon.txt"))
    l_small, l_big = args.equal_samples, max(args.gpu_samples)
    small = ingest(args.workdir, l_small)
    if small:   # first fits compile the CPU's probe tile: not in the timed fit
        g = user_fit(small, os.path.join(args.workdir, "run-small-gpu"), device, dmon,
                     f"fit l={l_small} {device}", 300)
        if "equality" not in args.skip and budget.allows(60, "the CPU fit beside it"):
            c = user_fit(small, os.path.join(args.workdir, "run-small-cpu"), "cpu", dmon,
                         f"fit l={l_small} cpu", 300)
            if g and c:
                d = float(np.abs(g["eigenvalue"] / c["eigenvalue"] - 1).max())
                say(f"l = {l_small}: eigenvalues {device} vs cpu, max rel diff {d:.1e}")
                FIGURES["small_eigenvalues_rel_diff"] = d
    big = (small if l_big == l_small else
           ingest(args.workdir, l_big) if budget.allows(30, f"the store of {l_big}") else None)
    fit = None
    if big and "bigfit" not in args.skip and budget.allows(130, f"the fit at l = {l_big}"):
        fit = user_fit(big, os.path.join(args.workdir, "run-big"), device, dmon,
                       f"fit l={l_big} {device}", max(60, budget.left() - 60))
    if fit and budget.allows(40 * (l_big / 1e6) ** 2 + 5, "the independent check"):
        independent_check(xp, big, fit, dmon)
    if big and "stop" not in args.skip and budget.allows(40, "the quiet stop"):
        quiet_stop(big, os.path.join(args.workdir, "run-stop"), device)
    if big and budget.allows(60 * (l_big / 1e6) ** 2 + 10, "dkha's passes"):
        sigma = fit["sigma"] if fit else 3 * sigma_of(load_all(big)[:200_000])
        dkha_passes(xp, device, big, sigma, dmon)
    if big and "float32" not in args.skip and budget.allows(100, "the float32 fit"):
        user_fit(big, os.path.join(args.workdir, "run-big-32"), device, dmon,
                 f"fit l={l_big} {device} float32", max(60, budget.left() - 30),
                 extra=["--precision", "float32"])
    double_fit(args, budget, device, dmon, l_big)
    dmon.report()
    acceptance_gpu(l_big)


def double_fit(args, budget, device, dmon, l_big):
    """The same fit at twice the rows where the section's remaining time allows it (the fit at
    ``l_big`` × 4 for the products, plus the store), else a line saying it is skipped."""
    l2 = 2 * l_big
    f1 = FIGURES.get("fits", {}).get(f"fit l={l_big} {device}")
    need = (4 * f1["seconds"] if f1 else 600) + 40 * l2 / 1e6 + 20
    if "double" in args.skip or not budget.allows(need, f"the fit at l = {l2}"):
        FIGURES["double_fit"] = "skipped"
        return
    store = ingest(args.workdir, l2)
    if store:
        user_fit(store, os.path.join(args.workdir, "run-double"), device, dmon,
                 f"fit l={l2} {device}", max(60, budget.left() - 10))


def projected(l_big: int, target: int = 10_000_000) -> str | None:
    """The fit at ``target`` rows projected from the measured one: its mean K'V pass × (l
    ratio)² × its products (the MK pass as one more), a line."""
    for name, f in FIGURES.get("fits", {}).items():
        if name.startswith(f"fit l={l_big} ") and "float32" not in name:
            kv = [w for k, w in f["passes"] if w and k == "product"]
            if not kv:
                kv = [w for _, w in f["passes"] if w]
            if not kv:
                return None
            per = float(np.mean(kv))
            n = len(f["passes"])
            t = per * (target / l_big) ** 2 * n
            FIGURES["projected_1e7"] = {"pass_s": per, "passes": n, "seconds": t}
            return (f"projected at l = {target:.0e}: {per:.2f} s a K'V pass × "
                    f"{(target / l_big) ** 2:.0f} (l ratio²) × {n} passes = {t / 60:.0f} min "
                    "(target ≤ 60 min, not a pass/fail line)")
    return None


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def acceptance_gpu(l_big: int):
    say("=== issue 40, GPU: acceptance")
    for name, f in FIGURES.get("fits", {}).items():
        if f"l={l_big}" in name:
            say(f"{name}: {f['seconds']:.1f} s wall, as typed (target ≤ 60 s: "
                f"{_met(f['seconds'] <= 60)})")
    ind = FIGURES.get("independent")
    if ind:
        say(f"independent float64 residual max {ind['residual_max']:.1e} (target ≤ 1e-6: "
            f"{_met(ind['residual_max'] <= 1e-6)})")
    p = FIGURES.get("passes")
    diffs = FIGURES.get("float32_rel_diff", {})
    if p:
        for label, row in p.items():
            if not isinstance(row, dict):
                continue
            d = diffs.get(label)
            say(f"{label}: centered K'V (20 columns) {row['kv_s']:.2f} s (target ≤ 3 s: "
                f"{_met(row['kv_s'] <= 3)}), rel diff to float64 "
                + ("—" if d is None else f"{d:.1e} (target ≤ 1e-5: {_met(d <= 1e-5)})")
                + f"; MK {row['mk_s']:.2f} s; the plain CuPy float32 loop (GEMM + exp + GEMM, "
                f"all l² values) {p['plain_float32_s']:.2f} s in the same run; products: "
                f"{row.get('products')}")
    for name, d in FIGURES.get("dmon", {}).items():
        if name.startswith("fit"):
            say(f"SM utilisation during {name} (first pass to last product, with its start): "
                f"mean {d['sm_mean']:.0f} % (target ≥ 80 %: {_met(d['sm_mean'] >= 80)})")
    if FIGURES.get("double_fit") == "skipped":
        say(f"the fit at l = {2 * l_big}: skipped (not enough of the section's time left)")
    line = projected(l_big)
    if line:
        say(line)
    q = FIGURES.get("quiet_stop")
    if q:
        say(f"SIGTERM mid-fit: exit {q['exit']} (75: resumable), {q['tracebacks']} traceback "
            f"lines, {q['other_lines']} lines besides progress")
    if FIGURES.get("failed"):
        say(f"failed steps: {', '.join(FIGURES['failed'])}")


def cpu_big(args, budget):
    """Issue 41 at ``--cpu-big-samples`` (200 000): a KHA-SMD pass on a fixed subset of its
    blocks (``--cpu-big-steps`` steps), 1 worker against the most, each beside the model
    (scaling.py --kha-only: the MK row sampled, no exact pass of one worker over 4·10¹⁰ values)."""
    l, most = args.cpu_big_samples, max(args.workers)
    out = os.path.join(args.workdir, "scaling-big.json")
    cmd = [sys.executable, os.path.join(HERE, "scaling.py"), "--samples", str(l),
           "--workers", "1", str(most), "--repeat", "1", "--projections", "workers",
           "--kha-only", "--kha-steps", str(args.cpu_big_steps), "--workdir", args.workdir,
           "--json", out]
    if "big" in args.skip or not budget.allows(60, f"the KHA-SMD subset at l = {l}"):
        return
    say("--- CPU scaling, fixed subset of blocks: " + " ".join(cmd[1:]))
    try:
        subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                       timeout=max(10, budget.left() - 5), check=False)
    except subprocess.TimeoutExpired:
        say(f"scaling.py at l = {l} ran out of the section's time")
    if os.path.exists(out):
        with open(out) as f:
            rows = json.load(f)
        FIGURES["scaling_big"] = rows
        for row in rows:
            if row["workers"] == most:
                say(f"l = {l}, {row['kind']} N={most}: {row['speedup']:.2f}× measured, "
                    f"{row['predicted']:.2f}× predicted (target ≥ 8×: "
                    f"{_met(row['speedup'] >= 8)}); coordinator CPU {row['cpu']:.2f} s")


def cpu_section(args, budget):
    if "scaling" not in args.skip:
        cpu_scaling(args, budget)
    cpu_big(args, budget)


def cpu_scaling(args, budget):
    out = os.path.join(args.workdir, "scaling.json")
    cmd = [sys.executable, os.path.join(HERE, "scaling.py"), "--samples", str(args.cpu_samples),
           "--workers", *map(str, args.workers), "--repeat", "1", "--projections", "workers",
           "--kha-steps", str(args.kha_steps), "--workdir", args.workdir, "--json", out,
           "--ceiling", "0.2" if args.dry_run else "2"]
    if "krylov" in args.skip:
        cmd.append("--skip-krylov")
    say("--- CPU scaling: " + " ".join(cmd[1:]))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        p = subprocess.run(cmd, env=env, timeout=max(10, budget.left() - 5), check=False)
        say(f"scaling.py exited {p.returncode}")
    except subprocess.TimeoutExpired:
        say("scaling.py ran out of the section's time; the rows measured are above")
    if not os.path.exists(out):
        return
    with open(out) as f:
        rows = json.load(f)
    FIGURES["scaling"] = rows
    say("=== issue 32, CPU: acceptance (speed-up of N workers over 1, measured / predicted)")
    first = {}
    for row in rows:
        base = first.setdefault(row["kind"], row)
        if base["workers"] != 1:
            continue
        target = 8 if row["kind"].startswith("KHA") else (12 if "pass" in row["kind"] or
                                                         "K'V" in row["kind"] else None)
        mark = ""
        if target and row["workers"] == 16:
            mark = f" (target ≥ {target}×: {'met' if row['speedup'] >= target else 'NOT met'})"
        say(f"{row['kind']:38s} N={row['workers']:2d}: {row['speedup']:5.2f}× measured, "
            f"{row['predicted']:5.2f}× predicted; coordinator CPU {row['cpu']:.2f} s{mark}")


def print_plan(args) -> None:
    """The run's plan, first: each section's steps, sizes and time."""
    say(f"plan{' (dry run: toy sizes, NumPy for CuPy)' if args.dry_run else ''}: sections "
        f"{' '.join(args.section)}; skipped steps: {' '.join(args.skip) or 'none'}")
    if "gpu" in args.section:
        l = max(args.gpu_samples)
        say(f"plan: gpu, {args.budget:.0f} s: ingest {args.equal_samples} and {l}; dkha fit "
            f"--components 20 --device cuda at {args.equal_samples} (compiles) and {l} (timed, "
            f"target ≤ 60 s); the independent float64 residuals; the fit with --precision "
            f"float32; dkha's MK and K'V passes (float32 Triton, float32 CuPy tiles, float64) "
            f"beside the plain CuPy loop; the fit at {2 * l} if the time left allows; the "
            f"projection to 10⁷; nvidia-smi dmon throughout")
    if "cpu" in args.section:
        say(f"plan: cpu, {args.cpu_budget:.0f} s: scaling.py at {args.cpu_samples} with workers "
            f"{' '.join(map(str, args.workers))} (MK, K'V, KHA-SMD {args.kha_steps} steps); at "
            f"{args.cpu_big_samples}, KHA-SMD {args.cpu_big_steps} steps, 1 and "
            f"{max(args.workers)} workers")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="every step at toy size, NumPy instead of CuPy, 2 workers")
    ap.add_argument("--section", nargs="+", default=["gpu", "cpu"], choices=["gpu", "cpu"])
    ap.add_argument("--budget", type=float, default=250, help="seconds of the gpu section (250)")
    ap.add_argument("--cpu-budget", type=float, default=200,
                    help="seconds of the cpu section (200; with the gpu section and the setup, "
                         "one run stays within 8 minutes)")
    ap.add_argument("--gpu-samples", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--equal-samples", type=int, default=20_000,
                    help="the first fit's samples (it compiles the probe tile), GPU and CPU")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["equality", "krylov", "bigfit", "stop", "float32", "double",
                             "big", "scaling"],
                    help="steps to leave out (krylov: the CPU section's krylov fits; scaling: "
                         "its scaling.py table, big: its fixed subset at the larger l)")
    ap.add_argument("--cpu-samples", type=int, default=50_000)
    ap.add_argument("--cpu-big-samples", type=int, default=200_000)
    ap.add_argument("--cpu-big-steps", type=int, default=4096,
                    help="KHA-SMD steps timed at --cpu-big-samples: the fixed subset of blocks")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--kha-steps", type=int, default=6400)
    ap.add_argument("--workdir", default="/tmp/dkha-device")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="where figures.json goes")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.gpu_samples, args.equal_samples = [3000], 3000      # one store
        args.cpu_samples, args.workers, args.kha_steps = 3000, [1, 2], 512
        args.cpu_big_samples, args.cpu_big_steps = 3000, 512
        args.budget, args.cpu_budget = min(args.budget, 240), min(args.cpu_budget, 240)
    print_plan(args)
    for section in args.section:
        say(f"=== section {section}")
        budget = Budget(args.budget if section == "gpu" else args.cpu_budget)
        (gpu_section if section == "gpu" else cpu_section)(args, budget)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "figures.json"), "w") as f:
            json.dump(FIGURES, f, indent=1, default=float)
    say("done")


if __name__ == "__main__":
    main()
