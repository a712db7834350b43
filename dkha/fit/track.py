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

import math

import numpy as np

from dkha import algorithms

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


#: a tracked evaluation is better only when it captures more by more than this relative margin:
#: Σθ² of states at round-off from each other (a start already exact) differ by ~1e-15 relative;
#: a pass that improves a Nyström start by anything measurable gains 1e-9 or more
TRACKED_MARGIN = 1e-12


def better(entry: dict, best: dict | None) -> bool:
    """Whether the history ``entry`` beats ``best`` (the best entry so far, or None): a tracked
    entry captures more (:func:`tracked`) by more than :data:`TRACKED_MARGIN`; an exact one
    (eq. 22) has a lower error by more than :data:`EXACT_MARGIN`. Entries of other measures
    never do."""
    if entry.get("measure") == MEASURE:
        return best is None or entry["captured"] > best["captured"] * (1.0 + TRACKED_MARGIN)
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


#: the reasons a fit keeps an earlier state than its last (the start of ``kept_reason``)
GAINS_TOO_LARGE = "the gains are too large for the start"
NOISE_FLOOR = "the start is already at the algorithm's noise floor"
#: ... and where a later pass than the start was the best: the passes went no lower
FLUCTUATED = "the passes reached the noise floor of their gains"


def _decaying() -> list[str]:
    """The batch algorithms whose gains decay (a gain rule of :class:`dkha.algorithms.Decaying`)."""
    return [a for a in algorithms.names(algorithms.BATCH)
            if isinstance(algorithms.spec(a).gains, algorithms.Decaying)]


def kept_reason(kept: dict, attrs: dict) -> str:
    """Why a fit kept the earlier state ``kept`` (its ``kept_state``) and what to try: one
    sentence, saved as the run's ``kept_reason`` and shown by the summary, the report and a
    pipeline's ``summary.json``. ``attrs``: the run's (``init`` as resolved, ``eta0`` as asked:
    ``None`` for the default gains).

    From a Nyström start at the default gains (chosen small for its deficit,
    :func:`dkha.solvers.batch.warm_eta0`) a worse end means the start is already as good as the
    passes can make it: the steps' noise at any gain that moves the state exceeds the start's
    error. Otherwise the gains were too large for the state they started from."""
    figure = "captured" if "captured" in kept else "error"
    what = "tracked Σθ²" if figure == "captured" else "the error E"
    n = kept["pass"]
    state = "the start (pass 0)" if n == 0 else f"the state of pass {n}"
    last = kept.get(f"{figure}_last", float("nan"))
    lost = f"{what} {kept[figure]:.10g} at pass {n}, {last:.10g} at the end"
    init = str(attrs.get("init") or "")
    warm = init.startswith("nystrom")
    if n == 0 and warm and attrs.get("eta0") is None:
        after = kept.get("stopped_after")
        stop = (f"the fit stopped at once, after pass {after}" if after is not None
                else "the passes were spent for nothing (a fit evaluated before its last pass "
                "stops at its first evaluation)")
        return (f"{NOISE_FLOOR}: the passes at the default gains for the Nyström start "
                f"({init}) did not improve on it ({lost}), so {state} is the result and {stop}; "
                "the start is already as good as these passes can make it: take it as it is, "
                "fit algorithm='krylov' (or the default, auto) for the exact components, or "
                "give eta0 (gains of your own) or init='random' to run every pass")
    if n > 0:
        return (f"{FLUCTUATED} by pass {n}: the later passes fluctuated above it ({lost}), so "
                f"{state} is the result and the later passes were thrown away; try a smaller "
                f"eta0 or a decaying gain ({', '.join(_decaying())}) to go lower")
    advice = "a smaller eta0 (a tenth)"
    if warm and attrs.get("eta0") is not None:
        advice += ", or leave eta0 unset for the gains that suit a Nyström start"
    return (f"{GAINS_TOO_LARGE}: every pass left it worse than the start ({lost}), so {state} "
            f"is the result and the passes were thrown away; try {advice}")


def kept_figures(attrs) -> dict:
    """Where a fit kept an earlier state than its last: ``kept_pass``, the kept state's
    ``kept_excess`` and ``kept_error`` where it was evaluated exactly (a pipeline's ``excess``
    and ``error`` are its last evaluation's: the result's are these), and ``kept_reason`` (the
    run's attrs, :func:`kept_reason`); nothing otherwise."""
    kept = attrs.get("kept_state")
    if not kept:
        return {}
    out = {"kept_pass": int(kept["pass"])}
    for key in ("excess", "error"):
        if isinstance(kept.get(key), (int, float)) and math.isfinite(kept[key]):
            out[f"kept_{key}"] = float(kept[key])
    out["kept_reason"] = str(attrs.get("kept_reason", "an earlier pass was better"))
    return out
