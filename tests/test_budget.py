"""Memory bounded by default: block rows, prefetch and tile side from dkha.memory-budget."""

from __future__ import annotations

import sys

import dask.config
import numpy as np
import pytest

from dkha import KernelHebbianPCA
from dkha.engine.budget import MIN_BLOCK_ROWS, block_rows_for, memory_plan

MiB = 2**20


class FakeClient:
    """What memory_plan reads of a client: the workers' memory limits."""

    def __init__(self, *limits):
        self.limits = limits

    def scheduler_info(self):
        return {"workers": {f"w{i}": {"memory_limit": m, "nthreads": 1}
                            for i, m in enumerate(self.limits)}}


def test_block_rows_and_prefetch_shrink_as_l_grows():
    sizes = (1_000, 20_000, 113_270, 200_000, 1_000_000, 10_000_000)
    with dask.config.set({"dkha.memory-budget": "512MiB", "dkha.block-rows": 256,
                          "dkha.prefetch": 4}):
        plans = [memory_plan(l, threads=2) for l in sizes]
    rows = [p.block_rows for p in plans]
    ahead = [p.prefetch for p in plans]
    assert rows[:2] == [256, 256] and ahead[:2] == [4, 4]       # small l: the caps
    assert all(a >= b for a, b in zip(rows, rows[1:])) and rows[2] < 256
    assert all(a >= b for a, b in zip(ahead, ahead[1:])) and ahead[-1] < 4
    for l, p in zip(sizes, plans):
        held = (p.prefetch + 2) * p.block_rows * l * 8
        assert held <= 512 * MiB or (p.block_rows == MIN_BLOCK_ROWS and p.prefetch == 1)
        assert 2 * 2 * p.tile_rows ** 2 * 8 <= 512 * MiB
    # the largest block that fits: one more row would not
    p = plans[3]
    assert (p.prefetch + 2) * (p.block_rows + 1) * 200_000 * 8 > 512 * MiB


def test_given_sizes_are_used_as_given():
    with dask.config.set({"dkha.memory-budget": "64MiB"}):
        p = memory_plan(200_000, block_rows=300, prefetch=6)
        assert (p.block_rows, p.prefetch) == (300, 6)
        assert block_rows_for(200_000, 300) == 300
        assert block_rows_for(200_000) < 256


def test_workers_memory_limits_lower_the_budget_but_not_the_blocks():
    with dask.config.set({"dkha.memory-budget": "1GiB"}):
        roomy = memory_plan(150_000, FakeClient(8 * 2**30, 8 * 2**30), threads=2)
        tight = memory_plan(150_000, FakeClient(400 * MiB, 400 * MiB), threads=2)
    assert roomy.budget == 2**30 and "dkha.memory-budget" in roomy.reason
    assert tight.budget == 200 * MiB and "workers" in tight.reason
    # the blocks group the steps: they follow the configured budget (a resume elsewhere matches)
    assert tight.block_rows == roomy.block_rows
    assert tight.prefetch < roomy.prefetch and tight.tile_rows < roomy.tile_rows


def test_fit_records_the_plan_and_matches_the_same_blocks_given(digits_store, client, seed):
    """A tight budget picks smaller blocks; the fit is the fit with those blocks given, and
    the run records the plan."""
    l = digits_store.n_samples
    kw = dict(algorithm="kha-smd", sigma=4.0, passes=1, seed=seed, init="random",
              evaluate_every=-1, client=client)
    with dask.config.set({"dkha.memory-budget": 6 * 8 * l * 40}):      # 40 rows, 4 ahead
        budgeted = KernelHebbianPCA(4, **kw).fit(digits_store.path)
    plan = budgeted.timings_["memory"]
    assert (plan["block_rows"], plan["prefetch"]) == (40, 4)
    given = KernelHebbianPCA(4, block_rows=40, **kw).fit(digits_store.path)
    np.testing.assert_array_equal(budgeted.alpha_, given.alpha_)
    default = KernelHebbianPCA(4, **kw).fit(digits_store.path)
    assert default.timings_["memory"]["block_rows"] == 256


