"""The coordinator: one block driver for the batch and online loops, Krylov, init, evaluation."""
