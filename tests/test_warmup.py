"""Compile ahead (dkha.solvers.warmup): the tiny fit compiles what a real fit's coordinator
calls."""

from __future__ import annotations

import pytest
from numba.core.registry import CPUDispatcher

from dkha import KernelHebbianPCA
from dkha.solvers import block_loops, compiled
from dkha.solvers.warmup import compile_ahead, tiny_fit


def signatures() -> dict:
    return {f"{module.__name__}.{name}": set(f.signatures)
            for module in (compiled, block_loops) for name, f in vars(module).items()
            if isinstance(f, CPUDispatcher)}


@pytest.mark.parametrize("algorithm", ["kha-et", "kha-smd"])
def test_tiny_fit_compiles_every_loop_a_fit_calls(algorithm, digits_store, client, seed):
    tiny_fit(algorithm)
    before = signatures()
    KernelHebbianPCA(3, algorithm=algorithm, sigma=4.0, passes=1, seed=seed, init="random",
                     evaluate_every=-1, client=client, projections="coordinator"
                     ).fit(digits_store.path)
    after = signatures()
    assert {k: v - before[k] for k, v in after.items() if v - before[k]} == {}


def test_compile_ahead_starts_once_per_algorithm():
    first = compile_ahead("kha-t")
    assert compile_ahead("kha-t") is None and compile_ahead("krylov") is None
    if first is not None:        # None: an earlier test of this process started it
        first.join(120)
        assert not first.is_alive()
