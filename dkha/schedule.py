"""The sample order p(t), concatenated random permutations, one per pass; and the run's
independent random streams (:class:`Stream`).

Pass ``k``'s permutation is drawn from a generator seeded by ``(seed, SCHEDULE, k)``, so any pass
(and any step) can be regenerated on its own: a run is reproducible from its seed, and a resumed
run needs no generator state.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import numpy as np


class Stream(enum.IntEnum):
    """The independent random streams drawn from one seed: stream ``s`` is
    ``numpy.random.default_rng([seed, s, …])`` (:func:`random_stream`). The numbers fix what a
    seed reproduces (saved runs, resumes, cached centering rows): never renumber one."""

    #: a run's random initial state
    INITIAL_STATE = 0
    #: the sample order, one permutation per pass (:func:`pass_permutation`)
    SCHEDULE = 1
    #: the columns of the Nyström start (:mod:`dkha.fit.init`)
    NYSTROM_COLUMNS = 2
    #: the random start vectors Krylov adds to a given start (:mod:`dkha.fit.krylov`)
    KRYLOV_START = 3
    #: the columns of a sampled MK row (``center_sample``, :mod:`dkha.engine.mkrow`)
    CENTERING_SAMPLE = 4
    #: the patches kept by an image ingest with ``max_samples`` (:mod:`dkha.data.ingest`)
    PATCH_SAMPLE = 5
    #: the Lanczos start vector of the default fit's dense path (:mod:`dkha.fit.dense`)
    DENSE_START = 6
    #: the training windows and SURE's probe of a denoising that chooses its own parameters
    #: (:mod:`dkha.apply.choose`)
    DENOISE_CHOICE = 7


def random_stream(seed: int, stream: Stream, *more: int) -> np.random.Generator:
    """The generator of random stream ``stream`` of ``seed`` (``more``: e.g. a pass index)."""
    return np.random.default_rng([int(seed), int(stream), *(int(m) for m in more)])


def pass_permutation(seed: int, pass_index: int, n_samples: int) -> np.ndarray:
    """The order of the samples in pass ``pass_index`` (0-based)."""
    return random_stream(seed, Stream.SCHEDULE, pass_index).permutation(n_samples)


def init_generator(seed: int) -> np.random.Generator:
    """The generator for a run's random initial state (independent of the schedule's)."""
    return random_stream(seed, Stream.INITIAL_STATE)


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
