"""The Runge-Kutta-Chebyshev stepper (solvers/chebyshev.py, ``rkc``): its stability polynomial, order, the
energy identity, stability far above the explicit bound, its radius estimate, exact resume and its failure path."""
from __future__ import annotations

import numpy as np
import pytest
from numpy.polynomial import chebyshev as cheb
from pdeflow.solvers import make_stepper
from pdeflow.solvers.base import State
from pdeflow.solvers.chebyshev import MAX_STAGES, RADIUS_SAFETY, chebyshev, rkc_step, stages_for

from pdeflow.core.system_jacobian import SystemJacobian
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from test_stiff import build, energy_identity_residual_simpson, integrate, resumed_run_matches, write_config

# fixed steps: a tolerance no step fails, dt_max = dt
FIXED = {"rtol": 1.0, "atol": 1.0}


def fixed(dt: float, **solver) -> dict:
    return {"method": "rkc", "dt": dt, "dt_max": dt, **FIXED, **solver}


def amplification(s: int, z: complex) -> complex:
    """What one s-stage step of size 1 does to y' = z y, y(0) = 1."""
    return complex(rkc_step(lambda y: z * y, np.array([1.0 + 0j]), np.array([z + 0j]), 1.0, s)[0])


# ---- the method's coefficients --------------------------------------------------------------------

@pytest.mark.parametrize("s", [2, 3, 5, 10, 40, 300])
def test_stability_polynomial_is_second_order_and_damped_on_its_interval(s):
    """The step is R_s(z) = a_s + b_s T_s(w0 + w1 z) (a_s = 1 - b_s T_s(w0)), R_s(z) = 1 + z + z^2/2 + O(z^3),
    and |R_s| <= 1 on [-beta(s), 0], beta(s) = (1 + w0)/w1 ~ 0.65 s^2 (damping 2/13)."""
    c = chebyshev(s)
    a_s = 1.0 - c.b[s] * c.T[s]
    unit = np.zeros(s + 1)
    unit[s] = 1.0
    for z in (-0.3, -1.0, -0.5 * c.beta, 0.1):
        assert abs(amplification(s, z) - (a_s + c.b[s] * cheb.chebval(c.w0 + c.w1 * z, unit))) < 1e-10
    defects = [abs(amplification(s, z) - (1 + z + z * z / 2)) for z in (-1e-2, -5e-3)]
    if s == 2:  # a polynomial of degree 2: exactly the Taylor one
        assert max(defects) < 1e-15
    else:
        assert abs(np.log2(defects[0] / defects[1]) - 3) < 0.1
    # the step acts on each component alone: one step of 4001 components gives R_s at 4001 points of the interval
    zs = -np.linspace(0.0, c.beta, 4001)
    assert np.max(np.abs(rkc_step(lambda y: zs * y, np.ones(zs.size), zs.copy(), 1.0, s))) <= 1.0 + 1e-9
    if s >= 10:
        assert 0.6 < c.beta / s ** 2 < 0.67


def test_stages_for_is_the_fewest_stable_stages():
    for h_rho in (0.1, 2.0, 7.3, 65.0, 1e3, 1e5, chebyshev(MAX_STAGES).beta):
        s = stages_for(h_rho)
        assert chebyshev(s).beta >= h_rho
        assert s == 2 or chebyshev(s - 1).beta < h_rho
    assert stages_for(1.01 * chebyshev(MAX_STAGES).beta) == MAX_STAGES + 1


# ---- order and the energy identity ------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    cfg, problem = build()
    ref, _, _, _ = integrate(cfg, problem, 1.0, method="adaptive", dt=0.01, rtol=1e-12, atol=1e-14)
    return cfg, problem, ref


