"""Reports of pipeline runs: a self-contained HTML page and the PNG files it shows.

* the convergence plot: excess error E/E_min − 1 per pass on a log scale, every batch fit on one
  plot (online fits: the AC index over steps);
* the leading components as pictures: the run's ``component_image`` (pre-images, patch data), or
  else, for square samples such as digits, the input-space image ``Σ_j alpha[i, j] x_j`` (the
  linear shadow of the feature-space component);
* response maps: the training projections over each image's patch grid (patch data);
* the denoised image beside the noisy one and the clean reference;
* a table of figures (final excess, time, AC index, SNR, VI).
"""

from __future__ import annotations

import base64
import html
import os

import numpy as np

from dkha.data import result
from dkha.data.store import open_store
from dkha.runs.run import Run

#: at most this many images and components in the response maps
MAP_IMAGES = 4
MAP_COMPONENTS = 6


def _png(fig, path: str) -> str:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_report(runner) -> str:
    """The pipeline's report: ``RUN/report.html`` and ``RUN/report/*.png``."""
    plt = _matplotlib()
    out_dir = os.path.join(runner.run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    title = runner.p.report.get("title", runner.p.name)
    rows = []
    datasets = {}
    for f in runner.p.fits:
        try:
            datasets[f["name"]] = result.load(runner.fit_dir(f["name"]))
        except Exception:
            continue
    images = [("Convergence", _png(convergence_figure(datasets),
                                   os.path.join(out_dir, "convergence.png")))]

    # components as pictures
    data = runner.state["stages"].get("data", {}).get("result", {}) or {}
    store_path = data.get("store")
    n_show = int(runner.p.report.get("components", 8))
    if datasets:
        name, ds = next(iter(datasets.items()))
        if "component_image" in ds:
            images.extend(run_pictures(ds, out_dir, name, n_show))
        elif store_path and "mk" in ds:
            st = open_store(store_path)
            side = int(np.sqrt(st.n_features))
            if side * side == st.n_features:
                comps = ds["alpha"].values[:n_show] @ st.read()
                images.append((f"Leading components of {name} (input-space images)",
                               _png(_picture_row(comps.reshape(-1, side, side)),
                                    os.path.join(out_dir, "components.png"))))

    # denoising
    for key, fig_data in runner.figures.items():
        if key.endswith("-denoise") and data.get("noisy"):
            noisy = np.clip(np.load(data["noisy"][0]), 0, 1)
            clean = np.load(data["clean"][0])
            import skimage.io

            den = skimage.io.imread(fig_data["image"]).astype(float)
            den = den / 255.0 if den.max() > 1 else den
            fig, axes = plt.subplots(1, 3, figsize=(12, 4.3))
            for a, img, t in zip(axes, (noisy, den, clean), (
                    f"noisy ({fig_data.get('snr_noisy', float('nan')):.2f} dB)",
                    f"dkha ({fig_data.get('snr_denoised', float('nan')):.2f} dB)", "clean")):
                a.imshow(img, cmap="gray", vmin=0, vmax=1)
                a.set_title(t)
                a.axis("off")
            images.append(("Denoising", _png(fig, os.path.join(out_dir, f"{key}.png"))))

    for name, figs in runner.figures.items():
        for k, v in figs.items():
            if isinstance(v, float):
                v = f"{v:.4g}"
            rows.append((name, k, v))

    path = os.path.join(runner.run_dir, "report.html")
    write_page(path, title, f"pipeline {runner.p.path} — run {runner.run_dir}", images, rows)
    return path



def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _picture_row(pictures: np.ndarray, titles=None):
    """One figure of grey pictures side by side."""
    plt = _matplotlib()
    n = len(pictures)
    fig, axes = plt.subplots(1, n, figsize=(1.6 * n, 1.9), squeeze=False)
    for i, (c, a) in enumerate(zip(pictures, axes[0])):
        a.imshow(c, cmap="gray")
        a.set_title(str(i) if titles is None else titles[i], fontsize=8)
        a.axis("off")
    return fig


def response_maps(ds) -> "xarray.DataArray | None":  # noqa: F821
    """The training projections as maps ``(component, image, row, col)`` over each image's
    patch grid (NaN outside a smaller image's grid); None without patch provenance."""
    if "projection" not in ds or not {"image", "row", "col"} <= set(ds["projection"].coords):
        return None
    proj = ds["projection"].reset_coords([c for c in ds["projection"].coords
                                          if c not in ("image", "row", "col", "component")],
                                         drop=True)
    return proj.set_index(sample=["image", "row", "col"]).unstack("sample").transpose(
        "component", "image", "row", "col")


def run_pictures(ds, out_dir: str, name: str, n_show: int = 8) -> list[tuple[str, str]]:
    """The component pictures and response maps of one run, as (caption, base64 PNG)."""
    plt = _matplotlib()
    images = []
    if "component_image" in ds:
        pics = ds["component_image"].values[:n_show]
        images.append((f"Components of {name}: pre-images (mean + 2 standard deviations along "
                       "each component)",
                       _png(_picture_row(pics), os.path.join(out_dir, "components.png"))))
    maps = response_maps(ds)
    if maps is not None:
        names = {}
        if "image_name" in ds.coords:
            for i, n in zip(ds["image"].values, ds["image_name"].values):
                names.setdefault(int(i), str(n))
        comps = maps["component"].values[:MAP_COMPONENTS]
        imgs = maps["image"].values[:MAP_IMAGES]
        fig, axes = plt.subplots(len(imgs), len(comps), squeeze=False,
                                 figsize=(2.0 * len(comps), 2.0 * len(imgs)))
        for a_row, im in zip(axes, imgs):
            for a, c in zip(a_row, comps):
                m = maps.sel(image=im, component=c)
                m = m.dropna("row", how="all").dropna("col", how="all")
                a.imshow(m.values, cmap="RdBu_r")
                a.set_title(f"{os.path.basename(names.get(int(im), str(im)))[:18]} · c{c}",
                            fontsize=7)
                a.axis("off")
        images.append((f"Response maps of {name}: each component's projection over each "
                       "image's patch grid", _png(fig, os.path.join(out_dir, "response_maps.png"))))
    return images


def convergence_figure(datasets: dict):
    """Excess error per pass (batch runs) and AC index per step (online runs)."""
    plt = _matplotlib()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    have_batch = have_online = False
    for name, ds in datasets.items():
        if ds.sizes.get("evaluation", 0) == 0:
            continue
        if Run(ds).is_dictionary:
            if "ac_index" in ds and np.isfinite(ds["ac_index"].values).any():
                ax2.plot(ds["step"].values, ds["ac_index"].values, marker=".", label=name)
                have_online = True
        else:
            ex = ds["excess"].values
            ok = ex > 0
            ax.semilogy(ds["pass"].values[ok], ex[ok], marker=".", label=name)
            have_batch = True
    ax.set_xlabel("pass")
    ax.set_ylabel("excess error E/E_min − 1")
    ax.set_title("batch algorithms")
    ax2.set_xlabel("step")
    ax2.set_ylabel("AC index")
    ax2.set_title("online algorithms")
    for a, has in ((ax, have_batch), (ax2, have_online)):
        if has:
            a.legend()
            a.grid(True, which="both", alpha=0.3)
        else:
            a.set_visible(False)
    return fig


def write_page(path: str, title: str, subtitle: str, images: list[tuple[str, str]],
               rows: list[tuple]) -> str:
    """A self-contained HTML page: the images inline (data: URLs) and a table of figures."""
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(subtitle)}</p>"]
    for caption, b64 in images:
        body.append(f"<h2>{html.escape(caption)}</h2><img alt=\"{html.escape(caption)}\" "
                    f"src=\"data:image/png;base64,{b64}\">")
    body.append("<h2>Figures</h2><table><tr><th>stage</th><th>figure</th><th>value</th></tr>")
    for name, k, v in rows:
        body.append(f"<tr><td>{html.escape(str(name))}</td><td>{html.escape(str(k))}</td>"
                    f"<td>{html.escape(str(v))}</td></tr>")
    body.append("</table>")
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "img{max-width:100%}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:3px 8px}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(page)
    os.replace(tmp, path)
    return path


def report_run(run_dir: str, *, components: int = 8) -> str:
    """``dkha report RUN``: ``RUN/report.html`` with the convergence curve, the component
    pictures and the response maps of one run directory (PNG files in ``RUN/report/``)."""
    ds = result.load(run_dir)
    out_dir = os.path.join(run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.basename(os.path.normpath(run_dir))
    images = [("Convergence", _png(convergence_figure({name: ds}),
                                   os.path.join(out_dir, "convergence.png")))]
    images.extend(run_pictures(ds, out_dir, name, components))
    rows = []
    if ds.sizes.get("evaluation", 0):
        last = ds.isel(evaluation=-1)
        for k in ("pass", "step", "excess", "wall_time", "ac_index"):
            if k in last and np.isfinite(float(last[k])):
                rows.append((name, k, f"{float(last[k]):.4g}"))
    title = f"dkha run {name}: {ds.attrs.get('algorithm')}, {ds.sizes['component']} components"
    return write_page(os.path.join(run_dir, "report.html"), title, os.path.abspath(run_dir),
                      images, rows)
