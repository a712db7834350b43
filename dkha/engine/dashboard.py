"""What the user sees of a cluster dkha reaches or starts: its dashboard's address, said in one
line (:func:`say_dashboard`; a port taken caught as it starts, :func:`port_moves`), and one log
line for each worker that leaves it mid-work (:func:`watching_workers`). Used by
:func:`dkha.engine.cluster.client_for`."""

from __future__ import annotations

import contextlib
import logging
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator

from dkha.engine.budget import workers_of
from dkha.progress import notice

log = logging.getLogger("dkha.engine.cluster")

#: where the dashboard of a cluster dkha starts listens (this host only); taken: another port
DASHBOARD = "127.0.0.1:8787"


@contextlib.contextmanager
def port_moves(dashboard: str | None) -> Iterator[list]:
    """While a cluster starts: distributed's warning that the dashboard's port is taken (it then
    listens on another) caught, the port asked for kept in the list yielded (for
    :func:`say_dashboard`), and the ResourceWarning of the socket distributed leaves unclosed
    probing it dropped."""
    moved: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield moved
    for w in caught:
        if "is already in use" in str(w.message):
            moved.append(str(dashboard).rpartition(":")[2])
        elif issubclass(w.category, ResourceWarning) and "distributed" in w.filename:
            continue    # the socket distributed leaks probing a taken port: not the user's
        else:       # the others as they were
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def dashboard_link(client, cluster=None) -> str | None:
    """The address of the dashboard of ``client``'s scheduler (``cluster``: the local cluster
    dkha started, whose scheduler is in this process); None where it serves none. (A scheduler
    started without its dashboard still serves HTTP, on the port it reports as its dashboard's:
    a reached scheduler's ``/status`` page is asked for, and one that answers 404 has none.)"""
    if cluster is not None:
        server = getattr(cluster.scheduler, "http_server", None)
        if server is None:
            return None
        host, port = server.address, server.port
    else:
        try:
            port = client.scheduler_info().get("services", {}).get("dashboard")
        except Exception:  # noqa: BLE001 - a scheduler that does not answer: nothing to say
            return None
        if not port:
            return None
        host = str(client.scheduler.address).split("://")[-1].rsplit(":", 1)[0]
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    link = f"http://{host}:{port}/status"
    return link if cluster is not None or _serves(link) else None


def _serves(link: str) -> bool:
    """Whether ``link`` is a page (not a 404 of a scheduler without its dashboard); a host this
    process cannot reach counts as one (its dashboard may be behind a firewall or a tunnel)."""
    try:
        with urllib.request.urlopen(link, timeout=2):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code != 404
    except (OSError, ValueError):
        return True


def say_dashboard(client, moved=(), cluster=None, asked: str | None = DASHBOARD) -> None:
    """One line: where the dashboard of ``client``'s scheduler is (``moved``: the port asked for
    was taken; ``cluster``: one dkha started, at ``asked``, ``None``: without a dashboard); that
    its pages need bokeh where it is not installed. Nothing where there is none."""
    if cluster is not None and asked is None:
        return
    link = dashboard_link(client, cluster)
    if link is None:
        return
    extra = [f"port {moved[0]} was taken"] if moved else []
    try:
        import bokeh  # noqa: F401
    except ImportError:
        extra.append("its pages need bokeh: pip install bokeh")
    notice(f"Dask dashboard: {link}" + (f" ({'; '.join(extra)})" if extra else ""))


#: seconds between two looks at the cluster's workers (:func:`watching_workers`)
WATCH_EVERY = 1.0


@contextlib.contextmanager
def watching_workers(client) -> Iterator[None]:
    """While it lasts, one log line (WARNING) for each worker that leaves ``client``'s cluster
    (a killed or crashed process): which one, and what happens next (its tasks run again on the
    workers left; the work goes on, or waits for one where none is left). A thread looks at the
    scheduler's workers every :data:`WATCH_EVERY` seconds. (Not the scheduler's ``all`` events:
    a client subscribed to them had a fit's tasks cancelled for "lost dependencies".)"""
    done = threading.Event()

    def watch(seen: dict) -> None:
        while not done.wait(WATCH_EVERY):
            try:
                now = workers_of(client)
            except Exception:  # noqa: BLE001 - a closing or lost scheduler: the work says so
                return
            for address in sorted(set(seen) - set(now)):
                if done.is_set():
                    return
                name = seen[address].get("name")
                named = f" ({name})" if name not in (None, address) else ""
                log.warning("worker %s%s lost: %s", address, named,
                            f"its tasks run again on the {len(now)} workers left; the work "
                            "goes on" if now else "no worker is left; the work waits for one")
            seen = now

    try:
        first = workers_of(client)
    except Exception:  # noqa: BLE001 - nothing to watch
        first = None
    thread = None
    if first is not None:
        thread = threading.Thread(target=watch, args=(first,), name="dkha-workers", daemon=True)
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()
