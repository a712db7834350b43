"""A gain rule is an object of its algorithm's spec (:class:`dkha.algorithms.GainRule`), and its
hyperparameters travel by the parameter table's one ``gain_params`` row: a rule with a new
hyperparameter, registered here from outside the package, reaches the command line
(``dkha fit --gain-params``), ``get_params``, the run's attrs, a loaded run and a resume with
no edit in ``dkha/``.

Oracle: the new rule's decay ``(l/(t + l))^p`` is KHA/t's at ``p = 1`` and KHA's constant
gains at ``p = 0`` (``x ** 1.0 == x`` and ``x ** 0.0 == 1.0`` exactly), so those fits give
the built-in algorithms' bits; ``p = 0.5`` lies between them.
"""

from __future__ import annotations

import json
import os
from types import MappingProxyType

import numpy as np
import pytest

import dkha
from dkha import algorithms
from dkha.algorithms import BATCH, GHA, AlgorithmSpec
from dkha.cli.main import main
from dkha.errors import ParameterError


class PowerDecay(algorithms.GainRule):
    """``η0 (l/(t + l))^power``: KHA/t's decay, raised to a hyperparameter."""

    params = MappingProxyType({"power": 1.0})

    def decay(self, t, l, params):
        return (l / (t + l)) ** params["power"]


#: KHA/t's spec with the power decay
POWER = AlgorithmSpec("kha-power", BATCH, eta0=0.5, warm_eta0=0.001, gains=PowerDecay(),
                      update=GHA)
R, PASSES, SEED = 4, 2, 3


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(algorithms, "REGISTRY", dict(algorithms.REGISTRY))
    return algorithms.register(POWER)


def fit(X, algorithm, **kw):
    return dkha.KernelHebbianPCA(R, algorithm=algorithm, sigma=4.0, passes=PASSES,
                                 init="random", seed=SEED, **kw).fit(X)


def test_a_gain_rule_takes_its_hyperparameter_from_gain_params(digits, registered):
    X = np.array(digits)[:120]
    kha_t, kha = fit(X, "kha-t").alpha_, fit(X, "kha", eta0=0.5).alpha_
    np.testing.assert_array_equal(fit(X, POWER.name).alpha_, kha_t)        # the default p = 1
    np.testing.assert_array_equal(
        fit(X, POWER.name, gain_params={"power": 0.0}).alpha_, kha)
    half = fit(X, POWER.name, gain_params={"power": 0.5})
    assert half.get_params()["gain_params"] == {"power": 0.5}
    assert half.attrs_["gain_params"] == {"power": 0.5}
    assert np.abs(half.alpha_ - kha_t).max() > 1e-6 and np.abs(half.alpha_ - kha).max() > 1e-6
    with pytest.raises(ParameterError, match="gain_params: nu not taken by the gain rule "
                                             r"PowerDecay \(it takes: power\)"):
        fit(X, POWER.name, gain_params={"nu": 1.0})
    with pytest.raises(ParameterError, match="it takes: none"):
        fit(X, "kha-t", gain_params={"power": 1.0})


def test_gain_params_reach_the_command_line_the_run_and_a_resume(digits, registered, tmp_path,
                                                                monkeypatch):
    """``dkha fit --gain-params power=0.5`` saves the hyperparameter in the run's attrs, a loaded
    run's ``get_params`` has it, a fit stopped after its first checkpoint resumes bare (the
    checkpoint repeats it) to the bits of the uninterrupted fit, and a resume asking another
    value is refused."""
    from dkha.data.checkpoint import Checkpointer

    X = np.array(digits)[:120]
    data = str(tmp_path / "data.npy")
    np.save(data, X)
    store = str(tmp_path / "data.zarr")
    assert main(["ingest", "array", data, "-o", store]) == 0
    fit_args = ["fit", store, "--algorithm", POWER.name, "--components", str(R), "--sigma", "4",
                "--init", "random", "--seed", str(SEED), "--passes", str(PASSES)]
    full, run = str(tmp_path / "full"), str(tmp_path / "run")
    assert main([*fit_args, "--gain-params", "power=0.5", "-o", full]) == 0
    with open(os.path.join(full, "components.zarr", "zarr.json")) as f:
        # (a dict attr is saved as JSON text, named in json_attrs: netCDF takes no dict)
        assert json.loads(json.load(f)["attributes"]["gain_params"]) == {"power": 0.5}
    assert dkha.load(full).get_params()["gain_params"] == {"power": 0.5}
    np.testing.assert_array_equal(dkha.load(full).alpha_,
                                  fit(X, POWER.name, gain_params={"power": 0.5}).alpha_)

    class Killed(Exception):
        pass

    save = Checkpointer.save

    def save_then_die(self, step, arrays, meta):
        save(self, step, arrays, meta)
        if step:
            raise Killed

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with pytest.raises(Killed):
        main([*fit_args, "--gain-params", "power=0.5", "-o", run, "--checkpoint-steps", "60"])
    monkeypatch.setattr(Checkpointer, "save", save)
    assert main([*fit_args, "--gain-params", "power=0.25", "-o", run, "--resume"]) != 0
    assert main(["fit", store, "-o", run, "--resume"]) == 0
    np.testing.assert_array_equal(dkha.load(run).alpha_, dkha.load(full).alpha_)
