"""The worker side of the passes on a GPU: the rows resident on the device, one task per band of
tiles, the products added up on the device.

A pass over the tiles ``I ≤ J`` of ``K'`` (the MK row, a product ``K' V``, the residuals of an
evaluation) is cut into bands of ``t`` rows. The task of band ``I`` computes every tile
``K'[I, J]``, ``J ≥ I``, on the device and keeps what the pass needs of it there: ``K'[I, J]
V[J]`` into the band's rows and, off the diagonal, ``K'[I, J]ᵀ V[I]`` into the rows of ``J``, in a
device array of the rows ``I.start … l`` (:func:`band_task`). The coordinator chains the bands'
arrays in their fixed order (:func:`combine`: the same additions in the same order whatever
ran when, so a pass gives the same bits every time) and brings one ``l × k`` result home
(:func:`to_host`). Nothing of ``X`` travels per task: the worker reads the store once and keeps
its rows on the device (:func:`resident_rows`: the tiles' operands in the tile precision, their
float64 squared norms), as :func:`dkha.engine.tasks.load_rows` keeps host chunks. ``V`` goes to
the device once per pass (:func:`_on_device`), the MK row once per task.

A tile is one GEMM and one fused elementwise kernel (distance, exp and centering in place:
:func:`dkha.tiles.array_tile`); each worker thread has its own non-blocking CUDA stream, and at
most ``dkha.gpu-streams`` tasks use the device at once (the others wait for a slot), so one
band's products overlap the next band's GEMM. The same functions run with NumPy behind them where
the kernel's device is ``cpu`` (the tests; ``dkha.band-passes: true``), with no stream.

Worker-side rules (docs/architecture.md): module-level functions of blocks and scalars; an
explicit per-process cache of the rows; no import of the coordinator, xarray or the CLI.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from dkha import tiles
from dkha.engine.tasks import load_all_rows, store_key
from dkha.kernels import Kernel
from dkha.tiles import triton_gaussian

# --- what a GPU worker has ------------------------------------------------------------------------


def device_info(device: str, code: int | None = None, precision: str = "float64") -> dict:
    """This worker's device for the plan: ``{"kind", "name", "free", "total", "products"}``
    (bytes; the host's memory stands in for a ``cpu`` device; ``products``: what computes the
    products and sums of tiles of kernel ``code`` in ``precision`` here, the fused Triton
    kernel or the CuPy/NumPy tile, and why)."""
    xp = tiles.array_module(device)
    if xp is np:
        import psutil

        vm = psutil.virtual_memory()
        info = {"kind": "cpu", "name": "cpu", "free": int(vm.available), "total": int(vm.total)}
    else:
        free, total = xp.cuda.runtime.memGetInfo()
        props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
        name = props["name"]
        info = {"kind": "cuda", "name": name.decode() if isinstance(name, bytes) else str(name),
                "free": int(free), "total": int(total)}
    if code is not None:
        info["products"] = triton_gaussian.serves(code, precision, info["kind"])[1]
    return info


# --- rows resident on the device (per process) ----------------------------------------------------


@dataclass
class Resident:
    """A store's rows on the device as the tiles take them: ``X`` in the tile precision (for a
    distance kernel in float32, shifted by the rows' mean: distances unchanged, the cancellation
    of ``‖x‖² + ‖y‖² − 2 x·y`` reduced), ``norms`` their float64 squared norms (distance
    kernels), ``X64`` the float64 rows where the laplacian's near pairs need them."""

    X: object
    norms: object
    X64: object


_RESIDENT: dict = {}
_RESIDENT_LOCK = threading.Lock()
#: resident row sets kept per process (a fit uses one, its exact evaluation a float64 second)
RESIDENT_KEPT = 2


def resident_rows(path, kernel: Kernel, n_samples: int) -> Resident:
    """The rows of ``path`` (a store, or rows held in memory) prepared for ``kernel``'s tiles on
    its device, read and moved once per process and kept (:data:`RESIDENT_KEPT` sets)."""
    spec = kernel.tile_spec()
    key = (store_key(path), n_samples, kernel, spec.dtype.str, spec.device)
    with _RESIDENT_LOCK:
        got = _RESIDENT.get(key)
        if got is not None:
            return got[1]
        xp = tiles.array_module(spec.device)
        # prepared as the column blocks of the CPU's tiles are (precision, shift, norms)
        cols = tiles.prepare_columns(spec, kernel.tile_inputs(load_all_rows(path, n_samples)))
        res = Resident(xp.asarray(cols.Ys), xp.asarray(cols.yy),
                       xp.asarray(cols.Y64) if spec.code == tiles.LAPLACIAN else None)
        _settle(xp)
        _RESIDENT[key] = (path, res)        # the path (an array too) kept: its id is not reused
        while len(_RESIDENT) > RESIDENT_KEPT:
            _RESIDENT.pop(next(iter(_RESIDENT)))
        return res


