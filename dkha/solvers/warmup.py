"""Compile ahead: the factored solver's loops compiled in a background thread while a fit starts.

The batch solvers' per-step loops are numba functions (each update's block loop,
:mod:`dkha.solvers.updates`, over :mod:`dkha.solvers.block_loops` and
:mod:`dkha.solvers.compiled`, ``cache=True``: compiled once per environment, then loaded from
numba's cache in a fraction of a second). In a fresh environment the first fit compiles them at
its first block — ~20 s for KHA-SMD on 2 cores, the most of a first ``dkha demo``.
:func:`compile_ahead` starts that compilation in a daemon thread on a tiny problem of the same
types as soon as a fit knows its algorithm, so it runs while the fit starts its cluster,
computes the centering row and its start; the first block then finds
the functions compiled (numba's dispatchers compile under one lock and check for an existing
compilation inside it: nothing is compiled twice). ``dkha.compile-ahead: false`` turns it off.

Ahead of install: :func:`compile_all` runs while ``pip install .`` builds the wheel, whose
numba cache then holds the compiled loops (see there).
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from dkha.solvers.batch import ALGORITHMS, BatchKHA, feature_norm, initial_coefficients

log = logging.getLogger(__name__)

_started: set = set()
_lock = threading.Lock()


def tiny_fit(algorithm: str, dtype=np.float64) -> BatchKHA:
    """One pass of ``algorithm`` on 24 samples in blocks of 8: every compiled loop a batch fit's
    coordinator calls, with the types a fit passes them (kernel rows of ``dtype``: float32 for
    ``precision="float32"``)."""
    rng = np.random.default_rng(0)
    l, r = 24, 2
    X = rng.standard_normal((l, 3))
    sq = np.einsum("ij,ij->i", X, X)
    K = np.exp(-np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0.0) / 2.0)
    mk = K.mean(axis=0)
    K = K - mk[None, :] - mk[:, None] + mk.mean()
    solver = BatchKHA(algorithm, r, l, eta0=0.1, mu=0.1, xi=0.99)
    solver.set_feature_norm(feature_norm(np.diag(K)))
    A = initial_coefficients(r, l, rng)
    solver.start(A, C=A @ K if solver.needs_projection else None)
    solver.begin_pass()
    for a in range(0, l, 8):
        index = np.arange(a, a + 8)
        solver.apply_block(index, np.ascontiguousarray(K[index], dtype=dtype))
    solver.state.fold()
    solver.A  # noqa: B018 - reading A, as a fit's evaluation and saving do
    return solver


def compile_all() -> list[str]:
    """Compile every batch algorithm's loops (:func:`tiny_fit`) into numba's cache: what
    ``pip install .`` runs while it builds dkha's wheel (``build_backend/dkha_build.py``), so that
    the cache ships in the wheel and a first fit loads its loops instead of compiling them. The
    cache holds the machine code of the CPU it was built on (numba's cache key: CPU name and
    features, numba's version, the source's content hash): a wheel built elsewhere compiles at
    the first fit, as before. Returns the algorithms compiled."""
    for algorithm in ALGORITHMS:
        for dtype in (np.float64, np.float32):
            tiny_fit(algorithm, dtype)
    return list(ALGORITHMS)


def _compile(algorithm: str) -> None:
    try:
        tiny_fit(algorithm)
    except Exception as exc:  # noqa: BLE001 - ahead of time only: the fit compiles what it needs
        log.debug("compiling %s ahead failed: %s", algorithm, exc)


def compile_ahead(algorithm: str) -> threading.Thread | None:
    """Start compiling ``algorithm``'s loops in a daemon thread (once per process and algorithm);
    the thread, or None where there is nothing to start."""
    if algorithm not in ALGORITHMS:
        return None
    with _lock:
        if algorithm in _started:
            return None
        _started.add(algorithm)
    thread = threading.Thread(target=_compile, args=(algorithm,), daemon=True,
                              name=f"dkha-compile-{algorithm}")
    thread.start()
    return thread
