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

import contextlib
import warnings

from dkha import algorithms
from dkha.data.store import DataStore, open_store
from dkha.errors import NullComponentWarning
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
    with null_components_of_runs([model]):
        return model.fit(store, run_dir=run_dir, overwrite=overwrite, resume=resume,
                         checkpoint_every=checkpoint_every or 0,
                         checkpoint_steps=checkpoint_steps or 0)


def held_components(model) -> int:
    """The components a batch model's run directory holds (null ones included): those asked,
    at most ``l − 1`` (the estimator pads its own view to scikit-learn's ``min(r, l)``)."""
    return int(model.attrs_.get("n_components", model.alpha_.shape[0]))


@contextlib.contextmanager
def null_components_of_runs(models: list):
    """Fits into run directories (``dkha fit``, pipelines) say the null components of the runs
    they saved: the estimator's warning speaks of its own view (scikit-learn's width,
    ``remove_zero_eig``, neither of them a command's); this one, a
    :class:`~dkha.errors.NullComponentWarning` per model, counts what its run holds."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NullComponentWarning)
        yield
    for m in models:
        if getattr(m, "failure_", None) is not None or not hasattr(m, "null_components_"):
            continue        # diverged, or online (no null components)
        held, null = held_components(m), int(m.null_components_)     # null: of the run's
        if null:
            rank = held - null
            warnings.warn(f"K' has rank {rank}: {null} of the run's {held} components "
                          f"are null (eigenvalue 0, projections 0); ask for {rank} components "
                          "to fit the others alone", NullComponentWarning, stacklevel=3)
