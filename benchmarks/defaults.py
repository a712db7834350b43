"""Defaults that need no tuning: the default fit against the best of the paper's gain grid.

For each data set of a panel assembled from what scikit-learn and scikit-image ship, this prints
the excess error ``E/E_min − 1`` after the default number of passes of the default fit
(``dkha fit DATA -o RUN --components 16``: KHA-SMD from the default Nyström start with the
default gains; the data set's kernel options where it is not the gaussian with the median
width), and the same for ``--algorithm kha``, ``kha-t`` and ``kha-et``, each next to the best
setting of the paper's ``{1, 2, 5}×10^b`` grid of η0 (× μ for KHA-SMD) for the same passes and
start. The four defaults of a data set are fitted in one kernel stream, the whole grid in
another (:func:`dkha.estimators.batch.fit_together`, the machinery of ``dkha tune``).

Beside each default, "start → end": its error at the start (the Nyström start, pass 0) and at
the end (the state the fit kept), both from the fit's own tracked evaluations (Σθ², no kernel
pass) written as an excess ``√(‖K'‖²_F − Σθ²)/E_min − 1`` (an upper bound on the error of the
best representation of the components' span); ``*`` marks a fit that kept an earlier pass's
state because its last pass was worse, ``!`` one that stopped at once because its first pass did
not improve on the Nyström start (issue 42: the start is already as good as the passes at its
default gains can make it). The defaults run as ``dkha fit`` runs them (tracked evaluations
every pass); the grid is evaluated exactly at the end. ``--defaults-only`` fits the defaults
alone (no grid, no ratio): the start → end check of issue 42 in a fraction of the time.

Targets (issue 14): no default fit fails or diverges; every default excess ≤ 1e-3 on the
gaussian kernels; every default within 3× of its grid's best; (issue 23) no default fit ends
worse than its start; (issue 42) every default fit improves on its start or stops at once.

The panel (``--data`` picks a subset; ``--small`` divides the patch counts by 4):

* ``patches8-5k``, ``patches11-5k``, ``patches8-20k``, ``patches11-20k``: 8×8 and 11×11 patches
  of several photographs (a seeded sample spread over each image, pixels in [0, 1]);
* ``digits``: load_digits with pixels ``x/8 − 1``; ``digits-std``: each pixel standardized
  (``x/16`` would be ``x/8 − 1`` again under the median width);
* ``cancer``, ``wine``: standardized breast-cancer and wine tables;
* ``digits-s0.5``, ``patches11-s3``: σ = 0.5× and 3× the median distance;
* ``digits-poly``: polynomial kernel ``(x·y + 1)³`` on ``x/16``; ``cancer-laplace``: the
  laplacian kernel with the median width.

``--timing`` also prints, on ``--timing-samples`` (20 000) 11×11 patches of camera (r = 20), the
seconds of the default fit to its first evaluation with excess ≤ 1e-3 (fit stopped there by
``tol``; centering, start and passes, evaluations excluded, and the whole call with them) beside
scikit-learn's exact ``KernelPCA`` (arpack) on the same data, in one run; and the seconds from
starting ``dkha fit`` on that store to its first line of output.

    python benchmarks/defaults.py [--data digits,cancer] [--small] [--passes N]
                                  [--coarse] [--defaults-only] [--timing] [--timing-samples N]

Run on a shared machine, compare ratios measured within one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import _data  # noqa: F401 - first: this checkout's dkha on the path
import dask.config
import numpy as np

from dkha import config
from dkha.data.ingest import ingest_array
from dkha.data.patches import extract_patches, read_grey_image
from dkha.data.store import open_store
from dkha.engine.cluster import client_for
from dkha.engine.rows import RowEngine
from dkha.estimators.batch import KernelHebbianPCA, fit_together
from dkha.estimators.tune import grid
from dkha.fit.evaluate import evaluate_many
from dkha.kernels import median_distance

R = 16
TARGET = 1e-3
ALGORITHMS = ("kha", "kha-t", "kha-et", "kha-smd")
PHOTOS_A = ("camera", "coins", "astronaut", "moon")
PHOTOS_B = ("chelsea", "coffee", "rocket", "brick")


def patch_sample(n: int, patch: int, photos, seed: int = 0) -> np.ndarray:
    """``n`` patches spread over ``photos`` (a seeded sample of each image's patches on a grid
    of 2, the same number from each)."""
    rng = np.random.default_rng([seed, patch, n])
    per = -(-n // len(photos))
    parts = []
    for name in photos:
        P = extract_patches(read_grey_image(f"skimage:{name}"), patch, 2)
        parts.append(P[np.sort(rng.choice(len(P), size=min(per, len(P)), replace=False))])
    X = np.concatenate(parts)
    return X[np.sort(rng.choice(len(X), size=n, replace=False))]


def standardized(X: np.ndarray) -> np.ndarray:
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def panel(small: bool) -> dict:
    """``name → (builder, kernel options, is gaussian)``; builders return the array."""
    from sklearn.datasets import load_breast_cancer, load_digits, load_wine

    k = 4 if small else 1
    digits = lambda: load_digits().data / 8.0 - 1.0
    median = lambda X: median_distance(X[np.random.default_rng(0).choice(
        len(X), size=min(1000, len(X)), replace=False)])
    return {
        "patches8-5k": (lambda: patch_sample(5000 // k, 8, PHOTOS_A), {}, True),
        "patches11-5k": (lambda: patch_sample(5000 // k, 11, PHOTOS_B), {}, True),
        "patches8-20k": (lambda: patch_sample(20000 // k, 8, PHOTOS_B), {}, True),
        "patches11-20k": (lambda: patch_sample(20000 // k, 11, PHOTOS_A), {}, True),
        "digits": (digits, {}, True),
        "digits-std": (lambda: standardized(load_digits().data), {}, True),
        "cancer": (lambda: standardized(load_breast_cancer().data), {}, True),
        "wine": (lambda: standardized(load_wine().data), {}, True),
        "digits-s0.5": (digits, {"sigma_times_median": 0.5}, True),
        "patches11-s3": (lambda: patch_sample(5000 // k, 11, PHOTOS_A + PHOTOS_B),
                         {"sigma_times_median": 3.0}, True),
        "digits-poly": (lambda: load_digits().data / 16.0,
                        {"kernel": "polynomial", "degree": 3, "offset": 1.0}, False),
        "cancer-laplace": (lambda: standardized(load_breast_cancer().data),
                           {"kernel": "laplacian"}, False),
        "_median": median,
    }


def grids(coarse: bool) -> dict:
    """The gains tried per algorithm: the paper's {1, 2, 5}×10^b (``coarse``: 10^b only)."""
    def g(lo, hi):
        values = grid(lo, hi)
        return [v for v in values if not coarse or np.isclose(np.log10(v), round(np.log10(v)))]
    return {"kha": [(e, None) for e in g(-5, -1)],
            "kha-t": [(e, None) for e in g(-5, -1)],
            "kha-et": [(e, None) for e in g(-4, 0)],
            "kha-smd": [(e, m) for e in g(-4, -1) for m in (0.1, 1.0, 10.0)]}


