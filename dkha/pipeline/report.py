"""Reports of runs: a self-contained HTML page and the PNG files it shows.

* the run's settings and timings as a table (units in the headers, integers as integers);
* convergence against the axis of the algorithm that ran, in the figure it measured: the
  excess error E/E_min − 1 (tracked fits: the span's movement) per pass for the iterative batch
  algorithms, the largest residual per ``K'V`` product for the exact ones (the dense path,
  which makes none: its excess),
  the AC index per step for the online ones;
* every component as a picture: the run's ``component_image`` (pre-images, patch data), or for
  square samples such as digits the input-space image ``Σ_j alpha[i, j] x_j`` (the linear shadow
  of the feature-space component), with a colour bar;
* response maps, one panel per image and component with its colour bar: from a ``dkha maps``
  store (``--maps``), else computed for every patch position of the training images when they can
  be read (:func:`dkha.runs.maps.response_maps`), else the training projections at the positions
  the store holds;
* for pipelines, the denoised image between the noisy one and the clean reference, and a table
  of figures.

At most ``components`` components are shown (every one by default up to
:data:`DEFAULT_COMPONENTS`); the page says "first N of M" and how to see the rest.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import os

import numpy as np

from dkha import algorithms as registry
from dkha.data import result
from dkha.data.atomic import write_file_atomically
from dkha.data.store import open_store
from dkha.runs.maps import display_name, response_maps
from dkha.runs.run import Run

log = logging.getLogger(__name__)

#: components shown unless asked for more (``dkha report --components``)
DEFAULT_COMPONENTS = 16

#: the run's settings shown in the table, in this order, with their labels
SETTINGS = (("algorithm", "algorithm"), ("kernel", "kernel"), ("sigma", "σ (kernel width)"),
            ("degree", "degree"), ("offset", "offset"), ("n_components", "components"),
            ("n_samples", "training samples"), ("n_features", "features"), ("init", "start"),
            ("eta0", "η0 (dimensionless gain)"), ("eta0_applied", "η0 applied"),
            ("mu", "μ (meta-gain)"), ("passes", "passes asked"), ("n_steps", "steps"),
            ("seed", "seed"), ("centering", "centering"), ("store", "data store"),
            ("dkha_version", "dkha version"))
#: the settings of the iterative algorithms' gains and length, not shown for an exact run
GAIN_SETTINGS = {"eta0", "eta0_applied", "mu", "passes", "n_steps"}


def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig, path: str | None = None) -> str:
    """The figure as base64 PNG text (also written to ``path`` when given)."""
    plt = _matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    if path is not None:
        write_file_atomically(data, path)
    return base64.b64encode(data).decode()


def _img(b64: str, alt: str, kind: str) -> str:
    a = html.escape(alt)
    return f'<img class="{kind}" alt="{a}" title="{a}" src="data:image/png;base64,{b64}">'


def _number(v) -> str:
    """A value as a person reads it: integers without exponent, floats to 4 digits."""
    if isinstance(v, (bool, np.bool_)) or v is None:
        return str(v)
    if isinstance(v, (int, np.integer)) or (isinstance(v, float) and v.is_integer()
                                            and abs(v) < 1e15):
        return f"{int(v):,}".replace(",", " ")
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4g}"
    return str(v)


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    return "".join(out) + "</table>"


# --- convergence ---------------------------------------------------------------------------

#: what a convergence panel can show, the first a run measured: (variable, axis label)
FIGURES = {"online": (("ac_index", "AC index"),),
           # the residual after every K'V product (a Krylov run's line), else the excess of
           # its one evaluation (the dense path)
           "exact": (("residual", "largest relative residual ‖K'v − θv‖/θ"),
                     ("excess", "excess error E/E_min − 1")),
           "pass": (("excess", "excess error E/E_min − 1"),
                    ("change", "sine of the largest angle the span moved"))}
#: each panel's x axis and title
AXES = {"pass": ("pass", "pass over the training samples", "iterative batch algorithms"),
        "exact": ("pass", "K'V products (block Krylov)", "exact (krylov, dense)"),
        "online": ("step", "step (samples presented)", "online algorithms")}


def ran(ds) -> str:
    """The algorithm a run ran: the default's path (dense, krylov), else its algorithm."""
    return str(ds.attrs.get("path") or ds.attrs.get("algorithm"))


def is_exact_run(ds) -> bool:
    """Whether the run ran an exact solver (dense, krylov): no gains, no passes of updates."""
    return ran(ds) == "dense" or registry.is_exact(ran(ds))


