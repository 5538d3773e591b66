"""The one time loop (pdeflow/solvers/loop.py) and its landing rule (pdeflow/core/clock.py); steppers built from
explicit parameters; the chaos experiment and the stability simulation advancing through the same loop; a checkpoint's
state and back (pdeflow/io/resume.py)."""
from __future__ import annotations

import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.base import State
from pdeflow.solvers.explicit import RK4, DormandPrince, Euler, Heun
from pdeflow.solvers.finite_volume import FiniteVolume, GridEvaluator
from pdeflow.solvers.jko import GridJKO, ParticleJKO
from pdeflow.solvers.loop import Frames, Loop, MaxSteps, Observer, Stationary, advance, frame_times
from pdeflow.solvers.sgd import SGD
from pdeflow.solvers.step_size import StepSizeController
from pdeflow.solvers.stiff import Rosenbrock
from pdeflow.solvers.unbalanced_jko import UnbalancedJKO
from pdeflow.solvers.wfr import WassersteinFisherRao

from conftest import build_config
from pdeflow import Problem
from pdeflow.analysis.dirac import stability
from pdeflow.analysis.finite_heads import chaos
from pdeflow.core.clock import TIME_RTOL, landed, same_time
from pdeflow.core.measure import Grid
from pdeflow.io.resume import checkpoint_of, state_of

pytestmark = pytest.mark.usefixtures("one_numba_thread", "one_blas_thread")

PARTICLES = {"init": {"n_particles": 5, "scale": 1.0, "seed": 3}}


