"""
=================================================
Image patches: component pictures and response maps
=================================================

Two photographs are cut into patches (``dkha.ingest_images``); each patch keeps where it came
from as coordinates along ``sample`` (image, image_name, row, col). After a fit, the run's
training projections unstack with xarray into one response map per image and component, and
``component_image`` shows each component's pre-image.
"""

# %%
import atexit
import os
import shutil
import tempfile

import skimage.data
import skimage.transform

import dkha
from dkha.data import result

small = os.environ.get("DKHA_EXAMPLE_SMALL") == "1"
side = 40 if small else 128
work = tempfile.mkdtemp(prefix="dkha-example-")
atexit.register(shutil.rmtree, work, True)      # the store and run go when the script ends
images = [skimage.transform.resize(skimage.data.camera(), (side, side)),
          skimage.transform.resize(skimage.color.rgb2gray(skimage.data.astronaut()),
                                   (side, side + side // 4))]
store = dkha.ingest_images(images, os.path.join(work, "patches.zarr"), patch=7,
                           step=2 if small else 3)
print(f"{store.n_samples} patches of {store.n_features} pixels")

# %%
# Fit and save a run: the run keeps the training projections with the patch coordinates.
run = os.path.join(work, "run")
model = dkha.KernelHebbianPCA(6, algorithm="kha-et", passes=2 if small else 5).fit(
    store.path, run_dir=run)
ds = result.load(run)
maps = ds.projection.set_index(sample=["image", "row", "col"]).unstack()
print(maps.dims, dict(maps.sizes))

# %%
# The response map of component 1 over each image, and each component's picture.
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2 + ds.sizes["component"], figsize=(12, 2.6))
for i, ax in enumerate(axes[:2]):
    m = maps.sel(image=i, component=1).dropna("row", how="all").dropna("col", how="all")
    ax.imshow(m, cmap="RdBu_r")
    ax.set_title(f"image {i}, component 1", fontsize=8)
for c, ax in enumerate(axes[2:]):
    ax.imshow(ds.component_image.sel(component=c), cmap="gray")
    ax.set_title(f"component {c}", fontsize=8)
for ax in axes:
    ax.axis("off")
fig.savefig("patch_maps.png", dpi=80)

# %%
# The same as an HTML page (what ``dkha report RUN`` writes).
from dkha.pipeline.report import report_run

print(report_run(run))
