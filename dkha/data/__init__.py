"""Everything on disk: data stores, images, the centering cache, run results, checkpoints."""
