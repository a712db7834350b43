"""How much kernel a fit holds at once: block rows, prefetch and tile side from a memory budget.

The large arrays of a fit are not the data or the model (``l × n`` and a few ``r × l``) but the
kernel it streams: blocks of ``b × l`` centered rows, ``prefetch`` of them computed ahead and one
more being applied (with its copy joined from the column groups, or the block before it while
that block's ``C̃`` update finishes beside it), and the square tiles of the
MK row and product passes (``t × t`` with a temporary as large, one per worker thread). With
fixed sizes (256 rows, 4 ahead) the blocks alone took 2 GB at ``l = 200 000``; here they are chosen
so that

* ``(prefetch + 2) · b · l · 8 ≤ budget`` — ``b`` at most ``dkha.block-rows`` (256) and at least
  :data:`MIN_BLOCK_ROWS`, ``prefetch`` at most ``dkha.prefetch`` (4), lowered only when ``b`` is at
  its least;
* ``2 · threads · t² · 8 ≤ budget`` — ``t`` at most ``dkha.tile-rows`` (4096), at least 256;

with ``budget`` = ``dkha.memory-budget`` (1 GiB), or a quarter of the workers' memory limits where
the cluster reports smaller ones (prefetch and tiles only: the block rows decide the steps'
grouping, so they follow the configured budget alone and a run resumes with the same blocks on
any cluster). A block size or prefetch given as an argument is used as given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dask.utils import parse_bytes

from dkha import config
from dkha.errors import ParameterError

#: the fewest rows of a block the budget may choose (a block is one task per column group; below
#: this the tasks' overhead outweighs their kernels)
MIN_BLOCK_ROWS = 16
MIN_TILE_ROWS = 256


@dataclass(frozen=True)
class MemoryPlan:
    """What a row engine holds at once (recorded in a run's ``timings.json`` as ``memory``)."""

    budget: int          # bytes: the configured budget, or less where the workers have less
    block_rows: int
    prefetch: int
    tile_rows: int
    reason: str          # what decided the sizes

    def as_dict(self) -> dict:
        return asdict(self)


def configured_budget() -> int:
    """``dkha.memory-budget`` in bytes (a number or a string such as ``"1GiB"``)."""
    value = config.get("memory-budget")
    try:
        budget = int(parse_bytes(value) if isinstance(value, str) else value)
    except (TypeError, ValueError):
        budget = 0
    if budget <= 0:
        raise ParameterError(f"dkha.memory-budget must be a positive size such as 1GiB, got {value!r}")
    return budget


def workers_budget(client) -> int | None:
    """A quarter of the memory limits the cluster's workers report (None where none does)."""
    if client is None:
        return None
    try:
        workers = client.scheduler_info().get("workers", {}).values()
    except Exception:  # noqa: BLE001 - no scheduler information: the configured budget alone
        return None
    limits = [int(w.get("memory_limit") or 0) for w in workers]
    if not limits or not all(limits):
        return None
    return sum(limits) // 4


def block_rows_for(n_samples: int, block_rows: int | None = None) -> int:
    """Rows per block of the batch stream: ``block_rows`` when given, else the most (up to
    ``dkha.block-rows``) whose blocks in flight fit ``dkha.memory-budget`` (module docstring)."""
    if block_rows is not None:
        return int(block_rows)
    cap = int(config.get("block-rows"))
    prefetch = max(1, int(config.get("prefetch")))
    fit = configured_budget() // ((prefetch + 2) * 8 * max(1, n_samples))
    return int(max(min(cap, MIN_BLOCK_ROWS), min(cap, fit)))


def memory_plan(n_samples: int, client=None, *, threads: int = 1, block_rows: int | None = None,
                prefetch: int | None = None) -> MemoryPlan:
    """Block rows, prefetch and tile side for a row engine over ``n_samples`` samples."""
    budget = configured_budget()
    reported = workers_budget(client)
    reason = f"dkha.memory-budget {budget / 2**20:.0f} MiB"
    if reported is not None and reported < budget:
        budget = reported
        reason = f"a quarter of the workers' memory limits, {budget / 2**20:.0f} MiB"
    b = block_rows_for(n_samples, block_rows)
    block_bytes = 8 * b * max(1, n_samples)
    if prefetch is not None:
        ahead = max(1, int(prefetch))
    else:
        ahead = max(1, int(config.get("prefetch")))
        ahead = max(1, min(ahead, budget // block_bytes - 2))
    cap = int(config.get("tile-rows"))
    t = int((budget / (2 * 8 * max(1, threads))) ** 0.5)
    tile_rows = max(min(cap, MIN_TILE_ROWS), min(cap, t))
    return MemoryPlan(budget=int(budget), block_rows=b, prefetch=ahead, tile_rows=tile_rows,
                      reason=reason)
