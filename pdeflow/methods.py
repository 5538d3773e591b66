"""The time steppers ``solver.method`` may name, declared once: the module of :mod:`pdeflow.solvers` defining each,
the measures (``init.measure``) it evolves and the method-specific ``[solver]`` keys it reads.

:mod:`pdeflow.config` validates ``solver.method``, its compatibility with ``init.measure`` and the keys of
:data:`METHOD_KEYS` against :data:`METHODS`; :mod:`pdeflow.solvers` imports the module of a method on first use from
it; the chaos experiment takes its reference flows from it. A test checks that every stepper class registered in
:mod:`pdeflow.solvers` agrees with its row (name, module, measures, explicit, the keys it reads).
"""
from __future__ import annotations

from dataclasses import dataclass

PARTICLES, GRID = "particles", "grid"


@dataclass(frozen=True)
class Method:
    """``module``: the submodule of :mod:`pdeflow.solvers` defining the stepper; ``measures``: the values of
    ``init.measure`` it evolves; ``explicit``: an explicit Runge-Kutta step (fixed or embedded) of the Wasserstein
    flow of particles, velocity ``-grad Phi`` alone (the reference flows of the chaos experiment); ``reads``: the keys
    of :data:`METHOD_KEYS` its stepper reads."""
    module: str
    measures: tuple[str, ...]
    explicit: bool = False
    reads: tuple[str, ...] = ()


# ``[solver]`` keys only some methods read, with what they are: a config giving one of them a value other than its
# default for a method that does not read it is refused (the value would be silently ignored).
METHOD_KEYS: dict[str, str] = {"gamma": "Fisher-Rao rate", "alpha": "transport speed", "total_mass": ""}


METHODS: dict[str, Method] = {
    "euler": Method("explicit", (PARTICLES,), explicit=True),
    "heun": Method("explicit", (PARTICLES,), explicit=True),
    "rk4": Method("explicit", (PARTICLES,), explicit=True),
    "adaptive": Method("explicit", (PARTICLES,), explicit=True),
    "jko": Method("jko", (PARTICLES, GRID)),
    "fv": Method("finite_volume", (GRID,), reads=("gamma",)),
    "sgd": Method("sgd", (PARTICLES,)),
    "wfr": Method("wfr", (PARTICLES,), reads=("gamma", "alpha", "total_mass")),
    "wfr_jko": Method("unbalanced_jko", (GRID,), reads=("gamma", "alpha")),
    "rosenbrock": Method("stiff", (PARTICLES,)),
    "rkc": Method("chebyshev", (PARTICLES,)),
    "cvode": Method("cvode", (PARTICLES,)),
}
SOLVER_METHODS: tuple[str, ...] = tuple(METHODS)
EXPLICIT_FLOWS: tuple[str, ...] = tuple(name for name, m in METHODS.items() if m.explicit)


def measure_mismatch(method: str, measure: str) -> str | None:
    """Why ``solver.method`` cannot evolve ``init.measure`` (one line naming the fix), or None when it can."""
    accepted = METHODS[method].measures
    if measure in accepted:
        return None
    what = "evolves a grid density" if accepted == (GRID,) else "moves particles"
    return f"solver.method = {method!r} {what}: set init.measure = {accepted[0]!r}"


def readers(key: str) -> tuple[str, ...]:
    """The methods that read the ``[solver]`` key ``key`` of :data:`METHOD_KEYS`."""
    return tuple(name for name, m in METHODS.items() if key in m.reads)


def unread_key(method: str, key: str) -> str | None:
    """Why a value of ``solver.<key>`` (a key of :data:`METHOD_KEYS`) other than its default is refused for
    ``solver.method = method`` (one line), or None when the method reads it."""
    if key in METHODS[method].reads:
        return None
    names = [repr(n) for n in readers(key)]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    what = f" ({METHOD_KEYS[key]})" if METHOD_KEYS[key] else ""
    return f"solver.{key}{what} is read by solver.method {listed}, not {method!r}"


__all__ = ["Method", "METHODS", "METHOD_KEYS", "readers", "unread_key", "SOLVER_METHODS", "EXPLICIT_FLOWS", "PARTICLES",
           "GRID", "measure_mismatch"]
