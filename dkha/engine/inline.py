"""Tasks run in this thread, at once: the client of small fits that name no cluster.

A fit of a few hundred samples spends most of its time on the round trips of a Dask cluster,
not on the kernels: ~100 tasks a fit, each submitted, scheduled, run on a worker thread and
waited for (measured: a ``krylov`` fit of 300 × 5 samples, 0.55 s of which the kernels and
eigensolver took 0.05 s). Scikit-learn's users fit such data many times over (grid searches,
pipelines, cross-validation), and a cluster has nothing to share out there.

:class:`InlineClient` has the part of ``distributed.Client``'s interface that the row engine
and its passes use (:mod:`dkha.engine.passes`, :mod:`dkha.engine.rows`, the MK row, the row
cache, the replicas): ``submit`` runs the task at once in the calling thread and returns a
finished :class:`InlineFuture` (a task's error is kept, and raised where the cluster's would
be: by ``gather`` or ``result``). So the fit runs the same engine code, the same tasks with the
same arguments in the same order of additions, and gives the same bits as on the in-process
cluster: it describes itself as that cluster does (one worker of ``os.cpu_count()`` threads
with the machine's memory), so that the tiles, blocks and memory plan it gets are the same.

:func:`dkha.engine.cluster.client_for` chooses it (``dkha.inline-samples``).
"""

from __future__ import annotations

import os

from distributed.system import MEMORY_LIMIT

#: the one worker an :class:`InlineClient` reports (this process)
WORKER = "inline://this-process"


class InlineFuture:
    """A finished task: its result, or the error it raised (raised again on ``result``)."""

    __slots__ = ("_error", "_value", "key")

    def __init__(self, value=None, error: BaseException | None = None, key=None):
        self._value = value
        self._error = error
        self.key = key

    @property
    def status(self) -> str:
        return "error" if self._error is not None else "finished"

    def done(self) -> bool:
        return True

    def release(self) -> None:
        """Nothing held elsewhere."""

    def result(self, timeout=None):
        if self._error is not None:
            raise self._error
        return self._value


def _resolved(arg):
    """A task's argument with the futures in it (also inside lists, tuples and dicts, as
    ``distributed`` looks for them) replaced by their results."""
    if isinstance(arg, InlineFuture):
        return arg.result()
    if type(arg) in (list, tuple):
        return type(arg)(_resolved(a) for a in arg)
    if type(arg) is dict:
        return {k: _resolved(v) for k, v in arg.items()}
    return arg


class InlineClient:
    """The tasks of a fit run in the calling thread as they are submitted (module docstring)."""

    status = "running"

    def __init__(self, threads: int | None = None):
        self.threads = max(1, int(threads or os.cpu_count() or 1))

    def __repr__(self) -> str:
        return f"<InlineClient: this thread, as {self.threads} threads>"

    # -- tasks --
    def submit(self, func, *args, key=None, workers=None, resources=None, retries=None,
               priority=0, fifo_timeout="100 ms", allow_other_workers=False, actor=False,
               actors=False, pure=True, **kwargs) -> InlineFuture:
        """``func(*args, **kwargs)`` now, in this thread (``distributed.Client.submit``'s own
        keywords — placement, priority, retries — have nothing to choose here)."""
        try:
            value = func(*_resolved(args), **_resolved(kwargs))
        except Exception as exc:  # noqa: BLE001 - kept, raised by gather/result as Dask does
            return InlineFuture(error=exc, key=key)
        return InlineFuture(value, key=key)

    def gather(self, futures):
        if isinstance(futures, InlineFuture):
            return futures.result()
        return _resolved(futures)

    def scatter(self, data, hash=True, broadcast=False, workers=None):
        """``data`` as futures, as ``distributed.Client.scatter`` returns them: a list (tuple,
        dict) of futures for a list (tuple, dict), one future otherwise."""
        if isinstance(data, (list, tuple)):
            return type(data)(InlineFuture(d) for d in data)
        if isinstance(data, dict):
            return {k: InlineFuture(v) for k, v in data.items()}
        return InlineFuture(data)

    def compute(self, collections, **kwargs):
        """Dask collections computed at once in this thread (``scheduler="sync"``)."""
        import dask

        single = not isinstance(collections, (list, tuple))
        values = dask.compute(*([collections] if single else collections), scheduler="sync")
        futures = [InlineFuture(v) for v in values]
        return futures[0] if single else futures

    def run(self, func, *args, on_error="raise", **kwargs) -> dict:
        """``func`` on the one worker, this process: ``{worker: result}``."""
        try:
            return {WORKER: func(*args, **kwargs)}
        except Exception:
            if on_error == "ignore":
                return {}
            raise

    def replicate(self, futures, **kwargs) -> None:
        """One worker: nothing to copy."""

    def register_plugin(self, plugin, name=None, **kwargs) -> None:
        """A worker plugin set up once, here (the one worker is this process)."""
        setup = getattr(plugin, "setup", None)
        if setup is not None:
            setup()

    # -- the cluster it stands for --
    def nthreads(self) -> dict:
        return {WORKER: self.threads}

    def scheduler_info(self, **kwargs) -> dict:
        """One worker of :attr:`threads` threads with the machine's memory: what the in-process
        cluster reports (``LocalCluster(n_workers=1, processes=False)``)."""
        return {"type": "Inline", "id": "inline", "address": WORKER,
                "workers": {WORKER: {"nthreads": self.threads, "memory_limit": MEMORY_LIMIT,
                                     "name": WORKER}}}

    def close(self) -> None:
        """Nothing to close."""
