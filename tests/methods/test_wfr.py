"""Wasserstein-Fisher-Rao dynamics (``solver.method = "wfr"``, and ``fv`` with ``solver.gamma``): the
Wasserstein limit bit for bit, mass conservation, the closed form of the pure Fisher-Rao flow with a frozen
potential, the energy identity, mass underflow, resume, and the grid reaction term against particles."""
from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from pdeflow.solvers import check_config, make_stepper
from pdeflow.solvers.base import State
from pdeflow.solvers.driver import run
from pdeflow.solvers.wfr import WassersteinFisherRao

from pdeflow import Problem, loads_config
from pdeflow.core.config import ConfigError
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from test_explicit import SMALL

# the small problem of the explicit steppers' tests, with the WFR stepper
SMALL_WFR = ["solver.method='wfr'", "solver.gamma=2.0", "run.frame_interval=0.25", "diagnostics.enabled=false"]
# Phi does not depend on rho: with a zero unembedding the logits vanish, the residual features are 0 and
# Phi(q) = (lam/2) |q|^2; with alpha = 0 the positions stay put, so Phi_i is frozen in time.
FROZEN = ["model.unembedding='zero'", "model.weight_decay=0.5", "solver.alpha=0.0"]


def build(*overrides: str, text: str | None = None):
    cfg = loads_config(text, list(overrides)) if text else loads_config(SMALL, SMALL_WFR + list(overrides))
    return cfg, Problem.from_config(cfg)


def advance(stepper, state: State, t_end: float) -> tuple[State, list[dict[str, float]]]:
    rows = []
    while t_end - state.t > 1e-12:
        state, extra = stepper.step(state, t_end - state.t)
        rows.append(extra)
    return state, rows


def frozen_closed_form(omega: np.ndarray, mass: np.ndarray, lam: float, gamma: float, t: float) -> np.ndarray:
    """``m_i(t) = m_i(0) exp(-gamma Phi_i t) / sum_j m_j(0) exp(-gamma Phi_j t)`` with ``Phi_i = lam/2 |omega_i|^2``."""
    phi = 0.5 * lam * np.einsum("ik,ik->i", omega, omega)
    w = mass * np.exp(-gamma * (phi - phi.min()) * t)
    return w / w.sum() * mass.sum()


def test_wfr_path_converges_to_the_wasserstein_flow_as_gamma_goes_to_zero():
    """The joint (omega, m) path of the wfr stepper itself (gamma > 0: no hand-off to adaptive) against adaptive at
    the same tolerances (rtol 1e-9): at gamma = 1e-300 the positions at t = 1 agree to 1e-7 (measured ~2e-9: the
    joint error norm also weighs the masses, so the steps differ); at gamma = 1e-2 and 1e-3 the distance is
    first order in gamma (ratio 10 +- 20 %) and far above the tolerance floor."""
    tight = ("solver.rtol=1e-9", "solver.atol=1e-12")
    cfg, problem = build("solver.gamma=1e-300", *tight)
    adaptive = make_stepper(problem, cfg.replace(solver={"method": "adaptive", "gamma": 0.0}))
    reference, _ = advance(adaptive, adaptive.initial_state(), 1.0)
    distance = {}
    for gamma in (1e-300, 1e-3, 1e-2):
        stepper = make_stepper(problem, cfg.replace(solver={"gamma": gamma}))
        assert isinstance(stepper, WassersteinFisherRao) and stepper.gamma > 0.0
        state, _ = advance(stepper, stepper.initial_state(), 1.0)
        assert state.fields["omega"].shape == reference.fields["omega"].shape
        distance[gamma] = float(np.max(np.abs(state.fields["omega"] - reference.fields["omega"])))
    assert 0.0 < distance[1e-300] < 1e-7, distance
    assert distance[1e-3] > 1e3 * distance[1e-300], distance
    assert 8.0 < distance[1e-2] / distance[1e-3] < 12.0, distance


def test_gamma_zero_hands_off_to_the_adaptive_stepper_bit_for_bit(tmp_path):
    """gamma = 0, alpha = 1: the wfr stepper is the adaptive one (its documented hand-off), file for file."""
    cfg, problem = build("solver.gamma=0.0")
    adaptive = cfg.replace(solver={"method": "adaptive"})
    run(cfg, problem, tmp_path / "wfr.h5", quiet=True)
    run(adaptive, problem, tmp_path / "w2.h5", quiet=True)
    a, b = open_trajectory(tmp_path / "wfr.h5"), open_trajectory(tmp_path / "w2.h5")
    assert len(a.frames["time"]) == 5 and a.steps["time"].size > 10
    for key in ("time", "omega", "mass", "energy", "dissipation", "dt"):
        np.testing.assert_array_equal(a.frames[key], b.frames[key])
    for key in ("time", "dt", "energy", "risk", "dissipation", "rejected"):
        np.testing.assert_array_equal(a.steps[key], b.steps[key])
    assert not np.any(a.steps["removed"][1:])  # row 0 is the initial state (nan)
    assert not np.array_equal(a.frames["omega"][0], a.frames["omega"][-1])  # the particles did move


