"""The one registry of fit algorithms: an :class:`AlgorithmSpec` per name, with its behaviour.

Families:

* ``batch`` — the KHA family over whole centered kernel rows, many passes
  (:mod:`dkha.solvers.batch`, driven by :func:`dkha.fit.coordinator.fit_batch`);
* ``exact`` — the exact top eigenvectors by block Krylov products (:mod:`dkha.fit.krylov`; a
  batch estimator, but it streams no kernel rows and fits one model at a time);
* ``default`` — ``auto``, the default: the exact top components by the fastest path, chosen by
  a cost model (:mod:`dkha.fit.plan`: ``K'`` held whole, or blockwise Krylov); given options of
  the KHA iterations it falls back to :data:`KHA_DEFAULT`. Neither exact nor streamable
  together: it fits one model at a time, and its path is decided at fit time;
* ``online`` — one sample at a time over a dictionary (:mod:`dkha.solvers.online`, driven by
  :func:`dkha.fit.online.fit_online`): each named algorithm runs its paper's update from the
  first sample; the online estimator's default ``auto`` (:data:`ONLINE_AUTO`, the one name
  registered for a second family: :data:`SCOPED`) is the exact kernel PCA of what was seen while
  it lies in the dictionary's span (:mod:`dkha.solvers.online_exact`), then ON-KHA's update.

A spec says what differs between the algorithms of a family, and nothing elsewhere branches on
an algorithm's name (``tests/test_architecture.py`` checks that no name is spelled outside this
module): a batch spec's gains (``eta0``, ``warm_eta0``, its :class:`GainRule`), whether it
keeps ``C = A K'`` and has SMD's meta-gain ``μ``, and the in-block ``update`` that serves it; an
online spec's ``update``. An update is named here and implemented in ``solvers/``, which maps
each name to its code (:data:`dkha.solvers.updates.TABLE`, one module per batch update;
:data:`dkha.solvers.online.UPDATES`):
this module is the bottom floor (it imports nothing of dkha but its errors), so it names the
code it needs and the floor that holds the code looks it up, and the import graph shows every
dependency.

Every list of allowed values (the estimators' parameter table, the command line's checks, the
solvers' ``ALGORITHMS``) is derived from :data:`REGISTRY`; a new algorithm is one spec here
(:func:`register` from outside the package).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dkha.errors import ParameterError

BATCH, EXACT, ONLINE, DEFAULT = "batch", "exact", "online", "default"

#: the in-block updates of the batch family (:data:`dkha.solvers.updates.TABLE`): GHA's step
#: in feature space with given gains, and Stochastic Meta-Descent's (Algorithm 1: the gains'
#: log ``ρ`` adapted with the meta-gain ``μ``, its state ``B = dA/dρ``)
GHA, SMD = "gha", "smd"
#: the online updates (:data:`dkha.solvers.online.UPDATES`): Souza Filho & Diniz's
#: orthonormalised (eqs. 45–50) and orthogonalised (eq. 52) KHA, and Honeine's online KPCA
#: (eq. 19, the KHA rule over the dictionary)
ORTHONORMALISED, ORTHOGONALISED, DICTIONARY = "orthonormalised", "orthogonalised", "dictionary"


class GainRule:
    """How a batch algorithm's gains go, an object of its spec: step ``t``'s gain of component
    ``i`` is ``η0/κ̄ · weights_i · decay(t)`` (:mod:`dkha.solvers.batch`). This one is
    constant (KHA's eq. 8); a rule overrides :meth:`weights` or :meth:`decay`, and names its
    own hyperparameters with their defaults in :attr:`params`, which the estimators'
    ``gain_params`` set (``--gain-params NAME=VALUE``; saved with the run, part of its
    identity, repeated by a resume)."""

    #: the rule's hyperparameters: ``{name: default}``
    params: Mapping[str, float] = MappingProxyType({})
    #: whether :meth:`weights` reads the eq. 13 eigenvalues ``λ`` (the state keeps ``C = A K'``)
    reads_eigenvalues = False

    def weights(self, state, params: Mapping):
        """The per-component factors of ``η0/κ̄`` (a number serves all)."""
        return 1.0

    def decay(self, t, l: int, params: Mapping):
        """The factor of step ``t`` (a number, or an array of steps) in a stream of ``l`` rows."""
        return 1.0

    def resolved(self, given: Mapping | None) -> dict:
        """The hyperparameters of ``given`` over :attr:`params`' defaults (floats); a name the
        rule does not take is refused."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise ParameterError(f"gain_params: {', '.join(unknown)} not taken by the gain rule "
                                 f"{type(self).__name__} (it takes: "
                                 f"{', '.join(self.params) or 'none'})")
        return {k: float(given.get(k, v)) for k, v in self.params.items()}


