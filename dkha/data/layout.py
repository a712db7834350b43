"""Where a run's components live.

A run directory ``RUN_DIR`` holds its components as ``RUN_DIR/components.zarr`` (a zarr group:
the dataset). Models fitted together into directories of one parent (``dkha fit --algorithm
kha-et,kha-smd -o OUT``: ``OUT/kha-et``, ``OUT/kha-smd``; :func:`dkha.fit_together` with such
``run_dirs``) are saved as one zarr group tree, ``OUT/components.zarr``, a group per model named
as its directory, which ``xarray.open_datatree("OUT/components.zarr", engine="zarr")`` opens
whole (``xarray.open_zarr("OUT/components.zarr", group="kha-et")`` one model); each model's
directory keeps its ``timings.json`` and checkpoints. Runs saved before, with a
``components.zarr`` in each model's directory, are read where they are
(:func:`components_path`).
"""

from __future__ import annotations

import os
import shutil

import zarr

from dkha.data import cf
from dkha.data.atomic import consolidate, write_zarr_atomically

COMPONENTS = "components.zarr"


def _split(run_dir: str) -> tuple[str, str]:
    """``(parent, name)`` of a run directory."""
    head, name = os.path.split(os.path.normpath(os.path.abspath(os.fspath(run_dir))))
    return head, name


def member_path(run_dir: str) -> str:
    """The group of ``run_dir``'s model in its parent's tree: ``PARENT/components.zarr/NAME``."""
    head, name = _split(run_dir)
    return os.path.join(head, COMPONENTS, name)


def components_path(run_dir: str) -> str:
    """Where the components of the run in ``run_dir`` are: its own ``components.zarr`` where
    there is one (a run fitted alone; a model fitted together by an older dkha), else its group
    in the parent's tree where there is one, else (a run not yet written) its own."""
    own = os.path.join(os.fspath(run_dir), COMPONENTS)
    if os.path.isdir(own):
        return own
    member = member_path(run_dir)
    if os.path.isfile(os.path.join(member, "zarr.json")):
        return member
    return own


def shares_a_tree(run_dirs) -> bool:
    """Whether models saved in ``run_dirs`` form one tree: several, in directories of one
    parent."""
    run_dirs = list(run_dirs or ())
    return len(run_dirs) > 1 and len({_split(d)[0] for d in run_dirs}) == 1


def tree_members(path: str) -> list[str]:
    """The models (child groups holding ``alpha``) of the tree at ``path`` (empty: no tree)."""
    try:
        group = zarr.open_group(path, mode="r")
        return sorted(name for name, g in group.groups() if "alpha" in g)
    except Exception:  # noqa: BLE001 - not a zarr group: no members
        return []


def save_member(ds, run_dir: str) -> str:
    """Write ``ds`` (attrs encoded) as the group of ``run_dir``'s model in its parent's tree,
    atomically (aside, then renamed into place), the tree's root made where there is none
    (``Conventions``, ``title``) and its consolidated metadata brought up to date (a plain
    ``xarray.open_datatree`` opens it without warning); a ``components.zarr`` left in
    ``run_dir`` by an older dkha is removed, so that the run is read from the tree. Returns the
    group's path."""
    head, _ = _split(run_dir)
    root = os.path.join(head, COMPONENTS)
    os.makedirs(run_dir, exist_ok=True)
    if not os.path.isfile(os.path.join(root, "zarr.json")):
        zarr.open_group(root, mode="a", zarr_format=3).update_attributes(
            {"Conventions": cf.CONVENTIONS,
             "title": "dkha kernel principal components: models fitted together, a group each",
             "source": ds.attrs.get("source", "dkha")})
    out = write_zarr_atomically(ds, member_path(run_dir))
    consolidate(root)
    shutil.rmtree(os.path.join(run_dir, COMPONENTS), ignore_errors=True)
    return out


def after_change(path: str) -> None:
    """Consolidate the metadata of the components at ``path`` after a variable was added, and
    of the tree they are a member of, if any."""
    consolidate(path)
    head = os.path.dirname(os.path.normpath(path))
    if os.path.basename(head) == COMPONENTS and os.path.isfile(os.path.join(head, "zarr.json")):
        consolidate(head)