def test_memory_budget_accepts_numbers_and_strings():
    with dask.config.set({"dkha.memory-budget": 3 * 2**30}):
        a = memory_plan(500_000)
    with dask.config.set({"dkha.memory-budget": "3GiB"}):
        b = memory_plan(500_000)
    assert a == b and a.budget == 3 * 2**30
    with dask.config.set({"dkha.memory-budget": "lots"}), \
            pytest.raises(ValueError, match="dkha.memory-budget"):
        memory_plan(500_000)


def test_nystrom_landmark_rows_count_against_the_budget(digits_store, client):
    """While the landmark rows are held the stream runs fewer blocks ahead (the rows and the
    blocks in flight within the budget), the rows equal those of the full prefetch, and the
    engine's prefetch is restored after."""
    from dkha.engine.rows import RowEngine
    from dkha.fit.init import landmark_prefetch, landmark_rows
    from dkha.kernels import make_kernel

    l, m = digits_store.n_samples, 200
    kernel = make_kernel("gaussian", sigma=4.0)
    with dask.config.set({"dkha.memory-budget": 8 * l * (m + 6 * 16)}):   # rows + 6 blocks of 16
        engine = RowEngine(digits_store, kernel, client, block_rows=16, prefetch=4)
        engine.compute_mk(cache=False)
        assert landmark_prefetch(engine, 0) == 4
        assert landmark_prefetch(engine, 8 * l * m) == 4            # 6 blocks still fit
        assert landmark_prefetch(engine, 8 * l * (m + 48)) == 1     # 3 fit: one ahead
        seen = []
        stream = engine.stream

        def spy(blocks, solver=None):
            seen.append(engine.prefetch)
            return stream(blocks, solver)

        engine.stream = spy
        with dask.config.set({"dkha.memory-budget": 8 * l * (m + 3 * 16)}):
            tight = RowEngine(digits_store, kernel, client, block_rows=16, prefetch=4)
        tight.set_mk(engine.mk, engine.mkm)
        tight_stream = tight.stream
        tight.stream = lambda blocks, solver=None: (seen.append(tight.prefetch),
                                                    tight_stream(blocks, solver))[1]
        M, rows = landmark_rows(tight, m, seed=0)
        assert seen == [1] and tight.prefetch == 4
        M2, want = landmark_rows(engine, m, seed=0)
        assert seen[-1] == 4
        np.testing.assert_array_equal(M, M2)
        np.testing.assert_array_equal(rows, want)


def test_default_landmarks_fill_at_most_half_the_budget():
    """The default Nyström start holds its m × l landmark rows whole: at most half the budget
    (640 rows at l = 200 000 took the fit's peak to 2.3 GiB), never fewer than 2 r."""
    from dkha.estimators.batch import start_of
    from dkha.solvers.batch import default_landmarks

    assert default_landmarks(1797, 16) == 640                  # no budget: 40 r
    assert default_landmarks(1797, 16, budget=2**30) == 640    # small l: not limited
    assert default_landmarks(200_000, 16, budget=2**30) == 2**30 // (16 * 200_000) == 335
    assert default_landmarks(1_000_000, 20, budget=2**30) == 67
    assert default_landmarks(10_000_000, 20, budget=2**30) == 40    # 2 r
    with dask.config.set({"dkha.memory-budget": "1GiB"}):
        assert start_of(None, "kha-smd", 200_000, 16) == ("nystrom", 335)
        assert start_of(None, "kha-smd", 1797, 16) == ("nystrom", 640)
    with dask.config.set({"dkha.memory-budget": "4GiB"}):
        assert start_of(None, "kha-smd", 200_000, 16) == ("nystrom", 640)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kernel_blocks_come_from_the_heap_here_and_in_the_workers_dkha_starts():
    """``dkha.heap-blocks``: glibc takes the settings in this process (mallopt accepts them), and
    the worker processes dkha starts get the same settings in their environment."""
    import os

    from dkha.engine.cluster import HEAP_BLOCKS, Where, client_for, heap_blocks

    assert heap_blocks()
    with dask.config.set({"dkha.heap-blocks": False}):
        assert not heap_blocks()
    with client_for(Where(workers=2)) as client:
        envs = client.run(lambda: {k: os.environ.get(k) for k in HEAP_BLOCKS})
    assert len(envs) == 2
    for env in envs.values():
        assert env == {k: str(v) for k, v in HEAP_BLOCKS.items()}
