"""The stiff stepper (solvers/stiff.py, ROS34PW2): its coefficients, order, stability on stiff problems,
the energy identity, exact resume and its failure path."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.base import State, hermite
from pdeflow.solvers.stiff import (
    EXPLICIT_BOUND,
    ORDER,
    SAFETY,
    explicit_stability_function,
    stability_function,
)

from pdeflow import Problem, loads_config
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from test_explicit import SMALL as EXPLICIT_SMALL

# the small problem of the explicit steppers' tests, stepped by rosenbrock
SMALL = EXPLICIT_SMALL.replace('method = "rk4"', 'method = "rosenbrock"')

# fixed steps: a tolerance no step fails, dt_max = dt, and stage solves far below the step error
FIXED = {"rtol": 1.0, "atol": 1.0, "krylov_tol": 1e-14}


def build(*overrides: str):
    cfg = loads_config(SMALL, list(overrides))
    return cfg, Problem.from_config(cfg)


def integrate(cfg, problem, t_end: float, start=None, **solver):
    """Advance to t_end (from ``start``, default the initial state) without files; returns the final state,
    all states, the stepper and the summed /steps columns (the stepper's and, as the loop adds them, the cost
    columns the Problem counted: ``gradient_evals``, ``jvps_exact``, ``jvps_difference``)."""
    cfg = cfg.replace(solver=solver) if solver else cfg
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    if start is not None:
        state = State(t=start.t, step=0, dt=cfg.solver.dt, fields=dict(start.fields))
    states, totals = [state], {}
    while t_end - state.t > 1e-12:
        mark = stepper.cost_mark()
        state, extra = stepper.step(state, t_end - state.t)
        extra = {**extra, **stepper.cost_since(mark)}
        states.append(state)
        for key, value in extra.items():
            totals[key] = totals.get(key, 0.0) + value
    return state, states, stepper, totals


def fixed(dt: float, **solver) -> dict:
    return {"method": "rosenbrock", "dt": dt, "dt_max": dt, **FIXED, **solver}


# ---- the method's coefficients --------------------------------------------------------------------

def test_stability_function_is_third_order_and_l_stable():
    # R(z) - e^z = C z^4 + ...: halving z divides the defect by 16
    defects = [abs(stability_function(z) - np.exp(z)) for z in (-0.02, -0.01)]
    assert abs(np.log2(defects[0] / defects[1]) - (ORDER + 1)) < 0.05
    # L-stable: |R| <= 1 on the left half plane (sampled on the imaginary axis and the negative real axis),
    # R(-inf) = 0
    for y in np.geomspace(1e-3, 1e6, 60):
        assert abs(stability_function(1j * y)) <= 1 + 1e-12
        assert abs(stability_function(-y)) <= 1 + 1e-12
    assert abs(stability_function(-1e12)) < 1e-10


def test_one_step_on_weight_decay_alone_is_the_stability_function():
    """Zero unembedding: the risk is constant, y' = -lam y, J = -lam I exactly; one step multiplies y by
    R(-lam h) even for lam h = 1e4, where an explicit step would blow up."""
    lam = 100.0
    cfg, problem = build("model.unembedding=\"zero\"", f"model.weight_decay={lam}")
    for h in (0.01, 1.0, 100.0):
        stepper = make_stepper(problem, cfg.replace(solver=fixed(h)))
        state = stepper.initial_state()
        new, extra = stepper.step(state, h)
        expected = stability_function(-lam * h).real * state.fields["omega"]
        np.testing.assert_allclose(new.fields["omega"], expected, rtol=1e-10, atol=1e-14)
        assert extra["failed_solves"] == 0 and extra["rejected"] == 0


# ---- order --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    cfg, problem = build()
    ref, _, _, _ = integrate(cfg, problem, 1.0, method="adaptive", dt=0.01, rtol=1e-12, atol=1e-14)
    return cfg, problem, ref


@pytest.mark.parametrize("jacobian", ["exact", "difference"])
def test_step_halving_gives_order_three(reference, jacobian):
    """Order 3 under step halving against a tight Dormand-Prince run, with the exact Jacobian and with a
    difference Jacobian (a W-method keeps its order with an approximate one)."""
    cfg, problem, ref = reference
    errors = []
    for dt in (0.1, 0.05, 0.025):
        final, _, _, _ = integrate(cfg, problem, 1.0, **fixed(dt, jacobian=jacobian))
        errors.append(np.sqrt(np.mean((final.fields["omega"] - ref.fields["omega"]) ** 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - ORDER) < 0.35), (errors, orders)


def test_adaptive_steps_meet_the_tolerance(reference):
    cfg, problem, ref = reference
    scale = np.max(np.abs(ref.fields["omega"]))
    counts = []
    for rtol in (1e-4, 1e-6):
        final, states, _, _ = integrate(cfg, problem, 1.0, method="rosenbrock", dt=0.05, rtol=rtol, atol=rtol * 1e-3)
        assert np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale < rtol
        counts.append(len(states))
    assert counts[1] > counts[0]


def test_loose_tolerances_still_solve_the_stage_systems(reference):
    """rtol = atol = 1 with the default solver.krylov_tol: the stage solves' target would exceed |b| (a zero U, a
    zero error estimate: steps of 0.05 left E at E(0) exactly); each solve still reaches a tenth of |b|, so the
    steps follow the flow: E(1) within 1 % of the energy drop of a tight Dormand-Prince run (measured 0.07 %)."""
    cfg, problem, ref = reference
    final, states, stepper, totals = integrate(cfg, problem, 1.0, method="rosenbrock", dt=0.05, dt_max=0.05, rtol=1.0,
                                               atol=1.0)
    e0, e_ref, e_loose = (stepper.diagnostics(s)["energy"] for s in (states[0], ref, final))
    assert totals["krylov_iters"] > 0
    assert abs(e_loose - e_ref) < 1e-2 * (e0 - e_ref), (e0, e_ref, e_loose)


def energy_identity_residual_simpson(states, stepper) -> float:
    """|E(T) - E(0) + int_0^T I dt| / |E(0)|, the integral by Simpson's rule on equal steps (order 4, so
    the residual shows the method's error, not the quadrature's)."""
    t = np.array([s.t for s in states])
    diag = [stepper.diagnostics(s) for s in states]
    e = np.array([d["energy"] for d in diag])
    i = np.array([d["dissipation"] for d in diag])
    h = np.diff(t)
    assert np.allclose(h, h[0]) and len(h) % 2 == 0
    integral = h[0] / 3 * (i[0] + i[-1] + 4 * i[1:-1:2].sum() + 2 * i[2:-1:2].sum())
    return abs(e[-1] - e[0] + integral) / abs(e[0])


def test_energy_identity_residual_shrinks_at_order_three():
    """Most of the residual accrues in the initial transient; the order shows from dt ~ 0.0125 on."""
    cfg, problem = build()
    residuals = []
    for dt in (0.0125, 0.00625, 0.003125):
        _, states, stepper, _ = integrate(cfg, problem, 0.4, **fixed(dt))
        residuals.append(energy_identity_residual_simpson(states, stepper))
    orders = np.log2(np.array(residuals[:-1]) / np.array(residuals[1:]))
    assert np.all(np.abs(orders - ORDER) < 0.25), (residuals, orders)


# ---- stiffness ----------------------------------------------------------------------------------

def test_stiff_problem_far_above_the_explicit_bound():
    """Weight decay lam = 3e3 on the risk: the Jacobian's eigenvalues are about -3e3. From t0 = 20 / lam (the
    initial transient, which both methods must resolve, is over) to t0 + 1, Dormand-Prince is held at its
    stability bound (lam h <= 3.3) while the Rosenbrock step grows to the scale of the (now slow) motion:
    > 30x fewer steps, the same answer to the tolerance."""
    lam = 3e3
    cfg, problem = build(f"model.weight_decay={lam}")
    t0 = 20.0 / lam
    start, _, _, _ = integrate(cfg, problem, t0, method="adaptive", dt=1e-5, rtol=1e-10, atol=1e-13)
    tol = {"rtol": 1e-6, "atol": 1e-9, "dt": 1e-4}
    stiff, _, _, counts = integrate(cfg, problem, t0 + 1.0, start, method="rosenbrock", **tol)
    explicit, _, _, _ = integrate(cfg, problem, t0 + 1.0, start, method="adaptive", **tol)
    assert explicit.step >= 0.5 * lam / 3.3  # Dormand-Prince is stable for lam h <= 3.3 only
    assert explicit.step > 30 * stiff.step, (explicit.step, stiff.step)
    assert stiff.dt > 30 * 3.3 / lam  # steps far above the explicit bound
    scale = np.max(np.abs(explicit.fields["omega"]))
    assert np.max(np.abs(stiff.fields["omega"] - explicit.fields["omega"])) < 1e-5 * scale + 1e-8
    assert counts["failed_solves"] == 0


# ---- files: resume and failure ------------------------------------------------------------------

def write_config(tmp_path: Path, *extra: str) -> Path:
    text = SMALL.replace('t_end = 1.0\nframe_interval = 0.5', 't_end = 4.0\nframe_interval = 1.0')
    text += "\n".join(extra) + "\n"
    path = tmp_path / "stiff.toml"
    path.write_text(text + "[diagnostics]\nenabled = false\n")
    return path


def resumed_run_matches(tmp_path: Path, options: list[str]):
    """Run the small config with ``options`` whole, and stopped by run.max_steps = 7 then resumed: the resumed
    file's frames (but the frame the stop added), /steps rows and checkpoint are the whole run's, bit for bit.
    Returns the whole run's trajectory."""
    cfg = write_config(tmp_path)
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    assert main(["run", str(cfg), "-o", str(full), "--quiet", *options]) == 0
    assert main(["run", str(cfg), "-o", str(part), "--quiet", "--set", "run.max_steps=7", *options]) == 0
    assert open_trajectory(part).attrs["steps"] == 7
    assert main(["run", str(cfg), "-o", str(part), "--quiet", "--resume", *options]) == 0
    a, b = open_trajectory(full), open_trajectory(part)
    # the max_steps stop added a frame at step 7; every other frame and every /steps row are the same bits
    keep = b.frames["step"] != 7
    assert np.sum(~keep) == 1
    for group, rows in (("frames", keep), ("steps", slice(None))):
        mine, theirs = getattr(a, group), getattr(b, group)
        assert set(mine) == set(theirs)
        for key in set(mine) - {"wall_time"}:
            np.testing.assert_array_equal(mine[key], theirs[key][rows], err_msg=f"{group}/{key}")
    for key, value in a.checkpoint.fields.items():
        np.testing.assert_array_equal(value, b.checkpoint.fields[key])
    return a


