"""The table of solver methods (:mod:`pdeflow.methods`) is the one source of solver choices, particle/grid
compatibility and the method-specific ``[solver]`` keys: every stepper registered in :mod:`pdeflow.solvers` agrees
with its row (including the keys it reads when built), and the config accepts exactly the (method, measure) pairs and
the keys the table lists."""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import pdeflow.solvers
import pytest
from pdeflow.solvers.explicit import ExplicitRK

from conftest import build_config
from pdeflow.config import Config, ConfigError
from pdeflow.methods import GRID, METHOD_KEYS, METHODS, PARTICLES, Method, readers
from pdeflow.problem import Problem


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


class _RecordingSection:
    """A ``[solver]`` section that records which keys are read from it."""

    def __init__(self, section: Any) -> None:
        self._section, self.read = section, set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._section, name)


def method_keys_read(build: Callable[[Config], Any], cfg: Config) -> set[str]:
    """The keys of METHOD_KEYS that ``build(cfg)`` reads from ``cfg.solver``."""
    section = _RecordingSection(cfg.solver)
    build(dataclasses.replace(cfg, solver=section))
    return section.read & set(METHOD_KEYS)


def _config_for(name: str) -> Config:
    """A small config the stepper of ``name`` can be built from (a coarse grid for grid methods)."""
    solver = {"method": name, "gamma": 1.0} if name == "wfr_jko" else {"method": name}
    if METHODS[name].measures[0] == GRID:
        return build_config(model={"coordinates": "output_gain"}, init={"measure": GRID}, grid={"n": 8},
                            solver=solver)
    return build_config(init={"n_particles": 4}, solver=solver)


def _table_disagreement(name: str, row: Method, read: set[str]) -> str | None:
    if read != set(row.reads):
        return f"{name}: its stepper reads solver.{sorted(read)} of METHOD_KEYS, its row says {sorted(row.reads)}"
    return None


@pytest.mark.parametrize("name", list(METHODS))
def test_the_keys_a_stepper_reads_are_its_row(name: str) -> None:
    cfg = _config_for(name)
    problem = Problem.from_config(cfg)
    read = method_keys_read(lambda c: pdeflow.solvers.make_stepper(problem, c), cfg)
    assert _table_disagreement(name, METHODS[name], read) is None


def test_a_stepper_reading_a_key_its_row_omits_is_caught() -> None:
    """The check fails when a stepper and its row disagree (a planted stepper reading solver.gamma)."""
    read = method_keys_read(lambda c: c.solver.gamma * c.solver.dt, Config())
    assert read == {"gamma"}
    assert _table_disagreement("planted", Method("explicit", (PARTICLES,)), read) is not None
    assert _table_disagreement("planted", Method("explicit", (PARTICLES,), reads=("gamma",)), read) is None


@pytest.mark.parametrize("key", list(METHOD_KEYS))
@pytest.mark.parametrize("name", list(METHODS))
def test_the_config_refuses_a_method_key_its_method_does_not_read(name: str, key: str) -> None:
    value = {"gamma": 2.0, "alpha": 0.5, "total_mass": "free"}[key]
    measure = METHODS[name].measures[0]
    solver = {"method": name, "gamma": 1.0, key: value} if name == "wfr_jko" else {"method": name, key: value}
    base = Config().replace(model={"coordinates": "output_gain"})

    def build() -> Config:
        return base.replace(solver=solver, init={"measure": measure})
    if key in METHODS[name].reads:
        build()
        return
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value).startswith(f"solver.{key}") and f"not {name!r}" in str(info.value)
    assert all(repr(reader) in str(info.value) for reader in readers(key))
