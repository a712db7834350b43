"""The gaussian tile's sweep as CUDA kernels (CuPy): an elementwise kernel, and a kernel over
rows that keeps each row's norm and centering in registers. Both sweep the GEMM's output in place
(one read and one write of the tile); :func:`dkha.tiles.array.array_tile` runs them."""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


_GAUSSIAN_SOURCE = """
double d = xi + yj - 2.0 * (double)g;
d = d > 0.0 ? d : 0.0;
k = (T)(exp(-s * d) - cj - ri);
"""
_gpu_kernels: dict = {}


def gpu_gaussian(xp):
    """The gaussian tile's sweep as one CUDA elementwise kernel (CuPy), or None where the array
    module has none (NumPy in the tests): distance from the GEMM in float64, exp, centering, in
    place over ``G`` — one read and one write of the tile, where the array functions made six to
    eight passes over it (float64 temporaries included)."""
    make = getattr(xp, "ElementwiseKernel", None)
    if make is None:
        return None
    if "gaussian" not in _gpu_kernels:
        _gpu_kernels["gaussian"] = make(
            "T g, float64 xi, float64 yj, float64 ri, float64 cj, float64 s", "T k",
            _GAUSSIAN_SOURCE, "dkha_gaussian_tile")
    return _gpu_kernels["gaussian"]


_ROWS_SOURCE = r"""
extern "C" __global__ void dkha_gaussian_rows_NAME(
    T* g, const double* xx, const double* yy, const double* ri, const double* cj,
    const double s, const int m, const int n, const int centered)
{
    for (int i = blockIdx.y; i < m; i += gridDim.y) {
        const double xi = xx[i];
        const double r = centered ? ri[i] : 0.0;
        T* row = g + (long long)i * n;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += blockDim.x * gridDim.x) {
            double d = xi + yy[j] - 2.0 * (double)row[j];
            d = d > 0.0 ? d : 0.0;
            row[j] = (T)(EXP - (centered ? cj[j] : 0.0) - r);
        }
    }
}
"""
#: the row kernel's exp: float64 tiles in double, float32 tiles in float (rounded to float anyway)
_ROWS_EXP = {"float64": "exp(-s * d)", "float32": "(double)expf((float)(-s * d))"}
_ROWS_TYPE = {"float64": "double", "float32": "float"}


def gpu_gaussian_rows(xp, dtype):
    """The gaussian tile's sweep as a CUDA kernel over rows (CuPy's ``RawKernel``): a block of
    threads walks a row of the GEMM's output with the row's norm and centering in registers, so
    no element pays the broadcast index arithmetic of an elementwise kernel. None where CuPy is
    not behind ``xp``, or where the kernel failed to build here (the elementwise kernel then)."""
    make = getattr(xp, "RawKernel", None)
    name = np.dtype(dtype).name
    if make is None or _gpu_kernels.get(("rows", name)) is False:
        return None
    if ("rows", name) not in _gpu_kernels:
        src = (_ROWS_SOURCE.replace("NAME", name).replace("EXP", _ROWS_EXP[name])
               .replace("T", "TYPE_").replace("TYPE_", _ROWS_TYPE[name]))
        _gpu_kernels[("rows", name)] = make(src, f"dkha_gaussian_rows_{name}")
    return _gpu_kernels[("rows", name)]


def rows_sweep(xp, kern, G, xx, yy, mr, mc, mkm, s) -> bool:
    """Run :func:`gpu_gaussian_rows`'s kernel over ``G`` in place; False (and the kernel marked
    unusable, with a log line) where it cannot build or run on this GPU."""
    m, n = G.shape
    centered = mr is not None
    ri = xp.ascontiguousarray(mr - mkm) if centered else xx
    cj = xp.ascontiguousarray(mc) if centered else yy
    try:
        kern((min(32, -(-n // 256)), min(m, 65535)), (256,),
             (G, xp.ascontiguousarray(xx), xp.ascontiguousarray(yy), ri, cj, np.float64(s),
              np.int32(m), np.int32(n), np.int32(centered)))
    except Exception as exc:  # noqa: BLE001 - NVRTC or launch failure: the elementwise kernel
        log.warning("the GPU row kernel is not usable here (%s); using the elementwise kernel",
                    exc)
        _gpu_kernels[("rows", G.dtype.name)] = False
        return False
    return True
