"""The CPU's tiles: one GEMM, then one compiled sweep (numba) over its output, panel by panel.

:func:`fused_sweep` turns each entry of ``G = X_I X_Jᵀ`` into the centered kernel value in place:
the squared distance ``‖x‖² + ‖y‖² − 2 G`` clipped at zero, scale, exp (a vectorisable exp, not
the C library's scalar one), the laplacian's square root (near pairs recomputed exactly), the
polynomial's power or the sigmoid's tanh, and the centering ``− mk[J] − (mk[I] − mkm)`` — where
NumPy made six to eight passes over the tile. Products and residuals take the tile a panel of
rows at a time (:data:`PANEL_BYTES`: small enough to stay in cache), in per-thread buffers
(:func:`scratch`).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from dkha.tiles.codes import GAUSSIAN, LAPLACIAN, POLYNOMIAL

# a panel of a product's tile: rows × |J| values in about 8 MiB (BLAS wants rows)
PANEL_BYTES = 1 << 23
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
    ``single``: the gaussian's distance (from the norms rounded to float32), exp and centering
    in float32 (the package docstring says why that keeps float32's accuracy).
    """
    m, n = T.shape
    single_gaussian = single and code == GAUSSIAN
    # float32 lanes throughout (twice float64's): the column norms and centering in float32
    yy32 = yy.astype(np.float32) if single_gaussian else np.zeros(0, np.float32)
    mk32 = mk_cols.astype(np.float32) if single_gaussian else np.zeros(0, np.float32)
    for i in range(m):
        g = T[i]
        o = g
        ci = mk_rows[i] - mkm
        xi = xx[i]
        if code == GAUSSIAN:
            if single:
                s = _F32(-p1)
                xi32, ci32, zero, two = _F32(xi), _F32(ci), _F32(0.0), _F32(2.0)
                for j in range(n):
                    d = max(xi32 + yy32[j] - two * g[j], zero)
                    o[j] = _exp_neg32(d * s) - (mk32[j] + ci32)
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


def cpu_panel(spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm, out=None):
    """The (centered) tile of the rows ``Xs`` against ``Ys`` on the CPU: GEMM, then the sweep
    (in ``out``, a ``|Xs| × |Ys|`` array of the tile's type, when given)."""
    T = np.matmul(Xs, Ys.T, out=out)
    fused_sweep(T, xx, yy, spec.code, spec.p1, spec.p2, spec.p3, mr, mc, float(mkm),
                X64, Y64, refine, spec.dtype == np.float32)
    return T


def panel_rows(n_cols: int, itemsize: int) -> int:
    """Rows of a panel of ``n_cols`` values of ``itemsize`` bytes (:data:`PANEL_BYTES`)."""
    return int(max(64, min(4096, PANEL_BYTES // max(1, n_cols * itemsize))))


def _panels(spec, ops, refine, mr, mc, mkm):
    """``(a, b, T)``: the centered tile's rows ``a:b`` computed into ``T``, a panel of
    :func:`panel_rows` rows at a time (one per-thread buffer for them all)."""
    Xs, Ys, xx, yy, X64, Y64 = ops
    m, n = len(Xs), len(Ys)
    step = panel_rows(n, spec.dtype.itemsize)
    panel = scratch("panel", (min(step, m), n), spec.dtype)
    for a in range(0, m, step):
        b = min(a + step, m)
        yield a, b, cpu_panel(spec, Xs[a:b], Ys, xx[a:b] if len(xx) else xx, yy, X64[a:b], Y64,
                              refine, mr[a:b], mc, mkm, out=panel[:b - a])


def panel_products(spec, ops, refine, mr, mc, mkm, Vd, Wd, TV, TW, rowsum, colsum):
    """:func:`dkha.tiles.tile_product` on the CPU: each panel's products taken while it is in
    cache, into ``TV``, ``TW``, ``rowsum``, ``colsum`` (those not None)."""
    TWp = None if Wd is None else scratch("product", TW.shape, np.result_type(spec.dtype, Wd))
    for a, b, T in _panels(spec, ops, refine, mr, mc, mkm):
        if Vd is not None:
            TV[a:b] = T @ Vd
        if Wd is not None:
            TW += np.matmul(T.T, Wd[a:b], out=TWp)
        if rowsum is not None:
            rowsum[a:b] = T.sum(axis=1, dtype=np.float64)
            colsum += T.sum(axis=0, dtype=np.float64)


def panel_residuals(spec, ops, refine, mr, mc, mkm, Cs, C_rows, C_cols, out):
    """:func:`dkha.tiles.tile_residuals` on the CPU, panel by panel, summed into ``out``."""
    rows0 = C_rows.start or 0
    for a, b, T in _panels(spec, ops, refine, mr, mc, mkm):
        flat = T.ravel()
        out[0] += float(np.dot(flat, flat))
        for k, C in enumerate(Cs):
            R = np.matmul(C[:, rows0 + a:rows0 + b].T, C[:, C_cols],
                          out=scratch("residual", T.shape, np.float64))
            R -= T
            flat = R.ravel()
            out[1 + k] += float(np.dot(flat, flat))