def _measured(ds, name: str) -> bool:
    return name in ds and bool(np.isfinite(ds[name].values).any())


def convergence_figure(datasets: dict, paper: dict | None = None):
    """Convergence of each run against the axis of the algorithm that ran, in the figure it
    measured: excess error (or, tracked, the span's movement) per pass for the iterative batch
    algorithms; the largest residual per ``K'V`` product for the exact ones (the dense path's
    excess); AC index per step for the online ones. A panel per kind and figure. ``paper``:
    ``{run name: {x: value}}``, a paper's figures for the runs, drawn as crosses beside them."""
    paper = paper or {}
    plt = _matplotlib()
    panels: dict = {}
    for name, ds in datasets.items():
        if ds.sizes.get("evaluation", 0) == 0:
            continue
        kind = "online" if Run(ds).is_dictionary else "exact" if is_exact_run(ds) else "pass"
        figure = next((f for f in FIGURES[kind] if _measured(ds, f[0])), None)
        if figure is not None:
            panels.setdefault((kind, figure), []).append((name, ds))
    panels = dict(sorted(panels.items(), key=lambda item: list(AXES).index(item[0][0])))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 3.8),
                             squeeze=False)
    if not panels:
        axes[0][0].text(0.5, 0.5, "no evaluations recorded", ha="center", va="center",
                        transform=axes[0][0].transAxes)
    for ax, ((kind, (var, label)), runs) in zip(axes[0], panels.items()):
        x, xlabel, title = AXES[kind]
        marker = "o" if kind == "exact" else "."
        for name, ds in runs:
            y = ds[var].values
            ok = np.isfinite(y) & (y > 0 if var != "ac_index" else True)
            line, = (ax.plot if var == "ac_index" else ax.semilogy)(
                ds[x].values[ok], y[ok], marker=marker, label=name)
            if paper.get(name):
                px = np.array([float(k) for k in paper[name]])
                ax.plot(px, list(paper[name].values()), "x", markersize=10, mew=2,
                        color=line.get_color(), label=f"{name} (paper)")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.set_title(title)
        if var == "excess" and not any((ds[var].values > 0).any() for _, ds in runs):
            ax.text(0.5, 0.5, "excess error at round-off (≤ 0) at every evaluation",
                    ha="center", va="center", transform=ax.transAxes)
        else:
            ax.legend()
            ax.grid(True, which="both", alpha=0.3)
    return fig


# --- components and maps -------------------------------------------------------------------

def _picture_grid(pictures: np.ndarray, titles: list[str], label: str, cmap: str = "gray"):
    """Pictures in rows of at most 8, one shared colour scale and colour bar."""
    plt = _matplotlib()
    n = len(pictures)
    cols = min(n, 8)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.5 * cols + 0.8, 1.7 * rows), squeeze=False)
    lo, hi = float(np.nanmin(pictures)), float(np.nanmax(pictures))
    im = None
    for k, a in enumerate(axes.ravel()):
        a.axis("off")
        if k < n:
            im = a.imshow(pictures[k], cmap=cmap, vmin=lo, vmax=hi)
            a.set_title(titles[k], fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=label)
    return fig


def component_section(ds, out_dir: str, n_show: int, store_path: str | None = None) -> str:
    """HTML of the component pictures (empty when the run has none to show)."""
    r = ds.sizes["component"]
    n = min(n_show, r)
    titles = [f"component {int(c)}" for c in ds["component"].values[:n]]
    if "component_image" in ds:
        pics = ds["component_image"].values[:n]
        caption = ("Components as pictures: the pre-image of the mean plus two standard "
                   "deviations along each component")
        label = "grey value"
    else:
        path = store_path or ds.attrs.get("store")
        try:
            st = open_store(path)
        except Exception:  # noqa: BLE001 - no store to show: the report shows what it can
            return ""
        side = int(np.sqrt(st.n_features))
        if side * side != st.n_features or "mk" not in ds or st.n_samples != ds.sizes["sample"]:
            return ""
        pics = (ds["alpha"].values[:n] @ st.read()).reshape(-1, side, side)
        caption = "Components as input-space images Σ_j alpha[i, j] x_j"
        label = "weight"
    b64 = _png(_picture_grid(pics, titles, label), os.path.join(out_dir, "components.png"))
    return (f"<h2>{html.escape(caption)}</h2>" + _shown_note(n, r)
            + _img(b64, f"components {int(ds['component'][0])} to "
                        f"{int(ds['component'][n - 1])}", "components"))