def store_for(name: str, builder, workdir: str, small: bool) -> str:
    """The data set's store in ``workdir``, made once (``--small`` ones apart from the others)."""
    path = os.path.join(workdir, f"{name}{'-small' if small else ''}.zarr")
    if not os.path.exists(path):
        ingest_array(builder(), path, chunk_rows=1024)
    return path


def run_panel(names, args, client, workdir) -> list[dict]:
    data = panel(args.small)
    median = data.pop("_median")
    gains = grids(args.coarse)
    rows = []
    for name in names:
        builder, kernel_options, gaussian = data[name]
        path = store_for(name, builder, workdir, args.small)
        kw = {k: v for k, v in kernel_options.items() if k != "sigma_times_median"}
        if "sigma_times_median" in kernel_options:
            kw["sigma"] = kernel_options["sigma_times_median"] * median(open_store(path).read())
        common = dict(passes=args.passes, client=client, **kw)
        # the defaults as `dkha fit` runs them: tracked evaluations every pass, the best state
        # kept (dkha.fit.track); the grid in one stream, evaluated exactly at the end only
        defaults = [KernelHebbianPCA(R, algorithm=a, **common) for a in ALGORITHMS]
        models = [KernelHebbianPCA(R, algorithm=a, eta0=e, mu=m, evaluate_every=0, **common)
                  for a in ALGORITHMS for e, m in gains[a]] if not args.defaults_only else []
        t0 = time.perf_counter()
        with dask.config.set({"dkha.evaluation": "tracked"}):
            fit_together(defaults, path, skip_diverged=True)
        with dask.config.set({"dkha.evaluation": "exact"}):
            if models:
                fit_together(models, path, skip_diverged=True)
            ends = exact_ends(path, defaults, client)
        seconds = time.perf_counter() - t0
        models = defaults + models
        first = models[0]
        row = {"data": name, "l": first.n_samples_, "n": first.n_features_in_,
               "kernel": first.kernel_.describe(), "gaussian": gaussian, "seconds": seconds,
               "models": len(models)}
        for i, a in enumerate(ALGORITHMS):
            d = models[i]
            row[a] = {"default": None if d.failure_ else ends[i]["excess"],
                      "start": None if d.failure_ else ends[i]["start"],
                      "end": None if d.failure_ else ends[i]["end"],
                      "kept_pass": None if d.failure_ else ends[i]["kept_pass"],
                      "stopped_after": None if d.failure_ else ends[i]["stopped_after"],
                      "failure": d.failure_, "init": None if d.failure_ else d.attrs_["init"],
                      "eta0": None if d.failure_ else d.attrs_["eta0_applied"],
                      "mu": None if d.failure_ else d.attrs_["mu"]}
            scored = [(m.history_[-1]["excess"], m.eta0, m.mu) for m in models[len(ALGORITHMS):]
                      if m.algorithm == a and m.failure_ is None and m.history_]
            best = min(scored) if scored else (None, None, None)
            row[a].update(best=best[0], best_eta0=best[1], best_mu=best[2],
                          diverged=sum(1 for m in models[len(ALGORITHMS):]
                                       if m.algorithm == a and m.failure_ is not None))
        rows.append(row)
        print_row(row, flush=True)
    return rows


