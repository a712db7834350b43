"""scikit-learn's view of a batch fit (:class:`~dkha.estimators.batch.KernelHebbianPCA`): the
output width, null components, ``eigenvectors_``, ``gamma_`` and the learned pre-image."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.utils import check_random_state

from dkha import config
from dkha.data.result import projection_array
from dkha.errors import NullComponentWarning
from dkha.fit.ridge import learned_preimage as fit_learned_preimage
from dkha.kernels import kernel_spec


def finish_fit(model, precomputed: bool) -> None:
    """scikit-learn's view of the fit: the output width ``min(n_components, l)`` (null
    components beyond the rank of ``K'`` padded, or dropped with ``remove_zero_eig`` and
    ``n_components=None``), ``eigenvectors_``, ``gamma_``, and the learned pre-image."""
    l = int(model.n_samples_)
    if precomputed:
        model.n_features_in_ = l
    null = int(getattr(model, "null_components_", 0))
    width = l if model.n_components is None else min(int(model.n_components), l)
    if model.remove_zero_eig or model.n_components is None:
        width = int(np.sum(model.eigenvalues_ > 0))
    pad = width - len(model.alpha_)
    if null + max(pad, 0) and not (model.remove_zero_eig or model.n_components is None):
        warnings.warn(f"K' has rank {len(model.alpha_) - null}: {null + max(pad, 0)} of the "
                      f"{width} components are null (eigenvalue 0, projections 0); ask for "
                      "fewer components or set remove_zero_eig=True",
                      NullComponentWarning, stacklevel=3)
    if pad > 0:
        model.alpha_ = np.vstack([model.alpha_, np.zeros((pad, l))])
        model.eigenvalues_ = np.concatenate([model.eigenvalues_, np.zeros(pad)])
    keep = slice(0, width)
    model.alpha_, model.eigenvalues_ = model.alpha_[keep], model.eigenvalues_[keep]
    P = np.zeros((l, width))
    C = model.projection_.values[:, :width]
    P[:, :C.shape[1]] = C
    model.projection_ = projection_array(P.T, model.store_)
    model.n_components_ = width
    model.eigenvectors_ = (model.alpha_ * np.sqrt(model.eigenvalues_)[:, None]).T
    model.gamma_ = sklearn_gamma(model)
    if model.fit_inverse_transform is True:
        learned_preimage(model)


def sklearn_gamma(model) -> float:
    """scikit-learn's ``gamma_``: the ``gamma`` asked; ``1/n_features`` under a name whose
    ``gamma`` defaults to ``None`` (scikit-learn's ``rbf``, ``poly``, ``sigmoid``: exactly its
    value, not one carried through the gaussian's ``sigma``); else the kernel's ``gamma``, or
    a gaussian's ``1/(2σ²)`` (:meth:`~dkha.kernels.Kernel.gaussian_sigma`), or
    ``1/n_features``."""
    k = model.kernel_
    got = kernel_spec(model.kernel) if isinstance(model.kernel, str) else None
    defaults = got[0].defaults(got[1]) if got is not None else {}
    if model.gamma is not None:
        return model.gamma
    if "gamma" in defaults and defaults["gamma"] is None:
        return 1 / int(model.n_features_in_)      # scikit-learn's, exactly
    if k.param_dict.get("gamma") is not None:
        return k.param_dict["gamma"]
    sigma = k.gaussian_sigma()
    return 1.0 / int(model.n_features_in_) if sigma is None else 1.0 / (2.0 * sigma ** 2)


def learned_preimage(model) -> None:
    """scikit-learn's learned pre-image (Bakır, Weston & Schölkopf 2004): kernel ridge
    regression, with the fit's kernel, from the training projections back to the inputs,
    ``dual_coef_ = (k(P, P) + alpha I)⁻¹ X`` (:func:`dkha.fit.ridge.learned_preimage`): a
    dense solve up to ``dkha.dense-eigh-limit`` samples, conjugate gradients on blockwise
    products ``k(P, P) V`` on the workers above (``inverse_iterations_`` products, relative
    residual ``inverse_residual_`` ≤ ``dkha.ridge-tol``)."""
    l = int(model.n_samples_)
    X = model.X_fit_ if model.X_fit_ is not None else model.store_.read_rows(np.arange(l))
    P = model.projection_.values
    ridge = fit_learned_preimage(P, X, model.kernel_, float(model.alpha), model.client,
                                 config.settings())
    model.dual_coef_ = ridge.dual_coef
    model.inverse_iterations_ = ridge.iterations
    model.inverse_residual_ = ridge.residual
    model.X_transformed_fit_ = P


def fit_seed(model) -> int:
    """The seed of this fit: scikit-learn's ``random_state`` where given, else ``seed``."""
    rs = model.random_state
    if rs is None:
        return model.seed
    if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool):
        return int(rs)
    return int(check_random_state(rs).randint(np.iinfo(np.int32).max))
