"""Nothing of X read serially on the coordinator: the finite check recorded at ingest (or made by
the workers for older stores), the content key from the chunks' CRC32Cs, σ's sample and the
default plan's probe read and measured on a worker — on a real multi-process cluster."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster
from fsspec.implementations.local import LocalFileSystem

from dkha import KernelHebbianPCA, config
from dkha.data.atomic import consolidate
from dkha.data.store import FINITE_ATTR, DataStore, combine_digests, file_digests, open_store
from dkha.data.writer import StoreWriter
from dkha.errors import InputError
from dkha.kernels import median_distance


@pytest.fixture(scope="module")
def processes():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def older_copy(store: DataStore, path) -> DataStore:
    """A copy of ``store`` as an older dkha wrote it: without the attributes recorded at ingest."""
    shutil.copytree(store.path, path)
    group = zarr.open_group(str(path), mode="r+", use_consolidated=False)
    attrs = {k: v for k, v in group.attrs.asdict().items() if k != FINITE_ATTR}
    group.attrs.clear()
    group.attrs.update(attrs)
    consolidate(str(path))
    return open_store(path)


@pytest.fixture
def reads_of_x(monkeypatch):
    """Every read of ``X``'s values or files in this process (the coordinator)."""
    reads = []
    getitem = zarr.Array.__getitem__

    def counted(self, selection):
        if str(self.path).rstrip("/").endswith("X"):
            reads.append(("X", selection))
        return getitem(self, selection)

    monkeypatch.setattr(zarr.Array, "__getitem__", counted)
    cat_file = LocalFileSystem.cat_file

    def whole_files(self, path, start=None, end=None, **kwargs):
        if "/X/c/" in str(path) and (start is None or start >= 0):   # not a chunk's CRC32C
            reads.append(("file", path))
        return cat_file(self, path, start, end, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "cat_file", whole_files)
    return reads


def test_the_content_key_reads_only_the_chunks_checksums(digits_store, tmp_path, reads_of_x):
    assert digits_store.known_finite and digits_store.chunks_checksummed()
    key = digits_store.content_checksum()
    copy = open_store(shutil.copytree(digits_store.path, tmp_path / "copy.zarr"))
    assert copy.content_checksum() == key and reads_of_x == []
    X = zarr.open_group(copy.path, mode="r+")["X"]
    row = X[200]
    row[3] += 1e-9                      # one value, changed in place by another program
    X[200] = row
    assert copy.content_checksum() != key
    # chunks without a checksum: the files' SHA-256s, on the workers as here
    plain = tmp_path / "plain.zarr"
    group = zarr.open_group(str(plain), mode="w")
    group.create_array("X", data=np.asarray(digits_store.read()), chunks=(64, 64),
                       dimension_names=["sample", "feature"])
    plain = open_store(plain)
    reads_of_x.clear()                  # (this test's own reads)
    assert not plain.chunks_checksummed() and not plain.known_finite and reads_of_x == []
    assert plain.content_checksum() == combine_digests(file_digests(plain.path,
                                                                    plain.content_files()))
    assert len(reads_of_x) == 2 * 5        # (every chunk read whole, twice)


@pytest.mark.parametrize("written_by", ["this dkha", "an older dkha"])
def test_a_default_fit_reads_no_x_on_the_coordinator(digits_store, processes, tmp_path,
                                                     reads_of_x, written_by):
    import dask.config

    from dkha.engine.content import content_key

    store = (older_copy(digits_store, tmp_path / "s.zarr") if written_by == "an older dkha"
             else open_store(shutil.copytree(digits_store.path, tmp_path / "s.zarr")))
    kw = {"n_components": 4, "seed": 0, "client": processes}
    with dask.config.set({"dkha.dense-bytes": 0}):      # the blockwise path, not the dense one
        model = KernelHebbianPCA(**kw).fit(store.path)
        assert model.attrs_["path"] == "krylov"
        assert reads_of_x == []
        again = KernelHebbianPCA(**kw).fit(store.path)      # the centering from the cache
        assert reads_of_x == []
    # the workers measured what the coordinator would have: σ from the same seeded sample

    sample = store.sample(int(config.settings().median_sample), 0)
    assert model.kernel_["sigma"] == pytest.approx(median_distance(sample), rel=1e-12)
    assert content_key(store, processes, settings=config.settings()) == store.content_checksum()
    np.testing.assert_array_equal(again.alpha_, model.alpha_)


def test_non_finite_rows_are_named_by_the_workers(processes, tmp_path, reads_of_x):
    X = np.random.default_rng(0).normal(size=(300, 5))
    X[217, 2] = np.nan
    writer = StoreWriter(tmp_path / "nan.zarr", 5, chunk_rows=64)
    writer.append(X)
    store = writer.commit({})
    assert store.attrs[FINITE_ATTR] is False
    with pytest.raises(InputError) as here:
        store.check_finite()
    reads_of_x.clear()
    with pytest.raises(InputError) as there:
        KernelHebbianPCA(3, sigma=2.0, client=processes).fit(store.path)
    assert str(there.value) == str(here.value)
    assert "rows 217..217" in str(there.value) and reads_of_x == []


def test_a_fit_given_a_scheduler_address_measures_sigma_on_its_workers(digits_store, processes):
    # the address, not a client: the cluster is reached for σ's sample, and closed after

    address = processes.scheduler.address
    model = KernelHebbianPCA(n_components=4, seed=0, client=address).fit(digits_store.path)
    sample = digits_store.sample(int(config.settings().median_sample), 0)
    assert model.kernel_["sigma"] == pytest.approx(median_distance(sample), rel=1e-12)