def exact_ends(path: str, defaults: list, client) -> list[dict]:
    """For each default fit: the exact excess ``E/E_min − 1`` of its result (one evaluation of
    all of them: a pass for their ``C = A K'``, one for the residuals, ``E_min`` from the
    store's cached spectrum), and its tracked error at the start and at the end (the state it
    kept) as an excess, ``√(‖K'‖²_F − Σθ²)/E_min − 1`` from the history's Σθ² (an upper bound
    on the error of the best representation of the span; the fit keeps its best entry, so the
    end is never above the start)."""
    done = [d for d in defaults if d.failure_ is None]
    out = [None] * len(defaults)
    if not done:
        return out
    engine = RowEngine(open_store(path), done[0].kernel_, client, config.settings())
    engine.compute_mk()
    evs = iter(evaluate_many(engine, [d.alpha_ for d in done], announce=False))
    for i, d in enumerate(defaults):
        if d.failure_ is not None:
            continue
        ev = next(evs)
        f2, e2 = ev.frobenius ** 2, ev.error_min ** 2
        def tracked(captured, f2=f2, e2=e2):
            return np.sqrt(max(f2 - captured, 0.0) / e2) - 1.0 if e2 > 0 else 0.0
        kept = d.attrs_.get("kept_state")
        end = kept["captured"] if kept else d.history_[-1]["captured"]
        out[i] = {"excess": ev.excess, "start": tracked(d.history_[0]["captured"]),
                  "end": tracked(end), "kept_pass": None if not kept else kept["pass"],
                  "stopped_after": None if not kept else kept.get("stopped_after")}
    return out


def print_header() -> None:
    print(f"{'data':15s} {'l':>6s} {'kernel':34s} " + " ".join(
        f"{a + ' default / best (ratio)':>36s} {'start → end':>23s}" for a in ALGORITHMS))


