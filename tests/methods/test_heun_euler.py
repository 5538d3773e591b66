"""heun_euler, the Heun-Euler 2(1) pair: one step is Heun's method and its error estimate the distance to the Euler
step (both computed here from grad Phi), step halving shows order 2 against an RK4 reference and the estimate order
2 (the controller's exponent 1/2), the error control meets its tolerance, and ``pdeflow run`` stopped and resumed
repeats the whole run bit for bit, with its cost in gradient equivalents through the one formula: the tableau's two
evaluations per attempt."""
from __future__ import annotations

import numpy as np
import pytest
from pdeflow.solvers import make_stepper

from pdeflow.analysis.convergence.spectral import run_gradient_equivalents
from test_explicit import build, integrate
from test_stiff import resumed_run_matches

FIXED = {"rtol": 1.0, "atol": 1.0}  # no step fails: with dt_max = dt the steps are fixed


@pytest.fixture(scope="module")
def small():
    """The small problem and its flow at t = 1 by RK4 at a step 40x below the finest compared here."""
    cfg, problem = build()
    return cfg, problem, integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)[0].fields["omega"]


def test_one_step_is_heuns_and_its_estimate_the_distance_to_euler(small):
    cfg, problem, _ = small
    rtol, atol, h = 1e-6, 1e-9, 0.1
    stepper = make_stepper(problem, cfg.replace(solver={"method": "heun_euler", "dt": h, "rtol": rtol, "atol": atol}))
    state = stepper.initial_state()
    y, mass = state.fields["omega"], state.fields["mass"]

    def f(x: np.ndarray) -> np.ndarray:
        return -problem.grad_phi(x, x, mass)
    euler = y + h * f(y)
    heun = y + 0.5 * h * (f(y) + f(euler))
    new, taken, err = stepper._step_impl(state, h, stepper._begin_step(state, {}), {})
    assert taken == h
    np.testing.assert_allclose(new.fields["omega"], heun, rtol=1e-13, atol=1e-15)
    scale = atol + rtol * np.maximum(np.abs(y), np.abs(heun))
    np.testing.assert_allclose(err, np.sqrt(np.mean(((heun - euler) / scale) ** 2)), rtol=1e-10)


def test_step_halving_gives_order_two_and_the_estimate_order_two(small):
    """The global error at t = 1 over fixed steps against RK4 at a 40x finer step falls as h^2; one step's error
    estimate falls as h^(error_order + 1) = h^2, the power the controller's exponent 1/2 assumes."""
    cfg, problem, ref = small
    errors, estimates = [], []
    for dt in (0.1, 0.05, 0.025):
        final, states, stepper = integrate(cfg, problem, 1.0, method="heun_euler", dt=dt, dt_max=dt, **FIXED)
        assert len(states) == round(1.0 / dt) + 1
        errors.append(np.sqrt(np.mean((final.fields["omega"] - ref) ** 2)))
        start = stepper.initial_state()
        estimates.append(stepper._step_impl(start, dt, stepper._begin_step(start, {}), {})[2])
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 2) < 0.3), orders
    slopes = np.log2(np.array(estimates[:-1]) / np.array(estimates[1:]))
    assert np.all(np.abs(slopes - 2) < 0.3), slopes
    assert stepper.exponent == 2 and stepper.order == 2


def test_adaptive_steps_meet_the_tolerance(small):
    cfg, problem, ref = small
    steps = []
    for rtol in (1e-3, 1e-4):
        final, states, _ = integrate(cfg, problem, 1.0, method="heun_euler", dt=0.1, rtol=rtol, atol=rtol * 1e-3)
        error = np.max(np.abs(final.fields["omega"] - ref)) / np.max(np.abs(ref))
        assert error < 10 * rtol, (rtol, error)
        steps.append(len(states))
    assert 2.5 * steps[0] < steps[1] < 4 * steps[0]  # err ~ h^2: 10x tighter is about 10^(1/2) = 3.2x the steps


def test_resume_is_bit_exact_and_the_cost_is_two_evaluations_per_attempt(tmp_path):
    """pdeflow run end to end: stopped at run.max_steps and resumed, the file is the whole run's bit for bit (the PI
    controller's memory in the checkpoint); its accuracy record holds; its gradient equivalents, read from the cost
    columns through the one formula, are the tableau's two new evaluations per attempted step (rejected ones
    included), no products."""
    a = resumed_run_matches(tmp_path, ["--set", "solver.method=\"heun_euler\"", "--set", "solver.rtol=1e-4"])
    assert "stepper.err" in a.checkpoint.extra
    steps = a.steps
    attempts = len(steps["time"]) - 1 + float(np.sum(steps["rejected"][1:]))
    assert np.sum(steps["rejected"][1:]) > 0  # the count covers rejected attempts too
    assert np.isnan(steps["gradient_evals"][0])  # row 0 is t = 0: no step, no cost
    assert run_gradient_equivalents(steps) == 2 * attempts
    assert np.all(steps["jvps_exact"][1:] == 0) and np.all(steps["jvps_difference"][1:] == 0)
    assert a.attrs["accuracy"].startswith("held"), a.attrs["accuracy"]
