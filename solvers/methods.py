"""The time steppers ``solver.method`` may name, as their classes declare them: the measures (``init.measure``) each
evolves, whether it is an explicit reference flow, and the method-specific ``[solver]`` keys it reads (their
declarations, :class:`~pdeflow.solvers.parameters.Param`, from which :func:`solver_schema` builds the ``[solver]``
schema).

A stepper class of :mod:`pdeflow.solvers` that sets a ``name`` declares its row here when it is defined
(:meth:`pdeflow.solvers.base.Stepper.__init_subclass__`, the way py-pde registers its solvers by subclassing):
:data:`METHODS` is filled by importing :mod:`pdeflow.solvers`, which imports every stepper module. The table lives
with the steppers, above core and io: what needs it (the config's method rules, :func:`pdeflow.solvers.check_config`;
``pdeflow config``, :func:`schema_text`; the analyses) sits at or above solvers. This module holds the table and
the one-line messages.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdeflow.core.config import describe_schema

from .parameters import Param, schema_keys

PARTICLES, GRID = "particles", "grid"


@dataclass(frozen=True)
class Method:
    """``name`` (``solver.method``); ``measures``: the values of ``init.measure`` it evolves; ``explicit``: an
    explicit Runge-Kutta step (fixed or embedded) of the Wasserstein flow of particles, velocity ``-grad Phi`` alone
    (the reference flows of the chaos experiment); ``params``: the method-specific ``[solver]`` keys it reads, as
    declared (:attr:`reads`: their names);
    ``summary``: what the method is, and ``use_when``: when to choose it, one line each (the rows of the "which
    solver" table, :func:`pdeflow.solvers.table.which_solver_table`)."""
    name: str
    measures: tuple[str, ...]
    explicit: bool = False
    params: tuple[Param, ...] = ()
    summary: str = ""
    use_when: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        """The names of the method-specific ``[solver]`` keys the method reads."""
        return tuple(p.name for p in self.params)


# solver.method -> its declaration, in the order the stepper classes were defined
METHODS: dict[str, Method] = {}


def declare(method: Method) -> None:
    """Add (or replace) the row of ``method.name``."""
    METHODS[method.name] = method


def explicit_flows() -> tuple[str, ...]:
    """The methods declared explicit reference flows."""
    return tuple(name for name, m in METHODS.items() if m.explicit)


def method_keys() -> tuple[str, ...]:
    """The ``[solver]`` keys some method reads (every key but ``method`` and ``dt``), sorted."""
    return tuple(sorted({key for m in METHODS.values() for key in m.reads}))


def measure_mismatch(method: str, measure: str) -> str | None:
    """Why ``solver.method`` cannot evolve ``init.measure`` (one line naming the fix), or None when it can."""
    accepted = METHODS[method].measures
    if measure in accepted:
        return None
    what = "evolves a grid density" if accepted == (GRID,) else "moves particles"
    return f"solver.method = {method!r} {what}: set init.measure = {accepted[0]!r}"


def readers(key: str) -> tuple[str, ...]:
    """The methods that read the ``[solver]`` key ``key``."""
    return tuple(name for name, m in METHODS.items() if key in m.reads)


def unread_key(method: str, key: str) -> str | None:
    """Why a value of ``solver.<key>`` (a key of :func:`method_keys`) other than its default is refused for
    ``solver.method = method`` (one line naming the methods that read it), or None when the method reads it."""
    if key in METHODS[method].reads:
        return None
    names = [repr(n) for n in readers(key)]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"solver.{key} is read by solver.method {listed}, not {method!r}"


def solver_schema() -> tuple[Param, ...]:
    """The ``[solver]`` keys the declared methods read, merged (:func:`pdeflow.solvers.parameters.schema_keys`): the
    source of :class:`pdeflow.core.solver_config.SolverConfig` (``python -m pdeflow.solvers.table --write``)."""
    return schema_keys((name, m.params) for name, m in METHODS.items())


def schema_text() -> str:
    """``pdeflow config``'s text: :func:`pdeflow.core.config.describe_schema` with the declared methods as the
    choices of ``solver.method`` and, for each method-specific ``[solver]`` key, the methods that read it."""
    return describe_schema(tuple(METHODS), readers)


__all__ = ["schema_text", "solver_schema", "Method", "METHODS", "declare", "explicit_flows", "method_keys", "readers",
           "unread_key", "PARTICLES", "GRID", "measure_mismatch"]
