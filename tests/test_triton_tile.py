"""The fused Triton gaussian kernel (dkha/tiles/triton_gaussian.py) run on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, torch's CPU build) against a float64 NumPy oracle: ragged
edges in rows, columns, features and ``V``'s columns, a diagonal tile (the same rows on both
sides: zero distances), centered and not, row sums. Skipped where triton or torch is missing,
except in CI (``.ci/run`` installs them and sets ``DKHA_REQUIRE_TRITON=1``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dkha.tiles import triton_gaussian as tg

if not tg.importable():
    if os.environ.get("DKHA_REQUIRE_TRITON") == "1":
        raise RuntimeError("DKHA_REQUIRE_TRITON=1 but triton or torch is not installed")
    pytest.skip("triton and torch not installed (pip install 'dkha[triton]')",
                allow_module_level=True)


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter for this test (the kernel rebuilt under it, and again after)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tg, "_kernel", None)
    yield


def oracle(X, Y, s, V, mr, mc, mkm):
    d = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    K = np.exp(-s * d)
    if mr is not None:
        K = K - mc[None, :] - (mr - mkm)[:, None]
    return K @ V, K.sum(axis=1)


def numpy_product(X, Y, s: float, V=None, mk_rows=None, mk_cols=None, mkm: float = 0.0,
                  *, rowsum: bool = False):
    """``tg.gaussian_product`` from NumPy float64 rows, on the CPU (the interpreter) or the
    GPU torch sees: the rows shifted by ``Y``'s mean, float32 operands, float64 norms, as the
    float32 tiles take them. Returns NumPy float64 arrays."""
    import torch

    dev = "cpu" if tg.interpreted() or not torch.cuda.is_available() else "cuda"
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    shift = Y.mean(axis=0) if len(Y) else np.zeros(Y.shape[1])
    Xc, Yc = X - shift, Y - shift

    def t(a, dt):
        return torch.as_tensor(np.ascontiguousarray(a, dtype=dt), device=dev)

    ri = cj = None
    if mk_rows is not None:
        ri = t(np.asarray(mk_rows, dtype=np.float64) - mkm, np.float64)
        cj = t(mk_cols, np.float64)
    KV, sums = tg.gaussian_product(
        t(Xc, np.float32), t(Yc, np.float32), t(np.einsum("ij,ij->i", Xc, Xc), np.float64),
        t(np.einsum("ij,ij->i", Yc, Yc), np.float64), s,
        None if V is None else t(V, np.float32), ri, cj, rowsum=rowsum)
    return (None if KV is None else KV.cpu().numpy()), (None if sums is None else
                                                          sums.cpu().numpy())


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("centered", [True, False])
def test_ragged_tile_matches_float64(interpreter, centered):
    """70 × 45 rows (neither a multiple of 64), 37 features (not of 32), 5 columns of V (padded
    to 16): the products and row sums within float32's accuracy of float64."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((70, 37)) + 5.0          # offset: the norms' cancellation
    Y = rng.standard_normal((45, 37)) + 5.0
    V = rng.standard_normal((45, 5))
    s = 1.0 / (2 * 6.0 ** 2)
    mr, mc, mkm = (rng.random(70) * 0.5, rng.random(45) * 0.5, 0.3) if centered else (None,) * 3
    KV, sums = numpy_product(X, Y, s, V, mr, mc, mkm or 0.0, rowsum=True)
    want_KV, want_sums = oracle(X, Y, s, V, mr, mc, mkm)
    assert KV.shape == (70, 5) and sums.shape == (70,)
    assert _rel(KV, want_KV) < 2e-6
    assert _rel(sums, want_sums) < 2e-6


def test_diagonal_tile_and_sums_only(interpreter):
    """The same rows on both sides (the diagonal tile of a pass: zero distances clipped, the
    exp at 1), 130 rows (three row programs, the last ragged); row sums alone (no V)."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((130, 9))
    s = 0.1
    V = rng.standard_normal((130, 17))              # 17 columns: padded to 32
    KV, sums = numpy_product(X, X, s, V, rowsum=True)
    want_KV, want_sums = oracle(X, X, s, V, None, None, 0.0)
    assert _rel(KV, want_KV) < 2e-6 and _rel(sums, want_sums) < 2e-6
    none, only = numpy_product(X, X, s, None, rowsum=True)
    assert none is None and _rel(only, want_sums) < 2e-6


def test_not_used_without_a_cuda_device(interpreter):
    """The device path never picks the kernel where it cannot run: under the interpreter (or
    with no CUDA device torch sees) :func:`available` says no, and why."""
    ok, why = tg.available()
    assert not ok and why


def test_the_device_path_chooses_it_only_where_it_serves(monkeypatch):
    """The plan's choice (:func:`serves`): the gaussian in float32 on a CUDA device where the
    kernel is usable; the CuPy tile, with the reason, for float64 tiles, other kernels, no CUDA
    device, or DKHA_TRITON=0."""
    from dkha.tiles import GAUSSIAN, LAPLACIAN

    monkeypatch.setattr(tg, "usable", lambda: (True, "triton fused gaussian"))
    assert tg.serves(GAUSSIAN, "float32", "cuda") == (True, "triton fused gaussian")
    for args in ((GAUSSIAN, "float64", "cuda"), (LAPLACIAN, "float32", "cuda"),
                 (GAUSSIAN, "float32", "cpu")):
        used, why = tg.serves(*args)
        assert not used and why.startswith("CuPy")
    monkeypatch.setenv("DKHA_TRITON", "0")
    assert tg.available() == (False, "turned off (DKHA_TRITON=0)")