def test_total_mass_is_conserved_to_rounding_and_masses_move():
    cfg, problem = build("solver.gamma=5.0")
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    m0 = state.fields["mass"].copy()
    state, rows = advance(stepper, state, 3.0)
    assert len(rows) > 20
    assert abs(state.fields["mass"].sum() - m0.sum()) < 20 * np.finfo(float).eps
    assert np.max(np.abs(state.fields["mass"] - m0)) > 0.02  # mass did flow between heads
    assert np.all(state.fields["mass"] > 0)


@pytest.mark.parametrize("rtol", [1e-5, 1e-8])
def test_pure_fisher_rao_with_frozen_phi_matches_the_closed_form(rtol):
    cfg, problem = build(*FROZEN, "solver.gamma=3.0", f"solver.rtol={rtol}", f"solver.atol={rtol * 1e-3}")
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    omega0, m0 = state.fields["omega"].copy(), state.fields["mass"].copy()
    phi = problem.phi(omega0, omega0, m0)
    np.testing.assert_allclose(phi, 0.25 * np.einsum("ik,ik->i", omega0, omega0), rtol=1e-14)  # Phi is frozen
    state, _ = advance(stepper, state, 2.0)
    np.testing.assert_array_equal(state.fields["omega"], omega0)  # alpha = 0: no transport
    exact = frozen_closed_form(omega0, m0, 0.5, 3.0, 2.0)
    err = np.max(np.abs(state.fields["mass"] - exact))
    assert err < 20 * rtol * exact.max()
    assert np.max(np.abs(exact - m0)) > 0.05  # the closed form is far from the initial masses


def test_free_total_mass_follows_the_unbalanced_closed_form():
    """solver.total_mass = 'free' (the conic flow): with a frozen Phi, m_i(t) = m_i(0) exp(-gamma Phi_i t) exactly
    (no normalization), and dE/dt = -(alpha int |grad Phi|^2 + gamma int Phi^2) d rho along the vector field."""
    cfg, problem = build(*FROZEN, "solver.gamma=3.0", "solver.total_mass='free'", "model.coordinates='gain2'",
                         "solver.rtol=1e-9", "solver.atol=1e-12")
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    omega0, m0 = state.fields["omega"].copy(), state.fields["mass"].copy()
    state, _ = advance(stepper, state, 2.0)
    exact = m0 * np.exp(-3.0 * 0.25 * np.einsum("ik,ik->i", omega0, omega0) * 2.0)
    np.testing.assert_allclose(state.fields["mass"], exact, rtol=1e-7)
    assert exact.sum() < 0.5  # the total mass did change
    # the energy identity of the free flow, on a problem where Phi depends on rho
    cfg, problem = build("solver.gamma=1.5", "solver.alpha=0.7", "solver.total_mass='free'")
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    ev = stepper.evaluate(state)
    y = np.concatenate([state.fields["omega"], state.fields["mass"][:, None]], axis=1)
    f = stepper._rates(y, ev.phi, ev.grad_phi)
    eps = 1e-5
    plus, minus = y + eps * f, y - eps * f
    dE = (problem.energy(plus[:, :-1], plus[:, -1]) - problem.energy(minus[:, :-1], minus[:, -1])) / (2 * eps)
    I = 0.7 * ev.dissipation + 1.5 * float(state.fields["mass"] @ ev.phi ** 2)
    assert stepper.diagnostics(state)["dissipation"] == pytest.approx(I, rel=1e-13)
    assert abs(dE + I) < 1e-7 * I


def test_energy_identity_exact_derivative_and_step_order():
    """dE/dt = -I: the derivative of E along the WFR vector field (central differences) equals -I; and over
    two steps of h/2 the residual E_2 - E_0 + Simpson(I) shrinks like h^5 (the quadrature and the method)."""
    cfg, problem = build("solver.gamma=1.5", "solver.alpha=0.7")
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    omega, mass = state.fields["omega"], state.fields["mass"]
    ev = stepper.evaluate(state)
    y = np.concatenate([omega, mass[:, None]], axis=1)
    f = stepper._rates(y, ev.phi, ev.grad_phi)
    eps = 1e-5
    plus, minus = y + eps * f, y - eps * f
    dE = (problem.energy(plus[:, :-1], plus[:, -1]) - problem.energy(minus[:, :-1], minus[:, -1])) / (2 * eps)
    I = stepper.diagnostics(state)["dissipation"]
    assert abs(dE + I) < 1e-7 * I

    def residual(h: float) -> float:
        fixed = cfg.replace(solver={"rtol": 1.0, "atol": 1.0, "dt": h / 2, "dt_max": h / 2})
        st = make_stepper(problem, fixed)
        s0 = st.initial_state()
        s1, _ = st.step(s0, h)
        s2, _ = st.step(s1, h)
        d0, d1, d2 = (st.diagnostics(s) for s in (s0, s1, s2))
        assert s2.t == pytest.approx(h, abs=1e-15)
        return d2["energy"] - d0["energy"] + h / 6 * (d0["dissipation"] + 4 * d1["dissipation"] + d2["dissipation"])

    r = [abs(residual(h)) for h in (0.1, 0.05, 0.025)]
    orders = [math.log2(r[i] / r[i + 1]) for i in range(2)]
    assert min(orders) > 4.5, (r, orders)