@pytest.mark.slow
@pytest.mark.parametrize("solver", [["deflate=0"], ["deflate=4"], ["deflate=4", "deflate_every=3"],
                                    ["deflate=4", "deflate_every=3", "stage_solve=\"auto\""]])
def test_resume_is_bit_exact(tmp_path, solver):
    """Resume after run.max_steps repeats the uninterrupted run bit for bit: the carried eigenpairs, their age,
    dI/dt, the PI controller's memory and the complement vector are in the checkpoint."""
    a = resumed_run_matches(tmp_path, [arg for key in solver for arg in ("--set", f"solver.{key}")])
    assert np.all(a.steps["jvps"][1:] > 0)  # row 0: t = 0
    if "auto" not in str(solver):
        assert np.all(a.steps["krylov_iters"][1:] > 0)


def test_failed_stage_solves_exit_3_and_keep_the_frames(tmp_path, capsys):
    """One MINRES iteration per stage solve cannot meet a tight solve tolerance at steps above dt_min: each
    failure quarters the step until it falls below solver.dt_min, the run exits 3 and keeps its frames."""
    cfg = write_config(tmp_path)
    out = tmp_path / "fail.h5"
    code = main(["run", str(cfg), "-o", str(out), "--quiet", "--set", "solver.krylov_maxiter=1",
                 "--set", "solver.krylov_tol=1e-6", "--set", "solver.dt_min=1e-3", "--set", "model.weight_decay=1e3"])
    assert code == 3
    err = capsys.readouterr().err
    assert "krylov_maxiter" in err and "Traceback" not in err
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "error"
    assert len(traj.time) >= 1 and traj.time[0] == 0.0


