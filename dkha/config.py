"""dkha's configuration: package defaults merged into ``dask.config`` under ``dkha.*``.

Read values at call time with ``dask.config.get("dkha.block-rows", override_with=arg)``;
never bind them in default arguments.
"""

from __future__ import annotations

import dask.config

from dkha.names import package_config

_defaults = package_config()

dask.config.update_defaults(_defaults)


def get(key: str, override_with=None):
    """The configuration value ``dkha.<key>``, or ``override_with`` when that is not None.

    The package default stands in where dask's configuration has no value: a
    ``dask.config.set({"dkha.…": …})`` entered before this module was first imported drops
    the defaults registered meanwhile when it exits."""
    default = _defaults["dkha"]
    for part in key.split("."):
        if not isinstance(default, dict) or part not in default:
            return dask.config.get(f"dkha.{key}", override_with=override_with)  # KeyError
        default = default[part]
    return dask.config.get(f"dkha.{key}", default, override_with=override_with)
