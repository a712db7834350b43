"""The top of the spectrum of ``K'``: dense ``eigh`` for small stores (``dkha.dense-eigh-limit``),
otherwise a block Krylov method (:mod:`dkha.solvers.eigen`) whose products ``K' V`` are blockwise
passes: ``K'`` is never held whole above that limit. The exact top eigenvalues (E_min's) are cached
in the data store (:mod:`dkha.data.spectra`, ``dkha.spectrum-cache``) and read back by later fits
and evaluations of the same data and kernel."""

from __future__ import annotations

import logging

import numpy as np
from dask.utils import parse_bytes

from dkha.data.spectra import read_spectrum, spectrum_key, write_spectrum
from dkha.engine.mkrow import engine_content_key
from dkha.progress import Progress, phase
from dkha.solvers.eigen import KrylovInfo, to_host, top_eigenpairs

log = logging.getLogger(__name__)

#: samples up to which the exact eigenpairs come from a dense ``eigh`` of ``K'`` (also below
#: ``5 k`` samples for a block of ``k`` vectors; dense is exact where K' is rank-deficient)
SMALL_DENSE = 200


def _cache_key(engine, cache: bool | None):
    """The spectrum cache entry of ``engine``'s data, kernel and centering (None: no cache)."""
    centering = getattr(engine, "centering", None)
    store = getattr(engine, "store", None)
    cache = engine.settings.spectrum_cache if cache is None else cache
    if not bool(cache) or centering is None or store is None:
        return None
    if store.rows is not None:      # an array fit's own store, removed with the model
        return None
    return spectrum_key(store, centering, engine_content_key(engine))


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
    limit = int(engine.settings.dense_eigh_limit if dense_limit is None else dense_limit)
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
                      exact: bool = False):
    """Top-``r`` eigenpairs ``(w, V)`` of ``K'`` (descending) by the block Krylov method of
    :func:`krylov_solve` (which also says how it went)."""
    w, V, _ = krylov_solve(engine, r, seed=seed, tol=tol, maxiter=maxiter, oversample=oversample,
                           X0=X0, exact=exact)
    return w, V


def dense_shortcut(l: int, r: int, oversample: int | None = None) -> str | None:
    """Why the block Krylov solve of the top ``r`` eigenpairs of ``l`` samples is a dense
    ``eigh`` of ``K'`` held whole instead (:func:`krylov_solve`'s shortcut: at most
    ``max(SMALL_DENSE, 5·block)`` samples, where the basis would span most of the space), said
    and saved as the run's path; ``None`` where the Krylov products run."""
    k = min(l - 1, r + (oversample if oversample is not None else default_oversample(r)))
    limit = max(SMALL_DENSE, 5 * k)
    if l > limit:
        return None
    return (f"{l} samples, at most max({SMALL_DENSE}, 5 × the Krylov block of {k}) = {limit}: "
            f"the exact eigenpairs by a dense eigh of the {l}×{l} K' instead of Krylov products")