def test_deflation_preconditioner_same_step_fewer_iterations():
    """The deflation preconditioner changes how the stage systems are solved, not what is solved: the same step
    to the solve tolerance, with fewer MINRES iterations at a step 100x the explicit bound (lam_max ~ 60)."""
    cfg, problem = build("model.weight_decay=0.01")
    start, _, _, _ = integrate(cfg, problem, 1.0, method="rosenbrock", dt=0.05)
    results = {}
    for m in (0, 12):
        stepper = make_stepper(problem, cfg.replace(solver=fixed(5.0, deflate=m, krylov_tol=1e-5)))
        results[m] = stepper.step(State(t=0.0, step=0, dt=5.0, fields=dict(start.fields)), 5.0)
    (plain, c0), (deflated, c1) = results[0], results[12]
    step = np.max(np.abs(plain.fields["omega"] - start.fields["omega"]))
    assert np.max(np.abs(plain.fields["omega"] - deflated.fields["omega"])) < 2e-3 * step
    assert c1["krylov_iters"] < 0.7 * c0["krylov_iters"], (c0, c1)
    assert c0["failed_solves"] == c1["failed_solves"] == 0


# ---- carried eigenpairs, the Hermite quadrature and Krylov-free steps ------------------------------

def test_explicit_bound_and_hermite_rule():
    """EXPLICIT_BOUND is the real stability interval of the W = 0 method (alpha, b); the Hermite rule is exact on
    cubics (the dissipation integral each step leaves)."""
    for x in np.linspace(0.0, EXPLICIT_BOUND, 400):
        assert abs(explicit_stability_function(-x)) <= 1 + 1e-12
    assert abs(explicit_stability_function(-(EXPLICIT_BOUND + 0.01))) > 1
    # W = 0 is an explicit method of order 3: R(z) - e^z = O(z^4)
    defects = [abs(explicit_stability_function(z) - np.exp(z)) for z in (-0.02, -0.01)]
    assert abs(np.log2(defects[0] / defects[1]) - (ORDER + 1)) < 0.05
    p = np.polynomial.Polynomial([0.3, -1.0, 0.7, 2.0])
    h = 0.8
    assert abs(hermite(h, p(0), p(h), p.deriv()(0), p.deriv()(h)) - (p.integ()(h) - p.integ()(0))) < 1e-14


