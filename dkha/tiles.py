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
the column block (distances do not change; the norms shrink to the data's spread), the norms are
computed in float64, the distance is formed in float64 from the float32 product, and for the
laplacian the near pairs (where the square root magnifies the error) are recomputed exactly.
The row engine keeps evaluation (E(A), E_min) and its tile cache in float64 whatever the
precision (``RowEngine.exact_kernel``): ``E_min² = ‖K'‖² − Σλ²`` cancels.

Devices. ``device="cpu"`` runs the compiled sweep. ``device="cuda"`` runs the same tile
functions with CuPy arrays (:func:`array_module`; install ``dkha[gpu]``): the array path
(:func:`_array_tile`) is written once against the NumPy/CuPy array API, so on a machine without a
GPU the same code runs with NumPy behind it (the tests do). ``device="auto"`` picks ``cuda`` on a
Dask worker that declares a ``GPU`` resource (``dask worker --resources GPU=1``) and ``cpu``
elsewhere: the choice is made per worker, where the task runs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from dkha.errors import ParameterError
from dkha.names import DEVICES, PRECISIONS

log = logging.getLogger(__name__)


# kernel codes of the compiled sweep (dkha.kernels.Kernel.tile_code)
GAUSSIAN, LAPLACIAN, POLYNOMIAL, SIGMOID = 0, 1, 2, 3

# a panel of a product's tile: rows × |J| values in about 8 MiB (BLAS wants rows)
PANEL_BYTES = 1 << 23
REFINE_FLOAT64 = 1e-6      # laplacian: recompute pairs with d² ≤ this · (max ‖x‖² + max ‖y‖²)
REFINE_FLOAT32 = 1e-3      # float32: recompute pairs with d² ≤ this · (‖x‖² + ‖y‖²)
SCRATCH_BYTES = 1 << 26    # panel buffers up to this size are kept per thread (64 MiB)

_scratch_arrays = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """A per-thread array of ``shape`` for the panels of a tile (``name``: one buffer per use),
    reused by every tile the thread computes; its contents are undefined.

    Allocating each panel anew costs a page fault per 4 KiB wherever large blocks are returned
    to the system at once — on every Dask worker started by a nanny, which sets
    ``MALLOC_TRIM_THRESHOLD_`` (and so turns off glibc's adaptive mmap threshold): tiles took
    16 % longer there than in a plain process (0.074 s against 0.063 s for a 3000 × 3000 MK
    tile, n = 121). Buffers above :data:`SCRATCH_BYTES` are not kept.
    """
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if size * dtype.itemsize > SCRATCH_BYTES:
        return np.empty(shape, dtype)
    key = (name, dtype.str)
    buf = getattr(_scratch_arrays, "buffers", None)
    if buf is None:
        buf = _scratch_arrays.buffers = {}
    arr = buf.get(key)
    if arr is None or arr.size < size:
        arr = buf[key] = np.empty(size, dtype)
    return arr[:size].reshape(shape)


def dtype_of(precision: str) -> np.dtype:
    """The floating type of kernel tiles for ``precision`` (``float64`` or ``float32``)."""
    if precision not in PRECISIONS:
        raise ParameterError(f"unknown precision {precision!r}; choose one of "
                             f"{', '.join(PRECISIONS)}")
    return np.dtype(precision)


# --- devices -------------------------------------------------------------------------------------


def _no_gpu() -> bool:
    return False


_gpu_probe = _no_gpu      # set by the worker-side tasks (dkha.engine.tasks): this worker's GPU


def set_gpu_probe(probe) -> None:
    """Tell ``device="auto"`` how to ask whether this process is a worker with a ``GPU`` resource
    (a function of no arguments; :mod:`dkha.engine.tasks` installs one reading the Dask worker's
    resources, so this module imports no Dask)."""
    global _gpu_probe
    _gpu_probe = probe


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda``: ``auto`` becomes ``cuda`` on a worker declaring a ``GPU`` resource."""
    if device not in DEVICES:
        raise ParameterError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if _gpu_probe() else "cpu"
    return device


def array_module(device: str):
    """The array module behind ``device``: NumPy for ``cpu``, CuPy for ``cuda``."""
    if resolve_device(device) == "cpu":
        return np
    try:
        import cupy
    except ImportError:
        raise ParameterError("device 'cuda' needs CuPy on the workers: pip install 'dkha[gpu]' "
                             "(or run with --device cpu)") from None
    return cupy


def array_module_of(a):
    """The array module of ``a``: CuPy for a CuPy array, else NumPy."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def to_host(xp, a):
    """``a`` as a NumPy array (copies from the GPU for CuPy)."""
    return a if xp is np else xp.asnumpy(a)


# --- the compiled sweep --------------------------------------------------------------------------


def _bitcast(int_type, float_type):
    """A compiled reinterpretation of ``int_type`` bits as ``float_type`` (for 2^k in the exp)."""
    @intrinsic
    def cast(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(float_type))
        return float_type(int_type), codegen
    return cast


_int_as_float64 = _bitcast(types.int64, types.float64)
_int_as_float32 = _bitcast(types.int32, types.float32)


@njit(inline="always", fastmath=True)
def _exp_neg64(x):
    """``exp(x)`` for ``x ≤ 0`` (2 ulp; 0 below −708): Cody–Waite reduction, degree-12 Taylor
    polynomial, 2^k from its bits. No call, so LLVM vectorises the loop around it."""
    x = max(x, -708.0)
    k = np.floor(x * 1.4426950408889634 + 0.5)
    r = x - k * 0.693145751953125 - k * 1.42860682030941723212e-6
    p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (
        1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (
            1.0 / 3628800 + r * (1.0 / 39916800 + r * (1.0 / 479001600))))))))))))
    return p * _int_as_float64((np.int64(k) + 1023) << 52)