def _shown_note(n: int, r: int) -> str:
    numbered = (" Components are numbered as the run's <code>component</code> coordinate, "
                "from 0, like the images and samples.")
    if n >= r:
        return f"<p>All {r} components.{numbered}</p>"
    return (f"<p>First {n} of {r} components; <code>dkha report RUN --components {r}</code> "
            f"shows them all.{numbered}</p>")


def training_maps(ds):
    """The training projections as maps ``(component, image, row, col)`` over each image's
    patch grid (NaN at positions the store does not hold); None without patch provenance."""
    if "projection" not in ds or not {"image", "row", "col"} <= set(ds["projection"].coords):
        return None
    proj = ds["projection"]
    names = {}
    if "image_name" in proj.coords:
        for i, nm in zip(proj["image"].values, proj["image_name"].values):
            names.setdefault(int(i), display_name(str(nm)))
    proj = proj.reset_coords([c for c in proj.coords
                              if c not in ("image", "row", "col", "component")], drop=True)
    maps = proj.set_index(sample=["image", "row", "col"]).unstack("sample").transpose(
        "component", "image", "row", "col")
    return maps.assign_coords(image=[names.get(int(i), f"image {int(i)}")
                                     for i in maps["image"].values])


def maps_for_report(ds, maps_path: str | None = None, client=None):
    """``(maps, note)``: a ``dkha maps`` store, else every patch position of the training
    images: the training projections where the store holds every position of every image
    (nothing to compute: 63 001 camera patches took a minute of projections on 2 cores), else
    projected when their files can be read, else the training projections where they are."""
    import xarray as xr

    if maps_path:
        return (result.objects_for_strings(xr.open_zarr(maps_path)).load()["response"],
                f"every patch position, from {os.path.basename(os.path.normpath(maps_path))}")
    try:
        images = open_store(ds.attrs["store"]).attrs.get("source", {}).get("images", [])
    except Exception:  # noqa: BLE001 - no store: maps from the training projections
        images = []
    if images and all(int(im.get("n_samples", -1)) == int(np.prod(im.get("grid", [0])))
                      for im in images):
        maps = training_maps(ds)
        if maps is not None:
            return maps, ("every patch position of the training images (the run's training "
                          "projections: the store holds every position)")
    paths = [im["path"] for im in images]
    if paths and all(p.startswith("skimage:") or os.path.exists(p) for p in paths):
        try:
            return (response_maps(ds, paths, client=client),
                    "every patch position of the training images")
        except Exception as exc:  # noqa: BLE001 - a report still shows what it can
            log.warning("response maps of the training images failed: %s", exc)
    maps = training_maps(ds)
    if maps is None:
        return None, ""
    return maps, ("the training projections, at the patch positions the store holds (blank "
                  "elsewhere; `dkha maps RUN IMAGE... -o maps.zarr` and `dkha report RUN --maps "
                  "maps.zarr` show every position)")


def map_section(maps, note: str, out_dir: str, n_show: int) -> str:
    """HTML table of response maps: a row per image, a panel per component with its colour bar."""
    plt = _matplotlib()
    r = maps.sizes["component"]
    n = min(n_show, r)
    rows = []
    for im in maps["image"].values:
        name = str(im)
        cells = [f"<th>{html.escape(name)}</th>"]
        one = maps.sel(image=im)
        for c in range(n):
            m = one.isel(component=c).dropna("row", how="all").dropna("col", how="all").values
            fig, ax = plt.subplots(figsize=(2.4, 2.0))
            shown = ax.imshow(m, cmap="viridis")
            number = int(maps["component"].values[c])
            ax.set_title(f"component {number}", fontsize=8)
            ax.axis("off")
            fig.colorbar(shown, ax=ax, shrink=0.85)
            alt = f"{name}, component {number}"
            cells.append("<td>" + _img(_png(fig), alt, "map") + "</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = ("<h2>Response maps: each component's projection over each image's patch grid</h2>"
              f"<p>{html.escape(note)}. Colour: the projection (dimensionless). "
              f"{maps.sizes['image']} image{'s' if maps.sizes['image'] != 1 else ''}.</p>"
              + _shown_note(n, r))
    return header + '<table class="maps">' + "".join(rows) + "</table>"


# --- settings ------------------------------------------------------------------------------

