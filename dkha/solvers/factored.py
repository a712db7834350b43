"""The exact factored engine of the batch KHA family (coordinator-math.md §3).

The stacked state ``S = [A; B]`` (``2r×l`` for KHA-SMD, just ``A`` otherwise: its update's
``stacked``, :mod:`dkha.solvers.updates`) is held as
``S = T · S̃`` with a small lower-triangular ``T``; a step multiplies ``T`` by the step's ``G`` and
changes one column of ``S̃``. ``C = A K'`` (kept for KHA/et and KHA-SMD) is held as
``C = T_AA · C̃``. Per block of centered rows ``K'_P`` (``b×l``) the work is

1. ``Y₀ = S̃ K'_Pᵀ``                         one GEMM (NumPy/BLAS); where ``C̃`` is kept, its
                                             ``A`` rows are ``C̃[:, P]`` (``K'`` is symmetric):
                                             SMD multiplies ``S̃_B`` alone, KHA/et nothing
2. the ``b`` steps, ``O(r² + b r)`` each     one compiled call (the update's ``block``)
3. ``C̃ += U_A K'_P``                         one more GEMM, the deferred eq. 18 (row ``j`` of
                                             ``U_A`` the ``A`` part of step ``j``'s column update)

``T`` is folded into ``S̃`` (``S̃ ← T S̃``, ``C̃ ← T_AA C̃``, ``T ← I``) before its condition number
would pass ``fold_condition``, and at every pass start. The result equals the per-step form
(:mod:`dkha.solvers.reference`) up to rounding. Reading ``A``, ``B`` or ``C`` returns the true
values ``T · S̃`` without changing the state, so evaluations do not perturb a run.

Projections on the workers (coordinator-math.md §4). Instead of ``K'_P`` the block may come as
``Y₀`` computed elsewhere plus ``K'[P, P]``; the state then records what the block did to ``S̃``
and ``C̃`` as a *message*, a tuple of operations that replicas of column ranges of ``S̃`` and
``C̃`` replay (:func:`apply_message`), and that the coordinator replays on projections computed
from an earlier version of ``S̃`` (:func:`replay_message`):

* ``("cols", j0, j1, Δ)``     ``S̃[:, p_j] += Δ[j - j0]`` for the block positions ``j0 ≤ j < j1``
* ``("fold", F)``             ``S̃ ← F S̃``, ``C̃ ← F_AA C̃`` (``F`` lower triangular)
* ``("direct", j, u, payload)``  a step taken directly: ``S̃ ← G S̃ + c e_pᵀ``,
                              ``C̃ ← M C̃ + a k'_pᵀ``, ``G`` and ``c`` by the update named
                              ``u`` from ``payload`` (its ``direct``, :mod:`dkha.solvers.updates`;
                              ``payload`` begins ``(a, y)``, which define ``M``)
* ``("c", U_A)``              the deferred eq. 18, ``C̃ += U_Aᵀ K'_P``

``C̃`` then lives with the replicas during a pass: the coordinator's copy is the last one brought
home (``c_stale`` is true until the next :meth:`FactoredState.set_c_tilde`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dkha.algorithms import GHA, SMD
from dkha.solvers import compiled, updates
from dkha.solvers.updates.base import Update

DEFAULT_FOLD_CONDITION = 1e3
_EMPTY = np.zeros((0, 0))
_QUEUE: list = []       # the one thread that applies the work queued on S̃ and C̃ (made on first use)
# the compiled loops' guard codes, named as :func:`dkha.solvers.reference.guard` names them
GUARD_NAMES = {compiled.GUARD_A: "A", compiled.GUARD_B: "B", compiled.GUARD_GAIN: "gain",
               compiled.GUARD_A_RUNAWAY: "A runaway",
               compiled.GUARD_GAIN_RUNAWAY: "gain runaway", compiled.GUARD_GRAM: "Gram"}


class BadStep(ArithmeticError):
    """Step ``j`` of a block was bad (``quantity``, ``component``: see
    :func:`dkha.solvers.reference.guard`); it was not kept, and the state is unusable."""

    def __init__(self, j: int, quantity: str, component: int):
        super().__init__(f"bad step {j}: {quantity} (component {component})")
        self.j, self.quantity, self.component = int(j), quantity, int(component)


def lower_times_inplace(T: np.ndarray, X: np.ndarray) -> None:
    """``X ← T X`` in place for lower-triangular ``T`` and C-contiguous ``X``.

    Each entry is summed in one fixed order (``k = 0 … i``), whatever the width of ``X``, the
    threads or the machine: the coordinator's fold of all of ``S̃`` and a worker replica's fold
    of its columns give the same bits (a BLAS ``trmm`` rounds differently with the width and its
    threads, and a rebuilt replica would not match the lost one). A fold happens at pass starts
    or when ``T`` grows ill-conditioned, so its ``O(m² l)`` compiled loop is off the hot path.
    """
    compiled.lower_times(np.ascontiguousarray(T, dtype=np.float64), X)


class QueuedFactors:
    """``S̃`` and ``C̃`` of :class:`FactoredState` with work queued on them off the coordinator's
    thread; a read of either waits for its own queue (``vars()`` holds the arrays as they are)."""

    # S̃ itself. Blocks applied from projections (the replicas hold S̃ for the products) leave
    # their message to one background thread that applies it to S̃ as a replica does
    # (apply_message: the same bits), off the coordinator's path to the next block; every read
    # of S̃ waits for what is queued (sync). vars() still holds the array under this name.
    @property
    def S_tilde(self) -> np.ndarray:
        self._sync_s()
        return self.__dict__["S_tilde"]

    @S_tilde.setter
    def S_tilde(self, value: np.ndarray) -> None:
        self._sync_s()
        self.__dict__["S_tilde"] = value

    # C̃ likewise: eq. 18's update of a block, C̃ += U_A K'_P (a GEMM as large as the block's
    # projections), runs on that thread while the coordinator multiplies the next block by S̃_B
    # (prepare_block; C̃'s columns are read after that GEMM); every read of C̃ waits for it
    # (sync_c), so what C̃ holds when read is the same bits as an update in line.
    @property
    def C_tilde(self) -> np.ndarray | None:
        self.sync_c()
        return self.__dict__["C_tilde"]

    @C_tilde.setter
    def C_tilde(self, value: np.ndarray | None) -> None:
        self.sync_c()
        self.__dict__["C_tilde"] = value

    def sync(self) -> None:
        """Wait until the work queued for ``S̃`` and ``C̃`` is done (see ``S_tilde``, ``C_tilde``)."""
        self._sync_s()
        self.sync_c()

    def _sync_s(self) -> None:
        pending = self.__dict__.pop("_pending", None)
        if pending is not None and not pending.result():
            raise FloatingPointError("non-finite values in S̃ after a fold or direct step")

    def sync_c(self) -> None:
        """Wait until the block update queued for ``C̃`` is applied (see ``C_tilde``)."""
        pending = self.__dict__.pop("_c_pending", None)
        if pending is not None:
            pending.result()

    @property
    def keeps_c(self) -> bool:
        """Whether ``C = A K'`` is maintained (KHA/et, KHA-SMD; without waiting for ``C̃``)."""
        return self.__dict__.get("C_tilde") is not None

    def _defer_c(self, U_A: np.ndarray, rows: np.ndarray) -> None:
        """Queue ``C̃ += U_Aᵀ K'_P`` (``rows``: ``K'_P``, in its precision)."""
        self.__dict__["_c_pending"] = _queue().submit(_add_block_to_c, self.__dict__["C_tilde"],
                                                      U_A, rows)

    def _defer(self, index: np.ndarray, ops: list) -> None:
        """Queue one block's message for ``S̃`` (FIFO on one thread: in order)."""
        self.__dict__["_pending"] = _queue().submit(_apply_to_s, self.__dict__["S_tilde"],
                                                    index, ops, self.__dict__.get("_pending"))

    def __getstate__(self) -> dict:
        self.sync()
        return {k: v for k, v in self.__dict__.items() if k != "block_start"}


