"""dkha's configuration: package defaults merged into ``dask.config`` under ``dkha.*``.

Read once, at the edge (an estimator's ``fit``, a command, a public function of ``runs/`` or
``apply/``): :func:`settings` returns every ``dkha.*`` value in one frozen :class:`Settings`,
which travels down with the request; ``fit/``, ``engine/``, ``solvers/`` and ``kernels/`` read
that, never the configuration (``tests/test_architecture.py``).
"""

from __future__ import annotations

import dataclasses

import dask.config

from dkha.names import package_config

_defaults = package_config()

dask.config.update_defaults(_defaults)

#: every ``dkha.*`` setting as one frozen value, a field per key of ``dkha.yaml`` (``-`` → ``_``)
Settings = dataclasses.make_dataclass(
    "Settings", [(k.replace("-", "_"), object, dataclasses.field(default=v))
                 for k, v in _defaults["dkha"].items()], frozen=True)
Settings.__module__ = __name__
Settings.__doc__ = ("Every ``dkha.*`` setting of one call, as :func:`settings` read them (the "
                    "package defaults where built bare).")


def settings(**overrides) -> Settings:
    """Every ``dkha.*`` value in effect now, each of ``overrides`` that is not None in its
    place (``block_rows=64``: an argument given beats the configuration). The package default
    stands in where dask's configuration has no value: a ``dask.config.set({"dkha.…": …})``
    entered before this module was first imported drops the defaults registered meanwhile
    when it exits."""
    values = {f.name: dask.config.get(f"dkha.{f.name.replace('_', '-')}", f.default)
              for f in dataclasses.fields(Settings)}
    unknown = set(overrides) - set(values)
    if unknown:
        raise TypeError(f"no dkha setting {', '.join(sorted(unknown))}")
    values.update((k, v) for k, v in overrides.items() if v is not None)
    return Settings(**values)
