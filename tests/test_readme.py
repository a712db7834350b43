"""Every Python block of README.md runs as written, in order, in one namespace, on a small data
store made here: the documentation cannot drift from the code."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.processes import REPO, subprocess_env

#: README blocks refer to a few names the reader has: defined here on small data (image patches,
#: so the response-map block has provenance). No cluster is started: as in a reader's fresh Python
#: session, fits of a store this small run their tasks in the calling thread (dkha.inline-samples;
#: with an in-process cluster of 2 threads the blocks took 75–120 s, a task round trip for each of
#: the memory budget's small row blocks, against 25–40 s)
PRELUDE = '''
import matplotlib
matplotlib.use("Agg")
import numpy as np
import skimage.data
import skimage.transform
import xarray as xr
import dkha as _dkha
import time
_t0 = time.perf_counter()

import dask
# the default fit's dense matrix (269 samples: 579 kB; more than the 200 a Krylov solve takes
# by a dense eigh) refused: the README's default fits run the blockwise Krylov solver, whose
# history (an entry per K'V product) the README plots; its Nyström start of 59 landmarks (the
# memory budget's), not 268 (which would leave the solve converged at its first product)
dask.config.set({"dkha.dense-bytes": 1e5, "dkha.memory-budget": "256kB"})
photos = [skimage.transform.resize(skimage.data.camera(), (30, 30), anti_aliasing=True),
          skimage.transform.resize(skimage.data.coins(), (24, 24), anti_aliasing=True)]
_dkha.ingest_images(photos, "data.zarr", patch=5, step=2)
X = _dkha.open_store("data.zarr").read()
new_samples, more_rows = X[:7], X[7:40]
_dkha.ingest_array(X, "big.zarr")
xr_array = xr.DataArray(X[:9], dims=("sample", "feature"),
                        coords={"sample": np.arange(100, 109)})
del _dkha
'''


#: after the block that plots the history of the default (Krylov) run: a line, an entry per
#: K'V product (before, one entry: a single dot, or xarray's "No numeric data to plot")
PLOTTED = '''
import matplotlib.pyplot as plt
assert ds.attrs["path"] == "krylov" and figure == "residual", (ds.attrs["path"], figure)
assert ds.sizes["evaluation"] > 1, ds.sizes
assert len(plt.gca().lines[-1].get_xdata()) == ds.sizes["evaluation"]
print("README plot: a line of", ds.sizes["evaluation"], "K'V products", flush=True)
plt.close("all")
'''


def python_blocks(text: str) -> list[str]:
    """The fenced ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def test_python_blocks_are_found():
    blocks = python_blocks("a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n")
    assert blocks == ["x = 1\n", "y = 2\n"]


def test_readme_plots_images_the_right_way_up():
    """xarray draws a 2-d array with its first coordinate value at the bottom: every README plot
    of a map over the patch grid (row, col: grid indices, 0 at the top) asks for row 0 at the
    top, as the image has it; the component pictures need not (their ``patch_row`` counts up
    from the bottom edge: tests/test_xarray_runs.py draws one)."""
    with open(f"{REPO}/README.md", encoding="utf-8") as f:
        code = "".join(python_blocks(f.read()))
    plots = re.findall(r"^(?:maps|ds\.projection)\b.*\.plot\((.*?)\)", code, flags=re.MULTILINE)
    assert len(plots) >= 2, plots
    assert all("yincrease=False" in args for args in plots), plots
    pictures = re.findall(r"^ds\.component_image\b.*\.plot\.imshow\((.*?)\)", code,
                          flags=re.MULTILINE)
    assert pictures and not any("yincrease" in args for args in pictures), pictures


@pytest.mark.slow
def test_every_readme_python_block_runs(tmp_path):
    with open(f"{REPO}/README.md", encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    assert len(blocks) >= 3, "README.md lost its Python examples"
    script = [PRELUDE]
    for i, block in enumerate(blocks, 1):
        script.append(f"print('README block {i} of {len(blocks)}', flush=True)\n{block}"
                      "print(f'  {time.perf_counter() - _t0:.1f} s', flush=True)\n")
        if "ds[figure]" in block:
            script.append(PLOTTED)
    script.append("print('README blocks done', flush=True)\n")
    (tmp_path / "readme.py").write_text("\n".join(script))
    p = subprocess.run([sys.executable, "readme.py"], cwd=tmp_path, env=subprocess_env(),
                       capture_output=True, text=True, timeout=900, check=False)
    print(p.stdout)     # each block's seconds (pytest -rP)
    ran = re.findall(r"README block (\d+) of", p.stdout)
    assert p.returncode == 0, (f"README block {ran[-1] if ran else '?'} failed:\n"
                               f"{p.stderr[-3000:]}")
    assert ran == [str(i) for i in range(1, len(blocks) + 1)]
    assert p.stdout.rstrip().endswith("README blocks done")
    assert "README plot: a line of" in p.stdout
    # what the blocks wrote is what they say: runs, a tune directory, an online run
    for path in ("run/components.zarr", "smd/components.zarr", "runs/components.zarr/et",
                 "runs/components.zarr/smd", "runs/et/timings.json", "run.nc",
                 "tune/tune.json", "tune/kha-smd/components.zarr", "online/components.zarr"):
        assert (tmp_path / path).exists(), path
