"""Start a dask-jobqueue cluster for dkha and write its scheduler file; keep it up until killed.

    python cluster/dkha-jobqueue.py --system slurm --jobs 8 --scheduler-file sched.json

Needs dask-jobqueue: ``pip install 'dkha[cluster]'``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=("slurm", "pbs"), default="slurm")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--scheduler-file", required=True)
    args = ap.parse_args()
    try:
        import dask_jobqueue
    except ImportError:
        sys.exit("dkha-jobqueue.py: needs dask-jobqueue, which dkha installs only with its "
                 "'cluster' extra: pip install 'dkha[cluster]' (or pip install dask-jobqueue)")
    from distributed import Client

    cls = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster}[args.system]
    cluster = cls(scheduler_options={"host": "0.0.0.0"})
    cluster.scale(jobs=args.jobs)
    with Client(cluster) as client:
        client.write_scheduler_file(args.scheduler_file)
        signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(0)))
        while True:
            time.sleep(60)


if __name__ == "__main__":
    main()