_F32 = np.float32


@njit(inline="always", fastmath=True)
def _exp_neg32(x):
    """``exp(x)`` for ``x ≤ 0`` in float32 (2 ulp; 0 below −87), as :func:`_exp_neg64`."""
    x = max(x, _F32(-87.0))
    k = _F32(np.floor(x * _F32(1.44269504) + _F32(0.5)))
    r = x - k * _F32(0.693359375) + k * _F32(2.12194440e-4)
    p = _F32(1.0) + r * (_F32(1.0) + r * (_F32(0.5) + r * (_F32(1.0 / 6) + r * (
        _F32(1.0 / 24) + r * (_F32(1.0 / 120) + r * (_F32(1.0 / 720) + r * _F32(1.0 / 5040)))))))
    return p * _int_as_float32((np.int32(k) + np.int32(127)) << np.int32(23))


@njit(cache=True, nogil=True, fastmath=True)
def fused_sweep(T, xx, yy, code, p1, p2, p3, mk_rows, mk_cols, mkm, X, Y, refine, single):
    """``T[i, j] ← k(x_i, y_j) − mk_cols[j] − (mk_rows[i] − mkm)`` from ``T = G = X Yᵀ``, one sweep
    in place (one array: LLVM vectorises only loops it can prove free of aliasing).

    ``code``/``p1..p3``: gaussian (``p1 = 1/(2σ²)``), laplacian (``p1 = 1/σ``; pairs with
    ``d² ≤ refine[0] + refine[1]·(‖x‖² + ‖y‖²)`` are recomputed from ``X`` and ``Y`` in float64),
    polynomial (degree ``p1``, offset ``p2``), sigmoid (gamma ``p1``, offset ``p2``). ``xx``/``yy``:
    float64 squared norms (distance kernels). Zero ``mk`` rows and ``mkm`` leave it uncentered.
    ``single``: the gaussian's exp in float32.
    """
    m, n = T.shape
    for i in range(m):
        g = T[i]
        o = g
        ci = mk_rows[i] - mkm
        xi = xx[i]
        if code == GAUSSIAN:
            if single:
                s = np.float32(-p1)
                for j in range(n):
                    d = max(xi + yy[j] - 2.0 * g[j], 0.0)
                    o[j] = _exp_neg32(np.float32(d) * s) - np.float32(mk_cols[j] + ci)
            else:
                for j in range(n):
                    d = max(xi + yy[j] - 2.0 * g[j], 0.0)
                    o[j] = _exp_neg64(-p1 * d) - mk_cols[j] - ci
        elif code == LAPLACIAN:
            for j in range(n):
                d = max(xi + yy[j] - 2.0 * g[j], 0.0)
                if d <= refine[0] + refine[1] * (xi + yy[j]):
                    d = 0.0
                    for f in range(X.shape[1]):
                        t = np.float64(X[i, f]) - np.float64(Y[j, f])
                        d += t * t
                o[j] = _exp_neg64(-p1 * np.sqrt(d)) - mk_cols[j] - ci
        elif code == POLYNOMIAL:
            degree = int(p1)
            for j in range(n):
                b = g[j] + p2
                v = b
                for _ in range(degree - 1):
                    v *= b
                o[j] = v - mk_cols[j] - ci
        else:
            for j in range(n):
                o[j] = np.tanh(p1 * g[j] + p2) - mk_cols[j] - ci