def print_row(row: dict, flush: bool = False) -> None:
    cells = []
    for a in ALGORITHMS:
        c = row[a]
        if c["default"] is None:
            cells.append(f"{'FAILED':>36s} {'':23s}")
            continue
        ratio = c["default"] / c["best"] if c["best"] else float("nan")
        best = f"{c['best']:8.2e}" if c["best"] is not None else "-"
        cells.append(f"{c['default']:10.2e} / {best} ({ratio:5.2f}×)"[:36].rjust(36)
                     + f" {c['start']:10.4e} → {c['end']:10.4e}"
                     + ("" if c["kept_pass"] is None else
                        "!" if c.get("stopped_after") is not None else "*"))
    print(f"{row['data']:15s} {row['l']:6d} {row['kernel'][:34]:34s} " + " ".join(cells),
          flush=flush)


def verdict(rows: list[dict]) -> None:
    failed = [(r["data"], a) for r in rows for a in ALGORITHMS if r[a]["default"] is None]
    above = [(r["data"], r["kha-smd"]["default"]) for r in rows
             if r["gaussian"] and r["kha-smd"]["default"] is not None
             and r["kha-smd"]["default"] > TARGET]
    worse = [(r["data"], a) for r in rows for a in ALGORITHMS
             if r[a]["default"] is not None and r[a]["end"] > r[a]["start"]]
    far = [(r["data"], a, r[a]["default"] / r[a]["best"]) for r in rows for a in ALGORITHMS
           if r[a]["default"] is not None and r[a]["best"] and r[a]["default"] > 3 * r[a]["best"]]
    print(f"\ndefault fits failed or diverged: {len(failed)}"
          + (f" ({', '.join(f'{d}/{a}' for d, a in failed)})" if failed else ""))
    print(f"default (kha-smd) excess above {TARGET:g} on gaussian kernels: {len(above)}"
          + (f" ({', '.join(f'{d} {e:.2e}' for d, e in above)})" if above else ""))
    print(f"default fits that end worse than their start (tracked): {len(worse)}"
          + (f" ({', '.join(f'{d}/{a}' for d, a in worse)})" if worse else ""))
    # issue 42: the passes improve on the start, or stop at once where they cannot
    done = [(r["data"], a, r[a]) for r in rows for a in ALGORITHMS if r[a]["default"] is not None]
    stopped = [(d, a) for d, a, c in done if c.get("stopped_after") is not None]
    improved = [(d, a) for d, a, c in done
                if c.get("stopped_after") is None and c["kept_pass"] != 0 and c["end"] < c["start"]]
    neither = [(d, a) for d, a, c in done if (d, a) not in stopped and (d, a) not in improved]
    print(f"default fits that improved on their start: {len(improved)}; that stopped at once "
          f"(the start already as good as their passes can make it): {len(stopped)}"
          + (f" ({', '.join(f'{d}/{a}' for d, a in stopped)})" if stopped else ""))
    print(f"default fits that neither improved on their start nor stopped at once: {len(neither)}"
          + (f" ({', '.join(f'{d}/{a}' for d, a in neither)})" if neither else ""))
    print(f"defaults more than 3× their grid's best: {len(far)}"
          + (f" ({', '.join(f'{d}/{a} {x:.1f}×' for d, a, x in far)})" if far else ""))