def test_underflowing_masses_are_removed_and_recorded(tmp_path):
    # frozen Phi with one far particle: its mass decays like exp(-gamma (Phi_far - <Phi>) t)
    cfg, problem = build(*FROZEN, "solver.gamma=4.0", "solver.mass_floor=1e-6", "run.t_end=3.0",
                         "run.frame_interval=1.0", "model.coordinates='gain2'", "init.scale=0.1")
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    omega = state.fields["omega"].copy()
    omega[0] = 3.0  # Phi_0 = 0.25 * 2 * 9 = 4.5, the others below 0.02
    start = State(t=0.0, step=0, dt=cfg.solver.dt, fields={"omega": omega, "mass": state.fields["mass"]})
    stepper.initial_state = lambda: State(t=0.0, step=0, dt=start.dt, fields=dict(start.fields))
    run(cfg, problem, tmp_path / "u.h5", quiet=True, stepper=stepper)
    traj = open_trajectory(tmp_path / "u.h5")
    removed = np.nan_to_num(traj.steps["removed"])
    assert removed.sum() == 1
    row = int(np.flatnonzero(removed)[0])
    assert 0 < traj.steps["removed_mass"][row] < 1e-6
    final = traj.frames["mass"][-1]
    assert final[0] == 0.0 and np.all(final[1:] > 0)
    assert abs(final.sum() - 1.0) < 1e-14
    # the survivors follow the closed form of the flow without particle 0 (its mass was below 1e-6)
    exact = frozen_closed_form(omega[1:], np.full(7, 1 / 7), 0.5, 4.0, 3.0)
    np.testing.assert_allclose(final[1:], exact, atol=1e-5)
    np.testing.assert_array_equal(traj.frames["omega"][-1], omega)  # alpha = 0 (and removed particles stay)


def test_resume_after_an_interruption_is_bit_exact(tmp_path):
    cfg, problem = build("solver.gamma=3.0", "run.t_end=1.0", "run.frame_interval=0.25")
    full = run(cfg, problem, tmp_path / "full.h5", quiet=True)
    assert full.status == "finished"

    stepper = make_stepper(problem, cfg)
    step = stepper.step
    count = {"n": 0}

    def interrupting_step(state, dt_limit):
        count["n"] += 1
        if count["n"] == 7:  # between frames
            os.kill(os.getpid(), signal.SIGINT)
        return step(state, dt_limit)

    stepper.step = interrupting_step
    part = run(cfg, problem, tmp_path / "part.h5", quiet=True, stepper=stepper)
    assert part.status == "interrupted" and part.state.t < 1.0
    resumed = run(cfg, problem, tmp_path / "part.h5", quiet=True, resume=True)
    assert resumed.status == "finished"
    a, b = open_trajectory(tmp_path / "full.h5"), open_trajectory(tmp_path / "part.h5")
    for key in ("time", "omega", "mass", "energy", "dissipation"):
        np.testing.assert_array_equal(a.frames[key], b.frames[key])
    for key in ("time", "dt", "energy", "dissipation", "rejected", "removed"):
        np.testing.assert_array_equal(a.steps[key], b.steps[key])
    assert not np.array_equal(a.frames["mass"][0], a.frames["mass"][-1])


@pytest.mark.parametrize("overrides,message", [
    (["solver.method='rk4'", "solver.gamma=1.0"], "solver.gamma"),
    (["solver.method='adaptive'", "solver.gamma=0.0", "solver.alpha=2.0"], "solver.alpha"),
    (["solver.alpha=0.0", "solver.gamma=0.0"], "both 0"),
    (["solver.gamma=-1.0"], "solver.gamma must be >= 0"),
    (["solver.method='adaptive'", "solver.gamma=0.0", "solver.total_mass='free'"], "solver.total_mass"),
])
def test_bad_wfr_keys_are_one_line_errors(overrides, message):
    """Refused when the config is read, or by the method's rules (pdeflow.solvers.check_config)."""
    with pytest.raises(ConfigError, match=message):
        check_config(loads_config(SMALL, SMALL_WFR + overrides))


