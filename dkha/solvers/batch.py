"""The batch KHA family: KHA, KHA/t, KHA/et and KHA-SMD (Schraudolph, Günter & Vishwanathan 2006).

:class:`BatchKHA` owns the small sequential state (``A``, and for SMD ``B`` and ``ρ``; ``C = A K'``
where the gains need eigenvalue estimates) and consumes blocks of centered kernel rows
``K'[P, :]`` in schedule order. The gains live here, in one place:

* ``kha``      ``η_t = η0`` (eq. 8/10)
* ``kha-t``    ``η_t = η0 · l / (t + l)``
* ``kha-et``   ``[η_t]_i = ‖λ‖ / λ_i · l / (t + l) · η0`` (eq. 12), ``λ`` by eq. 13 from the
               exact ``C = A K'`` once per pass (at the pass's first step)
* ``kha-smd``  ``e^ρ ⊙ η_t`` with ``η_t`` the KHA/et gain and ``ρ`` adapted by eq. 16

``t`` counts the steps taken before the current one (0 at the first step).

Two engines apply the steps: ``"factored"`` (the default), the exact factored form of
coordinator-math.md §3 with its in-block loop compiled (:mod:`dkha.solvers.factored`), and
``"reference"``, the straightforward ``O(r² l)`` per-step form (:mod:`dkha.solvers.reference`),
kept as the oracle the tests compare against.

The factored engine also takes blocks whose projections were computed on the workers
(coordinator-math.md §4, :class:`dkha.engine.replicas.ProjectedBlock`) while a row engine's stream has
attached its replicas (:meth:`BatchKHA.attach_replicas`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.errors import NumericalError, ParameterError
from dkha.solvers import reference
from dkha.solvers.factored import DEFAULT_FOLD_CONDITION, BadStep, FactoredState

ALGORITHMS = ("kha", "kha-t", "kha-et", "kha-smd")
ENGINES = ("factored", "reference")
DEFAULT_ETA0 = {"kha": 0.05, "kha-t": 0.5, "kha-et": 0.2, "kha-smd": 0.2}
DEFAULT_MU = 0.2
DEFAULT_XI = 0.99


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ParameterError(
            f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return algorithm


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


class BatchKHA:
    """Gains and updates of one batch algorithm over blocks of centered kernel rows.

    Parameters
    ----------
    algorithm : {"kha", "kha-t", "kha-et", "kha-smd"}
    n_components, n_samples : int
    eta0, mu, xi, rho0 : float
        ``eta0`` the base gain; ``mu`` SMD's meta-gain, ``xi`` its decay, ``rho0`` the initial
        log-gain (Algorithm 1 prints ρ0 = 1; 0 converges much better, see the docs).
    engine : {"factored", "reference"}
        ``"factored"`` (default) the exact factored form, ``O(r l)`` per step in two GEMMs per
        block plus ``O(r² + b r)`` compiled work per step; ``"reference"`` the ``O(r² l)``
        per-step form, for tests.
    fold_condition : float
        Factored engine: fold ``T`` into ``S̃`` before ``cond(T)`` exceeds this.
    """

    def __init__(self, algorithm: str, n_components: int, n_samples: int, *, eta0: float,
                 mu: float = DEFAULT_MU, xi: float = DEFAULT_XI, rho0: float = 0.0,
                 engine: str = "factored", fold_condition: float = DEFAULT_FOLD_CONDITION):
        if engine not in ENGINES:
            raise ParameterError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        self.engine = engine
        self.fold_condition = float(fold_condition)
        self.algorithm = check_algorithm(algorithm)
        self.r = int(n_components)
        self.l = int(n_samples)
        self.eta0 = float(eta0)
        self.mu = float(mu)
        self.xi = float(xi)
        self.rho0 = float(rho0)
        self.state: BatchState | FactoredState | None = None
        self.replicas = None     # a stream's dkha.engine.replicas.WorkerReplicas while one is attached

    @property
    def needs_projection(self) -> bool:
        """Whether the state needs ``C = A K'`` computed when it starts."""
        return self.algorithm in ("kha-et", "kha-smd")

    def start(self, A: np.ndarray, C: np.ndarray | None = None, t: int = 0) -> None:
        """Start from coefficients ``A`` (and ``C = A K'`` where :attr:`needs_projection`)."""
        A = np.array(A, dtype=np.float64, order="C")
        if self.needs_projection:
            if C is None:
                raise ValueError(f"{self.algorithm} needs C = A K' to start")
            C = np.array(C, dtype=np.float64, order="C")
        else:
            C = None
        smd = self.algorithm == "kha-smd"
        if self.engine == "factored":
            self.state = FactoredState(A, C=C, smd=smd, rho0=self.rho0, t=t,
                                       fold_condition=self.fold_condition)
            return
        st = BatchState(A=A, C=C, t=int(t))
        if smd:
            st.B = np.zeros_like(A)
            st.rho = np.full(self.r, self.rho0)
        self.state = st

    def begin_pass(self) -> None:
        """Refresh the eigenvalue estimates (eq. 13) from the exact ``C`` (once per pass).

        The factored engine also folds ``T`` here, and SMD re-synchronises its Grams from ``C``.
        """
        st = self.state
        if isinstance(st, FactoredState):
            if st.c_stale and self.replicas is not None:
                st.set_c_tilde(self.replicas.synchronise())
            folded = st.fold()
            if folded is not None and self.replicas is not None:
                self.replicas.record_fold(folded)
            if st.smd:
                st.resync_grams()
        if st.C is not None:
            st.lam = eigenvalue_estimate(st.A, st.C)

    def attach_replicas(self, replicas) -> None:
        """Let a block stream's worker replicas (:class:`dkha.engine.replicas.WorkerReplicas`) follow the
        state: folds made here are recorded with them, and projected blocks are completed by
        them. Only the factored engine supports this."""
        if not isinstance(self.state, FactoredState):
            raise ParameterError("projections on the workers need the factored engine")
        self.replicas = replicas

    def detach_replicas(self) -> None:
        self.replicas = None

    def base_gain(self, t: int) -> np.ndarray:
        """``η_t`` (before SMD's ``e^ρ``) for the step after ``t`` steps."""
        decay = self.l / (t + self.l)
        if self.algorithm == "kha":
            return np.full(self.r, self.eta0)
        if self.algorithm == "kha-t":
            return np.full(self.r, self.eta0 * decay)
        lam = self.state.lam
        return np.linalg.norm(lam) / lam * decay * self.eta0

    def block_gains(self, t: int, n_steps: int) -> np.ndarray:
        """``base_gain`` of the ``n_steps`` steps from step ``t`` on, as an ``n_steps×r`` array."""
        decay = (self.l / (t + np.arange(n_steps) + self.l))[:, None]
        if self.algorithm == "kha":
            return np.full((n_steps, self.r), self.eta0)
        if self.algorithm == "kha-t":
            return np.repeat(self.eta0 * decay, self.r, axis=1)
        lam = self.state.lam
        return (np.linalg.norm(lam) / lam)[None, :] * decay * self.eta0

    def apply_block(self, index: np.ndarray, rows) -> None:
        """Apply one step per entry of ``index``; ``rows[j] = K'[index[j], :]``.

        ``rows`` may instead be a :class:`dkha.engine.replicas.ProjectedBlock` from the stream whose
        replicas are attached (factored engine): its projections are brought up to date by the
        replicas, and the block's message is recorded with them. At the end of each pass
        (``t`` a multiple of ``l``) the replicas are checked and ``C̃`` is brought home.
        """
        st = self.state
        if isinstance(st, FactoredState):
            eta = self.block_gains(st.t, len(index))
            try:
                if isinstance(rows, np.ndarray):
                    st.apply_block(index, rows, eta, mu=self.mu, xi=self.xi)
                else:
                    if self.replicas is None:
                        raise ValueError("a block of projections needs the replicas of its "
                                         "stream attached (RowEngine.stream(..., solver=...))")
                    Y, kpp = self.replicas.projections(rows)
                    ops: list = []
                    st.apply_block(index, None, eta, mu=self.mu, xi=self.xi, projections=Y,
                                   kpp=kpp, ops=ops)
                    self.replicas.record_block(rows, ops)
            except BadStep as bad:
                raise self.diverged(st.t + bad.j, bad.quantity, bad.component) from None
            st.t += len(index)
            self.check_finite()
            if self.replicas is not None and st.t % self.l == 0:     # a pass end
                C_tilde = self.replicas.synchronise()
                if C_tilde is not None:
                    st.set_c_tilde(C_tilde)
            return
        smd = self.algorithm == "kha-smd"
        for j, p in enumerate(index):
            eta = self.base_gain(st.t)
            kp = rows[j]
            y = st.A @ kp
            if smd:
                z = st.B @ kp
                d = reference.smd_step(st.A, st.B, st.C, st.rho, int(p), kp, eta, self.mu,
                                       self.xi)
                bad = reference.guard(y, st.A @ kp, kp[p], d, rho=st.rho, z=z,
                                      state=(("A", st.A), ("B", st.B)))
            else:
                reference.step(st.A, int(p), kp, eta, st.C)
                bad = reference.guard(y, st.A @ kp, kp[p], eta, state=(("A", st.A),))
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
        return NumericalError(
            f"{self.algorithm} diverged at step {t + 1} (pass {t // self.l + 1}): {what}; the "
            f"step was not kept and nothing of it was checkpointed; lower eta0 (now {self.eta0})"
            + (f" or mu (now {self.mu})" if self.algorithm == "kha-smd" else ""))

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
                + (f" or mu (now {self.mu})" if self.algorithm == "kha-smd" else "")
            )

    @property
    def A(self) -> np.ndarray:
        """Current coefficients ``A`` (``r×l``); a read-only snapshot for the factored engine."""
        return self.state.A
