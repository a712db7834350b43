"""The plan from the hardware: memory bounded by default (block rows and prefetch from
dkha.memory-budget), tiles and tasks from the workers' threads and memory."""

from __future__ import annotations

import itertools
import math
import sys

import dask.config
import numpy as np
import pytest

from dkha import KernelHebbianPCA, config
from dkha.engine.budget import (
    MIN_BLOCK_ROWS,
    STREAM_BYTES,
    Hardware,
    Layout,
    block_rows_for,
    memory_plan,
)

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
        plans = [memory_plan(l, config.settings(), threads=2) for l in sizes]
    rows = [p.block_rows for p in plans]
    ahead = [p.prefetch for p in plans]
    assert rows[:2] == [256, 256] and ahead[:2] == [4, 4]       # small l: the caps
    assert all(a >= b for a, b in itertools.pairwise(rows)) and rows[2] < 256
    assert all(a >= b for a, b in itertools.pairwise(ahead)) and ahead[-1] < 4
    for l, p in zip(sizes, plans):
        held = (p.prefetch + 2) * p.block_rows * l * 8
        assert held <= 512 * MiB or (p.block_rows == MIN_BLOCK_ROWS and p.prefetch == 1)
        # each of the 2 threads holds a tile's rows, their copies and a panel (64 rows)
        assert 2 * p.tile_rows * 8 * (4 * 1 + 64) <= 512 * MiB
    # the largest block that fits: one more row would not
    p = plans[3]
    assert (p.prefetch + 2) * (p.block_rows + 1) * 200_000 * 8 > 512 * MiB


def test_given_sizes_are_used_as_given():
    with dask.config.set({"dkha.memory-budget": "64MiB"}):
        p = memory_plan(200_000, config.settings(), block_rows=300, prefetch=6)
        assert (p.block_rows, p.prefetch) == (300, 6)
        assert block_rows_for(200_000, config.settings(), 300) == 300
        assert block_rows_for(200_000, config.settings()) < 256


def test_workers_memory_limits_lower_the_budget_but_not_the_blocks():
    with dask.config.set({"dkha.memory-budget": "1GiB"}):
        roomy = memory_plan(150_000, config.settings(), FakeClient(8 * 2**30, 8 * 2**30), threads=2)
        tight = memory_plan(150_000, config.settings(), FakeClient(400 * MiB, 400 * MiB), threads=2)
    assert roomy.budget == 2**30 and "dkha.memory-budget" in roomy.reason
    assert tight.budget == 200 * MiB and "workers" in tight.reason
    # the blocks group the steps: they follow the configured budget (a resume elsewhere matches)
    assert tight.block_rows == roomy.block_rows
    assert tight.prefetch < roomy.prefetch
    assert (roomy.worker_budget, tight.worker_budget) == (2**30, 200 * MiB)


GiB = 2**30
L = 1_000_000


