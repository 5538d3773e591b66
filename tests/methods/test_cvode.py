"""The SUNDIALS CVODE stepper (solvers/cvode.py, ``cvode``): accuracy against a tight Dormand-Prince run, the
deflation preconditioner against the dense Newton matrix, CVODE's counters against pdeflow's own counts, stiffness,
the energy identity, resume to the tolerance, and the one-line message when scikit-sundae is missing."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.base import State

from pdeflow.core.system_jacobian import SystemJacobian, deflation_inverse
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from test_stiff import build, integrate, write_config


@pytest.fixture
def sundials():
    return pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')


@pytest.fixture(scope="module")
def reference():
    cfg, problem = build()
    ref, _, _, _ = integrate(cfg, problem, 1.0, method="adaptive", dt=0.01, rtol=1e-12, atol=1e-14)
    return cfg, problem, ref


def test_error_follows_the_tolerance(sundials, reference):
    """The global error at t = 1 against Dormand-Prince at rtol 1e-12 stays within 10 x rtol and falls with it,
    with the deflation preconditioner and without."""
    cfg, problem, ref = reference
    scale = np.max(np.abs(ref.fields["omega"]))
    for deflate in (0, 4):
        errors, steps = [], []
        for rtol in (1e-5, 1e-8):
            final, states, _, totals = integrate(cfg, problem, 1.0, method="cvode", dt=0.01, rtol=rtol,
                                                 atol=rtol * 1e-3, deflate=deflate)
            errors.append(np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale)
            steps.append(len(states) - 1)
            assert errors[-1] < 10 * rtol, (deflate, rtol, errors)
            assert (totals["preconditioner_setups"] > 0) == (deflate > 0)
        assert errors[1] < errors[0] / 30 and steps[1] > steps[0]


def test_difference_products_keep_the_steps_and_the_accuracy(sundials, reference):
    """``solver.jacobian = "difference"`` perturbs only the Newton matrix (the residual is the exact f): at rtol
    1e-5 and 1e-8, with deflation, the global error at t = 1 stays within 10 x rtol of Dormand-Prince at rtol
    1e-12, the two product kinds take steps within 10 % of each other, and their results agree within 2 x rtol
    (what the race relies on when it counts a difference product at one gradient)."""
    cfg, problem, ref = reference
    scale = np.max(np.abs(ref.fields["omega"]))
    for rtol in (1e-5, 1e-8):
        runs = {}
        for jacobian in ("exact", "difference"):
            final, states, _, totals = integrate(cfg, problem, 1.0, method="cvode", dt=0.01, rtol=rtol,
                                                 atol=rtol * 1e-3, deflate=4, jacobian=jacobian)
            runs[jacobian] = (final.fields["omega"], len(states) - 1, totals)
            assert np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale < 10 * rtol, (rtol, jacobian)
        (exact, n_exact, _), (diff, n_diff, totals) = runs["exact"], runs["difference"]
        assert abs(n_diff - n_exact) <= 0.1 * n_exact, (rtol, n_exact, n_diff)
        assert np.max(np.abs(diff - exact)) / scale < 2 * rtol, rtol
        assert totals["jvps"] > 0 and totals["linear_iters"] > 0


def test_plain_cvode_agrees_and_its_cost_is_cvodes_rhs_calls(sundials, reference):
    """``solver.jacobian = "cvode"`` with no preconditioner is SUNDIALS set up plainly (BDF, GMRES on CVODE's own
    difference quotients): at rtol 1e-8 the global error at t = 1 stays within 10 x rtol of Dormand-Prince at rtol
    1e-12, and every gradient evaluation the Problem counts is a right-hand-side call SUNDIALS reports (Newton's,
    its quotients' - one per GMRES iteration -, the initial one) or one of pdeflow's energy identity (f at each new
    state, and the start's); pdeflow's own products are dI/dt's alone, differences."""
    cfg, problem, ref = reference
    before = dict(problem.counts)
    final, states, _, totals = integrate(cfg, problem, 1.0, method="cvode", dt=0.01, rtol=1e-8, atol=1e-11,
                                         jacobian="cvode")
    spent = {kind: problem.counts[kind] - before[kind] for kind in before}
    steps = len(states) - 1
    scale = np.max(np.abs(ref.fields["omega"]))
    assert np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale < 1e-7
    assert totals["linear_rhs_evals"] == totals["linear_iters"] > 0
    assert spent["gradient"] == totals["rhs_evals"] + totals["linear_rhs_evals"] + steps + 1
    assert spent["jvp_exact"] == 0 and spent["jvp_difference"] == steps + 1 == totals["jvps"]
    assert totals["preconditioner_setups"] == 0


def test_head_blocks_are_the_frozen_measure_hessian_and_precondition_cvode(sundials, reference):
    """The blocks cvode's "heads" preconditioner takes (``frozen_blocks``) against the complex-step Hessian of Phi
    with the measure frozen (``Problem.hvp``) on random vectors, head by head; ``block_inverse`` inverts
    ``diag_i(I + gamma H_i)``; and cvode with ``solver.preconditioner = "heads"`` agrees with Dormand-Prince at rtol
    1e-12 within 10 x rtol, its setups counted as k exact products each."""
    from pdeflow.solvers.cvode import block_inverse

    from pdeflow.core.hessian_assembly import frozen_blocks

    cfg, problem, ref = reference
    stepper = make_stepper(problem, cfg.replace(solver={"method": "cvode"}))
    omega, mass = stepper.initial_state().fields.values()
    blocks = frozen_blocks(problem, omega, mass)
    n, k = omega.shape
    rng = np.random.default_rng(1)
    for i in range(n):
        v = rng.standard_normal(k)
        exact = problem.hvp(omega[i], v, omega, mass)
        np.testing.assert_allclose(blocks[i] @ v, exact, rtol=0, atol=1e-6 * np.max(np.abs(exact)))
    values, vectors = np.linalg.eigh(blocks)
    shifted = np.maximum(values, 0.0)
    x = rng.standard_normal(n * k)
    gamma = 0.2
    newton = np.einsum("nij,nj,nkj->nik", vectors, 1.0 + gamma * shifted, vectors)
    np.testing.assert_allclose(block_inverse(np.einsum("nij,nj->ni", newton, x.reshape(n, k)).ravel(), shifted,
                                             vectors, gamma), x, rtol=0, atol=1e-10)
    before = dict(problem.counts)
    final, states, _, totals = integrate(cfg, problem, 1.0, method="cvode", dt=0.01, rtol=1e-7, atol=1e-10,
                                         jacobian="difference", preconditioner="heads")
    scale = np.max(np.abs(ref.fields["omega"]))
    assert np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale < 1e-6
    setups = totals["preconditioner_setups"]
    assert setups > 0
    assert problem.counts["gradient"] - before["gradient"] == totals["rhs_evals"] + len(states)
    assert problem.counts["jvp_exact"] - before["jvp_exact"] == k * setups


def test_cvode_only_keys_are_refused_elsewhere_and_together(reference):
    """``jacobian = "cvode"`` is refused by rosenbrock (it has no CVODE quotients); ``preconditioner = "heads"``
    takes no deflated pairs."""
    from pdeflow.core.config import ConfigError

    cfg, problem, _ = reference
    with pytest.raises(ConfigError, match="cvode's alone"):
        make_stepper(problem, cfg.replace(solver={"method": "rosenbrock", "jacobian": "cvode"}))
    with pytest.raises(ConfigError, match="no solver.deflate"):
        make_stepper(problem, cfg.replace(solver={"method": "cvode", "preconditioner": "heads", "deflate": 4}))


def test_deflation_inverse_with_every_pair_inverts_the_newton_matrix(sundials):
    """With all eigenpairs of the dense mass-weighted Jacobian S, ``deflation_inverse`` is the inverse of CVODE's
    Newton matrix ``I - gamma J`` (J assembled column by column from the exact product)."""
    cfg, problem = build("init.n_particles=3", "model.d=4", "task.seq_len=3", "task.vocab_size=3")
    stepper = make_stepper(problem, cfg)
    omega, mass = stepper.initial_state().fields.values()
    mass = mass * np.array([0.5, 1.0, 1.5])  # unequal masses: the symmetrization matters
    jacobian = SystemJacobian(problem, omega, mass, problem.grad_phi(omega, omega, mass))
    n = omega.size
    minus_J = np.column_stack([jacobian.product(e.reshape(omega.shape)).ravel() for e in np.eye(n)])
    S = np.column_stack([jacobian.apply(e) for e in np.eye(n)])
    lam, V = np.linalg.eigh(0.5 * (S + S.T))
    root = np.repeat(np.sqrt(mass), omega.shape[1])
    x = np.random.default_rng(3).standard_normal(n)
    for gamma in (0.01, 0.3):
        newton = np.eye(n) + gamma * minus_J
        np.testing.assert_allclose(deflation_inverse(newton @ x, root, lam, V, gamma), x, rtol=0, atol=1e-9)


def test_counters_agree_with_pdeflow_counts(sundials, reference):
    """CVODE's counters (read through ctypes) against what pdeflow counts itself: one internal step per pdeflow
    step, a BDF order in 1..5, CVODE's right-hand-side calls = pdeflow's gradient evaluations besides the new
    states' (one a step), at least one Newton iteration a step and at most one call each, GMRES iterations =
    products besides dI/dt (one a step and one at the start; no eigenpairs without deflation)."""
    from pdeflow.solvers.cvode import Counters

    cfg, problem, _ = reference
    stepper = make_stepper(problem, cfg.replace(solver={"method": "cvode", "rtol": 1e-6, "atol": 1e-9, "dt": 0.01}))
    state = stepper.initial_state()
    stepper.evaluate(state)  # the start's evaluation, as a run makes it before its first step
    rows = []
    while state.t < 1.0 - 1e-12:
        live = state.carry.get("cvode")  # the running solver the state carries (none at the start)
        steps_before = live.counters.read()["steps"] if live is not None else 0.0
        mark = stepper.cost_mark()
        state, extra = stepper.step(state, 1.0 - state.t)
        live = state.carry["cvode"]
        assert live.counters.read()["steps"] - steps_before == 1
        rows.append({**extra, **stepper.cost_since(mark)})  # with the Problem's counts, as the loop adds them
    assert all(1 <= r["order"] <= 5 for r in rows) and max(r["order"] for r in rows) >= 3
    newton = sum(r["nonlinear_iters"] for r in rows)
    rhs = sum(r["gradient_evals"] for r in rows) - len(rows)
    assert live.counters.read()["rhs"] == rhs
    assert len(rows) <= newton <= rhs
    slopes = len(rows) + 1
    assert sum(r["jvps"] for r in rows) - slopes == sum(r["linear_iters"] for r in rows)
    assert sum(r["jvps"] for r in rows) == sum(r["jvps_exact"] + r["jvps_difference"] for r in rows)
    assert isinstance(live.counters, Counters)


def test_counters_layout_mismatch_fails_loudly(sundials, reference, monkeypatch):
    """CVODE's counters are read at a byte offset in scikit-sundae's solver object: a layout that does not check
    out (another object size, an offset not leading to CVODE's memory, a right-hand-side count that disagrees)
    is a SolverError naming the problem, never counters read from the wrong memory."""
    from pdeflow.solvers import cvode
    from pdeflow.solvers.base import SolverError

    cfg, problem, _ = reference
    stepper = make_stepper(problem, cfg.replace(solver={"method": "cvode", "rtol": 1e-6, "atol": 1e-9, "dt": 0.01}))
    state, _ = stepper.step(stepper.initial_state(), 0.1)
    live = state.carry["cvode"]
    inner, nfev = live.solver._CVODE__CVODE, int(live.counters.read()["rhs"])
    libraries = [live.counters.lib._name]
    assert cvode.layout_mismatch(inner, libraries, nfev) == ""
    assert "right-hand-side" in cvode.layout_mismatch(inner, libraries, nfev + 1)
    assert "libraries" in cvode.layout_mismatch(inner, [], nfev)
    offset = cvode.MEM_OFFSET
    monkeypatch.setattr(cvode, "MEM_OFFSET", cvode.MEM_OFFSET + 8)  # the SUNContext taken for CVODE's memory
    assert "SUNContext" in cvode.layout_mismatch(inner, libraries, nfev)
    monkeypatch.setattr(cvode, "MEM_OFFSET", offset)
    monkeypatch.setattr(cvode, "SOLVER_SIZE", cvode.SOLVER_SIZE + 8)
    assert "bytes" in cvode.layout_mismatch(inner, libraries, nfev)
    fresh = make_stepper(problem, cfg.replace(solver={"method": "cvode", "rtol": 1e-6, "atol": 1e-9, "dt": 0.01}))
    with pytest.raises(SolverError, match="cannot read CVODE's counters from scikit-sundae"):
        fresh.step(fresh.initial_state(), 0.1)


def test_stiff_problem_far_above_the_explicit_bound(sundials):
    """Weight decay lam = 3e3 (eigenvalues about -3e3), from t0 = 20 / lam to t0 + 1: cvode's steps go far above
    Dormand-Prince's stability bound (lam h <= 3.3) and the answer agrees to the tolerance, with the deflation
    preconditioner and without (a spectrum clustered at lam: GMRES needs about one iteration either way)."""
    lam = 3e3
    cfg, problem = build(f"model.weight_decay={lam}")
    t0 = 20.0 / lam
    start, _, _, _ = integrate(cfg, problem, t0, method="adaptive", dt=1e-5, rtol=1e-10, atol=1e-13)
    tol = {"rtol": 1e-6, "atol": 1e-9, "dt": 1e-4}
    explicit, _, _, _ = integrate(cfg, problem, t0 + 1.0, start, method="adaptive", **tol)
    scale = np.max(np.abs(explicit.fields["omega"]))
    for deflate in (0, 8):
        final, states, _, totals = integrate(cfg, problem, t0 + 1.0, start, method="cvode", deflate=deflate, **tol)
        assert explicit.step > 30 * final.step
        assert max(b.t - a.t for a, b in zip(states, states[1:])) > 30 * 3.3 / lam
        assert np.max(np.abs(final.fields["omega"] - explicit.fields["omega"])) < 1e-5 * scale + 1e-8
        assert totals["linear_iters"] <= 2 * totals["nonlinear_iters"]


def test_run_keeps_the_energy_identity_and_resumes_to_the_tolerance(sundials, tmp_path):
    """A file run: every step's Hermite quadrature explains its energy change (identity defect far below
    run.identity_tol), the /steps columns are written; stopped by run.max_steps = 7 and resumed, CVODE restarts at
    order 1 from the checkpoint, so the resumed frames agree with the uninterrupted run's to the tolerance (not bit
    for bit), and the frames before the stop are the same bits."""
    cfg = write_config(tmp_path)
    options = ["--set", "solver.method=\"cvode\"", "--set", "solver.rtol=1e-7", "--set", "solver.atol=1e-10",
               "--set", "solver.deflate=4"]
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    assert main(["run", str(cfg), "-o", str(full), "--quiet", *options]) == 0
    assert main(["run", str(cfg), "-o", str(part), "--quiet", "--set", "run.max_steps=7", *options]) == 0
    assert main(["run", str(cfg), "-o", str(part), "--quiet", "--resume", *options]) == 0
    a, b = open_trajectory(full), open_trajectory(part)
    steps = a.steps
    assert np.nanmax(steps["identity_defect"][1:]) < 1e-2
    for key in ("order", "nonlinear_iters", "gradient_evals", "jvps"):
        assert np.all(steps[key][1:] >= 1), key
    assert np.all(steps["linear_iters"][1:] >= 0) and np.sum(steps["linear_iters"][1:]) > 0
    assert b.steps["order"][8] == 1  # the restart
    np.testing.assert_array_equal(a.steps["energy"][:8], b.steps["energy"][:8])
    ta, tb = a.time, b.time[b.frames["step"] != 7]
    np.testing.assert_allclose(ta, tb, rtol=0, atol=1e-12)
    wa = a.frames["omega"][-1]
    wb = b.frames["omega"][-1]
    scale = np.max(np.abs(wa))
    assert np.max(np.abs(wa - wb)) < 1e-5 * scale
    assert np.max(np.abs(wa - wb)) > 0.0  # a restart, not a bit-exact continuation


def test_missing_scikit_sundae_exits_2_with_the_extra_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sksundae", None)  # import sksundae raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "sksundae.cvode", None)
    cfg = write_config(tmp_path)
    code = main(["run", str(cfg), "-o", str(tmp_path / "x.h5"), "--quiet", "--set", "solver.method=\"cvode\""])
    assert code == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[sundials]"' in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_non_positive_mass_is_refused(sundials, reference):
    cfg, problem, _ = reference
    stepper = make_stepper(problem, cfg.replace(solver={"method": "cvode"}))
    state = stepper.initial_state()
    mass = state.fields["mass"].copy()
    mass[0] = 0.0
    with pytest.raises(Exception, match="positive masses"):
        stepper.step(State(t=0.0, step=0, dt=0.01, fields={"omega": state.fields["omega"], "mass": mass}), 0.1)


def test_a_missing_sundials_is_one_line_when_the_stepper_is_built(monkeypatch):
    """scikit-sundae is optional: ``pdeflow.solvers`` imports without it (the cvode module imports it lazily) and
    building the cvode stepper then raises a one-line ConfigError naming the extra to install."""
    import sys

    import pdeflow.solvers
    from pdeflow.solvers.cvode import sundials

    from pdeflow.core.config import ConfigError

    monkeypatch.setitem(sys.modules, "sksundae", None)  # an import of it now fails as if it were not installed
    monkeypatch.setitem(sys.modules, "sksundae.cvode", None)
    pdeflow.solvers._import_steppers()
    with pytest.raises(ConfigError, match=r"^solver.method = 'cvode' needs scikit-sundae .*\[sundials\]") as exc:
        sundials()
    assert "\n" not in str(exc.value)
