"""The KHA iterations over one shared stream of centered kernel row blocks.

It owns the schedule (``dkha.schedule``), the passes, the evaluations recorded in the history and
the progress display. Kernel rows are computed ahead on the workers (``RowEngine.stream``); the
coordinator only applies the sequential updates.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dkha import schedule
from dkha.data.checkpoint import state_from_arrays, state_to_arrays
from dkha.engine.replicas import Carried
from dkha.errors import RESUME_HINT, Interrupted, NumericalError, ParameterError
from dkha.fit.control import BlockDriver
from dkha.fit.evaluate import announce_cost, evaluate_many, projections, projections_many
from dkha.fit.spectrum import top_eigenvalues
from dkha.fit.track import MEASURE as TRACKED
from dkha.fit.track import best_entry, better, state_of, tracked, worse_end
from dkha.solvers.batch import BatchKHA, eigenvalue_estimate, feature_norm, initial_coefficients
from dkha.solvers.factored import FactoredState

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    alpha: np.ndarray | None
    eigenvalue: np.ndarray | None
    history: list = field(default_factory=list)
    top_eigenvalues: np.ndarray | None = None
    wall_time: float = 0.0
    stream_stats: dict = field(default_factory=dict)
    #: why a model of a shared stream stopped without a result (it diverged); None otherwise
    failure: str | None = None
    #: the model's backoffs (:attr:`dkha.solvers.batch.BatchKHA.backoffs`), oldest first
    backoffs: list = field(default_factory=list)
    #: ``C = A K'`` (component × sample) of the final ``alpha``: the training samples'
    #: projections, which the final evaluation and eq. 13 use anyway
    projection: np.ndarray | None = None
    #: where the state kept is not the last one (a tracked evaluation found an earlier pass
    #: better): ``{"pass", "step", "captured", "captured_last"}``; None otherwise
    kept: dict | None = None


@dataclass
class _Model:
    """One solver of a shared stream and what belongs to it alone."""

    solver: BatchKHA
    tol: float | None
    checkpointer: object = None
    meta: dict | None = None
    history: list = field(default_factory=list)
    active: bool = True          # still taking steps (false once converged or diverged)
    failure: str | None = None
    #: the best evaluation so far (:func:`~dkha.fit.track.best_entry`: ``captured`` of a tracked
    #: one, ``error`` of an exact one; ``step``, ``pass``) with its ``A`` and ``C`` (the state kept
    #: if the end is worse), and the last span (a tracked entry's change)
    best: dict | None = None
    best_arrays: tuple | None = None
    previous: tuple | None = None


def at_the_floor(m: _Model) -> bool:
    """Whether ``m`` runs the default gains from a Nyström start (its meta's ``warm_gains``) and
    an evaluation after the start found no better state than the start: the start is already at
    the algorithm's noise floor, so the model stops (also on a resume, from its history)."""
    return (bool(m.meta and m.meta.get("warm_gains")) and m.best is not None
            and m.best["pass"] == 0 and any(h["pass"] > 0 for h in m.history))


def running_step(models: Sequence[_Model]) -> int:
    """The step a shared stream is at: its running models' (all at one step); a stopped model's
    state may be older (or, after a stop between two models' checkpoints, newer)."""
    return max(m.solver.state.t for m in ([m for m in models if m.active] or models))


def stopped_after(m: _Model, n_steps: int) -> int | None:
    """The pass after which :func:`at_the_floor` stopped ``m``: its first evaluation after the
    start, where that came before the schedule's last step (``None`` otherwise: every pass ran,
    e.g. with no evaluation between passes)."""
    if not at_the_floor(m):
        return None
    first = next(h for h in m.history if h["pass"] > 0)
    return int(first["pass"]) if first["step"] < n_steps else None


def run_batches(engine, solvers: Sequence[BatchKHA], *, n_steps: int, seed: int,
                evaluate_every: int = 1, verbose: bool = False,
                tol: float | Sequence | None = None,
                checkpointers: Sequence | None = None, checkpoint_every: int = 0,
                checkpoint_metas: Sequence[dict] | None = None,
                resumes: Sequence | None = None, checkpoint_steps: int = 0,
                handed: list | None = None,
                divergence_level: int = logging.WARNING) -> list[BatchResult]:
    """Fit several batch solvers over one stream of ``engine``'s kernel rows, one result each.

    Every block of centered rows is computed once and applied by every solver in turn, in the
    same schedule (``seed``, ``n_steps``); each model's coefficients equal those of its fit
    alone (a list of one). ``evaluate_every``: eq. 22 every that many passes and at the end (0:
    at the end, negative: never). The solvers share the number of components and the initial
    coefficients (``handed``'s ``A_init``, or the seeded random start), so the start's ``C = A
    K'`` and the pass-0 evaluation are computed once; later evaluations of all models share one
    pass for ``C`` and one for the residuals (:func:`dkha.fit.evaluate.evaluate_many`).

    ``tol`` (one value or one per solver): a model stops taking steps at its first evaluation
    with an excess error at most its ``tol``; the stream stops when no model is left. A model
    whose state becomes non-finite is set aside with a ``failure`` message in its result while
    the others go on; with ``on_divergence="backoff"`` (:class:`BatchKHA`) a model first backs
    off on its own (rolls back to its block's start and halves its gain) and is set aside only
    when backoffs do not help. ``divergence_level``: the log level of backoffs and set-aside
    models beside others (INFO where a table reports them). ``checkpointers``,
    ``checkpoint_metas`` and ``resumes`` (continued bit for bit, all at one step) are one per
    solver: saved every ``checkpoint_every`` passes, ``checkpoint_steps`` steps and on a STOP.

    A model at the default gains for a Nyström start that its first evaluation after the start
    does not improve on stops there, keeping the start (:func:`at_the_floor`, issue 42).

    ``handed``: ``[A_init, C_init]`` where the caller has a start (its coefficients and ``C =
    A_init K'``, which serves the start of KHA/et and SMD and the pass-0 evaluation instead of a
    pass), emptied here so that the start is dropped once the solvers hold copies
    (:func:`_taken`).
    """
    solvers = list(solvers)
    if not solvers:
        raise ParameterError("no models to fit")
    if len({s.r for s in solvers}) > 1:
        raise ParameterError("models fitted together need the same number of components, got "
                             + ", ".join(str(s.r) for s in solvers))
    tols = list(tol) if isinstance(tol, (list, tuple)) else [tol] * len(solvers)
    if any(t is not None for t in tols) and evaluate_every < 1:
        evaluate_every = 1
    # the exact E_min only when asked for: a tol on the excess, or dkha.evaluation: exact
    exact = any(t is not None for t in tols) or str(engine.settings.evaluation) == "exact"
    n = len(solvers)
    models = [_Model(*row) for row in zip(solvers, tols, checkpointers or [None] * n,
                                          checkpoint_metas or [None] * n)]
    for s in solvers:
        s.log_level = divergence_level
    fit = _SharedStream(engine, models, n_steps=n_steps, seed=seed, evaluate_every=evaluate_every,
                        divergence_level=divergence_level, exact=exact)
    C1 = fit.restore(resumes) if resumes is not None else fit.start(*_taken(handed))
    fit.set_gain_units()
    try:
        if evaluate_every > 0 and resumes is None:
            fit.record(fit.active(), Cs=None if C1 is None else [C1], shared_start=True)
    except Interrupted as exc:
        raise fit.stopped(exc) from None
    C1 = None
    desc = solvers[0].algorithm if len(solvers) == 1 else f"{len(solvers)} models"
    start_step = running_step(fit.models)
    fit.driver = BlockDriver(
        n_steps, start_step, desc=desc, verbose=verbose, seconds=fit.fit_seconds,
        save=fit.save_checkpoints if any(m.checkpointer is not None for m in models) else None,
        checkpoint_steps=checkpoint_steps)
    try:
        fit.stream(start_step, checkpoint_every,
                   pass_end_pending=bool(start_step) and fit.pass_end_pending)
        return fit.finish()
    except Interrupted as exc:
        raise fit.stopped(exc) from None
    finally:
        fit.driver.close()


def _taken(handed: list | None) -> tuple:
    """The start ``(A_init, C_init)``, ``handed`` emptied (a caller's names, arguments too, keep
    what they refer to for the whole call: the start's ``A`` and ``C``, 61 MiB at l = 200 000
    and r = 20, were held through the block stream); ``(None, None)`` without one."""
    if not handed:
        return None, None
    start = tuple(handed)
    handed.clear()
    return start


class _StreamState:
    """The settings of :func:`run_batches` and what it carries across a stop (its models, the top
    eigenvalues of the exact evaluations, the fit seconds), held by one checkpoint per model, all
    at one step: written together, read back together to resume."""

    def __init__(self, engine, models: list[_Model], *, n_steps: int, seed: int,
                 evaluate_every: int, divergence_level: int = logging.WARNING, exact: bool = True):
        self.engine, self.models = engine, models
        self.exact = exact
        self.divergence_level = divergence_level
        self.n_steps, self.seed, self.evaluate_every = n_steps, seed, evaluate_every
        self.l, self.r = engine.n_samples, models[0].solver.r
        self.eig_top: np.ndarray | None = None
        self.fit_seconds, self.pass_end_pending = 0.0, False
        self.carried: list = []     # the blocks in flight a resumed checkpoint carries
        self.driver: BlockDriver | None = None

    def active(self) -> list[_Model]:
        return [m for m in self.models if m.active]

    @property
    def seconds(self) -> float:
        return self.fit_seconds if self.driver is None else self.driver.seconds

    def set_gain_units(self) -> None:
        """The gains' unit κ̄ of every solver that has none, from the centered diagonal
        (O(l n); no kernel rows)."""
        unset = [m.solver for m in self.models if m.solver.feature_norm is None]
        if unset:
            kappa = feature_norm(self.engine.centered_diagonal())
            log.info("gain unit: mean squared feature-space norm (weighted) %.4g", kappa)
            for s in unset:
                s.set_feature_norm(kappa)

    def restore(self, resumes) -> None:
        """Every model's state from its checkpoint (all at the same step)."""
        # a model that had stopped (its tol, the noise floor) keeps its checkpoint at the step
        # it stopped at; the running ones must agree
        steps = {ck.step for ck in resumes if ck.meta.get("active", True)}
        if len(steps) > 1:
            raise ParameterError(f"the checkpoints to resume are at different steps "
                                 f"({', '.join(map(str, sorted(steps)))})")
        first = max(resumes, key=lambda ck: ck.step)
        self.engine.set_mk(first.arrays["mk"], float(first.meta["mkm"]))
        l, r = self.l, self.r
        for m, ck in zip(self.models, resumes):
            s = m.solver
            arrays = {k[len("state."):]: v for k, v in ck.arrays.items() if k.startswith("state.")}
            s.start(np.zeros((r, l)), C=np.zeros((r, l)) if s.needs_projection else None)
            s.state = state_from_arrays(type(s.state), arrays, ck.meta["state_scalars"])
            m.history = list(ck.meta["history"])
            s.backoffs = list(ck.meta.get("backoffs", []))
            if ck.meta.get("best") is not None:      # the best evaluation so far
                m.best = dict(ck.meta["best"])
                m.best_arrays = (ck.arrays["best.A"], ck.arrays["best.C"])
            if "previous.A" in ck.arrays:            # the span of the last tracked entry
                m.previous = (ck.arrays["previous.A"], ck.arrays.get("previous.Li"))
            m.active = ck.meta.get("active", True) and not at_the_floor(m)   # stays stopped
            log.info("resuming at step %d from %s", s.state.t, ck.path)
        self.fit_seconds = float(first.meta["fit_seconds"])
        self.pass_end_pending = bool(first.meta.get("pass_end_pending"))
        self.carried = Carried.from_checkpoint(first.arrays, first.meta.get("carried"))
        if "top_eigenvalues" in first.arrays:
            self.eig_top = first.arrays["top_eigenvalues"]

    def save_checkpoints(self, t: int | None = None, pass_end_pending: bool = False) -> None:
        for m in self.models:
            if m.checkpointer is not None and m.failure is None:
                save_checkpoint(m.checkpointer, m.solver, self.engine.mk, self.engine.mkm,
                                history=m.history, top_eigenvalues=self.eig_top,
                                fit_seconds=self.seconds, meta=m.meta, n_steps=self.n_steps,
                                pass_end_pending=pass_end_pending, tracked=m)

    def stopped(self, exc: Interrupted) -> Interrupted:
        """The error to raise for a stop asked outside the driver's check between blocks
        (inside an evaluation, while waiting for a block): the state at the last block boundary
        is consistent, so it is checkpointed as a stop between blocks would have."""
        if getattr(exc, "checkpointed", False):
            return exc
        t, l = running_step(self.models), self.l
        if t > 0 and any(m.checkpointer is not None for m in self.models):
            self.save_checkpoints(t, pass_end_pending=t % l == 0)
            return Interrupted(f"{exc} at step {t} (pass {-(-t // l)}); checkpoint written: "
                               f"continue with {RESUME_HINT}")
        if t > 0:
            return Interrupted(f"{exc} at step {t}; no checkpoint (fit with a run directory to "
                               "make runs resumable)")
        return Interrupted(f"{exc}, before the first step; nothing to keep: run the command again")


class _SharedStream(_StreamState):
    """The stepping of :func:`run_batches`: the start, every block applied to every active model,
    the evaluations recorded between passes, and the results."""

    def start(self, A_init: np.ndarray | None,
              C_init: np.ndarray | None = None) -> np.ndarray | None:
        """The shared start (``A_init`` or the seeded random one); returns its ``C = A K'``
        where a solver needs it."""
        engine = self.engine
        if engine.mk is None:
            engine.compute_mk()
        solvers = [m.solver for m in self.models]
        A1 = (initial_coefficients(self.r, self.l, schedule.init_generator(self.seed))
              if A_init is None else A_init)
        C1 = C_init
        if C1 is None and any(s.needs_projection for s in solvers):
            C1 = projections(engine, A1)
        for s in solvers:
            s.start(A1, C=C1 if s.needs_projection else None)
        return C1

    def record(self, which: list[_Model], Cs=None, shared_start: bool = False) -> None:
        """Evaluate ``which`` (one pass for C unless given, one for the residuals)."""
        if not which:
            return
        if not self.exact:
            self.track(which, Cs, shared_start=shared_start)
            return
        engine = self.engine
        announce_cost(engine, passes=(Cs is None) + 1, krylov=self.eig_top is None)
        if self.eig_top is None:
            self.eig_top = top_eigenvalues(engine, self.r, seed=self.seed)
        # every model still holding the one start: one evaluation serves all
        As = [m.solver.A for m in (which[:1] if shared_start else which)]
        if Cs is None:      # C = A K' kept with the best state (the result if the end is worse)
            Cs = projections_many(engine, As)
        evs = evaluate_many(engine, As, self.eig_top, Cs=Cs, announce=False)
        if shared_start:
            As, evs, Cs = As * len(which), evs * len(which), list(Cs[:1]) * len(which)
        for m, A, ev, C in zip(which, As, evs, Cs):
            entry = self._entered(m, A, C, ev.error, ev.error_min, ev.excess)
            log.info("%s pass %d step %d: excess error %.3e", m.solver.algorithm, entry["pass"],
                     entry["step"], ev.excess)
            if m.tol is not None and ev.excess <= m.tol and m.active:
                m.active = False
                log.info("%s: excess error %.3e ≤ tol %.3e after pass %d: stopping",
                         m.solver.algorithm, ev.excess, m.tol, entry["pass"])
        shown = [m.history[-1]["excess"] for m in self.models if m.history]
        if shown and self.driver is not None:
            self.driver.show(excess=f"{min(shown):.2e}")

    def track(self, which: list[_Model], Cs=None, shared_start: bool = False) -> None:
        """Tracked evaluations of ``which`` (:mod:`dkha.fit.track`): from each state's ``C``
        (KHA/et, SMD; given as ``Cs``, or one projection pass for the others), no ``E_min``.
        The best entry's state is kept: the fit never ends worse than its best evaluation.
        ``shared_start``: every model still holds the one start, whose ``C`` serves all."""
        if shared_start:
            C = np.array(Cs[0]) if Cs is not None else self._projections(which[:1])[0]
            Cs = [C] * len(which)
        if Cs is None:
            Cs = self._projections(which)
        for m, C in zip(which, Cs):
            A = m.solver.A
            got = tracked(A, C, m.previous)
            m.previous = state_of(A, C)
            entry = self._entered(m, A, C, measure=TRACKED, **got)
            log.info("%s pass %d step %d: captured Σθ² %.10g, span change %.2e",
                     m.solver.algorithm, entry["pass"], entry["step"], got["captured"],
                     got["change"])
        if self.driver is not None:
            shown = [m.history[-1]["change"] for m in self.models if m.history]
            shown = [v for v in shown if not np.isnan(v)]
            if shown:
                self.driver.show(change=f"{max(shown):.1e}")

    def _entered(self, m: _Model, A: np.ndarray, C: np.ndarray, error: float = float("nan"),
                 error_min: float = float("nan"), excess: float = float("nan"), **more) -> dict:
        """An evaluation of ``m``'s state ``A``, ``C`` entered in its history (returned; a tracked
        one has no ``error``, ``error_min``, ``excess``): the state kept where it is the best so
        far (:func:`~dkha.fit.track.better`); ``m`` stopped at once where its passes at the
        default gains for a Nyström start did not improve on the start (:func:`at_the_floor`):
        the start is as good as they can make it."""
        t = m.solver.state.t
        entry = {"pass": -(-t // self.l), "step": t, "error": error, "error_min": error_min,
                 "excess": excess, "wall_time": self.seconds, **more}
        m.history.append(entry)
        if better(entry, m.best):
            m.best = best_entry(entry)
            m.best_arrays = (np.array(A, copy=True), np.array(C, copy=True))
        if m.active and at_the_floor(m):
            m.active = False
            log.info("%s: pass %d did not improve on the Nyström start at the default gains: the "
                     "start is already as good as the passes can make it; stopping",
                     m.solver.algorithm, entry["pass"])
        return entry

    def _projections(self, models: list[_Model], kept: bool = True) -> list[np.ndarray]:
        """Each model's ``C = A K'``: the one its state keeps (KHA/et, SMD: eq. 18) where it keeps
        one (and ``kept``), the others' from one projection pass for all of them."""
        Cs = [getattr(m.solver.state, "C", None) if kept else None for m in models]
        missing = [m.solver.A for m, C in zip(models, Cs) if C is None]
        computed = iter(projections_many(self.engine, missing) if missing else [])
        return [next(computed) if C is None else np.array(C) for C in Cs]

    def set_aside(self, m: _Model, exc: NumericalError) -> None:
        m.active, m.failure = False, str(exc)
        # alone, the model's error is raised (and shown once); beside others, it is a warning
        log.log(self.divergence_level if len(self.models) > 1 else logging.INFO, "%s set aside: %s",
                m.solver.algorithm, exc)

    def _blocks(self, start_step: int):
        engine, solvers = self.engine, [m.solver for m in self.models]
        tagged = ((k, idx) for k, _, idx in
                  schedule.blocks(self.seed, self.l, self.n_steps, engine.block_rows,
                                  start_step=start_step))
        if len(solvers) == 1:
            return engine.stream(tagged, solver=solvers[0], carried=self.carried)
        for s in solvers:   # e.g. resumed from a state saved mid-pass with C̃ on the replicas
            if isinstance(s.state, FactoredState) and s.state.c_stale:
                s.state.set_c_tilde(engine.matmat(s.state.S_tilde[:self.r].T).T)
        return engine.stream(tagged)

    def _end_of_pass(self, done: int, k: int, checkpoint_every: int) -> bool:
        """The work between passes ``done`` and ``k + 1``; ``False`` when no model is left."""
        n_passes = -(-self.n_steps // self.l)
        every = self.evaluate_every
        with self.driver.paused():
            if every > 0 and done % every == 0 and done < n_passes:
                self.record(self.active())
            if not self.active():
                return False
            if checkpoint_every > 0 and k % checkpoint_every == 0:
                self.save_checkpoints()
        return True

    def stream(self, start_step: int, checkpoint_every: int, *, pass_end_pending: bool) -> None:
        """Apply every block of the schedule from ``start_step`` to every active model."""
        l, driver = self.l, self.driver
        # a resume mid-pass continues that pass (its eigenvalue refresh already happened)
        current_pass = start_step // l if start_step % l else -1
        if pass_end_pending:
            current_pass = start_step // l - 1   # saved between a pass's last block and its end
        blocks = self._blocks(start_step)
        driver.start()
        meter = PassMeter(self.engine)
        # closed here, not when the traceback of an interruption lets go of it (the client
        # may be gone by then)
        with contextlib.closing(blocks), meter:
            for k, idx, rows in ([] if not self.active() else blocks):
                if k != current_pass:
                    meter.begin(k)
                    with meter.excluded():
                        more = current_pass < 0 or self._end_of_pass(current_pass + 1, k,
                                                                     checkpoint_every)
                    if not more:
                        break
                    for m in self.active():
                        try:
                            m.solver.begin_pass()
                        except NumericalError as exc:
                            self.set_aside(m, exc)
                    current_pass = k
                for m in self.active():
                    try:
                        m.solver.apply_block(idx, rows)
                    except NumericalError as exc:
                        self.set_aside(m, exc)
                if not self.active():
                    break
                driver.advance(len(idx))
                t = self.active()[0].solver.state.t
                with meter.excluded():
                    driver.between_blocks(t, k + 1, pass_end_pending=t % l == 0)
                meter.mark()
        driver.stop_clock()

    def finish(self) -> list[BatchResult]:
        """The final evaluation (always, unless ``evaluate_every < 0``) and eq. 13 eigenvalues:
        one pass for C; without an evaluation, the ``C = A K'`` a state keeps (KHA/et, SMD:
        eq. 18) instead of a pass."""
        engine, models = self.engine, self.models
        done = [m for m in models if m.failure is None]
        Cs = self._projections(done, kept=self.evaluate_every < 0 or not self.exact)
        if self.evaluate_every >= 0:
            last = [(m, C) for m, C in zip(done, Cs)
                    if not m.history or m.history[-1]["step"] != m.solver.state.t]
            self.record([m for m, _ in last], Cs=[C for _, C in last])
        stats = {"blocks": engine.stats.blocks, "wait_seconds": engine.stats.wait_seconds,
                 "bytes_received": engine.stats.bytes_received}
        results, Cs = [], iter(Cs)
        for m in models:        # what every model's result holds, set aside or not
            own = {"history": m.history, "top_eigenvalues": self.eig_top, "stream_stats": stats,
                   "wall_time": self.driver.seconds, "backoffs": list(m.solver.backoffs)}
            if m.failure is not None:
                results.append(BatchResult(alpha=None, eigenvalue=None, failure=m.failure, **own))
                continue
            A, C = m.solver.A, next(Cs)
            kept = None
            last = m.history[-1] if m.history else {}
            if worse_end(last, m.best) or at_the_floor(m):
                # the end is worse than an earlier evaluation: that state is the result
                A, C = m.best_arrays
                figure = "captured" if last.get("measure") == TRACKED else "error"
                kept = dict(m.best, **{f"{figure}_last": last[figure]})
                after = stopped_after(m, self.n_steps)
                if after is not None:       # stopped at once, before the schedule's end
                    kept["stopped_after"] = after
                log.info("%s: the state of pass %d is better than the last (%s %.10g, last "
                         "%.10g): it is the result", m.solver.algorithm, m.best["pass"], figure,
                         m.best[figure], last[figure])
            results.append(BatchResult(alpha=A.copy(), eigenvalue=eigenvalue_estimate(A, C),
                                       projection=C, kept=kept, **own))
        return results


class PassMeter:
    """One record per KHA pass of the block stream in ``engine.stats.passes``: blocks, rows,
    the pass's wall seconds (its end-of-pass work, e.g. an evaluation, excluded: those passes
    have records of their own), the seconds the coordinator waited for blocks and was busy (the
    rest), the CPU seconds of the coordinator's thread (``busy_cpu_seconds``: its own work, which
    a coordinator sharing its cores with the workers stretches in wall seconds), when it
    ``began`` and ``ended`` (``time.time()``, to match a task stream), bytes received
    from the workers and sent to replicas, and where the projections were computed. A pass runs
    from the end of the previous pass's last block to the end of its own."""

    _COUNTERS = ("blocks", "rows", "wait_seconds", "bytes_received", "bytes_sent")

    def __init__(self, engine):
        self.engine = engine
        self.open: dict | None = None
        self.mark()

    def mark(self) -> None:
        """A block was applied: the point a pass that ends here ends at."""
        self.last = {"time": time.perf_counter(), "cpu": time.thread_time(), "epoch": time.time(),
                     **{c: getattr(self.engine.stats, c) for c in self._COUNTERS}}

    def begin(self, k: int) -> None:
        """Pass ``k``'s first block has arrived (the previous pass ended at the last mark)."""
        self.end()
        self.open = dict(self.last, k=k, excluded=0.0, excluded_cpu=0.0)

    @contextlib.contextmanager
    def excluded(self):
        """Work between passes that is not the pass's own."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            if self.open is not None:
                self.open["excluded"] += time.perf_counter() - t0
                self.open["excluded_cpu"] += time.thread_time() - c0

    def end(self) -> None:
        if self.open is None:
            return
        o, self.open = self.open, None
        now = self.last
        rec = {"what": f"KHA pass {o['k'] + 1}", "kind": "kha",
               "projections": getattr(self.engine, "projections", "coordinator"),
               "wall_seconds": now["time"] - o["time"] - o["excluded"],
               **{c: now[c] - o[c] for c in self._COUNTERS}}
        rec["tasks"] = rec["blocks"]
        rec["busy_seconds"] = max(0.0, rec["wall_seconds"] - rec["wait_seconds"])
        rec["busy_cpu_seconds"] = max(0.0, now["cpu"] - o["cpu"] - o["excluded_cpu"])
        rec["began"], rec["ended"] = o["epoch"], now["epoch"]     # time.time(), for task streams
        self.engine.stats.passes.append(rec)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.end()


def save_checkpoint(checkpointer, solver: BatchKHA, mk: np.ndarray, mkm: float, *,
                    history: list, top_eigenvalues: np.ndarray | None, fit_seconds: float,
                    meta: dict | None, n_steps: int, pass_end_pending: bool = False,
                    tracked=None) -> str:
    """Write ``solver``'s complete state (with the centering ``mk``, ``mkm``) as a checkpoint.

    ``pass_end_pending``: written after a pass's last block but before its end-of-pass work
    (evaluation, pass checkpoint), which a resume then does first."""
    # worker projections: C̃ brought home and the blocks in flight (a resume goes on bit for bit)
    carried = solver.replicas.checkpoint() if solver.replicas is not None else None
    arrays, scalars = state_to_arrays(solver.state)
    out = {f"state.{k}": v for k, v in arrays.items()}
    if carried is not None:
        out.update(carried[0])
    out["mk"] = mk
    if top_eigenvalues is not None:
        out["top_eigenvalues"] = np.asarray(top_eigenvalues)
    best = None
    if tracked is not None and tracked.best is not None:     # the best evaluation's state
        best = tracked.best
        out["best.A"], out["best.C"] = tracked.best_arrays
    if tracked is not None and tracked.previous is not None:     # a tracked entry's span
        out["previous.A"] = tracked.previous[0]
        if tracked.previous[1] is not None:
            out["previous.Li"] = tracked.previous[1]
    meta = dict(meta or {}, mkm=mkm, best=best, history=history, fit_seconds=fit_seconds,
                backoffs=solver.backoffs,
                state_scalars=scalars, state_class=type(solver.state).__name__, n_steps=n_steps,
                pass_end_pending=pass_end_pending, carried=carried and carried[1],
                active=True if tracked is None else bool(tracked.active))
    return checkpointer.save(solver.state.t, out, meta)
