"""Dask: where work runs, worker-side tasks, the row engine, the worker replicas."""
