"""The block Krylov eigensolver (dkha.solvers.eigen) against dense numpy.linalg.eigh."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import subspace_angles

from dkha.solvers.eigen import orthonormal_columns, top_eigenpairs

R = 6


def centered_gaussian(n: int, rng, dim: int = 5) -> np.ndarray:
    X = rng.standard_normal((n, dim))
    sq = (X * X).sum(1)
    K = np.exp(-np.maximum(sq[:, None] + sq[None] - 2 * X @ X.T, 0) / (2 * 2.0**2))
    mk = K.mean(0)
    return K - mk[None] - mk[:, None] + mk.mean()


def counted(K):
    calls = []

    def matmat(V):
        calls.append(V.shape[1])
        return K @ V
    return matmat, calls


@pytest.mark.parametrize("max_basis", [None, 3 * (R + 4)])     # the second restarts
def test_top_eigenpairs_match_eigh(seed, max_basis):
    rng = np.random.default_rng(seed)
    K = centered_gaussian(300, rng)
    w, V = np.linalg.eigh(K)
    w, V = w[::-1], V[:, ::-1]
    assert (w[R - 1] - w[R]) / w[0] > 1e-3
    matmat, calls = counted(K)
    lam, U, info = top_eigenpairs(matmat, rng.standard_normal((300, R + 4)), R, tol=1e-9,
                                  max_basis=max_basis)
    assert info.converged and not info.stalled
    assert info.products == len(calls) and info.columns == sum(calls)
    if max_basis is not None:
        assert info.restarts >= 1
        assert max(calls) <= R + 4
    np.testing.assert_allclose(lam, w[:R], rtol=1e-12)
    np.testing.assert_allclose(U.T @ U, np.eye(R), atol=1e-12)
    resid = np.linalg.norm(K @ U - U * lam, axis=0) / lam
    assert resid.max() <= 1e-9 * 1.01
    assert np.max(subspace_angles(U, V[:, :R])) < 1e-7
    assert np.all(np.abs(np.abs(np.sum(U * V[:, :R], axis=0)) - 1) < 1e-10)


def test_top_eigenpairs_fewer_products_than_lobpcg(seed):
    """The point of the method: to the same per-component residual in fewer products than
    scipy's LOBPCG from the same start (which dkha used before)."""
    from scipy.sparse.linalg import lobpcg

    rng = np.random.default_rng(seed)
    K = centered_gaussian(600, rng, dim=8)
    X0 = rng.standard_normal((600, R + 4))
    matmat, _calls = counted(K)
    lam, _U, info = top_eigenpairs(matmat, X0, R, tol=1e-6)
    assert info.converged
    lobpcg_calls = []

    def op(V):
        lobpcg_calls.append(1)
        return K @ V
    w, V = lobpcg(op, X0.copy(), largest=True, tol=1e-6 * lam[R - 1], maxiter=500)
    o = np.argsort(w)[::-1][:R]
    assert np.max(np.linalg.norm(K @ V[:, o] - V[:, o] * w[o], axis=0) / w[o]) <= 1e-6
    assert info.products < len(lobpcg_calls)