def settings_rows(ds, timings: dict | None) -> list[tuple[str, str]]:
    """(label, value) rows: the run's settings, its last evaluation and its timings, with units."""
    a = {**ds.attrs, **ds.attrs.get("kernel_parameters", {})}     # sigma, degree, offset
    path, exact = ran(ds), is_exact_run(ds)
    if path != a.get("algorithm"):
        a["algorithm"] = f"{a.get('algorithm')} → {path}"
    rows = [(label, _number(a[k])) for k, label in SETTINGS
            if a.get(k) is not None and not (exact and k in GAIN_SETTINGS)
            and not (path == "dense" and k == "init")]
    if "path_reason" in a:
        rows.append(("why this path", str(a["path_reason"])))
    if ds.sizes.get("evaluation", 0):
        last = ds.isel(evaluation=-1)
        done = (("pass", "K'V products"),) if registry.is_exact(path) else () if exact else (
            ("pass", "passes done"), ("step", "steps done"))
        for k, label in (*done, ("excess", "excess error E/E_min − 1"),
                         ("error", "reconstruction error E(A)"),
                         ("residual", "largest relative residual ‖K'v − θv‖/θ"),
                         ("ac_index", "AC index"), ("wall_time", "wall time of the passes (s)")):
            if k in last.variables and np.isfinite(float(last[k])):
                v = last[k].item()
                rows.append((label, _number(int(v) if k in ("pass", "step") else float(v))))
    if "total" in (timings or {}):   # the phases, passes and the rest (they add up to it)
        rows.append(("wall time of fitting (s)", _number(float(timings["total"]))))
    for k, v in (timings or {}).items():     # timings.json: seconds per phase of the fit
        if k in ("total", "attempts"):
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            name = k.replace("_", " ").removesuffix(" seconds")
            rows.append((f"time: {name} (s)", _number(float(v))))
    kept = ds.attrs.get("kept_state")
    if kept:     # the result is an earlier state than the last: which, and why
        rows.append(("state kept (not the last)", f"pass {kept['pass']}: "
                     + str(ds.attrs.get("kept_reason", "an earlier pass was better"))))
    backoffs = ds.sizes.get("backoff", 0)
    if backoffs:
        rows.append(("backoffs (step guard)", str(backoffs)))
    return rows


# --- pages ---------------------------------------------------------------------------------

def write_page(path: str, title: str, subtitle: str, sections: list[str]) -> str:
    """A self-contained HTML page: the sections' HTML, images inline (data: URLs)."""
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(subtitle)}</p>", *sections]
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "img{max-width:100%}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:3px 8px;text-align:left}table.maps td{padding:0}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    return write_file_atomically(page, path)


def _convergence_section(datasets: dict, out_dir: str, paper: dict | None = None) -> str:
    b64 = _png(convergence_figure(datasets, paper), os.path.join(out_dir, "convergence.png"))
    return "<h2>Convergence</h2>" + _img(b64, "convergence", "convergence")


#: the figures along a fit that a pipeline's summary holds (:func:`dkha.pipeline.runner.along`)
ALONG = (("excess_per_pass", "pass", "excess error E/E_min − 1"),
         ("ac_index_per_step", "step", "AC index"))


