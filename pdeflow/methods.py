"""The time steppers ``solver.method`` may name, declared once: the module of :mod:`pdeflow.solvers` defining each and
the measures (``init.measure``) it evolves.

:mod:`pdeflow.config` validates ``solver.method`` and its compatibility with ``init.measure`` against
:data:`METHODS`; :mod:`pdeflow.solvers` imports the module of a method on first use from it; the chaos experiment takes
its reference flows from it. A test checks that every stepper class registered in :mod:`pdeflow.solvers` agrees with its
row (name, module, measures, explicit).
"""
from __future__ import annotations

from dataclasses import dataclass

PARTICLES, GRID = "particles", "grid"


@dataclass(frozen=True)
class Method:
    """``module``: the submodule of :mod:`pdeflow.solvers` defining the stepper; ``measures``: the values of
    ``init.measure`` it evolves; ``explicit``: an explicit Runge-Kutta step (fixed or embedded) of the Wasserstein
    flow of particles, velocity ``-grad Phi`` alone (the reference flows of the chaos experiment)."""
    module: str
    measures: tuple[str, ...]
    explicit: bool = False


METHODS: dict[str, Method] = {
    "euler": Method("explicit", (PARTICLES,), explicit=True),
    "heun": Method("explicit", (PARTICLES,), explicit=True),
    "rk4": Method("explicit", (PARTICLES,), explicit=True),
    "adaptive": Method("explicit", (PARTICLES,), explicit=True),
    "jko": Method("jko", (PARTICLES, GRID)),
    "fv": Method("finite_volume", (GRID,)),
    "sgd": Method("sgd", (PARTICLES,)),
    "wfr": Method("wfr", (PARTICLES,)),
    "wfr_jko": Method("unbalanced_jko", (GRID,)),
    "rosenbrock": Method("stiff", (PARTICLES,)),
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


__all__ = ["Method", "METHODS", "SOLVER_METHODS", "EXPLICIT_FLOWS", "PARTICLES", "GRID", "measure_mismatch"]
