"""cluster/: the configuration files parse and are accepted by the libraries that read them."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.config
import pytest
import yaml

CLUSTER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cluster")


def test_jobqueue_profiles_render_batch_scripts():
    dask_jobqueue = pytest.importorskip("dask_jobqueue")
    with open(os.path.join(CLUSTER, "jobqueue.yaml")) as f:
        conf = yaml.safe_load(f)
    with dask.config.set(_dotted(conf)):  # on top of dask-jobqueue's own defaults
        for cls, marker in ((dask_jobqueue.SLURMCluster, "#SBATCH"),
                            (dask_jobqueue.PBSCluster, "#PBS")):
            with cls(scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"}) as cluster:
                script = cluster.job_script()
            assert marker in script
            assert "dkha-worker" in script
            assert "--nthreads 8" in script and "--local-directory $TMPDIR" in script


def _dotted(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_slurm_script_is_valid_bash():
    subprocess.run(["bash", "-n", os.path.join(CLUSTER, "slurm-fit.sh")], check=True)


def test_daskcluster_manifest_is_a_dask_operator_resource():
    with open(os.path.join(CLUSTER, "daskcluster.yaml")) as f:
        doc = yaml.safe_load(f)
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskCluster"
    worker = doc["spec"]["worker"]["spec"]["containers"][0]
    scheduler = doc["spec"]["scheduler"]["spec"]["containers"][0]
    assert worker["args"][:2] == ["dask", "worker"] and scheduler["args"] == ["dask", "scheduler"]
    assert {p["containerPort"] for p in scheduler["ports"]} == {8786, 8787}
    assert doc["spec"]["scheduler"]["service"]["ports"][0]["port"] == 8786


def test_jobqueue_script_without_dask_jobqueue_names_the_extra(tmp_path):
    """Where dask-jobqueue is not installed, dkha-jobqueue.py says which extra brings it (one
    line, exit status 1), not a traceback."""
    block = ("import runpy, sys; sys.modules['dask_jobqueue'] = None; "
             "sys.argv = ['dkha-jobqueue.py', '--scheduler-file', 's.json']; "
             f"runpy.run_path({os.path.join(CLUSTER, 'dkha-jobqueue.py')!r}, run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "pip install 'dkha[cluster]'" in p.stderr


STUBS = {   # the commands slurm-fit.sh runs, recording what they were asked
    "python": '#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = --scheduler-file ] && touch "$2"; '
              'shift; done\nexec sleep 60\n',
    "dkha": '#!/bin/bash\ntrap \'echo TERM >> "$LOG/dkha"; exit 75\' TERM\n'
            'echo "$@" >> "$LOG/dkha"\n[ "$FIT_RC" = wait ] || exit "$FIT_RC"\n'
            'sleep 60 & wait $!\n',
    "sbatch": '#!/bin/bash\necho "DKHA_RESUBMITS=$DKHA_RESUBMITS $*" >> "$LOG/sbatch"\n',
}


def _slurm_job(tmp_path, rc: str, **env):
    """``slurm-fit.sh STORE RUN --components 20`` with stub ``python``, ``dkha`` and ``sbatch``
    (``rc``: the fit's exit code, or ``wait`` until SIGTERM); its process."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    (tmp_path / "log").mkdir(exist_ok=True)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    environ = dict(os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}",
                   LOG=str(tmp_path / "log"), FIT_RC=rc, **env)
    return subprocess.Popen(["bash", os.path.join(CLUSTER, "slurm-fit.sh"), "STORE", str(run),
                             "--components", "20"], env=environ, stderr=subprocess.PIPE,
                            text=True)


def test_slurm_script_resumes_with_the_runs_settings_and_resubmits_a_capped_number_of_times(
        tmp_path):
    """On exit 75 the job resubmits itself, counting (DKHA_RESUBMITS), at most
    DKHA_MAX_RESUBMITS times; it resumes a run with checkpoints by a bare ``--resume`` and
    never asks for checkpoints itself (which made the default fit KHA-SMD)."""
    import signal
    import time

    log = tmp_path / "log"
    job = _slurm_job(tmp_path, "wait", DKHA_RESUBMITS="2")
    while not (log / "dkha").exists():     # the fit is running: SLURM's signal before the limit
        assert job.poll() is None, job.stderr.read()
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 75
    fit = (log / "dkha").read_text().splitlines()
    assert fit[0] == f"fit STORE -o {tmp_path / 'run'} --scheduler-file " \
                     f"{tmp_path / 'run'}.scheduler.json --resume --components 20"
    assert fit[1] == "TERM"     # passed on to the fit, which checkpoints and exits 75
    assert (log / "sbatch").read_text().split()[:2] == ["DKHA_RESUBMITS=3", "--export=ALL"]
    (log / "sbatch").unlink()
    job = _slurm_job(tmp_path, "75", DKHA_RESUBMITS="4", DKHA_MAX_RESUBMITS="4")
    assert job.wait(timeout=60) == 75
    assert not (log / "sbatch").exists(), "resubmitted beyond DKHA_MAX_RESUBMITS"
    assert "not resubmitted again" in job.stderr.read()
    job = _slurm_job(tmp_path, "0")
    assert job.wait(timeout=60) == 0 and not (log / "sbatch").exists()
