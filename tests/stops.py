"""A pass stopped mid-way must let go of its tasks quietly: shared by the row engine's tile
passes (tests/test_rows.py) and the GPU workers' band passes (tests/test_band_passes.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest


def stop_mid_pass_quietly(engine, V: np.ndarray, monkeypatch, stop_ats) -> None:
    """``engine.matmat(V)`` stopped at each of ``stop_ats`` waits of its pass (the stop request
    set while it waits on a task): each stop raises :class:`~dkha.errors.Interrupted`, nothing
    is logged at ERROR by distributed or asyncio (a cancelled chain of tasks trips the
    scheduler's ``assert ts.who_wants``), and the pass after the stops gives the bits of the
    one before them."""
    from dkha.engine import passes
    from dkha.engine.stop import STOP
    from dkha.errors import Interrupted

    errors: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            errors.append(record.getMessage())

    handler = Keep(level=logging.ERROR)
    loggers = [logging.getLogger(n) for n in ("distributed", "asyncio")]
    for lg in loggers:
        lg.addHandler(handler)
    want = engine.matmat(V)
    settle = passes.ClusterPasses.settle
    waited = [0, 0]

    def stop_after(self, future, what):
        waited[0] += 1
        if waited[0] == waited[1]:
            STOP.set()
        return settle(self, future, what)

    monkeypatch.setattr(passes.ClusterPasses, "settle", stop_after)
    try:
        for stop_at in stop_ats:
            waited[:] = [0, stop_at]
            with pytest.raises(Interrupted):
                engine.matmat(V)
            STOP.clear()
        monkeypatch.setattr(passes.ClusterPasses, "settle", settle)
        assert np.array_equal(engine.matmat(V), want)       # the cluster still works
    finally:
        STOP.clear()
        for lg in loggers:
            lg.removeHandler(handler)
    assert not errors, errors[:3]
