"""Rows held in this process, as the tasks of a cluster whose workers are this process take them
(a model fitted on an in-memory array: :attr:`dkha.data.store.DataStore.rows`).

distributed pickles every task it is given, also for an in-process cluster: rows passed as a
plain array made each task's graph as large as the data (Dask's "Sending large graph of size
18.46 MiB" for ``KernelHebbianPCA().fit(X)`` on 20 000 × 121, once per task) and gave each task
a copy of them. A :class:`HeldRows` is pickled as a key of this process's registry instead; the
task gets the same array back, with no copy.
"""

from __future__ import annotations

import weakref

import numpy as np

#: the held rows of this process by key (their id), while something references them
_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class HeldRows(np.ndarray):
    """A view of rows held in this process (:func:`held`) that pickles as its key; an array
    computed from it (not registered) pickles as its values, as a plain array does."""

    def __reduce_ex__(self, protocol):
        if _HELD.get(id(self)) is self:
            return _held, (id(self),)
        return np.asarray(self).__reduce_ex__(protocol)

    def __reduce__(self):
        return self.__reduce_ex__(2)


def held(rows: np.ndarray) -> HeldRows:
    """``rows`` as :class:`HeldRows`, registered while the view lives (the caller keeps it)."""
    view = rows.view(HeldRows)
    _HELD[id(view)] = view
    return view


def _held(key: int) -> HeldRows:
    try:
        return _HELD[key]
    except KeyError:
        raise RuntimeError("rows held by another process (or gone) reached a task: held rows "
                           "are only for workers in the process that holds them") from None
