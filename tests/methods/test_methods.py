"""A method is declared once, by its stepper class (name, measures, explicit reference flow, the method-specific
``[solver]`` keys it reads), and :mod:`pdeflow.solvers.methods`' table, the config's method rules
(:func:`pdeflow.solvers.check_config`) and ``pdeflow config`` derive from it: every registered class agrees with its
row, the keys a stepper reads when built are its declared ones, and every method-specific key given a value for a
method that does not read it is refused (exit 2, one line naming the methods that read it)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pdeflow.solvers
import pytest
from pdeflow.solvers import STEPPERS, check_config
from pdeflow.solvers.base import Stepper
from pdeflow.solvers.chebyshev import RADIUS_EVERY
from pdeflow.solvers.explicit import ExplicitRK
from pdeflow.solvers.methods import GRID, METHODS, PARTICLES, Method, method_keys, readers, schema_text
from pdeflow.solvers.parameters import Param
from pdeflow.solvers.wfr import GAMMA

from conftest import build_config, config_text
from pdeflow.core.config import Config, ConfigError, SolverConfig
from pdeflow.core.problem import Problem
from pdeflow.interface.cli import main


def _built_measures(cls: type) -> set[str]:
    """The measures a registered stepper class builds: its own, and those of the subclasses it dispatches to
    (``jko`` builds a particle or a grid stepper after ``init.measure``)."""
    return {cls.measure} | {sub.measure for sub in cls.__subclasses__() if not sub.__dict__.get("name")}


def test_every_registered_stepper_declares_its_row() -> None:
    assert list(STEPPERS) == list(METHODS)
    for name, method in METHODS.items():
        cls = pdeflow.solvers.stepper_class(name)
        assert method == Method(name, cls.measures or (cls.measure,), cls.explicit_flow, tuple(cls.params),
                                cls.__dict__["summary"], cls.__dict__["use_when"])
        assert _built_measures(cls) == set(method.measures), name
        # explicit: an explicit Runge-Kutta step of the Wasserstein velocity -grad Phi alone (wfr integrates
        # (omega, m) with its own vector field)
        wasserstein_rk = issubclass(cls, ExplicitRK) and cls._velocity is ExplicitRK._velocity
        assert wasserstein_rk == method.explicit, name
    # every [solver] key but the method and its step is some method's
    assert set(method_keys()) == {f.name for f in dataclasses.fields(SolverConfig)} - {"method", "dt"}


def test_a_new_stepper_class_declares_itself() -> None:
    """Defining a class with a name is all it takes to add a method (py-pde's registration by subclassing)."""
    class Planted(Stepper):
        name = "planted_method"
        params: ClassVar[tuple[Param, ...]] = (RADIUS_EVERY,)

        @classmethod
        def from_config(cls, problem: Problem, cfg: Config) -> Stepper:
            return cls(problem)
    try:
        assert STEPPERS["planted_method"] is Planted
        assert METHODS["planted_method"] == Method("planted_method", (PARTICLES,), False, (RADIUS_EVERY,))
        assert METHODS["planted_method"].reads == ("radius_every",)
        assert "planted_method" in readers("radius_every")
        check_config(Config().replace(solver={"method": "planted_method", "radius_every": 3}))
    finally:
        del STEPPERS["planted_method"], METHODS["planted_method"]


def test_a_stepper_module_that_fails_to_import_raises(monkeypatch) -> None:
    """Importing :mod:`pdeflow.solvers` imports every module of it, and a module missing a third-party import fails
    loudly instead of leaving its method out (an optional dependency is imported when its stepper is built)."""
    import importlib

    real = importlib.import_module

    def failing(name: str, *args: Any) -> Any:
        if name == "pdeflow.solvers.chebyshev":
            raise ModuleNotFoundError("No module named 'not_installed'", name="not_installed")
        return real(name, *args)
    monkeypatch.setattr(importlib, "import_module", failing)
    with pytest.raises(ModuleNotFoundError, match="not_installed"):
        pdeflow.solvers._import_steppers()


def test_a_stepper_class_that_breaks_the_contract_is_refused_when_defined() -> None:
    """The contract of :class:`pdeflow.solvers.base.Stepper`: a named class lacking ``from_config``, or an adaptive
    one lacking its error estimate's order, fails where it is defined (and registers nothing); a class without
    ``step`` cannot be instantiated."""
    from pdeflow.solvers.controller import AdaptiveStepper

    with pytest.raises(TypeError, match=r"Unconfigured \(solver.method = 'unconfigured'\) does not define "
                                        r"from_config"):
        class Unconfigured(Stepper):
            name = "unconfigured"
    with pytest.raises(TypeError, match="does not define error_order, _step_impl"):
        class Unestimated(AdaptiveStepper):
            name = "unestimated"
            order = 2

            @classmethod
            def from_config(cls, problem: Problem, cfg: Config) -> Stepper:
                return cls(problem, 0.1, controller=cls.default_controller(rtol=1e-3, atol=1e-6, dt_min=1e-9,
                                                                           dt_max=1.0, max_growth=5.0))
    assert "unconfigured" not in STEPPERS and "unestimated" not in STEPPERS and "unestimated" not in METHODS

    class Stepless(Stepper):
        pass
    with pytest.raises(TypeError, match="abstract method.*step"):
        Stepless(Problem.from_config(Config()))


@pytest.mark.parametrize("measure", [PARTICLES, GRID])
@pytest.mark.parametrize("name", list(METHODS))
def test_the_config_accepts_exactly_the_declared_measures(name: str, measure: str) -> None:
    solver = {"method": name, "gamma": 1.0} if name == "wfr_jko" else {"method": name}  # wfr_jko needs gamma > 0
    cfg = Config().replace(model={"coordinates": "output_gain"}, solver=solver, init={"measure": measure})
    try:
        check_config(cfg)
    except ConfigError as exc:
        assert measure not in METHODS[name].measures, f"{name} on {measure}: {exc}"
        assert str(exc) == f"solver.method = {name!r} " + (
            "evolves a grid density: set init.measure = 'grid'" if measure == PARTICLES
            else "moves particles: set init.measure = 'particles'")
    else:
        assert measure in METHODS[name].measures, f"{name} accepted on {measure}"


def test_an_unknown_method_is_refused_with_the_methods_listed(tmp_path, capsys) -> None:
    with pytest.raises(ConfigError, match="solver.method 'leapfrog' is unknown; methods are .*rk4"):
        check_config(Config().replace(solver={"method": "leapfrog"}))
    with pytest.raises(ConfigError, match="methods are .*rk4"):
        pdeflow.solvers.stepper_class("leapfrog")


class _RecordingSection:
    """A ``[solver]`` section that records which keys are read from it."""

    def __init__(self, section: Any) -> None:
        self._section, self.read = section, set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._section, name)


