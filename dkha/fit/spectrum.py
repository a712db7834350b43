"""The top of the spectrum of ``K'``: dense ``eigh`` for small stores (``dkha.dense-eigh-limit``),
otherwise a block Krylov method (LOBPCG) whose products ``K' V`` are blockwise passes: ``K'`` is
never held whole above that limit."""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import LinearOperator, lobpcg

from dkha import config
from dkha.progress import Progress, phase

#: samples up to which the exact eigenpairs come from a dense ``eigh`` of ``K'`` (LOBPCG needs
#: more than ``5 k`` samples for ``k`` vectors; dense is exact where K' is rank-deficient)
SMALL_DENSE = 200


def top_eigenvalues(engine, r: int, *, seed: int = 0, dense_limit: int | None = None,
                    tol: float = 1e-11, maxiter: int = 500) -> np.ndarray:
    """The ``r`` largest eigenvalues of ``K'`` (descending)."""
    l = engine.n_samples
    limit = int(config.get("dense-eigh-limit", dense_limit))
    phase(f"E_min: the top {r} eigenvalues of K' ("
          + ("dense" if l <= limit else "block Krylov") + ")")
    if l <= limit:
        with engine.labelled("eigenvalues of K' (dense)"):
            Kc = engine.dense()
        w = np.linalg.eigvalsh(Kc)
        return w[::-1][:r].copy()
    return krylov_eigenpairs(engine, r, seed=seed, tol=tol, maxiter=maxiter, exact=True)[0]


def krylov_eigenpairs(engine, r: int, *, seed: int = 0, tol: float = 1e-8, maxiter: int = 300,
                      oversample: int | None = None, X0: np.ndarray | None = None,
                      exact: bool = False):
    """Top-``r`` eigenpairs of ``K'`` by LOBPCG (a block Krylov method) on blockwise products.

    Each iteration is one blockwise pass ``K' V`` on the workers. ``tol`` is relative to the
    largest eigenvalue: iterations stop when every residual ``‖K'v − θv‖ ≤ tol·λ_1``, which bounds
    the eigenvalue errors by about ``(tol·λ_1)² / gap``. ``exact``: float64 products whatever the
    engine's precision (E_min).
    """
    l = engine.n_samples
    k = min(l - 1, r + (oversample if oversample is not None else max(5, r // 2)))
    if l <= max(SMALL_DENSE, 5 * k):     # where LOBPCG would fall back to eigh itself
        with engine.labelled("eigenpairs of K' (dense)"):
            Kc = engine.dense()
        w, V = np.linalg.eigh(0.5 * (Kc + Kc.T))
        return w[::-1][:r].copy(), V[:, ::-1][:, :r].copy()
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((l, k)) if X0 is None else np.asarray(X0, dtype=np.float64)
    X, _ = np.linalg.qr(X)
    verbose = getattr(engine, "verbose", False)
    # no total: LOBPCG stops at its tolerance, far below the iteration cap
    with Progress(verbose, None, "Krylov (LOBPCG)", unit="product") as bar:
        def matmat(V):
            bar.update()
            with engine.labelled(f"Krylov product {bar.n}"):
                return engine.matmat(V, exact=True) if exact else engine.matmat(V)

        KX = matmat(X)
        lam1 = float(np.max(np.linalg.eigvalsh(X.T @ KX)))  # Rayleigh-Ritz scale of the spectrum
        X, _ = np.linalg.qr(KX)  # one step of subspace iteration as the start
        op = LinearOperator((l, l), matvec=lambda v: matmat(v.reshape(-1, 1)).ravel(),
                            matmat=matmat, dtype=np.float64)
        w, V = lobpcg(op, X, largest=True, tol=tol * abs(lam1), maxiter=maxiter,
                      verbosityLevel=0)
    order = np.argsort(w)[::-1]
    return w[order][:r], V[:, order][:, :r]


def clip_eigenvalues(eigenvalue: np.ndarray) -> np.ndarray:
    """scikit-learn's ``_check_psd_eigenvalues``: round-off eigenvalues (negative ones, or below
    ``1e-12`` of the largest) become exactly 0; significantly negative ones raise its
    ``ValueError`` ("There are significant negative eigenvalues ...": the kernel is not PSD)."""
    w = np.array(eigenvalue, dtype=np.float64)     # a copy, clipped below (its rules, its words)
    if w.size == 0:
        return w
    top = w.max()
    if top < 0:
        raise ValueError(f"All eigenvalues are negative (maximum is {top:g}). Either the matrix "
                         "is not PSD, or there was an issue while computing the "
                         "eigendecomposition of the matrix.")
    if w.min() < -1e-5 * top:
        raise ValueError(f"There are significant negative eigenvalues ({-w.min() / top:g} of the "
                         "maximum positive). Either the matrix is not PSD, or there was an issue "
                         "while computing the eigendecomposition of the matrix.")
    w[w < 0] = 0.0
    w[(w > 0) & (w < 1e-12 * top)] = 0.0
    return w


def sign_convention(alpha: np.ndarray) -> np.ndarray:
    """``±1`` per component such that each component's largest coefficient in absolute value
    (the first of equal ones) is positive: scikit-learn's ``svd_flip`` on the eigenvectors
    ``alpha_i √λ_i``, so signs depend on the data only, never on the seed."""
    alpha = np.asarray(alpha)
    if alpha.size == 0:
        return np.ones(len(alpha))
    pick = np.argmax(np.abs(alpha), axis=1)
    signs = np.sign(alpha[np.arange(len(alpha)), pick])
    signs[signs == 0] = 1.0
    return signs


def finalise_components(alpha: np.ndarray, eigenvalue: np.ndarray,
                        projection: np.ndarray | None = None):
    """The components as a fit hands them out: eigenvalues clipped (:func:`clip_eigenvalues`),
    components of eigenvalue 0 null (coefficients and projections 0: they carry no variance,
    and round-off directions would be scaled by ``1/√λ`` up to 1e7), signs fixed
    (:func:`sign_convention`), sorted by decreasing eigenvalue. Returns ``(alpha, eigenvalue,
    projection, null)`` with ``null`` the number of null components."""
    w = clip_eigenvalues(eigenvalue)
    alpha = np.array(alpha, dtype=np.float64)
    order = np.argsort(-w, kind="stable")
    w, alpha = w[order], alpha[order]
    null = w <= 0
    alpha[null] = 0.0
    signs = sign_convention(alpha)
    alpha *= signs[:, None]
    if projection is not None:
        projection = np.array(projection, dtype=np.float64)[order] * signs[:, None]
        projection[null] = 0.0
    return alpha, w, projection, int(null.sum())