def along_section(figures: dict) -> str:
    """HTML tables of each fit's figure along the fit (excess per pass, AC per step), at a few
    points (1, 5, 10, 20, 50… passes; every evaluation of an online fit up to 12), with the
    paper's figures beside them where the pipeline gives them, and the state a fit kept."""
    out = []
    for key, axis, label in ALONG:
        fits = {name: f for name, f in figures.items() if isinstance(f.get(key), dict)}
        if not fits:
            continue
        xs = sorted({int(x) for f in fits.values() for x in f[key]}
                    | {int(x) for f in fits.values() for x in f.get("paper", {})})
        if axis == "pass":
            xs = [x for x in xs if x in (1, 2, 5, 10, 20, 50, 100) or x == xs[-1]]
        elif len(xs) > 12:
            xs = sorted(set(xs[::-(-len(xs) // 12)]) | {xs[-1]})
        rows = []
        for name, f in fits.items():
            rows.append((name, *(_number(f[key].get(str(x))) if str(x) in f[key] else ""
                                 for x in xs)))
            if "paper" in f:
                rows.append((f"{name} (paper)", *(_number(f["paper"].get(str(x)))
                                                  if str(x) in f["paper"] else "" for x in xs)))
        sources = {f["paper_source"] for f in fits.values() if "paper_source" in f}
        out.append(f"<h2>{html.escape(label)} by {axis}</h2>"
                   + _table(("fit", *(f"{axis} {x}" for x in xs)), rows)
                   + "".join(f"<p>paper: {html.escape(s)}</p>" for s in sorted(sources)))
    kept = [(name, f"pass {f['kept_pass']}"
             + (f" (excess {_number(f['kept_excess'])})" if "kept_excess" in f else ""),
             f["kept_reason"]) for name, f in figures.items() if "kept_pass" in f]
    if kept:
        out.append("<h2>Fits that kept an earlier state than their last</h2>"
                   + _table(("fit", "state kept", "why, and what to try"), kept))
    return "".join(out)


def report_run(run_dir: str, *, components: int = DEFAULT_COMPONENTS, maps: str | None = None,
               client=None) -> str:
    """``dkha report RUN``: ``RUN/report.html`` with the settings and timings, the convergence,
    every component's picture and the response maps of one run directory (PNG files in
    ``RUN/report/``). ``maps``: a ``dkha maps`` store to show instead of computing them."""
    ds = result.load(run_dir)
    out_dir = os.path.join(run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.basename(os.path.normpath(run_dir))
    r = ds.sizes["component"]
    sections = ["<h2>Settings and timings</h2>"
                + _table(("", "value"), settings_rows(ds, result.load_timings(run_dir))),
                _convergence_section({name: ds}, out_dir),
                component_section(ds, out_dir, components)]
    m, note = maps_for_report(ds, maps, client)
    if m is not None:
        sections.append(map_section(m, note, out_dir, components))
    title = (f"dkha run {name}: {ds.attrs.get('algorithm')}, {r} components of "
             f"{_number(ds.attrs.get('n_samples'))} samples")
    return write_page(os.path.join(run_dir, "report.html"), title, os.path.abspath(run_dir),
                      sections)


def write_report(runner) -> str:
    """The pipeline's report: ``RUN/report.html`` and ``RUN/report/*.png``."""
    plt = _matplotlib()
    out_dir = os.path.join(runner.run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    title = runner.p.report.get("title", runner.p.name)
    datasets = {}
    for f in runner.p.fits:
        try:
            datasets[f["name"]] = result.load(runner.fit_dir(f["name"]))
        except Exception:  # noqa: BLE001, S112 - a fit not run (or unreadable) is left out
            continue
    paper = {name: f["paper"] for name, f in runner.figures.items()
             if isinstance(f, dict) and isinstance(f.get("paper"), dict)}
    sections = [_convergence_section(datasets, out_dir, paper), along_section(runner.figures)]
    data = runner.state["stages"].get("data", {}).get("result", {}) or {}
    n_show = int(runner.p.report.get("components", DEFAULT_COMPONENTS))
    if datasets:
        name, ds = next(iter(datasets.items()))
        sections.append(f"<h2>Fit {html.escape(name)}</h2>"
                        + _table(("", "value"), settings_rows(ds, result.load_timings(
                            runner.fit_dir(name)))))
        sections.append(component_section(ds, out_dir, n_show, data.get("store")))
        m = training_maps(ds)
        if m is not None:
            sections.append(map_section(m, "the training projections", out_dir, n_show))

    for key, fig_data in runner.figures.items():
        if key.endswith("-denoise") and data.get("noisy"):
            noisy = np.clip(np.load(data["noisy"][0]), 0, 1)
            clean = np.load(data["clean"][0])
            import skimage.io

            den = skimage.io.imread(fig_data["image"]).astype(float)
            den = den / 255.0 if den.max() > 1 else den
            fig, axes = plt.subplots(1, 3, figsize=(12, 4.3))
            for a, img, t in zip(axes, (noisy, den, clean), (
                    f"noisy ({fig_data.get('snr_noisy', float('nan')):.2f} dB SNR)",
                    f"denoised by dkha ({fig_data.get('snr_denoised', float('nan')):.2f} dB SNR)",
                    "clean reference")):
                shown = a.imshow(img, cmap="gray", vmin=0, vmax=1)
                a.set_title(t)
                a.axis("off")
            fig.colorbar(shown, ax=list(axes), shrink=0.8, label="grey value")
            sections.append("<h2>Denoising: noisy, denoised, clean</h2>"
                            + _img(_png(fig, os.path.join(out_dir, f"{key}.png")),
                                   "denoising", "denoise"))

    rows = []
    for stage, figs in runner.figures.items():
        for k, v in figs.items():
            if not isinstance(v, dict):     # figures along a fit: the tables above
                rows.append((stage, k.replace("_", " "), _number(v)))
    sections.append("<h2>Figures</h2>" + _table(("stage", "figure", "value"), rows))
    path = os.path.join(runner.run_dir, "report.html")
    write_page(path, title, f"pipeline {runner.p.path} — run {runner.run_dir}", sections)
    return path
