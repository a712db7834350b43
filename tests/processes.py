"""Helpers for tests that start real processes: ``dkha`` commands, ``dask scheduler``/``worker``."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env(**extra: str) -> dict:
    """The environment for child processes: this checkout importable, no inherited scheduler."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    env.update(extra)
    return env


#: a progress line of the ``dkha`` command outside a terminal: ``HH:MM:SS (+S.S s) dkha CMD: …``
PROGRESS_LINE = re.compile(r"^\d\d:\d\d:\d\d \(\+(\d+\.\d) s\) (dkha [\w-]+: .*)$")


def progress_lines(stderr: str) -> list[tuple[float, str]]:
    """``(seconds since the command started, "dkha CMD: message")`` of its progress lines."""
    return [(float(m.group(1)), m.group(2)) for m in map(PROGRESS_LINE.match, stderr.splitlines())
            if m]


def other_lines(stderr: str) -> list[str]:
    """The non-empty lines of ``stderr`` that are not progress lines (errors, warnings)."""
    return [ln for ln in stderr.strip().splitlines() if ln.strip() and not PROGRESS_LINE.match(ln)]


def dkha_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dkha.cli", *args]


def start_dask_cluster(directory: str, n_workers: int, *, nthreads: int = 1, nanny: bool = True,
                       scheduler_args=(), worker_args=(), env=None, security=None):
    """``dask scheduler`` + ``n_workers`` ``dask worker`` processes on 127.0.0.1.

    Returns ``(address, scheduler_file, scheduler_process, worker_processes)`` once every worker
    has registered.
    """
    env = env or subprocess_env()
    sched_file = os.path.join(directory, "scheduler.json")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
         "0", "--no-dashboard", "--scheduler-file", sched_file, *scheduler_args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.time() + 60
        while not os.path.exists(sched_file):
            if time.time() > deadline:
                raise RuntimeError("dask scheduler did not start")
            time.sleep(0.2)
        time.sleep(0.3)
        for i in range(n_workers):
            workers.append(start_dask_worker(sched_file, f"w{i}", nthreads=nthreads, nanny=nanny,
                                             worker_args=worker_args, env=env))
        from distributed import Client

        kw = {"security": security} if security is not None else {}
        with Client(scheduler_file=sched_file, timeout="30s", **kw) as c:
            c.wait_for_workers(n_workers, timeout=60)
            address = c.scheduler.address
    except BaseException:
        stop_processes([scheduler, *workers])
        raise
    return address, sched_file, scheduler, workers


def start_dask_worker(sched_file: str, name: str, *, nthreads: int = 1, nanny: bool = True,
                      worker_args=(), env=None) -> subprocess.Popen:
    """One ``dask worker`` process joining the scheduler of ``sched_file`` (not waited for)."""
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", sched_file,
         "--nthreads", str(nthreads), "--no-dashboard", "--host", "127.0.0.1", "--name", name,
         *([] if nanny else ["--no-nanny"]), *worker_args],
        env=env or subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reference_and_background_fit(store: str, directory: str, fit_args, sched_file: str):
    """Fit ``store`` on the cluster of ``sched_file`` to the end (the undisturbed reference),
    then start the same fit, checkpointing every pass, in the background.

    Returns ``(reference run directory, run directory, the background fit's process)``.
    """
    ref = os.path.join(directory, "undisturbed")
    subprocess.run(dkha_command("fit", store, "-o", ref, *fit_args, "--scheduler-file", sched_file),
                   env=subprocess_env(), check=True, timeout=600)
    run = os.path.join(directory, "disturbed")
    fit = subprocess.Popen(dkha_command("fit", store, "-o", run, *fit_args, "--scheduler-file",
                                        sched_file, "--checkpoint-every", "1"),
                           env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    return ref, run, fit


def stop_processes(procs) -> None:
    for p in reversed(list(procs)):
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


@contextlib.contextmanager
def local_cluster(n_workers: int, threads_per_worker: int, *, processes: bool = False):
    """A fresh ``LocalCluster`` (no dashboard), closed on exit."""
    import warnings

    from distributed import LocalCluster

    with warnings.catch_warnings():
        # the scheduler's HTTP server still binds a port; another cluster may hold 8787
        warnings.filterwarnings("ignore", message="Port .* is already in use")
        cluster = LocalCluster(processes=processes, n_workers=n_workers,
                               threads_per_worker=threads_per_worker, dashboard_address=None)
    try:
        yield cluster
    finally:
        cluster.close()


@contextlib.contextmanager
def local_client(n_workers: int, threads_per_worker: int, *, processes: bool = False):
    """A fresh ``distributed.Client`` on its own ``LocalCluster``, closed (with it) on exit."""
    from distributed import Client

    with local_cluster(n_workers, threads_per_worker, processes=processes) as cluster, \
            Client(cluster) as client:
        yield client

class Ran:
    """What an in-process ``dkha`` command did: ``returncode``, ``stdout``, ``stderr`` and the
    ``warnings`` and log ``records`` (WARNING and above) a separate process would have printed."""

    def __init__(self, returncode, stdout, stderr, warnings, records):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.warnings, self.records = warnings, records


#: warnings a plain interpreter does not print (its default filters)
_SILENT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def dkha_in_process(*argv: str, config: dict | None = None) -> Ran:
    """Run ``dkha ARGV`` in this process (what :func:`dkha.cli.main` does) with its output
    captured, and put back what the command sets for a process of its own: the SIGTERM handler,
    the levels of the loggers and of the root logger's handlers, the stop flag. ``config``: dask
    settings."""
    import importlib
    import io
    import logging
    import signal
    import warnings

    import dask.config

    from dkha.cli import progress_shown
    from dkha.cli.parser import build_parser
    from dkha.engine.stop import STOP

    def main(argv):
        # dkha.cli.main's body: once the submodule dkha.cli.main is imported, the package's
        # attribute ``main`` names that module, not the function
        args = build_parser().parse_args(argv)
        with progress_shown(args):
            return importlib.import_module("dkha.cli.main").run(args)

    from dkha.data import storage

    storage_options = dict(storage._STORAGE_OPTIONS)     # --storage-option sets them
    sigterm = signal.getsignal(signal.SIGTERM)
    levels = {name: logging.getLogger(name).level for name in list(logging.root.manager.loggerDict)}
    handlers = [(h, h.level) for h in logging.root.handlers]
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep = Keep(logging.WARNING)
    logging.root.addHandler(keep)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught, dask.config.set(config or {}):
            warnings.simplefilter("always")
            try:
                code = main(list(argv))
            except SystemExit as exc:       # argparse's errors
                code = exc.code
    finally:
        logging.root.removeHandler(keep)
        signal.signal(signal.SIGTERM, sigterm)
        STOP.clear()
        storage._STORAGE_OPTIONS.clear()
        storage._STORAGE_OPTIONS.update(storage_options)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for h, level in handlers:
            h.setLevel(level)
    shown = [w for w in caught if not issubclass(w.category, _SILENT)]
    return Ran(code, out.getvalue(), err.getvalue(), shown, records)
