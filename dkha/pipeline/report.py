"""Reports of pipeline runs: a self-contained HTML page and the PNG files it shows.

* the convergence plot: excess error E/E_min − 1 per pass on a log scale, every batch fit on one
  plot (online fits: the AC index over steps);
* the leading components as images when the data are image patches (each component's input-space
  image ``Σ_j alpha[i, j] x_j``, the linear shadow of the feature-space component);
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


def _png(fig, path: str) -> str:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_report(runner) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    out_dir = os.path.join(runner.run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    title = runner.p.report.get("title", runner.p.name)
    images: list[tuple[str, str]] = []
    rows = []

    # convergence
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    have_batch = have_online = False
    datasets = {}
    for f in runner.p.fits:
        try:
            ds = result.load(runner.fit_dir(f["name"]))
        except Exception:
            continue
        datasets[f["name"]] = ds
        if ds.sizes.get("evaluation", 0) == 0:
            continue
        if Run(ds).is_dictionary:
            if "ac_index" in ds and np.isfinite(ds["ac_index"].values).any():
                ax2.plot(ds["step"].values, ds["ac_index"].values, marker=".", label=f["name"])
                have_online = True
        else:
            ex = ds["excess"].values
            ok = ex > 0
            ax.semilogy(ds["pass"].values[ok], ex[ok], marker=".", label=f["name"])
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
    images.append(("Convergence", _png(fig, os.path.join(out_dir, "convergence.png"))))

    # components as images (patch data)
    data = runner.state["stages"].get("data", {}).get("result", {}) or {}
    store_path = data.get("store")
    n_show = int(runner.p.report.get("components", 8))
    if store_path and datasets:
        st = open_store(store_path)
        side = int(np.sqrt(st.n_features))
        name, ds = next(iter(datasets.items()))
        if side * side == st.n_features and "mk" in ds:
            X = st.read()
            A = ds["alpha"].values[:n_show]
            comps = A @ X
            fig, axes = plt.subplots(1, len(comps), figsize=(1.6 * len(comps), 1.9))
            for i, (c, a) in enumerate(zip(comps, np.atleast_1d(axes))):
                a.imshow(c.reshape(side, side), cmap="gray")
                a.set_title(f"{i}", fontsize=8)
                a.axis("off")
            images.append((f"Leading components of {name} (input-space images)",
                           _png(fig, os.path.join(out_dir, "components.png"))))

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

    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>pipeline {html.escape(runner.p.path)} — run {html.escape(runner.run_dir)}</p>"]
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
    path = os.path.join(runner.run_dir, "report.html")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(page)
    os.replace(tmp, path)
    return path

