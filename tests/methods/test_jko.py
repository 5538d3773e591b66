"""JKO steppers (solvers/jko.py): particle proximal steps and the entropic grid JKO.

What is checked, and against what:
- particles: first-order convergence to an RK4 reference trajectory as tau -> 0 (observed order);
  energy decrease at tau = 10x the explicit Euler stability limit where Euler itself fails (both shown);
  the limit itself against a dense finite-difference Jacobian; the implicit Euler equations of a step
  (tracers included); POT's optimal coupling against a known case;
- grid: one linearized step against POT's semi-relaxed unbalanced Sinkhorn; Fokker-Planck (data term off)
  against the exact Ornstein-Uhlenbeck Gaussian, with the error's orders in tau and eps and the
  entropic bias eps / (4 tau) of the diffusion; mass to 1e-10;
- failures: a failing inner solve ends the run with exit code 3, a message naming the step, and the
  last good frame in the file.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import ot
import pdeflow.solvers.jko as jko
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.driver import run
from pdeflow.solvers.entropic_ot import entropic_plan, entropic_prox
from pdeflow.solvers.particle_proximal import coupling_gap, proximal_step

from conftest import build_config, symmetric_particle_jacobian
from pdeflow.core.config import ConfigError, load_config
from pdeflow.core.measure import Grid, l1_distance
from pdeflow.core.problem import Problem
from pdeflow.core.system_jacobian import euler_stability_limit
from pdeflow.io.trajectory import open_trajectory

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
pytestmark = pytest.mark.usefixtures("one_numba_thread", "one_blas_thread")


# ---- particles ------------------------------------------------------------------------------------
PARTICLES = {"init": {"n_particles": 6, "scale": 0.7, "seed": 3}, "diagnostics": {"enabled": False}}


def particle_config(method: str, dt: float, t_end: float, **solver):
    return build_config(**PARTICLES, solver={"method": method, "dt": dt, **solver},
                        run={"t_end": t_end, "frame_interval": t_end})


def final_cloud(cfg, path: Path) -> tuple[np.ndarray, np.ndarray, object]:
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    assert result.status == "finished", result.message
    traj = open_trajectory(path)
    return traj.frames["omega"][-1], traj.frames["mass"][-1], traj


def test_particle_jko_converges_to_rk4_at_first_order(tmp_path):
    t_end, taus = 1.0, np.array([0.2, 0.1, 0.05, 0.025])
    ref, mass, _ = final_cloud(particle_config("rk4", 0.01, t_end), tmp_path / "rk4.h5")
    errors = []
    for tau in taus:
        cfg = particle_config("jko", float(tau), t_end, inner_tol=1e-10)
        omega, _, traj = final_cloud(cfg, tmp_path / f"jko{tau}.h5")
        errors.append(math.sqrt(float(mass @ np.sum((omega - ref) ** 2, axis=1))))
        steps = traj.steps
        # the inner solve's record: tolerance met at every step, identity coupling optimal (small tau)
        assert np.all(steps["inner_grad_norm"][1:] <= steps["inner_tol"][1:])
        assert np.all(steps["inner_tol"][1:] == 1e-10) and np.all(steps["inner_iterations"][1:] >= 1)
        assert np.all(steps["coupling_optimal"][1:] == 1.0)
        assert np.all(np.diff(steps["energy"]) < 0)
    errors = np.array(errors)
    order = float(np.polyfit(np.log(taus), np.log(errors), 1)[0])
    pairwise = np.log2(errors[:-1] / errors[1:])
    print(f"particle JKO vs RK4 at t = {t_end}: errors {errors}, observed order {order:.3f}, pairwise {pairwise}")
    assert abs(order - 1.0) <= 0.2
    assert np.all(np.abs(pairwise - 1.0) <= 0.2)


def stiff_problem():
    cfg = particle_config("jko", 1.0, 1.0)
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    return cfg, problem, omega, mass


def test_euler_stability_limit_matches_dense_jacobian():
    """2 / lambda_max of the particle Jacobian (Lanczos on complex-step products) against the dense Jacobian
    of the velocity by central differences, on a small cloud in the gain2 family."""
    cfg = build_config(model={"coordinates": "gain2"}, init={"n_particles": 3, "scale": 1.0, "seed": 2})
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    symmetric = symmetric_particle_jacobian(problem, omega, mass, 1e-5)    # M^{1/2} J M^{-1/2}, symmetric
    assert np.allclose(symmetric, symmetric.T, atol=1e-6)
    expected = 2.0 / np.max(np.linalg.eigvalsh(0.5 * (symmetric + symmetric.T)))
    assert euler_stability_limit(problem, omega, mass, tol=1e-10) == pytest.approx(expected, rel=1e-6)


def test_jko_falls_at_ten_times_the_euler_limit_where_euler_does_not():
    cfg, problem, omega, mass = stiff_problem()
    limit = euler_stability_limit(problem, omega, mass)
    n_steps = 5

    def energies(method: str, dt: float) -> tuple[np.ndarray, list]:
        # tau is JKO's own step; Euler, which does not read it, keeps its default
        c = cfg.replace(solver={"method": method, "dt": dt, "tau": dt if method == "jko" else 0.0})
        stepper = make_stepper(problem, c)
        state = stepper.initial_state()
        out, columns = [stepper.diagnostics(state)["energy"]], []
        for _ in range(n_steps):
            previous = state
            state, extra = stepper.step(state, np.inf)
            out.append(stepper.diagnostics(state)["energy"])
            moved = state.fields["omega"] - previous.fields["omega"]
            columns.append((extra, float(mass @ np.sum(moved ** 2, axis=1)) / (2 * dt)))
        return np.array(out), columns

    # the limit is what it claims: Euler below it decreases the energy, at 10x it does not
    below, _ = energies("euler", 0.5 * limit)
    assert np.all(np.diff(below) < 0)
    euler, _ = energies("euler", 10 * limit)
    implicit, columns = energies("jko", 10 * limit)
    print(f"Euler limit {limit:.4g}; energies at dt = tau = {10 * limit:.4g}: Euler {euler}, JKO {implicit}")
    assert np.any(np.diff(euler) > 0) and euler[-1] > euler[0]
    assert np.all(np.diff(implicit) < 0)
    # the minimizing-movement inequality E(Y) + sum m |y - omega|^2 / (2 tau) <= E(omega), step by step
    for (extra, kinetic), e0, e1 in zip(columns, implicit[:-1], implicit[1:]):
        assert e1 + kinetic <= e0 + 1e-12
        assert extra["inner_grad_norm"] <= cfg.solver.inner_tol


def test_proximal_step_solves_the_implicit_euler_equations_with_tracers():
    """y_i = omega_i - tau grad Phi(y_i; rho_Y) for every particle, zero-mass tracers included; the tracers
    do not change the measure (the massive particles land where they land without them)."""
    _, problem, omega, _ = stiff_problem()
    mass = np.array([0.3, 0.2, 0.0, 0.25, 0.25, 0.0])
    tau = 0.3
    result = proximal_step(problem, omega, mass, tau, 1e-11, 500)
    assert result.converged and result.residual <= 1e-11
    y = result.omega
    heavy = mass > 0
    implicit = omega - tau * problem.grad_phi(y, y[heavy], mass[heavy])
    assert np.max(np.abs(y - implicit)) <= 1e-9
    alone = proximal_step(problem, omega[heavy], mass[heavy], tau, 1e-11, 500)
    assert np.max(np.abs(alone.omega - y[heavy])) <= 1e-9
    assert result.evaluation.energy == pytest.approx(problem.energy(y, mass), rel=1e-12)


def test_coupling_gap():
    """0 when keeping labels is optimal (small motion), (identity - W2^2) / identity otherwise."""
    rng = np.random.default_rng(0)
    old = rng.normal(size=(8, 3))
    mass = np.full(8, 1 / 8)
    assert coupling_gap(old, old + 1e-3 * rng.normal(size=old.shape), mass) <= 1e-12   # rounding of ot.emd2
    assert coupling_gap(old, old, mass) == 0.0
    # two particles swap places: the identity pays 4, the optimal coupling (relabel) 0
    old, new, half = np.array([[0.0], [2.0]]), np.array([[2.0], [0.0]]), np.array([0.5, 0.5])
    assert coupling_gap(old, new, half) == pytest.approx(1.0)
    # they cross halfway: identity 1 * 1.5^2 = 2.25 against W2^2 = 0.5^2 = 0.25
    assert coupling_gap(old, np.array([[1.5], [0.5]]), half) == pytest.approx(2.0 / 2.25)


def test_non_optimal_coupling_is_marked_and_warned_once(monkeypatch):
    """A step whose labelled coupling is not optimal is marked in its /steps column and counted; one warning."""
    cfg, problem, _, _ = stiff_problem()
    stepper = make_stepper(problem, cfg.replace(solver={"dt": 0.1}))
    monkeypatch.setattr(jko, "coupling_gap", lambda old, new, mass: 0.25)
    state = stepper.initial_state()
    with pytest.warns(RuntimeWarning, match="not optimal") as caught:
        for _ in range(2):
            state, extra = stepper.step(state, np.inf)
            assert extra["coupling_optimal"] == 0.0 and extra["transport_gap"] == 0.25
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert stepper.non_optimal_couplings == 2


# ---- grid -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.filterwarnings("ignore:If reg_type = entropy:UserWarning")
def test_entropic_prox_matches_pot_semi_relaxed_sinkhorn(k):
    """One linearized step, min <C, pi> + eps sum pi (log pi - 1) + 2 tau <V, q> + (2 tau / beta) sum q log(q / |C|)
    over pi 1 = p, is POT's semi-relaxed unbalanced problem with reg_m = (inf, 2 tau / beta) and
    b = |C| exp(-beta V): the plans agree (Newton here, generalized Sinkhorn there)."""
    rng = np.random.default_rng(k)
    grid = Grid((-2.0,) * k, (2.0,) * k, (24,) if k == 1 else (6, 6))
    x = grid.centres
    p = rng.random(grid.n_cells) ** 2
    p[rng.random(grid.n_cells) < 0.2] = 0.0           # empty cells
    p /= p.sum()
    V = 0.5 * np.sum(x ** 2, axis=1) + 0.3 * np.sin(3 * x[:, 0])
    eps, tau, beta = 0.2, 0.3, 2.0
    cost = ot.dist(x, x)
    sol = entropic_prox(cost, p, V, eps, tau, beta, grid.cell_volume, 1e-13, 100)
    assert sol.converged and sol.violation <= 1e-13
    plan = entropic_plan(cost, p, sol.potential, eps)
    b = grid.cell_volume * np.exp(-beta * V)
    reference = ot.unbalanced.sinkhorn_unbalanced(p, b, cost, eps, (np.inf, 2 * tau / beta), reg_type="entropy",
                                                  numItermax=200_000, stopThr=1e-15)
    assert np.max(np.abs(plan - reference)) <= 1e-9
    assert np.allclose(plan.sum(axis=1), p, atol=1e-15, rtol=0)
    assert np.allclose(plan.sum(axis=0), sol.masses, atol=1e-14, rtol=0)
    assert sol.transport_cost == pytest.approx(float(np.sum(plan * cost)), rel=1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropic = float(np.sum(plan * cost) + eps * np.sum(np.where(plan > 0, plan * (np.log(plan) - 1), 0.0)))
    assert sol.entropic_cost == pytest.approx(entropic, rel=1e-10)


FP = {"lam": 1.0, "beta": 4.0, "mu0": 1.0, "s0": 1.0, "t_end": 0.4}


def fokker_planck_config(tau: float, eps: float, n: int = 200):
    return build_config(model={"coordinates": "output_gain", "unembedding": "zero", "weight_decay": FP["lam"],
                               "beta": FP["beta"]},
                        init={"measure": "grid", "distribution": "gaussian", "mean": [FP["mu0"]], "scale": FP["s0"]},
                        grid={"n": n, "radius": 4.0},
                        solver={"method": "jko", "dt": float(tau), "epsilon": float(eps)},
                        run={"t_end": FP["t_end"], "frame_interval": FP["t_end"]}, diagnostics={"enabled": False})


def ou_moments(t: float, diffusion: float) -> tuple[float, float]:
    """Mean and variance of d rho/dt = div(rho lam omega) + D Laplace rho from N(mu0, s0^2)."""
    lam = FP["lam"]
    return FP["mu0"] * math.exp(-lam * t), diffusion / lam + (FP["s0"] ** 2 - diffusion / lam) * math.exp(-2 * lam * t)


def fokker_planck_run(tau: float, eps: float) -> dict:
    cfg = fokker_planck_config(tau, eps)
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state = stepper.initial_state()
    masses = [stepper.grid.total_mass(state.fields["density"])]
    while state.t < FP["t_end"] - 1e-12:
        state, extra = stepper.step(state, FP["t_end"] - state.t)
        masses.append(extra["mass"])
        assert extra["marginal_violation"] <= cfg.solver.inner_tol
    grid, rho = stepper.grid, state.fields["density"]
    mean, var = ou_moments(FP["t_end"], 1.0 / FP["beta"])
    return {"l1": l1_distance(grid, rho, grid.gaussian(mean, math.sqrt(var))), "mass": np.array(masses),
            "mean": float(grid.mean(rho)[0]), "var": float(grid.covariance(rho)[0, 0])}


def test_grid_jko_fokker_planck_approaches_the_exact_gaussian():
    """The exact solution is Gaussian with mean mu0 exp(-lam t) and variance 1/(lam beta) + (s0^2 - 1/(lam beta))
    exp(-2 lam t). Errors (L1 against its cell averages): first order in tau with eps = tau^2, and
    decreasing in eps at fixed tau with order 1: the entropic plan adds diffusion eps / (4 tau)."""
    taus = np.array([0.2, 0.1, 0.05])
    by_tau = [fokker_planck_run(tau, tau ** 2) for tau in taus]
    e_tau = np.array([r["l1"] for r in by_tau])
    order_tau = np.log2(e_tau[:-1] / e_tau[1:])
    epsilons = np.array([0.016, 0.008, 0.004])
    by_eps = [fokker_planck_run(0.1, eps) for eps in epsilons]
    e_eps = np.array([r["l1"] for r in by_eps])
    order_eps = float(np.log2((e_eps[0] - e_eps[1]) / (e_eps[1] - e_eps[2])))
    print(f"Fokker-Planck L1 errors: tau {taus} (eps = tau^2): {e_tau}, orders {order_tau}; "
          f"tau = 0.1, eps {epsilons}: {e_eps}, order of the eps part {order_eps:.3f}")
    assert np.all(np.diff(e_tau) < 0) and np.all(np.abs(order_tau - 1.0) <= 0.2)
    assert np.all(np.diff(e_eps) < 0) and abs(order_eps - 1.0) <= 0.3
    # the eps part is the predicted extra diffusion: variance shifts of d/lam (1 - exp(-2 lam t)) with d = eps/(4 tau)
    for a, b, ea, eb in zip(by_eps[:-1], by_eps[1:], epsilons[:-1], epsilons[1:]):
        predicted = ou_moments(FP["t_end"], (ea - eb) / (4 * 0.1))[1] - ou_moments(FP["t_end"], 0.0)[1]
        assert (a["var"] - b["var"]) == pytest.approx(predicted, rel=0.15)
        assert a["mean"] == pytest.approx(b["mean"], abs=1e-5)   # diffusion leaves the mean (but for the box)
    for r in by_tau + by_eps:
        assert np.max(np.abs(r["mass"] - 1.0)) <= 1e-10


def test_grid_jko_run_conserves_mass_and_lowers_the_energy(tmp_path):
    """Through the driver on a problem with its data term on (the risk re-linearized to the fixed point)."""
    cfg = build_config(model={"coordinates": "gain2", "beta": 20.0}, init={"measure": "grid", "scale": 0.7},
                       grid={"n": 12, "radius": 3.0}, solver={"method": "jko", "dt": 0.5, "epsilon": 0.2},
                       run={"t_end": 1.5, "frame_interval": 0.5}, diagnostics={"enabled": False})
    result = run(cfg, Problem.from_config(cfg), tmp_path / "grid.h5", quiet=True)
    assert result.status == "finished", result.message
    traj = open_trajectory(tmp_path / "grid.h5")
    grid = Grid.from_frame_attrs(traj.frame_attrs)
    masses = [grid.total_mass(rho) for rho in traj.frames["density"]]
    assert np.max(np.abs(np.array(masses) - 1.0)) <= 1e-10
    steps = traj.steps
    assert np.all(np.abs(steps["mass"][1:] - 1.0) <= 1e-10)
    assert np.all(np.diff(steps["energy"]) < 0)
    assert np.allclose(steps["energy_change"][1:], np.diff(steps["energy"]), rtol=1e-12, atol=1e-15)
    assert np.all(steps["linearization_residual"][1:] <= cfg.solver.inner_tol)
    assert np.all(steps["outer_iterations"][1:] >= 2)   # the risk is non-linear: re-linearized at least once


def test_grid_too_large_for_dense_plans_is_a_config_error():
    cfg = build_config(model={"coordinates": "gain2"}, init={"measure": "grid"}, grid={"n": 60},
                       solver={"method": "jko"})
    with pytest.raises(ConfigError, match=r"grid\.n"):
        make_stepper(Problem.from_config(cfg), cfg)


# ---- failures -------------------------------------------------------------------------------------
def check_failed_run(path: Path, result, step: int, n_frames: int) -> None:
    assert result.status == "error" and result.exit_code == 3
    assert f"JKO step {step} " in result.message and "the last good frame is kept" in result.message
    traj = open_trajectory(path)
    assert traj.attrs["status"] == "error" and f"JKO step {step} " in traj.attrs["message"]
    assert len(traj.time) == n_frames
    assert traj.checkpoint is not None and traj.checkpoint.step == step - 1


def test_failing_inner_solve_names_the_step_and_keeps_the_last_frame(tmp_path, monkeypatch):
    # a real failure: one iteration cannot reach the tolerance
    cfg = particle_config("jko", 0.1, 0.3, inner_maxiter=1, inner_tol=1e-14).replace(run={"frame_interval": 0.1})
    path = tmp_path / "strict.h5"
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    check_failed_run(path, result, 1, 1)
    assert "solver.inner_maxiter" in result.message
    # an injected failure at the third step: frames of steps 0, 1, 2 are kept
    real, calls = jko.proximal_step, []

    def failing(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            out.converged = False
        return out

    monkeypatch.setattr(jko, "proximal_step", failing)
    cfg = particle_config("jko", 0.1, 0.5).replace(run={"frame_interval": 0.1})
    path = tmp_path / "injected.h5"
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    check_failed_run(path, result, 3, 3)
    traj = open_trajectory(path)
    assert traj.time == pytest.approx([0.0, 0.1, 0.2])


def test_failing_grid_solve_names_the_step(tmp_path):
    cfg = fokker_planck_config(0.1, 0.01, n=40).replace(solver={"inner_maxiter": 1, "inner_tol": 1e-14},
                                                        run={"t_end": 0.2, "frame_interval": 0.1})
    path = tmp_path / "grid.h5"
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    check_failed_run(path, result, 1, 1)
    assert "marginal violation" in result.message


# ---- shipped configs ------------------------------------------------------------------------------
def test_jko_config_takes_ten_times_the_euler_limit():
    cfg = load_config(CONFIGS / "jko.toml")
    assert cfg.solver.method == "jko" and cfg.init.measure == "particles"
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    limit = euler_stability_limit(problem, omega, mass, tol=1e-3)
    assert jko.jko_tau(cfg) >= 10 * limit


def test_jko_grid_config_builds():
    cfg = load_config(CONFIGS / "jko-grid.toml")
    assert cfg.solver.method == "jko" and cfg.init.measure == "grid"
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    assert isinstance(stepper, jko.GridJKO) and stepper.grid.n_cells <= jko.MAX_GRID_CELLS


# ---- the default entropic regularization ----------------------------------------------------------
OU = {"lam": 1.0, "mu0": 1.0, "s0": 0.5}


def ou_grid_config(tau: float, eps: float, beta: float = math.inf, n: int = 100, steps: int = 8):
    return build_config(model={"coordinates": "output_gain", "unembedding": "zero", "weight_decay": OU["lam"],
                               "beta": beta},
                        init={"measure": "grid", "distribution": "gaussian", "mean": [OU["mu0"]], "scale": OU["s0"]},
                        grid={"n": n, "radius": 4.0}, solver={"method": "jko", "dt": float(tau), "epsilon": float(eps)},
                        run={"t_end": tau * steps, "frame_interval": tau * steps}, diagnostics={"enabled": False})


def ou_errors(tau: float, eps: float, steps: int = 8) -> tuple[float, float, float, float]:
    """beta = inf, risk off: Phi = lam |x|^2 / 2. The plan from x is prop. to exp(-(lam tau y^2 + (x - y)^2) / eps),
    a Gaussian of mean x / (1 + lam tau) and variance eps / (2 (1 + lam tau)), so the grid moments follow
    m <- m / (1 + lam tau), v <- v / (1 + lam tau)^2 + eps / (2 (1 + lam tau)) up to the grid sampling.
    Returns the stepper's eps and the errors of the mean and variance after ``steps`` steps, and the
    variance the regularization added (the same recurrence without its eps term)."""
    cfg = ou_grid_config(tau, eps, steps=steps)
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state, grid, lt = stepper.initial_state(), stepper.grid, OU["lam"] * tau
    m, v = float(grid.mean(state.fields["density"])[0]), float(grid.covariance(state.fields["density"])[0, 0])
    v_plain = v
    for _ in range(steps):
        state, _ = stepper.step(state, math.inf)
        m, v, v_plain = m / (1 + lt), v / (1 + lt) ** 2 + stepper.epsilon / (2 * (1 + lt)), v_plain / (1 + lt) ** 2
    rho = state.fields["density"]
    return (stepper.epsilon, float(grid.mean(rho)[0]) - m, float(grid.covariance(rho)[0, 0]) - v, v - v_plain)


def test_default_grid_epsilon_is_the_squared_cell_width_and_adds_exactly_its_diffusion():
    """solver.epsilon = 0 (the default) gives eps = h^2, whose implied diffusion eps / (4 tau) is what the
    flow gets: on the Ornstein-Uhlenbeck drift with beta = inf the grid moments follow the exact recurrence
    of the entropic step (mean to 1e-4, the added variance to 1 %), though each step moves the mass less
    than a cell (lam mu tau / (1 + lam tau) = 0.6 h). With eps = h^2 / 4 the plan no longer resolves the
    grid and the sub-cell drift is pinned: the mean lags by more than 1e-3 (measured 4.4e-3)."""
    assert build_config().solver.epsilon == 0.0
    h, tau = 0.08, 0.05
    assert OU["lam"] * OU["mu0"] * tau / (1 + OU["lam"] * tau) < 0.6 * h
    eps, mean_err, var_err, added = ou_errors(tau, 0.0)
    assert eps == pytest.approx(h ** 2, rel=1e-12)
    assert jko.implied_diffusion(ou_grid_config(tau, 0.0), [h]) == pytest.approx(h ** 2 / (4 * tau), rel=1e-12)
    print(f"default eps = h^2 = {eps:.4g}: mean error {mean_err:.2e}, variance error {var_err:.2e} "
          f"of the added {added:.4g}")
    assert abs(mean_err) <= 1e-4
    assert abs(var_err) <= 0.01 * added
    # an explicit epsilon is used as given; below h^2 the drift is lost
    eps, mean_err, _, _ = ou_errors(tau, h ** 2 / 4)
    assert eps == pytest.approx(h ** 2 / 4, rel=1e-12)
    print(f"eps = h^2 / 4: mean error {mean_err:.2e}")
    assert mean_err > 1e-3


def test_info_prints_the_implied_diffusion_of_a_grid_jko_run(tmp_path):
    from pdeflow.interface.cli import format_info

    cfg = ou_grid_config(0.1, 0.0, beta=4.0, n=40, steps=2)   # h = 0.2: eps = 0.04, D = 0.1 = 0.4 / beta
    path = tmp_path / "grid.h5"
    assert run(cfg, Problem.from_config(cfg), path, quiet=True).exit_code == 0
    traj = open_trajectory(path)
    assert traj.frame_attrs["epsilon"] == pytest.approx(0.04, rel=1e-12)
    assert traj.frame_attrs["implied_diffusion"] == pytest.approx(0.1, rel=1e-12)
    line = [s for s in format_info(traj).splitlines() if s.startswith("entropic")]
    assert line == ["entropic    eps = 0.04 (default h^2), tau = 0.1: implied diffusion eps/(4 tau) = 0.1, "
                    "0.4 x the physical 1/beta = 0.25"]
    cfg = ou_grid_config(0.1, 0.01, n=40, steps=2)             # beta = inf, explicit eps: D = 0.025
    assert run(cfg, Problem.from_config(cfg), path, quiet=True, overwrite=True).exit_code == 0
    line = [s for s in format_info(open_trajectory(path)).splitlines() if s.startswith("entropic")]
    # sqrt(2 D t) = sqrt(2 * 0.025 * 0.2) = 0.1 = half a cell
    assert line == ["entropic    eps = 0.01, tau = 0.1: implied diffusion eps/(4 tau) = 0.025 (beta = inf: the "
                    "flow has none; it spreads mass by 0.5 cells by t = 0.2)"]
