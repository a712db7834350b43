"""The online, dictionary-based algorithms: ON-KHA, OO-KHA and Honeine's online KPCA.

References: Souza Filho & Diniz (2017), Table I and eqs. 45–60 (ON-KHA, OO-KHA); Honeine (2012),
Table 2, eqs. 19–20 and §5.2 (online KPCA, "okpca"). Readings settled in coordinator-math.md §6–7.

The papers' form
----------------
A dictionary ``D_m`` of ``m`` samples, ``Ψ_m`` their images, ``K_m`` their Gram matrix. A sample
``x`` has the kernel vector ``κ = k(D_m, x)``, the coordinates ``β = K_m⁻¹ κ`` of its projection
``Ψ_m β`` on the dictionary's span, and the squared distance ``ε² = k(x, x) − κᵀ β`` to that span
(ALD / distance criterion). It joins the dictionary when ``ε² ≥ ν`` (and ``m < max_members``);
then ``β = e_{m+1}`` and the coefficients get a zero row (eq. 58). With the coefficients ``A``
(``m × r``, component ``j`` is ``w_j = Ψ_m A[:, j]``), ``y = Aᵀ κ`` and a step size ``η``:

* ``okpca``  (Honeine eq. 19, read as in §7): ``A ← A + η (β yᵀ − A ut(y yᵀ))``
* ``oo-kha`` (eq. 52): ``A ← A + η (β yᵀ − A M)``, ``M = 2 ut(y yᵀ) − diag(y yᵀ)`` (eq. 50)
* ``on-kha`` (eqs. 46–49): the OO-KHA update, then each column scaled to unit feature-space
  norm, ``A[:, j] /= sqrt(A[:, j]ᵀ K_m A[:, j])``.

The first sample only initialises the dictionary (``m = 1``, ``A`` a random ``1 × r`` row, entries
``N(0, 0.01)`` as in the paper's experiments); updates start at the second. The step size is
``η = η0 γ^s`` (``η(k) = γ η(k−1)``, applied before use) or ``η = η0 / (1 + s/τ)`` (Honeine eq.
20), ``s`` the 0-based step of the sample (the initialising sample is step 0).

What is computed instead: Cholesky coordinates
----------------------------------------------
``K_m = L Lᵀ`` with ``L`` lower triangular, grown by one row per new member
(``L_{m+1} = [[L, 0], [cᵀ, ε]]`` with ``c = L⁻¹ κ``) — never the recursive inverse of eq. 59,
which drifts. ``Q = Ψ_m L⁻ᵀ`` is an orthonormal basis of the span, so in the coordinates
``B = Lᵀ A`` and ``c = L⁻¹ κ = Lᵀ β``::

    y = Aᵀ κ = Bᵀ c,     ε² = k(x, x) − ‖c‖²,     ‖w_j‖² = A_jᵀ K_m A_j = ‖B_j‖²

and every update above reads the same with ``(B, c)`` for ``(A, β)`` (multiply by ``Lᵀ``). A new
member appends a zero to ``B`` (``B' = L'ᵀ [A; 0] = [B; 0]``) and its coordinates are
``c' = [c; ε]``. Per step this costs one forward substitution (done for a whole block at once as
a triangular solve, BLAS-3) and ``O(m r)`` for the update — the paper's ``K_m Â`` of eq. 47
(``O(m² r)``) becomes a column norm. ``A = L⁻ᵀ B`` is formed only on output.

Centering (Honeine §5.2, coordinator-math §6): the running mean of the samples' coordinates
``β̄`` (a new member pads it with a zero) gives the mean ``μ = Ψ_m β̄``; the sample is replaced by
its centered projection ``Ψ_m (β − β̄)``: ``y = Aᵀ K_m (β − β̄) = Aᵀ (κ − K_m β̄)`` and
``A ← A + η ((β − β̄) yᵀ − A M)``. In Cholesky coordinates ``c̄ = Lᵀ β̄`` is the running mean of
the ``c``. The mean includes the current sample (and the initialising one).

The per-sample loop is compiled with numba (:func:`online_block`, one call per block): a Python
step costs tens of microseconds of interpreter overhead, more than the ``O(m r)`` arithmetic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy.linalg import solve_triangular
from scipy.linalg.blas import dtrsm

from dkha import algorithms
from dkha.algorithms import DICTIONARY, ONLINE, ORTHOGONALISED, ORTHONORMALISED
from dkha.errors import NumericalError, ParameterError
from dkha.kernels import Kernel
from dkha.names import (
    ONLINE_ALGORITHMS,
    ONLINE_DEFAULT_GAMMA,
)
from dkha.solvers.batch import MAX_BACKOFFS, check_on_divergence
from dkha.solvers.compiled import RUNAWAY
from dkha.solvers.online_exact import ExactSpan, sign_fixed

log = logging.getLogger(__name__)

ALGORITHMS = ONLINE_ALGORITHMS
#: the online updates (:attr:`dkha.algorithms.AlgorithmSpec.update`) → their code in the compiled
#: loop (:func:`online_block`'s ``algorithm``)
UPDATES = {ORTHONORMALISED: 0, ORTHOGONALISED: 1, DICTIONARY: 2}
RATE_EXPONENTIAL = 0  # η = η0 γ^s
RATE_SEARCH_THEN_CONVERGE = 1  # η = η0 / (1 + s/τ)

RUNAWAY2 = RUNAWAY * RUNAWAY  # a component's squared norm past this is a runaway
DEFAULT_GAMMA = ONLINE_DEFAULT_GAMMA
#: the default ν relative to the data's variance in feature space (:func:`relative_nu`)
NU_RELATIVE = 0.1
COMPUTE_ROWS = 256  # samples per compiled call (bounds the in-slice kernel block)
INIT_STD = 0.1  # the paper's initial coefficients: zero-mean gaussian, variance 0.01


def sample_scales(K: np.ndarray) -> tuple[float, float]:
    """From the kernel matrix ``K`` of a sample: ``(variance, unit)``.

    ``variance`` is the data's variance in feature space, ``trace(K')/n`` of the centered
    ``K'``: the scale of the ALD distances ``ε²`` once the dictionary holds the mean, from which
    the default ``ν = NU_RELATIVE · variance`` follows (a sample joins when it lies farther from
    the dictionary's span than a tenth of the spread of the data; on 1797 digits that keeps
    about 360 members where ν = 1e-3 kept 1717, with the same AC index). ``unit`` is
    ``Σ k(x,x)² / Σ k(x,x)``: the squared norm of the samples the updates see, weighted as GHA's
    step condition ``η ‖Φ(x)‖² < 2`` weighs them (:mod:`dkha.solvers.batch`); ``η0`` is in its
    units (1 for the gaussian and laplacian kernels, where ``k(x, x) = 1``).
    """
    diagonal = np.maximum(np.diag(K), 0.0)
    if not diagonal.sum() > 0:
        raise ParameterError("every sample maps to zero in feature space (k(x, x) = 0); choose "
                             "another kernel")
    return float(diagonal.mean() - K.mean()), float((diagonal * diagonal).sum() / diagonal.sum())


def online_spec(algorithm: str) -> algorithms.AlgorithmSpec:
    """The spec of the online ``algorithm`` (its update, whether it starts exact in the span); a
    one-line :class:`ParameterError` where the compiled loop serves none (:data:`UPDATES`)."""
    return algorithms.served(algorithm, ONLINE, UPDATES, label="online algorithm",
                             by="the online solvers")


def learning_rate(step: int, eta0: float, gamma: float | None, tau: float | None) -> float:
    """The step size of the update at 0-based ``step`` (the compiled loop computes the same)."""
    if tau is not None:
        return eta0 / (1.0 + step / tau)
    return eta0 * (1.0 if gamma is None else gamma) ** step


# Reassociation lets LLVM vectorise the dot products and norms; no-NaN/no-inf assumptions are
# left out so a diverging run still shows up as non-finite coefficients.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
#: while the dictionary holds fewer members than components, a sample joins when its ε² exceeds
#: this fraction of k(x, x) (independent beyond round-off), whatever ν: components over fewer
#: members than their number would duplicate each other
INDEPENDENT = 1e-10


# The pieces of a step, inlined into :func:`online_block` (numba IR inlining, before type
# inference: the compiled loop is the one written out in one function, bit for bit).


@njit(inline="always", fastmath=_FASTMATH)
def sample_coordinates(c, C0, Kbb, L, pos, j, m0, m):  # pragma: no cover - compiled
    """``c = L⁻¹ κ`` of sample ``j`` (the block-start members from ``C0``, later ones by
    substitution); returns ``‖c‖²``."""
    for q in range(m0):
        c[q] = C0[j, q]
    for q in range(m0, m):
        acc = Kbb[j, pos[q - m0]]
        for i in range(q):
            acc -= L[q, i] * c[i]
        c[q] = acc / L[q, q]
    norm2 = 0.0
    for q in range(m):
        norm2 += c[q] * c[q]
    return norm2


@njit(inline="always", fastmath=_FASTMATH)
def join_member(B, L, cbar, c, a_init, m, eps2):  # pragma: no cover - compiled
    """The sample joins as member ``m`` (``L``'s row ``m``, ``c[m] = √ε²``, a zero column of
    ``B`` and of ``c̄``); the first member initialises ``B`` to ``√ε² a_init``, which it says."""
    d = np.sqrt(eps2)
    for i in range(m):
        L[m, i] = c[i]
    L[m, m] = d
    c[m] = d
    initialising = m == 0
    if initialising:
        for k in range(B.shape[0]):
            B[k, 0] = d * a_init[k]
    else:
        for k in range(B.shape[0]):
            B[k, m] = 0.0
    cbar[m] = 0.0
    return initialising


@njit(inline="always", fastmath=_FASTMATH)
def centred(c, cbar, u, m, count, center):  # pragma: no cover - compiled
    """``u = c − c̄`` once the running mean ``c̄`` has taken ``c`` in (``center``), else
    ``u = c``; returns the new count of samples in the mean."""
    if center:
        count += 1
        for q in range(m):
            cbar[q] += (c[q] - cbar[q]) / count
        for q in range(m):
            u[q] = c[q] - cbar[q]
    else:
        for q in range(m):
            u[q] = c[q]
    return count


@njit(inline="always", fastmath=_FASTMATH)
def project(B, u, y, s, m):  # pragma: no cover - compiled
    """``y = B u`` over the first ``m`` members, and the prefix sums ``s`` zeroed."""
    for k in range(B.shape[0]):
        acc = 0.0
        for q in range(m):
            acc += B[k, q] * u[q]
        y[k] = acc
    for q in range(m):
        s[q] = 0.0


@njit(inline="always", fastmath=_FASTMATH)
def okpca_update(B, y, u, s, eta, m):  # pragma: no cover - compiled
    """okpca: ``B_k += η y_k (u − Σ_{i≤k} y_i B_i)``; the first component whose norm
    ``‖w_k‖ = ‖B_k‖`` is non-finite or past ``RUNAWAY``, else -1."""
    for k in range(B.shape[0]):
        yk = y[k]
        nrm = 0.0
        for q in range(m):
            s[q] += yk * B[k, q]
            B[k, q] += eta * yk * (u[q] - s[q])
            nrm += B[k, q] * B[k, q]
        if not nrm <= RUNAWAY2:
            return k
    return -1


@njit(inline="always", fastmath=_FASTMATH)
def kha_update(B, y, u, s, eta, m, algorithm):  # pragma: no cover - compiled
    """oo-kha / on-kha: ``B_k += η y_k (u − 2 Σ_{i<k} y_i B_i − y_k B_k)``, ON-KHA (``algorithm``
    0) normalising each ``B_k``; the first component whose norm is bad (non-finite or past
    ``RUNAWAY``; ON-KHA: non-finite or zero), else -1."""
    for k in range(B.shape[0]):
        yk = y[k]
        nrm = 0.0
        for q in range(m):
            bq = B[k, q]
            bn = bq + eta * yk * (u[q] - 2.0 * s[q] - yk * bq)
            B[k, q] = bn
            s[q] += yk * bq
            nrm += bn * bn
        if algorithm != 0 and not nrm <= RUNAWAY2:
            return k
        if algorithm == 0:
            # ON-KHA normalises: its norm must be finite and non-zero
            if not (np.isfinite(nrm) and nrm > 0.0):
                return k
            nrm = 1.0 / np.sqrt(nrm)
            for q in range(m):
                B[k, q] *= nrm
    return -1


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def online_block(algorithm, center, rate_kind, eta0, rate_param, nu, m, count, step, capacity,
                 B, L, cbar, a_init, C0, Kbb, kdiag, joined):  # pragma: no cover - compiled
    """Run the steps of one block of samples; return ``(m, count, step, n_joined, bad)``.

    ``B (r, capacity)`` coefficients in Cholesky coordinates, ``L (capacity, capacity)`` the
    Cholesky factor, ``cbar (capacity,)`` the running mean of the coordinates (centered runs);
    all updated in place, the first ``m`` members in use. ``C0 (b, m0)`` holds ``L⁻¹ κ`` of the
    block's samples against the ``m0 = m`` members at the block's start; ``Kbb (b, b)`` the
    kernel among the block's samples (the kernel vector against members that join within the
    block), ``kdiag (b,)`` their ``k(x, x)``. ``joined`` receives the block positions of the
    samples that joined the dictionary. ``rate_param`` is ``γ`` or ``τ`` per ``rate_kind``.

    Guard: after each update the feature-space norm of every component, ``‖w_k‖ = ‖B_k‖``, must be
    finite and at most ``RUNAWAY`` (ON-KHA, which normalises it: finite and non-zero). Otherwise the
    loop stops at that step (``step`` is its 0-based index) and ``bad`` is the component ``k``; the
    state is then unusable. ``bad`` is ``-1`` when every step was good."""
    r = B.shape[0]
    b = kdiag.shape[0]
    m0 = m
    pos = np.empty(b, dtype=np.int64)  # block position of the members joined in this block
    c = np.zeros(capacity)
    u = np.zeros(capacity)
    s = np.zeros(capacity)
    y = np.zeros(r)
    n_joined = 0
    for j in range(b):
        eps2 = kdiag[j] - sample_coordinates(c, C0, Kbb, L, pos, j, m0, m)
        initialising = False
        # below r members any numerically independent sample joins: r components need r members
        if (eps2 >= nu or (m < r and eps2 > INDEPENDENT * kdiag[j])) and m < capacity:
            initialising = join_member(B, L, cbar, c, a_init, m, eps2)
            pos[m - m0] = j
            joined[n_joined] = j
            n_joined += 1
            m += 1
        count = centred(c, cbar, u, m, count, center)
        if initialising or m == 0:
            step += 1
            continue
        if rate_kind == 0:
            eta = eta0 * rate_param ** step
        else:
            eta = eta0 / (1.0 + step / rate_param)
        project(B, u, y, s, m)
        if algorithm == 2:
            bad = okpca_update(B, y, u, s, eta, m)
        else:
            bad = kha_update(B, y, u, s, eta, m, algorithm)
        if bad >= 0:
            return m, count, step, n_joined, bad
        step += 1
    return m, count, step, n_joined, -1


@dataclass
class OnlineState:
    """The sequential state, preallocated to ``capacity`` members (grown on demand)."""

    B: np.ndarray  # (r, capacity) coefficients in Cholesky coordinates
    L: np.ndarray  # (capacity, capacity) Cholesky factor of K_m (lower)
    cbar: np.ndarray  # (capacity,) running mean of the coordinates c (centered runs)
    dictionary: np.ndarray  # (capacity, n_features)
    member_index: np.ndarray  # (capacity,) sample index (store row, or stream position)
    member_step: np.ndarray  # (capacity,) step at which the member joined
    m: int = 0
    count: int = 0  # samples in the running mean
    step: int = 0  # samples consumed
    gain_factor: float = 1.0  # multiplies the step size; halved by each backoff

    @property
    def capacity(self) -> int:
        return self.L.shape[0]

    @classmethod
    def empty(cls, r: int, capacity: int, n_features: int) -> OnlineState:
        """A state of ``r`` components with room for ``capacity`` members, none in use."""
        return cls(B=np.zeros((r, capacity)), L=np.zeros((capacity, capacity)),
                   cbar=np.zeros(capacity), dictionary=np.zeros((capacity, n_features)),
                   member_index=np.zeros(capacity, dtype=np.int64),
                   member_step=np.zeros(capacity, dtype=np.int64))

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the ``m`` members in use (views)."""
        m = self.m
        return {"B": self.B[:, :m], "L": self.L[:m, :m], "cbar": self.cbar[:m],
                "dictionary": self.dictionary[:m], "member_index": self.member_index[:m],
                "member_step": self.member_step[:m]}

    def scalars(self) -> dict:
        return {"m": int(self.m), "count": int(self.count), "step": int(self.step),
                "capacity": int(self.capacity), "gain_factor": float(self.gain_factor)}

    @classmethod
    def restored(cls, arrays: dict[str, np.ndarray], scalars: dict, r: int, n_features: int,
                 capacity: int) -> OnlineState:
        """A state of room ``capacity`` holding :meth:`arrays` and :meth:`scalars`' members."""
        st = cls.empty(r, capacity, n_features)
        st.m, st.count, st.step = int(scalars["m"]), int(scalars["count"]), int(scalars["step"])
        for name, members in st.arrays().items():      # views of the members' rows
            members[...] = arrays[name]
        st.gain_factor = float(scalars.get("gain_factor", 1.0))
        return st


