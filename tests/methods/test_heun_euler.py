"""heun-euler, the Heun-Euler 2(1) pair, added as its module and this test alone (the stepper contract,
solvers/base.py): one step is Heun's with Euler's difference as the estimate, step halving shows order 2, the
step count follows the estimate's order (error order 1), the error control meets its tolerance, a resumed run
repeats the whole one bit for bit, and the run's cost is two grad Phi evaluations per attempt through the one
gradient-equivalent formula."""
from __future__ import annotations

import numpy as np
from pdeflow.solvers import METHODS, make_stepper

from pdeflow.core.problem import gradient_equivalents
from test_explicit import build, integrate
from test_stiff import resumed_run_matches

FIXED = {"rtol": 1.0, "atol": 1.0}  # no step fails: with dt_max = dt the steps are fixed


def test_one_step_is_heuns_and_the_estimate_is_eulers_difference():
    """Against the formulas written out on the particle ODE f = -grad Phi."""
    cfg, problem = build()
    h = 0.1
    stepper = make_stepper(problem, cfg.replace(solver={"method": "heun-euler", "dt": h, **FIXED}))
    state = stepper.initial_state()
    omega, mass = state.fields["omega"], state.fields["mass"]

    def f(x: np.ndarray) -> np.ndarray:
        return -problem.grad_phi(x, x, mass)
    k1 = f(omega)
    k2 = f(omega + h * k1)
    new, extra = stepper.step(state, 1.0)
    assert extra["rejected"] == 0 and new.t == h
    y_new = omega + h * (k1 + k2) / 2
    np.testing.assert_allclose(new.fields["omega"], y_new, rtol=1e-13, atol=1e-15)
    # the error the controller sees is the norm of Heun's solution minus Euler's, h (k2 - k1) / 2
    _, _, err = stepper._step_impl(state, h, {})
    expected = stepper.error_norm(h * (k2 - k1) / 2, omega, y_new)
    assert err > 0 and abs(err - expected) <= 1e-10 * expected
    assert METHODS["heun-euler"].explicit and "rtol" in METHODS["heun-euler"].reads


def test_step_halving_gives_order_two():
    cfg, problem = build()
    ref, _, _ = integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)
    errors = []
    for dt in (0.1, 0.05, 0.025):
        final, states, _ = integrate(cfg, problem, 1.0, method="heun-euler", dt=dt, dt_max=dt, **FIXED)
        assert len(states) == round(1.0 / dt) + 1
        errors.append(np.sqrt(np.mean((final.fields["omega"] - ref.fields["omega"]) ** 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 2) < 0.3), orders


def test_adaptive_steps_meet_the_tolerance_at_the_error_orders_rate():
    """err ~ h^2: a 100x tighter tolerance takes about 100^(1/2) = 10x the steps (1/3 of that would be an
    estimate of order 2 taken for the exponent, 100^(1/3) = 4.6x)."""
    cfg, problem = build()
    ref, _, _ = integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)
    steps = []
    for rtol in (1e-3, 1e-5):
        final, states, _ = integrate(cfg, problem, 1.0, method="heun-euler", dt=0.1, rtol=rtol, atol=rtol * 1e-3)
        error = np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / np.max(np.abs(ref.fields["omega"]))
        assert error < 10 * rtol, (rtol, error)
        steps.append(len(states))
    assert 6 * steps[0] < steps[1] < 16 * steps[0], steps


def test_resume_is_bit_exact_and_the_cost_is_two_evaluations_an_attempt(tmp_path):
    """pdeflow run end to end: stopped at run.max_steps and resumed, the file is the whole run's bit for bit; every
    /steps row costs two grad Phi evaluations per attempt, no products, and the run's gradient equivalents are the
    one formula's."""
    a = resumed_run_matches(tmp_path, ["--set", "solver.method=\"heun-euler\"", "--set", "solver.rtol=1e-4"])
    assert "stepper.err" in a.checkpoint.extra  # the PI controller's memory
    s = a.steps
    attempts = 1 + s["rejected"][1:]
    np.testing.assert_array_equal(s["gradient_evals"][1:], 2 * attempts)
    assert np.all(s["jvps_exact"][1:] == 0) and np.all(s["jvps_difference"][1:] == 0)
    total = {"gradient": float(np.sum(s["gradient_evals"][1:])), "jvp_exact": 0.0, "jvp_difference": 0.0}
    assert gradient_equivalents(total) == 2 * float(np.sum(attempts))
    assert a.attrs["accuracy"].startswith("held"), a.attrs["accuracy"]