class FactoredState(QueuedFactors):
    """The coordinator's state in the factored form ``S = T · S̃``.

    Attributes read by callers: ``A``, ``B`` (SMD), ``C`` (KHA/et, SMD) as read-only snapshots of
    the true values; ``rho`` (SMD), ``lam``, ``t``; ``update``, the name of the in-block update
    (:attr:`step_update` the update itself); ``folds``, the number of folds so far;
    ``c_stale``, true while the current ``C̃`` is held by worker replicas (blocks applied from
    worker-side projections) and the local ``C_tilde`` is only the last copy brought home.
    """

    c_stale = False     # a class default: states saved before this attribute existed read False
    gain_factor = 1.0   # multiplies every gain; halved by each backoff (BatchKHA.back_off)
    # attributes that are not state (snapshots of true values, the S̃ work queued): never
    # checkpointed, saved for a rollback or restored
    TRANSIENT = frozenset({"_cache", "_pending", "_c_pending", "block_start"})

    def __init__(self, A: np.ndarray, *, C: np.ndarray | None = None,
                 update: str = GHA, rho0: float = 0.0, t: int = 0,
                 fold_condition: float = DEFAULT_FOLD_CONDITION):
        A = np.asarray(A, dtype=np.float64)
        r, l = A.shape
        self.r = r
        u = updates.get(update)
        self.update = u.name
        m = u.stacked * r
        self.S_tilde = np.zeros((m, l))
        self.S_tilde[:r] = A
        self.T = np.eye(m)
        self.C_tilde = None if C is None else np.array(C, dtype=np.float64, order="C")
        self.rho = None
        for name, value in (u.start(r, rho0) if u.start is not None else {}).items():
            setattr(self, name, value)
        self.lam: np.ndarray | None = None
        self.t = int(t)
        self.fold_condition = float(fold_condition)
        self.folds = 0
        self.gain_factor = 1.0
        self._fresh = True       # T is exactly the identity
        self.cond_bound = np.full(1, np.inf)
        self._cache: dict[str, np.ndarray] = {}
        self.resync()

    @property
    def step_update(self) -> Update:
        """The in-block update (:mod:`dkha.solvers.updates`; a state checkpointed before the
        updates had names says ``smd``)."""
        name = self.__dict__.get("update")
        if name is None:
            name = SMD if self.__dict__.get("smd") else GHA
        return updates.get(name)

    @property
    def fresh(self) -> bool:
        """Whether ``T`` is exactly the identity."""
        return self._fresh

    # -- true values --------------------------------------------------------------------------

    def forget_values(self) -> None:
        """Drop the cached true values ``A``, ``B``, ``C``: after the factors were set from
        outside (a rollback to a block's start, a state read from a checkpoint)."""
        self._cache = {}

    def _value(self, name: str) -> np.ndarray:
        v = self._cache.get(name)
        if v is None:
            r = self.r
            if name == "A":
                v = self.T[:r, :r] @ self.S_tilde[:r]
            elif name == "B":
                v = self.T[r:] @ self.S_tilde
            else:
                v = self.T[:r, :r] @ self.C_tilde
            v.flags.writeable = False
            self._cache[name] = v
        return v

    @property
    def A(self) -> np.ndarray:
        """The coefficients ``A`` (``r×l``), a read-only snapshot."""
        return self._value("A")

    @property
    def B(self) -> np.ndarray | None:
        """SMD's ``B = ∂A/∂ρ`` (``r×l``), a read-only snapshot; ``None`` for the other gains."""
        return self._value("B") if self.T.shape[0] > self.r else None

    @property
    def C(self) -> np.ndarray | None:
        """``C = A K'`` as kept by eq. 18 (read-only snapshot), or ``None`` where it is not kept."""
        if self.C_tilde is None:
            return None
        if self.c_stale:
            raise RuntimeError("C is held by the worker replicas in the middle of a pass; it is "
                               "brought home at the end of each pass and when the block stream "
                               "closes")
        return self._value("C")

    def set_c_tilde(self, C_tilde: np.ndarray) -> None:
        """Replace the local ``C̃`` by the current one (brought home from the replicas)."""
        C_tilde = np.array(C_tilde, dtype=np.float64, order="C")
        if self.C_tilde is None or C_tilde.shape != self.C_tilde.shape:
            raise ValueError("C̃ of the wrong shape, or C is not kept by this state")
        self.C_tilde = C_tilde
        self.c_stale = False
        self._cache.clear()

    # -- maintenance --------------------------------------------------------------------------

    def fold(self) -> np.ndarray | None:
        """``S̃ ← T S̃``, ``C̃ ← T_AA C̃``, ``T ← I`` (exact; the true values do not change).

        Returns the matrix folded in (``None`` when ``T`` was already the identity), so that
        replicas of ``S̃`` can follow (the message ``(("fold", F),)``).
        """
        if self._fresh:
            return None
        F = self.T
        if self.__dict__.get("_pending") is not None:
            self._defer(None, [("fold", F)])        # after the queued messages, in order
        else:
            start = self.__dict__.get("block_start")    # a backoff's copy of S̃ by columns
            if start is not None:
                start.before_fold(self)
            lower_times_inplace(F, self.S_tilde)
        if self.C_tilde is not None and not self.c_stale:
            lower_times_inplace(F[:self.r, :self.r], self.C_tilde)
        return self._fold_t()

    def condition_bound(self) -> np.ndarray:
        """``cond_bound`` (1,): an upper bound on ``cond(T)`` the block loops keep, so that they
        compute the exact condition only near ``fold_condition`` (their decisions are those of
        an exact test at every step). Saved and rolled back with ``T``; ``inf`` (unknown) in a
        state saved before it existed."""
        bound = self.__dict__.get("cond_bound")
        if bound is None:
            bound = self.cond_bound = np.full(1, np.inf)
        return bound

    def _fold_t(self) -> np.ndarray:
        """``T ← I`` once ``T`` is folded into ``S̃`` and ``C̃`` (or will be: inside a block of
        projections ``S̃`` gets the fold with the block's message, ``C̃`` on the replicas);
        returns the ``T`` folded."""
        F = self.T
        self.T = np.eye(F.shape[0])
        self._fresh = True
        self.folds += 1
        self._cache.clear()     # snapshots taken before the fold differ in rounding
        return F

    def resync(self) -> None:
        """The update's own work at a pass start (:attr:`~dkha.solvers.updates.base.Update.resync`;
        SMD: its Grams from ``C``, without the recurrences' drift)."""
        u = self.step_update
        if u.resync is not None:
            u.resync(self)

    def nonfinite(self) -> str | None:
        """The name of a state component holding non-finite values, or ``None``."""
        r = self.r
        if self.rho is not None and not np.isfinite(self.rho).all():
            return "rho"
        if self.__dict__.get("_pending") is not None:
            # S̃ is being brought up to date with finite column updates (checked when taken);
            # its folds and direct steps are checked there (sync raises)
            S = None
        else:
            S = self.S_tilde
        if not (np.isfinite(self.T[:r]).all() and (S is None or np.isfinite(S[:r]).all())):
            return "A"
        if self.T.shape[0] > r and not (np.isfinite(self.T[r:]).all()
                                        and (S is None or np.isfinite(S[r:]).all())):
            return "B"
        return None

    # -- the block ----------------------------------------------------------------------------

    def _s_projections(self, index: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``Y₀ᵀ = K'_P S̃ᵀ`` (``b×m``, float64) of a block of rows ``K'_P``, but its ``A`` rows
        where ``C̃ = S̃_A K'`` is kept (KHA/et, SMD): those need no product, as ``K'`` is
        symmetric, so ``K'_P S̃_Aᵀ = C̃[:, P]ᵀ`` (``y = A k'_p = C e_p``; :meth:`_c_projections`),
        and only SMD's ``B`` rows take the block's GEMM (``r`` columns, not ``2r``; KHA/et none).
        The GEMM runs in the rows' precision (float32 rows: float32 operands, Y₀ and the state
        float64)."""
        r, m = self.r, self.T.shape[0]
        lo = r if self.keeps_c else 0
        Y = np.empty((len(index), m))
        if lo < m:
            S = self.S_tilde[lo:]
            if rows.dtype == np.float32:
                Y[:, lo:] = rows @ S.T.astype(np.float32)
            else:
                np.matmul(rows, S.T, out=Y[:, lo:])
        return Y

    def _c_projections(self, index: np.ndarray, Y: np.ndarray) -> None:
        """The ``A`` rows of ``Y₀ᵀ`` from ``C̃`` into ``Y`` (where kept; :meth:`_s_projections`)."""
        if self.keeps_c:
            np.take(self.C_tilde, index, axis=1, out=Y[:, :self.r].T)

    def prepare_block(self, index: np.ndarray, rows: np.ndarray) -> tuple:
        """What :meth:`apply_block` computes of a block of rows before its first step and that
        its steps do not change: the rows contiguous, ``K'_P[:, P]`` and the block's GEMM with
        ``S̃`` (not ``C̃``, which may still be taking the previous block's update). Valid for
        this block from the current ``S̃`` and after a rollback to it; pass it as
        ``apply_block(..., prepared=)``."""
        index = np.ascontiguousarray(index, dtype=np.int64)
        single = getattr(rows, "dtype", None) == np.float32     # --precision float32
        rows = np.ascontiguousarray(rows, dtype=np.float32 if single else np.float64)
        Kpp = np.take(rows, index, axis=1).astype(np.float64)    # K'_P[:, P], b×b
        return index, rows, Kpp, self._s_projections(index, rows)

    def apply_block(self, index: np.ndarray, rows: np.ndarray | None, eta: np.ndarray, *,
                    mu: float = 0.0, xi: float = 0.0, projections: np.ndarray | None = None,
                    kpp: np.ndarray | None = None, ops: list | None = None,
                    prepared: tuple | None = None) -> None:
        """Take one step per entry of ``index`` (``rows[j] = K'[index[j], :]``, gains ``eta[j]``).

        Does not advance ``t``; the caller owns the step count and the gains. Raises
        :class:`BadStep` at the first step the guards find bad (compiled module docstring).

        With ``projections`` (``b×m``, ``Y₀ᵀ = K'_P S̃ᵀ`` on the current ``S̃``, computed elsewhere)
        and ``kpp`` (``K'[P, P]``), ``rows`` is not needed; the block's effect on ``S̃`` and ``C̃``
        is appended to ``ops`` as the operations of one message (see the module docstring), and
        ``C̃`` is left to the replicas (``c_stale`` becomes true).

        ``prepared``: :meth:`prepare_block` of ``index`` and ``rows``, computed before (then
        ``rows`` is not read again). Eq. 18's ``C̃ += U_A K'_P`` is queued (``C_tilde``).
        """
        index = np.ascontiguousarray(index, dtype=np.int64)
        eta = np.ascontiguousarray(eta, dtype=np.float64)
        b = index.shape[0]
        if b == 0:
            return
        r = self.r
        keeps_c = self.keeps_c
        u = self.step_update
        if projections is not None:
            if ops is None or kpp is None:
                raise ValueError("a block of projections needs kpp and an ops list")
            Y = np.array(projections, dtype=np.float64, order="C")    # ours to update
            Kpp = np.ascontiguousarray(kpp, dtype=np.float64)
            rows = np.zeros((b, 0))
            S_arg = np.zeros((self.T.shape[0], 0))       # S̃ follows the message (_defer)
            C_arg = np.zeros((r, 0)) if keeps_c else _EMPTY      # carry U, C̃ lives elsewhere
            direct_log = np.zeros((b, 1 + u.direct_vectors * r))
        else:
            if self.c_stale:
                raise RuntimeError("C̃ is held by worker replicas; bring it home "
                                   "(set_c_tilde) before applying kernel rows")
            index, rows, Kpp, Y = prepared or self.prepare_block(index, rows)
            # the steps update it: a block applied again starts from the prepared Y
            Y = Y.copy()
            self._c_projections(index, Y)
            C_arg = self.C_tilde if keeps_c else _EMPTY
            direct_log = _EMPTY
            S_arg = self.S_tilde
        self._cache.clear()
        U = np.empty_like(Y)                          # row j: the column update Δ_j of step j
        start = 0
        while start < b:
            stop, fold, self._fresh, guard, comp = u.block(
                self, S_arg, C_arg, rows, Y, U, Kpp, index, eta, mu, xi, start, direct_log)
            if guard != compiled.GUARD_OK:
                raise BadStep(stop, GUARD_NAMES[guard], comp)
            if ops is not None:
                _record_steps(ops, U, direct_log, start, stop, r, u, float(xi))
            if fold:
                # carry what is still pending into the new basis: the projections of the steps
                # to come, and the deferred C̃ updates of the steps taken
                Y[stop:] = Y[stop:] @ self.T.T
                if keeps_c:
                    U[:stop, :r] = U[:stop, :r] @ self.T[:r, :r].T
                F = self._fold_t() if projections is not None else self.fold()
                if ops is not None:
                    ops.append(("fold", F))
            start = stop
        if keeps_c:                                   # eq. 18, deferred: C̃ += U_A K'_P
            if projections is not None:
                ops.append(("c", np.array(U[:, :r])))
                self.c_stale = True
            else:
                self._defer_c(U[:, :r], rows)
        if projections is not None:
            self._defer(index.copy(), list(ops))      # S̃ follows, off this thread


def _queue() -> ThreadPoolExecutor:
    """The one thread of the work queued on ``S̃`` and ``C̃`` (FIFO: in order)."""
    if not _QUEUE:
        _QUEUE.append(ThreadPoolExecutor(1, thread_name_prefix="dkha-factors"))
    return _QUEUE[0]


def _add_block_to_c(C: np.ndarray, U_A: np.ndarray, rows: np.ndarray) -> None:
    """Eq. 18 for a block, deferred: ``C̃ += U_Aᵀ K'_P`` (the GEMM in the rows' precision)."""
    C += U_A.T.astype(rows.dtype) @ rows


# --- messages: replicas of S̃ and C̃, projections from earlier versions (§4) --------------------


def _apply_to_s(S: np.ndarray, index: np.ndarray | None, ops: list, before) -> bool:
    """The coordinator's deferred ``S̃`` update: one message applied to all of ``S̃`` (as a
    replica of every column); returns whether ``S̃`` is finite after a fold or direct step.
    ``before``, the future of the message before (done: one thread, in order), passes its
    failure on, so that waiting for the last message reports any."""
    if before is not None and not before.result():
        return False
    apply_message(S, None, 0, S.shape[1], index, ops, None)
    if any(op[0] in ("fold", "direct") for op in ops):
        return compiled.all_finite(S)
    return True


def _record_steps(ops: list, U: np.ndarray, direct_log: np.ndarray, start: int, stop: int,
                  r: int, update: Update, xi: float) -> None:
    """Append the operations of steps ``start..stop-1`` (column updates, direct steps) to ``ops``.

    ``U[start:stop]`` must still hold the column updates as taken (copied here, before any later
    carry into a new basis changes them).
    """
    flags = direct_log[start:stop, 0] if direct_log.shape[0] else np.zeros(stop - start)
    j0 = start
    for j in np.flatnonzero(flags) + start:
        if j > j0:
            ops.append(("cols", j0, int(j), np.array(U[j0:j])))
        ops.append(("direct", int(j), update.name, update.direct_payload(direct_log[j], r, xi)))
        j0 = int(j) + 1
    if stop > j0:
        ops.append(("cols", j0, stop, np.array(U[j0:stop])))


def replay_message(Y: np.ndarray, ops, cols: np.ndarray | None) -> None:
    """Bring projections ``Y`` (``b×m``, ``Y[i] = S̃_v k'_{q_i}``) over one message, in place.

    ``cols`` is ``K'[Q, P]`` (``b×|P|``) for the rows ``Q`` of ``Y`` and the block ``P`` whose steps
    the message records (``None`` for a message without column updates, e.g. a lone fold).
    """
    for op in ops:
        kind = op[0]
        if kind == "cols":
            _, j0, j1, delta = op
            Y += cols[:, j0:j1] @ delta
        elif kind == "fold":
            Y[...] = Y @ op[1].T
        elif kind == "direct":
            _, j, update, payload = op
            c = updates.get(update).direct(Y.T, payload)     # Y ← Y Gᵀ
            Y += np.outer(cols[:, j], c)
        elif kind != "c":
            raise ValueError(f"unknown operation {kind!r} in a message")


def apply_message(S: np.ndarray, C: np.ndarray | None, lo: int, hi: int,
                  index: np.ndarray | None, ops, K: np.ndarray | None) -> None:
    """Apply one message to the replica ``S̃[:, lo:hi]`` (``S``) and ``C̃[:, lo:hi]`` (``C``).

    ``index`` is the block ``P`` the message's steps belong to (``None`` for a lone fold) and ``K``
    is ``K'[P, lo:hi]``, needed when ``C`` is kept and the message updates it. In place; ``S`` and
    ``C`` C-contiguous.
    """
    for op in ops:
        kind = op[0]
        if kind == "cols":
            _, j0, j1, delta = op
            compiled.add_columns(S, lo, hi, np.ascontiguousarray(index[j0:j1], dtype=np.int64),
                                 np.ascontiguousarray(delta, dtype=np.float64))
        elif kind == "fold":
            F = op[1]
            lower_times_inplace(F, S)
            if C is not None:
                lower_times_inplace(F[:C.shape[0], :C.shape[0]], C)
        elif kind == "direct":
            _, j, update, payload = op
            c = updates.get(update).direct(S, payload)       # S ← G S
            p = int(index[j])
            if lo <= p < hi:
                S[:, p - lo] += c
            if C is not None:
                a, y = payload[:2]
                compiled.apply_m(C, a, y, C)
                C += np.outer(a, K[j])
        elif kind == "c":
            if C is not None:
                C += op[1].T @ K
        else:
            raise ValueError(f"unknown operation {kind!r} in a message")
