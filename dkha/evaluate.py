"""Blockwise evaluation: reconstruction error E(A) (eq. 22), E_min, excess error, eigenvalues.

With ``C = A K'`` (one blockwise pass, ``K' Aᵀ``)::

    E(A)² = Σ over row blocks I of ‖K'[I, :] − C[:, I]ᵀ C‖²_F     (direct form, second pass)
    E_min² = ‖K'‖²_F − Σ_{i≤r} λ_i(K')²

``λ_1..λ_r`` come from dense ``eigh`` for small stores (``dkha.dense-eigh-limit``) and from a
block Krylov method (LOBPCG) whose products ``K' V`` are blockwise passes otherwise: ``K'`` is
never held whole above that limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from dkha import config

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """Reconstruction errors of one coefficient matrix."""

    error: float
    error_min: float
    excess: float
    frobenius: float

    def as_dict(self) -> dict:
        return {"error": self.error, "error_min": self.error_min, "excess": self.excess,
                "frobenius": self.frobenius}


def top_eigenvalues(engine, r: int, *, seed: int = 0, dense_limit: int | None = None,
                    tol: float = 1e-11, maxiter: int = 500) -> np.ndarray:
    """The ``r`` largest eigenvalues of ``K'`` (descending)."""
    l = engine.n_samples
    limit = int(config.get("dense-eigh-limit", dense_limit))
    if l <= limit:
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
    from scipy.sparse.linalg import LinearOperator, lobpcg

    l = engine.n_samples
    k = min(l - 1, r + (oversample if oversample is not None else max(5, r // 2)))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((l, k)) if X0 is None else np.asarray(X0, dtype=np.float64)
    X, _ = np.linalg.qr(X)
    product = (lambda V: engine.matmat(V, exact=True)) if exact else engine.matmat
    KX = product(X)
    lam1 = float(np.max(np.linalg.eigvalsh(X.T @ KX)))  # Rayleigh-Ritz scale of the spectrum
    X, _ = np.linalg.qr(KX)  # one step of subspace iteration as the start
    op = LinearOperator((l, l), matvec=lambda v: product(v.reshape(-1, 1)).ravel(),
                        matmat=product, dtype=np.float64)
    w, V = lobpcg(op, X, largest=True, tol=tol * abs(lam1), maxiter=maxiter, verbosityLevel=0)
    order = np.argsort(w)[::-1]
    return w[order][:r], V[:, order][:, :r]


def projections(engine, A: np.ndarray) -> np.ndarray:
    """``C = A K'`` (``r × l``), one blockwise pass."""
    return projections_many(engine, [A])[0]


def projections_many(engine, As: list[np.ndarray]) -> list[np.ndarray]:
    """``C = A K'`` for each coefficient matrix of ``As``: one blockwise pass for all of them
    (the stacked ``[A_1; A_2; …]ᵀ`` multiplied by ``K'``), or, where they are zero outside a few
    columns ``S`` (a quarter of ``l`` or fewer), ``A[:, S] K'[S, :]`` from the ``|S|`` kernel rows
    (e.g. the start ``init="random:M"``: ``M`` rows instead of ``l²/2`` tile entries)."""
    if not As:
        return []
    V = np.ascontiguousarray(np.concatenate([np.asarray(A, dtype=np.float64) for A in As]).T)
    columns = np.flatnonzero(np.any(V != 0, axis=1))
    if 4 * len(columns) <= V.shape[0]:
        KV = np.zeros(V.shape)
        b = engine.block_rows
        blocks = ((a, columns[a:a + b]) for a in range(0, len(columns), b))
        for _, index, rows in engine.stream(blocks):
            KV += rows.T @ V[index]
    else:
        KV = engine.matmat(V)
    out, start = [], 0
    for A in As:
        out.append(KV[:, start:start + A.shape[0]].T.copy())
        start += A.shape[0]
    return out


def evaluate(engine, A: np.ndarray, eigenvalues: np.ndarray | None = None, *,
             C: np.ndarray | None = None) -> Evaluation:
    """``E(A)``, ``E_min`` and the excess ``E/E_min − 1`` of eq. 22, blockwise.

    ``eigenvalues`` (the top ``r`` of ``K'``) may be passed to skip their computation.
    """
    return evaluate_many(engine, [A], eigenvalues, Cs=None if C is None else [C])[0]


def evaluate_many(engine, As: list[np.ndarray], eigenvalues: np.ndarray | None = None, *,
                  Cs: list[np.ndarray] | None = None) -> list[Evaluation]:
    """:func:`evaluate` for several coefficient matrices, sharing the kernel passes: one pass
    for all their ``C = A K'`` (unless ``Cs`` are given) and one for all their residuals."""
    if Cs is None:
        Cs = projections_many(engine, As)
    frob2, res2 = engine.residuals(Cs)
    r = max(A.shape[0] for A in As)
    if eigenvalues is None:
        eigenvalues = top_eigenvalues(engine, r)
    out = []
    for A, res in zip(As, res2):
        emin2 = frob2 - float(np.sum(np.asarray(eigenvalues[:A.shape[0]]) ** 2))
        error = float(np.sqrt(max(res, 0.0)))
        error_min = float(np.sqrt(max(emin2, 0.0)))
        excess = error / error_min - 1.0 if error_min > 0 else float("inf")
        out.append(Evaluation(error=error, error_min=error_min, excess=excess,
                              frobenius=float(np.sqrt(frob2))))
    return out

# --- explained variance (Honeine 2012, eq. 23) --------------------------------------------------


@dataclass
class ExplainedVariance:
    """Honeine's explained variance per component (eq. 23) and what it was estimated over.

    ``Var_x(ψ_j(x)) = E_x(ψ_j(x)²) − E_x(ψ_j(x))²`` with ``ψ_j(x) = ⟨v_j, Φ(x)⟩`` the principal
    function of component ``j`` as the run holds it (not normalised), the expectations over the
    data set's samples. A projection that differs from ``ψ_j`` by a constant (``⟨v_j, Φ(x) − m⟩``,
    what dkha's projections are) has the same variance. For exact kernel PCA with unit
    components, ``Var(ψ_j) = λ_j(K')/l`` and the sum over all components is ``trace(K')/l``.

    Attributes
    ----------
    variance : ndarray (r,)
        Eq. 23 per component.
    total : float or None
        ``trace(K')/l = mean_i k(x_i, x_i) − mkm``: the variance in feature space, which all the
        components of exact kernel PCA explain (batch runs; None for dictionary runs, which hold
        no ``mkm``).
    n_samples : int
        Samples the expectations were taken over.
    sampled : bool
        Whether those were a seeded sample rather than the whole data set.
    """

    variance: np.ndarray
    total: float | None
    n_samples: int
    sampled: bool

    def as_dict(self) -> dict:
        out = {"explained_variance": [float(v) for v in self.variance],
               "cumulative_variance": float(np.sum(self.variance)),
               "total_variance": self.total, "variance_samples": self.n_samples,
               "variance_sampled": self.sampled}
        if self.total:
            out["explained_fraction"] = float(np.sum(self.variance)) / self.total
        return out


def variance_of(Y: np.ndarray) -> np.ndarray:
    """Eq. 23 from the values ``Y (n, r)`` of the principal functions on ``n`` samples."""
    Y = np.asarray(Y, dtype=np.float64)
    mean = Y.mean(axis=0)
    return np.maximum(np.mean(Y * Y, axis=0) - mean * mean, 0.0)


def explained_variance(ds, client, *, samples: int | None = None, seed: int = 0
                       ) -> ExplainedVariance:
    """Eq. 23 for every component of a run (batch or online), blockwise on the cluster.

    Parameters
    ----------
    ds : xarray.Dataset
        The run's components (:func:`dkha.result.load`).
    client : distributed.Client
    samples : int, optional
        Take the expectations over a seeded sample of this many rows of the training store
        instead of all of it (for huge ``l``; the sample's values are computed the same way).
    seed : int
        Seeds the sample.

    Notes
    -----
    Batch runs, whole data set: ``C = A K'`` in one blockwise pass (:func:`projections`), the
    values of the principal functions on every training sample. Dictionary (online) runs: the
    store's chunks are projected on the workers (:func:`dkha.transform.transform_lazy`) and only
    the per-component sums ``Σ ψ`` and ``Σ ψ²`` come back.
    """
    from dkha.store import open_store
    from dkha.transform import engine_for_run, kernel_of, project, transform_lazy

    store = open_store(ds.attrs["store"])
    online = "dictionary" in ds
    sampled = samples is not None and samples < store.n_samples
    total = None
    if sampled:
        X = store.sample(int(samples), seed)
        values = project(ds, X, client=client)
        var, n = variance_of(values), len(X)
        if not online:
            total = float(np.mean(kernel_of(ds).diagonal(X))) - float(ds.attrs["mkm"])
        return ExplainedVariance(var, total, n, True)
    if online:
        Y = transform_lazy(ds, store.path).data
        s1, s2 = client.gather(client.compute([Y.sum(axis=0), (Y * Y).sum(axis=0)]))
        l = store.n_samples
        mean = s1 / l
        var = np.maximum(s2 / l - mean * mean, 0.0)
    else:
        engine = engine_for_run(ds, client)
        var = variance_of(projections(engine, ds["alpha"].values).T)
        kernel = kernel_of(ds)
        diag = sum(float(kernel.diagonal(Xc).sum()) for _, _, Xc in store.iter_chunks()) \
            if kernel.name not in ("gaussian", "laplacian") else float(store.n_samples)
        total = diag / store.n_samples - float(ds.attrs["mkm"])
    return ExplainedVariance(var, total, store.n_samples, False)
