"""The top eigenpairs of a symmetric positive semi-definite operator known only by its products
``K V``: a thick-restarted block Krylov method, written for operators whose every product is a
pass over the data (dkha's ``K' V``: a blockwise pass of kernel tiles), so it spends coordinator
arithmetic freely to save products.

The method (block Davidson without preconditioner, which is block Lanczos with full
re-orthogonalisation when every residual is kept):

* the basis ``Q`` (orthonormal, ``n × m``) and its products ``K Q`` are kept; the Rayleigh quotient
  ``T = Qᵀ K Q`` grows by one block per product;
* the Ritz pairs ``(θ_i, x_i = Q y_i)`` of ``T`` give exact residuals ``K x_i − θ_i x_i =
  (K Q) y_i − θ_i Q y_i`` without a product;
* the next block is the residuals of the top ``block`` Ritz pairs, orthogonalised against ``Q``
  (twice) and among themselves: ``span(Q, R) = span(Q, K Q)`` restricted to the wanted end of the
  spectrum. The residuals of the components already converged are left out (soft locking: they
  stay in the basis and keep improving, but cost no width of the next product);
* a block larger than ``r`` (``block``, default ``r + max(10, r/2)``) converges the ``r``-th
  component at the rate of the gap ``λ_r / λ_{block+1}`` instead of ``λ_r / λ_{r+1}``;
* when the basis would exceed ``max_basis`` columns it is compressed to the top ``2·block`` Ritz
  vectors (thick restart), their products ``(K Q) Y`` kept: a restart costs no product.

Convergence is judged per component, ``‖K x_i − θ_i x_i‖ ≤ tol · θ_i`` for ``i < r`` (``θ_i`` not
below ``1e-8 θ_1``, and residuals under ``1e-12 θ_1`` count as converged: the null space of a
rank-deficient operator is judged against the largest eigenvalue). Where round-off in the products
(float32 kernel tiles) keeps the residuals from reaching ``tol``, the method stops after ``stall``
products without a halving of the largest scaled residual.

The arithmetic between two products is held at the floor of one block step (the two projections
of the new block against the basis, its Gram matrix, a triangular solve; issue 40):

* the basis and its products live in preallocated ``n × max_basis`` buffers (:class:`Basis`),
  a spare pair beside them takes each step's Ritz vectors and their products, which a thick
  restart then completes in place of a new basis; nothing of ``n`` rows is stacked or allocated
  per product;
* the new block is orthonormalised by the two Gram–Schmidt projections and **CholeskyQR2**
  (the Cholesky factor of its Gram matrix, twice; :func:`orthonormal_columns`): BLAS-3 products
  of the ``n``-row block, the factorisations on ``k × k`` matrices, the triangular solves as
  products with ``R⁻¹``. Where the Gram matrix is ill-conditioned (its condition number, after
  scaling its columns to unit norm, above :data:`COND_CHOLESKY`), the Cholesky fails, or a
  column lies in the basis' span, Householder QR of the block takes over (the SVD of its small
  triangular factor drops the dependent directions); :attr:`KrylovInfo.householder` counts
  those blocks;
* the ``n``-row work is swept in chunks of :data:`CHUNK_ROWS` rows on the CPU (:func:`_sweep`):
  a projection, a solve and the next Gram matrix of a chunk while it is in the cache; the
  residuals come with the Ritz vectors a thick restart keeps, in one read of the basis and its
  products (``benchmarks/krylov_coordinator.py`` measures the solver against the floor);
* Rayleigh–Ritz and the restarts' rotations are computed on the host on ``m × m`` matrices
  (``m ≤ max_basis``); the ``n``-row arrays stay in the array module of the start block
  (NumPy, or CuPy on a GPU: then only ``k × k`` matrices and ``k``-vectors reach the host, the
  checkpoints' arrays aside)."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field

import numpy as np

#: eigenvalues below this fraction of the largest are judged against the largest
FLOOR = 1e-8
#: residuals below this fraction of the largest eigenvalue are round-off of float64 products:
#: converged whatever ``tol`` (the null space of a rank-deficient operator)
ROUNDOFF = 1e-12
#: the largest condition number of a block's Gram matrix (columns scaled to unit norm) that
#: CholeskyQR2 takes: the first pass leaves an orthogonality error of about ``u·cond`` (1e-8),
#: which the second removes; above it, Householder QR
COND_CHOLESKY = 1e8
#: above this condition number the block's components along the basis, amplified by up to
#: ``√cond`` by the triangular solves, are projected out once more (as the SVD path always did)
COND_REPROJECT = 1e4
#: the rows of one chunk of a sweep over an ``n``-row block on the CPU (:func:`_sweep`): a
#: chunk of the block and of the basis (4 096 × 120 numbers, 3.9 MB) stay in the cache between
#: the projection, the triangular solve and the Gram matrix
CHUNK_ROWS = 4096


@dataclass
class KrylovInfo:
    """How a solve went: ``products`` (calls of ``matmat``), ``columns`` (columns multiplied in
    all), ``restarts``, ``converged`` (every wanted residual within ``tol``), ``residuals``
    (``‖K x_i − θ_i x_i‖ / θ_i`` of the ``r`` wanted pairs at the end), ``history`` (the
    largest of those after each product), ``trace`` (after each product: ``products``, that
    largest ``residual``, the ``r`` wanted Ritz values ``ritz`` and the ``seconds`` of the
    solve so far, a resumed solve's included) and ``householder`` (the blocks orthonormalised
    by the Householder fallback instead of CholeskyQR2, in this process)."""

    products: int = 0
    columns: int = 0
    restarts: int = 0
    converged: bool = False
    stalled: bool = False
    residuals: np.ndarray | None = None
    history: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    householder: int = 0


@dataclass
class KrylovState:
    """The iteration between two products (at the top of its loop): the basis ``Q``, its
    products ``KQ``, the Rayleigh quotient ``T`` and the stall counters, with the
    :class:`KrylovInfo` counts so far. The arrays are the iteration's own (no copies: ``Q`` and
    ``KQ`` are views of its buffers, left unchanged until the next product boundary; in the
    solver's array module, ``T`` on the host); an iteration continued from it
    (``top_eigenpairs(..., state=)``) does exactly what the one it was taken from would have
    done."""

    Q: np.ndarray
    KQ: np.ndarray
    T: np.ndarray
    best: float
    since: int
    products: int
    columns: int
    restarts: int
    history: list
    #: :attr:`KrylovInfo.trace` so far (a checkpoint written before it was kept has none)
    trace: list = field(default_factory=list)


# --- the array module ----------------------------------------------------------------------------


def array_module(a):
    """The array module of ``a``: NumPy for a NumPy array, else the module its type comes from
    (CuPy for a CuPy array)."""
    if isinstance(a, np.ndarray):
        return np
    return importlib.import_module(type(a).__module__.split(".")[0])


def to_host(a) -> np.ndarray:
    """``a`` as a NumPy array (a copy from the device for CuPy)."""
    return _host(array_module(a), a)


def _host(xp, a) -> np.ndarray:
    return a if xp is np else xp.asnumpy(a)


# --- orthonormal blocks --------------------------------------------------------------------------


def orthonormal_columns(Z, Q=None, *, drop: float = 1e-10, info: KrylovInfo | None = None):
    """An orthonormal basis of the part of ``span(Z)`` orthogonal to ``Q`` (classical
    Gram–Schmidt twice, then CholeskyQR2; Householder QR where the Gram matrix is
    ill-conditioned, the SVD of its triangular factor dropping directions below ``drop`` of
    ``Z``'s scale). ``Z`` is left unchanged; any array module (NumPy, CuPy)."""
    xp = array_module(Z)
    Z = xp.array(Z, dtype=np.float64, order="C", copy=True)
    return _orthonormalize(xp, Z, Q, drop=drop, info=info)


def _orthonormalize(xp, Z, Q, *, norms=None, drop: float = 1e-10, joint=None,
                    info: KrylovInfo | None = None):
    """:func:`orthonormal_columns` of ``Z`` (``n × a``, overwritten): ``Z`` itself where
    CholeskyQR2 serves, else the Householder fallback's new array. ``norms``: ``Z``'s column
    norms on the host where known (the residuals'); ``joint``: ``[Q Z]`` where ``Z`` lies in the
    columns right after ``Q``'s (the basis' buffer): the second projection's ``Qᵀ Z`` and the
    Gram matrix are then one product, the Gram matrix of the projected block by Pythagoras
    (``ZᵀZ − CᵀC``, ``C = QᵀZ`` at round-off after the first projection).

    ``Z``'s rows are swept in chunks (:func:`_sweep`), each chunk of ``Z`` and ``Q`` used while
    it is in the cache: the first projection with the product that follows it (``[Q Z]ᵀ Z``, or
    ``Qᵀ Z``), the second projection with the first triangular solve and the next Gram matrix,
    then the second solve."""
    if norms is None:
        norms = _column_norms(xp, Z)
    scale = float(np.max(norms, initial=0.0))
    if scale == 0.0:
        return Z[:, :0]
    against = Q is not None and Q.shape[1] > 0
    C, rescale = None, False    # C: the second projection's Qᵀ Z, while it is still to make
    if not against:
        G = _host(xp, Z.T @ Z)
    elif joint is None:
        C = _sweep(xp, Z, Q=Q, C=Q.T @ Z, gram=Q)
        G, C = _sweep(xp, Z, Q=Q, C=C, gram=Z), None
    else:
        W = _sweep(xp, Z, Q=Q, C=Q.T @ Z, gram=joint)
        C = W[:Q.shape[1]]
        G = W[Q.shape[1]:] - C.T @ C
    d = np.sqrt(np.maximum(np.diag(G), 0.0)) / scale
    if np.isfinite(scale) and d.min() > drop:
        ev = np.linalg.eigvalsh(G / np.outer(d, d) / scale**2)
        cond = ev[-1] / ev[0] if ev[0] > 0 else np.inf
        if cond <= COND_CHOLESKY:
            try:
                G2 = _sweep(xp, Z, Q=Q, C=C, R=_cholesky(G), gram=Z)
                C = None
                _sweep(xp, Z, R=_cholesky(G2))
                if against and cond > COND_REPROJECT:
                    G3 = _sweep(xp, Z, Q=Q, C=Q.T @ Z, gram=Z)
                    _sweep(xp, Z, R=_cholesky(G3))
                return Z
            except np.linalg.LinAlgError:
                rescale = True
    if C is not None:           # the second projection, where no sweep has made it
        _sweep(xp, Z, Q=Q, C=C)
    if rescale:                 # a Cholesky failed: the block's scale as it now is
        scale = float(np.max(_column_norms(xp, Z), initial=0.0))
    return _householder(xp, Z, Q if against else None, scale, drop, info)


def _column_norms(xp, Z) -> np.ndarray:
    """The columns' norms (host), in one pass and no ``n``-row temporary (``linalg.norm``
    squares into a fresh array: its page faults cost as much as the pass)."""
    return np.sqrt(_host(xp, xp.einsum("ij,ij->j", Z, Z)))


def _cholesky(G: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor ``R`` of the ``k × k`` Gram matrix ``G = RᵀR`` (host)."""
    return np.linalg.cholesky(0.5 * (G + G.T)).T


def _chunks(xp, n: int):
    """The row ranges of a sweep: :data:`CHUNK_ROWS` on the CPU (a chunk of ``Z`` and of the
    basis stay in the cache while it is used), the whole array on a GPU."""
    step = CHUNK_ROWS if xp is np else max(n, 1)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _sweep(xp, Z, *, Q=None, C=None, R=None, gram=None):
    """One sweep over ``Z``'s rows (``n × a``, in place), chunk by chunk: ``Z ← Z − Q C``
    (where ``C``, ``Qᵀ Z`` of before, is given), then ``Z ← Z R⁻¹`` (where the upper
    triangular ``R`` is given), then the Gram matrix ``gramᵀ Z`` of the result summed over the
    chunks (where ``gram`` is given: ``Z`` itself, or ``[Q Z]`` with ``Z`` its last columns),
    which it returns (host)."""
    n, a = Z.shape
    chunks = _chunks(xp, n)
    T = xp.empty((chunks[0][1] if chunks else 0, a))       # one chunk's work space
    W = xp.zeros((0 if gram is None else gram.shape[1], a))
    if C is not None:
        C = xp.asarray(C)
    Rinv = None if R is None else _inverse(xp, R)
    for lo, hi in chunks:
        Zc, Tc = Z[lo:hi], T[:hi - lo]
        if C is not None:
            xp.matmul(Q[lo:hi], C, out=Tc)
            Zc -= Tc
        if Rinv is not None:
            xp.matmul(Zc, Rinv, out=Tc)
            Zc[...] = Tc
        if gram is not None:
            W += gram[lo:hi].T @ Zc
    return None if gram is None else _host(xp, W)


def _inverse(xp, R):
    """``R⁻¹`` of the upper triangular ``k × k`` factor ``R`` (host), in ``xp``: a block's
    triangular solve ``Z R⁻¹`` as a product (BLAS-3 on chunks of rows, where LAPACK's
    triangular solve of a chunk is a third as fast; the same on a GPU). ``R`` is a Cholesky
    factor of a Gram matrix of condition ≤ :data:`COND_CHOLESKY` (``cond(R) ≤ 10⁴``), and the
    product's error is of the triangular solve's order, which CholeskyQR2's second pass
    (``cond ≈ 1``) removes."""
    from scipy.linalg import solve_triangular

    return xp.asarray(solve_triangular(R, np.eye(len(R)), lower=False))


def _householder(xp, Z, Q, scale: float, drop: float, info: KrylovInfo | None):
    """The fallback: Householder QR of ``Z`` (already projected against ``Q``), the SVD of its
    triangular factor (``Z``'s singular values) keeping directions above ``drop·max(1, s_max)``
    of ``Z / scale``, then once more against ``Q`` and QR (the directions kept may be small)."""
    if info is not None:
        info.householder += 1
    H, Rh = xp.linalg.qr(Z)
    U, s, _ = np.linalg.svd(_host(xp, Rh) / scale)
    keep = s > drop * max(1.0, s.max(initial=0.0))
    W = H @ xp.asarray(np.ascontiguousarray(U[:, keep]))
    if Q is not None and Q.shape[1] and W.shape[1]:
        W -= Q @ (Q.T @ W)
        W, _ = xp.linalg.qr(W)
    return W


# --- the basis -----------------------------------------------------------------------------------


class Basis:
    """The basis ``Q`` and its products ``KQ`` in preallocated ``n × width`` buffers (``m``
    columns in use), the spare pair each step's Ritz vectors and their products go to (a thick
    restart completes them there and the pairs swap), and a block buffer of ``n × block``
    (the residuals, then the projections' scratch and the next product's input). A new block
    is orthonormalised where it then stays, in the columns after ``Q``'s. Nothing of ``n`` rows
    is allocated after these."""

    def __init__(self, xp, n: int, width: int, block: int):
        self.xp, self.n, self.m, self.width = xp, n, 0, width
        self.Q, self.KQ = xp.empty((n, width)), xp.empty((n, width))
        self.spare = (xp.empty((n, width)), xp.empty((n, width)))
        self._block = xp.empty(n * block)
        self._ready = 0         # the spare pair's columns :meth:`residuals` filled

    @property
    def q(self):
        return self.Q[:, :self.m]

    @property
    def kq(self):
        return self.KQ[:, :self.m]

    def block(self, c: int):
        """The block buffer as a C-contiguous ``n × c`` array (a new view each call)."""
        return self._block[:self.n * c].reshape(self.n, c)

    def load(self, Q, KQ) -> None:
        """A checkpoint's basis and products (any array module) into the buffers."""
        m = Q.shape[1]
        self.Q[:, :m] = self.xp.asarray(Q)
        self.KQ[:, :m] = self.xp.asarray(KQ)
        self.m = m

    def start(self, X0, info: KrylovInfo):
        """The orthonormal columns of the start block, in ``Q``; the product's input."""
        Z = self.Q[:, :X0.shape[1]]
        Z[...] = self.xp.asarray(X0, dtype=np.float64)
        return self._settle(Z, _orthonormalize(self.xp, Z, None, info=info))

    def residuals(self, Y: np.ndarray, theta: np.ndarray, k: int, keep: int = 0
                  ) -> np.ndarray:
        """The top ``k`` Ritz vectors ``X = Q Y`` and their products ``KX = (KQ) Y`` (into the
        spare pair), their residuals ``R = KX − X θ`` (the block buffer); their norms. Where
        ``keep > k`` (a thick restart to ``keep`` expected), the Ritz vectors and products up
        to ``keep`` come in the same sweep (one read of ``Q`` and ``KQ``)."""
        xp, m, w = self.xp, self.m, max(k, keep)
        Yw = xp.asarray(np.ascontiguousarray(Y[:, :w]))
        th = xp.asarray(np.ascontiguousarray(theta[:k]))
        X, KX, R = self.spare[0][:, :w], self.spare[1][:, :w], self.block(k)
        squares = xp.zeros(k)
        chunks = _chunks(xp, self.n)
        T = xp.empty((chunks[0][1] if chunks else 0, w))   # the products' C-ordered output
        for lo, hi in chunks:
            Tc, Rc = T[:hi - lo], R[lo:hi]
            xp.matmul(self.Q[lo:hi, :m], Yw, out=Tc)
            X[lo:hi] = Tc
            xp.multiply(Tc[:, :k], th, out=Rc)
            xp.matmul(self.KQ[lo:hi, :m], Yw, out=Tc)
            KX[lo:hi] = Tc
            xp.subtract(Tc[:, :k], Rc, out=Rc)
            squares += xp.einsum("ij,ij->j", Rc, Rc)
        self._ready = w
        return np.sqrt(_host(xp, squares))

    def restart(self, Y: np.ndarray, keep: int) -> None:
        """Thick restart to the top ``keep`` Ritz vectors and their products: the spare pair
        (holding the top ``k``, or more, since :meth:`residuals`) completed and swapped in."""
        Qn, KQn = self.spare
        if keep > self._ready:
            Yr = self.xp.asarray(np.ascontiguousarray(Y[:, self._ready:keep]))
            self.xp.matmul(self.q, Yr, out=Qn[:, self._ready:keep])
            self.xp.matmul(self.kq, Yr, out=KQn[:, self._ready:keep])
        self.spare = (self.Q, self.KQ)
        self.Q, self.KQ, self.m = Qn, KQn, keep

    def next_block(self, k: int, active: np.ndarray, norms: np.ndarray, info: KrylovInfo):
        """The residuals ``active`` (of the last :meth:`residuals`, ``k`` of them)
        orthonormalised against ``Q`` in the columns after it; the product's input (a copy in
        the block buffer), empty where they lie in ``span(Q)``."""
        xp, m, a = self.xp, self.m, len(active)
        R = self.block(k)
        picked = R[:, :a] if a == 0 or active[-1] == a - 1 else R[:, xp.asarray(active)]
        if m + a > self.width:      # n columns at most: the basis nearly spans the space
            Z = xp.array(picked, order="C", copy=True)
            return self._settle(None, _orthonormalize(xp, Z, self.q, norms=norms[active],
                                                      info=info))
        Z = self.Q[:, m:m + a]
        Z[...] = picked
        U = _orthonormalize(xp, Z, self.q, norms=norms[active], joint=self.Q[:, :m + a],
                            info=info)
        return self._settle(Z, U)

    def _settle(self, Z, U):
        """``U`` (the block orthonormalised in place, ``Z``, or the fallback's) in ``Q``'s
        next columns; a copy in the block buffer, the product's input."""
        # more columns than the buffer holds only where it spans the whole space (n columns):
        # the excess is dependent on the basis
        if U.shape[1] > self.width - self.m:
            U = U[:, :self.width - self.m]
        p = U.shape[1]
        if U is not Z:
            self.Q[:, self.m:self.m + p] = U
        V = self.block(p)
        V[...] = U
        return V

    def append(self, KZ) -> np.ndarray:
        """The products of the block :meth:`next_block` gave: into ``KQ``; the new columns of
        the Rayleigh quotient, ``[Q Z]ᵀ KZ`` (host), summed over chunks of rows as they are
        copied."""
        xp, m, p = self.xp, self.m, KZ.shape[1]
        J = self.Q[:, :m + p]
        C = xp.zeros((m + p, p))
        for lo, hi in _chunks(xp, self.n):
            self.KQ[lo:hi, m:m + p] = KZ[lo:hi]
            C += J[lo:hi].T @ KZ[lo:hi]
        self.m = m + p
        return _host(xp, C)


# --- the iteration -------------------------------------------------------------------------------


def top_eigenpairs(matmat, X0, r: int, *, tol: float = 1e-8, maxiter: int = 300,
                   max_basis: int | None = None, stall: int = 6, callback=None,
                   state: KrylovState | None = None, on_state=None
                   ) -> tuple[np.ndarray, np.ndarray, KrylovInfo]:
    """The ``r`` largest eigenpairs ``(w, V)`` (descending, ``V`` orthonormal ``n × r``) of the
    symmetric positive semi-definite operator ``matmat: V ↦ K V``, from the start block ``X0``
    (``n × block``, ``block ≥ r``: its width is the block size), with the :class:`KrylovInfo`.

    The ``n``-row arrays (the basis, ``V``, the blocks ``matmat`` gets and returns) are in
    ``X0``'s array module (NumPy, or CuPy: the basis stays on the GPU), ``w`` on the host.
    ``matmat`` gets a fresh array object each call, a view of the solver's buffers: it must
    not keep it past its return.

    ``maxiter`` bounds the products; ``max_basis`` the basis columns (default ``12·block``, at
    least ``3·block``); ``callback(info)`` is called after each product. ``on_state(state)``
    gets the :class:`KrylovState` at every product boundary (before the Ritz pairs it gives);
    ``state``: continue from one (``X0`` then only gives the block's width)."""
    n, block = X0.shape
    if not 0 < r <= block:
        raise ValueError(f"the start block needs at least r = {r} columns, got {block}")
    xp = array_module(X0)
    max_basis = min(n, max(3 * block, max_basis or 12 * block))
    info = KrylovInfo()
    t0 = time.perf_counter()
    basis = Basis(xp, n, max_basis if state is None else max(max_basis, state.Q.shape[1]), block)
    if state is None:
        Z = basis.start(X0, info)
        T = _grown(np.zeros((0, 0)), basis.append(_product(matmat, Z, info, xp)))
        best, since = np.inf, 0
    else:
        basis.load(state.Q, state.KQ)
        T, best, since = np.asarray(state.T), state.best, state.since
        info.products, info.columns, info.restarts = state.products, state.columns, state.restarts
        info.history = list(state.history)
        info.trace = list(getattr(state, "trace", ()))   # (none in an older state)
    before = info.trace[-1]["seconds"] if info.trace else 0.0
    while True:
        if on_state is not None:
            on_state(KrylovState(basis.q, basis.kq, T, float(best), since, info.products,
                                 info.columns, info.restarts, list(info.history),
                                 list(info.trace)))
        theta, Y = _ritz(T)
        k = min(block, len(theta))
        keep = min(len(theta), 2 * block)   # a thick restart's, with the residuals where due
        res = basis.residuals(Y, theta, k, keep if basis.m + k > max_basis else 0)
        scaled = _scaled(res, theta[:k])
        worst = float(scaled[:r].max())
        info.history.append(worst)
        info.trace.append({"products": info.products, "residual": worst,
                           "ritz": [float(t) for t in theta[:r]],
                           "seconds": before + time.perf_counter() - t0})
        info.residuals = scaled[:r].copy()
        if callback is not None:
            callback(info)
        if worst <= tol:
            info.converged = True
            break
        if worst < 0.5 * best:
            best, since = worst, 0
        else:
            since += 1
        if since >= stall:
            info.stalled = True
            break
        if info.products >= maxiter:
            break
        active = np.flatnonzero(scaled > tol)           # soft locking of converged pairs
        if basis.m + len(active) > max_basis:           # thick restart to the top 2·block
            basis.restart(Y, keep)
            T = np.diag(theta[:keep])
            info.restarts += 1
        Z = basis.next_block(k, active, res, info)
        if Z.shape[1] == 0:         # an invariant subspace: the Ritz pairs are exact
            info.converged = True
            break
        T = _grown(T, basis.append(_product(matmat, Z, info, xp)))
    theta, Y = _ritz(T)
    V = basis.q @ xp.asarray(np.ascontiguousarray(Y[:, :r]))
    return theta[:r].copy(), V, info


def _scaled(res: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The residuals relative to their eigenvalues (:data:`FLOOR`, :data:`ROUNDOFF`)."""
    top = max(abs(theta[0]), np.finfo(float).tiny)
    scaled = res / np.maximum(np.abs(theta), FLOOR * top)
    scaled[res <= ROUNDOFF * top] = 0.0
    return scaled


def _product(matmat, V, info: KrylovInfo, xp):
    info.products += 1
    info.columns += V.shape[1]
    out = xp.asarray(matmat(xp.ascontiguousarray(V)), dtype=np.float64)
    if out.shape != V.shape:
        raise ValueError(f"matmat returned shape {out.shape} for a block of shape {V.shape}")
    return out


def _grown(T: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The Rayleigh quotient grown by a block: ``C = [Q Z]ᵀ K Z`` (``(m + p) × p``)."""
    m = len(T)
    return np.block([[T, C[:m]], [C[:m].T, _sym(C[m:])]])


def _sym(T: np.ndarray) -> np.ndarray:
    return 0.5 * (T + T.T)


def _ritz(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of the Rayleigh quotient, largest first."""
    theta, Y = np.linalg.eigh(_sym(T))
    return theta[::-1], Y[:, ::-1]
