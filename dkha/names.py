"""The names of dkha's algorithms and the defaults the command line shows: plain constants,
importable in milliseconds (no numpy, numba, dask), so that ``dkha --help`` and the parameter
table (:mod:`dkha.estimators.params`) do not load the numerical modules that define the
algorithms (:mod:`dkha.solvers.batch`, :mod:`dkha.solvers.online`, which take these from here).
The kernels' names are their registry's (:mod:`dkha.kernels.spec`): ``--kernel`` takes any name,
checked when the kernel is made."""

import functools
import os

from dkha import algorithms

#: the batch algorithms of the KHA family (:mod:`dkha.solvers.batch`) and the online algorithms
#: (:mod:`dkha.solvers.online`), from the one registry (:mod:`dkha.algorithms`)
BATCH_ALGORITHMS = algorithms.names(algorithms.BATCH)
ONLINE_ALGORITHMS = algorithms.names(algorithms.ONLINE)

#: SMD's meta-gain and decay (:mod:`dkha.solvers.batch`); the meta-gain from the random start
DEFAULT_MU = 0.3
COLD_MU = 0.1
DEFAULT_XI = 0.99
#: the online algorithms' initial step, its decay per step and the dictionary cap
#: (:mod:`dkha.solvers.online`)
ONLINE_DEFAULT_ETA0 = 0.05
ONLINE_DEFAULT_GAMMA = 0.999995
ONLINE_DEFAULT_MAX_MEMBERS = 2000

#: the kernel tiles' precisions (:mod:`dkha.tiles`)
PRECISIONS = ("float64", "float32")
#: where the workers compute kernel tiles (:mod:`dkha.tiles`)
DEVICES = ("cpu", "cuda", "auto")


@functools.cache
def package_config() -> dict:
    """dkha's package configuration defaults, ``{"dkha": {...}}`` from ``dkha.yaml`` (registered
    with ``dask.config`` by :mod:`dkha.config`; read here without loading dask)."""
    import yaml

    with open(os.path.join(os.path.dirname(__file__), "dkha.yaml")) as f:
        return yaml.safe_load(f)


def config_default(key: str):
    """The package default of the setting ``dkha.<key>`` (what the command line's help shows;
    the value in effect is ``dkha.config.settings()``'s)."""
    return package_config()["dkha"][key]