def drop_resident() -> None:
    """Free the rows kept on this process's device (and the operands of the last passes)."""
    with _RESIDENT_LOCK:
        _RESIDENT.clear()
    _OPERANDS.clear()


_OPERANDS: dict = {}
_OPERANDS_LOCK = threading.Lock()


def _on_device(xp, array: np.ndarray, dtype):
    """``array`` on the device in ``dtype``, moved once for every task of a pass that takes the
    same array (keyed by its identity, the array kept referenced meanwhile)."""
    if xp is np:
        return np.asarray(array, dtype=dtype)
    key = (id(array), array.__array_interface__["data"][0], array.shape, np.dtype(dtype).str)
    with _OPERANDS_LOCK:
        got = _OPERANDS.get(key)
        if got is None:
            got = (array, xp.asarray(np.ascontiguousarray(array, dtype=dtype)))
            _settle(xp)     # complete before another thread's stream reads it
            _OPERANDS[key] = got
            while len(_OPERANDS) > 4:
                _OPERANDS.pop(next(iter(_OPERANDS)))
        return got[1]


def _settle(xp) -> None:
    """Wait for this thread's stream (a copy to the device that other streams will read)."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


# --- streams and slots ----------------------------------------------------------------------------

_THREAD = threading.local()
_SLOTS: dict = {}
_SLOTS_LOCK = threading.Lock()


@contextlib.contextmanager
def device_slot(xp, streams: int):
    """One of ``streams`` slots of the device (``dkha.gpu-streams``, in the task), used on this
    thread's own non-blocking stream (synchronised before the slot is given back); nothing for
    NumPy."""
    if xp is np:
        yield
        return
    n = max(1, int(streams))
    with _SLOTS_LOCK:
        slots = _SLOTS.setdefault(n, threading.BoundedSemaphore(n))
    stream = getattr(_THREAD, "stream", None)
    if stream is None:
        stream = _THREAD.stream = xp.cuda.Stream(non_blocking=True)
    with slots:
        with stream:
            yield
        stream.synchronize()


# --- one band of tiles ----------------------------------------------------------------------------


def _tile(xp, spec, res: Resident, rows: slice, cols: slice, mk, mkm: float, buf):
    """``K'[rows, cols]`` (``mk`` None: uncentered) in ``buf``'s memory: a GEMM into it, then one
    elementwise kernel in place (:func:`dkha.tiles.array_tile`)."""
    m, n = rows.stop - rows.start, cols.stop - cols.start
    out = buf[:m * n].reshape(m, n)
    if mk is None:
        mr = mc = None
    else:
        mr, mc = mk[rows], mk[cols]
    norms = res.norms
    return tiles.array_tile(
        xp, spec, res.X[rows], res.X[cols],
        norms[rows] if len(norms) else norms, norms[cols] if len(norms) else norms,
        None if res.X64 is None else res.X64[rows], None if res.X64 is None else res.X64[cols],
        mr, mc, mkm, out=out)


def band_task(path, kernel: Kernel, n_samples: int, start: int, stop: int, side: int,
              streams: int, kind: str, mk: np.ndarray | None = None, mkm: float = 0.0, V=None,
              Cs=None):
    """The band ``start:stop`` of a pass over the tiles ``I ≤ J`` (module docstring), on the
    kernel's device, one of its ``streams`` (:func:`device_slot`). ``kind``:

    * ``"sums"`` — the uncentered kernel's column sums, and row sums off the diagonal: a vector
      of the rows ``start … l`` (the MK row's part, ``mk`` unused);
    * ``"product"`` — ``K' V``'s part: an array of the rows ``start … l`` by ``V``'s columns;
    * ``"residuals"`` — ``[‖T‖², ‖T − C[:, I]ᵀ C[:, J]‖² for C in Cs]`` over the band's tiles
      (both halves off the diagonal).

    Returned on the device (the pass's :func:`combine` adds it there).
    """
    spec = kernel.tile_spec()
    xp = tiles.array_module(spec.device)
    res = resident_rows(path, kernel, n_samples)
    l = n_samples
    fused = (kind != "residuals" and xp is not np
             and triton_gaussian.serves(spec.code, spec.dtype, "cuda")[0])
    with device_slot(xp, streams):
        mk_d = None if mk is None else xp.asarray(np.asarray(mk, dtype=np.float64))
        if fused:
            return _fused_band(xp, spec, res, start, stop, l, kind, mk_d, mkm,
                               None if V is None else _on_device(xp, V, spec.dtype))
        if kind == "product":
            Vd = _on_device(xp, V, spec.dtype)
            out = xp.zeros((l - start, V.shape[1]))
        elif kind == "sums":
            out = xp.zeros(l - start)
        else:
            Cd = [_on_device(xp, C, np.float64) for C in Cs]
            out = xp.zeros(1 + len(Cs))
        buf = xp.empty(min(side, stop - start) * min(side, l - start), dtype=spec.dtype)
        ones = (xp.ones(side) if kind == "sums" and spec.dtype == np.float64 else None)
        rows = slice(start, stop)
        for c in range(start, l, side):
            cols = slice(c, min(c + side, l))
            T = _tile(xp, spec, res, rows, cols, mk_d, mkm, buf)
            here, there = slice(0, stop - start), slice(c - start, cols.stop - start)
            diagonal = c == start
            if kind == "product":       # T kept C-contiguous: (V_Iᵀ T)ᵀ for Tᵀ V_I
                out[here] += T @ Vd[cols]
                if not diagonal:
                    out[there] += (Vd[rows].T @ T).T
            elif ones is not None:          # float64 sums: products with ones (cuBLAS GEMV)
                out[there] += ones[:T.shape[0]] @ T
                if not diagonal:
                    out[here] += T @ ones[:T.shape[1]]
            elif kind == "sums":            # float32 tiles: summed in float64
                out[there] += T.sum(axis=0, dtype=xp.float64)
                if not diagonal:
                    out[here] += T.sum(axis=1, dtype=xp.float64)
            else:
                w = 1.0 if diagonal else 2.0
                T = T.astype(xp.float64, copy=False)
                out[0] += w * xp.vdot(T, T)
                for m, C in enumerate(Cd):
                    R = T - C[:, rows].T @ C[:, cols]
                    out[1 + m] += w * xp.vdot(R, R)
    return out


def _fused_band(xp, spec, res: Resident, start: int, stop: int, l: int, kind: str, mk, mkm,
                Vd):
    """:func:`band_task`'s product or sums by the fused Triton kernel (the tiles never stored):
    the band's rows against the columns ``start … l`` into its own rows, and the rows after the
    band against the band's columns (``K'[J, I] = K'[I, J]ᵀ``) into theirs — the same sums as the
    tile loop's, each tile's values computed twice instead of stored. Centered with ``mk`` as
    the tiles are; ``sums``: the uncentered row sums. On this thread's CuPy stream."""
    import torch

    def t(a):
        return torch.as_tensor(a, device="cuda")

    X, nrm = res.X, res.norms
    shape = (l - start,) if kind == "sums" else (l - start, Vd.shape[1])
    out = xp.zeros(shape)
    ot = t(out)
    stream = torch.cuda.ExternalStream(xp.cuda.get_current_stream().ptr)
    with torch.cuda.stream(stream):
        for rows, cols, at in ((slice(start, stop), slice(start, l), 0),
                               (slice(stop, l), slice(start, stop), stop - start)):
            if rows.start >= rows.stop:
                continue
            ri = cj = None
            if kind == "product" and mk is not None:
                ri, cj = t(mk[rows] - mkm), t(mk[cols])
            KV, sums = triton_gaussian.gaussian_product(
                t(X[rows]), t(X[cols]), t(nrm[rows]), t(nrm[cols]), spec.p1,
                None if kind == "sums" else t(Vd[cols]), ri, cj, rowsum=kind == "sums")
            ot[at:at + rows.stop - rows.start] = sums if kind == "sums" else KV
    return out


def combine(partial, shape: tuple, starts: tuple, streams: int, *parts):
    """``partial + parts``, each part added to the rows from its start on (``out[s:] += part``),
    one after the other in the order given (``partial`` None: zeros of ``shape``): the chain of a
    pass, on the device that holds the parts. The same additions in the same order whatever the
    grouping into tasks, so the same bits."""
    xp = tiles.array_module_of(parts[0])
    with device_slot(xp, streams):
        out = xp.zeros(shape) if partial is None else partial.copy()
        for s, part in zip(starts, parts):
            out[s:s + len(part)] += part
    return out


def to_host(partial) -> np.ndarray:
    """The pass's result as a NumPy array."""
    xp = tiles.array_module_of(partial)
    return tiles.to_host(xp, partial)
