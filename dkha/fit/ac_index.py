"""The AC index (Souza Filho & Diniz 2017, eqs. 61–63): mean |cosine| to exact KPCA components.

For components ``w_i = Σ_q α_iq Φ(d_q)`` over a dictionary ``D`` and reference components
``v_i = Σ_j a_ij Φ(x_j)`` over reference samples ``X_ref`` (exact KPCA, dense ``eigh``)::

    AC = (1/r) Σ_i |α_iᵀ K(D, X_ref) a_i| / ( sqrt(α_iᵀ K(D, D) α_i) · sqrt(a_iᵀ K_ref a_i) )

which is eq. 62 when the dictionary is part of ``X_ref`` (``K(D, X_ref) = [K_m  K_dic×¬dic]``,
eq. 63), and stays valid when it is not. Components are matched by index and the absolute value
is taken (signs are arbitrary; coordinator-math.md §7). AC ignores norms: a high AC does not imply a
low reconstruction error.

The reference is uncentered by default, as the paper's eq. 62 (eigenvectors of the Gram matrix
``K_ref``). With ``centered=True`` it is the usual centered KPCA: eigenvectors ``a`` of ``H K H``
(``H = I − 11ᵀ/l``), i.e. ``v_i = Σ_j (H a_i)_j Φ(x_j)`` — compare it with centered online runs.
When the data set is large the reference is computed on a seeded subset (:meth:`from_store`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dkha.data.sources import ArraySource
from dkha.data.store import DataStore, open_store
from dkha.errors import ParameterError
from dkha.kernels import Kernel

DEFAULT_REFERENCE_SAMPLES = 2000


@dataclass(frozen=True)
class ACReference:
    """Exact KPCA components on reference samples, ready to score online components.

    Attributes
    ----------
    X : ndarray (l_ref, n_features)
    coefficients : ndarray (r, l_ref)
        Reference component ``i`` is ``Σ_j coefficients[i, j] Φ(X[j])`` (already multiplied by
        ``H`` when centered).
    norms : ndarray (r,)
        Feature-space norms of the reference components.
    eigenvalues : ndarray (r,)
        Top eigenvalues of ``K_ref`` (or ``H K_ref H``), descending.
    """

    kernel: Kernel
    X: np.ndarray
    coefficients: np.ndarray
    norms: np.ndarray
    eigenvalues: np.ndarray
    centered: bool = False

    @property
    def n_components(self) -> int:
        return self.coefficients.shape[0]

    @classmethod
    def from_data(cls, X: np.ndarray, kernel: Kernel, n_components: int, *,
                  centered: bool = False) -> ACReference:
        """Dense ``eigh`` of the (optionally centered) Gram matrix of ``X``."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        l = len(X)
        r = int(n_components)
        if not 1 <= r <= l:
            raise ParameterError(
                f"the AC reference needs 1 <= n_components <= reference samples; got {r} and {l}"
            )
        K = kernel.block(X, X)
        if centered:
            mean_row = K.mean(axis=0)
            Kc = K - mean_row[None, :] - mean_row[:, None] + mean_row.mean()
        else:
            Kc = K
        w, V = np.linalg.eigh(Kc)
        order = np.argsort(w)[::-1][:r]
        lam, a = w[order], V[:, order].T  # unit eigenvectors: ‖v_i‖² = aᵀ Kc a = λ_i
        if centered:
            a = a - a.mean(axis=1, keepdims=True)  # H a
        norms = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", a, K, a), 0.0))
        return cls(kernel=kernel, X=X, coefficients=np.ascontiguousarray(a), norms=norms,
                   eigenvalues=lam, centered=bool(centered))

    @classmethod
    def from_store(cls, store, kernel: Kernel, n_components: int, *,
                   max_samples: int = DEFAULT_REFERENCE_SAMPLES, seed: int = 0,
                   centered: bool = False) -> ACReference:
        """The reference on all samples of a data store, or a seeded subset of ``max_samples``."""
        if store.n_samples <= max_samples:
            X = store.read()
        else:
            X = store.sample(max_samples, seed)
        return cls.from_data(X, kernel, n_components, centered=centered)

    def cosines(self, alpha: np.ndarray, dictionary: np.ndarray) -> np.ndarray:
        """``|cos|`` between component ``i`` of ``alpha`` (``r × m``) and reference ``i``."""
        alpha = np.atleast_2d(np.asarray(alpha, dtype=np.float64))
        r = alpha.shape[0]
        if r > self.n_components:
            raise ParameterError(
                f"the AC reference has {self.n_components} components; {r} were given"
            )
        D = np.asarray(dictionary, dtype=np.float64)
        cross = alpha @ self.kernel.block(D, self.X)  # (r, l_ref)
        num = np.einsum("ij,ij->i", cross, self.coefficients[:r])
        Km = self.kernel.block(D, D)
        own = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", alpha, Km, alpha), 0.0))
        den = own * self.norms[:r]
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = np.where(den > 0, np.abs(num) / np.where(den > 0, den, 1.0), 0.0)
        return cos

    def score(self, alpha: np.ndarray, dictionary: np.ndarray) -> float:
        """The AC index: the mean of :meth:`cosines`."""
        return float(np.mean(self.cosines(alpha, dictionary)))


def reference_of(reference, kernel, r: int, *, seed: int = 0,
                 max_samples: int = DEFAULT_REFERENCE_SAMPLES,
                 centered: bool = False) -> ACReference:
    """An :class:`ACReference` as is, or exact KPCA on a data store (path,
    :class:`~dkha.data.store.DataStore` or in-memory source; a seeded subset of at most
    ``max_samples``) or on an array of reference samples."""
    if isinstance(reference, ACReference):
        return reference
    if isinstance(reference, (str, os.PathLike)):
        reference = open_store(reference)
    if isinstance(reference, (DataStore, ArraySource)):
        return ACReference.from_store(reference, kernel, r, max_samples=max_samples, seed=seed,
                                      centered=centered)
    return ACReference.from_data(np.asarray(reference, dtype=np.float64), kernel, r,
                                 centered=centered)
