"""Applications of kernel principal components: denoising through pre-images, and spectral
clustering.

* :mod:`dkha.apply.preimage` — pre-images of projections: the fixed-point iteration of Mika et
  al., Honeine's conformal map and gradient iteration (with non-negativity), for batch and
  dictionary runs; vectorised over samples, blockwise over the training set.
* :mod:`dkha.apply.denoise` — denoise an image with a run fitted on its patches: cut patches on
  the store's grid, project, pre-image, average the overlapping patches; SNR.
* :mod:`dkha.apply.choose` — denoise an image with no run: kernel PCA of its own patches, the
  width, rank, pre-image and aggregation chosen by a risk estimate on the noisy image
  (:mod:`dkha.apply.risk`: the noise level, SURE, the held-out-pixel loss;
  :mod:`dkha.apply.noise`: the noise model, the Anscombe transform); :func:`fit_denoise`.
* :mod:`dkha.apply.clustering` — spectral clustering (Ng, Jordan & Weiss) on the projections of
  the training samples; the variation of information.
"""

import importlib

from dkha.lazy import submodules as _submodules

#: the names this package exports, each loaded from its module on first use (PEP 562): importing
#: one application (``dkha.apply.pictures`` for a fit's component pictures) does not import the
#: others (the denoiser's choice pulls in ``scipy.stats``, seconds at every command's start)
_EXPORTS = {
    "fit_denoise": "choose", "noise_level": "risk", "snr": "denoise", "denoise_image": "denoise",
    **dict.fromkeys(("cluster_run", "entropy", "spectral_clustering",
                     "variation_of_information"), "clustering"),
    **dict.fromkeys(("METHODS", "RunPreimages", "conformal", "expansion", "fixed_point",
                     "gradient", "preimages"), "preimage"),
}
__all__ = ["METHODS", "RunPreimages", "cluster_run", "conformal", "denoise_image", "entropy",
           "expansion", "fit_denoise", "fixed_point", "gradient", "noise_level", "preimages",
           "snr", "spectral_clustering", "variation_of_information"]
_module, __dir__ = _submodules(__name__, __path__)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    return _module(name)
