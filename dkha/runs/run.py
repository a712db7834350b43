"""A saved run, opened once: it decides whether it is a batch run (coefficients over the centered
training samples, read back through the row engine) or a dictionary run (the online algorithms:
coefficients over a dictionary held in the run), and everything else asks it.

Its kernel is rebuilt from the attrs here and only here (:func:`kernel_of`).
"""

from __future__ import annotations

import os

import numpy as np
import xarray as xr

from dkha import config
from dkha.data import result
from dkha.data.store import DataStore, open_store
from dkha.engine.mkrow import describe_centering
from dkha.engine.rows import RowEngine
from dkha.errors import InputError
from dkha.kernels import Kernel, make_kernel

#: the variables of a dictionary run that its projections need (small: the dictionary's size)
DICTIONARY_VARIABLES = ("alpha", "dictionary", "mean_coefficient")


def kernel_of(ds: xr.Dataset) -> Kernel:
    """The kernel a run was fitted with, from its attrs."""
    return make_kernel(ds.attrs["kernel"], **ds.attrs.get("kernel_parameters", {}))


class Run:
    """The components of one fit (``components.zarr``) and what they were fitted on.

    Parameters
    ----------
    ds : xarray.Dataset
        The components (:func:`dkha.data.result.load`).
    run_dir : str, optional
        The run directory it was read from.

    Attributes
    ----------
    ds : xarray.Dataset
    is_dictionary : bool
        An online run (ON-KHA, OO-KHA, okpca): components over ``dictionary (member, feature)``;
        otherwise a batch run over the training store's samples with its centering ``mk``.
    """

    def __init__(self, ds: xr.Dataset, run_dir: str | None = None):
        self.ds = ds
        self.run_dir = run_dir
        self.is_dictionary = "dictionary" in ds
        self._kernel: Kernel | None = None

    @classmethod
    def open(cls, run_dir: str) -> Run:
        return cls(result.load(run_dir), os.path.abspath(run_dir))

    def describe(self) -> dict:
        """What a product of this run (projections, maps) names it by: the run directory where
        known, its training store, algorithm, kernel and the kernel's parameters (e.g. σ)."""
        out = {} if self.run_dir is None else {"run": self.run_dir}
        return {**out, "run_store": self.store_path, "algorithm": self.attrs.get("algorithm"),
                "kernel": self.kernel.name, "kernel_parameters": dict(self.kernel.param_dict),
                "n_components": self.n_components}

    @property
    def attrs(self) -> dict:
        return self.ds.attrs

    @property
    def kernel(self) -> Kernel:
        if self._kernel is None:
            self._kernel = kernel_of(self.ds)
        return self._kernel

    @property
    def n_features(self) -> int:
        return int(self.ds.attrs["n_features"])

    @property
    def n_components(self) -> int:
        return int(self.ds.sizes["component"])

    @property
    def alpha(self) -> np.ndarray:
        return np.ascontiguousarray(self.ds["alpha"].values, dtype=np.float64)

    @property
    def store_path(self) -> str:
        return self.ds.attrs["store"]

    def training_store(self) -> DataStore:
        return open_store(self.store_path)

    def patch_geometry(self, needs: str) -> tuple[int, int]:
        """``(patch, step)`` of the training store of a run fitted on image patches; other runs
        are refused in one line (``needs``: what needs patches, e.g. ``"denoising needs"``)."""
        attrs = self.training_store().attrs
        patch, step = attrs.get("patch"), attrs.get("step")
        if patch is None or step is None:
            raise InputError(f"the run's training store {self.store_path} was not ingested from "
                             f"images (no patch/step attrs); {needs} a run fitted on patches "
                             "(`dkha ingest images`, or `dkha ingest array --patch P`)")
        if int(patch) ** 2 != self.n_features:
            raise InputError(f"the run has {self.n_features} features, not {patch}×{patch} "
                             "patches")
        return int(patch), int(step)

    def check_features(self, n_features: int, what: str = "new data") -> None:
        if n_features != self.n_features:
            raise InputError(f"{what} has {n_features} features; the run was fitted on "
                             f"{self.ds.attrs['n_features']}")

    def engine(self, client, cache_rows: bool | None = None) -> RowEngine:
        """The row engine of a batch run's training store and kernel, with the run's centering."""
        if self.is_dictionary:
            raise InputError("a dictionary (online) run has no kernel rows of its training data")
        store = self.training_store()
        if store.n_samples != self.ds.sizes["sample"]:
            raise InputError(f"the training store {store.path} now holds {store.n_samples} "
                             f"samples; the run was fitted on {self.ds.sizes['sample']}")
        engine = RowEngine(store, self.kernel, client, config.settings(row_cache=cache_rows))
        engine.set_mk(self.ds["mk"].values, float(self.ds.attrs["mkm"]))
        # what the row is (as RowEngine.compute_mk describes it): keys the store's caches
        a = self.ds.attrs
        sampled = a.get("centering", "exact") == "sample"
        engine.centering = dict(describe_centering(
            engine.kernel, store.n_samples, int(a["center_sample"]) if sampled else None,
            int(a["seed"]) if sampled else 0), cached=True)
        return engine

    def dictionary_part(self) -> xr.Dataset:
        """A dictionary run's small variables, loaded, with the attrs: what a task projecting
        blocks of new samples on the workers needs."""
        small = self.ds[list(DICTIONARY_VARIABLES)].load()
        small.attrs = dict(self.ds.attrs)
        return small


def as_run(run: Run | xr.Dataset | str | os.PathLike) -> Run:
    """A :class:`Run` from a run, its components dataset or its directory."""
    if isinstance(run, Run):
        return run
    if isinstance(run, (str, os.PathLike)):
        return Run.open(os.fspath(run))
    return Run(run)
