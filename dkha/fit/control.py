"""The one block driver of the coordinator's loops (batch and online): the stop event,
checkpoint cadence, progress and wall-time accounting."""

from __future__ import annotations

import threading

#: set (e.g. by the CLI's SIGTERM handler) to make a running fit checkpoint and stop
STOP = threading.Event()