def method_keys_read(build: Callable[[Config], Any], cfg: Config) -> set[str]:
    """The method-specific keys that ``build(cfg)`` reads from ``cfg.solver``."""
    section = _RecordingSection(cfg.solver)
    build(dataclasses.replace(cfg, solver=section))
    return section.read & set(method_keys())


def _config_for(name: str, measure: str) -> Config:
    """A small config the stepper of ``name`` can be built from (a coarse grid for a grid)."""
    solver = {"method": name, "gamma": 1.0} if name == "wfr_jko" else {"method": name}
    if measure == GRID:
        return build_config(model={"coordinates": "output_gain"}, init={"measure": GRID}, grid={"n": 8},
                            solver=solver)
    return build_config(init={"n_particles": 4}, solver=solver)


def _declaration_disagreement(name: str, row: Method, read: set[str]) -> str | None:
    if not read <= set(row.reads):
        return f"{name}: its stepper reads solver.{sorted(read - set(row.reads))}, its class does not declare them"
    return None


@pytest.mark.parametrize("name,measure", [(name, measure) for name, m in METHODS.items() for measure in m.measures])
def test_the_keys_a_stepper_reads_are_declared(name: str, measure: str) -> None:
    cfg = _config_for(name, measure)
    problem = Problem.from_config(cfg)
    read = method_keys_read(lambda c: STEPPERS[name].from_config(problem, c), cfg)
    assert _declaration_disagreement(name, METHODS[name], read) is None


def test_every_declared_key_is_read_by_some_measure() -> None:
    for name, method in METHODS.items():
        read = set()
        for measure in method.measures:
            cfg = _config_for(name, measure)
            problem = Problem.from_config(cfg)
            read |= method_keys_read(lambda c, p=problem: STEPPERS[name].from_config(p, c), cfg)
        assert read == set(method.reads), name


