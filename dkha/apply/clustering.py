"""Spectral clustering on kernel principal components, and the variation of information.

Spectral clustering after Ng, Jordan & Weiss (2002), on the components of a dkha run
(Schraudolph et al. 2006 §5.3):

1. ``Y = Cᵀ`` (``l × r``): the projections of the training samples on the ``r`` components,
   ``C = A K'``: the run's saved ``projection``, or where it has none one blockwise pass on the
   workers (:func:`dkha.fit.evaluate.projections`).
   ``scale="eigenvectors"`` (the default) first divides each component's column by its norm, so
   that for exact kernel PCA ``Y`` holds the unit eigenvectors ``u_i`` of ``K'`` (NJW's matrix of
   stacked eigenvectors; the projections themselves are ``√λ_i u_i``); ``scale="projections"``
   keeps the projections.
2. Normalise each row of ``Y`` to unit length (rows of zero norm are left at zero).
3. k-means on the rows (scikit-learn ``KMeans``, seeded, ``n_init`` restarts).

Quality against class labels: the variation of information (Meilă 2005)::

    VI(X, Y) = H(X | Y) + H(Y | X) = H(X) + H(Y) − 2 I(X; Y)

in nats (natural logarithm), from the joint distribution of the two labellings. VI = 0 for
identical partitions (up to renaming), ``H(X) + H(Y)`` for independent ones; ``ln 10 ≈ 2.30`` is
the entropy of ten balanced classes, so two balanced independent 10-way labellings have VI ≈ 4.6
(the paper's "4.54 corresponds to random performance" on USPS). The random baseline reported
here is the VI of the labels against the clusters shuffled among the samples (same cluster sizes,
independent of the labels).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields

import numpy as np
import xarray as xr

from dkha import config
from dkha.data.atomic import write_zarr_atomically
from dkha.engine.cluster import client_for
from dkha.errors import InputError, ParameterError, RunDirectoryError
from dkha.fit.evaluate import projections
from dkha.progress import phase
from dkha.runs.run import as_run

log = logging.getLogger(__name__)

SCALES = ("eigenvectors", "projections")


def _codes(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise InputError(f"labels must be 1-d, got shape {labels.shape}")
    return np.unique(labels, return_inverse=True)[1].ravel()


def contingency(a, b) -> np.ndarray:
    """Counts ``n[i, j]`` of samples labelled ``i`` in ``a`` and ``j`` in ``b``."""
    ca, cb = _codes(a), _codes(b)
    if len(ca) != len(cb):
        raise InputError(f"labellings of different lengths: {len(ca)} and {len(cb)}")
    n = np.zeros((ca.max(initial=-1) + 1, cb.max(initial=-1) + 1))
    np.add.at(n, (ca, cb), 1.0)
    return n


def entropy(labels) -> float:
    """``H(X) = −Σ p log p`` in nats of a labelling's empirical distribution."""
    p = np.bincount(_codes(labels)) / len(labels)
    p = p[p > 0]
    return float(-np.sum(p * np.log(p)))


def variation_of_information(a, b) -> float:
    """``VI(a, b) = H(a | b) + H(b | a)`` in nats (natural log) between two labellings.

    Symmetric, zero exactly when the partitions agree up to renaming, ``H(a) + H(b)`` when they
    are independent.
    """
    n = contingency(a, b)
    total = n.sum()
    if total == 0:
        raise InputError("variation of information of empty labellings")
    p = n / total
    pa, pb = p.sum(axis=1), p.sum(axis=0)
    i, j = np.nonzero(p)
    pij = p[i, j]
    # H(a|b) + H(b|a) = −Σ p_ij [log(p_ij / p_j) + log(p_ij / p_i)]
    vi = -np.sum(pij * (2.0 * np.log(pij) - np.log(pa[i]) - np.log(pb[j])))
    return float(vi) if vi > 0 else 0.0  # rounding can leave −1e-17 (or −0.0) for equal ones


def random_vi(labels, clusters, *, seed: int = 0) -> float:
    """VI of ``labels`` against ``clusters`` shuffled among the samples (the chance level)."""
    rng = np.random.default_rng(seed)
    return variation_of_information(labels, rng.permutation(np.asarray(clusters)))


def spectral_embedding(projections: np.ndarray, *, scale: str = "eigenvectors") -> np.ndarray:
    """Steps 1–2: the row-normalised ``l × r`` matrix of (scaled) projections."""
    if scale not in SCALES:
        raise ParameterError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    Y = np.array(projections, dtype=np.float64, ndmin=2)
    if scale == "eigenvectors":
        norms = np.linalg.norm(Y, axis=0)
        Y /= np.where(norms > 0, norms, 1.0)[None, :]
    rn = np.linalg.norm(Y, axis=1)
    Y /= np.where(rn > 0, rn, 1.0)[:, None]
    return Y


