"""bs23, the Bogacki-Shampine 3(2) pair: one step is scipy's RK23 step, step halving shows order 3, the error control
meets its tolerance, a resumed run repeats the whole one bit for bit (the PI controller's memory in the checkpoint),
and a run's accuracy record holds (the energy-identity defect of its stage quadrature falls at the order)."""
from __future__ import annotations

import numpy as np
from pdeflow.solvers import make_stepper
from pdeflow.solvers.accuracy import identity_defect
from scipy.integrate import RK23

from test_explicit import build, integrate
from test_stiff import resumed_run_matches

FIXED = {"rtol": 1.0, "atol": 1.0}  # no step fails: with dt_max = dt the steps are fixed


def test_one_step_is_scipys_rk23():
    """The same tableau, step and first-same-as-last stage as scipy.integrate.RK23 on the particle ODE."""
    cfg, problem = build()
    stepper = make_stepper(problem, cfg.replace(solver={"method": "bs23", "dt": 0.1, **FIXED}))
    state = stepper.initial_state()
    omega, mass = state.fields["omega"], state.fields["mass"]
    new, extra = stepper.step(state, 1.0)
    assert extra["rejected"] == 0 and new.t == 0.1

    def f(t: float, y: np.ndarray) -> np.ndarray:
        x = y.reshape(omega.shape)
        return -problem.grad_phi(x, x, mass).ravel()
    rk23 = RK23(f, 0.0, omega.ravel(), t_bound=1.0, first_step=0.1, **FIXED)
    rk23.step()
    assert rk23.t == 0.1
    np.testing.assert_allclose(new.fields["omega"].ravel(), rk23.y, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(-stepper.evaluate(new).grad_phi.ravel(), rk23.f, rtol=1e-12, atol=1e-14)


def test_step_halving_gives_order_three():
    cfg, problem = build()
    ref, _, _ = integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)
    errors = []
    for dt in (0.1, 0.05, 0.025):
        final, states, _ = integrate(cfg, problem, 1.0, method="bs23", dt=dt, dt_max=dt, **FIXED)
        assert len(states) == round(1.0 / dt) + 1
        errors.append(np.sqrt(np.mean((final.fields["omega"] - ref.fields["omega"]) ** 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 3) < 0.3), orders


def test_adaptive_steps_meet_the_tolerance():
    cfg, problem = build()
    ref, _, _ = integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)
    steps = []
    for rtol in (1e-4, 1e-6):
        final, states, _ = integrate(cfg, problem, 1.0, method="bs23", dt=0.1, rtol=rtol, atol=rtol * 1e-3)
        error = np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / np.max(np.abs(ref.fields["omega"]))
        assert error < 10 * rtol, (rtol, error)
        steps.append(len(states))
    assert steps[1] > 4 * steps[0]  # err ~ h^3: 100x tighter is about 100^(1/3) = 4.6x the steps


def test_energy_identity_defect_falls_at_order_three():
    """The step's stage quadrature h sum_i b_i I(Y_i) is the method on z' = -I: |dE + Q| / |dE| = O(h^3)."""
    cfg, problem = build()
    defects = []
    for h in (0.08, 0.04, 0.02):
        stepper = make_stepper(problem, cfg.replace(solver={"method": "bs23", "dt": h, "dt_max": h, **FIXED}))
        state = stepper.initial_state()
        d0 = stepper.diagnostics(state)
        new, _ = stepper.step(state, np.inf)
        d1 = stepper.diagnostics(new)
        defects.append(identity_defect(d0["energy"], d1["energy"], stepper.dissipation_integral(state, new, d0, d1),
                                       float(np.finfo(float).eps)))
    orders = np.log2(np.array(defects[:-1]) / np.array(defects[1:]))
    assert np.all(orders > 2.6), (defects, orders)


def test_resume_is_bit_exact_and_the_accuracy_record_holds(tmp_path):
    """pdeflow run end to end: stopped at run.max_steps and resumed, the file is the whole run's bit for bit; its
    accuracy record has every step's identity defect, all far below run.identity_tol."""
    a = resumed_run_matches(tmp_path, ["--set", "solver.method=\"bs23\"", "--set", "solver.rtol=1e-5"])
    assert "stepper.err" in a.checkpoint.extra  # the PI controller's memory
    defects = a.steps["identity_defect"][1:]
    assert len(defects) > 7 and np.all(np.isfinite(defects)) and np.max(defects) < 0.05
    assert a.attrs["accuracy"].startswith("held"), a.attrs["accuracy"]