@pytest.mark.slow
def test_pdeflow_wfr_command_writes_both_runs_gaps_and_figure(tmp_path):
    """The experiment's command on a short version of data/configs/wfr.toml (t_end = 5, coarse gap grid)."""
    config = Path(__file__).resolve().parents[2] / "data" / "configs" / "wfr.toml"
    out = tmp_path / "w.h5"
    args = ["wfr", str(config), "-o", str(out), "--quiet", "--set", "run.t_end=5.0", "--set", "run.n_frames=3",
            "--set", "diagnostics.grid_points=16", "--set", "diagnostics.n_starts=4"]
    assert main(args) == 0
    assert main(args) == 2  # the files exist: no overwrite without --force
    lines = (tmp_path / "w-gaps.csv").read_text().splitlines()
    assert lines[0] == "flow,time,gap_found,gap_bound,min_phi,min_phi_lower,certified,evaluations"
    rows = [line.split(",") for line in lines[1:]]
    gaps = {flow: [float(r[2]) for r in rows if r[0] == flow] for flow in ("w2", "wfr")}
    assert len(gaps["wfr"]) == len(gaps["w2"]) == 4 and all(r[6] == "1" for r in rows)  # k = 2: certified
    # found <= true gap <= certified bound, i.e. min Phi found >= its proven lower bound
    assert all(float(r[2]) <= float(r[3]) and float(r[5]) <= float(r[4]) for r in rows)
    assert all(float(r[3]) - float(r[2]) < 1e-6 for r in rows)  # and tight (the data bounds of the certificate)
    assert gaps["wfr"][0] == gaps["w2"][0] > 1.0  # the same initial measure
    assert 0 <= gaps["wfr"][-1] < 0.7 * gaps["w2"][-1]  # the mass exchange already helps at t = 5
    assert (tmp_path / "w.png").stat().st_size > 0 and (tmp_path / "w-w2.h5").exists()
    masses = open_trajectory(out).frames["mass"]
    assert np.ptp(masses[-1]) > 0 and abs(masses[-1].sum() - 1) < 1e-14
    assert main(["wfr", str(config), "-o", str(tmp_path / "x.h5"), "--set", "solver.gamma=0"]) == 2
    assert main(["wfr", str(config), "-o", str(tmp_path / "x.h5"), "--dpi", "0"]) == 2
    assert not (tmp_path / "x.h5").exists()   # refused before any run
    assert main([*args, "--force", "--format", "pdf", "--dpi", "72"]) == 0
    assert (tmp_path / "w.pdf").read_bytes().startswith(b"%PDF")
    assert main(["wfr", str(config), "-o", str(tmp_path / "x.h5"), "--set", "solver.total_mass=free"]) == 2
    assert not (tmp_path / "x.h5").exists()


def test_wfr1d_basis_is_the_gain2_slice_at_output_gain_minus_one():
    """data/configs/wfr1d.npz is the attention-sharpness axis of wfr.toml's gain2 family at omega_2 = -1:
    theta(omega) = theta0_gain2 + omega basis_1 - basis_2, rebuilt here from the family (to 1e-13)."""
    from pdeflow import load_config
    from pdeflow.core.model import make_coordinates

    configs = Path(__file__).resolve().parents[2] / "data" / "configs"
    gain2 = make_coordinates(load_config(configs / "wfr.toml").model)
    one = Problem.from_config(load_config(configs / "wfr1d.toml"))
    assert one.k == 1
    omega = np.linspace(-3.0, 3.0, 7)[:, None]
    expected = gain2.theta(np.concatenate([omega, -np.ones_like(omega)], axis=1))
    np.testing.assert_allclose(one.coords.theta(omega), expected, rtol=0, atol=1e-13)


def test_wfr_summary_calls_only_the_bound_certified():
    """The summary line: G found is a lower bound; "certified G <= x" states gap_bound, and "from t" follows the
    bound's own crossing of 1e-6, not the gap found's; an uncertified flow says so."""
    from pdeflow.analysis.comparison.wfr_comparison import FlowGaps, first_below, summary_line

    t = np.array([0.0, 1.0, 2.0, 3.0])
    g = FlowGaps(time=t, gap=np.array([1.0, 1e-3, 1e-9, 1e-10]), gap_bound=np.array([2.0, 0.1, 1e-5, 5e-7]),
                 min_phi=np.full(4, -1.0), min_phi_lower=np.full(4, -1.1), minimizer=np.zeros((4, 2)),
                 certified=np.ones(4, dtype=bool), evaluations=np.full(4, 10))
    assert first_below(t, g.gap) == 2.0 and first_below(t, g.gap_bound) == 3.0
    assert first_below(t, np.array([1e-7, np.nan, 1e-7, 1e-7])) == 2.0      # nan (uncertified) counts as above
    assert math.isnan(first_below(t, np.array([1e-7, 1e-7, 1e-7, 1e-5])))
    line = summary_line("WFR", g)
    assert "G found 1.000e-10 (<= 1e-06 from t = 2; a lower bound on G)" in line
    assert "certified G <= 5.000e-07 (<= 1e-06 from t = 3)" in line
    g.certified[-1], g.gap_bound[-1] = False, np.nan
    assert "NOT certified" in summary_line("WFR", g) and "certified G <=" not in summary_line("WFR", g)


