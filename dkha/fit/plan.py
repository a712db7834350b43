"""The default fit (``algorithm="auto"``): the fastest path to the exact top ``r`` components
on the machine at hand, chosen from a cost model of its passes.

Paths:

* ``dense`` — ``K'`` held whole in this process and its top eigenpairs by Lanczos
  (:mod:`dkha.fit.dense`; scikit-learn's own path, with a full ``eigh``), where the ``l × l``
  float64 matrix takes at most ``dkha.dense-bytes`` of memory;
* ``krylov`` — block Krylov (LOBPCG) on blockwise products over the workers
  (:mod:`dkha.fit.krylov`), started from the Nyström solution: memory ``O(l r)`` on the
  coordinator, one pass over the kernel's upper triangle per product.

The cost model counts kernel entries: a probe tile computed here gives this machine's rate
(entries per second on one thread, the kernel's own width and feature count), the cluster's
threads multiply it. The dense path computes the upper triangle once (``l²/2`` entries) and
then a few dozen memory-bound products ``K' v`` (Lanczos); the Krylov path computes ``l²/2``
entries per product (:data:`KRYLOV_PRODUCTS` of them, the MK row and the start) and pays for
starting the workers and scheduling each pass. The choice,
its reason and the estimates are recorded with the run (:meth:`Plan.attrs`).

The paper's algorithms stay one option away (``algorithm="kha-smd"`` etc.), with their own
Nyström or random starts and gains.

:func:`route` is the one place ``auto`` is resolved: asked with options of the KHA iterations
it runs KHA-SMD, with no component or all of them the exact solver, else the path of the
cost model's :class:`Plan`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
from distributed import Client

from dkha.algorithms import AUTO, KHA_DEFAULT, KRYLOV
from dkha.config import Settings
from dkha.engine.cluster import blas_limit, total_threads
from dkha.engine.content import on_sample

log = logging.getLogger(__name__)

#: products a Krylov solve from the default Nyström start takes to the default residual, r = 20
#: patches 11×11 (benchmarks/cost_model.py: 11 at l = 5 000, 9 at 20 000; 6 at 150 000 in
#: issue 35, where the former 25 made the estimate 4× the fit)
KRYLOV_PRODUCTS = 10
#: seconds the Krylov path spends outside its passes (starting the workers, a pass's own
#: scheduling: 0.1–0.2 s measured at l = 3 000)
KRYLOV_START_SECONDS, KRYLOV_PASS_SECONDS = 3.0, 0.15
#: Lanczos products per component on the dense matrix (ARPACK, ncv = 2r + 1, restarts)
LANCZOS_PRODUCTS_PER_COMPONENT = 6
#: bytes per second of a memory-bound product with a dense float64 matrix (one core, modest)
DENSE_PRODUCT_BYTES_PER_SECOND = 4e9
#: the residual tolerance (relative to λ1) of the default's Krylov path: well below what an
#: excess error of 1e-4 needs (the excess grows as the residual squared)
AUTO_KRYLOV_TOL = 1e-6
#: the probe tile: rows × columns of kernel entries timed here
PROBE_ROWS, PROBE_COLUMNS = 256, 2048


#: options of the KHA iterations: given with ``algorithm="auto"``, they make it KHA-SMD
KHA_OPTIONS = ("passes", "steps", "eta0", "mu", "xi", "init", "gain_params")


@dataclass(frozen=True)
class Route:
    """What a batch model asked for runs (:func:`route`)."""

    #: the algorithm the run is saved under and takes its defaults from: the one asked,
    #: or KHA-SMD for ``auto`` given options of the KHA iterations
    named: str
    #: what runs: a KHA algorithm, ``krylov``, ``dense``, or ``auto`` while the cost model is
    #: still to be asked (:func:`route` again with the :class:`Plan`)
    runs: str
    #: why ``auto`` was resolved so, where it was (``None``: the algorithm asked, or the plan's)
    reason: str | None = None
    plan: Plan | None = None

    def attrs(self) -> dict:
        """The choice as run attrs: the plan's, or the path and its reason."""
        if self.plan is not None:
            return self.plan.attrs()
        return {} if self.reason is None else {"path": self.runs, "path_reason": self.reason}


def route(asked: str, params, n_components: int, n_samples: int,
          plan: Plan | None = None) -> Route:
    """The one resolution of ``algorithm="auto"`` (any other ``asked`` runs as it is), without
    changing anything: with options of the KHA iterations given (:data:`KHA_OPTIONS` not
    ``None`` in ``params``, the estimator's parameters) KHA-SMD, their default before ``auto``
    (the default path takes no passes or gains); with no component or all ``l − 1`` of them the
    exact solver; else the path of ``plan``, the cost model's (``runs="auto"`` until it is
    given: it needs the data and the workers, :func:`plan_fit`)."""
    if asked != AUTO:
        return Route(asked, asked)
    given = [n for n in KHA_OPTIONS if params.get(n) is not None]
    if given:
        return Route(KHA_DEFAULT, KHA_DEFAULT, f"{', '.join(given)} given: options of the KHA "
                     f"iterations, so {KHA_DEFAULT} (the default path takes no passes or gains)")
    if not 0 < n_components < n_samples - 1:
        return Route(AUTO, KRYLOV)
    if plan is None:
        return Route(AUTO, AUTO)
    return Route(AUTO, plan.path, plan=plan)


