"""pdeflow's time steppers, registered by name and chosen by ``solver.method``.

``euler``, ``heun``, ``rk4``, ``adaptive`` (:mod:`pdeflow.solvers.explicit`), ``jko``
(:mod:`pdeflow.solvers.jko`), ``fv`` (:mod:`pdeflow.solvers.finite_volume`), ``sgd`` (:mod:`pdeflow.solvers.sgd`),
``wfr`` (:mod:`pdeflow.solvers.wfr`), ``wfr_jko`` (:mod:`pdeflow.solvers.unbalanced_jko`), ``rosenbrock``
(:mod:`pdeflow.solvers.stiff`). The loop that drives them is :func:`pdeflow.solvers.driver.run`.
"""
from __future__ import annotations

import importlib

from pdeflow.config import Config, ConfigError
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
    """The stepper ``cfg.solver.method`` names, built for ``problem``."""
    return stepper_class(cfg.solver.method)(problem, cfg)


__all__ = ["STEPPERS", "register", "make_stepper", "stepper_class", "Stepper", "State", "SolverError"]
