"""Everything on disk: data stores, images, the centering cache, run results, checkpoints."""

from dkha.lazy import submodules as _submodules

__getattr__, __dir__ = _submodules(__name__, __path__)
