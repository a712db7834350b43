"""Where a ``dkha`` command runs: its ``--scheduler``, ``--scheduler-file`` and ``--workers``
options (:func:`dkha.cli.options.add_cluster_options`) as the one ``client=`` value."""

from __future__ import annotations

from dkha.engine.cluster import Where


def cluster_kwargs(args) -> dict:
    """``{"client": where}`` from ``--scheduler``, ``--scheduler-file`` and ``--workers``: the one
    where-it-runs value every public function takes (:func:`dkha.engine.cluster.client_for`)."""
    return {"client": Where(args.scheduler, args.scheduler_file, args.workers)}