def test_carried_eigenpairs_give_the_same_solution_with_fewer_products():
    """Deflation with eigenpairs carried and refined every 5 steps solves the same stage systems as eigenpairs
    recomputed every step (the preconditioner changes how, not what): the same trajectory to the solve
    tolerance, fewer products."""
    cfg, problem = build("model.weight_decay=0.01")
    start, _, _, _ = integrate(cfg, problem, 1.0, method="rosenbrock", dt=0.05)
    finals, totals = {}, {}
    for every in (1, 5):
        solver = {"method": "rosenbrock", "dt": 0.5, "rtol": 1e-5, "atol": 1e-8, "deflate": 8, "deflate_every": every}
        finals[every], _, _, totals[every] = integrate(cfg, problem, 1.0 + 20.0, start, **solver)
    moved = np.max(np.abs(finals[1].fields["omega"] - start.fields["omega"]))
    assert np.max(np.abs(finals[1].fields["omega"] - finals[5].fields["omega"])) < 1e-4 * moved
    assert totals[5]["jvps"] < 0.8 * totals[1]["jvps"], (totals[1], totals[5])


def test_krylov_free_step_keeps_the_explicit_bound_on_a_known_spectrum():
    """Weight decay alone (zero unembedding): S = lam I, so every eigenvalue is lam, V holds m of them and the
    complement's top is lam. A step asked for at 4x the explicit bound of the complement is capped at
    SAFETY * EXPLICIT_BOUND / lam (margin SAFETY), taken without a product in the stage solves, and is
    exactly R(-lam h) on span V and the explicit R_explicit(-lam h) on its complement; asked for far beyond,
    it solves with MINRES (margin NaN) and is R(-lam h) everywhere."""
    lam = 10.0
    cfg, problem = build("model.unembedding=\"zero\"", f"model.weight_decay={lam}")
    h_bound = SAFETY * EXPLICIT_BOUND / lam
    for asked, krylov_free in ((4.0 * h_bound, True), (1000.0 * h_bound, False)):
        solver = {**fixed(asked), "deflate": 3, "stage_solve": "auto"}
        stepper = make_stepper(problem, cfg.replace(solver=solver))
        state = stepper.initial_state()
        new, extra = stepper.step(state, asked)
        h = new.t - state.t
        omega = state.fields["omega"]
        if krylov_free:
            assert abs(h - h_bound) < 1e-3 * h_bound and abs(extra["explicit_margin"] - SAFETY) < 1e-3
            assert extra["krylov_iters"] == 0
            V = new.carry["V"]  # the carried eigenpairs: orthonormal, in sqrt(m) omega coordinates
            root = np.sqrt(state.fields["mass"])[:, None]
            v = (root * omega).ravel()
            on_v = V @ (V.T @ v)
            expected = (stability_function(-lam * h).real * on_v
                        + explicit_stability_function(-lam * h).real * (v - on_v))
            np.testing.assert_allclose((root * new.fields["omega"]).ravel(), expected, rtol=1e-8, atol=1e-12)
        else:
            assert h == asked and np.isnan(extra["explicit_margin"]) and extra["krylov_iters"] > 0
            np.testing.assert_allclose(new.fields["omega"], stability_function(-lam * h).real * omega, rtol=1e-6)


