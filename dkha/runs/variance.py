"""Honeine's explained variance (2012, eq. 23) of a saved run, batch or dictionary, blockwise on
the cluster."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from dkha.fit.evaluate import projections, variance_of
from dkha.runs.run import Run, as_run
from dkha.runs.transform import project, transform_lazy


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


def explained_variance(ds: xr.Dataset | Run, client, *, samples: int | None = None, seed: int = 0
                       ) -> ExplainedVariance:
    """Eq. 23 for every component of a run (batch or online), blockwise on the cluster.

    Parameters
    ----------
    ds : xarray.Dataset
        The run's components (:func:`dkha.data.result.load`).
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
    store's chunks are projected on the workers (:func:`dkha.runs.transform.transform_lazy`)
    and only the per-component sums ``Σ ψ`` and ``Σ ψ²`` come back.
    """
    run = as_run(ds)
    ds = run.ds
    store = run.training_store()
    online = run.is_dictionary
    sampled = samples is not None and samples < store.n_samples
    total = None
    if sampled:
        X = store.sample(int(samples), seed)
        values = project(run, X, client=client)
        var, n = variance_of(values), len(X)
        if not online:
            total = float(np.mean(run.kernel.diagonal(X))) - float(ds.attrs["mkm"])
        return ExplainedVariance(var, total, n, True)
    if online:
        Y = transform_lazy(run, store.path, client=client).data
        s1, s2 = client.gather(client.compute([Y.sum(axis=0), (Y * Y).sum(axis=0)]))
        l = store.n_samples
        mean = s1 / l
        var = np.maximum(s2 / l - mean * mean, 0.0)
    else:
        engine = run.engine(client)
        var = variance_of(projections(engine, ds["alpha"].values).T)
        kernel = run.kernel
        constant = kernel.constant_diagonal()
        diag = sum(float(kernel.diagonal(Xc).sum()) for _, _, Xc in store.iter_chunks()) \
            if constant is None else constant * store.n_samples
        total = diag / store.n_samples - float(ds.attrs["mkm"])
    return ExplainedVariance(var, total, store.n_samples, False)
