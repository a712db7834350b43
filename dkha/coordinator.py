"""The coordinator: drives a batch solver over the block stream of centered kernel rows.

It owns the schedule (``dkha.schedule``), the passes, the evaluations recorded in the history and
the progress display. Kernel rows are computed ahead on the workers (``RowEngine.stream``); the
coordinator only applies the sequential updates.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from dkha import schedule
from dkha.evaluate import evaluate, projections, top_eigenvalues
from dkha.solvers.batch import BatchKHA, eigenvalue_estimate, initial_coefficients

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    alpha: np.ndarray
    eigenvalue: np.ndarray
    history: list = field(default_factory=list)
    top_eigenvalues: np.ndarray | None = None
    wall_time: float = 0.0
    stream_stats: dict = field(default_factory=dict)


def _progress(verbose: bool, total: int, desc: str):
    if not verbose:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", unit_scale=True, leave=True)


#: set (e.g. by the CLI's SIGTERM handler) to make a running fit checkpoint and stop
STOP = threading.Event()


def run_batch(engine, solver: BatchKHA, *, n_steps: int, seed: int, evaluate_every: int = 1,
              verbose: bool = False, A_init: np.ndarray | None = None,
              tol: float | None = None, checkpointer=None, checkpoint_every: int = 0,
              checkpoint_meta: dict | None = None, resume=None,
              checkpoint_steps: int = 0) -> BatchResult:
    """Fit ``solver`` for ``n_steps`` steps over ``engine``'s kernel rows.

    ``evaluate_every``: evaluate (eq. 22) every that many passes and at the end; 0 evaluates only
    at the end; a negative value never evaluates. ``tol``: stop at the first evaluation whose
    excess error is at most ``tol`` (evaluating at least every pass).

    ``checkpointer`` (a :class:`dkha.checkpoint.Checkpointer`) writes the complete state every
    ``checkpoint_every`` passes, at the first block boundary after every ``checkpoint_steps``
    steps, and at the next block boundary when :data:`STOP` is set (then
    :class:`~dkha.errors.Interrupted` is raised). ``resume``: a loaded checkpoint to continue
    from; the continued run equals the uninterrupted one bit for bit.
    """
    from dkha.checkpoint import state_from_arrays, state_to_arrays
    from dkha.errors import Interrupted

    if tol is not None and evaluate_every < 1:
        evaluate_every = 1
    l, r = engine.n_samples, solver.r
    history: list[dict] = []
    eig_top: np.ndarray | None = None
    fit_seconds = 0.0
    if resume is not None:
        arrays = {k[len("state."):]: v for k, v in resume.arrays.items() if k.startswith("state.")}
        engine.set_mk(resume.arrays["mk"], float(resume.meta["mkm"]))
        solver.start(np.zeros((r, l)), C=np.zeros((r, l)) if solver.needs_projection else None)
        solver.state = state_from_arrays(type(solver.state), arrays, resume.meta["state_scalars"])
        history = list(resume.meta["history"])
        fit_seconds = float(resume.meta["fit_seconds"])
        if "top_eigenvalues" in resume.arrays:
            eig_top = resume.arrays["top_eigenvalues"]
        log.info("resuming at step %d from %s", solver.state.t, resume.path)
    else:
        if engine.mk is None:
            engine.compute_mk()
        A1 = initial_coefficients(r, l, schedule.init_generator(seed)) if A_init is None else A_init
        solver.start(A1, C=projections(engine, A1) if solver.needs_projection else None)

    def save_checkpoint(pass_end_pending: bool = False):
        arrays, scalars = state_to_arrays(solver.state)
        out = {f"state.{k}": v for k, v in arrays.items()}
        out["mk"] = engine.mk
        if eig_top is not None:
            out["top_eigenvalues"] = np.asarray(eig_top)
        meta = dict(checkpoint_meta or {}, mkm=engine.mkm, history=history,
                    fit_seconds=fit_seconds, state_scalars=scalars,
                    state_class=type(solver.state).__name__, n_steps=n_steps,
                    pass_end_pending=pass_end_pending)
        checkpointer.save(solver.state.t, out, meta)

    def record(pass_index: int, C=None):
        nonlocal eig_top
        if eig_top is None:
            eig_top = top_eigenvalues(engine, r, seed=seed)
        ev = evaluate(engine, solver.A, eig_top, C=C)
        history.append({"pass": pass_index, "step": solver.state.t, "error": ev.error,
                        "error_min": ev.error_min, "excess": ev.excess, "wall_time": fit_seconds})
        log.info("pass %d step %d: excess error %.3e", pass_index, solver.state.t, ev.excess)
        return ev

    if evaluate_every > 0 and resume is None:
        record(0)
    converged = tol is not None and history and history[-1]["excess"] <= tol
    bar = _progress(verbose, n_steps, solver.algorithm)
    start_step = solver.state.t
    if bar is not None and start_step:
        bar.update(start_step)
    n_passes = -(-n_steps // l)
    # a resume mid-pass continues that pass (its eigenvalue refresh already happened)
    current_pass = start_step // l if start_step % l else -1
    if resume is not None and start_step and resume.meta.get("pass_end_pending"):
        current_pass = start_step // l - 1   # saved between a pass's last block and its end work
    t0 = time.perf_counter()
    tagged = ((k, idx) for k, _, idx in
              schedule.blocks(seed, l, n_steps, engine.block_rows, start_step=start_step))
    for k, idx, rows in ([] if converged else engine.stream(tagged, solver=solver)):
        if k != current_pass:
            if current_pass >= 0:
                fit_seconds += time.perf_counter() - t0
                _end_of_pass(current_pass, evaluate_every, n_passes, record, bar)
                if tol is not None and history and history[-1]["excess"] <= tol:
                    log.info("excess error %.3e ≤ tol %.3e after pass %d: stopping",
                             history[-1]["excess"], tol, current_pass + 1)
                    break
                if checkpointer is not None and checkpoint_every > 0 and k % checkpoint_every == 0:
                    save_checkpoint()
                t0 = time.perf_counter()
            solver.begin_pass()
            current_pass = k
        t_before = solver.state.t
        solver.apply_block(idx, rows)
        if bar is not None:
            bar.update(len(idx))
        if (checkpointer is not None and checkpoint_steps > 0 and solver.state.t < n_steps
                and solver.state.t // checkpoint_steps > t_before // checkpoint_steps):
            fit_seconds += time.perf_counter() - t0
            save_checkpoint(pass_end_pending=solver.state.t % l == 0)
            t0 = time.perf_counter()
        if STOP.is_set() and solver.state.t < n_steps:
            fit_seconds += time.perf_counter() - t0
            if checkpointer is not None:
                save_checkpoint(pass_end_pending=solver.state.t % l == 0)
                raise Interrupted(f"stopped at step {solver.state.t} (pass {k + 1}); checkpoint "
                                  f"written: continue with `dkha fit ... --resume`")
            raise Interrupted(f"stopped at step {solver.state.t} (pass {k + 1}); no checkpoint "
                              "(fit with a run directory to make runs resumable)")
    fit_seconds += time.perf_counter() - t0
    last_pass = solver.state.t / l
    # final evaluation (always, unless evaluate_every < 0)
    C = projections(engine, solver.A)
    if evaluate_every >= 0:
        pass_label = int(np.ceil(last_pass))
        if not history or history[-1]["step"] != solver.state.t:
            ev = record(pass_label, C=C)
            if bar is not None:
                bar.set_postfix(excess=f"{ev.excess:.2e}")
    if bar is not None:
        bar.close()
    lam = eigenvalue_estimate(solver.A, C)
    return BatchResult(alpha=solver.A.copy(), eigenvalue=lam, history=history,
                       top_eigenvalues=eig_top, wall_time=fit_seconds,
                       stream_stats={"blocks": engine.stats.blocks,
                                     "wait_seconds": engine.stats.wait_seconds,
                                     "bytes_received": engine.stats.bytes_received})


def _end_of_pass(k: int, evaluate_every: int, n_passes: int, record, bar) -> None:
    done = k + 1
    if evaluate_every > 0 and done % evaluate_every == 0 and done < n_passes:
        ev = record(done)
        if bar is not None:
            bar.set_postfix(excess=f"{ev.excess:.2e}")


def run_krylov(engine, r: int, *, seed: int, A_init: np.ndarray | None = None, tol: float = 1e-8,
               with_evaluation: bool = True) -> BatchResult:
    """The exact top-``r`` components by block Krylov (LOBPCG) on blockwise passes."""
    from dkha.solvers.nystrom import krylov_coefficients

    if engine.mk is None:
        engine.compute_mk()
    passes = [0]
    matmat = engine.matmat

    def counted(V):
        passes[0] += 1
        return matmat(V)

    engine.matmat = counted
    t0 = time.perf_counter()
    try:
        X0 = None if A_init is None else (A_init * np.linalg.norm(A_init, axis=1, keepdims=True) ** -1).T
        alpha, w = krylov_coefficients(engine, r, seed=seed, tol=tol, X0=X0)
    finally:
        engine.matmat = matmat
    seconds = time.perf_counter() - t0
    history = []
    if with_evaluation:
        ev = evaluate(engine, alpha, w)
        history.append({"pass": passes[0], "step": 0, "error": ev.error, "error_min": ev.error_min,
                        "excess": ev.excess, "wall_time": seconds})
    return BatchResult(alpha=alpha, eigenvalue=w, history=history, top_eigenvalues=w,
                       wall_time=seconds, stream_stats={"blocks": 0, "wait_seconds": 0.0,
                                                        "bytes_received": 0})