#: KHA's constant gains, the batch default
CONSTANT = GainRule()


class Decaying(GainRule):
    """``η0 l/(t + l)``: the gains decay over the steps (KHA/t)."""

    def decay(self, t, l: int, params: Mapping):
        return l / (t + l)


class Equalised(GainRule):
    """Eq. 12's per-component gains ``λ_r/λ_i`` (eigenvalues by eq. 13 from ``C``)."""

    reads_eigenvalues = True

    def weights(self, state, params: Mapping):
        lam = state.lam
        return lam.min() / lam


class EqualisedDecaying(Equalised, Decaying):
    """Eq. 12's gains, decaying as ``l/(t + l)`` (KHA/et, and SMD's base gains)."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """One fit algorithm and what sets it apart.

    Attributes
    ----------
    name : str
        What users give as ``algorithm``.
    family : {"batch", "exact", "default", "online"}
    eta0 : float or None
        Batch: the default base gain ``η0`` from the random start (units of ``κ̄``,
        :mod:`dkha.solvers.batch`).
    warm_eta0 : float or None
        Batch: the default ``η0`` from a Nyström start per unit of its eigenvalue deficit
        (:func:`dkha.solvers.batch.warm_eta0`).
    gains : GainRule
        Batch: how its gains go over the components and the steps.
    update : str or None
        The in-block update that serves it: :data:`GHA` or :data:`SMD` (batch),
        :data:`ORTHONORMALISED`, :data:`ORTHOGONALISED` or :data:`DICTIONARY` (online).
    exact_span : bool
        Online: the state is the exact kernel PCA of the samples seen while they all lie in the
        dictionary's span (:mod:`dkha.solvers.online_exact`), the ``update`` from the first
        sample outside it; off (every named online algorithm): the update from the first sample.
    """

    name: str
    family: str
    eta0: float | None = None
    warm_eta0: float | None = None
    gains: GainRule = CONSTANT
    update: str | None = None
    exact_span: bool = False

    @property
    def has_mu(self) -> bool:
        """Whether it takes SMD's meta-gain ``μ`` (and ``ξ``, ``ρ0``)."""
        return self.update == SMD

    @property
    def keeps_c(self) -> bool:
        """Whether its state keeps ``C = A K'`` (eq. 12's eigenvalues, SMD's Grams): started
        with it, and tracked evaluations read it."""
        return self.gains.reads_eigenvalues or self.has_mu

    @property
    def is_exact(self) -> bool:
        """Whether it is the exact solver (no kernel row stream, no gains)."""
        return self.family == EXACT

    @property
    def streams_together(self) -> bool:
        """Whether it can share one kernel row stream with other models (the KHA family; not
        the exact solver, which streams no rows, nor the default, whose path is decided at fit
        time)."""
        return self.family == BATCH


#: the default's name (:mod:`dkha.fit.plan`)
AUTO = "auto"
#: the exact solver's name
KRYLOV = "krylov"
#: the KHA algorithm the default falls back to given options of the KHA iterations, and the
#: one ``dkha demo`` and ``dkha tune`` fit unless told
KHA_DEFAULT = "kha-smd"
#: the online algorithm whose update the online estimator's default streams with
ONLINE_DEFAULT = "on-kha"

#: name → spec, in the order the documentation lists them. Default gains: on the paper's digits
#: (l = 1000, σ = 4, r = 16, 50 passes, seed 0) these give the paper's ordering SMD 2.4e-4 <
#: KHA/et 3.3e-4 < KHA/t 4.5e-3 < KHA 5.3e-2 (``benchmarks/digits_kpca.py --defaults``); KHA/t at
#: 0.2 ended at 6.3e-2, worse than constant-gain KHA, and SMD at μ = 0.3 at 4.1e-4, above KHA/et.
#: Warm gains: :func:`dkha.solvers.batch.warm_eta0`.
REGISTRY: dict[str, AlgorithmSpec] = {s.name: s for s in (
    AlgorithmSpec(AUTO, DEFAULT),
    AlgorithmSpec("kha", BATCH, eta0=0.05, warm_eta0=0.001, update=GHA),
    AlgorithmSpec("kha-t", BATCH, eta0=0.5, warm_eta0=0.001, gains=Decaying(), update=GHA),
    AlgorithmSpec("kha-et", BATCH, eta0=1.0, warm_eta0=0.05, gains=EqualisedDecaying(),
                  update=GHA),
    AlgorithmSpec(KHA_DEFAULT, BATCH, eta0=1.0, warm_eta0=0.05, gains=EqualisedDecaying(),
                  update=SMD),
    AlgorithmSpec(KRYLOV, EXACT),
    AlgorithmSpec(ONLINE_DEFAULT, ONLINE, update=ORTHONORMALISED),
    AlgorithmSpec("oo-kha", ONLINE, update=ORTHOGONALISED),
    AlgorithmSpec("okpca", ONLINE, update=DICTIONARY),
)}

