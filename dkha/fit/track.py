"""Convergence tracked from what the passes already compute: no kernel pass of its own.

The exact evaluation (eq. 22, :mod:`dkha.fit.evaluate`) needs ``E_min``, i.e. the exact top
eigenvalues of ``K'``: as costly as solving the problem exactly, so a fit asks for it only when
told to (``dkha.evaluation: exact``, or a ``tol`` on the excess error). By default each
evaluation is instead *tracked* from ``A`` and ``C = A K'``, which KHA/et and SMD keep anyway
(eq. 18; the other gains need one projection pass):

* ``G = A Cᵀ = A K' Aᵀ`` (the components' Gram matrix in feature space) and
  ``H = C Cᵀ = A K'² Aᵀ`` give the Rayleigh–Ritz values ``θ`` of ``K'`` on the span of the
  components (the pencil ``H x = θ G x``); ``captured = Σ θ_i²`` never exceeds ``Σ λ_i²`` (Cauchy
  interlacing) and reaches it at the exact solution, so ``‖K'‖²_F − captured`` bounds the error
  of the best representation of that span from above and falls as the span improves
  (``E_min² = ‖K'‖²_F − Σ λ_i²``);
* ``change``: the sine of the largest principal angle between the span now and at the previous
  entry, from ``C_now A_prevᵀ`` — how far the last pass(es) moved it.

:func:`tracked` computes both (``O(r² l)``, no kernel entries).
"""

from __future__ import annotations

import numpy as np

#: the history's ``measure`` of a tracked entry
MEASURE = "ritz"


def _orthonormaliser(G: np.ndarray) -> np.ndarray | None:
    """``L⁻¹`` with ``L Lᵀ = G`` (``None`` where ``G`` is not positive definite)."""
    try:
        L = np.linalg.cholesky(0.5 * (G + G.T))
    except np.linalg.LinAlgError:
        return None
    return np.linalg.inv(L)


def ritz_values(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The Rayleigh–Ritz values of ``K'`` on the span of the components ``A`` (``C = A K'``),
    descending (NaN where the components are linearly dependent in feature space)."""
    Li = _orthonormaliser(A @ C.T)
    if Li is None:
        return np.full(A.shape[0], np.nan)
    M = Li @ (C @ C.T) @ Li.T
    return np.linalg.eigvalsh(0.5 * (M + M.T))[::-1].copy()


def tracked(A: np.ndarray, C: np.ndarray, previous: tuple[np.ndarray, np.ndarray] | None = None
            ) -> dict:
    """``{"captured": Σ θ_i², "change": sin of the largest angle to the previous span (NaN
    without one)}`` for the components ``A`` with ``C = A K'`` (module docstring); ``previous``:
    ``(A_prev, L⁻¹_prev)`` as :func:`state_of` returns them."""
    theta = ritz_values(A, C)
    out = {"captured": float(np.sum(theta ** 2)), "change": float("nan")}
    if previous is not None:
        A_prev, Li_prev = previous
        Li = _orthonormaliser(A @ C.T)
        if Li is not None and Li_prev is not None:
            cos = np.linalg.svd(Li @ (C @ A_prev.T) @ Li_prev.T, compute_uv=False)
            out["change"] = float(np.sqrt(max(0.0, 1.0 - float(np.min(cos)) ** 2)))
    return out


def state_of(A: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """What :func:`tracked` needs of this entry to measure the next one's ``change``."""
    return np.array(A, copy=True), _orthonormaliser(A @ C.T)


#: an exact evaluation is better than the best so far only when its error is lower by more than
#: this relative margin: evaluations of one state in different blockings (one model apart, or
#: several together) differ in their last digits, and must never pick different states
EXACT_MARGIN = 1e-9


def better(entry: dict, best: dict | None) -> bool:
    """Whether the history ``entry`` beats ``best`` (the best entry so far, or None): a tracked
    entry captures more (:func:`tracked`); an exact one (eq. 22) has a lower error by more than
    :data:`EXACT_MARGIN`. Entries of other measures never do."""
    if entry.get("measure") == MEASURE:
        return best is None or entry["captured"] > best["captured"]
    if "measure" in entry or not np.isfinite(entry.get("error", np.nan)):
        return False
    return best is None or entry["error"] < best["error"] * (1.0 - EXACT_MARGIN)


def worse_end(last: dict, best: dict | None) -> bool:
    """Whether the fit's ``last`` entry is worse than an earlier ``best`` one, so that ``best``'s
    state is the result: the fit never ends worse than its best evaluation."""
    if best is None or not last or best["step"] == last["step"]:
        return False
    if last.get("measure") == MEASURE:
        return "captured" in best and last["captured"] < best["captured"]
    return ("measure" not in last and "error" in best
            and last["error"] > best["error"] * (1.0 + EXACT_MARGIN))


def best_entry(entry: dict) -> dict:
    """What a checkpoint and the run keep of a best entry (its measure's figures, step, pass)."""
    keys = ("captured",) if entry.get("measure") == MEASURE else ("error", "error_min", "excess")
    return {"step": entry["step"], "pass": entry["pass"], **{k: entry[k] for k in keys}}


def result_entry(history: list, kept: dict | None) -> dict:
    """The history entry that describes a fit's result: the last one, with the errors of the
    kept state where an earlier, better state is the result (exact evaluations; a tracked
    entry's figures stay the last pass's, the kept state's are in ``kept``)."""
    last = dict(history[-1]) if history else {}
    if kept and "error" in kept and last and "measure" not in last:
        last.update({k: kept[k] for k in ("error", "error_min", "excess")})
    return last
