"""What every tile function takes: the kernel as a :class:`TileSpec` (code, parameters,
precision, device), the column block prepared once (:class:`Columns`), and the operands in the
tile's precision (float32: shifted by the column block's mean, norms in float64)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.errors import ParameterError
from dkha.names import PRECISIONS
from dkha.tiles.codes import CODES

REFINE_FLOAT64 = 1e-6      # laplacian: recompute pairs with d² ≤ this · (max ‖x‖² + max ‖y‖²)
REFINE_FLOAT32 = 1e-3      # float32: recompute pairs with d² ≤ this · (‖x‖² + ‖y‖²)


def dtype_of(precision: str) -> np.dtype:
    """The floating type of kernel tiles for ``precision`` (``float64`` or ``float32``)."""
    if precision not in PRECISIONS:
        raise ParameterError(f"unknown precision {precision!r}; choose one of "
                             f"{', '.join(PRECISIONS)}")
    return np.dtype(precision)


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
        entry = CODES.get(self.code)
        return entry is not None and entry.distance


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


def operands(spec: TileSpec, X: np.ndarray, Y):
    """``(Xs, Ys, xx, yy, X64, Y64)``: the blocks in the tile's precision (shifted by ``Y``'s
    mean for a distance kernel in float32: distances unchanged, cancellation reduced) and float64
    norms (``Y`` raw or already :func:`prepared <prepare_columns>`), and the float64 rows of
    both."""
    cols = Y if isinstance(Y, Columns) else prepare_columns(spec, Y)
    X = np.asarray(X, dtype=np.float64)
    if cols.shift is not None:
        X = X - cols.shift
    xx = np.einsum("ij,ij->i", X, X) if spec.distance else np.zeros(0)
    Xs = X.astype(np.float32) if spec.dtype == np.float32 else X
    return Xs, cols.Ys, xx, cols.yy, X, cols.Y64


def refine_thresholds(spec: TileSpec, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """Thresholds ``(absolute, relative)`` for recomputing near pairs of the laplacian."""
    if spec.dtype == np.float32:
        return np.array([0.0, REFINE_FLOAT32])
    scale = (float(xx.max()) if len(xx) else 0.0) + (float(yy.max()) if len(yy) else 0.0)
    return np.array([REFINE_FLOAT64 * scale, 0.0])


def mk_args(m: int, n: int, mk_rows, mk_cols):
    """The centering's row and column terms as float64 arrays (zeros where not centered)."""
    mr = np.zeros(m) if mk_rows is None else np.ascontiguousarray(mk_rows, dtype=np.float64)
    mc = np.zeros(n) if mk_cols is None else np.ascontiguousarray(mk_cols, dtype=np.float64)
    return mr, mc
