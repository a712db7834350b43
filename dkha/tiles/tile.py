"""The tile functions the engine calls, whatever the device: :func:`kernel_tile` (the tile),
:func:`tile_product` (its products, the tile never written out whole), :func:`tile_residuals`;
each dispatches to the CPU's compiled panels (:mod:`dkha.tiles.cpu`) or the array path on the
device (:mod:`dkha.tiles.array`)."""

from __future__ import annotations

import numpy as np

from dkha.tiles.array import device_products, device_residuals, device_tile
from dkha.tiles.codes import GAUSSIAN
from dkha.tiles.cpu import cpu_panel, panel_products, panel_residuals, scratch
from dkha.tiles.devices import array_module, to_host
from dkha.tiles.spec import TileSpec, mk_args, operands, refine_thresholds


def kernel_tile(spec: TileSpec, X, Y, mk_rows=None, mk_cols=None, mkm: float = 0.0,
                *, out_dtype=np.float64, out: np.ndarray | None = None) -> np.ndarray:
    """``K[X, Y]``, centered when ``mk_rows``/``mk_cols`` are given, as a NumPy array of
    ``out_dtype`` (the coordinator's rows: float64; the tile cache may keep the tile precision).

    ``out``: a ``|X| × |Y|`` NumPy array (a view, e.g. a column range of a block's rows) that
    receives the tile and is returned; on the CPU the tile is computed in a per-thread buffer
    and copied in, so the pieces of a block cost no array of their own (an array of a few MB
    is fresh memory each time: a page fault every 4 KiB, :func:`~dkha.tiles.cpu.scratch`)."""
    Xs, Ys, xx, yy, X64, Y64 = operands(spec, X, Y)
    mr, mc = mk_args(len(Xs), len(Ys), mk_rows, mk_cols)
    refine = refine_thresholds(spec, xx, yy)
    xp = array_module(spec.device)
    if xp is np:
        buf = None if out is None else scratch("tile", (len(Xs), len(Ys)), spec.dtype)
        T = cpu_panel(spec, Xs, Ys, xx, yy, X64, Y64, refine, mr, mc, mkm, out=buf)
    else:
        T = to_host(xp, device_tile(xp, spec, (Xs, Ys, xx, yy, X64, Y64), mr, mc, mkm))
    if out is None:
        return T.astype(out_dtype, copy=False)
    out[...] = T
    return out


def tile_product(spec: TileSpec, X, Y, V=None, W=None, mk_rows=None, mk_cols=None,
                 mkm: float = 0.0, *, sums: bool = False):
    """Products of the (centered) tile ``T = K'[X, Y]`` without writing ``T`` out.

    Returns ``(T V, Tᵀ W, T 1, Tᵀ 1)``: ``V`` is ``|Y| × k``, ``W`` is ``|X| × k'`` (each product
    ``None`` when its operand is); with ``sums``, the row and column sums too (else ``None``).
    All float64; the tile is computed ``panel`` rows at a time, each panel multiplied while it is
    in cache (compiled sweep on CPU; one array-function tile on GPU).
    """
    ops = operands(spec, X, Y)
    m, n = len(ops[0]), len(ops[1])
    mr, mc = mk_args(m, n, mk_rows, mk_cols)
    refine = refine_thresholds(spec, ops[2], ops[3])
    dt = spec.dtype
    Vd = None if V is None else np.ascontiguousarray(V, dtype=dt)
    Wd = None if W is None else np.ascontiguousarray(W, dtype=dt)
    TV = None if V is None else np.empty((m, V.shape[1]))
    TW = None if W is None else np.zeros((n, W.shape[1]))
    rowsum = np.empty(m) if sums else None
    colsum = np.zeros(n) if sums else None
    xp = array_module(spec.device)
    if xp is not np:
        device_products(xp, spec, ops, mr, mc, mkm, Vd, Wd, TV, TW, rowsum, colsum)
    else:
        panel_products(spec, ops, refine, mr, mc, mkm, Vd, Wd, TV, TW, rowsum, colsum)
    return TV, TW, rowsum, colsum


def tile_residuals(spec: TileSpec, X, Y, Cs: tuple, C_rows: slice, C_cols: slice,
                   mk_rows=None, mk_cols=None, mkm: float = 0.0) -> np.ndarray:
    """``[‖T‖², ‖T − C[:, rows]ᵀ C[:, cols]‖² for each C of Cs]`` for the (centered) tile
    ``T = K'[X, Y]``, panel by panel (each panel's residuals taken while it is in cache; float64
    sums; on GPU one array-function tile)."""
    ops = operands(spec, X, Y)
    mr, mc = mk_args(len(ops[0]), len(ops[1]), mk_rows, mk_cols)
    refine = refine_thresholds(spec, ops[2], ops[3])
    out = np.zeros(1 + len(Cs))
    xp = array_module(spec.device)
    if xp is not np:
        device_residuals(xp, spec, ops, mr, mc, mkm, Cs, C_rows, C_cols, out)
    else:
        panel_residuals(spec, ops, refine, mr, mc, mkm, Cs, C_rows, C_cols, out)
    return out


def compile_sweeps() -> None:
    """Compile :func:`dkha.tiles.cpu.fused_sweep` for the types the engine's tiles pass it (both
    precisions; whole tiles and panels of a product), on tiny blocks: what the first kernel tile
    of a fit would otherwise compile (``cache=True``: once per environment; see
    :func:`dkha.solvers.warmup.compile_all`)."""
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((6, 3)), rng.standard_normal((5, 3))
    mk6, mk5 = np.zeros(6), np.zeros(5)
    for precision in ("float64", "float32"):
        spec = TileSpec(GAUSSIAN, 0.5, 0.0, 0.0, precision, "cpu")
        kernel_tile(spec, X, Y, mk6, mk5, 0.0)
        tile_product(spec, X, Y, V=np.ones((5, 2)), W=np.ones((6, 2)), mk_rows=mk6,
                     mk_cols=mk5, sums=True)
