"""Nyström initial coefficients, on the row engine.

Nyström (Williams & Seeger): with ``M`` a seeded random set of ``m`` landmarks,
``C = K'[:, M]`` and ``W = K'[M, M]``, ``K' ≈ C W⁺ Cᵀ``. Writing ``B = C W^{-1/2}`` and
``BᵀB = U diag(s) Uᵀ``, the approximation's eigenvectors are ``v_i = B u_i / √s_i`` with
eigenvalues ``s_i``, so the unit-norm components in feature space have coefficients

    A_i = v_i / √s_i = (W^{-1/2} u_i / s_i)ᵀ Cᵀ          (r × l)

The landmark rows ``K'[M, :]`` are ordinary centered kernel rows from the engine's stream: the
data path is the one the KHA family uses.

The exact block-Krylov solver is :mod:`dkha.fit.krylov`.
"""

from __future__ import annotations

import logging

import numpy as np

from dkha.algorithms import is_exact
from dkha.config import Settings
from dkha.engine.budget import configured_budget
from dkha.errors import ParameterError
from dkha.fit.spectrum import clip_eigenvalues
from dkha.progress import Progress
from dkha.schedule import Stream, random_stream
from dkha.solvers.batch import default_landmarks

log = logging.getLogger(__name__)


def start_of(init, algorithm: str, n_samples: int, r: int, settings: Settings
             ) -> tuple[str, int | None]:
    """``("random", None)``, ``("random", M)`` or ``("nystrom", M)`` from ``init``
    (``None``: the Nyström start with :func:`~dkha.solvers.batch.default_landmarks` landmarks
    within the memory budget of ``settings``, the random start for the exact solver)."""
    if init is None and is_exact(algorithm):
        return "random", None
    if init is None:
        m = default_landmarks(n_samples, r, budget=configured_budget(settings))
        return ("nystrom", m) if m else ("random", None)
    init = str(init)
    if init == "random":
        return "random", None
    kind, _, m = init.partition(":")
    if kind in ("random", "nystrom"):
        try:
            m = int(m)
        except ValueError:
            m = -1
        if not 0 < m < n_samples:
            raise ParameterError(f"init {init!r}: M must be an integer in 1..{n_samples - 1}")
        return kind, m
    raise ParameterError(f"unknown init {init!r}; use 'random', 'random:M' or 'nystrom:M'")


