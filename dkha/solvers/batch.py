"""The batch KHA family: KHA, KHA/t, KHA/et and KHA-SMD (Schraudolph, Günter & Vishwanathan 2006).

:class:`BatchKHA` owns the small sequential state (``A``, and for SMD ``B`` and ``ρ``; ``C = A K'``
where the gains need eigenvalue estimates) and consumes blocks of centered kernel rows
``K'[P, :]`` in schedule order. The gains live here, in one place, each algorithm's from its
spec (:class:`dkha.algorithms.AlgorithmSpec`: its :class:`~dkha.algorithms.GainRule`, its
``update``):

* ``kha``      ``η_t = η0 / κ̄`` (eq. 8/10)
* ``kha-t``    ``η_t = η0 / κ̄ · l / (t + l)``
* ``kha-et``   ``[η_t]_i = η0 / κ̄ · λ_r / λ_i · l / (t + l)`` (eq. 12 with its base gain
               ``η0 λ_r / (‖λ‖ κ̄)``), ``λ`` by eq. 13 from the exact ``C = A K'`` once per pass
               (at the pass's first step), ``λ_r`` the smallest
* ``kha-smd``  ``e^ρ ⊙ η_t`` with ``η_t`` the KHA/et gain and ``ρ`` adapted by eq. 16 with the
               meta-gain ``μ / κ̄``

``t`` counts the steps taken before the current one (0 at the first step).

**Gains without units.** ``κ̄`` (:func:`feature_norm`) is the squared feature-space norm of the
centered samples, ``K'[p, p] = ‖Φ'(x_p)‖²``, averaged with the weights ``K'[p, p]``:
``Σ K'[p, p]² / Σ K'[p, p]``. Every update is GHA's in feature space,
``w_i ← w_i + d_i y_i (Φ'(x_p) − Σ_{j≤i} y_j w_j)``; for a unit component it changes the squared
norm by ``d_i y_i² (d_i ‖Φ'(x_p)‖² − 2)`` (plus the deflation terms), so GHA is stable only
while ``d_i ‖Φ'(x_p)‖² < 2`` on the samples that carry the component (weights ``y_i²``, which
grow with ``K'[p, p]``). With the gains above the largest step ``d_i κ̄`` is ``η0 · l/(t + l)``
for every algorithm and data set: ``η0`` is that dimensionless step, stable below about 2 on
any data, kernel, width, ``l`` and ``r``, and the whole fit is invariant under ``k → c·k``
(``μ``'s units are those of ``y z``, ``κ̄``). KHA/et's eq. 12 equalises the components' rates
(``d_i λ_i`` the same for all ``i``); normalising by its largest gain keeps the smallest
component within the step condition where ``‖λ‖ / λ_r`` reaches 10–100 after the first pass.

Two engines apply the steps: ``"factored"`` (the default), the exact factored form of
coordinator-math.md §3 with its in-block loop compiled (:mod:`dkha.solvers.factored`), and
``"reference"``, the straightforward ``O(r² l)`` per-step form (each update's ``reference_step``),
kept as the oracle the tests compare against.

The factored engine also takes blocks whose projections were computed on the workers
(coordinator-math.md §4, :class:`dkha.engine.replicas.ProjectedBlock`) while a row engine's stream
has attached its replicas (:meth:`BatchKHA.attach_replicas`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from dkha import algorithms
from dkha.algorithms import BATCH, AlgorithmSpec
from dkha.errors import NumericalError, ParameterError
from dkha.names import BATCH_ALGORITHMS, COLD_MU, DEFAULT_MU, DEFAULT_XI
from dkha.solvers import reference, updates
from dkha.solvers.factored import DEFAULT_FOLD_CONDITION, BadStep, FactoredState

log = logging.getLogger(__name__)

#: the batch algorithms the package defines (:func:`batch_spec` also takes those registered
#: later)
ALGORITHMS = BATCH_ALGORITHMS
ENGINES = ("factored", "reference")
WARM_ETA0_MAX = 0.05


def default_eta0(algorithm: str, *, warm: bool) -> float | None:
    """The default ``η0`` of ``algorithm`` from a random start (its spec's ``eta0``: units of
    κ̄, see the module docstring; 0 for an algorithm without gains); ``None`` from a Nyström
    start, where it follows from the start (:func:`warm_eta0`). SMD's μ: :func:`default_mu`."""
    spec = algorithms.REGISTRY.get(algorithm)
    return None if warm else (spec.eta0 if spec is not None and spec.eta0 is not None else 0.0)


