"""The block Krylov solver with CholeskyQR2 and preallocated buffers (dkha.solvers.eigen, issue
40) against the solver as it was before (tests/_eigen_before.py: two projections, the SVD and
QR of n-row blocks, np.hstack) and against dense numpy.linalg.eigh, at tol 1e-12: eigenvalues
within 1e-12 relative, subspace angles within 1e-10. Its Householder fallback on nearly
dependent blocks, its array-module path (a stand-in for CuPy that refuses implicit copies to
the host), and its resumes (bit-identical; a state written by the solver before resumes)."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
from scipy.linalg import subspace_angles

from dkha.solvers import eigen
from dkha.solvers.eigen import KrylovInfo, orthonormal_columns, top_eigenpairs
from tests import _device_stub as stub
from tests import _eigen_before as before
from tests.conftest import digits_subset

TOL = 1e-12


@functools.cache
def clustered(n: int = 300, seed: int = 3) -> tuple[np.ndarray, int]:
    """A dense symmetric PSD matrix whose top 8 eigenvalues come in tight clusters (relative
    spacing 1e-6 and 1e-7, a double eigenvalue), a gap of 1/3 below them."""
    rng = np.random.default_rng(seed)
    top = [10.0, 10.0 * (1 - 1e-6), 10.0 * (1 - 2e-6), 5.0, 5.0 * (1 - 1e-7), 2.0, 2.0, 1.5]
    w = np.concatenate([top, 1.0 * 0.97 ** np.arange(n - len(top))])
    U = np.linalg.qr(rng.standard_normal((n, n)))[0]
    return (U * w) @ U.T, len(top)


@functools.cache
def digits_kernel() -> tuple[np.ndarray, int]:
    """The centered gaussian kernel matrix (σ = 4) of 500 digits; r = 10."""
    X, _ = digits_subset(50)
    sq = (X * X).sum(1)
    K = np.exp(-np.maximum(sq[:, None] + sq[None] - 2 * X @ X.T, 0) / (2 * 4.0**2))
    mk = K.mean(0)
    return K - mk[None] - mk[:, None] + mk.mean(), 10


def assert_same_pairs(w, V, w_ref, V_ref):
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=0)
    assert np.max(subspace_angles(V, V_ref)) <= 1e-10


OPERATORS = {"clustered": clustered, "digits": digits_kernel}


@functools.cache
def dense_eigh(name: str):
    return np.linalg.eigh(OPERATORS[name]()[0])


@pytest.fixture(params=[None, 37], ids=["one-chunk", "chunks-of-37"])
def chunk_rows(request, monkeypatch):
    """The sweeps' chunk of rows as it is (larger than these matrices: one chunk) and of 37
    rows (many chunks, the last one short): the chunked projections, solves, Gram matrices,
    residuals and products must give the same pairs."""
    if request.param is not None:
        monkeypatch.setattr(eigen, "CHUNK_ROWS", request.param)
    return request.param


@pytest.mark.parametrize("restarts", [False, True])
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_new_solver_matches_the_solver_before_and_eigh(name, restarts, chunk_rows):
    K, r = OPERATORS[name]()
    n = len(K)
    block = r + 10
    X0 = np.random.default_rng(7).standard_normal((n, block))
    max_basis = 3 * block if restarts else None
    w, V, info = top_eigenpairs(lambda Z: K @ Z, X0, r, tol=TOL, max_basis=max_basis)
    w_old, V_old, info_old = before.top_eigenpairs(lambda Z: K @ Z, X0, r, tol=TOL,
                                                   max_basis=max_basis)
    assert info.converged and info_old.converged
    assert (info.restarts > 0) == restarts
    assert info.products <= info_old.products + 1
    assert_same_pairs(w, V, w_old, V_old)
    ew, EV = dense_eigh(name)
    assert_same_pairs(w, V, ew[::-1][:r], EV[:, ::-1][:, :r])
    np.testing.assert_allclose(V.T @ V, np.eye(r), atol=1e-13)


def _orthonormal_against(Q, U, dim):
    assert U.shape[1] == dim
    np.testing.assert_allclose(U.T @ U, np.eye(dim), atol=1e-14)
    assert np.abs(Q.T @ U).max() < 1e-14


def test_well_conditioned_block_by_cholesky_qr2(seed, chunk_rows):
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((500, 12)))[0]
    Z = rng.standard_normal((500, 8)) * np.logspace(0, -6, 8)      # column scales 1 … 1e-6
    info = KrylovInfo()
    U = orthonormal_columns(Z, Q, info=info)
    assert info.householder == 0
    _orthonormal_against(Q, U, 8)
    assert np.max(subspace_angles(U, before.orthonormal_columns(Z, Q))) < 1e-12


def test_ill_conditioned_block_by_cholesky_qr2_projected_again(seed, chunk_rows):
    """A condition number of the Gram matrix between COND_REPROJECT and COND_CHOLESKY: still
    CholeskyQR2, with the block projected against Q once more (its components along Q,
    amplified by the triangular solves, back to round-off)."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((500, 12)))[0]
    A = rng.standard_normal((500, 6))
    Z = np.hstack([A, A[:, :1] + 3e-4 * rng.standard_normal((500, 1))])
    Zp = Z - Q @ (Q.T @ Z)
    G = Zp.T @ Zp / np.outer(np.linalg.norm(Zp, axis=0), np.linalg.norm(Zp, axis=0))
    assert eigen.COND_REPROJECT < np.linalg.cond(G) < eigen.COND_CHOLESKY
    info = KrylovInfo()
    U = orthonormal_columns(Z, Q, info=info)
    assert info.householder == 0
    _orthonormal_against(Q, U, 7)
    assert np.max(subspace_angles(U, before.orthonormal_columns(Z, Q))) < 1e-8


