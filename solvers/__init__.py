"""pdeflow's time steppers, registered by name and chosen by ``solver.method``.

``euler``, ``heun``, ``rk4``, ``adaptive`` (:mod:`pdeflow.solvers.explicit`), ``jko``
(:mod:`pdeflow.solvers.jko`), ``fv`` (:mod:`pdeflow.solvers.finite_volume`), ``sgd`` (:mod:`pdeflow.solvers.sgd`),
``wfr`` (:mod:`pdeflow.solvers.wfr`), ``wfr_jko`` (:mod:`pdeflow.solvers.unbalanced_jko`), ``rosenbrock``
(:mod:`pdeflow.solvers.stiff`), ``rkc`` (:mod:`pdeflow.solvers.chebyshev`), ``cvode`` (:mod:`pdeflow.solvers.cvode`,
SUNDIALS, an optional extra). Each takes explicit parameters and has ``from_config``; :func:`make_stepper`
builds the one a config names. The one time loop that advances them is :class:`pdeflow.solvers.loop.Loop`
(the driver :func:`pdeflow.solvers.driver.run` writes a file from it).
"""
from __future__ import annotations

import functools
import importlib

import numpy as np

from pdeflow.config import Config, ConfigError
from pdeflow.measure import initial_density
from pdeflow.methods import METHODS
from pdeflow.problem import Problem

from .base import SolverError, State, Stepper

STEPPERS: dict[str, type[Stepper]] = {}
# The module defining each method (the table pdeflow.methods.METHODS); imported on first use so a run loads only
# what it needs.
MODULES = {name: f"{__name__}.{m.module}" for name, m in METHODS.items()}


def register(cls: type[Stepper]) -> type[Stepper]:
    """Class decorator adding a stepper to :data:`STEPPERS` under ``cls.name``."""
    STEPPERS[cls.name] = cls
    return cls


def stepper_class(method: str) -> type[Stepper]:
    """The stepper class of ``solver.method``; ConfigError if it is unknown or not available."""
    if method not in STEPPERS:
        module = MODULES.get(method)
        if module is None:
            raise ConfigError(f"solver.method {method!r} is unknown; methods are {', '.join(MODULES)}")
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            raise ConfigError(f"solver.method {method!r} is not available in this pdeflow") from None
    return STEPPERS[method]


def make_stepper(problem: Problem, cfg: Config) -> Stepper:
    """The stepper ``cfg.solver.method`` names, built for ``problem`` by its ``from_config``, starting from the
    initial measure of ``init.*`` (:func:`initial_fields`)."""
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


__all__ = ["STEPPERS", "register", "make_stepper", "initial_fields", "stepper_class", "Stepper", "State", "SolverError"]