class Recorder(Observer):
    """Every step the loop takes, every frame, and the stop checks it asked for."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float]] = []
        self.frames: list[tuple[int, float]] = []
        self.checks = 0

    def check(self, state: State) -> None:
        self.checks += 1

    def accept(self, step) -> None:
        if step.new is not step.old:
            self.steps.append((step.old.t, step.new.t))
        if step.frame is not None:
            self.frames.append((step.frame, step.new.t))


def particle_start(cfg) -> tuple[Problem, dict[str, np.ndarray]]:
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    return problem, {"omega": omega, "mass": mass}


# ---- the landing rule ----------------------------------------------------------------------------
def test_same_time_is_one_relative_tolerance():
    assert TIME_RTOL == 1e-12
    assert same_time(0.1 + 0.2, 0.3) and not same_time(0.3 + 2e-12, 0.3)
    assert same_time(1e6 + 5e-7, 1e6) and not same_time(1e6 + 2e-6, 1e6)    # relative above 1
    assert same_time(1e-13, 0.0) and not same_time(2e-12, 0.0)              # absolute below 1
    assert landed(0.30000000000000004, 0.3) == 0.3 and landed(0.29, 0.3) == 0.29
    assert list(same_time(np.array([0.3, 0.31]), 0.3)) == [True, False]


def test_steps_land_exactly_on_every_frame_and_on_the_final_time():
    """Targets that are no multiple of dt: the step before each is shortened, every frame is seen at its time
    exactly (no rounding), no step exceeds dt, and the last state is at the last time exactly."""
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    dt = 0.03
    times = np.array([0.0, 0.1, 0.25, 1.0 / 3.0, 0.7, 1.0])
    rec = Recorder()
    end, stop = advance(RK4(problem, dt=dt), State(0.0, 0, dt, fields), times, observers=[rec])
    assert stop.status == "finished"
    assert rec.frames == [(f, t) for f, t in enumerate(times)]          # exact equality of every frame time
    assert end.t == times[-1]
    lengths = np.array([b - a for a, b in rec.steps])
    assert np.all(lengths <= dt * (1 + 1e-15)) and np.all(lengths > 0)
    assert end.step == len(rec.steps) == 35     # ceil of each interval over dt: 4 + 5 + 3 + 13 + 10
    # a step ending within the tolerance of a frame lands on it: 0.1 = 0.03 * 3 + 0.01 takes 4 steps, not 5
    assert [t for _, t in rec.steps][:4][-1] == 0.1


def test_frames_at_or_before_the_start_are_passed_over_unless_included():
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    rec = Recorder()
    loop = Loop(RK4(problem, dt=0.1), [0.0, 0.5, 1.0], [rec])
    end, stop = loop.run(State(0.5, 0, 0.1, fields))                  # resume-like: starts on frame 1
    assert rec.frames == [(2, 1.0)] and end.t == 1.0 and stop.status == "finished"
    rec2 = Recorder()
    Loop(RK4(problem, dt=0.1), [0.0, 0.5], [rec2]).run(State(0.0, 0, 0.1, fields), include_start=True)
    assert rec2.frames == [(0, 0.0), (1, 0.5)]


def test_stop_reasons_hang_on_the_loop():
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    rec = Recorder()
    end, stop = Loop(RK4(problem, dt=0.1), [0.0, 5.0], [rec, MaxSteps(7)]).run(State(0.0, 0, 0.1, fields))
    assert stop.status == "max_steps" and end.step == 7 and rec.checks == 8
    end, stop = Loop(RK4(problem, dt=0.1), [0.0, 5.0], [Stationary(1e30)], measure=True).run(State(0.0, 0, 0.1, fields))
    assert stop.status == "stationary" and end.step == 1
    # far beyond Euler's stability limit the state overflows: the loop stops with the last finite state
    bad = {"omega": fields["omega"], "mass": fields["mass"]}
    end, stop = Loop(Euler(problem, dt=1e6), [0.0, 1e9]).run(State(0.0, 0, 1e6, bad))
    assert stop.status == "non_finite" and np.all(np.isfinite(end.fields["omega"]))
    assert "non-finite state at step" in stop.message


def test_frame_schedule_ends_exactly_at_t_end():
    def schedule(t_end, interval):
        return frame_times(build_config(run={"t_end": t_end, "frame_interval": interval}))

    times = schedule(1.0, 0.1)
    assert len(times) == 11 and times[-1] == 1.0                      # 10 * 0.1 = 1.0000000000000002 is t_end
    times = schedule(1.05, 0.1)
    assert len(times) == 12 and times[-1] == 1.05 and times[-2] == pytest.approx(1.0)
    times = schedule(0.3, 0.1)                                       # 0.3 / 0.1 = 2.9999999999999996
    assert len(times) == 4 and times[-1] == 0.3


# ---- steppers from parameters alone --------------------------------------------------------------
def same_steps(a, b, state: State, n: int = 3, dt_limit: float = np.inf) -> None:
    """``n`` steps of two steppers from the same state agree bit for bit (fields, time, next dt, columns)."""
    sa, sb = state, state
    for _ in range(n):
        (sa, ea), (sb, eb) = a.step(sa, dt_limit), b.step(sb, dt_limit)
        assert sa.t == sb.t and sa.dt == sb.dt and ea == eb
        for key in sa.fields:
            assert np.array_equal(sa.fields[key], sb.fields[key]), key


def test_particle_steppers_from_parameters_equal_the_configured_ones():
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    control = {"rtol": 1e-6, "atol": 1e-9, "dt_min": 1e-8, "dt_max": 1.0, "max_growth": 5.0}
    cases = [
        (Euler(problem, dt=0.05), {"method": "euler", "dt": 0.05}),
        (Heun(problem, dt=0.05), {"method": "heun", "dt": 0.05}),
        (RK4(problem, dt=0.05), {"method": "rk4", "dt": 0.05}),
        # the step-size controller an object passed in: the elementary one for Dormand-Prince, else PI
        (DormandPrince(problem, 0.05, controller=StepSizeController.elementary(**control)),
         {"method": "adaptive", "dt": 0.05, **control}),
        (WassersteinFisherRao(problem, 0.05, controller=StepSizeController.elementary(**control), alpha=1.0,
                              gamma=0.5, mass_floor=1e-12),
         {"method": "wfr", "dt": 0.05, "gamma": 0.5, **control}),
        (ParticleJKO(problem, tau=0.2, inner_tol=1e-9), {"method": "jko", "tau": 0.2, "inner_tol": 1e-9}),
        (SGD(problem, 0.05, batch_size=2, seed=11), {"method": "sgd", "dt": 0.05}),
        (Rosenbrock(problem, 0.05, controller=StepSizeController(**control), jacobian="exact", krylov_tol=0.01,
                    krylov_maxiter=200, deflate=2, deflate_every=3, stage_solve="auto"),
         {"method": "rosenbrock", "dt": 0.05, "krylov_maxiter": 200, "deflate": 2, "deflate_every": 3,
          "stage_solve": "auto", **control}),
    ]
    for stepper, solver in cases:
        configured = make_stepper(problem, cfg.replace(solver=solver, sgd={"batch_size": 2, "seed": 11}))
        assert type(configured) is type(stepper)
        start = stepper.initial_state(fields)
        assert start.dt == configured.initial_state().dt
        same_steps(stepper, configured, start)


def test_grid_steppers_from_parameters_equal_the_configured_ones():
    cfg = build_config(model={"coordinates": "gain2", "beta": 20.0}, init={"measure": "grid", "scale": 0.7},
                       grid={"n": 10, "radius": 3.0}, solver={"method": "fv"})
    problem = Problem.from_config(cfg)
    grid = Grid.from_config(cfg.grid, problem.k)
    cases = [
        (FiniteVolume(problem, grid, 0.2, scheme="upwind"), {"method": "fv", "dt": 0.2, "scheme": "upwind"}),
        (GridJKO(problem, grid, 0.5, epsilon=0.2), {"method": "jko", "dt": 0.5, "epsilon": 0.2}),
        (UnbalancedJKO(problem, grid, 0.2, alpha=1.0, gamma=1.0, dt=0.2, epsilon=0.3),
         {"method": "wfr_jko", "dt": 0.2, "gamma": 1.0, "epsilon": 0.3}),
    ]
    for stepper, solver in cases:
        configured = make_stepper(problem, cfg.replace(solver=solver))
        assert type(configured) is type(stepper)
        attrs, expected = stepper.frame_attrs(), configured.frame_attrs()
        assert attrs.keys() == expected.keys() and all(np.array_equal(attrs[k], expected[k]) for k in attrs)
        start = configured.initial_state()
        assert stepper.initial_state(dict(start.fields)).dt == start.dt
        same_steps(stepper, configured, start, n=2)


def test_grid_jko_evaluates_the_grid_without_a_finite_volume_stepper():
    """GridJKO holds the shared grid evaluation, which gives the finite-volume stepper's energy and dissipation."""
    cfg = build_config(model={"coordinates": "gain2", "beta": 20.0}, init={"measure": "grid", "scale": 0.7},
                       grid={"n": 10, "radius": 3.0}, solver={"method": "fv"})
    problem = Problem.from_config(cfg)
    jko = make_stepper(problem, cfg.replace(solver={"method": "jko"}))
    fv = make_stepper(problem, cfg.replace(solver={"method": "fv"}))
    assert isinstance(jko.evaluator, GridEvaluator) and not any(isinstance(v, FiniteVolume) for v in vars(jko).values())
    state = fv.initial_state()
    assert jko.diagnostics(State(0.0, 0, 1.0, dict(state.fields))) == fv.diagnostics(state)