def spectral_clustering(projections: np.ndarray, n_clusters: int, *, scale: str = "eigenvectors",
                        seed: int = 0, n_init: int = 10) -> np.ndarray:
    """Cluster labels (``0..k−1``) from the samples' projections (``l × r``, one row each)."""
    from sklearn.cluster import KMeans

    if not isinstance(n_clusters, (int, np.integer)) or n_clusters < 1:
        raise ParameterError(
            f"the number of clusters must be a positive integer, got {n_clusters!r}")
    Y = spectral_embedding(projections, scale=scale)
    if n_clusters > len(Y):
        raise ParameterError(f"{n_clusters} clusters for {len(Y)} samples")
    km = KMeans(n_clusters=int(n_clusters), n_init=n_init, random_state=seed)
    return km.fit_predict(Y).astype(np.int64)


@dataclass
class ClusteringResult:
    """Clusters of a run's training samples and, when the store has labels, their quality.

    Attributes
    ----------
    clusters : ndarray of int (l,)
    vi, vi_random : float or None
        VI (nats) of the store's labels against the clusters, and against the shuffled clusters.
    entropy_labels, entropy_clusters : float or None
    """

    clusters: np.ndarray
    n_clusters: int
    vi: float | None = None
    vi_random: float | None = None
    entropy_labels: float | None = None
    entropy_clusters: float | None = None

    def summary(self) -> dict:
        """The number of samples and every field but the clusters, in their order."""
        return {"n_samples": len(self.clusters),
                **{f.name: getattr(self, f.name) for f in fields(self)[1:]}}


def score(clusters: np.ndarray, labels, *, seed: int = 0) -> dict:
    """VI, the random-labels VI and both entropies (nats)."""
    return {"vi": variation_of_information(labels, clusters),
            "vi_random": random_vi(labels, clusters, seed=seed),
            "entropy_labels": entropy(labels), "entropy_clusters": entropy(clusters)}


def cluster_run(run, n_clusters: int, *, scale: str = "eigenvectors", seed: int = 0,
                n_init: int = 10, client=None, verbose: bool = False) -> ClusteringResult:
    """Spectral clustering of a batch run's training samples.

    ``run`` is a run directory or its components dataset. The projections ``C = A K'`` are the
    run's own ``projection`` (saved by the fit), else computed blockwise on the cluster (a
    progress bar or log lines with ``verbose``); the store's ``label`` (when present) scores the
    result.
    """
    run = as_run(run)
    if run.is_dictionary:
        raise InputError("spectral clustering needs a batch run (alpha over the training samples); "
                         "this one is an online (dictionary) run")
    Y = stored_projections(run)
    if Y is None:
        with client_for(client, settings=config.settings()) as c:
            engine = run.engine(c)
            engine.verbose = verbose
            Y = projections(engine, run.alpha).T
    labels = run.training_store().labels()
    phase(f"k-means: {n_clusters} clusters of {len(Y)} samples, {n_init} starts")
    clusters = spectral_clustering(Y, n_clusters, scale=scale, seed=seed, n_init=n_init)
    return ClusteringResult(clusters=clusters, n_clusters=int(n_clusters),
                            **({} if labels is None else score(clusters, labels, seed=seed)))


def stored_projections(run) -> np.ndarray | None:
    """The training projections ``Cᵀ`` (``l × r``) a batch run saved with its components (its
    ``projection``, :func:`dkha.data.result.projection_array`), or None where it holds none of
    that shape."""
    if "projection" not in run.ds:
        return None
    proj = run.ds["projection"]
    shape = (run.ds.sizes.get("sample"), run.n_components)
    if proj.dims != ("sample", "component") or proj.shape != shape:
        return None
    phase("spectral embedding: the run's saved projections")
    return np.asarray(proj.values, dtype=np.float64)


def save_clusters(res: ClusteringResult, out: str, *, attrs: dict | None = None,
                  overwrite: bool = False) -> xr.Dataset:
    """Write ``cluster (sample)`` (and the scores as attrs) to the zarr store ``out``."""
    if os.path.lexists(out) and not overwrite:
        raise RunDirectoryError(f"{out} already exists; pass --overwrite to replace it")
    meta = {k: v for k, v in res.summary().items() if v is not None}
    meta.update(attrs or {})
    ds = xr.Dataset({"cluster": ("sample", res.clusters)}, attrs=meta)
    write_zarr_atomically(ds, out)
    return ds