def bands_by_the_rule(l, n_features=121, cap=16384, budget=GiB, threads=16):
    """The layout's rule, computed here: planned for 16 threads within 1 GiB whatever the
    cluster: at least 16 tiles a thread, the diagonal ones counted as halves (n²/2 ≥ 16·16);
    a side of at most 16 384 rows and of what the budget gives a thread (its rows, their
    copies, a panel of 64 rows: 8·(4n + 64) bytes a row)."""
    least = math.ceil(math.sqrt(32 * threads))
    side = min(cap, budget // (threads * 8 * (4 * n_features + 64)))
    return max(least, math.ceil(l / side))


@pytest.mark.parametrize("workers,threads,memory", [
    (1, 16, 128 * GiB), (16, 16, 128 * GiB), (1, 2, 24 * GiB), (1, 64, None), (4, 64, 16 * GiB)])
def test_the_tiles_at_a_million_samples_are_the_layouts_and_the_tasks_follow_the_workers(
        workers, threads, memory):
    """The tile grid (the arithmetic: which partial sums are added, in which order) is the same
    on every cluster; the tasks a pass takes follow the threads, about 16 a thread."""
    hardware = Hardware.described(workers, threads, memory)
    p = memory_plan(L, config.settings(), hardware=hardware, n_features=121)
    n = bands_by_the_rule(L)
    assert p.bands == n and p.tiles == n * (n + 1) // 2 and p.layout_reason.startswith("layout")
    # a task at most a tile of 16 384 rows' entries: tiles of 15 152 rows are a task each
    assert p.tiles_per_task == 1 and p.tasks == p.tiles
    assert p.tile_rows == math.ceil(L / n) and (n - 1) * p.tile_rows < L
    assert p.worker_budget == (max(GiB, memory // 4) if memory else GiB)
    # the blocks: the stream's default budget whatever the workers, (2 + 2)·16·l·8 ≤ 512 MiB
    assert (p.block_rows, p.prefetch, p.budget) == (memory_plan(L, config.settings()).block_rows,
                                                    2, STREAM_BYTES)
    assert hardware.threads == threads


def test_the_plan_at_a_million_samples_in_one_line():
    p = memory_plan(L, config.settings(), hardware=Hardware.described(1, 16, 128 * GiB),
                    n_features=121)
    assert p.tiles == 2211 and p.tile_rows == 15152 and p.worker_budget == 32 * GiB
    line = p.describe()
    # the blocks (the steps' grouping) stay those of the stream's default budget, 512 MiB: below
    # 16 rows at 4 ahead ((4 + 2)·b·l·8 ≤ 512 MiB: b = 11), so 16 rows and 2 ahead
    assert STREAM_BYTES == 512 * MiB and STREAM_BYTES // (6 * 8 * L) == 11
    assert STREAM_BYTES // (16 * 8 * L) - 2 == 2
    assert line.startswith("plan: 16 CPU threads in 1 worker (128 GiB), 2 211 tiles of 15 152 "
                           "rows (layout for 16 threads) in 2 211 tasks, blocks of 16 rows, "
                           "2 ahead (512 MiB: the stream's default)"), line
    assert "tiles within 32 GiB (a quarter of the workers' memory)" in line
    many = memory_plan(L, config.settings(), hardware=Hardware.described(16, 16, 128 * GiB),
                       n_features=121)
    assert "16 CPU threads in 16 workers (128 GiB)" in many.describe()
    d = p.as_dict()
    assert (d["tiles"], d["tasks"], d["hardware"]["threads"], d["device"]) == (2211, 2211, 16,
                                                                               "cpu")
    # the same 276 tiles of 2 174 rows at 50 000 for 16 threads and for one: one a task for
    # 16 threads (91 of 4 096 had left the last wave idle), 17 a task for one (about 16 tasks
    # a thread, each well within the entries of a tile of 16 384 rows)
    big = memory_plan(50_000, config.settings(), hardware=Hardware.described(16, 16, 128 * GiB),
                      n_features=121)
    one = memory_plan(50_000, config.settings(), hardware=Hardware.described(1, 1, 8 * GiB),
                      n_features=121)
    assert big.tiles == one.tiles == 276 and big.tile_rows == one.tile_rows == 2174
    assert (big.tasks, one.tiles_per_task, one.tasks) == (276, 17, 17)


def test_a_recorded_layout_is_kept_and_one_that_does_not_fit_is_planned_again():
    """A resume gives back the layout its run recorded, whatever the cluster now; where a
    worker's memory cannot hold a tile a thread, the grid is planned again, and the plan says
    so (the bits then differ)."""
    settings = config.settings()
    recorded = Layout(bands=40, column_groups=3)
    p = memory_plan(L, settings, hardware=Hardware.described(1, 2, 8 * GiB), n_features=121,
                    layout=recorded)
    assert p.bands == 40 and p.layout_reason == "the run's recorded layout"
    assert Layout.from_dict(recorded.as_dict()) == recorded and Layout.from_dict(None) is None
    # 64 threads in 2 GiB: a quarter (512 MiB) holds 64 tiles of 67 MiB? no
    small = memory_plan(L, settings, hardware=Hardware.described(1, 64, 2 * GiB),
                        n_features=121, layout=recorded)
    assert small.bands > 40 and small.layout_reason.startswith("planned again: a worker of 64 "
                                                               "threads and 2 GiB")
    assert "bits differ" in small.describe()


def test_a_recorded_prefetch_is_kept_where_it_fits_and_lowered_and_said_where_not():
    """With worker projections the blocks computed ahead are the fit's arithmetic: a resume
    takes the recorded prefetch, fewer or more than the budget now would plan, where it fits
    (the block rows given), and lowers it where it does not, saying the bits then differ."""
    host, b = Hardware.described(1, 2, 8 * GiB), 40
    block = 8 * b * L
    with dask.config.set({"dkha.memory-budget": 5 * block}):       # 3 ahead fit, 4 asked
        fresh = memory_plan(L, config.settings(), hardware=host, block_rows=b)
        assert fresh.prefetch == 3
        kept = memory_plan(L, config.settings(), hardware=host, block_rows=b,
                           layout=Layout(bands=40, column_groups=3, prefetch=1))
        assert kept.prefetch == 1 and kept.layout_reason == "the run's recorded layout"
        lowered = memory_plan(L, config.settings(), hardware=host, block_rows=b,
                              layout=Layout(bands=40, column_groups=3, prefetch=4))
    assert lowered.prefetch == 3 and "4 blocks ahead, as recorded, do not fit" in \
        lowered.layout_reason and "bits differ" in lowered.describe()
    recorded = Layout(bands=40, column_groups=3, prefetch=2)
    assert Layout.from_dict(recorded.as_dict()) == recorded
    assert Layout.from_dict({"bands": 4, "column_groups": 2}).prefetch is None   # older runs


def test_a_budget_set_by_the_user_wins_over_the_workers():
    host = Hardware.described(1, 16, 128 * GiB)
    with dask.config.set({"dkha.memory-budget": "256MiB"}):
        p = memory_plan(L, config.settings(), hardware=host, n_features=121)
    assert p.worker_budget == p.budget == 256 * MiB and p.worker_reason == "dkha.memory-budget"
    side = 256 * MiB // (16 * 8 * (4 * 121 + 64))
    assert p.bands == math.ceil(L / side)


def test_fit_records_the_plan_and_matches_the_same_blocks_given(digits_store, client, seed):
    """A tight budget picks smaller blocks; the fit is the fit with those blocks given, and
    the run records the plan."""
    l = digits_store.n_samples
    kw = dict(algorithm="kha-smd", sigma=4.0, passes=1, seed=seed, init="random",
              evaluate_every=-1, client=client)
    # 40 rows, 4 ahead; the MK row computed here (not read from the store's cache, which a
    # test run earlier in this process may have filled): its pass shows the plan's tasks
    with dask.config.set({"dkha.memory-budget": 6 * 8 * l * 40, "dkha.mk-cache": False}):
        budgeted = KernelHebbianPCA(4, **kw).fit(digits_store.path)
    plan = budgeted.timings_["memory"]
    assert (plan["block_rows"], plan["prefetch"]) == (40, 4)
    assert budgeted.timings_["plan"].startswith(f"plan: {plan['hardware']['threads']} CPU thread")
    mk = [p for p in budgeted.timings_["passes"] if p["kind"] == "mk"]
    assert [p["tasks"] for p in mk] == [plan["tasks"]] and plan["tasks"] == plan["tiles"] > 1
    given = KernelHebbianPCA(4, block_rows=40, **kw).fit(digits_store.path)
    np.testing.assert_array_equal(budgeted.alpha_, given.alpha_)
    default = KernelHebbianPCA(4, **kw).fit(digits_store.path)
    assert default.timings_["memory"]["block_rows"] == 256


def test_memory_budget_accepts_numbers_and_strings():
    with dask.config.set({"dkha.memory-budget": 3 * 2**30}):
        a = memory_plan(500_000, config.settings())
    with dask.config.set({"dkha.memory-budget": "3GiB"}):
        b = memory_plan(500_000, config.settings())
    assert a == b and a.budget == 3 * 2**30
    with dask.config.set({"dkha.memory-budget": "lots"}), \
            pytest.raises(ValueError, match="dkha.memory-budget"):
        memory_plan(500_000, config.settings())


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
        engine = RowEngine(digits_store, kernel, client,
                           config.settings(), block_rows=16, prefetch=4)
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
            tight = RowEngine(digits_store, kernel, client,
                              config.settings(), block_rows=16, prefetch=4)
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
        assert start_of(None, "kha-smd", 200_000, 16, config.settings()) == ("nystrom", 335)
        assert start_of(None, "kha-smd", 1797, 16, config.settings()) == ("nystrom", 640)
    with dask.config.set({"dkha.memory-budget": "4GiB"}):
        assert start_of(None, "kha-smd", 200_000, 16, config.settings()) == ("nystrom", 640)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kernel_blocks_come_from_the_heap_here_and_in_the_workers_dkha_starts():
    """``dkha.heap-blocks``: glibc takes the settings in this process (mallopt accepts them), and
    the worker processes dkha starts get the same settings in their environment."""
    import os

    from dkha.engine.cluster import HEAP_BLOCKS, Where, client_for, heap_blocks

    assert heap_blocks(config.settings())
    with dask.config.set({"dkha.heap-blocks": False}):
        assert not heap_blocks(config.settings())
    with client_for(Where(workers=2), settings=config.settings()) as client:
        envs = client.run(lambda: {k: os.environ.get(k) for k in HEAP_BLOCKS})
    assert len(envs) == 2
    for env in envs.values():
        assert env == {k: str(v) for k, v in HEAP_BLOCKS.items()}


def test_the_streams_default_budget_is_below_the_tiles_and_the_starts():
    """Issue 41: the blocks in flight get 512 MiB by default (at l = 200 000 blocks of 55 rows,
    4 ahead: (4 + 2)·55·l·8 ≤ 512 MiB, where 1 GiB gave 111 rows and the fit's peak 2.3 GiB of
    all processes); the tiles' layout and the Nyström start keep the 1 GiB floor (their bits,
    and the start's landmarks, do not change)."""
    from dkha.engine.budget import FLOOR_BYTES, configured_budget, layout_bands
    from dkha.solvers.batch import default_landmarks

    settings = config.settings()
    p = memory_plan(200_000, settings, threads=2, n_features=16)
    assert (p.block_rows, p.prefetch, p.budget) == (55, 4, STREAM_BYTES) == (55, 4, 512 * MiB)
    assert 6 * 55 * 200_000 * 8 <= 512 * MiB < 6 * 56 * 200_000 * 8
    assert "the stream's default" in p.describe()
    assert block_rows_for(43_690, settings) == 256 and block_rows_for(43_691, settings) == 255
    assert configured_budget(settings) == FLOOR_BYTES == GiB
    assert default_landmarks(200_000, 16, budget=configured_budget(settings)) == 335
    with dask.config.set({"dkha.memory-budget": "1GiB"}):
        assert layout_bands(200_000, 121, config.settings(), Hardware())[0] == \
            layout_bands(200_000, 121, settings, Hardware())[0]
        assert block_rows_for(200_000, config.settings()) == 111


def test_the_start_is_let_go_before_the_block_stream(digits_store, client, seed, monkeypatch):
    """The Nyström start's ``A`` and ``C = A K'`` (r × l each) are dropped once the solver holds
    its copies: the coordinator's and run_batches' names kept them for the whole stream (61 MiB
    at l = 200 000, r = 20)."""
    import gc
    import time
    import weakref

    from dkha.fit import coordinator, kha_stream

    refs, seen = [], []
    real_start, real_stream = coordinator.start, kha_stream._SharedStream.stream

    def start(*args, **kw):
        out = real_start(*args, **kw)
        refs.extend(weakref.ref(a) for a in out[1:3] if a is not None)
        return out

    def stream(self, *args, **kw):
        # what only holds them a moment longer (a reference cycle, the cluster's threads) is
        # given up to 30 s (a loaded machine; a pass returns as soon as they are gone); before,
        # the callers' names held them for the whole stream
        for _ in range(300):
            gc.collect()
            if all(r() is None for r in refs):
                break
            time.sleep(0.1)
        seen.append([r() is None for r in refs])
        return real_stream(self, *args, **kw)

    monkeypatch.setattr(coordinator, "start", start)
    monkeypatch.setattr(kha_stream._SharedStream, "stream", stream)
    fitted = KernelHebbianPCA(4, algorithm="kha-smd", sigma=4.0, passes=1, seed=seed,
                              client=client).fit(digits_store.path)
    assert fitted.alpha_.shape == (4, digits_store.n_samples)
    assert len(refs) == 2 and seen == [[True, True]]


def test_a_resume_keeps_the_block_rows_its_run_recorded(digits_store, client, tmp_path):
    """The blocks are the fit's arithmetic: a run checkpointed with blocks of 40 rows (here a
    smaller dkha.block-rows; a dkha whose stream budget gave more rows, as 1 GiB gave 111 at
    l = 200 000 where 512 MiB now gives 55) resumes with them when no block size is asked for,
    and ends with the uninterrupted run's bits (before: refused, 'block_rows: 40 in the
    checkpoint, 256 now'). A block size asked for that differs is still refused."""
    from dkha.data.checkpoint import Checkpointer
    from dkha.errors import ParameterError

    kw = dict(algorithm="kha-smd", sigma=4.0, evaluate_every=1, init="nystrom:60", client=client)
    run = str(tmp_path / "run")
    with dask.config.set({"dkha.block-rows": 40}):
        full = KernelHebbianPCA(3, passes=3, **kw).fit(digits_store)
        KernelHebbianPCA(3, passes=2, **kw).fit(digits_store).save(run, resumable=True)
    assert Checkpointer(run).newest_meta()["exact"]["block_rows"] == 40
    with pytest.raises(ParameterError, match="block_rows: 40 in the checkpoint, 50 now"):
        KernelHebbianPCA(3, passes=3, block_rows=50, **kw).fit(digits_store, run_dir=run,
                                                              resume=True)
    resumed = KernelHebbianPCA(3, passes=3, **kw).fit(digits_store, run_dir=run, resume=True)
    assert np.array_equal(resumed.alpha_, full.alpha_)
    assert [h["excess"] for h in resumed.history_] == [h["excess"] for h in full.history_]


def test_a_joined_blocks_pieces_are_let_go_before_it_is_applied(digits_store, client,
                                                                  monkeypatch):
    """A block computed by several tasks (column groups) is joined on the coordinator; its
    pieces are let go there and on the workers before the block is yielded, not kept beside it
    until the next block (one block more than the budget counts)."""
    from dkha.engine import stream as stream_module
    from dkha.engine.rows import RowEngine
    from dkha.kernels import make_kernel

    with dask.config.set({"dkha.column-groups": 3}):
        engine = RowEngine(digits_store, make_kernel("gaussian", sigma=4.0), client,
                           config.settings(), block_rows=40, prefetch=2)
    engine.compute_mk(cache=False)
    released, submitted = set(), []
    real_release, real_submit = stream_module.release, engine.submit_rows

    def release(futures):
        released.update(f.key for f in futures)
        real_release(futures)

    def submit_rows(index, priority=0):
        futures = real_submit(index, priority)
        submitted.append({f.key for f in futures})
        return futures

    monkeypatch.setattr(stream_module, "release", release)
    engine.submit_rows = submit_rows
    l = digits_store.n_samples
    blocks = [(i, np.arange(40 * i, 40 * i + 40)) for i in range(l // 40)]
    for k, (tag, idx, block) in enumerate(engine.stream(blocks)):
        assert len(submitted[k]) == 3 and submitted[k] <= released
        assert block.shape == (40, l)
    assert len(submitted) == len(blocks) > 4


HEAP_SCRIPT = """
import numpy as np, psutil
from dkha import config
from dkha.engine.cluster import heap_blocks, release_free_heap
MiB = 2**20
assert heap_blocks(config.settings())
proc = psutil.Process()
big = np.ones(300 * MiB // 8)           # from the heap: below the 512 MiB mmap threshold
pin = np.ones(16 * MiB // 8)            # above it in the heap: the heap cannot shrink past it
del big
kept = proc.memory_info().rss
done = release_free_heap()
print(done, kept, proc.memory_info().rss)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_memory_freed_in_the_heap_goes_back_to_the_system():
    """With the kernel blocks from the heap (``dkha.heap-blocks``), an array freed below one
    allocated after it stays resident (the Nyström start's landmark rows: 511 MiB through the
    stream); :func:`release_free_heap` gives it back. In a fresh process, whose heap holds
    nothing else."""
    import subprocess

    from processes import subprocess_env

    out = subprocess.run([sys.executable, "-c", HEAP_SCRIPT], env=subprocess_env(),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    done, kept, back = out.stdout.split()
    assert done == "True" and int(kept) - int(back) > 250 * MiB, out.stdout
