"""Tuning the gains: the paper's ``{1, 2, 5}×10^b`` grid, every setting in one kernel stream.

Schraudolph et al. (2006, §5) tuned ``η0`` (and ``μ`` for KHA-SMD) "by a local search over values
in the set {a·10^b: a ∈ {1, 2, 5}, b ∈ ℤ}". :func:`tune` evaluates a whole range of that set at
once: every setting is a model of one :func:`dkha.estimators.batch.fit_together` call, so the kernel
rows are computed once for all of them (only the projections multiply), and the best setting
of each algorithm by excess error ``E/E_min − 1`` after a few passes is kept as a complete,
resumable run directory (continue it with ``dkha fit ... --resume --passes N``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

import dask
import numpy as np

from dkha import algorithms as registry
from dkha.data.atomic import write_json_atomically
from dkha.errors import NumericalError, ParameterError, RunDirectoryError
from dkha.estimators.batch import KernelHebbianPCA, fit_together
from dkha.fit.track import result_entry

log = logging.getLogger(__name__)

SUMMARY = "tune.json"


def grid(lowest: int, highest: int) -> list[float]:
    """``{1, 2, 5}×10^b`` for ``lowest ≤ b ≤ highest``, ascending."""
    return [float(f"{a * 10.0 ** b:.3g}") for b in range(lowest, highest + 1) for a in (1, 2, 5)]


#: the default ranges: η0 from 0.001 to 5 (dimensionless: a Nyström start's defaults are near
#: the bottom, a random start's near the top), μ 0.01 to 1
ETA0_GRID = grid(-3, 0)
MU_GRID = grid(-2, -1) + [1.0]


def _row(m: KernelHebbianPCA) -> dict:
    """One setting's line of the summary: its gains, excess error (or divergence), backoffs."""
    row = {"algorithm": m.algorithm, "eta0": m.eta0, "mu": m.mu, "backoffs": len(m.backoffs_)}
    if m.backoffs_:     # the gain it ended with (halved by each backoff)
        row["eta0_final"] = m.backoffs_[-1]["gain_after"]
    if m.failure_ is None and m.history_:
        final = result_entry(m.history_, m.attrs_.get("kept_state"))
        row.update(excess=final["excess"], error=final["error"])
    else:
        row.update(excess=None, diverged=m.failure_ or "not evaluated")
    return row


def _best(models, rows: list[dict], algorithms, eta0s, mus, tune_dir) -> dict:
    """The best setting of each algorithm by excess error (marked in ``rows``), kept in
    ``tune_dir/<algorithm>`` as a resumable run."""
    best = {}
    for a in algorithms:
        scored = [(row["excess"], i) for i, (row, m) in enumerate(zip(rows, models))
                  if m.algorithm == a and row["excess"] is not None and np.isfinite(row["excess"])]
        if not scored:
            continue
        _, i = min(scored)
        m = models[i]
        smd = registry.has_mu(a)
        entry = {"eta0": m.eta0, "mu": m.mu if smd else None,
                 "excess": rows[i]["excess"], "run_dir": None,
                 # a best value at the end of its range may be beaten outside it
                 "at_edge": [name for name, v, values in
                             (("eta0", m.eta0, eta0s), ("mu", m.mu, mus if smd else []))
                             if len(values) > 1 and v in (min(values), max(values))]}
        rows[i]["best"] = True
        if tune_dir is not None:
            entry["run_dir"] = os.path.join(tune_dir, a)
            m.save(entry["run_dir"], resumable=True)
        best[a] = entry
    return best


def tune(X, algorithms: Sequence[str] = (registry.KHA_DEFAULT,), *,
         eta0: Sequence[float] | None = None, mu: Sequence[float] | None = None, passes: int = 3,
         tune_dir: str | None = None, overwrite: bool = False, **settings) -> dict:
    """Fit every ``(η0[, μ])`` of the grid for each algorithm in one kernel stream; pick the best.

    Parameters
    ----------
    X : a data store path, :class:`~dkha.data.store.DataStore` or array
    algorithms : batch algorithms to tune (``kha``, ``kha-t``, ``kha-et``, ``kha-smd``)
    eta0, mu : the values to try (default :data:`ETA0_GRID`; :data:`MU_GRID` for KHA-SMD, whose
        grid is the product ``η0 × μ``)
    passes : passes of every setting; the best has the lowest excess error after them
    tune_dir : where to keep the best run of each algorithm (``tune_dir/<algorithm>``, resumable)
        and the summary (``tune_dir/tune.json``); refused when it holds anything unless
        ``overwrite``
    settings : the other :class:`~dkha.estimators.batch.KernelHebbianPCA` parameters, shared by all
        settings (``n_components``, kernel, ``seed``, ``evaluate_every`` (default 0: only at the
        end), cluster, ...)

    Returns
    -------
    dict : the summary written to ``tune.json``: ``grid`` (one entry per setting: algorithm,
        eta0, mu, excess or the divergence, its number of backoffs and the gain it ended with),
        ``best`` (per algorithm: its gains, excess and run directory), ``seconds`` and the shared
        settings.
    """
    algorithms = list(dict.fromkeys(algorithms))
    if not algorithms:
        raise ParameterError("no algorithm to tune")
    for a in algorithms:
        if not registry.streams_together(a):
            raise ParameterError(f"cannot tune {a!r}: tuning applies to the batch algorithms "
                                 + ", ".join(registry.names(registry.BATCH)))
    eta0s = list(ETA0_GRID if eta0 is None else eta0)
    mus = list(MU_GRID if mu is None else mu)
    if tune_dir is not None:
        if os.path.lexists(tune_dir) and not os.path.isdir(tune_dir):
            raise RunDirectoryError(f"{tune_dir} exists and is not a directory")
        if os.path.isdir(tune_dir) and os.listdir(tune_dir) and not overwrite:
            raise RunDirectoryError(f"{tune_dir} is not empty; pass --overwrite to tune into it "
                                    "again")
    settings = dict(settings)
    settings.setdefault("evaluate_every", 0)
    models = [KernelHebbianPCA(algorithm=a, eta0=e, mu=m, passes=passes, **settings)
              for a in algorithms for e in eta0s for m in (mus if registry.has_mu(a) else [None])]
    log.info("tuning %d settings in one kernel stream", len(models))
    t0 = time.perf_counter()
    # the settings are judged by their exact excess: E_min once (cached in the data store)
    with dask.config.set({"dkha.evaluation": "exact"}):
        fit_together(models, X, skip_diverged=True)
    seconds = time.perf_counter() - t0
    rows = [_row(m) for m in models]
    best = _best(models, rows, algorithms, eta0s, mus, tune_dir)
    first = models[0]
    summary = {"algorithms": algorithms, "passes": passes, "n_samples": first.n_samples_,
               "n_components": first.n_components, "kernel": first.kernel_.describe(),
               "kernel_parameters": first.kernel_.param_dict, "seed": first.seed,
               "settings": len(models), "seconds": seconds, "grid": rows, "best": best}
    if tune_dir is not None:
        os.makedirs(tune_dir, exist_ok=True)
        write_json_atomically(summary, os.path.join(tune_dir, SUMMARY), indent=1)
    if not best:
        raise NumericalError(f"every one of the {len(models)} settings diverged; try smaller "
                             "eta0 (or mu) values")
    return summary
