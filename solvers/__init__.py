"""pdeflow's time steppers, registered by name and chosen by ``solver.method``.

The methods are the stepper classes the modules of this package define with a ``name``; what each is and when
to use it is the "which solver" table that :func:`pdeflow.solvers.table.which_solver_table` renders from their
declarations (the README's "Solvers", docs/solvers.md's "Choosing"). Importing the package imports every module
of it, and each such class registers itself (:meth:`pdeflow.solvers.base.Stepper.__init_subclass__`) and declares
its row of :data:`pdeflow.solvers.methods.METHODS`. :func:`check_config` checks a config's method against those rows;
:func:`make_stepper` builds the stepper a config names. The one time loop that advances them is
:class:`pdeflow.solvers.loop.Loop` (the driver :func:`pdeflow.solvers.driver.run` writes a file from it).
"""
from __future__ import annotations

import functools
import importlib
import pkgutil

import numpy as np

from pdeflow.core.config import Config, ConfigError, SolverConfig
from pdeflow.core.measure import initial_density
from pdeflow.core.problem import Problem

from .base import STEPPERS, SolverError, State, Stepper
from .methods import METHODS, measure_mismatch, method_keys, unread_key
from .parameters import SCHEMA_FILE


def stepper_class(method: str) -> type[Stepper]:
    """The stepper class of ``solver.method``; ConfigError if it is unknown."""
    if method not in STEPPERS:
        raise ConfigError(f"solver.method {method!r} is unknown; methods are {', '.join(STEPPERS)}")
    return STEPPERS[method]


def check_config(cfg: Config) -> None:
    """The rules of ``cfg.solver.method`` (ConfigError, one line): a known method, one that evolves ``init.measure``,
    no method-specific ``[solver]`` key set to other than its default for a method that does not read it, and the
    keys it reads going together (its class's :meth:`~pdeflow.solvers.base.Stepper.check_keys`)."""
    s = cfg.solver
    cls = stepper_class(s.method)
    mismatch = measure_mismatch(s.method, cfg.init.measure)
    if mismatch is not None:
        raise ConfigError(mismatch)
    defaults = SolverConfig()
    missing = [key for key in method_keys() if not hasattr(defaults, key)]
    if missing:
        # a stepper class declares a key the generated schema does not have yet: a developer's step, not the user's
        raise RuntimeError(f"the [solver] schema ({SCHEMA_FILE}) lacks solver.{', solver.'.join(missing)}, declared "
                           f"by a stepper class: run python -m pdeflow.solvers.table --write")
    for key in method_keys():
        unread = unread_key(s.method, key) if getattr(s, key) != getattr(defaults, key) else None
        if unread is not None:
            raise ConfigError(unread)
    cls.check_keys(cfg)


def make_stepper(problem: Problem, cfg: Config) -> Stepper:
    """The stepper ``cfg.solver.method`` names (:func:`check_config`), built for ``problem`` by its ``from_config``,
    starting from the initial measure of ``init.*`` (:func:`initial_fields`)."""
    check_config(cfg)
    stepper = stepper_class(cfg.solver.method).from_config(problem, cfg)
    stepper.initial_fields = functools.partial(initial_fields, stepper, cfg)
    return stepper


def initial_fields(stepper: Stepper, cfg: Config) -> dict[str, np.ndarray]:
    """The measure ``init.*`` sets, as the stepper's fields: ``omega`` and ``mass`` of the particles, or the
    ``density`` on the stepper's grid."""
    if stepper.measure == "grid":
        return {"density": initial_density(stepper.grid, cfg.init)}
    omega, mass = stepper.problem.initial_measure(cfg)
    return {"omega": omega, "mass": mass}


def _import_steppers() -> None:
    """Import every module of this package, so that every stepper class is defined (registered). A module that
    fails to import raises: no method disappears silently. An optional dependency (SUNDIALS for ``cvode``) is
    imported when the stepper is built, with a one-line error naming the extra to install
    (:func:`pdeflow.solvers.cvode.sundials`)."""
    # table renders the registry and is run as a script (python -m pdeflow.solvers.table): imported here, runpy
    # would find it loaded before running it
    for module in (m for m in pkgutil.iter_modules(__path__) if m.name != "table"):
        importlib.import_module(f"{__name__}.{module.name}")


_import_steppers()

__all__ = ["STEPPERS", "METHODS", "check_config", "make_stepper", "initial_fields", "stepper_class",
           "Stepper", "State", "SolverError"]
