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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkha.errors import NumericalError, ParameterError
from dkha.solvers import reference

ALGORITHMS = ("kha", "kha-t", "kha-et", "kha-smd")
DEFAULT_ETA0 = {"kha": 0.05, "kha-t": 0.5, "kha-et": 0.2, "kha-smd": 0.2}
DEFAULT_MU = 0.2
DEFAULT_XI = 0.99


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ParameterError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return algorithm


def initial_coefficients(n_components: int, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """``A1 ~ N(0, 1/(r l))`` (Algorithm 1, step 1d)."""
    return rng.standard_normal((n_components, n_samples)) / np.sqrt(n_components * n_samples)


def eigenvalue_estimate(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Eq. 13/14: ``λ_i = ‖(A K')_i‖ / ‖A_i‖``."""
    return np.sqrt(np.einsum("ij,ij->i", C, C) / np.einsum("ij,ij->i", A, A))


@dataclass
class BatchState:
    """The coordinator's state. ``C = A K'`` is kept for ``kha-et`` and ``kha-smd`` only."""

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
    """

    def __init__(self, algorithm: str, n_components: int, n_samples: int, *, eta0: float,
                 mu: float = DEFAULT_MU, xi: float = DEFAULT_XI, rho0: float = 0.0):
        self.algorithm = check_algorithm(algorithm)
        self.r = int(n_components)
        self.l = int(n_samples)
        self.eta0 = float(eta0)
        self.mu = float(mu)
        self.xi = float(xi)
        self.rho0 = float(rho0)
        self.state: BatchState | None = None

    @property
    def needs_projection(self) -> bool:
        """Whether the state needs ``C = A K'`` computed when it starts."""
        return self.algorithm in ("kha-et", "kha-smd")

    def start(self, A: np.ndarray, C: np.ndarray | None = None, t: int = 0) -> None:
        A = np.array(A, dtype=np.float64, order="C")
        st = BatchState(A=A, t=int(t))
        if self.needs_projection:
            if C is None:
                raise ValueError(f"{self.algorithm} needs C = A K' to start")
            st.C = np.array(C, dtype=np.float64, order="C")
        if self.algorithm == "kha-smd":
            st.B = np.zeros_like(A)
            st.rho = np.full(self.r, self.rho0)
        self.state = st

    def begin_pass(self) -> None:
        """Refresh the eigenvalue estimates (eq. 13) from the exact ``C`` (once per pass)."""
        st = self.state
        if st.C is not None:
            st.lam = eigenvalue_estimate(st.A, st.C)

    def base_gain(self, t: int) -> np.ndarray:
        """``η_t`` (before SMD's ``e^ρ``) for the step after ``t`` steps."""
        decay = self.l / (t + self.l)
        if self.algorithm == "kha":
            return np.full(self.r, self.eta0)
        if self.algorithm == "kha-t":
            return np.full(self.r, self.eta0 * decay)
        lam = self.state.lam
        return np.linalg.norm(lam) / lam * decay * self.eta0

    def apply_block(self, index: np.ndarray, rows: np.ndarray) -> None:
        """Apply one step per entry of ``index``; ``rows[j] = K'[index[j], :]``."""
        st = self.state
        smd = self.algorithm == "kha-smd"
        for j, p in enumerate(index):
            eta = self.base_gain(st.t)
            if smd:
                reference.smd_step(st.A, st.B, st.C, st.rho, int(p), rows[j], eta, self.mu, self.xi)
            else:
                reference.step(st.A, int(p), rows[j], eta, st.C)
            st.t += 1
        self.check_finite()

    def check_finite(self) -> None:
        st = self.state
        for name in ("A", "B", "rho"):
            v = getattr(st, name)
            if v is not None and not np.isfinite(v).all():
                raise NumericalError(
                    f"{self.algorithm} diverged: non-finite values in {name} by step {st.t}; "
                    f"lower eta0 (now {self.eta0})" + (f" or mu (now {self.mu})" if self.algorithm == "kha-smd" else "")
                )

    @property
    def A(self) -> np.ndarray:
        return self.state.A
