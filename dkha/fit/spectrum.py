"""The top of the spectrum of ``K'``: dense ``eigh`` for small stores (``dkha.dense-eigh-limit``),
otherwise a block Krylov method (LOBPCG) whose products ``K' V`` are blockwise passes: ``K'`` is
never held whole above that limit. The exact top eigenvalues (E_min's) are cached in the data
store (:mod:`dkha.data.spectra`, ``dkha.spectrum-cache``) and read back by later fits and
evaluations of the same data and kernel."""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import LinearOperator, lobpcg

from dkha import config
from dkha.data.spectra import read_spectrum, spectrum_key, write_spectrum
from dkha.progress import Progress, phase


def _cache_key(engine, cache: bool | None):
    """The spectrum cache entry of ``engine``'s data, kernel and centering (None: no cache)."""
    centering = getattr(engine, "centering", None)
    store = getattr(engine, "store", None)
    if not bool(config.get("spectrum-cache", cache)) or centering is None or store is None:
        return None
    return spectrum_key(store, centering)


def cached_top_eigenvalues(engine, r: int) -> np.ndarray | None:
    """The top ``r`` eigenvalues of ``K'`` from the data store's cache, or ``None``."""
    key = _cache_key(engine, None)
    return None if key is None else read_spectrum(engine.store, key, r)


def top_eigenvalues(engine, r: int, *, seed: int = 0, dense_limit: int | None = None,
                    tol: float = 1e-11, maxiter: int = 500, cache: bool | None = None
                    ) -> np.ndarray:
    """The ``r`` largest eigenvalues of ``K'`` (descending): from the store's cache
    (``cache``, default ``dkha.spectrum-cache``) or computed and then cached."""
    key = _cache_key(engine, cache)
    if key is not None:
        cached = read_spectrum(engine.store, key, r)
        if cached is not None:
            return cached
    l = engine.n_samples
    limit = int(config.get("dense-eigh-limit", dense_limit))
    phase(f"E_min: the top {r} eigenvalues of K' ("
          + ("dense" if l <= limit else "block Krylov") + ")")
    if l <= limit:
        with engine.labelled("eigenvalues of K' (dense)"):
            Kc = engine.dense()
        w = np.linalg.eigvalsh(Kc)[::-1][:r].copy()
    else:
        w = krylov_eigenpairs(engine, r, seed=seed, tol=tol, maxiter=maxiter, exact=True)[0]
    if key is not None:
        write_spectrum(engine.store, key, w)
    return w


def krylov_eigenpairs(engine, r: int, *, seed: int = 0, tol: float = 1e-8, maxiter: int = 300,
                      oversample: int | None = None, X0: np.ndarray | None = None,
                      exact: bool = False, info: dict | None = None):
    """Top-``r`` eigenpairs of ``K'`` by LOBPCG (a block Krylov method) on blockwise products.

    Each iteration is one blockwise pass ``K' V`` on the workers. ``tol`` is relative to the
    largest eigenvalue: iterations stop when every residual ``‖K'v − θv‖ ≤ tol·λ_1``, which bounds
    the eigenvalue errors by about ``(tol·λ_1)² / gap``. ``exact``: float64 products whatever the
    engine's precision (E_min). ``info`` (a dict, optional) receives ``products`` (the passes
    made) and ``residual``: the largest ``‖K'v − θv‖ / λ_1`` of the returned pairs, as LOBPCG
    last measured them (no extra pass).
    """
    l = engine.n_samples
    k = min(l - 1, r + (oversample if oversample is not None else max(5, r // 2)))
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
        w, V, norms = lobpcg(op, X, largest=True, tol=tol * abs(lam1), maxiter=maxiter,
                             verbosityLevel=0, retResidualNormsHistory=True)
    order = np.argsort(w)[::-1]
    if info is not None:
        last = np.asarray(norms[-1] if len(norms) else [np.nan], dtype=np.float64)
        top = last[order][:r] if last.shape == w.shape else last
        info.update(products=int(bar.n), residual=float(np.max(top)) / abs(float(w[order][0])))
    return w[order][:r], V[:, order][:, :r]
