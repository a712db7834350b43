"""dkha's build backend: setuptools', plus numba's cache compiled into the wheel.

``pip install .`` builds a wheel on the machine it installs on. Before setuptools packs it, this
backend compiles the coordinator's numba loops (every batch algorithm, both precisions) and the
kernel tiles' sweep in a child process (``dkha.solvers.warmup.compile_all``,
``dkha.tiles.compile_sweeps``): numba writes them to ``__pycache__`` beside the sources, and
the package data (``pyproject.toml``) puts those files in the wheel. The first fit after the
install loads them (numba checks the source's content hash, its own version and the CPU) instead
of compiling for 10–20 s. Where the compile cannot run (no numba in the build environment, a
read-only tree), the wheel is built without the cache and the first fit compiles, as before.
``DKHA_BUILD_COMPILE=0`` skips it. Editable installs (``pip install -e``) compile on first use,
into the same ``__pycache__``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # every other hook is setuptools' own

ROOT = pathlib.Path(__file__).resolve().parents[1]

_COMPILE = (
    "from dkha.solvers.warmup import compile_all; from dkha.tiles import compile_sweeps; "
    "compile_all(); compile_sweeps()"
)


def _numba_caches(top: pathlib.Path) -> list[pathlib.Path]:
    return [p for pat in ("*.nbi", "*.nbc") for p in top.rglob(f"__pycache__/{pat}")]


def compile_into_tree() -> bool:
    """Compile dkha's numba functions into the source tree's ``__pycache__``; whether it worked.
    Whatever numba cache the tree held before is removed first, also from setuptools' staging
    folder (``build/lib``, which it does not clear), so the wheel ships only this build's."""
    for top in (ROOT / "dkha", ROOT / "build" / "lib" / "dkha"):
        for path in _numba_caches(top):
            path.unlink(missing_ok=True)
    if os.environ.get("DKHA_BUILD_COMPILE", "1") == "0":
        return False
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    # the checkout first; then what pip's isolated build environment put on the path (its
    # numba and numpy are found through it)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        print("dkha build: numba's cache not compiled (the first fit will compile):\n"
              + proc.stderr[-2000:], file=sys.stderr)
        return False
    print(f"dkha build: compiled {len(_numba_caches(ROOT / 'dkha'))} numba cache files into the "
          "wheel",
          file=sys.stderr)
    return True


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    compile_into_tree()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
