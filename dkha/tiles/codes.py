"""The one table of the tiles' kernel codes: which formula a tile evaluates, and what each
device's implementation of it is (:class:`dkha.kernels.Kernel.tile_code` gives a kernel's code and
its parameters ``p1..p3``; every module of :mod:`dkha.tiles` decides on these constants only)."""

from __future__ import annotations

from dataclasses import dataclass

# kernel codes of the tiles (dkha.kernels.Kernel.tile_code); the compiled sweep branches on them
GAUSSIAN, LAPLACIAN, POLYNOMIAL, SIGMOID = 0, 1, 2, 3


@dataclass(frozen=True)
class TileCode:
    """One code of the table: its formula (``d²``: the squared distance, ``g``: the inner
    product), whether the tile needs the rows' squared norms (a distance kernel), and the fused
    implementations beside the CPU's compiled sweep and the array functions every code has."""

    code: int
    formula: str
    distance: bool
    fused: tuple[str, ...] = ()


#: code → its row of the table
CODES: dict[int, TileCode] = {c.code: c for c in (
    TileCode(GAUSSIAN, "exp(−p1 d²)", True,
             ("cuda elementwise", "cuda rows", "triton")),
    TileCode(LAPLACIAN, "exp(−p1 √d²), near pairs recomputed exactly", True),
    TileCode(POLYNOMIAL, "(g + p2)^p1", False),
    TileCode(SIGMOID, "tanh(p1 g + p2)", False),
)}