def test_a_stepper_reading_an_undeclared_key_is_caught() -> None:
    """The check fails when a stepper and its declaration disagree (a planted stepper reading solver.gamma)."""
    read = method_keys_read(lambda c: c.solver.gamma * c.solver.dt, Config())
    assert read == {"gamma"}
    assert _declaration_disagreement("planted", Method("planted", (PARTICLES,)), read) is not None
    assert _declaration_disagreement("planted", Method("planted", (PARTICLES,), params=(GAMMA,)), read) is None


def other_value(key: str) -> Any:
    """A valid value of ``solver.<key>`` other than its default."""
    f = {f.name: f for f in dataclasses.fields(SolverConfig)}[key]
    if f.metadata["choices"]:
        return next(c for c in f.metadata["choices"] if c != f.default)
    if isinstance(f.default, int):
        return f.default + 1
    return 1.0 if math.isinf(f.default) or f.default == 0.0 else 2.0 * f.default


@pytest.mark.parametrize("key", sorted({f.name for f in dataclasses.fields(SolverConfig)} - {"method", "dt"}))
@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_key_its_method_does_not_read_is_refused(name: str, key: str) -> None:
    measure = METHODS[name].measures[0]
    solver = {"method": name, "gamma": 1.0} if name == "wfr_jko" and key != "gamma" else {"method": name}
    if (name, key) == ("rosenbrock", "stage_solve"):
        solver["deflate"] = 2  # 'auto' needs deflation
    cfg = Config().replace(model={"coordinates": "output_gain"}, solver={**solver, key: other_value(key)},
                           init={"measure": measure})
    if key in METHODS[name].reads:
        check_config(cfg)
        return
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert str(info.value).startswith(f"solver.{key} is read by") and f"not {name!r}" in str(info.value)
    assert all(repr(reader) in str(info.value) for reader in readers(key))