def test_rank_deficient_operator_stops_at_its_rank(seed):
    """A linear kernel of rank 3 asked for 6 components: the Krylov space is exhausted, the
    solve ends converged with the zero eigenvalues at round-off."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((200, 3))
    X -= X.mean(0)
    K = X @ X.T
    w = np.linalg.eigvalsh(K)[::-1]
    matmat, calls = counted(K)
    lam, _U, info = top_eigenpairs(matmat, rng.standard_normal((200, R + 4)), R, tol=1e-10)
    assert info.converged and len(calls) <= 3
    np.testing.assert_allclose(lam[:3], w[:3], rtol=1e-12)
    assert np.all(np.abs(lam[3:]) < 1e-10 * w[0])


def test_warm_start_converges_in_fewer_products(seed):
    rng = np.random.default_rng(seed)
    K = centered_gaussian(400, rng)
    _w, V = np.linalg.eigh(K)
    cold = top_eigenpairs(lambda V: K @ V, rng.standard_normal((400, R + 4)), R, tol=1e-8)[2]
    start = np.hstack([V[:, ::-1][:, :R] + 1e-4 * rng.standard_normal((400, R)),
                       rng.standard_normal((400, 4))])
    warm = top_eigenpairs(lambda V: K @ V, start, R, tol=1e-8)[2]
    assert warm.converged and warm.products < cold.products


def test_stall_stops_on_noisy_products(seed):
    """Products with noise (float32 tiles) that keep the residuals above tol: the solve stops
    after ``stall`` products without progress instead of running to ``maxiter``."""
    rng = np.random.default_rng(seed)
    K = centered_gaussian(300, rng)

    def noisy(V):
        return K @ V + 1e-5 * rng.standard_normal(V.shape)
    lam, _U, info = top_eigenpairs(noisy, rng.standard_normal((300, R + 4)), R, tol=1e-12,
                                  maxiter=200, stall=4)
    assert info.stalled and not info.converged and info.products < 60
    np.testing.assert_allclose(lam, np.linalg.eigvalsh(K)[::-1][:R], rtol=1e-3)


def test_orthonormal_columns_drops_dependent_directions(seed):
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((50, 4)))[0]
    Z = np.hstack([rng.standard_normal((50, 3)), Q[:, :1] * 2.0])
    Z = np.hstack([Z, Z[:, :1] + Z[:, 1:2]])                 # dependent column
    U = orthonormal_columns(Z, Q)
    assert U.shape == (50, 3)
    np.testing.assert_allclose(U.T @ U, np.eye(3), atol=1e-12)
    assert np.abs(Q.T @ U).max() < 1e-12


def test_start_block_narrower_than_r_is_refused():
    with pytest.raises(ValueError, match="at least r"):
        top_eigenpairs(lambda V: V, np.ones((10, 2)), 3)


def test_the_krylov_solvers_dense_eigh_is_said_and_saved(digits_store, digits, tmp_path):
    """On at most ``max(200, 5·block)`` samples the Krylov solver's eigenpairs come from a dense
    ``eigh`` of ``K'``: the run says so among its first lines and in its summary, and saves
    ``path: dense`` with the reason (before: ``krylov``, or nothing for ``--algorithm krylov``),
    its eigenvalues those of the oracle's ``eigh``. Above that, the Krylov products run and
    nothing claims a dense path."""
    from dkha.data import result
    from dkha.pipeline.report import settings_rows
    from tests.conftest import centered_kernel_oracle
    from tests.processes import dkha_in_process, progress_lines

    w = np.linalg.eigvalsh(centered_kernel_oracle(np.array(digits), "gaussian", sigma=4)[1])[::-1]
    why = "300 samples, at most max(200, 5 × the Krylov block of 75) = 375: "
    for name, algorithm, config in (("auto", (), {"dkha.dense-bytes": 0}),
                                    ("krylov", ("--algorithm", "krylov"), None)):
        run = tmp_path / name
        p = dkha_in_process("fit", digits_store.path, "-o", str(run), "--components", "50",
                            "--sigma", "4", *algorithm, config=config)
        assert p.returncode == 0, p.stderr
        said = [m for _, m in progress_lines(p.stderr)]
        line = (f"dkha fit: path: dense ({why}the exact eigenpairs by a dense eigh of the "
                "300×300 K' instead of Krylov products)")
        assert [m for m in said if m.startswith("dkha fit: path: ")] == [line], said
        assert not [m for m in said if m.startswith(("dkha fit: estimate", "dkha fit: Krylov"))]
        assert f"\npath: dense ({why}" in p.stdout, p.stdout
        ds = result.load(str(run))
        assert ds.attrs["path"] == "dense" and ds.attrs["path_reason"].startswith(why)
        assert "(dense)" in ds.attrs["history"]
        rows = dict(settings_rows(ds, None))          # the report's settings table
        assert rows["algorithm"] == f"{name} → dense" and rows["why this path"].startswith(why)
        np.testing.assert_allclose(ds["eigenvalue"].values, w[:50], rtol=1e-10, atol=1e-12)
    run = tmp_path / "products"                 # 300 > max(200, 5 × 13): Krylov products
    p = dkha_in_process("fit", digits_store.path, "-o", str(run), "--components", "3",
                        "--sigma", "4", "--algorithm", "krylov")
    assert p.returncode == 0, p.stderr
    ds = result.load(str(run))
    assert "path" not in ds.attrs and "path: dense" not in p.stdout + p.stderr, p.stdout
    assert "after " in p.stdout and " Krylov products" in p.stdout
    np.testing.assert_allclose(ds["eigenvalue"].values, w[:3], rtol=1e-8)
