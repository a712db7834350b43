"""The exact solver: the top-``r`` eigenpairs of ``K'`` by a block Krylov method on blockwise
products (:func:`dkha.fit.spectrum.krylov_solve`), ``alpha_i = v_i / √λ_i``; resumable
from its checkpoints (:class:`KrylovCheckpoints`)."""

from __future__ import annotations

import logging
import time

import numpy as np

from dkha.algorithms import KRYLOV
from dkha.errors import RESUME_HINT, Interrupted
from dkha.fit.evaluate import evaluate
from dkha.fit.kha_stream import BatchResult
from dkha.fit.spectrum import clip_eigenvalues, krylov_solve
from dkha.schedule import Stream, random_stream
from dkha.solvers.eigen import KrylovInfo, KrylovState, to_host

log = logging.getLogger(__name__)

#: without ``checkpoint_every``, a checkpoint is written once the products since the last one
#: took this many times as long as writing it took: checkpoints cost at most about 1/20 of the
#: solve, however long its products (the first is written after the first product)
COST_RATIO = 20.0
#: the arrays of a :class:`~dkha.solvers.eigen.KrylovState` in a checkpoint
_ARRAYS = ("Q", "KQ", "T")
_SCALARS = ("best", "since", "products", "columns", "restarts", "history", "trace")


class KrylovCheckpoints:
    """The exact solver's checkpoints in a run directory: at a product boundary, its basis, the
    products ``K'Q``, the Rayleigh quotient and counters (a
    :class:`~dkha.solvers.eigen.KrylovState`, written as the iteration holds them: no copies,
    nothing held beyond what the iteration holds) with the centering row.

    Written every ``every`` products when asked (``--checkpoint-every``), else whenever the
    products since the last one took at least :data:`COST_RATIO` times as long as writing it.
    A stop (:class:`~dkha.errors.Interrupted`) mid-product writes the last product boundary's
    state where it is not written yet (:meth:`stopped`). ``resume``: the checkpoint to continue
    from (its ``krylov`` meta; one without it is a start that wrote no state yet)."""

    def __init__(self, checkpointer, meta: dict, engine, *, every: int = 0, resume=None):
        self.checkpointer, self.meta, self.engine = checkpointer, dict(meta), engine
        self.every = int(every or 0)
        self.resume = resume if resume is not None and KRYLOV in resume.meta else None
        self.latest: KrylovState | None = None
        self.written = -1 if self.resume is None else int(self.resume.meta[KRYLOV]["products"])
        self.write_seconds = 0.0
        self.last_write = time.perf_counter()
        self.seconds = 0.0 if self.resume is None else float(self.resume.meta["fit_seconds"])
        self.t0 = time.perf_counter()

    def state(self) -> KrylovState | None:
        """The state to continue from (``None``: start afresh). Its arrays leave the loaded
        checkpoint (which would otherwise hold the first basis for the whole solve)."""
        if self.resume is None:
            return None
        a, s = self.resume.arrays, self.resume.meta[KRYLOV]
        log.info("resuming the Krylov solve after product %d from %s", s["products"],
                 self.resume.path)
        # (a checkpoint written before the trace was kept has none: the history then starts
        # at the resumed product)
        return KrylovState(**{k: np.ascontiguousarray(a.pop(f"krylov.{k}")) for k in _ARRAYS},
                           **{k: s[k] for k in _SCALARS if k in s})

    def elapsed(self) -> float:
        """Seconds of the solve so far (a resumed one's included)."""
        return self.seconds + time.perf_counter() - self.t0

    def seen(self, state: KrylovState) -> None:
        """The iteration's state at a product boundary: written if due."""
        self.latest = state
        if state.products == self.written or state.products == 0:
            return
        if self.every:
            due = state.products % self.every == 0
        else:
            due = (self.written < 0 or time.perf_counter() - self.last_write
                   >= COST_RATIO * self.write_seconds)
        if due:
            self.write(state)

    def write(self, state: KrylovState) -> None:
        t0 = time.perf_counter()
        arrays = {f"krylov.{k}": to_host(getattr(state, k)) for k in _ARRAYS}    # off a GPU
        arrays["mk"] = self.engine.mk
        meta = dict(self.meta, mkm=self.engine.mkm, fit_seconds=self.elapsed(),
                    **{KRYLOV: {k: getattr(state, k) for k in _SCALARS}})
        self.checkpointer.save(state.products, arrays, meta)
        self.written = state.products
        self.last_write = time.perf_counter()
        self.write_seconds = self.last_write - t0

    def stopped(self, exc: Interrupted) -> Interrupted:
        """The error of a stop mid-solve, the last product boundary's state written first."""
        state = self.latest
        if state is None or state.products == 0:
            return Interrupted(f"{exc} before the first Krylov product ended; continue with "
                               f"{RESUME_HINT} (it starts the solve again)")
        if state.products != self.written:
            self.write(state)
        return Interrupted(f"{exc} after {state.products} Krylov products; checkpoint written: "
                           f"continue with {RESUME_HINT}")


