"""Blockwise evaluation: reconstruction error E(A) (eq. 22), E_min, excess error, eigenvalues.

With ``C = A K'`` (one blockwise pass, ``K' Aᵀ``)::

    E(A)² = Σ over row blocks I of ‖K'[I, :] − C[:, I]ᵀ C‖²_F     (direct form, second pass)
    E_min² = ‖K'‖²_F − Σ_{i≤r} λ_i(K')²

``λ_1..λ_r`` come from :mod:`dkha.fit.spectrum`. :func:`variance_of` is Honeine's eq. 23 from
the values of the principal functions (the explained variance of a saved run is
:mod:`dkha.runs.variance`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from dkha.fit.spectrum import top_eigenvalues
from dkha.progress import Progress, phase

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """Reconstruction errors of one coefficient matrix."""

    error: float
    error_min: float
    excess: float
    frobenius: float

    def as_dict(self) -> dict:
        return asdict(self)


def projections(engine, A: np.ndarray) -> np.ndarray:
    """``C = A K'`` (``r × l``), one blockwise pass."""
    return projections_many(engine, [A])[0]


def projections_many(engine, As: list[np.ndarray]) -> list[np.ndarray]:
    """``C = A K'`` for each coefficient matrix of ``As``: one blockwise pass for all of them
    (the stacked ``[A_1; A_2; …]ᵀ`` multiplied by ``K'``), or, where they are zero outside a few
    columns ``S`` (a quarter of ``l`` or fewer), ``A[:, S] K'[S, :]`` from the ``|S|`` kernel rows
    (e.g. the start ``init="random:M"``: ``M`` rows instead of ``l²/2`` tile entries)."""
    if not As:
        return []
    V = np.ascontiguousarray(np.concatenate([np.asarray(A, dtype=np.float64) for A in As]).T)
    columns = np.flatnonzero(np.any(V != 0, axis=1))
    desc = "projections C = A K'"
    if 4 * len(columns) <= V.shape[0]:
        KV = np.zeros(V.shape)
        b = engine.block_rows
        blocks = ((a, columns[a:a + b]) for a in range(0, len(columns), b))
        with Progress(getattr(engine, "verbose", False), len(columns), desc, unit="row") as bar:
            for _, index, rows in engine.stream(blocks):
                KV += rows.T @ V[index]
                bar.update(len(index))
    else:
        with engine.labelled(desc):
            KV = engine.matmat(V)
    ends = np.cumsum([A.shape[0] for A in As])[:-1]      # each A's columns of KV
    return [part.T.copy() for part in np.split(KV, ends, axis=1)]


def evaluate(engine, A: np.ndarray, eigenvalues: np.ndarray | None = None, *,
             C: np.ndarray | None = None) -> Evaluation:
    """``E(A)``, ``E_min`` and the excess ``E/E_min − 1`` of eq. 22, blockwise.

    ``eigenvalues`` (the top ``r`` of ``K'``) may be passed to skip their computation.
    """
    return evaluate_many(engine, [A], eigenvalues, Cs=None if C is None else [C])[0]


#: evaluations above this many samples say what they will cost before they start
ANNOUNCE_SAMPLES = 50_000


def announce_cost(engine, *, passes: int, krylov: bool) -> None:
    """Say, before an evaluation at large ``l``, how many passes over the kernel it makes (each
    ``l²/2`` kernel entries, about as long as the MK pass when this engine made one), and that
    ``--evaluate-every -1`` skips it."""
    l = engine.n_samples
    if l < ANNOUNCE_SAMPLES:
        return
    limit = int(engine.settings.dense_eigh_limit)
    what = f"{passes} pass{'es' if passes > 1 else ''}"
    if krylov and l > limit:
        what += " and, for E_min, one per Krylov product (typically 8–15)"
    seconds = getattr(getattr(engine, "stats", None), "mk_pass_seconds", None)
    each = f", each about {seconds:.0f} s like the MK pass" if seconds else ""
    log.warning("evaluating at l = %d: %s over the kernel's %.2g entries%s; "
                "--evaluate-every -1 skips evaluations", l, what, l * (l + 1) / 2.0, each)


def evaluate_many(engine, As: list[np.ndarray], eigenvalues: np.ndarray | None = None, *,
                  Cs: list[np.ndarray] | None = None, announce: bool = True) -> list[Evaluation]:
    """:func:`evaluate` for several coefficient matrices, sharing the kernel passes: one pass
    for all their ``C = A K'`` (unless ``Cs`` are given) and one for all their residuals.
    ``announce``: say the cost first at large ``l`` (:func:`announce_cost`)."""
    r = max(A.shape[0] for A in As)
    phase("evaluation: E(A), E_min and the excess error (eq. 22)")
    if announce:
        announce_cost(engine, passes=(Cs is None) + 1, krylov=eigenvalues is None)
    if Cs is None:
        Cs = projections_many(engine, As)
    frob2, res2 = engine.residuals(Cs)
    if eigenvalues is None:
        eigenvalues = top_eigenvalues(engine, r)
    out = []
    for A, res in zip(As, res2):
        emin2 = frob2 - float(np.sum(np.asarray(eigenvalues[:A.shape[0]]) ** 2))
        error = float(np.sqrt(max(res, 0.0)))
        error_min = float(np.sqrt(max(emin2, 0.0)))
        # E_min unknown (NaN: not asked for) leaves the excess unknown too
        excess = (error / error_min - 1.0 if error_min > 0 else
                  float("nan") if np.isnan(error_min) else float("inf"))
        out.append(Evaluation(error=error, error_min=error_min, excess=excess,
                              frobenius=float(np.sqrt(frob2))))
    return out


def variance_of(Y: np.ndarray) -> np.ndarray:
    """Eq. 23 from the values ``Y (n, r)`` of the principal functions on ``n`` samples."""
    Y = np.asarray(Y, dtype=np.float64)
    mean = Y.mean(axis=0)
    return np.maximum(np.mean(Y * Y, axis=0) - mean * mean, 0.0)