# ---- the grid: finite volumes with the Fisher-Rao reaction --------------------------------------------------
GRID = """
[task]
name = "majority"
vocab_size = 3
seq_len = 4
exact = true
[model]
d = 8
head_dim = 2
coordinates = "output_gain"
family_scale = 4.0
family_seed = 1
weight_decay = 0.05
[init]
measure = "grid"
mean = [0.5]
scale = 0.6
[grid]
n = 32
radius = 4.0
[solver]
method = "fv"
gamma = 2.0
cfl = 0.4
dt = 0.1
[run]
t_end = 1.0
frame_interval = 0.5
"""


def grid_run(*overrides: str, t_end: float = 1.0):
    """fv to t_end; the problem, the stepper and the (time, energy, dissipation, mass, min density) of every step."""
    cfg, problem = build(*overrides, text=GRID)
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    rows = [(0.0, *(stepper.diagnostics(state)[c] for c in ("energy", "dissipation")), 1.0, 0.0)]
    while t_end - state.t > 1e-12:
        state, extra = stepper.step(state, t_end - state.t)
        d = stepper.diagnostics(state)
        rows.append((state.t, d["energy"], d["dissipation"], extra["mass"], extra["min_density"]))
    return problem, stepper, state, np.array(rows)


def moments(problem, omega, mass) -> np.ndarray:
    """The risk and the first two moments of a measure: smooth functionals to compare discretizations by."""
    return np.array([problem.risk(omega, mass), float(mass @ omega[:, 0]), float(mass @ omega[:, 0] ** 2)])


def test_grid_reaction_converges_to_the_particle_flow():
    """fv with the reaction against WFR particles started at the cells of a fine grid (quadrature particles:
    the Lagrangian form of the same PDE), at n = 16, 32, 64: second-order convergence (measured ~1.9)."""
    cfg, problem = build("grid.n=512", text=GRID)
    from pdeflow.core.measure import Grid, initial_density
    fine = Grid.from_config(cfg.grid, problem.k)
    omega, mass = fine.particles(initial_density(fine, cfg.init))
    particles = cfg.replace(init={"measure": "particles"}, solver={"method": "wfr", "rtol": 1e-10, "atol": 1e-13})
    stepper = make_stepper(problem, particles)
    start = State(t=0.0, step=0, dt=0.01, fields={"omega": omega[mass > 0], "mass": mass[mass > 0]})
    state, _ = advance(stepper, start, 1.0)
    reference = moments(problem, state.fields["omega"], state.fields["mass"])
    errors = []
    for n in (16, 32, 64):
        _, st, final, _ = grid_run(f"grid.n={n}")
        errors.append(np.abs(moments(problem, *st.grid.particles(final.fields["density"])) - reference))
    orders = np.log2(errors[0][1:] / errors[2][1:]) / 2  # the moments (the risk is nearly flat here)
    assert np.all(orders > 1.6), (errors, orders)
    # the reaction matters far beyond the discretization error: without it the moments differ 13-250x more
    _, st, final, _ = grid_run("grid.n=64", "solver.gamma=0.0")
    assert np.all(np.abs(moments(problem, *st.grid.particles(final.fields["density"])) - reference)[1:]
                  > 10 * errors[2][1:])


@pytest.mark.parametrize("beta", ["inf", "20.0"])
def test_grid_reaction_keeps_mass_positivity_and_the_energy_identity(beta):
    """Mass to rounding, a nonnegative density, and E(t) - E(0) + int I = O(dt^2) (splitting and trapezoid)."""
    residuals = []
    for cfl in (0.2, 0.1):
        _, _, _, rows = grid_run("grid.n=64", f"model.beta={beta}", f"solver.cfl={cfl}")
        t, energy, dissipation, total, low = rows.T
        assert np.max(np.abs(total[1:] - 1.0)) < 1e-14 and np.min(low[1:]) >= 0.0
        residuals.append(abs(energy[-1] - energy[0] + np.trapezoid(dissipation, t)) / (energy[0] - energy[-1]))
    assert residuals[0] < 5e-3 and residuals[1] < residuals[0] / 3, residuals