def timing(args, workdir: str) -> dict:
    """Seconds of the default fit to excess ≤ 1e-3 beside scikit-learn's exact KernelPCA, and
    the seconds to ``dkha fit``'s first output, at ``--timing-samples`` camera patches."""
    from sklearn.decomposition import KernelPCA

    n, r = args.timing_samples, 20
    path = os.path.join(workdir, f"camera11-{n}.zarr")
    if not os.path.exists(path):
        ingest_array(patch_sample(n, 11, ("camera",)), path, chunk_rows=1024)
    X = open_store(path).read()
    out = {"l": n, "r": r}
    # the first line `dkha fit` prints (a fresh process, its own cluster; the MK row cached)
    run_dir = os.path.join(workdir, "first-output")
    cmd = [os.path.join(os.path.dirname(sys.executable), "dkha"), "fit", path, "-o", run_dir,
           "--components", str(r), "--overwrite", "--passes", "1", "-v"]   # -v: lines in a pipe
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE),
                                     PYTHONUNBUFFERED="1"))
    first = proc.stdout.readline()
    out["first_output_seconds"] = time.perf_counter() - t0 if first else None
    out["first_output"] = first.decode(errors="replace").strip()[:100]
    proc.kill()
    proc.wait()
    # the fit pays its own centering row, as scikit-learn pays its kernel (no cached MK row)
    with dask.config.set({"dkha.mk-cache": False}), \
            client_for(settings=config.settings()) as client:
        t0 = time.perf_counter()
        m = KernelHebbianPCA(r, tol=TARGET, client=client).fit(path)
        out["dkha_call_seconds"] = time.perf_counter() - t0
    hit = [h for h in m.history_ if h["excess"] <= TARGET]
    h = hit[0] if hit else m.history_[-1]
    out.update(dkha_seconds=m.timings_["centering"] + m.timings_["init"] + h["wall_time"],
               dkha_excess=h["excess"], dkha_pass=h["pass"], reached=bool(hit),
               sigma=m.kernel_["sigma"], init=m.attrs_["init"])
    t0 = time.perf_counter()
    KernelPCA(r, kernel="rbf", gamma=1 / (2 * m.kernel_["sigma"] ** 2),
              eigen_solver="arpack").fit(X)
    out["sklearn_seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="comma-separated data sets of the panel (default: all)")
    ap.add_argument("--small", action="store_true", help="a quarter of the patches")
    ap.add_argument("--passes", type=int, default=10, help="passes (default 10, dkha fit's)")
    ap.add_argument("--coarse", action="store_true", help="grid 10^b only (a third of it)")
    ap.add_argument("--defaults-only", action="store_true",
                    help="the default fits alone, no grid (issue 42's start → end check)")
    ap.add_argument("--timing", action="store_true", help="also the l = 20 000 timings")
    ap.add_argument("--timing-only", action="store_true", help="only the timings")
    ap.add_argument("--timing-samples", type=int, default=20000)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "dkha-defaults"))
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for name in ("distributed", "dkha"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.makedirs(args.workdir, exist_ok=True)
    names = [n for n in panel(args.small) if not n.startswith("_")]
    if args.data:
        unknown = set(args.data.split(",")) - set(names)
        if unknown:
            ap.error(f"unknown data sets {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(names)}")
        names = args.data.split(",")
    result = {"passes": args.passes, "coarse": args.coarse, "small": args.small}
    if not args.timing_only:
        print(f"excess E/E_min − 1 after {args.passes} passes, r = {R}: the default fit against "
              f"the best of the {'coarse ' if args.coarse else ''}{{1,2,5}}×10^b grid (same start)")
        print_header()
        with client_for(settings=config.settings()) as client:
            result["panel"] = run_panel(names, args, client, args.workdir)
        verdict(result["panel"])
    if args.timing or args.timing_only:
        t = timing(args, args.workdir)
        result["timing"] = t
        print(f"\nl = {t['l']} camera patches 11×11, r = {t['r']}, σ = {t['sigma']:.3g} (median):")
        print(f"  dkha default fit ({t['init']}) to excess {t['dkha_excess']:.2e} "
              f"(pass {t['dkha_pass']}): {t['dkha_seconds']:.1f} s fitting "
              f"({t['dkha_call_seconds']:.1f} s with its evaluations)")
        print(f"  scikit-learn KernelPCA (arpack, exact): {t['sklearn_seconds']:.1f} s  → ratio "
              f"dkha/sklearn {t['dkha_seconds'] / t['sklearn_seconds']:.2f} "
              f"({t['dkha_call_seconds'] / t['sklearn_seconds']:.2f} with evaluations)")
        fo = t["first_output_seconds"]
        print("  first output of `dkha fit`: " + (f"{fo:.2f} s ({t['first_output']!r})"
                                                  if fo is not None else "none"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=float)


if __name__ == "__main__":
    main()
