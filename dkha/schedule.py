"""The sample order p(t): concatenated random permutations, one per pass.

Pass ``k``'s permutation is drawn from a generator seeded by ``(seed, k)``, so any pass (and any
step) can be regenerated on its own: a run is reproducible from its seed, and a resumed run needs
no generator state.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


def pass_permutation(seed: int, pass_index: int, n_samples: int) -> np.ndarray:
    """The order of the samples in pass ``pass_index`` (0-based)."""
    return np.random.default_rng([int(seed), 1, int(pass_index)]).permutation(n_samples)


def init_generator(seed: int) -> np.random.Generator:
    """The generator for a run's random initial state (independent of the schedule's)."""
    return np.random.default_rng([int(seed), 0])


def blocks(seed: int, n_samples: int, n_steps: int, block_rows: int, start_step: int = 0
           ) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(pass_index, first_step, index)`` blocks covering steps ``start_step .. n_steps-1``.

    Blocks never straddle a pass boundary, so per-pass work (eigenvalue refresh) happens between
    blocks.
    """
    l = int(n_samples)
    t = int(start_step)
    while t < n_steps:
        k, pos = divmod(t, l)
        perm = pass_permutation(seed, k, l)
        end_of_pass = min((k + 1) * l, n_steps)
        while t < end_of_pass:
            stop = min(t + block_rows, end_of_pass)
            yield k, t, perm[pos:pos + (stop - t)]
            pos += stop - t
            t = stop
