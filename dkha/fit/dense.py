"""The dense path of the default fit: ``K'`` held whole in this process, its top ``r``
eigenpairs by Lanczos (ARPACK), for stores small enough that the kernel matrix fits comfortably
in memory (:mod:`dkha.fit.plan` decides). scikit-learn's ``KernelPCA`` takes the same path with
a full ``eigh``; Lanczos on ``r`` components costs a few dozen products ``K' v`` instead of
``O(l³)``.

The history entry is exact at no extra pass: with ``K'`` at hand, ``E(A)`` (direct form) and
``E_min = (‖K'‖²_F − Σ λ_i²)^½`` cost one product each.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse.linalg import LinearOperator, eigsh

from dkha.engine.stop import check_stop
from dkha.fit.kha_stream import BatchResult
from dkha.fit.spectrum import clip_eigenvalues
from dkha.schedule import Stream, random_stream

log = logging.getLogger(__name__)

#: rows of the kernel matrix computed at a time (bounds the temporary panels)
ROW_BLOCK = 1024


@dataclass
class DenseStats:
    """What the dense path did, in the shape the estimators keep for the row engine's passes."""

    passes: list = field(default_factory=list)
    replica_rebuilds: int = 0
    replica_moves: int = 0


def centered_kernel(X: np.ndarray, kernel) -> tuple[np.ndarray, np.ndarray, float]:
    """``(K', mk, mkm)``: the centered kernel matrix of ``X`` (``l × l``, float64, built in place
    from the upper block triangle) with its centering row."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    l = len(X)
    K = np.empty((l, l))
    for a in range(0, l, ROW_BLOCK):
        check_stop("the dense kernel matrix")
        b = min(l, a + ROW_BLOCK)
        K[a:b, a:] = kernel.block(X[a:b], X[a:])
        K[a:, a:b] = K[a:b, a:].T
    mk = K.mean(axis=0)
    mkm = float(mk.mean())
    for a in range(0, l, ROW_BLOCK):
        b = min(l, a + ROW_BLOCK)
        K[a:b] -= mk[None, :]
        K[a:b] -= mk[a:b, None]
        K[a:b] += mkm
    return K, mk, mkm


def dense_fit(X: np.ndarray, kernel, r: int, *, seed: int = 0, tol: float = 0.0
              ) -> tuple[BatchResult, np.ndarray, float, DenseStats]:
    """The exact top-``r`` components of the data ``X`` (``l × n``) with ``K'`` held whole.

    Returns the result (``alpha_i = v_i / √λ_i``, one exact history entry), the centering row
    ``mk``, ``mkm`` and the stats of the two steps (kernel matrix, eigensolver). A stop
    (:data:`~dkha.engine.stop.STOP`) ends it between two row blocks of ``K'`` or two Lanczos
    products with :class:`~dkha.errors.Interrupted`: it keeps no partial state (``K'`` is
    rebuilt in less time than written and read back; ARPACK's state cannot be saved), a resume
    starts it again, to the same bits (its start vector is seeded)."""
    t0 = time.perf_counter()
    K, mk, mkm = centered_kernel(X, kernel)
    t1 = time.perf_counter()
    l = len(K)
    v0 = random_stream(seed, Stream.DENSE_START).standard_normal(l)

    def product(v):     # K' v, a stop checked before each (a stop ends Lanczos within one)
        check_stop("the dense path's eigensolver (Lanczos)")
        return K @ v

    w, V = eigsh(LinearOperator((l, l), matvec=product, dtype=np.float64), k=r, which="LA",
                 tol=tol, v0=v0)
    order = np.argsort(w)[::-1]
    w, V = w[order], np.ascontiguousarray(V[:, order])
    # round-off eigenvalues become 0 and their components null, as on the Krylov path
    w = clip_eigenvalues(w)
    t2 = time.perf_counter()
    scale = np.zeros_like(w)
    scale[w > 0] = 1.0 / np.sqrt(w[w > 0])
    alpha = (V * scale).T.copy()
    C = w[:, None] * alpha                       # A K' = λ_i alpha_i
    KV = K @ V
    residual = np.linalg.norm(KV - V * w, axis=0) / np.where(w > 0, w, 1.0)
    frob2 = float(np.einsum("ij,ij->", K, K))
    # E(A)² = ‖K' − CᵀC‖² = ‖K'‖² − 2 tr(C K' Cᵀ) + ‖C Cᵀ‖², all from K' V
    CKC = float(np.sum(w * np.einsum("ij,ij->j", V, KV)))     # C = diag(√λ) Vᵀ
    err2 = frob2 - 2.0 * CKC + float(np.sum((C @ C.T) ** 2))
    emin2 = frob2 - float(np.sum(w ** 2))
    error, error_min = float(np.sqrt(max(err2, emin2, 0.0))), float(np.sqrt(max(emin2, 0.0)))
    t3 = time.perf_counter()
    history = [{"pass": 0, "step": 0, "error": error, "error_min": error_min,
                "excess": error / error_min - 1.0 if error_min > 0 else float("inf"),
                "wall_time": t2 - t0, "measure": "exact", "residual": float(residual.max())}]
    stats = DenseStats(passes=[
        {"what": what, "kind": kind, "tasks": 1, "wall_seconds": end - begin,
         "wait_seconds": 0.0, "busy_seconds": end - begin, "bytes_received": 0}
        for what, kind, begin, end in (("kernel matrix K' (dense, in process)", "dense", t0, t1),
                                       ("eigenpairs (Lanczos, dense)", "eigensolver", t1, t2),
                                       ("exact evaluation (dense)", "evaluation", t2, t3))])
    log.info("dense path: K' in %.1f s, %d eigenpairs in %.1f s (largest relative residual %.1e)",
             t1 - t0, r, t2 - t1, residual.max())
    res = BatchResult(alpha=alpha, eigenvalue=w, history=history, top_eigenvalues=w,
                      wall_time=t2 - t0, projection=C,
                      stream_stats={"blocks": 0, "wait_seconds": 0.0, "bytes_received": 0})
    return res, mk, mkm, stats
