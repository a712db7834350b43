"""dkha's configuration: package defaults merged into ``dask.config`` under ``dkha.*``.

Read values at call time with ``dask.config.get("dkha.block-rows", override_with=arg)``;
never bind them in default arguments.
"""

from __future__ import annotations

import os

import dask.config
import yaml

_fn = os.path.join(os.path.dirname(__file__), "dkha.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


def get(key: str, override_with=None):
    """The configuration value ``dkha.<key>``, or ``override_with`` when that is not None."""
    return dask.config.get(f"dkha.{key}", override_with=override_with)