@pytest.mark.parametrize("key", method_keys())
def test_pdeflow_run_refuses_an_unread_key_with_exit_2(key: str, tmp_path, capsys) -> None:
    """``pdeflow run`` with rk4 (which reads none of them) and any method-specific key: exit 2, one line, no file."""
    path = tmp_path / "c.toml"
    path.write_text(config_text(solver={"method": "rk4", key: other_value(key)}))
    out = tmp_path / "out.h5"
    assert main(["run", str(path), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"solver.{key} is read by" in err[0], err
    assert not out.exists()


def test_pdeflow_config_lists_the_methods_and_their_readers() -> None:
    text = schema_text()
    line = next(line for line in text.splitlines() if line.startswith("  method = "))
    assert all(repr(name) in line for name in METHODS)
    for key in method_keys():
        line = next(line for line in text.splitlines() if line.startswith(f"  {key} = "))
        assert line.endswith(f"[read by {', '.join(readers(key))}]"), line


@pytest.mark.parametrize("solver,message", [
    ({"method": "wfr_jko"}, "'wfr_jko' needs solver.gamma > 0"),
    ({"method": "wfr", "alpha": 0.0}, "both 0"),
    ({"method": "rosenbrock", "stage_solve": "auto"}, "needs solver.deflate > 0"),
])
def test_keys_that_do_not_go_together_are_refused_by_their_method(solver: dict, message: str) -> None:
    measure = METHODS[solver["method"]].measures[0]
    cfg = Config().replace(model={"coordinates": "output_gain"}, solver=solver, init={"measure": measure})
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


# ---- the [solver] schema, built from the declarations -----------------------------------------------------------
def test_the_solver_schema_is_the_declarations_of_the_classes() -> None:
    """Every field of the config's ``[solver]`` section is a declared key: the common ``method`` and ``dt``, then each
    key as the classes declare it (type, default, allowed values); a key several methods read with different docs
    says what it means to each (``deflate``: a preconditioner for rosenbrock and cvode, linearly implicit pairs for
    eserk4), and ``pdeflow config`` prints it so."""
    from pdeflow.solvers.methods import solver_schema
    from pdeflow.solvers.parameters import COMMON

    fields = {f.name: f for f in dataclasses.fields(SolverConfig)}
    keys = solver_schema()
    assert [p.name for p in keys] == list(fields) and keys[:2] == COMMON
    for p in keys:
        f = fields[p.name]
        assert (f.type, f.default, f.metadata["doc"]) == (p.type.__name__, p.default, p.doc), p.name
        assert all(f.metadata[k] == getattr(p, k) for k in ("ge", "gt", "le", "choices")), p.name
        for name in readers(p.name):
            declared = next(q for q in METHODS[name].params if q.name == p.name)
            assert declared.agrees_with(p) and declared.doc in p.doc, (name, p.name)
    deflate = next(line for line in schema_text().splitlines() if line.startswith("  deflate = "))
    for name in ("rosenbrock", "cvode", "eserk4"):
        assert f"{name}: largest eigenpairs" in deflate or f"{name}, " in deflate, deflate
    assert "treated linearly implicitly" in deflate and "preconditioner" in deflate


def test_declarations_of_one_key_that_disagree_are_refused() -> None:
    """Two methods may say different things about a key, but not give it two defaults, types or ranges."""
    from pdeflow.solvers.parameters import DT, schema_keys

    tau = Param("tau", float, 0.0, "a step", ge=0)
    merged = schema_keys([("a", [tau]), ("b", [Param("tau", float, 0.0, "another step", ge=0)]), ("c", [tau])])
    assert merged[-1] == Param("tau", float, 0.0, "a, c: a step; b: another step", ge=0)
    for other in (Param("tau", float, 1.0, "a step", ge=0), Param("tau", int, 0, "a step", ge=0),
                  Param("tau", float, 0.0, "a step", gt=0)):
        with pytest.raises(ValueError, match=r"solver.tau is declared differently by solver.method 'a' .* and 'b'"):
            schema_keys([("a", [tau]), ("b", [other])])
    with pytest.raises(ValueError, match="declares solver.dt, a key of every method"):
        schema_keys([("a", [DT])])


def test_a_declared_carry_is_checkpointed_and_restored_by_the_base() -> None:
    """Item 8 of the contract: a stepper declares what it carries (:class:`pdeflow.solvers.base.Carried`) and a step
    leaves it on the state it returns (``State.carry``); the base writes it as nan-padded float arrays of the
    declared shapes (only what the stepper's settings keep) and restores the same values, in the declared memory
    order, to the state it is given; a state whose carry is empty has none, a new state from a step starts with an
    empty one, and a checkpoint that knows nothing restores none."""
    from pdeflow.solvers.base import Carried, State

    class Carrying(Stepper):  # no name: a base, not a method
        m = 3
        carried = (Carried("rho"), Carried("age", "int"), Carried("vector", "vector"),
                   Carried("lam", "values", count="m"), Carried("V", "columns", count="m", like="lam", order="F"),
                   Carried("off", when=lambda stepper: stepper.m > 5))

        @classmethod
        def from_config(cls, problem: Problem, cfg: Config) -> Stepper:
            return cls(problem)

        def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
            return state, {}

    fields = {"omega": np.zeros((2, 2)), "mass": np.ones(2)}
    state, other = State(0.0, 0, 0.1, dict(fields)), State(0.0, 0, 0.1, dict(fields))
    stepper = Carrying(None)
    V = np.arange(8.0).reshape(4, 2)
    state.carry.update(rho=2.5, age=4, vector=np.arange(4.0))
    state.carry.update(lam=np.array([3.0, 1.0]), V=V)
    assert other.carry == {} and state.advanced(dict(fields), 0.1).carry == {}
    extra = stepper.extra_state(state)
    assert list(extra) == ["rho", "age", "vector", "lam", "V"]  # "off": not kept with these settings
    assert extra["lam"].shape == (3,) and np.isnan(extra["lam"][2]) and extra["V"].shape == (4, 3)
    assert np.all(np.isnan(extra["V"][:, 2])) and np.array_equal(extra["V"][:, :2], V)
    assert all(np.all(np.isnan(a)) for a in stepper.extra_state(other).values())  # nothing known at `other`

    fresh = Carrying(None)
    assert fresh.restore(other, extra) is other
    back = other.carry
    assert back["rho"] == 2.5 and back["age"] == 4 and isinstance(back["age"], int)
    np.testing.assert_array_equal(back["vector"], np.arange(4.0))
    np.testing.assert_array_equal(back["lam"], [3.0, 1.0])
    np.testing.assert_array_equal(back["V"], V)
    assert back["V"].flags["F_CONTIGUOUS"]
    nothing = State(0.0, 0, 0.1, dict(fields))
    fresh.restore(other, stepper.extra_state(nothing))
    assert other.carry == {}
