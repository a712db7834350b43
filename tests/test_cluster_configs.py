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
                       text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "pip install 'dkha[cluster]'" in p.stderr
