"""The table of solver methods (:mod:`pdeflow.methods`) is the one source of solver choices and particle/grid
compatibility: every stepper registered in :mod:`pdeflow.solvers` agrees with its row, and the config accepts exactly
the (method, measure) pairs the table lists."""
from __future__ import annotations

import importlib

import pdeflow.solvers
import pytest
from pdeflow.solvers.explicit import ExplicitRK

from pdeflow.config import Config, ConfigError
from pdeflow.methods import GRID, METHODS, PARTICLES


def _accepted_measures(cls: type) -> set[str]:
    """The measures a registered stepper class builds: its own, and those of the subclasses it dispatches to
    (``jko`` builds a particle or a grid stepper after ``init.measure``)."""
    return {cls.measure} | {sub.measure for sub in cls.__subclasses__()}


def test_every_registered_stepper_agrees_with_the_table() -> None:
    for method in METHODS.values():
        importlib.import_module(f"pdeflow.solvers.{method.module}")
    assert set(pdeflow.solvers.STEPPERS) == set(METHODS), "a stepper is registered without a row in pdeflow.methods"
    for name, method in METHODS.items():
        cls = pdeflow.solvers.stepper_class(name)
        assert cls.name == name
        assert cls.__module__ == f"pdeflow.solvers.{method.module}", name
        assert _accepted_measures(cls) == set(method.measures), name
        # explicit: an explicit Runge-Kutta step of the Wasserstein velocity -grad Phi alone (wfr integrates
        # (omega, m) with its own vector field)
        wasserstein_rk = issubclass(cls, ExplicitRK) and cls._velocity is ExplicitRK._velocity
        assert wasserstein_rk == method.explicit, name


@pytest.mark.parametrize("measure", [PARTICLES, GRID])
@pytest.mark.parametrize("name", list(METHODS))
def test_the_config_accepts_exactly_the_measures_of_the_table(name: str, measure: str) -> None:
    solver = {"method": name, "gamma": 1.0} if name == "wfr_jko" else {"method": name}  # wfr_jko needs gamma > 0
    base = Config().replace(model={"coordinates": "output_gain"})  # reduced coordinates: a grid is allowed
    try:
        base.replace(solver=solver, init={"measure": measure})
    except ConfigError as exc:
        assert measure not in METHODS[name].measures, f"{name} on {measure}: {exc}"
        assert str(exc) == f"solver.method = {name!r} " + (
            "evolves a grid density: set init.measure = 'grid'" if measure == PARTICLES
            else "moves particles: set init.measure = 'particles'")
    else:
        assert measure in METHODS[name].measures, f"{name} accepted on {measure}"


def test_an_unknown_method_is_refused_with_the_table_listed() -> None:
    with pytest.raises(ConfigError, match="solver.method"):
        Config().replace(solver={"method": "leapfrog"})
    with pytest.raises(ConfigError, match="methods are euler, heun, rk4"):
        pdeflow.solvers.stepper_class("leapfrog")
