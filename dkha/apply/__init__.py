"""Applications of kernel principal components: denoising through pre-images, and spectral
clustering.

* :mod:`dkha.apply.preimage` — pre-images of projections (the fixed-point iteration of Mika et
  al. for the gaussian kernel), vectorised over samples, blockwise over the training set.
* :mod:`dkha.apply.denoise` — denoise an image with a run fitted on its patches: cut patches on
  the store's grid, project, pre-image, average the overlapping patches; SNR.
* :mod:`dkha.apply.clustering` — spectral clustering (Ng, Jordan & Weiss) on the projections of
  the training samples; the variation of information.
"""

from dkha.apply.clustering import (cluster_run, entropy, spectral_clustering,
                                   variation_of_information)
from dkha.apply.denoise import denoise_image, snr
from dkha.apply.preimage import expansion, fixed_point, preimages

__all__ = ["cluster_run", "denoise_image", "entropy", "expansion", "fixed_point", "preimages",
           "snr", "spectral_clustering", "variation_of_information"]
