"""A saved run (batch or dictionary), opened once: transform, explained variance."""
