"""Kernel tiles at the speed of the hardware: one GEMM, then one fused sweep.

A kernel tile ``K[I, J]`` (optionally centered, coordinator-math.md §1) is computed as

1. ``G = X_I X_Jᵀ`` by one GEMM (BLAS; ``float64``, or ``float32`` with ``precision="float32"``);
2. one compiled sweep over ``G`` (:func:`fused_sweep`) that turns each entry into the centered
   kernel value: the squared distance ``‖x‖² + ‖y‖² − 2 G`` clipped at zero, scale, exp (a
   vectorisable exp, not the C library's scalar one), the laplacian's square root (near pairs
   recomputed exactly), the polynomial's power or the sigmoid's tanh, and the centering
   ``− mk[J] − (mk[I] − mkm)`` — where NumPy made six to eight passes over the tile.

Where the tile is only needed as a product (``K' V``, the projections ``S̃ K'ᵀ``, the MK row
sums) :func:`tile_product` computes it panel by panel (a few rows at a time, small enough to stay
in cache) and multiplies each panel by ``V`` (and its transpose by ``W``) before moving on: the
tile is never written out whole. Products are accumulated in float64 whatever the precision.

``precision="float32"``: the GEMM and the sweep run in single precision. The distance expansion
loses ``~eps₃₂·(‖x‖² + ‖y‖²)`` to cancellation, so both blocks are first shifted by the mean of
the column block (distances do not change; the norms shrink to the data's spread) and the norms
are computed in float64. The gaussian's CPU sweep then forms the distance, the exp and the
centering in float32 lanes (twice as many a vector as float64's: the sweep 2.7× faster
than one that forms the distance in float64; the rounding of the norms to float32 adds less than
the float32 product's own error, and the largest error against float64 on photo patches stays
1.6e-6); the other kernels form the distance in float64 from the float32 product, and for the
laplacian the near pairs (where the square root magnifies the error) are recomputed exactly.
The row engine keeps evaluation (E(A), E_min) and its tile cache in float64 whatever the
precision (``RowEngine.exact_kernel``): ``E_min² = ‖K'‖² − Σλ²`` cancels.

Devices. ``device="cpu"`` runs the compiled sweep. ``device="cuda"`` runs the same tile
functions with CuPy arrays (:func:`array_module`; install ``dkha[gpu]``): the array path
(:func:`array_tile`) is written once against the NumPy/CuPy array API, so on a machine without a
GPU the same code runs with NumPy behind it (the tests do). ``device="auto"`` picks ``cuda`` on a
Dask worker that declares a ``GPU`` resource (``dask worker --resources GPU=1``) and ``cpu``
elsewhere: the choice is made per worker, where the task runs.

The package, one module a part:

* :mod:`~dkha.tiles.codes` — the one table of kernel codes (formula, distance kernel, the fused
  implementations of each);
* :mod:`~dkha.tiles.spec` — :class:`TileSpec`, the prepared column block, the operands;
* :mod:`~dkha.tiles.devices` — ``cpu``/``cuda``/``auto`` and the array module of each;
* :mod:`~dkha.tiles.cpu` — the numba sweep, the panels and their per-thread buffers;
* :mod:`~dkha.tiles.array` — the NumPy/CuPy array tile (the device path);
* :mod:`~dkha.tiles.cuda` — the gaussian's CUDA sweeps (CuPy);
* :mod:`~dkha.tiles.triton_gaussian` — the gaussian's products as one fused Triton kernel
  (optional: ``dkha[triton]``; the GPU band passes use it where it serves);
* :mod:`~dkha.tiles.tile` — :func:`kernel_tile`, :func:`tile_product`, :func:`tile_residuals`.
"""

from __future__ import annotations

from dkha.tiles import array, codes, cpu, cuda, devices, spec
from dkha.tiles.array import array_tile
from dkha.tiles.codes import CODES, GAUSSIAN, LAPLACIAN, POLYNOMIAL, SIGMOID, TileCode
from dkha.tiles.cpu import fused_sweep, scratch
from dkha.tiles.devices import (
    array_module,
    array_module_of,
    resolve_device,
    set_gpu_probe,
    to_host,
)
from dkha.tiles.spec import Columns, TileSpec, dtype_of, prepare_columns
from dkha.tiles.tile import compile_sweeps, kernel_tile, tile_product, tile_residuals

__all__ = [
    "CODES", "GAUSSIAN", "LAPLACIAN", "POLYNOMIAL", "SIGMOID", "Columns", "TileCode", "TileSpec",
    "array", "array_module", "array_module_of", "array_tile", "codes", "compile_sweeps", "cpu",
    "cuda", "devices", "dtype_of", "fused_sweep", "kernel_tile", "prepare_columns",
    "resolve_device", "scratch", "set_gpu_probe", "spec", "tile_product", "tile_residuals",
    "to_host",
]