def test_step_halving_gives_order_two(reference):
    """Order 2 under step halving against a tight Dormand-Prince run, the stage count held fixed (``s`` enters
    the error constant)."""
    cfg, problem, ref = reference
    errors = []
    for dt in (0.1, 0.05, 0.025):
        final, states, _, totals = integrate(cfg, problem, 1.0, **fixed(dt))
        assert totals["stages"] == 2 * (len(states) - 1)
        errors.append(np.sqrt(np.mean((final.fields["omega"] - ref.fields["omega"]) ** 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 2) < 0.2), (errors, orders)


@pytest.mark.parametrize("s", [5, 9])
def test_order_two_with_many_chebyshev_stages(reference, s):
    """The s-stage step (s >= 5: a Chebyshev polynomial, not the degree-2 Taylor one of s = 2) on the particle flow,
    the stage count held fixed: order 2 under step halving against a tight Dormand-Prince run."""
    cfg, problem, ref = reference
    stepper = make_stepper(problem, cfg)
    start = stepper.initial_state()
    mass = start.fields["mass"]

    def velocity(y: np.ndarray) -> np.ndarray:
        return -problem.grad_phi(y, y, mass)

    errors = []
    for n in (10, 20, 40):
        y, h = start.fields["omega"].copy(), 1.0 / n
        for _ in range(n):
            y = rkc_step(velocity, y, velocity(y), h, s)
        errors.append(np.sqrt(np.mean((y - ref.fields["omega"]) ** 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 2) < 0.2), (errors, orders)


def test_adaptive_steps_follow_the_tolerance(reference):
    """The tolerance bounds the local error of a step; the global error at t = 1 stays within 10 x rtol and
    falls with it."""
    cfg, problem, ref = reference
    scale = np.max(np.abs(ref.fields["omega"]))
    counts, errors = [], []
    for rtol in (1e-4, 1e-6):
        final, states, _, _ = integrate(cfg, problem, 1.0, method="rkc", dt=0.05, rtol=rtol, atol=rtol * 1e-3)
        errors.append(np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale)
        assert errors[-1] < 10 * rtol
        counts.append(len(states))
    assert counts[1] > counts[0] and errors[1] < errors[0] / 10


def test_energy_identity_residual_shrinks_at_order_two():
    cfg, problem = build()
    residuals = []
    for dt in (0.025, 0.0125, 0.00625):
        _, states, stepper, _ = integrate(cfg, problem, 0.4, **fixed(dt))
        residuals.append(energy_identity_residual_simpson(states, stepper))
    orders = np.log2(np.array(residuals[:-1]) / np.array(residuals[1:]))
    assert np.all(np.abs(orders - 2) < 0.25), (residuals, orders)


# ---- stiffness and the radius estimate ------------------------------------------------------------------

def test_stiff_problem_far_above_the_explicit_bound():
    """Weight decay lam = 3e3 on the risk (eigenvalues about -3e3), from t0 = 20 / lam (after the transient) to
    t0 + 1: Dormand-Prince is held at lam h <= 3.3, rkc takes steps far above it with ~sqrt(lam h) stages each,
    > 10x fewer gradient evaluations, the same answer to the tolerance."""
    lam = 3e3
    cfg, problem = build(f"model.weight_decay={lam}")
    t0 = 20.0 / lam
    start, _, _, _ = integrate(cfg, problem, t0, method="adaptive", dt=1e-5, rtol=1e-10, atol=1e-13)
    tol = {"rtol": 1e-6, "atol": 1e-9, "dt": 1e-4}
    stepper = make_stepper(problem, cfg.replace(solver={"method": "rkc", **tol}))
    rkc, margins = State(t=t0, step=0, dt=tol["dt"], fields=dict(start.fields)), []
    mark = problem.mark()
    while t0 + 1.0 - rkc.t > 1e-12:
        rkc, extra = stepper.step(rkc, t0 + 1.0 - rkc.t)
        margins.append(extra["stability_margin"])
    spent = problem.since(mark)  # rkc's calls as the Problem counted them: grad Phi and difference products
    explicit, _, _, _ = integrate(cfg, problem, t0 + 1.0, start, method="adaptive", **tol)
    assert explicit.step >= 0.5 * lam / 3.3
    assert rkc.dt > 30 * 3.3 / lam  # steps far above the explicit bound
    assert 6 * explicit.step > 10 * (spent["gradient"] + spent["jvp_difference"])
    assert max(margins) <= 1 / RADIUS_SAFETY + 1e-12  # h rho <= beta(s) / 1.2 on every step
    scale = np.max(np.abs(explicit.fields["omega"]))
    assert np.max(np.abs(rkc.fields["omega"] - explicit.fields["omega"])) < 1e-5 * scale + 1e-8


def true_top(problem, state) -> float:
    """The largest eigenvalue of the mass-weighted particle Jacobian at a state by Lanczos (ARPACK, tolerance 1e-8)
    on exact forward-mode products: independent of the stepper's Ritz estimate on difference products."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    omega, mass = state.fields["omega"], state.fields["mass"]
    apply = SystemJacobian(problem, omega, mass, problem.grad_phi(omega, omega, mass), "exact").apply
    op = LinearOperator((omega.size, omega.size), matvec=apply, dtype=float)
    return float(eigsh(op, k=1, which="LA", tol=1e-8, v0=np.ones(omega.size))[0][0])


@pytest.mark.parametrize("stiff", [True, False])
def test_true_stability_margin_of_every_step(stiff):
    """``h lambda_max / beta(s)`` with lambda_max of the Jacobian at the step's start by Lanczos (not the stepper's
    own radius, which is reused for up to solver.radius_every steps): at most 1 on every accepted step, i.e. every
    step inside the stability interval of its polynomial. The stiff problem of the test above (lam = 3e3, 24 steps,
    measured at most 0.82) and the small one from t = 0 to 2 while its spectrum moves (measured at most 0.42, the
    true lambda_max up to 1.05 x the stepper's estimate)."""
    if stiff:
        lam = 3e3
        cfg, problem = build(f"model.weight_decay={lam}")
        t0 = 20.0 / lam
        start, _, _, _ = integrate(cfg, problem, t0, method="adaptive", dt=1e-5, rtol=1e-10, atol=1e-13)
        tol, t1 = {"rtol": 1e-6, "atol": 1e-9, "dt": 1e-4}, t0 + 0.3
    else:
        cfg, problem = build()
        start, tol, t1 = make_stepper(problem, cfg).initial_state(), {"rtol": 1e-4, "atol": 1e-7, "dt": 0.05}, 2.0
    stepper = make_stepper(problem, cfg.replace(solver={"method": "rkc", **tol}))
    state = State(t=start.t, step=0, dt=tol["dt"], fields=dict(start.fields))
    margins = []
    while t1 - state.t > 1e-12:
        new, extra = stepper.step(state, t1 - state.t)
        margins.append((new.t - state.t) * true_top(problem, state) / chebyshev(int(extra["stages"])).beta)
        state = new
    assert len(margins) > 10 and max(margins) <= 1.0, max(margins)
    if stiff:
        assert max(margins) > 0.5  # the steps do use the interval


def test_radius_estimate_against_the_dense_spectrum():
    """The warm Rayleigh-Ritz estimate on difference products is a lower bound of the largest eigenvalue of the
    dense mass-weighted Jacobian, within 1 % of it, and the cold one within 5 %."""
    cfg, problem = build()
    final, _, stepper, _ = integrate(cfg, problem, 1.0, **fixed(0.05))
    omega, mass = final.fields["omega"], final.fields["mass"]
    apply = SystemJacobian(problem, omega, mass, problem.grad_phi(omega, omega, mass)).apply
    dense = np.column_stack([apply(e) for e in np.eye(omega.size)])
    top = np.linalg.eigvalsh(0.5 * (dense + dense.T))[-1]
    plan = stepper._new_plan(final)
    cold, vector = stepper._radius(final, None, plan)
    warm, _ = stepper._radius(final, vector, plan)
    assert cold <= top * (1 + 1e-6) and cold > 0.95 * top
    assert cold - 1e-6 * top <= warm <= top * (1 + 1e-6) and warm > 0.99 * top


# ---- files: resume and failure ------------------------------------------------------------------

def test_resume_is_bit_exact(tmp_path):
    """Resume after run.max_steps repeats the uninterrupted run bit for bit: the radius estimate, its vector and
    age, dI/dt and the PI controller's memory are in the checkpoint."""
    a = resumed_run_matches(tmp_path, ["--set", "solver.method=\"rkc\"", "--set", "solver.radius_every=3",
                                       "--set", "solver.rtol=1e-6"])
    assert a.attrs["steps"] > 10
    assert np.all(a.steps["stages"][1:] >= 2) and np.all(a.steps["spectral_radius"][1:] > 0)


def test_step_below_dt_min_exits_3_and_keeps_the_frames(tmp_path, capsys):
    cfg = write_config(tmp_path)
    out = tmp_path / "fail.h5"
    code = main(["run", str(cfg), "-o", str(out), "--quiet", "--set", "solver.method=\"rkc\"",
                 "--set", "solver.rtol=1e-13", "--set", "solver.atol=1e-16", "--set", "solver.dt_min=1e-3"])
    assert code == 3
    err = capsys.readouterr().err
    assert "dt_min" in err and "Traceback" not in err
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "error"
    assert len(traj.time) >= 1 and traj.time[0] == 0.0
