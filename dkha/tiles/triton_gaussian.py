"""The gaussian tile's products as one fused Triton kernel: the tile never written to memory.

For a block of rows ``X_I`` against columns ``Y_J``, :func:`gaussian_product` computes

    ``out[i] = Σ_j (exp(−s d²_ij) − cj_j − ri_i) V[j]``   and, with ``rowsum``, ``Σ_j (…)``

in the style of FlashAttention: each program owns ``BLOCK_M`` rows; for each ``BLOCK_N`` columns
it forms the distances by ``tl.dot`` (``input_precision="tf32x3"`` on the GPU: three TF32
products, float32 accuracy, on the tensor cores), ``d² = ‖x‖² + ‖y‖² − 2 x·y`` in float64 from
float64 norms (the cancellation the float32 tiles guard against, :mod:`dkha.tiles.spec`), clips
it at zero, takes the exp in float32 and the centering in registers, multiplies by ``V_J`` with
a second ``tl.dot`` and adds that tile's float32 partial into a float64 accumulator (the per-row
sums in float64). Ragged edges (rows, columns, features, ``V``'s columns) are masked. The
centered part is what dkha's float32 tiles compute (:func:`dkha.tiles.cpu.fused_sweep`, which
forms the gaussian's distance in float32 lanes: the same values to float32 accuracy), so the
kernel is a drop-in for a band's products (:mod:`dkha.engine.device`).

Optional: needs ``triton`` and ``torch`` (``pip install 'dkha[triton]'``); :func:`available`
says whether this process can run it on a CUDA device, and the device path uses it only then
(the CuPy tile stays the fallback and the oracle). No autotuning: the block sizes are fixed
below. The tests run the same source on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``, torch's CPU build) against a float64 NumPy oracle.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading

import numpy as np

from dkha.tiles.codes import GAUSSIAN

BLOCK_M, BLOCK_N, BLOCK_D = 64, 64, 32

_kernel = None
_compiled: set = set()                  # the constexpr variants launched once in this process
_compile_lock = threading.Lock()        # a variant's first launch (Triton compiles it) alone


def importable() -> bool:
    """Whether ``triton`` and ``torch`` are installed (without importing them)."""
    return all(importlib.util.find_spec(m) is not None for m in ("triton", "torch"))


def interpreted() -> bool:
    """Whether Triton runs its interpreter here (``TRITON_INTERPRET=1``: on the CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available() -> tuple[bool, str]:
    """``(usable, why)``: whether the fused kernel can run on a CUDA device in this process."""
    if os.environ.get("DKHA_TRITON", "1") == "0":
        return False, "turned off (DKHA_TRITON=0)"
    if not importable():
        return False, "triton and torch not installed (pip install 'dkha[triton]')"
    if interpreted():
        return False, "TRITON_INTERPRET=1 (the interpreter is for tests)"
    import torch

    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"triton fused gaussian (torch {torch.__version__})"


@functools.cache
def usable() -> tuple[bool, str]:
    """:func:`available`, asked once per process (the worker's choice for every band)."""
    return available()


def serves(code: int, dtype, kind: str) -> tuple[bool, str]:
    """``(used, why)``: whether the device path computes tiles of ``code`` in ``dtype`` by this
    kernel: the gaussian, float32 tiles (tf32x3 is float32's accuracy: a float64 request keeps
    the CuPy tile), where :func:`usable`; ``kind`` the device's (``cuda``)."""
    if kind != "cuda":
        return False, "CuPy/NumPy tiles (no CUDA device)"
    if int(code) != GAUSSIAN:
        return False, "CuPy tiles (the fused Triton kernel is the gaussian's)"
    if np.dtype(dtype) != np.float32:
        return False, ("CuPy tiles (float64 tiles asked for; the fused Triton kernel is "
                       "float32's accuracy: --precision float32)")
    ok, why = usable()
    return ok, (why if ok else f"CuPy tiles (Triton: {why})")


def _build():
    """The kernel, compiled by Triton on first launch (built once per process)."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def gaussian_kv(X, Y, V, XX, YY, RI, CJ, OUT, SUMS, m, n, d, r, s,
                    stride_x, stride_y, stride_v, stride_o,
                    CENTERED: tl.constexpr, HAS_V: tl.constexpr, ROWSUM: tl.constexpr,
                    PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    BD: tl.constexpr, BR: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BM + tl.arange(0, BM)
        rmask = rows < m
        feats = tl.arange(0, BD)
        vcols = tl.arange(0, BR)
        xi = tl.load(XX + rows, mask=rmask, other=0.0)
        ri = tl.load(RI + rows, mask=rmask, other=0.0)   # the norms again where uncentered
        acc = tl.zeros((BM, BR), dtype=tl.float64)
        sums = tl.zeros((BM,), dtype=tl.float64)
        for c in range(0, n, BN):
            cols = c + tl.arange(0, BN)
            cmask = cols < n
            g = tl.zeros((BM, BN), dtype=tl.float32)
            for f in range(0, d, BD):
                fm = (f + feats) < d
                x = tl.load(X + rows[:, None] * stride_x + (f + feats)[None, :],
                            mask=rmask[:, None] & fm[None, :], other=0.0)
                y = tl.load(Y + cols[:, None] * stride_y + (f + feats)[None, :],
                            mask=cmask[:, None] & fm[None, :], other=0.0)
                g += tl.dot(x, tl.trans(y), input_precision=PRECISION)
            yj = tl.load(YY + cols, mask=cmask, other=0.0)
            dist = xi[:, None] + yj[None, :] - 2.0 * g.to(tl.float64)
            dist = tl.maximum(dist, 0.0)
            k = tl.exp((-s * dist).to(tl.float32))
            if CENTERED:
                cj = tl.load(CJ + cols, mask=cmask, other=0.0)
                k = k - (cj[None, :] + ri[:, None]).to(tl.float32)
            k = tl.where(rmask[:, None] & cmask[None, :], k, 0.0)
            if HAS_V:
                v = tl.load(V + cols[:, None] * stride_v + vcols[None, :],
                            mask=cmask[:, None] & (vcols < r)[None, :], other=0.0)
                acc += tl.dot(k, v, input_precision=PRECISION).to(tl.float64)
            if ROWSUM:
                sums += tl.sum(k, axis=1).to(tl.float64)
        if HAS_V:
            tl.store(OUT + rows[:, None] * stride_o + vcols[None, :], acc,
                     mask=rmask[:, None] & (vcols < r)[None, :])
        if ROWSUM:
            tl.store(SUMS + rows, sums, mask=rmask)

    _kernel = gaussian_kv
    return _kernel


def _pow2(k: int, least: int = 16) -> int:
    return max(least, 1 << max(0, int(k) - 1).bit_length())


def gaussian_product(X, Y, xx, yy, s: float, V=None, ri=None, cj=None, *, rowsum: bool = False,
                     precision: str | None = None):
    """``(K' V, K' 1)`` of the gaussian tile ``K'[X, Y] = exp(−s d²) − cj[j] − ri[i]`` (``ri``,
    ``cj`` None: uncentered), the tile never stored. Torch tensors on one device: ``X`` ``m × d``
    and ``Y`` ``n × d`` float32 (shifted by a common mean), ``xx``/``yy`` their float64 squared
    norms, ``V`` ``n × r`` float32, ``ri``/``cj`` float64. Returns float64 tensors, each None when
    not asked for. ``precision``: ``tl.dot``'s input precision (default ``tf32x3``; ``ieee``
    under the interpreter)."""
    import torch

    kern = _build()
    m, d = X.shape
    n = Y.shape[0]
    dev = X.device
    X, Y = X.contiguous(), Y.contiguous()
    r = 0 if V is None else V.shape[1]
    out = torch.empty((m, max(r, 1)), dtype=torch.float64, device=dev)
    sums = torch.empty(m if rowsum else 1, dtype=torch.float64, device=dev)
    Vc = out if V is None else V.contiguous()
    centered = ri is not None
    ri_t = ri.contiguous() if centered else xx
    cj_t = cj.contiguous() if centered else yy
    if precision is None:
        precision = "ieee" if interpreted() else "tf32x3"
    grid = (max(1, -(-m // BLOCK_M)),)
    variant = (centered, V is not None, rowsum, precision, _pow2(r))
    if m and (r or rowsum):
        with _compile_lock if variant not in _compiled else contextlib.nullcontext():
            _launch(kern, grid, X, Y, Vc, xx, yy, ri_t, cj_t, out, sums, m, n, d, r, s,
                    variant)
            _compiled.add(variant)
    return (out if V is not None else None), (sums if rowsum else None)


def _launch(kern, grid, X, Y, Vc, xx, yy, ri_t, cj_t, out, sums, m, n, d, r, s, variant):
    centered, has_v, rowsum, precision, br = variant
    kern[grid](X, Y, Vc, xx.contiguous(), yy.contiguous(), ri_t, cj_t, out, sums,
               m, n, d, r, float(s), X.stride(0), Y.stride(0), Vc.stride(0), out.stride(0),
               CENTERED=centered, HAS_V=has_v, ROWSUM=rowsum, PRECISION=precision,
               BM=BLOCK_M, BN=BLOCK_N, BD=BLOCK_D, BR=br)