def landmark_rows(engine, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(M, K'[M, :])`` for ``m`` seeded random landmarks (sorted), streamed in blocks."""
    l = engine.n_samples
    if not 0 < m < l:
        raise ParameterError(f"nystrom:M needs 0 < M < the number of samples ({l}), got {m}")
    M = np.sort(random_stream(seed, Stream.NYSTROM_COLUMNS).choice(l, size=m, replace=False))
    b = engine.block_rows
    rows = np.empty((m, l))
    blocks = ((a, M[a:a + b]) for a in range(0, m, b))
    kept = engine.prefetch
    engine.prefetch = landmark_prefetch(engine, rows.nbytes)
    try:
        with Progress(getattr(engine, "verbose", False), m, "Nyström landmark rows",
                      unit="row") as bar:
            for a, idx, block in engine.stream(blocks):
                rows[a:a + len(idx)] = block
                bar.update(len(idx))
    finally:
        engine.prefetch = kept
    return M, rows


def landmark_prefetch(engine, held: int) -> int:
    """Blocks ahead while the landmark rows (``held`` bytes) are kept: the rows count against
    the engine's memory budget (:mod:`dkha.engine.budget`: ``(prefetch + 2)`` blocks of
    ``b × l`` in flight), so the stream runs fewer blocks ahead while they grow — at
    l = 200 000 × 16 the 500 rows (0.8 GB) beside the full prefetch took the default fit to a
    2.07 GiB peak. At least one ahead: the rows themselves are the start's cost."""
    memory = getattr(engine, "memory", None)
    if memory is None:
        return engine.prefetch
    block = 8 * engine.block_rows * max(1, engine.n_samples)
    fit = (memory.budget - held) // block - 2
    return int(max(1, min(engine.prefetch, fit)))


def nystrom_coefficients(engine, r: int, m: int, seed: int = 0, *, rcond: float = 1e-10,
                         check_rank: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients ``A`` (``r × l``, unit-norm components) and eigenvalues of the Nyström
    solution. Where the landmarks span fewer than ``r`` dimensions, fewer rows; with
    ``check_rank`` only where ``K'`` itself has that rank (:func:`_check_rank`: else more
    landmarks are needed), without it as they are (a warm start the exact solver pads)."""
    M, CT = landmark_rows(engine, m, seed)
    W = CT[:, M]
    W = 0.5 * (W + W.T)
    w, Q = np.linalg.eigh(W)
    clip_eigenvalues(np.sort(w)[::-1][:r])      # a kernel that is not PSD: scikit-learn's error
    keep = w > rcond * max(w.max(), 0.0)
    if not keep.any():
        return np.zeros((0, engine.n_samples)), np.zeros(0)
    W_isqrt = (Q[:, keep] / np.sqrt(w[keep])) @ Q[:, keep].T
    BT = CT                                # Bᵀ = W^{-1/2} Cᵀ   (m × l), in place: at l = 200 000
    step = max(1, (1 << 22) // m)          # and m = 500 a second m × l array took 0.8 GB more
    for a in range(0, BT.shape[1], step):
        BT[:, a:a + step] = W_isqrt @ BT[:, a:a + step]
    s, U = np.linalg.eigh(BT @ BT.T)
    order = np.argsort(s)[::-1][:r]
    s, U = s[order], U[:, order]
    if keep.sum() < r:
        if check_rank:
            _check_rank(engine, m, int(keep.sum()), r, float(np.sum(s)))
        pos = s > rcond * max(s.max(), 0.0)
        s, U = s[pos], U[:, pos]
    A = (U / s).T @ BT                     # A_i = u_iᵀ Bᵀ / s_i
    return A, s


def _check_rank(engine, m: int, rank: int, r: int, captured: float) -> None:
    """The landmarks span ``rank < r`` dimensions: either ``K'`` itself has that rank (the
    Nyström approximation is then exact: ``K' − C W⁺ Cᵀ`` is positive semi-definite with trace
    ``trace(K') − Σ s_i`` ≈ 0), and the start holds every non-null component; or more
    landmarks are needed (raised)."""
    total = float(np.sum(engine.centered_diagonal()))
    if total - captured > 1e-9 * max(abs(total), np.finfo(float).tiny):
        raise ParameterError(f"the {m} landmarks span only {rank} dimensions of K' for {r} "
                             f"components (trace {total:.6g}, captured {captured:.6g}); use "
                             "more landmarks (init='nystrom:M') or algorithm='krylov'")
    log.info("K' has rank %d < %d components: the Nyström start is exact; the other "
             "components are null", rank, r)


def unit_norm_components(A: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``A`` and ``C = A K'`` with each component scaled to unit feature-space norm,
    ``‖w_i‖² = (A K' Aᵀ)_ii = Σ_j A_ij C_ij``.

    The Nyström components have unit norm only under the Nyström approximation of ``K'``. A
    component whose norm is off by ``δ`` adds about ``λ_i² δ²`` to ``E(A)²``, and KHA/et and SMD,
    which give the top components the smallest gains, take passes to correct it: on 1797 digits
    (σ = 4, r = 16, 300 landmarks) the scaling alone takes the start from excess 1.7e-3 to 3.5e-4.
    """
    norms = np.sqrt(np.einsum("ij,ij->i", A, C))
    if not np.all(np.isfinite(norms) & (norms > 0)):
        raise ParameterError("a Nyström component has zero norm in feature space; use more "
                             "landmarks or fewer components")
    return A / norms[:, None], C / norms[:, None]
