"""The one registry of fit algorithms: each name and its family.

* ``batch`` — the KHA family over whole centered kernel rows, many passes
  (:mod:`dkha.solvers.batch`, driven by :func:`dkha.fit.coordinator.fit_batch`);
* ``exact`` — the exact top eigenvectors by block Krylov products (:mod:`dkha.fit.krylov`; a
  batch estimator, but it streams no kernel rows and fits one model at a time);
* ``default`` — ``auto``, the default: the exact top components by the fastest path, chosen by
  a cost model (:mod:`dkha.fit.plan`: ``K'`` held whole, or blockwise Krylov); given options of
  the KHA iterations it falls back to ``kha-smd``. Neither exact nor streamable together: it
  fits one model at a time, and its path is decided at fit time;
* ``online`` — one sample at a time over a dictionary (:mod:`dkha.solvers.online`, driven by
  :func:`dkha.fit.online.fit_online`).

Every list of allowed values (the estimators' parameter table, the command line's checks, the
solvers' ``ALGORITHMS``) is derived from :data:`REGISTRY`; a new algorithm is one entry here.
"""

from __future__ import annotations

from dkha.errors import ParameterError

BATCH, EXACT, ONLINE, DEFAULT = "batch", "exact", "online", "default"

#: name → family, in the order the documentation lists them
REGISTRY: dict[str, str] = {
    "auto": DEFAULT,
    "kha": BATCH, "kha-t": BATCH, "kha-et": BATCH, "kha-smd": BATCH,
    "krylov": EXACT,
    "on-kha": ONLINE, "oo-kha": ONLINE, "okpca": ONLINE,
}

#: the exact solver's name
KRYLOV = "krylov"
#: the default's name (:mod:`dkha.fit.plan`)
AUTO = "auto"

#: the families each estimator fits (the batch estimator fits the default and the exact
#: solver too)
ESTIMATOR_FAMILIES = {"batch": (DEFAULT, BATCH, EXACT), "online": (ONLINE,)}


def names(*families: str) -> tuple[str, ...]:
    """The algorithms of ``families`` (every one without arguments), in registry order."""
    return tuple(a for a, f in REGISTRY.items() if not families or f in families)


def family(algorithm: str, *, option: str = "algorithm") -> str:
    """The family of ``algorithm``; an unknown name is refused in one line listing them all
    (``option`` names what gave it, e.g. ``--algorithm``)."""
    try:
        return REGISTRY[algorithm]
    except (KeyError, TypeError):
        raise ParameterError(f"unknown {option} {algorithm!r}; choose one of "
                             f"{', '.join(names())}") from None


def is_exact(algorithm: str) -> bool:
    """Whether ``algorithm`` is the exact solver (no kernel row stream, no gains)."""
    return REGISTRY.get(algorithm) == EXACT


def streams_together(algorithm: str) -> bool:
    """Whether ``algorithm`` can share one kernel row stream with other models (the KHA family;
    not the exact solver, which streams no rows, nor the default, whose path is decided at fit
    time)."""
    return REGISTRY.get(algorithm) == BATCH
