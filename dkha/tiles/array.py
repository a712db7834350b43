"""The tile written once against the NumPy/CuPy array API: the device path (CuPy on a GPU,
``device="cuda"``), run with NumPy behind it on a machine without one (the tests do). On CuPy the
gaussian is one GEMM and a fused CUDA sweep in place (:mod:`dkha.tiles.cuda`)."""

from __future__ import annotations

from dkha.tiles.codes import GAUSSIAN, LAPLACIAN, POLYNOMIAL
from dkha.tiles.cuda import gpu_gaussian, gpu_gaussian_rows, rows_sweep
from dkha.tiles.devices import to_host
from dkha.tiles.spec import refine_thresholds


def plain_array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm):
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


def device_tile(xp, spec, ops, mr, mc, mkm):
    """The whole (centered) tile on the device: the host operands moved there, then
    :func:`array_tile`."""
    Xs, Ys, xx, yy, X64, Y64 = (xp.asarray(a) for a in ops)
    if spec.code != LAPLACIAN:      # the exact near pairs need the float64 rows, others not
        X64 = Y64 = None
    return array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, xp.asarray(mr), xp.asarray(mc), mkm)


def array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, mr, mc, mkm: float, *, out=None):
    """The tile ``K'[X, Y]`` (uncentered where ``mr`` is None) with the operands already on
    ``xp``'s device (a worker's resident rows, :mod:`dkha.engine.device`): on CuPy the gaussian
    by one GEMM into ``out`` (a contiguous ``|X| × |Y|`` array of the tile's type, or None) and
    :func:`dkha.tiles.cuda.gpu_gaussian` in place; otherwise :func:`plain_array_tile` (NumPy
    in the tests)."""
    fused = gpu_gaussian(xp) if spec.code == GAUSSIAN else None
    if fused is not None:
        G = xp.matmul(Xs, Ys.T, out=out)
        rows = gpu_gaussian_rows(xp, spec.dtype)
        if rows is not None and rows_sweep(xp, rows, G, xx, yy, mr, mc, mkm, spec.p1):
            return G
        ri, cj = (0.0, 0.0) if mr is None else ((mr - mkm)[:, None], mc[None, :])
        fused(G, xx[:, None], yy[None, :], ri, cj, float(spec.p1), G)
        return G
    if mr is None:
        mr, mc, mkm = xp.zeros(len(Xs)), xp.zeros(len(Ys)), 0.0
    refine = xp.asarray(refine_thresholds(spec, xx, yy))
    if X64 is None:
        X64 = Y64 = xp.zeros((0, 0))
    T = plain_array_tile(xp, spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm)
    if out is None:
        return T
    out[...] = T
    return out


def device_products(xp, spec, ops, mr, mc, mkm, Vd, Wd, TV, TW, rowsum, colsum):
    """:func:`dkha.tiles.tile_product` on the device: the whole tile, then its products (into
    the host arrays ``TV``, ``TW``, ``rowsum``, ``colsum``, those not None)."""
    T = device_tile(xp, spec, ops, mr, mc, mkm)
    if Vd is not None:
        TV[:] = to_host(xp, T @ xp.asarray(Vd))
    if Wd is not None:
        TW[:] = to_host(xp, T.T @ xp.asarray(Wd))
    if rowsum is not None:
        rowsum[:] = to_host(xp, T.sum(axis=1, dtype=xp.float64))
        colsum[:] = to_host(xp, T.sum(axis=0, dtype=xp.float64))


def device_residuals(xp, spec, ops, mr, mc, mkm, Cs, C_rows, C_cols, out):
    """:func:`dkha.tiles.tile_residuals` on the device: one array-function tile."""
    T = device_tile(xp, spec, ops, mr, mc, mkm)
    T = T.astype(xp.float64)
    out[0] = float((T * T).sum())
    for k, C in enumerate(Cs):
        Cd = xp.asarray(C)
        R = T - Cd[:, C_rows].T @ Cd[:, C_cols]
        out[1 + k] = float((R * R).sum())