def test_krylov_free_steps_follow_the_minres_trajectory():
    """stage_solve = "auto" on a stiff stretch (weight decay 0.01, lambda_max ~ 60) gives the MINRES run's answer
    to the error tolerance with fewer gradient equivalents, every Krylov-free step within the bound."""
    cfg, problem = build("model.weight_decay=0.01", "solver.jacobian=\"difference\"")
    start, _, _, _ = integrate(cfg, problem, 1.0, method="rosenbrock", dt=0.05)
    tol = {"method": "rosenbrock", "dt": 0.2, "rtol": 1e-6, "atol": 1e-9, "jacobian": "difference", "deflate": 12}
    plain, _, _, c0 = integrate(cfg, problem, 21.0, start, **tol)
    fast, states, _, c1 = integrate(cfg, problem, 21.0, start, stage_solve="auto", deflate_every=20, **tol)
    scale = np.max(np.abs(plain.fields["omega"]))
    assert np.max(np.abs(plain.fields["omega"] - fast.fields["omega"])) < 1e-4 * scale
    assert c1["jvps"] + c1["gradient_evals"] < 0.7 * (c0["jvps"] + c0["gradient_evals"]), (c0, c1)
    assert c1["failed_solves"] == 0 and c1["krylov_iters"] < c0["krylov_iters"]


def test_complement_estimate_against_the_dense_spectrum():
    """The explicit bound's rho_c (largest eigenvalue of S off span V) against the dense projected matrix: a lower
    bound within 5 %, for eigenpairs of the current state and for stale ones (of an earlier state)."""
    cfg, problem = build("model.weight_decay=0.01", "solver.deflate=4", "solver.stage_solve=\"auto\"")
    stepper = make_stepper(problem, cfg)
    first = stepper.initial_state()
    later, _, _, _ = integrate(cfg, problem, 1.0, method="rosenbrock", dt=0.05)
    dense = stepper._operator(later).matmat(np.eye(later.fields["omega"].size))
    dense = 0.5 * (dense + dense.T)
    for source in (later, first):
        lam, V, _ = stepper._eigenpairs(source, None)
        projector = np.eye(V.shape[0]) - V @ V.T
        exact = np.linalg.eigvalsh(projector @ dense @ projector)[-1]
        rho, _ = stepper._complement_top(later, V, None)
        assert 0.95 * exact <= rho <= exact * (1 + 1e-6), (rho, exact)