def test_reaction_factor_is_the_exact_frozen_reaction():
    from pdeflow.solvers.finite_volume import reaction_factor
    rho = np.array([0.0, 0.5, 1.0, 2.0, 0.25])
    xi = np.array([-900.0, 1.0, 0.0, 0.3, 800.0])  # huge exponents: no overflow, empty cells stay empty
    out = reaction_factor(rho, -2.0 * xi, float(rho.sum()))
    w = rho[1:4] * np.exp(-2.0 * xi[1:4])
    np.testing.assert_allclose(out[1:4], w / w.sum() * rho.sum(), rtol=1e-14)
    assert out[0] == 0.0 and out[4] == 0.0 and abs(out.sum() - rho.sum()) < 1e-15


@pytest.mark.usefixtures("one_numba_thread")
def test_two_mpi_ranks_equal_the_serial_run(tmp_path):
    """Heads sharded over 2 ranks: the rho-averages <Phi> and the error norm are sums over ranks, so the
    run equals the serial one to 1e-12 (masses included)."""
    from test_mpi import mpi_run, write_config

    config = write_config(tmp_path / "w.toml", solver={"method": "wfr", "gamma": 3.0, "dt": 0.05})
    assert main(["run", str(config), "-o", str(tmp_path / "serial.h5"), "--quiet"]) == 0
    done = mpi_run("run", str(config), "-o", str(tmp_path / "mpi.h5"), "--quiet")
    assert done.returncode == 0, done.stderr
    a, b = open_trajectory(tmp_path / "serial.h5"), open_trajectory(tmp_path / "mpi.h5")
    assert b.attrs["status"] == "finished" and a.steps["time"].size == b.steps["time"].size
    for key in ("omega", "mass", "energy", "dissipation"):
        np.testing.assert_allclose(b.frames[key], a.frames[key], rtol=0, atol=1e-12, err_msg=key)
    assert np.ptp(a.frames["mass"][-1]) > 1e-3  # the masses did move


# ---- the grid: JKO steps for the WFR metric ---------------------------------------------------------------
def closed_form_semi_relaxed_plan(a: np.ndarray, cost: np.ndarray, eps: float) -> np.ndarray:
    """The oracle: the minimizer of ``<cost, pi> + eps KL(pi | a x 1) + KL(pi 1 | a)`` (second marginal free) is
    ``pi_ij = a_i Z_i^(eps / (1 + eps)) exp(-cost_ij / eps) / Z_i``, ``Z_i = sum_j exp(-cost_ij / eps)`` (each row
    alone: the row mass s minimizes ``s (eps log s - eps log Z_i) + KL(s | a_i)``), in the log domain: a [M],
    cost [M, M'] -> [M, M']."""
    from scipy.special import logsumexp
    log_kernel = -cost / eps
    log_z = logsumexp(log_kernel, axis=1)
    return np.exp(log_kernel + (np.log(a) + (eps / (1.0 + eps) - 1.0) * log_z)[:, None])


def plan_errors(pot: np.ndarray, oracle: np.ndarray) -> tuple[float, float]:
    """The largest relative errors of the column sums (what the step uses; those below 1e-12 of the largest column
    measured against the largest column) and of the entries above 1e-12 of their row's largest entry."""
    columns, reference = pot.sum(axis=0), oracle.sum(axis=0)
    scale = np.maximum(reference, 1e-12 * reference.max())
    big = oracle > 1e-12 * oracle.max(axis=1, keepdims=True)
    return float(np.max(np.abs(columns - reference) / scale)), float(np.max(np.abs(pot[big] / oracle[big] - 1.0)))


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_plan_is_pots_semi_relaxed_transport(seed):
    """The oracle equals POT's sinkhorn_unbalanced called directly (reg_m = (1, 0), c = a x 1, no rescaling) at
    random inputs where POT's plain kernel is representable."""
    import ot
    rng = np.random.default_rng(seed)
    m, n = rng.integers(3, 12, size=2)
    a, cost, eps = rng.random(m) + 1e-3, 3.0 * rng.random((m, n)), rng.uniform(0.05, 2.0)
    pot = ot.unbalanced.sinkhorn_unbalanced(a, np.ones(n), cost, eps, (1.0, 0.0), reg_type="kl",
                                            c=np.outer(a, np.ones(n)), numItermax=100000, stopThr=1e-15)
    np.testing.assert_allclose(closed_form_semi_relaxed_plan(a, cost, eps), pot, rtol=1e-12, atol=1e-15)