@pytest.mark.parametrize("eps", [1e-9, 0.0])
def test_nearly_dependent_block_falls_back_to_householder(seed, eps, chunk_rows):
    """A column within 1e-9 of another (the Gram matrix's condition number ~1e18), or exactly
    dependent, and one in span(Q): Householder QR with the SVD of its triangular factor, which
    keeps what the SVD of the whole block kept before and drops the rest."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((300, 5)))[0]
    A = rng.standard_normal((300, 4))
    Z = np.hstack([A, A[:, :1] + eps * rng.standard_normal((300, 1)), 2.0 * Q[:, 1:2]])
    info = KrylovInfo()
    U = orthonormal_columns(Z, Q, info=info)
    assert info.householder == 1
    old = before.orthonormal_columns(Z, Q)
    _orthonormal_against(Q, U, old.shape[1])
    assert U.shape[1] == (5 if eps else 4)
    assert np.max(subspace_angles(U, old)) < 1e-6


def test_start_block_with_a_dependent_column_goes_through_the_fallback(seed):
    """A start block whose last column is the sum of two others: its Gram matrix is singular,
    the Householder path keeps ``block − 1`` directions, and the solve converges to eigh's."""
    K, r = clustered()
    X0 = np.random.default_rng(seed).standard_normal((len(K), r + 4))
    X0[:, -1] = X0[:, 0] + X0[:, 1]
    columns = []
    w, V, info = top_eigenpairs(lambda Z: columns.append(Z.shape[1]) or K @ Z, X0, r, tol=TOL)
    assert info.converged and info.householder >= 1 and columns[0] == r + 3
    ew, EV = dense_eigh("clustered")
    assert_same_pairs(w, V, ew[::-1][:r], EV[:, ::-1][:, :r])


def test_device_arrays_stay_on_the_device_and_agree_with_numpy(seed):
    """The solver on a stand-in for CuPy (arrays that refuse implicit conversion to NumPy):
    only small matrices and vectors reach the host, and the eigenpairs agree with the NumPy
    path's (issue 40's CuPy-against-NumPy line: eigenvalues 1e-12, subspace angles 1e-10)."""
    K, r = clustered(300)
    n, block = len(K), r + 10
    X0 = np.random.default_rng(seed).standard_normal((n, block))
    Kd = stub.asarray(K)
    stub.TO_HOST.clear()
    w, Vd, info = top_eigenpairs(lambda V: Kd @ V, stub.asarray(X0), r, tol=TOL,
                                 max_basis=3 * block)
    assert isinstance(Vd, stub.DeviceArray) and info.converged and info.restarts > 0
    assert stub.TO_HOST and max(max(s) for s in stub.TO_HOST) <= 3 * block
    w_np, V_np, _ = top_eigenpairs(lambda V: K @ V, X0, r, tol=TOL, max_basis=3 * block)
    assert_same_pairs(w, stub.asnumpy(Vd), w_np, V_np)
    assert eigen.to_host(Vd).shape == (n, r)


def _states(K, X0, r, solver, **kw):
    """The states at every product boundary (copied: the iteration's own change after it)."""
    got = []
    w, V, info = solver(lambda Z: K @ Z, X0, r, tol=TOL, on_state=lambda s: got.append(
        copy.deepcopy(s)), **kw)
    return got, (w, V, info)


def test_resumed_solve_is_bit_identical(seed, chunk_rows):
    K, r = clustered(300)
    X0 = np.random.default_rng(seed).standard_normal((300, r + 10))
    states, (w, V, info) = _states(K, X0, r, top_eigenpairs, max_basis=3 * (r + 10))
    assert info.restarts >= 1 and len(states) >= 4
    for state in (states[1], states[3]):        # before and after a restart
        w2, V2, info2 = top_eigenpairs(lambda Z: K @ Z, X0, r, tol=TOL, state=state,
                                       max_basis=3 * (r + 10))
        assert np.array_equal(w2, w) and np.array_equal(V2, V)
        assert info2.products == info.products and info2.history == info.history


def test_a_state_of_the_solver_before_resumes(seed):
    """A checkpoint written by the previous solver (the same arrays and counters) continues in
    the new one to the same eigenpairs."""
    K, r = clustered()
    X0 = np.random.default_rng(seed).standard_normal((len(K), r + 10))
    states, (w_old, V_old, _) = _states(K, X0, r, before.top_eigenpairs)
    w, V, info = top_eigenpairs(lambda Z: K @ Z, X0, r, tol=TOL, state=states[2])
    assert info.converged and info.products > states[2].products
    assert_same_pairs(w, V, w_old, V_old)


def test_cupy_path_agrees_with_numpy(seed):
    """Issue 40's line for a GPU host: the solver with its basis on the GPU (CuPy) and on the
    host agree, eigenvalues within 1e-12 relative, subspace angles within 1e-10 (skipped where
    CuPy or a GPU is missing)."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception:  # noqa: BLE001 - CuPy without a driver: no GPU here
        pytest.skip("no GPU")
    K, r = digits_kernel()
    block = r + 10
    X0 = np.random.default_rng(seed).standard_normal((len(K), block))
    Kd = cupy.asarray(K)
    w, Vd, info = top_eigenpairs(lambda V: Kd @ V, cupy.asarray(X0), r, tol=TOL,
                                 max_basis=3 * block)
    assert isinstance(Vd, cupy.ndarray) and info.converged
    w_np, V_np, _ = top_eigenpairs(lambda V: K @ V, X0, r, tol=TOL, max_basis=3 * block)
    assert_same_pairs(w, cupy.asnumpy(Vd), w_np, V_np)