def test_a_checkpoint_holds_the_state_and_gives_it_back():
    cfg = build_config(**PARTICLES, solver={"method": "sgd", "dt": 0.05}, sgd={"batch_size": 2})
    problem = Problem.from_config(cfg)
    stepper = make_stepper(problem, cfg)
    state, _ = stepper.step(stepper.initial_state(), 1.0)
    ck = checkpoint_of(state, {"stepper.x": np.array([1.5, 2.5])}, n_frames=3, n_steps=4)
    assert (ck.n_frames, ck.n_steps, list(ck.extra["stepper.x"])) == (3, 4, [1.5, 2.5])
    back = stepper.restore(state_of(ck), stepper.extra_state(state))
    assert (back.t, back.step, back.dt) == (state.t, state.step, state.dt)
    same_steps(stepper, stepper, back)      # the generator continues: the same draws from either copy
    a, _ = stepper.step(back, 1.0)
    b, _ = stepper.step(state, 1.0)
    assert np.array_equal(a.fields["omega"], b.fields["omega"])


# ---- the callers share it ------------------------------------------------------------------------
@pytest.fixture
def loop_spy(monkeypatch):
    """Every Loop.run gets a Recorder appended: the runs and what they saw."""
    runs: list[Recorder] = []
    original = Loop.run

    def run(self, state, include_start=False):
        rec = Recorder()
        runs.append(rec)
        self.observers.append(rec)
        return original(self, state, include_start)

    monkeypatch.setattr(Loop, "run", run)
    return runs


def test_stability_simulation_goes_through_the_loop(loop_spy):
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    times = np.linspace(0.0, 0.5, 11)
    omega = stability.simulate(problem, fields["omega"], fields["mass"], times, 0.013)
    (rec,) = loop_spy
    assert [f for f, _ in rec.frames] == list(range(11)) and [t for _, t in rec.frames] == list(times)
    assert len(rec.steps) == 10 * 4                                   # 0.05 = 3 * 0.013 + 0.011 per interval
    # the frames returned are the loop's: the same as stepping RK4 by hand to each time
    state = State(0.0, 0, 0.013, dict(fields))
    stepper = RK4(problem, dt=0.013)
    for f, t in enumerate(times[1:], start=1):
        while state.t < t:
            state, _ = stepper.step(state, t - state.t)
            state.t = landed(state.t, t)
        assert np.array_equal(omega[f], state.fields["omega"])


def test_chaos_trajectories_go_through_the_loop(loop_spy):
    cfg = build_config(**PARTICLES, solver={"method": "rk4", "dt": 0.05},
                       run={"t_end": 0.3, "frame_interval": 0.1})
    problem, fields = particle_start(cfg)
    times = frame_times(cfg)
    seen = []
    ref, tracers, end = chaos.characteristics(make_stepper(problem, cfg), fields["omega"], fields["mass"],
                                              fields["omega"][:2], times, 0.05, on_frame=lambda f, s: seen.append(f))
    (rec,) = loop_spy
    assert seen == [0, 1, 2, 3] and [t for _, t in rec.frames] == list(times) and end.t == times[-1]
    assert len(rec.steps) == 6 and end.step == 6


def test_a_failed_chaos_step_is_a_chaos_error_naming_the_stop():
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    with pytest.raises(chaos.ChaosError, match="non-finite state"):
        chaos._trajectory(Euler(problem, dt=1e6), fields["omega"], fields["mass"], np.array([0.0, 1e9]), 1e6)


def test_frames_observer_sees_the_start_and_every_target():
    cfg = build_config(**PARTICLES)
    problem, fields = particle_start(cfg)
    seen = []
    Loop(RK4(problem, dt=0.1), [0.0, 0.2], [Frames(lambda f, s: seen.append((f, s.t)))]).run(
        State(0.0, 0, 0.1, fields), include_start=True)
    assert seen == [(0, 0.0), (1, 0.2)]