def test_pots_semi_relaxed_scaling_repeats_itself_from_its_second_iteration():
    """What lets wfr_jko ask POT for its plan without the log (solvers/unbalanced_jko.py, PLAN_TOL): called as the
    step calls it (row-shifted, capped cost, a x 1 reference), POT's change between iterations is exactly 0 from
    the second one, so it stops there, whatever the masses, costs (+inf too) and eps."""
    import ot
    from pdeflow.solvers.unbalanced_jko import COST_CAP, PLAN_MAXITER, PLAN_TOL, hk_cost, semi_relaxed_plan
    rng = np.random.default_rng(3)
    x = np.linspace(-4.0, 4.0, 64)
    for eps in (1.0, 1e-2, 2.5e-4):
        a = rng.random(64) ** 4 + 1e-15
        cost = hk_cost(x[:, None], math.sqrt(0.5)) + np.log(1e-6 + 3.0 * rng.random(64))[None, :]
        shift = np.min(cost, axis=1)
        shifted = np.minimum(cost - shift[:, None], COST_CAP * eps)
        ones = np.ones(64)
        plan, log = ot.unbalanced.sinkhorn_unbalanced(a * np.exp(-shift), ones, shifted, eps, (1.0, 0.0),
                                                      method="sinkhorn", reg_type="kl", c=np.outer(a, ones),
                                                      numItermax=PLAN_MAXITER, stopThr=PLAN_TOL, log=True)
        assert len(log["err"]) == 2 and log["err"][-1] == 0.0, (eps, log["err"])
        np.testing.assert_array_equal(semi_relaxed_plan(a, cost, eps), plan)


def test_wfr_jko_plan_is_the_closed_form_at_small_eps_and_infinite_costs():
    """POT in the step (row-shifted, capped cost) against the oracle where POT's plain kernel would over- and
    underflow: eps down to 2.5e-4, the HK cost with +inf beyond pi delta, a cost shift log(growth) down to -28, masses
    down to 1e-15. Row sums, column sums (what the step uses) and every entry above 1e-12 of its row's largest, to
    1e-14 / eps: a cost of size ~10 known to rounding moves exp(-cost / eps) by ~1e-15 / eps in both (measured
    <= 1.1e-15 / eps)."""
    from pdeflow.solvers.unbalanced_jko import hk_cost, semi_relaxed_plan
    rng = np.random.default_rng(1)
    x = np.linspace(-4.0, 4.0, 128)
    a = np.exp(-x**2) / np.sum(np.exp(-x**2)) + 1e-15
    cost = hk_cost(x[:, None], math.sqrt(0.5))
    assert np.isinf(cost).any()
    for eps in (1e-2, 1e-3, 2.5e-4):
        for low in (1e-12, 1e-3, 0.5):
            growth = low + rng.random(128) * 3.0
            shifted = cost + np.log(growth)[None, :]
            pot, oracle = semi_relaxed_plan(a, shifted, eps), closed_form_semi_relaxed_plan(a, shifted, eps)
            rows = float(np.max(np.abs(pot.sum(axis=1) / oracle.sum(axis=1) - 1.0)))
            assert max(rows, *plan_errors(pot, oracle)) < 1e-14 / eps, (eps, low, rows, plan_errors(pot, oracle))


def test_wfr_jko_inner_problem_without_transport_is_the_implicit_reaction():
    """Infinite off-diagonal cost, eps -> 0: the step is the implicit reaction b = a / (1 + c (xi - lam))^2."""
    from pdeflow.solvers.unbalanced_jko import jko_masses
    rng = np.random.default_rng(0)
    a, xi, c = rng.random(8) + 0.1, rng.normal(size=8), 0.3
    diagonal = np.where(np.eye(8) > 0, 0.0, np.inf)
    b, _ = jko_masses(a, diagonal, xi, c, 1e-9)
    assert abs(b.sum() - a.sum()) < 1e-14 and np.all(b > 0)
    slope, _ = np.polyfit(xi, np.sqrt(a / b), 1)  # sqrt(a / b) = 1 + c (xi - lam): affine in xi with slope c
    assert slope == pytest.approx(c, rel=1e-6)


def test_wfr_jko_multiplier_search_started_at_a_guess_finds_the_same_root_with_fewer_plans(monkeypatch):
    """The mass multiplier's bracket (:func:`bracket`) from a guess on either side of the root, near or far, with a
    too small or too large width, holds the root, and the step's masses and multiplier agree with the search from
    the pole to 1e-13; a guess next to the root (what the step's next linearization has) costs fewer plans."""
    import pdeflow.solvers.unbalanced_jko as module

    rng = np.random.default_rng(3)
    x = np.linspace(-2.0, 2.0, 40)
    a = np.exp(-x**2) + 0.05
    cost = module.hk_cost(x[:, None], 0.7)
    xi, c, eps = rng.normal(size=40), 0.4, 2e-3
    plans = [0]
    original = module.semi_relaxed_plan

    def counted(*args):
        plans[0] += 1
        return original(*args)

    monkeypatch.setattr(module, "semi_relaxed_plan", counted)
    b0, lam0 = module.jko_masses(a, cost, xi, c, eps)
    cold = plans[0]
    assert abs(b0.sum() - a.sum()) <= 1e-13 * a.sum()
    for offset in (-3.0, -1e-3, -1e-9, 0.0, 1e-9, 1e-3):
        for width in (1e-14, 1e-6, 10.0):
            lam = min(lam0 + offset, float(np.min(xi)) + 0.999 / c)
            plans[0] = 0
            b, root = module.jko_masses(a, cost, xi, c, eps, (lam, width))
            assert abs(root - lam0) <= 1e-13 * max(1.0, abs(lam0)), (offset, width, root, lam0)
            np.testing.assert_allclose(b, b0, rtol=1e-12, atol=0)
            if abs(offset) <= 1e-9 and width == 1e-6:
                assert plans[0] < cold, (offset, plans[0], cold)