def krylov_coefficients(engine, r: int, *, seed: int = 0, tol: float = 1e-8, maxiter: int = 300,
                        X0: np.ndarray | None = None, checkpoints: KrylovCheckpoints | None = None
                        ) -> tuple[np.ndarray, np.ndarray, KrylovInfo]:
    """Exact top-``r`` components: ``alpha_i = v_i / √λ_i`` from blockwise block Krylov products
    (:func:`~dkha.fit.spectrum.krylov_solve`), with their eigenvalues and how the solve went."""
    if X0 is not None:  # warm start: pad the given vectors with random ones (the oversampling)
        k = min(engine.n_samples - 1, r + max(5, r // 2))
        extra = random_stream(seed, Stream.KRYLOV_START).standard_normal(
            (engine.n_samples, k - X0.shape[1]))
        X0 = np.hstack([X0, extra]) if k > X0.shape[1] else X0
    w, V, info = krylov_solve(engine, r, seed=seed, tol=tol, maxiter=maxiter, X0=X0,
                              state=None if checkpoints is None else checkpoints.state(),
                              on_state=None if checkpoints is None else checkpoints.seen)
    # round-off eigenvalues become 0 and their components null, as scikit-learn's
    # _check_psd_eigenvalues (significantly negative ones: not a PSD kernel, its ValueError)
    w = clip_eigenvalues(w)
    positive = w > 0
    scale = np.zeros_like(w)
    scale[positive] = 1.0 / np.sqrt(w[positive])
    return (V * scale).T.copy(), w, info


def product_entry(t: dict) -> dict:
    """The history entry of a Krylov product (:attr:`~dkha.solvers.eigen.KrylovInfo.trace`):
    the largest relative residual of the wanted pairs and their Ritz values after it, with the
    products so far as its ``pass`` and the seconds of the solve so far."""
    return {"pass": int(t["products"]), "step": 0, "error": float("nan"),
            "error_min": float("nan"), "excess": float("nan"), "wall_time": float(t["seconds"]),
            "measure": "residual", "residual": float(t["residual"]),
            "ritz_value": list(t["ritz"])}


def run_krylov(engine, r: int, *, seed: int, A_init: np.ndarray | None = None, tol: float = 1e-8,
               with_evaluation: bool = True, tracked: bool = False,
               checkpoints: KrylovCheckpoints | None = None) -> BatchResult:
    """The exact top-``r`` components by block Krylov on blockwise passes.

    ``with_evaluation``: the history's entry is exact (eq. 22 with ``E_min`` from the computed
    eigenvalues: one residual pass, ``C = A K'`` being ``λ_i alpha_i``); otherwise it is the
    tracked measure with ``tracked`` (``measure="residual"``: the solver's own largest relative
    residual, no pass), or no entry. ``checkpoints``: where the solve checkpoints and what it
    resumes from; a stop is then raised with the last product boundary written."""
    if engine.mk is None:
        engine.compute_mk()
    t0 = time.perf_counter()
    try:
        X0 = (None if A_init is None else
              (A_init * np.linalg.norm(A_init, axis=1, keepdims=True) ** -1).T)
        alpha, w, info = krylov_coefficients(engine, r, seed=seed, tol=tol, X0=X0,
                                             checkpoints=checkpoints)
        seconds = (time.perf_counter() - t0 if checkpoints is None else checkpoints.elapsed())
        C = w[:, None] * alpha
        trace = info.trace
        last = {"pass": info.products, "step": 0, "wall_time": seconds,
                "residual": float(info.history[-1]) if info.history else float("nan")}
        if trace:
            last["ritz_value"] = trace[-1]["ritz"]
        if with_evaluation:
            ev = evaluate(engine, alpha, w, C=C)
            last.update(error=ev.error, error_min=ev.error_min, excess=ev.excess,
                        measure="exact")
        elif tracked:
            last.update(error=float("nan"), error_min=float("nan"), excess=float("nan"),
                        measure="residual")
        # an entry per product: its residual and Ritz values, the last one evaluated
        history = ([product_entry(t) for t in trace[:-1]] + [last]
                   if with_evaluation or tracked else [])
    except Interrupted as exc:
        if checkpoints is None:
            raise Interrupted(f"{exc}; no checkpoint (fit with a run directory to make runs "
                              "resumable)") from None
        raise checkpoints.stopped(exc) from None
    # alpha_i = v_i/√λ_i, so C = A K' = λ_i alpha_i exactly
    return BatchResult(alpha=alpha, eigenvalue=w, history=history, top_eigenvalues=w,
                       wall_time=seconds, projection=C,
                       stream_stats={"blocks": 0, "wait_seconds": 0.0, "bytes_received": 0})