class OnlineKHA:
    """One online algorithm's state and updates, fed blocks of samples in stream order.

    Parameters
    ----------
    algorithm : str
        An online algorithm of :mod:`dkha.algorithms` (its spec's ``update``, and whether it
        starts exact in the dictionary's span: ``exact_span``).
    n_components, n_features : int
    kernel : dkha.kernels.Kernel
        With all parameters set (``sigma`` resolved).
    nu : float
        ALD threshold: a sample joins the dictionary when ``ε² ≥ nu``.
    max_members : int
        Cap on the dictionary; past it samples are only projected.
    eta0 : float
    gamma, tau : float or None
        ``η = η0 γ^s`` or ``η = η0 / (1 + s/τ)`` (give at most one; neither: constant ``η0``).
    center : bool
        Track the running mean in the dictionary's span (Honeine §5.2).
    a_init : ndarray (n_components,)
        The first member's coefficients (``A(1)`` of Table I).
    on_divergence : {"backoff", "stop"}
        A bad step (the guard of :func:`online_block`): ``"backoff"`` (default) rolls the state
        back to the start of its slice of samples, halves the step size (the state's
        ``gain_factor``), records the event in :attr:`backoffs` and goes on; ``"stop"`` raises
        :class:`NumericalError`, as does a run still diverging after ``MAX_BACKOFFS`` halvings.
    """

    def __init__(self, algorithm: str, n_components: int, n_features: int, kernel: Kernel, *,
                 nu: float, max_members: int, eta0: float, gamma: float | None = None,
                 tau: float | None = None, center: bool = False, a_init: np.ndarray,
                 on_divergence: str = "backoff"):
        spec = online_spec(algorithm)
        self.algorithm, self.update = spec.name, spec.update
        self.r, self.n_features, self.kernel = int(n_components), int(n_features), kernel
        self.nu, self.max_members, self.eta0 = float(nu), int(max_members), float(eta0)
        if gamma is not None and tau is not None:
            raise ParameterError("give gamma or tau, not both")
        self.gamma = None if gamma is None else float(gamma)
        self.tau = None if tau is None else float(tau)
        self.center = bool(center)
        self.a_init = np.ascontiguousarray(a_init, dtype=np.float64)
        if self.a_init.shape != (self.r,):
            raise ValueError(f"a_init must have shape ({self.r},)")
        self.state = OnlineState.empty(self.r, min(self.max_members, 64), self.n_features)
        self._factor_copy: tuple[int, np.ndarray] | None = None  # (m, Fortran copy of L[:m,:m])
        self.stream_length: int | None = None  # samples per pass, when known (for messages)
        self.on_divergence = check_on_divergence(on_divergence)
        #: one dict per backoff, as :attr:`dkha.solvers.batch.BatchKHA.backoffs` (gains: η0)
        self.backoffs: list[dict] = []
        self.log_level = logging.WARNING
        #: the exact solution while all seen lies in the span (:mod:`~dkha.solvers.online_exact`;
        #: the spec's ``exact_span``), None past it; ``exact_steps``: the samples it covered
        self.exact: ExactSpan | None = ExactSpan() if spec.exact_span else None
        self.exact_steps: int | None = None
        self._settled = True

    # -- storage --
    def _reserve(self, extra: int) -> None:
        st = self.state
        need = min(self.max_members, st.m + extra)
        if need <= st.capacity:
            return
        self.state = OnlineState.restored(st.arrays(), st.scalars(), self.r, self.n_features,
                                          min(self.max_members, max(need, 2 * st.capacity)))

    # -- checkpoints --
    def snapshot(self) -> tuple[dict[str, np.ndarray], dict]:
        """The complete state as arrays (the ``m`` members in use) and JSON scalars.

        With :meth:`restore` a run continues bit for bit: the dictionary, the Cholesky factor
        ``L``, the coefficients ``B = Lᵀ A``, the running mean, the member records, the step (the
        stream position and, through it, the step size) and the allocated capacity.
        """
        self._settle()
        arrays, scalars = dict(self.state.arrays(), a_init=self.a_init), self.state.scalars()
        if self.exact is not None:
            arrays.update(self.exact.arrays())
            scalars["exact_n"] = int(self.exact.n)
        if self.exact_steps is not None:
            scalars["exact_steps"] = int(self.exact_steps)
        return arrays, scalars

    def restore(self, arrays: dict[str, np.ndarray], scalars: dict) -> None:
        """Continue from a :meth:`snapshot` (of a solver with the same settings)."""
        m = int(scalars["m"])
        shapes = {"B": (self.r, m), "L": (m, m), "cbar": (m,), "dictionary": (m, self.n_features),
                  "member_index": (m,), "member_step": (m,), "a_init": (self.r,)}
        for name, shape in shapes.items():
            if arrays[name].shape != shape:
                raise ValueError(f"checkpoint array {name} has shape {arrays[name].shape}, "
                                 f"expected {shape}")
        if not np.array_equal(arrays["a_init"], self.a_init):
            raise ValueError("checkpoint of a run with other initial coefficients")
        self.state = OnlineState.restored(arrays, scalars, self.r, self.n_features,
                                          max(int(scalars["capacity"]), m))
        self._factor_copy = None
        # runs saved before the exact span, or past it: streaming only
        self.exact = (ExactSpan.restored(arrays, scalars["exact_n"])
                      if "exact_S" in arrays and "exact_n" in scalars else None)
        self.exact_steps = scalars.get("exact_steps")
        self._settled = True

    # -- the block step --
    def coordinates(self, X: np.ndarray) -> np.ndarray:
        """``c = L⁻¹ k(D_m, x)`` for each row of ``X``, as an ``(m, len(X))`` array."""
        st = self.state
        m = st.m
        if m == 0:
            return np.zeros((0, len(X)))
        if self._factor_copy is None or self._factor_copy[0] != m:
            # L changes only when members join: the Fortran copy BLAS wants is reused meanwhile
            self._factor_copy = (m, np.asfortranarray(st.L[:m, :m]))
        Kxd = self.kernel.block(X, st.dictionary[:m])  # (b, m) C order = (m, b) Fortran order
        return dtrsm(1.0, self._factor_copy[1], Kxd.T, lower=1, overwrite_b=1)

    def apply_block(self, X: np.ndarray, sample_index: np.ndarray) -> int:
        """Consume the rows of ``X`` (stream order); returns how many joined the dictionary.

        ``sample_index[j]`` is recorded as the member index when row ``j`` joins. Rows are
        processed in slices of at most :data:`COMPUTE_ROWS` (the in-slice kernel block is
        ``slice × slice``), whatever the size of the block read.
        """
        X = np.ascontiguousarray(X, dtype=np.float64)
        sample_index = np.asarray(sample_index)
        joined = 0
        for a in range(0, len(X), COMPUTE_ROWS):
            joined += self._apply_slice(X[a:a + COMPUTE_ROWS], sample_index[a:a + COMPUTE_ROWS])
        return joined

    def _apply_slice(self, X: np.ndarray, sample_index: np.ndarray) -> int:
        b = len(X)
        if b == 0:
            return 0
        self._reserve(b)
        self._settle()      # while exact: the slice streams from the exact solution so far
        st = self.state
        m0 = st.m
        C0 = np.ascontiguousarray(self.coordinates(X).T)  # a view: (b, m) in C order
        Kbb = np.ascontiguousarray(self.kernel.block(X, X))
        kdiag = np.ascontiguousarray(self.kernel.diagonal(X))
        joined = np.empty(b, dtype=np.int64)
        if self.tau is not None:
            rate_kind, rate_param = RATE_SEARCH_THEN_CONVERGE, self.tau
        else:
            rate_kind, rate_param = RATE_EXPONENTIAL, (1.0 if self.gamma is None else self.gamma)
        step0, count0 = st.step, st.count
        backoff = self.on_divergence == "backoff"
        if backoff:     # the rollback point: what the slice changes of the members so far
            B0, cbar0 = st.B[:, :m0].copy(), st.cbar[:m0].copy()
        while True:
            m, count, step, n_joined, bad = online_block(
                UPDATES[self.update], self.center, rate_kind,
                self.eta0 * st.gain_factor, rate_param, self.nu, m0, count0, step0, st.capacity,
                st.B, st.L, st.cbar, self.a_init, C0, Kbb, kdiag, joined)
            if bad < 0 or not backoff:
                break
            if len(self.backoffs) >= MAX_BACKOFFS:
                break
            st.B[:, :m0], st.cbar[:m0] = B0, cbar0      # members that joined are dropped
            st.B[:, m0:m], st.cbar[m0:m], st.L[m0:m] = 0.0, 0.0, 0.0
            self._back_off(step, bad, step0)
        pos = joined[:n_joined]
        st.dictionary[m0:m] = X[pos]
        st.member_index[m0:m] = sample_index[pos]
        st.member_step[m0:m] = step0 + pos
        st.m, st.count, st.step = int(m), int(count), int(step)
        if bad >= 0:
            where = "" if self.stream_length is None else \
                f" (pass {step // self.stream_length + 1})"
            raise NumericalError(
                f"{self.algorithm} diverged at step {step + 1}{where}: component {bad}'s "
                f"feature-space norm became non-finite or passed {RUNAWAY:g}; the step was not "
                f"kept and nothing of it was checkpointed; lower eta0 (now {self.eta0})"
                + (f" (still, after {len(self.backoffs)} backoffs that halved the step size to "
                   f"{st.gain_factor:g} of eta0)" if self.backoffs else ""))
        if not np.isfinite(st.B[:, :m]).all():
            raise NumericalError(
                f"{self.algorithm} diverged: non-finite coefficients by step {st.step}; "
                f"lower eta0 (now {self.eta0})"
            )
        if self.exact is not None:
            if self.exact.add(self.coordinates(X), kdiag):
                self._settled = False
            else:       # a sample outside the span: this slice streamed from the exact
                self.exact_steps = self.exact.n     # solution of what came before it;
                self.exact = None                   # streaming from here
        return int(n_joined)

    def _settle(self) -> None:
        """Set ``B`` and the mean to the exact solution of what was seen (while it lies in the
        dictionary's span; :mod:`dkha.solvers.online_exact`); signs as scikit-learn's."""
        if self._settled or self.exact is None or self.exact.n == 0:
            return
        st = self.state
        m = st.m
        B, mean = self.exact.solution(self.r, self.center, m)
        A = solve_triangular(st.L[:m, :m].T, B.T, lower=False, check_finite=False).T
        linear = self.kernel.input_scale() is not None
        # (components beyond the span's dimension keep their streaming state)
        st.B[:len(B), :m] = sign_fixed(B, A @ st.dictionary[:m] if linear else B)
        if self.center:
            st.cbar[:m] = mean
        self._settled = True

    def _back_off(self, step: int, component: int, rolled_back_to: int) -> None:
        """Halve the step size after a bad step (0-based ``step``); record the event."""
        st = self.state
        before = self.eta0 * st.gain_factor
        st.gain_factor *= 0.5
        where = "" if self.stream_length is None else f" (pass {step // self.stream_length + 1})"
        event = {"step": int(step) + 1,
                 "pass": 0 if self.stream_length is None else int(step) // self.stream_length + 1,
                 "gain_before": before, "gain_after": self.eta0 * st.gain_factor,
                 "rolled_back_to": int(rolled_back_to),
                 "reason": f"component {component}'s feature-space norm became non-finite or "
                           f"passed {RUNAWAY:g}"}
        self.backoffs.append(event)
        log.log(self.log_level, "%s diverged at step %d%s; rolled back to step %d and halved "
                "the step size: eta0 %.3g → %.3g", self.algorithm, event["step"], where,
                rolled_back_to, before, event["gain_after"])

    # -- outputs --
    @property
    def n_members(self) -> int:
        return self.state.m

    def alpha(self) -> np.ndarray:
        """``Aᵀ`` (``r × m``): component ``j`` is ``Σ_q alpha[j, q] Φ(d_q)``."""
        self._settle()
        st = self.state
        m = st.m
        if m == 0:
            return np.zeros((self.r, 0))
        A = solve_triangular(st.L[:m, :m].T, st.B[:, :m].T, lower=False, check_finite=False)
        return np.ascontiguousarray(A.T)

    def mean_coefficients(self) -> np.ndarray:
        """``β̄`` (``m``): the running mean is ``Σ_q β̄_q Φ(d_q)`` (zeros when not centered)."""
        self._settle()
        st = self.state
        m = st.m
        if not self.center or m == 0:
            return np.zeros(m)
        return solve_triangular(st.L[:m, :m].T, st.cbar[:m], lower=False, check_finite=False)

    def component_norms(self) -> np.ndarray:
        """Feature-space norms ``‖w_j‖`` of the components."""
        self._settle()
        st = self.state
        return np.sqrt(np.einsum("ij,ij->i", st.B[:, :st.m], st.B[:, :st.m]))

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``(len(X), r)`` projections ``w_jᵀ (Φ(x) − μ)`` (``μ = 0`` when not centered)."""
        self._settle()
        X = np.asarray(X, dtype=np.float64)
        st = self.state
        C = self.coordinates(X)
        if self.center and st.m:
            C -= st.cbar[:st.m, None]
        return (st.B[:, :st.m] @ C).T

    def dictionary(self) -> np.ndarray:
        return self.state.dictionary[:self.state.m].copy()

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        """``(member_index, member_step)`` of the dictionary's members."""
        st = self.state
        return st.member_index[:st.m].copy(), st.member_step[:st.m].copy()