@dataclass
class Plan:
    """The path chosen, why, and the cost model's seconds for every path (None: not possible)."""

    path: str
    reason: str
    estimates: dict = field(default_factory=dict)
    rate: float = 0.0           # kernel entries per second per thread (the probe)
    threads: int = 1

    @classmethod
    def from_attrs(cls, attrs: dict) -> Plan:
        """The plan that :meth:`attrs` describes (a resumed run keeps its path)."""
        return cls(attrs["path"], attrs["path_reason"], dict(attrs.get("path_estimates", {})),
                   float(attrs.get("path_probe_rate", 0.0)), int(attrs.get("path_threads", 1)))

    def attrs(self) -> dict:
        """The choice as run attrs (JSON values)."""
        return {"path": self.path, "path_reason": self.reason,
                "path_estimates": {k: (None if v is None else round(float(v), 3))
                                   for k, v in self.estimates.items()},
                "path_probe_rate": float(self.rate), "path_threads": int(self.threads)}

    def eta_line(self, now: float | None = None, *, n_samples: int = 0,
                 products: int = 0) -> str:
        """The cost model's seconds for the path chosen as one of the fit's first lines, with
        the clock time it gives (an ETA: the estimate, not a promise); a Krylov solve resumed
        after ``products`` products of ``n_samples`` samples: the seconds of the rest."""
        seconds = self.estimates.get(self.path)
        if seconds is None:
            return f"path: {self.path} (no estimate)"
        what = f"the {self.path} path"
        if products and self.path == KRYLOV and n_samples:
            per_pass = 0.5 * n_samples**2 / (max(self.rate, 1e-9) * self.threads)
            seconds = max(per_pass, float(seconds) - products * (per_pass + KRYLOV_PASS_SECONDS))
            what += f" resumed after {products} products"
        return eta_text(seconds, what, self.threads, now)


def eta_text(seconds: float, what: str, threads: int, now: float | None = None) -> str:
    """``estimate: about S s for WHAT on N threads (ETA HH:MM:SS)``."""
    end = time.strftime("%H:%M:%S", time.localtime((time.time() if now is None else now)
                                                   + float(seconds)))
    return f"estimate: about {float(seconds):.2g} s for {what} on {threads} threads (ETA {end})"


def passes_estimate(l: int, passes: float, *, rate: float, threads: int,
                    landmarks: int | None = None, centering: bool = True) -> float:
    """The cost model's seconds for ``passes`` passes of the KHA iterations over ``l`` samples:
    each computes every kernel row once (``l²`` entries) and pays a pass's scheduling
    (:data:`KRYLOV_PASS_SECONDS`), after the centering's MK row (``l²/2``; none on a resume)
    and a Nyström start of ``landmarks`` (its ``landmarks × l`` entries and one pass). The
    evaluations along the way (``--evaluate-every``) are not counted."""
    per_entry = 1.0 / (max(rate, 1e-9) * max(1, int(threads)))
    pass_seconds = l * l * per_entry + KRYLOV_PASS_SECONDS
    start = ((landmarks * l * per_entry + pass_seconds) if landmarks else 0.0)
    mk = 0.5 * l * l * per_entry if centering else 0.0
    return mk + start + float(passes) * pass_seconds


def passes_eta_line(store, kernel, client, algorithm: str, passes: float, seed: int,
                    settings: Settings, *, landmarks: int | None = None,
                    resumed: bool = False) -> str:
    """The ETA line of the KHA iterations (:func:`passes_estimate`, the rate from a probe tile
    as :func:`plan_fit` times it), ``passes`` left of them."""
    rate = probed_rate(store, kernel, client, seed, settings)
    threads = cluster_threads(client)
    seconds = passes_estimate(store.n_samples, passes, rate=rate, threads=threads,
                              landmarks=None if resumed else landmarks, centering=not resumed)
    what = f"{passes:.3g} {algorithm} passes" + (" (resumed)" if resumed else "")
    return eta_text(seconds, what, threads)