# --- one tile: GEMM + sweep (compiled on CPU, array functions on GPU) -------------------------


class TileSpec:
    """What a tile function needs of a kernel: its code and parameters, precision, device.

    Built by :meth:`dkha.kernels.Kernel.tile_spec`; a plain value, cheap to make per task.
    """

    __slots__ = ("code", "device", "dtype", "p1", "p2", "p3")

    def __init__(self, code: int, p1: float, p2: float, p3: float, precision: str, device: str):
        self.code, self.p1, self.p2, self.p3 = int(code), float(p1), float(p2), float(p3)
        self.dtype = dtype_of(precision)
        self.device = device

    @property
    def distance(self) -> bool:
        return self.code in (GAUSSIAN, LAPLACIAN)


@dataclass(frozen=True)
class Columns:
    """The column block ``Y`` of tiles ``K[X, Y]`` as the tile functions take it, prepared once
    (:func:`prepare_columns`) for every tile against it: in the tile's precision (shifted by its
    mean for a distance kernel in float32), its float64 squared norms, the float64 rows."""

    Ys: np.ndarray
    yy: np.ndarray
    Y64: np.ndarray
    shift: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.Ys, self.yy, self.Y64) if a is not None) - (
            self.Y64.nbytes if self.Ys is self.Y64 else 0)


def prepare_columns(spec: TileSpec, Y: np.ndarray) -> Columns:
    """``Y`` prepared for :func:`kernel_tile` and :func:`tile_product` (see :class:`Columns`):
    a worker that computes many row blocks against the same columns prepares them once."""
    Y = np.asarray(Y, dtype=np.float64)
    shift = None
    if spec.distance and spec.dtype == np.float32 and len(Y):
        shift = Y.mean(axis=0)
        Y = Y - shift
    yy = np.einsum("ij,ij->i", Y, Y) if spec.distance else np.zeros(0)
    return Columns(Y.astype(np.float32) if spec.dtype == np.float32 else Y, yy, Y, shift)


def _operands(spec: TileSpec, X: np.ndarray, Y):
    """``(Xs, Ys, xx, yy)``: the blocks in the tile's precision (shifted by ``Y``'s mean for a
    distance kernel in float32: distances unchanged, cancellation reduced) and float64 norms
    (``Y`` raw or already :func:`prepared <prepare_columns>`), and the float64 rows of both."""
    cols = Y if isinstance(Y, Columns) else prepare_columns(spec, Y)
    X = np.asarray(X, dtype=np.float64)
    if cols.shift is not None:
        X = X - cols.shift
    xx = np.einsum("ij,ij->i", X, X) if spec.distance else np.zeros(0)
    Xs = X.astype(np.float32) if spec.dtype == np.float32 else X
    return Xs, cols.Ys, xx, cols.yy, X, cols.Y64