def test_wfr_jko_steps_use_plans_equal_to_the_closed_form(monkeypatch):
    """Every plan the stepper computes (tau = 0.2, eps = 4e-3, n = 128: 560 plans) against the oracle at the same
    inputs: the column sums (the masses b) and every entry above 1e-12 of its row's largest to 1e-14 / eps."""
    import pdeflow.solvers.unbalanced_jko as module
    pots = module.semi_relaxed_plan
    worst = [0.0, 0.0, 0]

    def checked(a, cost, eps):
        pot = pots(a, cost, eps)
        errors = plan_errors(pot, closed_form_semi_relaxed_plan(a, cost, eps))
        worst[:] = max(worst[0], errors[0]), max(worst[1], errors[1]), worst[2] + 1
        return pot

    monkeypatch.setattr(module, "semi_relaxed_plan", checked)
    grid_run("grid.n=128", "solver.method='wfr_jko'", "solver.tau=0.2", "solver.epsilon=0.004")
    assert worst[2] > 500 and max(worst[:2]) < 1e-14 / 0.004, worst


def test_wfr_jko_keeps_mass_and_positivity_decreases_energy_and_approaches_fv():
    """JKO steps on the 1-D problem (n = 128, eps = tau^2 / 10): mass to rounding, rho >= 0, E_h decreasing at every
    step; L1 distance at t = 1 to fv with the reaction (cfl 0.1) measured 0.029 (tau = 0.2), 0.019 (tau = 0.1).
    (At tau = 0.05 the kernel, sqrt(eps) = 0.016, is narrower than a cell, 0.0625, and the distance grows to 0.064.)"""
    _, fv, ref, _ = grid_run("grid.n=128", "solver.cfl=0.1")
    distances = []
    for tau in (0.2, 0.1):
        _, st, final, rows = grid_run("grid.n=128", "solver.method='wfr_jko'", f"solver.tau={tau}",
                                       f"solver.epsilon={tau * tau / 10}")
        t, energy, _, total, low = rows.T
        assert np.max(np.abs(total[1:] - 1.0)) < 1e-13 and np.min(low[1:]) >= 0.0
        assert np.all(np.diff(energy) < 0)
        distances.append(float(np.sum(np.abs(final.fields["density"] - ref.fields["density"]))) * st.grid.cell_volume)
    assert distances[1] < 0.025 and distances[1] < 0.8 * distances[0], distances


def test_wfr_jko_needs_both_rates():
    with pytest.raises(ConfigError, match="wfr_jko' needs solver.gamma > 0"):
        check_config(loads_config(GRID, ["solver.method='wfr_jko'", "solver.gamma=0.0"]))


def test_wfr_jko_runs_through_pdeflow_run_with_a_first_order_identity_defect(tmp_path):
    """``pdeflow run`` at the settings of the tests above (n = 128, eps = tau^2 / 10), the accuracy record on: the
    run finishes with accuracy held, the steps landing on a frame time (h = 0.1 < tau = 0.2) included, and the
    energy-identity defect of the right-point rule is first order: halving tau roughly halves it (measured median
    0.090 -> 0.039, largest 0.22 -> 0.16)."""
    medians = []
    for tau in (0.2, 0.1):
        cfg, problem = build("grid.n=128", "solver.method='wfr_jko'", f"solver.tau={tau}",
                             f"solver.epsilon={tau * tau / 10}", text=GRID)
        run(cfg, problem, tmp_path / f"jko{tau}.h5", quiet=True)
        traj = open_trajectory(tmp_path / f"jko{tau}.h5")
        assert traj.attrs["status"] == "finished" and traj.attrs["accuracy"].startswith("held"), traj.attrs
        h = np.diff(traj.steps["time"])
        defect = traj.steps["identity_defect"][1:]
        if tau == 0.2:
            assert np.any(h < tau - 1e-9)  # a short step landing on a frame time is among them
        assert np.max(defect) < 0.5 * cfg.run.identity_tol
        medians.append(float(np.median(defect)))
    assert 1.6 < medians[0] / medians[1] < 3.0, medians