def probe_rate(kernel, sample: np.ndarray, repeat: int = 2) -> float:
    """Kernel entries per second on one thread of this machine for ``kernel`` on rows like
    ``sample`` (``≥ 2`` rows): the best of ``repeat`` timings of one probe tile."""
    sample = np.ascontiguousarray(sample, dtype=np.float64)
    rng = np.random.default_rng(0)
    X = sample[rng.integers(0, len(sample), PROBE_ROWS)]
    Y = sample[rng.integers(0, len(sample), PROBE_COLUMNS)]
    best = np.inf
    with blas_limit(1):
        kernel.block(X[:8], Y[:8])       # compiled on first use: not part of the timing
        for _ in range(repeat):
            t0 = time.perf_counter()
            kernel.block(X, Y)
            best = min(best, time.perf_counter() - t0)
    return PROBE_ROWS * PROBE_COLUMNS / max(best, 1e-9)


def _probe(sample: np.ndarray, kernel) -> float:
    return probe_rate(kernel, sample)


def choose_path(l: int, r: int, *, rate: float, threads: int, dense_bytes: float,
                landmarks: int | None = None) -> Plan:
    """The fastest path to the exact top-``r`` components of ``l`` samples (module docstring),
    holding the kernel matrix whole up to ``dense_bytes`` (``dkha.dense-bytes``)."""
    threads = max(1, int(threads))
    limit = float(dense_bytes)
    per_pass = 0.5 * l * l / (rate * threads)          # the upper triangle, once
    matrix_bytes = 8.0 * l * l
    dense = None
    if matrix_bytes <= limit:
        lanczos = LANCZOS_PRODUCTS_PER_COMPONENT * r * matrix_bytes / DENSE_PRODUCT_BYTES_PER_SECOND
        dense = per_pass + lanczos
    start = (landmarks or 0) / l * 2 * per_pass
    krylov = (KRYLOV_START_SECONDS + (1 + KRYLOV_PRODUCTS) * (per_pass + KRYLOV_PASS_SECONDS)
              + start)
    estimates = {"dense": dense, KRYLOV: krylov}
    if dense is not None and dense <= krylov:
        reason = (f"the {l}×{l} kernel matrix ({matrix_bytes / 2**20:.0f} MiB) fits within "
                  f"dkha.dense-bytes ({limit / 2**20:.0f} MiB) and the cost model gives "
                  f"{dense:.1f} s against {krylov:.1f} s for blockwise Krylov")
        return Plan("dense", reason, estimates, rate, threads)
    if dense is None:
        reason = (f"the {l}×{l} kernel matrix ({matrix_bytes / 2**30:.2f} GiB) exceeds "
                  f"dkha.dense-bytes ({limit / 2**30:.2f} GiB): blockwise Krylov, about "
                  f"{KRYLOV_PRODUCTS} passes of {per_pass:.2g} s on {threads} threads "
                  f"(estimated: {krylov:.2g} s)")
    else:
        reason = (f"the cost model gives {krylov:.1f} s for blockwise Krylov against {dense:.1f} s "
                  "for the dense matrix")
    return Plan(KRYLOV, reason, estimates, rate, threads)


def auto_krylov_tol(tol: float | None) -> float:
    """The Krylov path's residual tolerance for a target excess error ``tol`` (None: the
    default's :data:`AUTO_KRYLOV_TOL`): the excess grows as the squared residual over the
    spectral gaps, so ``0.01 √tol`` leaves a wide margin."""
    if tol is None:
        return AUTO_KRYLOV_TOL
    return float(min(AUTO_KRYLOV_TOL, 0.01 * np.sqrt(float(tol))))


def cluster_threads(client) -> int:
    """The threads the blockwise passes will run on: a connected client's workers' threads, else
    (the in-process cluster, or one not yet reached) this machine's cores."""
    try:
        if isinstance(client, Client):
            return max(1, int(total_threads(client)))
    except Exception:  # noqa: BLE001, S110 - no worker information: the local cores
        pass
    return max(1, os.cpu_count() or 1)


def probed_rate(store, kernel, client, seed: int, settings: Settings) -> float:
    """:func:`probe_rate` on a seeded sample of ``store`` (on a worker of ``client`` where its
    workers are other processes: their rate, and nothing of ``X`` read here)."""
    return on_sample(store, client, min(store.n_samples, 2 * PROBE_COLUMNS), seed, _probe,
                     kernel, settings=settings)


def plan_fit(store, kernel, model, client, seed: int, settings: Settings) -> Plan:
    """The default fit's :class:`Plan` for ``store`` (a probe tile on a seeded sample of it, on a
    worker of ``client`` where its workers are other processes: their rate, and nothing of ``X``
    read here); ``model``: its settings (``n_components``, ``landmarks``)."""
    rate = probed_rate(store, kernel, client, seed, settings)
    plan = choose_path(store.n_samples, int(model.n_components),
                       rate=rate, threads=cluster_threads(client),
                       dense_bytes=float(settings.dense_bytes), landmarks=model.landmarks)
    log.info("default fit: %s (%s)", plan.path, plan.reason)
    return plan