def _refine(spec: TileSpec, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """Thresholds ``(absolute, relative)`` for recomputing near pairs of the laplacian."""
    if spec.dtype == np.float32:
        return np.array([0.0, REFINE_FLOAT32])
    scale = (float(xx.max()) if len(xx) else 0.0) + (float(yy.max()) if len(yy) else 0.0)
    return np.array([REFINE_FLOAT64 * scale, 0.0])



def _mk_args(m: int, n: int, mk_rows, mk_cols):
    mr = np.zeros(m) if mk_rows is None else np.ascontiguousarray(mk_rows, dtype=np.float64)
    mc = np.zeros(n) if mk_cols is None else np.ascontiguousarray(mk_cols, dtype=np.float64)
    return mr, mc


def _cpu_panel(spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm, out=None):
    """The (centered) tile of the rows ``Xs`` against ``Ys`` on the CPU: GEMM, then the sweep
    (in ``out``, a ``|Xs| × |Ys|`` array of the tile's type, when given)."""
    T = np.matmul(Xs, Ys.T, out=out)
    fused_sweep(T, xx, yy, spec.code, spec.p1, spec.p2, spec.p3, mr, mc, float(mkm),
                X64, Y64, refine, spec.dtype == np.float32)
    return T


def _array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm):
    """The same tile with array functions only (CuPy on a GPU, NumPy in the tests on CPU)."""
    G = Xs @ Ys.T
    if spec.distance:
        d = xx[:, None] + yy[None, :] - 2.0 * G.astype(xp.float64)
        xp.maximum(d, 0.0, out=d)
        if spec.code == LAPLACIAN:
            i, j = xp.nonzero(d <= refine[0] + refine[1] * (xx[:, None] + yy[None, :]))
            for s in range(0, len(i), 4096):
                diff = X64[i[s:s + 4096]] - Y64[j[s:s + 4096]]
                d[i[s:s + 4096], j[s:s + 4096]] = (diff * diff).sum(axis=1)
            d = xp.exp(-spec.p1 * xp.sqrt(d))
        else:
            d = xp.exp((-spec.p1 * d).astype(spec.dtype))
        K = d.astype(spec.dtype, copy=False)
    elif spec.code == POLYNOMIAL:
        K = (G + spec.p2) ** int(spec.p1)
    else:
        K = xp.tanh(spec.p1 * G + spec.p2)
    K = K - mc[None, :].astype(spec.dtype) - (mr - mkm)[:, None].astype(spec.dtype)
    return K.astype(spec.dtype, copy=False)


_GAUSSIAN_SOURCE = """
double d = xi + yj - 2.0 * (double)g;
d = d > 0.0 ? d : 0.0;
k = (T)(exp(-s * d) - cj - ri);
"""
_gpu_kernels: dict = {}


def _gpu_gaussian(xp):
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


def _device_tile(xp, spec, ops, mr, mc, mkm):
    """The whole (centered) tile on the device: the host operands moved there, then
    :func:`array_tile`."""
    Xs, Ys, xx, yy, X64, Y64 = (xp.asarray(a) for a in ops)
    if spec.code != LAPLACIAN:      # the exact near pairs need the float64 rows, others not
        X64 = Y64 = None
    return array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, xp.asarray(mr), xp.asarray(mc), mkm)


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


def _gpu_gaussian_rows(xp, dtype):
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


