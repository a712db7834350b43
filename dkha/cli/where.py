"""Where a ``dkha`` command runs: its ``--scheduler``, ``--scheduler-file``, ``--workers`` and
``--dashboard`` options (:func:`dkha.cli.options.add_cluster_options`) as the one ``client=``
value; with ``--performance-report``, the client of the cluster the whole command runs on
(:func:`performance_reported`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dkha import config
from dkha.engine.cluster import Where, client_for
from dkha.errors import ParameterError
from dkha.progress import notice


def cluster_kwargs(args) -> dict:
    """``{"client": where}`` from ``--scheduler``, ``--scheduler-file``, ``--workers`` and
    ``--dashboard``: the one where-it-runs value every public function takes
    (:func:`dkha.engine.cluster.client_for`); the command's own client where
    :func:`performance_reported` made one."""
    started = getattr(args, "client", None)
    if started is not None:
        return {"client": started}
    dashboard = getattr(args, "dashboard", None)
    return {"client": Where(args.scheduler, args.scheduler_file, args.workers,
                            None if str(dashboard).lower() in ("none", "") else dashboard)}


@contextlib.contextmanager
def performance_reported(args) -> Iterator[None]:
    """With ``--performance-report FILE``: the command runs on one cluster (reached or started
    here, as its options say; set as ``args.client``) inside Dask's
    ``performance_report(FILE)``, written as the command ends (a stop or an error included)."""
    filename = getattr(args, "performance_report", None)
    if not filename:
        yield
        return
    try:
        import bokeh  # noqa: F401  (the report is bokeh's page)
    except ImportError:
        raise ParameterError("--performance-report needs bokeh (pip install bokeh)") from None
    from distributed import performance_report

    with client_for(cluster_kwargs(args)["client"], settings=config.settings()) as client:
        args.client = client
        try:
            with performance_report(filename=filename):
                yield
        finally:
            args.client = None
            notice(f"Dask performance report: {filename}")
