"""From command-line or pipeline values to a fitted run: the one way ``dkha fit``, ``dkha tune``
and pipelines choose and fit an estimator.

Both speak the same units, whatever the algorithm's family (:mod:`dkha.algorithms`):
``passes`` and ``checkpoint_every`` count passes through the data, ``steps`` and
``checkpoint_steps`` single-sample steps; ``evaluate_every`` counts passes on the command line
(pipelines: the estimator's own unit, steps for the online algorithms, as pipeline files have
always said). :func:`estimator_for` converts them to the online estimator's steps;
:func:`fit_run` passes the checkpoint interval in the unit each estimator's ``fit`` takes.
"""

from __future__ import annotations

from dkha import algorithms
from dkha.data.store import DataStore, open_store
from dkha.estimators.batch import KernelHebbianPCA
from dkha.estimators.online import OnlineKernelPCA
from dkha.estimators.params import BATCH, ONLINE, estimator_kwargs

#: the estimator of each family, and its rows of the parameter table
ESTIMATORS = {algorithms.DEFAULT: (KernelHebbianPCA, BATCH),
              algorithms.BATCH: (KernelHebbianPCA, BATCH),
              algorithms.EXACT: (KernelHebbianPCA, BATCH),
              algorithms.ONLINE: (OnlineKernelPCA, ONLINE)}


def _n_samples(store) -> int:
    return store.n_samples if isinstance(store, DataStore) else open_store(store).n_samples


def in_steps(values: dict, store, *, evaluate_in_passes: bool = True) -> dict:
    """``values`` with ``passes`` and (``evaluate_in_passes``) ``evaluate_every`` (passes; 0 or
    less: only at the end) counted in steps of ``store``'s samples, as the online estimator
    takes them."""
    values = dict(values)
    passes = values.pop("passes", None)
    every = values.pop("evaluate_every", None) if evaluate_in_passes else None
    if passes is None and every is None:
        return values
    n = _n_samples(store)
    if values.get("steps") is None and passes is not None:
        values["steps"] = passes * n
    if every is not None:
        values["evaluate_every"] = every * n if every > 0 else None
    return values


def estimator_for(algorithm: str, values: dict, *, store=None, where: str = "--",
                  **fixed) -> KernelHebbianPCA | OnlineKernelPCA:
    """The estimator of ``algorithm`` from ``values`` (the table's keys: command-line ``args``
    attributes or pipeline keys; ``None`` leaves a default), in the units of the module
    docstring (``store``: the data, for the passes of an online algorithm). ``fixed``: further
    keywords as they are (``verbose``, ``client``, ...). A value only the other family takes is
    refused in one line (``where`` prefixes its key: ``"--"`` options, ``""`` pipeline keys)."""
    family = algorithms.family(algorithm, option=f"{where}algorithm")
    cls, model = ESTIMATORS[family]
    values = dict(values, algorithm=algorithm)
    if family == algorithms.ONLINE:
        values = in_steps(values, store, evaluate_in_passes=where == "--")
    kwargs = estimator_kwargs(values, model, algorithm, where=where)
    kwargs.update(fixed)
    return cls(**kwargs)


def fit_run(model, store, run_dir: str, *, overwrite: bool = False, resume: bool = False,
            checkpoint_every: int | None = None, checkpoint_steps: int | None = None,
            ac_reference=None):
    """Fit ``model`` on ``store`` into ``run_dir``: checkpoints every ``checkpoint_every``
    passes or at the first block boundary after every ``checkpoint_steps`` steps, ``resume``
    from the newest; ``ac_reference`` for online algorithms (see ``OnlineKernelPCA.fit``)."""
    if isinstance(model, OnlineKernelPCA):
        every = (checkpoint_every * _n_samples(store) if checkpoint_every
                 else checkpoint_steps or 0)
        return model.fit(store, run_dir=run_dir, overwrite=overwrite, resume=resume,
                         checkpoint_every=every, ac_reference=ac_reference)
    return model.fit(store, run_dir=run_dir, overwrite=overwrite, resume=resume,
                     checkpoint_every=checkpoint_every or 0,
                     checkpoint_steps=checkpoint_steps or 0)