def _rows_sweep(xp, kern, G, xx, yy, mr, mc, mkm, s) -> bool:
    """Run :func:`_gpu_gaussian_rows`'s kernel over ``G`` in place; False (and the kernel marked
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


def array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, mr, mc, mkm: float, *, out=None):
    """The tile ``K'[X, Y]`` (uncentered where ``mr`` is None) with the operands already on
    ``xp``'s device (a worker's resident rows, :mod:`dkha.engine.device`): on CuPy the gaussian
    by one GEMM into ``out`` (a contiguous ``|X| × |Y|`` array of the tile's type, or None) and
    :func:`_gpu_gaussian` in place; otherwise :func:`_array_tile` (NumPy in the tests)."""
    fused = _gpu_gaussian(xp) if spec.code == GAUSSIAN else None
    if fused is not None:
        G = xp.matmul(Xs, Ys.T, out=out)
        rows = _gpu_gaussian_rows(xp, spec.dtype)
        if rows is not None and _rows_sweep(xp, rows, G, xx, yy, mr, mc, mkm, spec.p1):
            return G
        ri, cj = (0.0, 0.0) if mr is None else ((mr - mkm)[:, None], mc[None, :])
        fused(G, xx[:, None], yy[None, :], ri, cj, float(spec.p1), G)
        return G
    if mr is None:
        mr, mc, mkm = xp.zeros(len(Xs)), xp.zeros(len(Ys)), 0.0
    refine = xp.asarray(_refine(spec, xx, yy))
    if X64 is None:
        X64 = Y64 = xp.zeros((0, 0))
    T = _array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm)
    if out is None:
        return T
    out[...] = T
    return out


def kernel_tile(spec: TileSpec, X, Y, mk_rows=None, mk_cols=None, mkm: float = 0.0,
                *, out_dtype=np.float64) -> np.ndarray:
    """``K[X, Y]``, centered when ``mk_rows``/``mk_cols`` are given, as a NumPy array of
    ``out_dtype`` (the coordinator's rows: float64; the tile cache may keep the tile precision)."""
    Xs, Ys, xx, yy, X64, Y64 = _operands(spec, X, Y)
    mr, mc = _mk_args(len(Xs), len(Ys), mk_rows, mk_cols)
    refine = _refine(spec, xx, yy)
    xp = array_module(spec.device)
    if xp is np:
        T = _cpu_panel(spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm)
        return T.astype(out_dtype, copy=False)
    K = _device_tile(xp, spec, (Xs, Ys, xx, yy, X64, Y64), mr, mc, mkm)
    return to_host(xp, K).astype(out_dtype, copy=False)


def _panel_rows(n_cols: int, itemsize: int) -> int:
    return int(max(64, min(4096, PANEL_BYTES // max(1, n_cols * itemsize))))


def tile_product(spec: TileSpec, X, Y, V=None, W=None, mk_rows=None, mk_cols=None,
                 mkm: float = 0.0, *, sums: bool = False):
    """Products of the (centered) tile ``T = K'[X, Y]`` without writing ``T`` out.

    Returns ``(T V, Tᵀ W, T 1, Tᵀ 1)``: ``V`` is ``|Y| × k``, ``W`` is ``|X| × k'`` (each product
    ``None`` when its operand is); with ``sums``, the row and column sums too (else ``None``).
    All float64; the tile is computed ``panel`` rows at a time, each panel multiplied while it is
    in cache (compiled sweep on CPU; one array-function tile on GPU).
    """
    Xs, Ys, xx, yy, X64, Y64 = _operands(spec, X, Y)
    m, n = len(Xs), len(Ys)
    mr, mc = _mk_args(m, n, mk_rows, mk_cols)
    refine = _refine(spec, xx, yy)
    dt = spec.dtype
    Vd = None if V is None else np.ascontiguousarray(V, dtype=dt)
    Wd = None if W is None else np.ascontiguousarray(W, dtype=dt)
    TV = None if V is None else np.empty((m, V.shape[1]))
    TW = None if W is None else np.zeros((n, W.shape[1]))
    rowsum = np.empty(m) if sums else None
    colsum = np.zeros(n) if sums else None
    xp = array_module(spec.device)
    if xp is not np:
        T = _device_tile(xp, spec, (Xs, Ys, xx, yy, X64, Y64), mr, mc, mkm)
        if V is not None:
            TV[:] = to_host(xp, T @ xp.asarray(Vd))
        if W is not None:
            TW[:] = to_host(xp, T.T @ xp.asarray(Wd))
        if sums:
            rowsum[:] = to_host(xp, T.sum(axis=1, dtype=xp.float64))
            colsum[:] = to_host(xp, T.sum(axis=0, dtype=xp.float64))
        return TV, TW, rowsum, colsum
    step = _panel_rows(n, dt.itemsize)
    panel = scratch("panel", (min(step, m), n), dt)
    TWp = None if W is None else scratch("product", TW.shape, np.result_type(dt, Wd))
    for a in range(0, m, step):
        b = min(a + step, m)
        T = _cpu_panel(spec, Xs[a:b], Ys, xx[a:b] if len(xx) else xx, yy, X64[a:b], Y64, refine,
                       mr[a:b], mc, mkm, out=panel[:b - a])
        if V is not None:
            TV[a:b] = T @ Vd
        if W is not None:
            TW += np.matmul(T.T, Wd[a:b], out=TWp)
        if sums:
            rowsum[a:b] = T.sum(axis=1, dtype=np.float64)
            colsum += T.sum(axis=0, dtype=np.float64)
    return TV, TW, rowsum, colsum


def tile_residuals(spec: TileSpec, X, Y, Cs: tuple, C_rows: slice, C_cols: slice,
                   mk_rows=None, mk_cols=None, mkm: float = 0.0) -> np.ndarray:
    """``[‖T‖², ‖T − C[:, rows]ᵀ C[:, cols]‖² for each C of Cs]`` for the (centered) tile
    ``T = K'[X, Y]``, panel by panel (each panel's residuals taken while it is in cache; float64
    sums; on GPU one array-function tile)."""
    Xs, Ys, xx, yy, X64, Y64 = _operands(spec, X, Y)
    m, n = len(Xs), len(Ys)
    mr, mc = _mk_args(m, n, mk_rows, mk_cols)
    refine = _refine(spec, xx, yy)
    out = np.zeros(1 + len(Cs))
    xp = array_module(spec.device)
    if xp is not np:
        T = _device_tile(xp, spec, (Xs, Ys, xx, yy, X64, Y64), mr, mc, mkm)
        T = T.astype(xp.float64)
        out[0] = float((T * T).sum())
        for k, C in enumerate(Cs):
            Cd = xp.asarray(C)
            R = T - Cd[:, C_rows].T @ Cd[:, C_cols]
            out[1 + k] = float((R * R).sum())
        return out
    rows0 = C_rows.start or 0
    step = _panel_rows(n, spec.dtype.itemsize)
    panel = scratch("panel", (min(step, m), n), spec.dtype)
    residual = scratch("residual", (min(step, m), n), np.float64)
    for a in range(0, m, step):
        b = min(a + step, m)
        T = _cpu_panel(spec, Xs[a:b], Ys, xx[a:b] if len(xx) else xx, yy, X64[a:b], Y64, refine,
                       mr[a:b], mc, mkm, out=panel[:b - a])
        flat = T.ravel()
        out[0] += float(np.dot(flat, flat))
        for k, C in enumerate(Cs):
            R = np.matmul(C[:, rows0 + a:rows0 + b].T, C[:, C_cols], out=residual[:b - a])
            R -= T
            flat = R.ravel()
            out[1 + k] += float(np.dot(flat, flat))
    return out


def compile_sweeps() -> None:
    """Compile :func:`fused_sweep` for the types the engine's tiles pass it (both precisions;
    whole tiles and panels of a product), on tiny blocks: what the first kernel tile of a fit
    would otherwise compile (``cache=True``: once per environment; see
    :func:`dkha.solvers.warmup.compile_all`)."""
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((6, 3)), rng.standard_normal((5, 3))
    mk6, mk5 = np.zeros(6), np.zeros(5)
    for precision in ("float64", "float32"):
        spec = TileSpec(GAUSSIAN, 0.5, 0.0, 0.0, precision, "cpu")
        kernel_tile(spec, X, Y, mk6, mk5, 0.0)
        tile_product(spec, X, Y, V=np.ones((5, 2)), W=np.ones((6, 2)), mk_rows=mk6,
                     mk_cols=mk5, sums=True)