def default_mu(*, warm: bool) -> float:
    """SMD's default meta-gain: :data:`DEFAULT_MU` from a Nyström start, :data:`COLD_MU` from
    the random start (where the log-gains start far from their values at convergence and a
    larger μ keeps them noisy for the whole fit)."""
    return DEFAULT_MU if warm else COLD_MU


def start_deficit(nystrom_eigenvalues: np.ndarray, eigenvalues: np.ndarray) -> float:
    """``δ = mean_i (λ_i − s_i) / λ_i``: how far the Nyström eigenvalues ``s`` fall short of
    the eq. 13 estimates ``λ`` of the same components on the exact ``K'``.

    The Nyström approximation ``K'_M ⪯ K'`` misses a part of ``K'`` along each of its
    components, and that part is what a refinement has to add; ``δ`` is 0 for an exact start
    (e.g. ``l − 1`` landmarks) and the start's excess error is about ``δ²`` (within a factor of
    a few; on digits, standardized tables and patches, 50 to 1500 landmarks)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    s = np.asarray(nystrom_eigenvalues, dtype=np.float64)
    return float(np.clip(np.mean((lam - s) / lam), 0.0, 1.0))


def warm_eta0(algorithm: str, deficit: float) -> float:
    """The default ``η0`` from a Nyström start with eigenvalue deficit ``δ``
    (:func:`start_deficit`): its spec's ``warm_eta0 · δ``, at most :data:`WARM_ETA0_MAX`, at
    least 1e-8.

    KHA's steps add noise in proportion to the gain: a refinement step must stay well below
    the start's error, or the first pass makes the start worse. On 2 000 photo patches
    (r = 20, 800 landmarks, δ = 0.009, start excess 2.289e-4) KHA-SMD's pass 1 ended at
    3.06e-4 with 2δ, 2.49e-4 with δ, 2.30e-4 with δ/4 and improved the start only from δ/10
    down (δ/20: 2.2880e-4, then 2.2858e-4 after 3 passes); KHA/t rose at δ/50 still
    (4.6e-4). KHA/et and SMD take ``δ/20``; KHA and KHA/t, whose single gain is the top
    components' too (they carry most of ``E``), a fiftieth of that. (Where a pass still makes
    the state worse, the tracked evaluation keeps the better state: :mod:`dkha.fit.track`.)"""
    return float(np.clip(batch_spec(algorithm).warm_eta0 * deficit, 1e-8, WARM_ETA0_MAX))




def default_landmarks(n_samples: int, n_components: int, budget: int | None = None
                      ) -> int | None:
    """Landmarks of the default Nyström start: ``40 r``, at least 400, at most ``l − 1`` and, with
    ``budget`` (bytes), at most as many rows of ``l`` float64 values as fill half of it (the
    rows are held whole while the start is computed: 640 rows at l = 200 000 took 1 GB, and
    the fit's peak to 2.3 GiB), but not fewer than ``2 r``; ``None`` where that leaves fewer
    than ``r`` (then the random start)."""
    m = min(n_samples - 1, max(40 * n_components, 400))
    if budget is not None:
        m = min(m, max(2 * n_components, int(budget) // (2 * 8 * max(1, n_samples))))
    return m if m >= n_components else None


def feature_norm(diagonal: np.ndarray) -> float:
    """``κ̄ = Σ K'[p, p]² / Σ K'[p, p]``: the squared feature-space norm of the centered samples,
    weighted as GHA's step condition weighs them (module docstring); ``diagonal`` is ``K'[p, p]``
    for every sample (:meth:`dkha.engine.rows.RowEngine.centered_diagonal`)."""
    kappa = np.maximum(np.asarray(diagonal, dtype=np.float64), 0.0)
    total = kappa.sum()
    if not (np.isfinite(total) and total > 0):
        raise ParameterError("the centered kernel's diagonal is zero: every sample maps to the "
                             "same point in feature space (duplicate samples, or a kernel width "
                             "far too large); choose another kernel or width")
    return float((kappa * kappa).sum() / total)
ON_DIVERGENCE = ("backoff", "stop")
#: a backoff halves the gain; a run still diverging after this many halvings (gain × 2⁻³⁰) fails
MAX_BACKOFFS = 30


def check_on_divergence(value: str) -> str:
    """``value`` if it is one of :data:`ON_DIVERGENCE`, else a :class:`ParameterError`."""
    if value not in ON_DIVERGENCE:
        raise ParameterError(f"on_divergence must be one of {', '.join(ON_DIVERGENCE)}, "
                             f"got {value!r}")
    return value


def batch_spec(algorithm: str) -> AlgorithmSpec:
    """The spec of the batch algorithm ``algorithm``; an unknown name, or one whose update is
    not served here (:data:`dkha.solvers.updates.TABLE`), is refused in one line."""
    return algorithms.served(algorithm, BATCH, updates.names(), label="algorithm",
                             by="the batch solvers")


def initial_coefficients(n_components: int, n_samples: int, rng: np.random.Generator, *,
                         support: int | None = None) -> np.ndarray:
    """``A1 ~ N(0, 1/(r l))`` (Algorithm 1, step 1d); with ``support=M``, ``N(0, 1/(r M))`` on
    ``M`` random columns and zero elsewhere (the same norms; ``A1 K'`` from ``M`` kernel rows)."""
    if support is None:
        return rng.standard_normal((n_components, n_samples)) / np.sqrt(n_components * n_samples)
    columns = np.sort(rng.choice(n_samples, size=int(support), replace=False))
    A = np.zeros((n_components, n_samples))
    A[:, columns] = rng.standard_normal((n_components, len(columns))) / np.sqrt(
        n_components * len(columns))
    return A


def eigenvalue_estimate(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Eq. 13/14: ``λ_i = ‖(A K')_i‖ / ‖A_i‖``."""
    return np.sqrt(np.einsum("ij,ij->i", C, C) / np.einsum("ij,ij->i", A, A))


@dataclass
class BatchState:
    """The reference engine's state, held plainly. ``C = A K'`` is kept for ``kha-et`` and
    ``kha-smd`` only. (The factored engine's state, :class:`~dkha.solvers.factored.FactoredState`,
    exposes the same attributes.)"""

    A: np.ndarray
    B: np.ndarray | None = None
    rho: np.ndarray | None = None
    C: np.ndarray | None = None
    lam: np.ndarray | None = None
    t: int = 0
    gain_factor: float = 1.0     # halved by each backoff (a checkpointed part of the state)


class BlockStart:
    """A copy of a solver's state at the start of a block: where a backoff rolls back to.

    The copy's arrays are kept from block to block and overwritten in place (a block's start
    costs copies, not allocations). The factored state's ``S̃`` (``m×l``) is copied only where a
    block changes more of it than the columns of its steps: a block whose ``T`` is not the
    identity changes only those columns until its first fold (a direct step needs ``T = I``),
    so the copy holds them (``m×b``) and takes the rest of ``S̃`` at that fold, if one comes
    (:meth:`before_fold`): a block's start costs ``O(m b)``, not ``O(m l)``."""

    # class defaults: a copy pickled before these existed reads them
    columns: tuple | None = None        # (index, S̃[:, index]): S̃ copied by the block's columns
    whole: np.ndarray | None = None     # a copy of all of S̃, its array kept from block to block
    taken = False                       # whether ``whole`` holds S̃ at this block's start

    def __init__(self):
        self.state = None
        self.saved: dict = {}

    def save(self, st, *, keep_replicated: bool = False, index: np.ndarray | None = None
             ) -> None:
        """Copy ``st`` (its transient caches left out). ``keep_replicated``: the worker replicas
        follow the state; blocks of projections change ``S̃`` only once they are taken
        (``FactoredState._defer``) and ``C̃`` only on the replicas, so a rollback leaves both as
        they are. ``index``: the block's samples (the factored state's ``S̃`` then by columns,
        where its ``T`` is not the identity; :meth:`release` when the block is done)."""
        saved = self.saved if self.state is st else {}
        if hasattr(st, "sync_c"):       # the factored state's C̃ may be taking a block's update
            st.sync_c()
        skip = set(getattr(st, "TRANSIENT", ())) | {"S_tilde"}      # S̃: in ``whole``
        saved.pop("S_tilde", None)
        self.columns, self.taken = None, False
        if keep_replicated:
            skip.add("C_tilde")
            saved.pop("C_tilde", None)
        elif "S_tilde" in vars(st):
            if index is not None and not getattr(st, "fresh", True):
                index = np.array(index, dtype=np.int64)
                self.columns = (index, np.take(st.S_tilde, index, axis=1))
                st.block_start = self
            else:
                self._take(st.S_tilde)
        for k, v in vars(st).items():
            if k in skip:
                continue
            old = saved.get(k)
            if isinstance(v, np.ndarray):
                if isinstance(old, np.ndarray) and old.shape == v.shape and old.dtype == v.dtype:
                    np.copyto(old, v)
                else:
                    saved[k] = v.copy()
            else:
                saved[k] = v
        self.state, self.saved = st, saved

    def _take(self, S: np.ndarray) -> None:
        """``S̃`` into ``whole`` (its array overwritten where it fits)."""
        if isinstance(self.whole, np.ndarray) and self.whole.shape == S.shape \
                and self.whole.dtype == S.dtype:
            np.copyto(self.whole, S)
        else:
            self.whole = S.copy()
        self.taken = True

    def before_fold(self, st) -> None:
        """``S̃`` at the block's start, taken before a fold changes all of it: as it is now (the
        block has changed only its own columns so far) with those columns as they were."""
        if self.taken or self.columns is None:
            return
        self._take(st.S_tilde)
        index, cols = self.columns
        self.whole[:, index] = cols

    def release(self) -> None:
        """The block is done: its state no longer calls :meth:`before_fold`."""
        if self.state is not None:
            self.state.__dict__.pop("block_start", None)

    def restore(self, *, gain_factor: float) -> None:
        """Put the copy back into the state, with ``gain_factor`` (kept in the copy too: where a
        second rollback of the same block returns to)."""
        st = self.state
        self.saved["gain_factor"] = gain_factor
        for k, v in self.saved.items():
            setattr(st, k, v.copy() if isinstance(v, np.ndarray) else v)
        if self.taken:
            st.S_tilde = self.whole.copy()
        elif self.columns is not None:      # only the block's columns changed: put them back
            index, cols = self.columns
            st.S_tilde[:, index] = cols
        if hasattr(st, "forget_values"):   # the factored state's snapshots of A, B, C
            st.forget_values()


class BatchKHA:
    """Gains and updates of one batch algorithm over blocks of centered kernel rows.

    Parameters
    ----------
    algorithm : {"kha", "kha-t", "kha-et", "kha-smd"}
    n_components, n_samples : int
    eta0, mu, xi, rho0 : float
        ``eta0`` the base gain; ``mu`` SMD's meta-gain, ``xi`` its decay, ``rho0`` the initial
        log-gain (Algorithm 1 prints ρ0 = 1; 0 converges much better, see the docs).
    feature_norm : float or None, default 1.0
        ``κ̄`` (:func:`feature_norm`): ``eta0`` and ``mu`` are in its units (module docstring).
        1.0 takes them as raw gains; ``None`` leaves it to the coordinator, which sets it from
        the row engine (:meth:`set_feature_norm`) before the first step.
    engine : {"factored", "reference"}
        ``"factored"`` (default) the exact factored form, ``O(r l)`` per step in two GEMMs per
        block plus ``O(r² + b r)`` compiled work per step; ``"reference"`` the ``O(r² l)``
        per-step form, for tests.
    fold_condition : float
        Factored engine: fold ``T`` into ``S̃`` before ``cond(T)`` exceeds this.
    on_divergence : {"backoff", "stop"}
        What a bad step does (:func:`reference.guard`): ``"backoff"`` (default) rolls the state
        back to the start of its block, halves the gain (the state's ``gain_factor``, which
        multiplies every gain; KHA-SMD also lowers log-gains ``ρ`` above ``rho0`` to ``rho0``),
        records the event in :attr:`backoffs` and applies the block again; ``"stop"`` raises
        :class:`NumericalError`. A run still diverging after :data:`MAX_BACKOFFS` halvings
        raises it too.
    """

    def __init__(self, algorithm: str, n_components: int, n_samples: int, *, eta0: float,
                 mu: float = DEFAULT_MU, xi: float = DEFAULT_XI, rho0: float = 0.0,
                 engine: str = "factored", fold_condition: float = DEFAULT_FOLD_CONDITION,
                 feature_norm: float | None = 1.0, on_divergence: str = "backoff",
                 gain_params=None):
        if engine not in ENGINES:
            raise ParameterError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        self.engine = engine
        self.fold_condition = float(fold_condition)
        self.spec = batch_spec(algorithm)
        self.algorithm = self.spec.name
        self.r = int(n_components)
        self.l = int(n_samples)
        self.eta0 = float(eta0)
        self.mu = float(mu)
        self.xi = float(xi)
        self.rho0 = float(rho0)
        self.gain_params = self.spec.gains.resolved(gain_params)
        self.feature_norm = None
        if feature_norm is not None:
            self.set_feature_norm(feature_norm)
        self.state: BatchState | FactoredState | None = None
        # a stream's dkha.engine.replicas.WorkerReplicas while one is attached
        self.replicas = None
        self.on_divergence = check_on_divergence(on_divergence)
        #: one dict per backoff: step, pass (1-based, of the bad step), gain_before, gain_after
        #: (the effective η0, ``eta0 × gain_factor``), rolled_back_to (the block's first step)
        #: and reason
        self.backoffs: list[dict] = []
        self._block_start = BlockStart()     # the state's copy a backoff rolls back to
        # of the backoff messages (INFO where a table shows them)
        self.log_level = logging.WARNING

    @property
    def needs_projection(self) -> bool:
        """Whether the state needs ``C = A K'`` computed when it starts."""
        return self.spec.keeps_c

    def start(self, A: np.ndarray, C: np.ndarray | None = None, t: int = 0) -> None:
        """Start from coefficients ``A`` (and ``C = A K'`` where :attr:`needs_projection`)."""
        A = np.array(A, dtype=np.float64, order="C")
        if self.needs_projection:
            if C is None:
                raise ValueError(f"{self.algorithm} needs C = A K' to start")
            C = np.array(C, dtype=np.float64, order="C")
        else:
            C = None
        if self.engine == "factored":
            self.state = FactoredState(A, C=C, update=self.spec.update, rho0=self.rho0, t=t,
                                       fold_condition=self.fold_condition)
            return
        st = BatchState(A=A, C=C, t=int(t))
        u = self.update
        if u.stacked > 1:
            st.B = np.zeros_like(A)
        for name, value in (u.start(self.r, self.rho0) if u.start is not None else {}).items():
            setattr(st, name, value)
        self.state = st

    @property
    def update(self) -> updates.Update:
        """The in-block update of its spec (:mod:`dkha.solvers.updates`)."""
        return updates.get(self.spec.update)

    def begin_pass(self) -> None:
        """Refresh the eigenvalue estimates (eq. 13) from the exact ``C`` (once per pass).

        The factored engine also folds ``T`` here, and the update does its own pass-start work
        (:meth:`FactoredState.resync`: SMD re-synchronises its Grams from ``C``).
        """
        st = self.state
        if isinstance(st, FactoredState):
            if st.c_stale and self.replicas is not None:
                st.set_c_tilde(self.replicas.synchronise())
            folded = st.fold()
            if folded is not None and self.replicas is not None:
                self.replicas.messages.record_fold(folded)
            st.resync()
        if st.C is not None:
            st.lam = eigenvalue_estimate(st.A, st.C)

    def attach_replicas(self, replicas) -> None:
        """Let a block stream's worker replicas (:class:`dkha.engine.replicas.WorkerReplicas`)
        follow the state: folds made here are recorded with them, and projected blocks are completed
        by them. Only the factored engine supports this."""
        if not isinstance(self.state, FactoredState):
            raise ParameterError("projections on the workers need the factored engine")
        self.replicas = replicas

    def detach_replicas(self) -> None:
        self.replicas = None

    def set_feature_norm(self, value: float) -> None:
        """Set ``κ̄``, the unit of ``eta0`` and ``mu`` (:func:`feature_norm`)."""
        value = float(value)
        if not (np.isfinite(value) and value > 0):
            raise ParameterError(f"feature_norm must be a positive number, got {value}")
        self.feature_norm = value

    @property
    def meta_gain(self) -> float:
        """SMD's meta-gain as applied, ``μ / κ̄``."""
        return self.mu / self._unit()

    def effective_gains(self) -> dict:
        """What the gains were in the kernel's own units: ``feature_norm`` (κ̄), ``gain``
        (``η0/κ̄``, the largest ``d_i`` before the decay ``l/(t + l)``) and, for SMD,
        ``meta_gain`` (``μ/κ̄``)."""
        out = {"feature_norm": self.feature_norm, "gain": self.eta0 / self._unit()}
        if self.spec.has_mu:
            out["meta_gain"] = self.meta_gain
        return out

    def _unit(self) -> float:
        if self.feature_norm is None:
            raise ValueError("the gains' unit κ̄ is not set: call set_feature_norm first")
        return self.feature_norm

    def component_gains(self) -> np.ndarray:
        """The gains of step ``t`` without its decay, per component (the spec's gain rule)."""
        eta0 = self.eta0 / self._unit()
        return np.full(self.r, self.spec.gains.weights(self.state, self.gain_params) * eta0)

    def base_gain(self, t: int) -> np.ndarray:
        """``η_t`` (before SMD's ``e^ρ``) for the step after ``t`` steps."""
        return self.component_gains() * self.spec.gains.decay(t, self.l, self.gain_params)

    def block_gains(self, t: int, n_steps: int) -> np.ndarray:
        """``base_gain`` of the ``n_steps`` steps from step ``t`` on, as an ``n_steps×r`` array."""
        steps = t + np.arange(n_steps)
        decay = np.broadcast_to(self.spec.gains.decay(steps, self.l, self.gain_params),
                                steps.shape)
        return decay[:, None] * self.component_gains()[None, :]

    def apply_block(self, index: np.ndarray, rows) -> None:
        """Apply one step per entry of ``index``; ``rows[j] = K'[index[j], :]``.

        With ``on_divergence="backoff"`` a bad step rolls the state back to the block's start,
        halves the gain and applies the block again (:meth:`back_off`).

        ``rows`` may instead be a :class:`dkha.engine.replicas.ProjectedBlock` from the stream
        whose replicas are attached (factored engine): its projections are brought up to date by the
        replicas, and the block's message is recorded with them. At the end of each pass
        (``t`` a multiple of ``l``) the replicas are checked and ``C̃`` is brought home.
        """
        prepared = None
        if isinstance(self.state, FactoredState) and isinstance(rows, np.ndarray):
            # the block's GEMM with S̃ first: C̃ may still be taking the last block's update
            prepared = self.state.prepare_block(index, rows)
        if self.on_divergence == "stop":
            self._apply_block(index, rows, prepared)
            return
        self._block_start.save(self.state, keep_replicated=self.replicas is not None,
                               index=index)
        try:
            while True:
                try:
                    self._apply_block(index, rows, prepared)
                    return
                except NumericalError as exc:
                    self.back_off(exc)
        finally:
            self._block_start.release()

    def back_off(self, exc: NumericalError) -> None:
        """Roll the state back to the block's start and halve the gain; record the event.

        Raises ``exc`` (with the backoffs named) once :data:`MAX_BACKOFFS` halvings did not help.
        """
        st = self._block_start.state
        t_bad = getattr(exc, "step", None)
        factor = st.gain_factor
        if len(self.backoffs) >= MAX_BACKOFFS:
            raise NumericalError(f"{exc} (still, after {len(self.backoffs)} backoffs that "
                                 f"halved the gain to {factor:g} of eta0)") from None
        self._block_start.restore(gain_factor=factor * 0.5)
        if getattr(st, "rho", None) is not None:
            # SMD: its divergences are runaway log-gains; those above the start go back to it
            st.rho = np.minimum(st.rho, self.rho0)
        before = self.eta0 * factor
        t_bad = st.t if t_bad is None else t_bad
        event = {"step": int(t_bad) + 1, "pass": int(t_bad) // self.l + 1,
                 "gain_before": before, "gain_after": self.eta0 * st.gain_factor,
                 "rolled_back_to": int(st.t), "reason": str(exc)}
        self.backoffs.append(event)
        log.log(self.log_level, "%s diverged at step %d (pass %d); rolled back to step %d and "
                "halved the gain: eta0 %.3g → %.3g", self.algorithm, event["step"], event["pass"],
                st.t, event["gain_before"], event["gain_after"])

    def _apply_block(self, index: np.ndarray, rows, prepared: tuple | None = None) -> None:
        st = self.state
        if isinstance(st, FactoredState):
            eta = self.block_gains(st.t, len(index)) * st.gain_factor
            try:
                if isinstance(rows, np.ndarray):
                    st.apply_block(index, rows, eta, mu=self.meta_gain, xi=self.xi,
                                   prepared=prepared)
                else:
                    if self.replicas is None:
                        raise ValueError("a block of projections needs the replicas of its "
                                         "stream attached (RowEngine.stream(..., solver=...))")
                    Y, kpp = self.replicas.messages.projections(rows)
                    ops: list = []
                    st.apply_block(index, None, eta, mu=self.meta_gain, xi=self.xi, projections=Y,
                                   kpp=kpp, ops=ops)
                    self.replicas.messages.record_block(rows, ops)
            except BadStep as bad:
                raise self.diverged(st.t + bad.j, bad.quantity, bad.component) from None
            st.t += len(index)
            self.check_finite()
            if self.replicas is not None and st.t % self.l == 0:     # a pass end
                C_tilde = self.replicas.synchronise()
                if C_tilde is not None:
                    st.set_c_tilde(C_tilde)
            return
        step = self.update.reference_step
        for j, p in enumerate(index):
            eta = self.base_gain(st.t) * st.gain_factor
            bad = step(st, int(p), rows[j], eta, self.meta_gain, self.xi)
            if bad is not None:
                raise self.diverged(st.t, *bad)
            st.t += 1
        self.check_finite()

    def diverged(self, t: int, quantity: str, component: int) -> NumericalError:
        """The error for a bad step after ``t`` steps (:func:`reference.guard`'s findings)."""
        i = f" of component {component}" if component >= 0 else ""
        what = {"A": f"non-finite coefficients A{i}",
                "B": f"non-finite values in SMD's B = dA/dρ{i}",
                "gain": f"a non-finite gain{i}",
                "A runaway": f"runaway growth: component {component} passed "
                             f"{reference.RUNAWAY:g} times unit norm",
                "gain runaway": f"runaway growth of the gain{i}: e^ρ passed "
                                f"{reference.RUNAWAY:g}",
                "Gram": "non-finite values in SMD's Gram matrices"}.get(quantity, quantity)
        exc = NumericalError(
            f"{self.algorithm} diverged at step {t + 1} (pass {t // self.l + 1}): {what}; the "
            f"step was not kept and nothing of it was checkpointed; lower eta0 (now {self.eta0})"
            + (f" or mu (now {self.mu})" if self.spec.has_mu else ""))
        exc.step = t
        return exc

    def check_finite(self) -> None:
        """Raise :class:`NumericalError` if the state holds non-finite values (a diverged run)."""
        st = self.state
        if isinstance(st, FactoredState):
            name = st.nonfinite()
        else:
            values = ((n, getattr(st, n)) for n in ("A", "B", "rho"))
            name = next((n for n, v in values if v is not None and not np.isfinite(v).all()), None)
        if name is not None:
            raise NumericalError(
                f"{self.algorithm} diverged: non-finite values in {name} by step {st.t}; "
                f"lower eta0 (now {self.eta0})"
                + (f" or mu (now {self.mu})" if self.spec.has_mu else "")
            )

    @property
    def A(self) -> np.ndarray:
        """Current coefficients ``A`` (``r×l``); a read-only snapshot for the factored engine."""
        return self.state.A