#: the online estimator's default, ``auto``: exact while the samples lie in the dictionary's
#: span, then ON-KHA's update (:attr:`AlgorithmSpec.exact_span`)
ONLINE_AUTO = AlgorithmSpec(AUTO, ONLINE, update=ORTHONORMALISED, exact_span=True)
#: (family, name) → spec: a name that means another algorithm in one family than in
#: :data:`REGISTRY` (``auto``: the batch estimator's default there, :data:`ONLINE_AUTO` for the
#: online estimator). :func:`spec`, :func:`served` and :func:`names` given a family read it first
SCOPED: dict[tuple[str, str], AlgorithmSpec] = {(ONLINE, AUTO): ONLINE_AUTO}

#: the families each estimator fits (the batch estimator fits the default and the exact
#: solver too)
ESTIMATOR_FAMILIES = {"batch": (DEFAULT, BATCH, EXACT), "online": (ONLINE,)}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` to :data:`REGISTRY` (a new algorithm from outside the package, e.g. a batch
    variant whose gains and update the solvers already serve); a name taken is refused."""
    if spec.name in REGISTRY:
        raise ParameterError(f"algorithm {spec.name!r} is registered already")
    REGISTRY[spec.name] = spec
    return spec


def names(*families: str) -> tuple[str, ...]:
    """The algorithms of ``families`` (every one without arguments), in registry order (a
    name of :data:`SCOPED` first in its family)."""
    scoped = tuple(a for (f, a) in SCOPED if families and f in families)
    return scoped + tuple(a for a, s in REGISTRY.items()
                          if (not families or s.family in families) and a not in scoped)


def spec(algorithm: str, *, option: str = "algorithm", family: str | None = None
         ) -> AlgorithmSpec:
    """The spec of ``algorithm`` (``family``: as that family's estimator reads the name,
    :data:`SCOPED`); an unknown name is refused in one line listing them all (``option`` names
    what gave it, e.g. ``--algorithm``)."""
    s = _get(algorithm, family)
    if s is None:
        raise ParameterError(f"unknown {option} {algorithm!r}; choose one of "
                             f"{', '.join(names())}")
    return s


def exact_span_twin(algorithm: str, family: str) -> str | None:
    """The algorithm of ``family`` that runs ``algorithm``'s update after the exact span (the
    name a run saved before the named online algorithms ran their papers' updates from the first
    sample meant, where its saved state still held the exact span); ``None`` if none does."""
    s = _get(algorithm, family)
    if s is None or s.exact_span:
        return None if s is None else s.name
    twins = [t.name for t in (*SCOPED.values(), *REGISTRY.values())
             if t.family == family and t.exact_span and t.update == s.update]
    return twins[0] if twins else None


def served(algorithm: str, family: str, updates, *, label: str, by: str) -> AlgorithmSpec:
    """The spec of ``algorithm`` where it is of ``family`` and its update is one of ``updates``
    (what the solvers ``by`` serve); else a one-line :class:`ParameterError` (``label``: what
    the caller calls its algorithms, e.g. ``online algorithm``)."""
    s = _get(algorithm, family) if isinstance(algorithm, str) else None
    if s is None or s.family != family:
        raise ParameterError(f"unknown {label} {algorithm!r}; choose one of "
                             f"{', '.join(names(family))}")
    if s.update not in updates:
        raise ParameterError(f"{label} {algorithm!r} asks for the update {s.update!r}; {by} "
                             f"serve {', '.join(updates)}")
    return s


def family(algorithm: str, *, option: str = "algorithm") -> str:
    """The family of ``algorithm`` (refused as :func:`spec` refuses it)."""
    return spec(algorithm, option=option).family


def _get(algorithm, family: str | None = None) -> AlgorithmSpec | None:
    try:
        return SCOPED.get((family, algorithm)) or REGISTRY.get(algorithm)
    except TypeError:       # unhashable: no algorithm
        return None


def is_exact(algorithm: str) -> bool:
    """Whether ``algorithm`` is the exact solver (no kernel row stream, no gains)."""
    s = _get(algorithm)
    return s is not None and s.is_exact


def streams_together(algorithm: str) -> bool:
    """Whether ``algorithm`` can share one kernel row stream with other models (see
    :attr:`AlgorithmSpec.streams_together`)."""
    s = _get(algorithm)
    return s is not None and s.streams_together


def has_mu(algorithm: str) -> bool:
    """Whether ``algorithm`` takes SMD's meta-gain ``μ`` (an unknown name does not)."""
    s = _get(algorithm)
    return s is not None and s.has_mu