def default_oversample(r: int) -> int:
    """Columns of the Krylov block beyond ``r``: ``max(10, r/2)``. A wider block converges the
    ``r``-th component at the gap ``λ_r/λ_{block+1}``: on 3 500 patches (r = 20, median σ) the
    residual 1e-6 took 13 products at 30 columns, 11 at 40 (LOBPCG: 42 at 30); on 20 000,
    9 at 30 or 40 (LOBPCG: 26)."""
    return max(10, r // 2)


def krylov_solve(engine, r: int, *, seed: int = 0, tol: float = 1e-8, maxiter: int = 300,
                 oversample: int | None = None, X0: np.ndarray | None = None,
                 exact: bool = False, state=None, on_state=None
                 ) -> tuple[np.ndarray, np.ndarray, KrylovInfo]:
    """Top-``r`` eigenpairs of ``K'`` by a thick-restarted block Krylov method on blockwise
    products (:func:`dkha.solvers.eigen.top_eigenpairs`), with how it went (products, residuals).

    Each product is one blockwise pass ``K' V`` on the workers. ``tol`` is per component: the
    iterations stop when every ``‖K'v_i − θ_i v_i‖ ≤ tol·θ_i``, which bounds the relative
    eigenvalue errors by about ``tol² θ_i / gap``. ``X0``: start vectors (padded with seeded random
    ones to the block of ``r + oversample`` columns). ``exact``: float64 products whatever the
    engine's precision (E_min). The basis is sized by ``dkha.krylov-memory`` bytes (twice
    ``l × columns``: the vectors and their products; at least 3 blocks), held twice (a spare
    pair for the Ritz vectors and restarts), on the GPU where :func:`solver_array_module`
    says. ``state``, ``on_state``: as :func:`~dkha.solvers.eigen.top_eigenpairs` takes them (a
    resumed solve's progress counts its products from the state's).
    """
    l = engine.n_samples
    k = min(l - 1, r + (oversample if oversample is not None else default_oversample(r)))
    if dense_shortcut(l, r, oversample):     # a dense eigh (exact where K' is rank-deficient)
        with engine.labelled("eigenpairs of K' (dense)"):
            Kc = engine.dense()
        w, V = np.linalg.eigh(0.5 * (Kc + Kc.T))
        return w[::-1][:r].copy(), V[:, ::-1][:, :r].copy(), KrylovInfo(converged=True)
    rng = np.random.default_rng(seed)
    start = rng.standard_normal((l, k))
    if X0 is not None:
        X0 = np.asarray(X0, dtype=np.float64)[:, :k]
        start[:, :X0.shape[1]] = X0
    max_basis = int(parse_bytes(engine.settings.krylov_memory) // (16 * l))
    verbose = getattr(engine, "verbose", False)
    xp = solver_array_module(engine)
    # no total: the solver stops at its tolerance, far below the iteration cap
    done = 0 if state is None else state.products
    with Progress(verbose, None, "Krylov", unit="product", initial=done) as bar:
        def matmat(V):
            bar.update()
            V = to_host(V)
            with engine.labelled(f"Krylov product {bar.n}"):
                KV = engine.matmat(V, exact=True) if exact else engine.matmat(V)
            return xp.asarray(KV)

        w, V, info = top_eigenpairs(matmat, xp.asarray(start), r, tol=tol, maxiter=maxiter,
                                    max_basis=max_basis, state=state, on_state=on_state)
    log.info("Krylov: %d products (%d columns), %d restarts, largest residual %.2e%s; the "
             "basis on the %s%s", info.products, info.columns, info.restarts, info.history[-1],
             "" if info.converged else " (not converged)", "host" if xp is np else "GPU",
             f", {info.householder} blocks by Householder QR" if info.householder else "")
    return w, to_host(V), info


def solver_array_module(engine):
    """Where the Krylov solver keeps its basis, blocks and products between products: CuPy
    where the products run on GPU workers (``engine.bands`` on a ``cuda`` device) and this
    process sees a GPU too (issue 40: then only ``k × k`` matrices reach the host, and the
    products' ``l × k`` blocks cross once each way); NumPy otherwise."""
    bands = getattr(engine, "bands", None)
    if bands is None or bands.device.get("kind") != "cuda":
        return np
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return np
    except Exception:  # noqa: BLE001 - no usable GPU here: the host keeps the basis
        return np
    return cupy


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
                        projection: np.ndarray | None = None, *, r: int = 0):
    """The components as a fit hands them out: eigenvalues clipped (:func:`clip_eigenvalues`),
    components of eigenvalue 0 null (coefficients and projections 0: they carry no variance,
    and round-off directions would be scaled by ``1/√λ`` up to 1e7), signs fixed
    (:func:`sign_convention`), sorted by decreasing eigenvalue, and null ones added up to the
    ``r`` components the run was asked for (a Nyström start that finds ``K'`` of a lower rank
    fits only that many, :func:`dkha.fit.coordinator.start`: the run holds the others null, as
    the dense path does). Returns ``(alpha, eigenvalue, projection, null)`` with ``null`` the
    number of null components."""
    missing = max(0, r - len(alpha))
    w = clip_eigenvalues(np.concatenate([eigenvalue, np.zeros(missing)]))
    alpha = np.vstack([alpha, np.zeros((missing, np.shape(alpha)[1]))])
    if projection is not None:
        projection = np.vstack([projection, np.zeros((missing, np.shape(projection)[1]))])
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
