"""The coordinator's cost per pass: the per-step reference form against the factored engine.

Isolates the coordinator (no Dask, no kernel evaluations): random centered-kernel-like row blocks
``K'_P`` of the realistic shape ``b×l`` are fed straight into :class:`dkha.solvers.batch.BatchKHA`.
``K' = F Fᵀ`` with ``F`` (``l×k``) random, so ``K'`` is symmetric, positive semi-definite and its
diagonal is about 1, as a centered gaussian kernel's is; its rows are made outside the timers.

Prints, per algorithm: the reference step time extrapolated to a pass, the factored engine's time
per pass (extrapolated from a few blocks), the split of the latter into the two GEMMs and the
compiled in-block loop, and the coordinator's throughput in steps per second. Also the measurement
behind keeping the GEMMs in BLAS: ``Y₀ = S̃ K'_Pᵀ`` by BLAS against a compiled naive loop.

    python benchmarks/coordinator_speed.py [--samples 20000] [--components 20] [--block 512]
                                           [--blas-threads N]

On a machine shared with other work, pass ``--blas-threads 1``: oversubscribed BLAS threads make
both engines' timings erratic (the reference's the most).
"""

from __future__ import annotations

import argparse
import os
import time

import _data  # noqa: F401 - first: this checkout's dkha on the path
import numpy as np
from numba import njit
from threadpoolctl import threadpool_limits

from dkha.solvers import compiled
from dkha.solvers.batch import BatchKHA, default_eta0, initial_coefficients


def make_factor(l: int, rank: int, rng: np.random.Generator) -> np.ndarray:
    """``F`` with ``K' = F Fᵀ`` centered and of rank ``rank``, its spectrum shaped like that of
    load_digits' gaussian kernel (σ = 4, pixels x/8 − 1): ``λ_i / l ≈ 0.065 / (1 + i/3)``."""
    scale = np.sqrt(0.065 / (1 + np.arange(rank) / 3))
    F = rng.standard_normal((l, rank)) * scale
    return F - F.mean(axis=0)


@njit(cache=False, nogil=True)
def naive_projection(S, rows, out):
    """``out = S rows.T``, the plain triple loop (what ``Y₀`` would cost compiled without BLAS)."""
    for q in range(S.shape[0]):
        for j in range(rows.shape[0]):
            s = 0.0
            for k in range(S.shape[1]):
                s += S[q, k] * rows[j, k]
            out[q, j] = s


def time_reference(algorithm, A, C, F, steps, rng):
    """Median seconds per step of the reference form (one step per block)."""
    solver = BatchKHA(algorithm, A.shape[0], A.shape[1], eta0=default_eta0(algorithm, warm=False),
                      engine="reference")
    solver.start(A, C=C)
    solver.begin_pass()
    idx = rng.integers(0, A.shape[1], steps + 1)
    rows = F[idx] @ F.T
    times = []
    for j in range(steps + 1):
        t0 = time.perf_counter()
        solver.apply_block(idx[j:j + 1], rows[j:j + 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def time_factored(algorithm, A, C, F, block, n_blocks, rng):
    """Median seconds per step of the factored engine over ``n_blocks`` blocks of a first pass
    (the first pass from a random start folds most often), and of its GEMMs alone."""
    r, l = A.shape
    solver = BatchKHA(algorithm, r, l, eta0=default_eta0(algorithm, warm=False))
    solver.start(A, C=C)
    solver.begin_pass()
    perm = rng.permutation(l)
    st = solver.state
    per_block, gemms = [], []
    for k in range(n_blocks + 1):            # block 0 warms up (loads the compiled code)
        idx = perm[k * block:(k + 1) * block]
        rows = F[idx] @ F.T
        t0 = time.perf_counter()
        solver.apply_block(idx, rows)
        t1 = time.perf_counter()
        # the block's GEMMs again, alone, to split its time
        Y = rows @ st.S_tilde.T
        if st.C_tilde is not None:
            Y[:, :r].T @ rows
        t2 = time.perf_counter()
        if k:
            per_block.append(t1 - t0)
            gemms.append(t2 - t1)
    return (float(np.median(per_block)) / block, float(np.median(gemms)) / block,
            st.folds / (n_blocks + 1))


def threadpool_info_line() -> str:
    from threadpoolctl import threadpool_info

    pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
    return ", ".join(f"{p['internal_api']} {p['num_threads']} thread(s)" for p in pools) or "BLAS ?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--components", type=int, default=20)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=6, help="factored blocks timed per algorithm")
    ap.add_argument("--reference-steps", type=int, default=8)
    ap.add_argument("--algorithms", default="kha,kha-et,kha-smd")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="limit BLAS to this many threads (default: BLAS's own choice)")
    args = ap.parse_args(argv)
    with threadpool_limits(args.blas_threads, user_api="blas"):
        measure(args)


def measure(args):
    l, r, b = args.samples, args.components, args.block
    rng = np.random.default_rng(0)
    F = make_factor(l, 64, rng)
    A = initial_coefficients(r, l, rng)
    C = (A @ F) @ F.T
    blas = threadpool_info_line()
    print(f"l = {l}, r = {r}, block = {b} rows; times per pass of l steps; {blas}; "
          f"dkha from {os.path.dirname(compiled.__file__)}")

    S = np.ascontiguousarray(rng.standard_normal((2 * r, l)))
    rows = F[:b] @ F.T
    out = np.empty((2 * r, b))
    naive_projection(S[:, :8], rows[:, :8], out)
    t_naive, t_blas = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        naive_projection(S, rows, out)
        t_naive.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        Y = S @ rows.T
        t_blas.append(time.perf_counter() - t0)
    assert np.allclose(Y, out)
    t_naive, t_blas = min(t_naive), min(t_blas)
    print(f"Y0 = S~ K'_P^T ({2 * r}x{l} by {l}x{b}): BLAS {t_blas * 1e3:.1f} ms, "
          f"compiled naive loop {t_naive * 1e3:.1f} ms")

    for algorithm in args.algorithms.split(","):
        Cs = C if algorithm in ("kha-et", "kha-smd") else None
        ref = time_reference(algorithm, A, Cs, F, args.reference_steps, rng)
        fac, gemm, folds = time_factored(algorithm, A, Cs, F, b, args.blocks, rng)
        print(f"{algorithm:8s} reference {ref * 1e3:7.2f} ms/step -> {ref * l:7.1f} s/pass | "
              f"factored {fac * 1e6:6.1f} us/step -> {fac * l:6.2f} s/pass "
              f"(GEMMs {gemm / fac:4.0%}, in-block loop + rest {1 - gemm / fac:4.0%}, "
              f"{folds:.1f} folds/block) | "
              f"{1 / fac:8.0f} steps/s | speed-up {ref / fac:5.0f}x")


if __name__ == "__main__":
    main()
