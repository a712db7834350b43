"""Every third-party module that dkha, its tests, examples or benchmarks import is declared in
pyproject.toml — a fresh virtual environment (what `.ci/run` makes) has nothing else."""
import ast
import importlib.metadata as md
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# modules of optional extras that need not be installed where the tests run: module -> extra
OPTIONAL = {"cupy": "gpu", "cupyx": "gpu", "bm3d": "bench", "dask_jobqueue": "cluster",
            "triton": "triton", "torch": "triton"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0])


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(r) for r in project.get("dependencies", [])}
    extras = {k: {_requirement_name(r) for r in v}
              for k, v in project.get("optional-dependencies", {}).items()}
    return core | {_norm(project["name"])}, extras


def _imported_modules() -> dict[str, str]:
    """Top-level module name -> one file importing it (absolute imports only)."""
    found: dict[str, str] = {}
    local = {p.stem for d in ("tests", "benchmarks", "examples") for p in (ROOT / d).glob("*.py")}
    local |= {p.name for p in ROOT.iterdir() if p.is_dir()}
    for folder in ("dkha", "tests", "benchmarks", "examples", "cluster"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _undeclared(declared: set[str], extras: dict[str, set[str]]) -> list[str]:
    dists = md.packages_distributions()
    missing = []
    for module, where in sorted(_imported_modules().items()):
        if module in OPTIONAL:
            if OPTIONAL[module] not in extras:
                missing.append(f"{module} (imported by {where}; extra {OPTIONAL[module]} absent)")
            continue
        provided_by = {_norm(d) for d in dists.get(module, [])}
        if not provided_by:
            missing.append(f"{module} (imported by {where}; not installed)")
        elif not provided_by & declared:
            missing.append(f"{module} (imported by {where}; from {sorted(provided_by)})")
    return missing


def test_every_imported_module_is_declared():
    core, extras = _declared()
    missing = _undeclared(core.union(*extras.values()), extras)
    assert not missing, "undeclared in pyproject.toml: " + "; ".join(missing)


def test_the_check_sees_an_undeclared_module():
    """Not vacuous: with matplotlib and psutil taken off the list, both are reported."""
    core, extras = _declared()
    declared = core.union(*extras.values()) - {"matplotlib", "psutil"}
    missing = " ".join(_undeclared(declared, extras))
    assert "matplotlib (imported by dkha/" in missing and "psutil (imported by dkha/" in missing


_CACHE_PROBE = """
import numpy as np
from dkha.solvers import warmup
from dkha.solvers.updates import smd
from dkha import tiles
warmup.tiny_fit("kha-smd")
tiles.compile_sweeps()
print(smd.__file__)
for f in (smd.smd_block_logged, tiles.fused_sweep):
    print(f.__name__, sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values()))
"""


def test_an_installed_wheel_ships_the_compiled_loops(tmp_path):
    """``pip install .`` (what CI and the README run) compiles the numba loops while it builds the
    wheel (build_backend/dkha_build.py): the wheel lists the cache files, and the installed dkha
    loads its loops from them (numba's cache hits, no miss, i.e. nothing compiled)."""
    installed = list(md.distributions(name="dkha", path=[sysconfig.get_paths()["purelib"]]))
    if not installed:
        pytest.skip("dkha is not installed in this environment")
    dist = installed[0]     # the installed one, not the checkout's dkha.egg-info
    direct = dist.read_text("direct_url.json") or ""
    if '"editable": true' in direct.replace(" ", "").replace('":true', '": true'):
        pytest.skip("an editable install compiles on first use, into the source tree's cache")
    shipped = [str(f) for f in dist.files or []]
    for name in ("updates/__pycache__/smd.smd_block_logged",
                 "updates/__pycache__/gha.kha_block_logged", "tiles/__pycache__/cpu.fused_sweep"):
        assert any(re.search(rf"{re.escape(name)}-\d+\.py\d+\.nbi$", f)
                   for f in shipped), f"{name} is not in the wheel's numba cache"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NUMBA_") and k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _CACHE_PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert not lines[0].startswith(str(ROOT)), "the probe imported the checkout, not the install"
    for line in lines[1:3]:
        name, hits, misses = line.split()
        assert int(hits) >= 1 and int(misses) == 0, line
