"""Acceptance tests of pdeflow.analysis.diagnostics and the ``pdeflow diagnose`` command.

Every expectation is recomputed independently: closed forms (synthetic energy curves, the quadratic Phi of
the output-gain family, the translation Hessian of a Dirac), brute-force evaluation of Phi on fine grids,
the KKT conditions of the constrained minimum, and energies of other runs and random measures.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import h5py
import numba
import numpy as np
import pytest
from pdeflow.solvers.driver import run

from conftest import build_config
from pdeflow.analysis import diagnostics as D
from pdeflow.core.config import Config, DiagnosticsConfig
from pdeflow.core.measure import Grid, free_energy
from pdeflow.core.problem import Problem
from pdeflow.interface.cli import main
from pdeflow.io.checkpoint import Checkpoint
from pdeflow.io.file_access import TrajectoryError
from pdeflow.io.trajectory import open_trajectory
from pdeflow.io.trajectory_writer import TrajectoryWriter


@pytest.fixture(autouse=True, scope="module")
def one_numba_thread():
    """Tiny kernels on a loaded 2-core machine run many times faster on one thread than on two."""
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(old)


# the analysis with the gap search, as pdeflow diagnose stores it (a finished run's own analysis leaves the gap out)
ANALYSE_WITH_GAP = functools.partial(D.analyse_run, gap=True)


def run_config(tmp_path: Path, name: str, on_finish=None, **overrides) -> tuple[Config, Path]:
    cfg = build_config(**overrides)
    path = tmp_path / f"{name}.h5"
    result = run(cfg, Problem.from_config(cfg), path, quiet=True, on_finish=on_finish)
    assert result.status == "finished", result.message
    return cfg, path


# ---- synthetic curves: PL, KL, energy identity ------------------------------------------------
def test_pl_constant_recovers_mu_on_exponential_curve():
    """E - E* = A exp(-2 mu t) with I = -dE/dt by second-order differences: mu within 1% at every time."""
    mu, e_star = 0.7, 0.3
    t = np.linspace(0.0, 10.0, 401)
    energy = e_star + 2.0 * np.exp(-2 * mu * t)
    dissipation = -np.gradient(energy, t, edge_order=2)
    estimate = D.pl_constant(energy, dissipation, e_star)
    assert np.max(np.abs(estimate / mu - 1)) < 0.01
    # a wrong E* is visible: the ratio drifts by far more than 1%
    assert np.max(np.abs(D.pl_constant(energy, dissipation, e_star - 1e-3) / mu - 1)) > 0.1
    assert np.isnan(D.pl_constant([1.0, 2.0], [1.0, 1.0], 1.0)[0])


@pytest.mark.parametrize("a", [1.5, 2.0, 4.0])
def test_kl_exponent_recovers_theta_on_power_law(a):
    """E - E* = (1 + t)^(-a) gives I = a (E - E*)^((a + 1)/a), i.e. theta = (a - 1) / (2 a); I from differences."""
    t = np.linspace(0.0, 200.0, 2001)
    energy = 1.5 + (1.0 + t) ** (-a)
    dissipation = -np.gradient(energy, t, edge_order=2)
    theta, lo, hi = D.kl_exponent(energy, dissipation, 1.5, window=0.5)
    assert abs(theta - (a - 1) / (2 * a)) < 0.02
    assert lo <= theta <= hi and hi - lo < 0.02


def test_kl_exponent_is_one_half_for_exponential_decay_and_fit_finds_e_star():
    t = np.linspace(0.0, 20.0, 801)
    energy = -0.4 + 3.0 * np.exp(-0.5 * t)
    dissipation = -np.gradient(energy, t, edge_order=2)
    assert abs(D.kl_exponent(energy, dissipation, -0.4)[0] - 0.5) < 0.02
    e_star = D.fit_e_star(energy, dissipation)
    assert abs(e_star - (-0.4)) < 1e-6 * 3.0
    # a power-law tail too: its limit is found from the curve alone
    energy = 2.0 + (1.0 + t) ** -2.0
    assert abs(D.fit_e_star(energy, -np.gradient(energy, t, edge_order=2)) - 2.0) < 1e-3
    assert math.isnan(D.kl_exponent([1.0, 1.0], [0.0, 0.0], 0.0)[0])
    # a tail far from its limit (E falls 5% of the way to it) does not determine E*: nan, not a guess
    t = np.linspace(0.0, 5.0, 101)
    assert math.isnan(D.fit_e_star(3.0 * np.exp(-0.01 * t), 0.03 * np.exp(-0.01 * t)))


def test_energy_identity_residual_is_second_order_and_exact_for_linear_dissipation():
    def residual(n):
        t = np.linspace(0.0, 2.0, n + 1)
        return D.energy_identity_residual(t, np.exp(-t), np.exp(-t))[-1]
    order = math.log2(abs(residual(20) / residual(40)))
    assert abs(order - 2.0) < 0.05
    t = np.linspace(0.0, 3.0, 7)
    assert np.max(np.abs(D.energy_identity_residual(t, -(t + t ** 2 / 2), 1.0 + t))) < 1e-14


def test_a_tail_fit_that_moves_with_the_window_is_no_e_star():
    """The fitted E* interval assumes an asymptotic tail. On a pure exponential tail the fits on the window and
    its halves agree and hold the true limit; on a two-time-scale curve seen mid-transition the window's interval
    misses the true limit (1), the halves disagree with it, and the fit is refused with a note."""
    from pdeflow.analysis.diagnostics.analysis import _fit_moves_with_the_window

    t = np.linspace(0.0, 100.0, 401)
    energy, dissipation = 1.0 + np.exp(-0.05 * t), 0.05 * np.exp(-0.05 * t)
    window = t >= 50.0
    fitted = D.fit_e_star_interval(energy[window], dissipation[window])
    assert fitted[1] <= 1.0 <= fitted[2]
    assert _fit_moves_with_the_window(fitted, t, energy, dissipation, 50.0, 100.0) == ""
    t = np.linspace(0.0, 40.0, 161)
    energy = 1.0 + np.exp(-0.2 * t) + 0.05 * np.exp(-0.02 * t)
    dissipation = 0.2 * np.exp(-0.2 * t) + 0.001 * np.exp(-0.02 * t)
    window = t >= 10.0
    fitted = D.fit_e_star_interval(energy[window], dissipation[window])
    assert math.isfinite(fitted[0]) and not fitted[1] <= 1.0 <= fitted[2]  # an interval that misses the limit
    assert "moves with the window" in _fit_moves_with_the_window(fitted, t, energy, dissipation, 10.0, 40.0)


def test_a_tail_fit_bounded_from_above_only_gives_no_point_estimate():
    """A noisy power-law tail far from its limit (E = 1 + t^-1/2, I with 5 % noise, t <= 100): the profile bounds
    E* from above only, and its point estimate misses the limit 1 by 0.07. The analysis keeps no E* and says so."""
    from pdeflow.analysis.diagnostics.analysis import Analysis, _rates
    from pdeflow.core.config import DiagnosticsConfig

    t = np.geomspace(1.0, 100.0, 60)
    energy = 1.0 + t ** -0.5
    dissipation = 0.5 * t ** -1.5 * np.exp(0.05 * np.random.default_rng(0).standard_normal(t.size))
    fitted = D.fit_e_star_interval(energy[t >= 50.0], dissipation[t >= 50.0])
    assert fitted[1] == -math.inf and fitted[0] - 1.0 > 0.05  # the point estimate is a guess
    nan = np.full(t.size, np.nan)
    a = Analysis(t, energy, dissipation, *([nan] * 12))
    _rates(a, DiagnosticsConfig(), t, energy, dissipation)
    assert a.e_star_source == "none" and not math.isfinite(a.e_star)
    assert any(f"E* <= {fitted[2]:.10g} (95%)" in note for note in a.notes)


def test_energy_identity_residual_takes_the_runs_own_quadrature():
    """Given the steps' integrals of I (a run's /steps/dissipation_integral), the residual is E - E(0) + their
    cumulative sum: zero for exact integrals where the trapezoid rule is not; a non-finite integral (a stepper
    without the identity) falls back to the trapezoid rule."""
    t = np.linspace(0.0, 2.0, 11)
    exact = np.concatenate([[np.nan], np.exp(-t[:-1]) - np.exp(-t[1:])])
    own = D.energy_identity_residual(t, np.exp(-t), np.exp(-t), exact)
    trapezoid = D.energy_identity_residual(t, np.exp(-t), np.exp(-t))
    assert np.max(np.abs(own)) < 1e-15 and abs(trapezoid[-1]) > 1e-3
    broken = exact.copy()
    broken[4] = np.nan
    np.testing.assert_array_equal(D.energy_identity_residual(t, np.exp(-t), np.exp(-t), broken), trapezoid)


# ---- the optimality gap ------------------------------------------------------------------------
def brute_force_min(problem: Problem, G: np.ndarray, domain: D.Domain, n: int) -> float:
    mesh, inside = domain.grid(n)
    return float(np.min(problem.phi_field(mesh[inside], G)))


@pytest.mark.parametrize("domain,radius", [("ball", 2.0), ("box", 2.0), ("ball", 0.4)])
def test_gap_search_agrees_with_brute_force_on_two_coordinates(domain, radius):
    """k = 2: the gap's minimum is no higher than Phi on a 161 x 161 grid of Omega and at most a grid cell's
    curvature below it; with the small ball the minimum sits on the circle."""
    problem = build_config_problem(model={"coordinates": "gain2", "weight_decay": 0.05})
    rng = np.random.default_rng(3)
    omega, mass = rng.normal(size=(6, 2)), rng.dirichlet(np.ones(6))
    res = D.optimality_gap(problem, omega, mass, domain=domain, radius=radius, n_starts=4, grid_points=16)
    G = problem.residual_features(omega, mass)
    dom = D.Domain.make(domain, 2, radius)
    brute = brute_force_min(problem, G, dom, 161)
    assert res.exhaustive
    assert res.min_phi <= brute + 1e-12
    assert brute - res.min_phi < 1e-3
    assert abs(problem.phi(res.minimizer[None], omega, mass)[0] - res.min_phi) < 1e-13
    assert abs(res.mean_phi - mass @ problem.phi(omega, omega, mass)) < 1e-13
    assert not dom.outside(res.minimizer[None])[0]
    if radius < 1:
        assert abs(np.linalg.norm(res.minimizer) - radius) < 1e-9


def build_config_problem(**overrides) -> Problem:
    return Problem.from_config(build_config(**overrides))


def test_zero_head_is_stationary_but_not_optimal():
    """The Dirac at omega = 0 (full coordinates) is stationary: theta = 0 has WO = WV = 0, so every
    component of grad Phi vanishes; with a small weight decay Phi is lower elsewhere and G > 0."""
    problem = build_config_problem(model={"weight_decay": 0.01})
    omega, mass = np.zeros((1, problem.k)), np.ones(1)
    assert np.max(np.abs(problem.grad_phi(omega, omega, mass))) == 0.0
    res = D.optimality_gap(problem, omega, mass, radius=3.0, n_starts=8)
    assert not res.exhaustive
    assert res.mean_phi == 0.0
    assert res.gap > 0.05
    assert np.linalg.norm(res.minimizer) <= 3.0 * (1 + 1e-12)
    assert abs(problem.phi(res.minimizer[None], omega, mass)[0] + res.gap) < 1e-13
    # the minimizer is a KKT point of min Phi on the ball: grad Phi = -nu omega with nu >= 0 on the sphere
    g = problem.grad_phi(res.minimizer[None], omega, mass)[0]
    w = res.minimizer
    if np.linalg.norm(w) > 3.0 * (1 - 1e-6):
        nu = -(g @ w) / (w @ w)
        assert nu >= 0
        assert np.linalg.norm(g + nu * w) < 1e-5 * max(1.0, np.linalg.norm(g))
    else:
        assert np.linalg.norm(g) < 1e-5


def test_gap_search_in_full_coordinates_ends_at_kkt_points():
    """k = 56, random measure: minimizer in the box / ball and satisfying the KKT conditions there."""
    problem = build_config_problem(model={"weight_decay": 0.1})
    rng = np.random.default_rng(0)
    omega, mass = 0.5 * rng.normal(size=(8, problem.k)), np.full(8, 1 / 8)
    for domain in ("ball", "box"):
        res = D.optimality_gap(problem, omega, mass, domain=domain, radius=2.0, n_starts=4, seed=1)
        g = problem.grad_phi(res.minimizer[None], omega, mass)[0]
        w = res.minimizer
        assert res.gap >= 0 and res.min_phi <= np.min(problem.phi(omega, omega, mass))
        if domain == "box":
            assert np.all(np.abs(w) <= 2.0)
            free = np.abs(w) < 2.0 - 1e-8
            assert np.max(np.abs(g[free])) < 1e-5
            assert np.all(g[~free] * np.sign(w[~free]) <= 1e-8)     # pushing outward only
        else:
            assert np.linalg.norm(w) <= 2.0 * (1 + 1e-12)
            nu = max(0.0, -(g @ w) / (w @ w)) if np.linalg.norm(w) > 2.0 * (1 - 1e-6) else 0.0
            assert np.linalg.norm(g + nu * w) < 1e-5


def test_output_gain_long_run_reaches_the_support_condition(tmp_path):
    """1-D output gain: Phi(w) = a w + (lam/2) w^2 + c, so G = (lam/2) sum_i m_i (w_i - w*)^2 with w* = -a/lam.
    Particles uniform on Omega = [-4, 4] converge; the gap falls below 1e-3 and equals the closed form,
    and the PL ratio tends to lam (the spread contracts at rate lam)."""
    lam, R = 0.2, 4.0
    cfg, path = run_config(tmp_path, "gain", on_finish=ANALYSE_WITH_GAP,
                           model={"coordinates": "output_gain", "weight_decay": lam},
                           init={"n_particles": 24, "distribution": "uniform", "scale": R},
                           solver={"method": "rk4", "dt": 0.5}, run={"t_end": 40.0, "frame_interval": 4.0},
                           diagnostics={"gap_frames": 3, "n_starts": 4, "grid_points": 64, "radius": R})
    traj = open_trajectory(path)
    a = D.read_analysis(traj)
    problem = traj.problem()
    omega, mass = D.frame_measure(traj, -1)
    G = problem.residual_features(omega, mass)
    phi0, phi1 = problem.phi_field(np.array([[0.0], [1.0]]), G)
    w_star = -(phi1 - phi0 - lam / 2) / lam
    assert abs(w_star) < R
    closed = lam / 2 * np.sum(mass * (omega[:, 0] - w_star) ** 2)
    assert a.gap[-1] < 1e-3
    assert abs(a.gap[-1] - closed) < 1e-9 + 1e-6 * closed
    assert abs(a.minimizer[-1, 0] - w_star) < 1e-7
    assert a.gap[0] > 0.1 and not a.gap_is_estimate
    assert abs(a.pl_mu[-1] / lam - 1) < 1e-3
    assert abs(a.kl_theta - 0.5) < 0.02
    # the residual is the run's own: E - E(0) + the steps' RK4 quadratures of I, at the frames
    steps = traj.steps
    quadrature = np.concatenate([[0.0], np.cumsum(steps["dissipation_integral"][1:])])
    recomputed = steps["energy"] - steps["energy"][0] + quadrature
    np.testing.assert_allclose(a.energy_identity_residual, np.interp(a.time, steps["time"], recomputed), rtol=0,
                               atol=1e-15)
    assert np.max(np.abs(a.energy_identity_residual)) < 1e-4 * (a.energy[0] - a.energy[-1])  # RK4, dt = 0.5


def test_output_gain_grid_run_reaches_the_support_condition(tmp_path):
    """The same family on a finite-volume grid whose density covers Omega (the grid box [-4, 4]): G falls
    below 1e-3 (down to the grid's resolution) and equals (lam/2) sum_c m_c (c - w*)^2 over the cells."""
    lam = 0.2
    _, path = run_config(tmp_path, "fv", on_finish=ANALYSE_WITH_GAP,
                         model={"coordinates": "output_gain", "weight_decay": lam},
                         init={"measure": "grid", "distribution": "uniform", "scale": 3.9},
                         grid={"n": 64, "radius": 4.0}, solver={"method": "fv", "dt": 0.5},
                         run={"t_end": 40.0, "frame_interval": 8.0}, diagnostics={"domain": "grid", "gap_frames": 2})
    traj = open_trajectory(path)
    a = D.read_analysis(traj)
    problem = traj.problem()
    omega, mass = D.frame_measure(traj, -1)
    phi0, phi1 = problem.phi_field(np.array([[0.0], [1.0]]), problem.residual_features(omega, mass))
    w_star = -(phi1 - phi0 - lam / 2) / lam
    closed = lam / 2 * np.sum(mass * (omega[:, 0] - w_star) ** 2)
    assert a.gap[0] > 0.1 and a.gap[-1] < 1e-3
    assert abs(a.gap[-1] - closed) < 1e-9


def test_pl_ratio_of_a_dirac_tends_to_the_translation_hessian(tmp_path):
    """A Dirac moves by the one-head energy e(w): near its minimizer w*, I / (2 (e - e*)) -> e''(w*),
    which Problem.translation_hvp gives independently; E* from a scalar minimization of e."""
    from scipy.optimize import minimize_scalar

    cfg, path = run_config(tmp_path, "dirac", model={"coordinates": "output_gain", "weight_decay": 0.05},
                           init={"n_particles": 1, "distribution": "point", "mean": [2.0]},
                           solver={"method": "rk4", "dt": 0.1}, run={"t_end": 30.0, "frame_interval": 3.0})
    problem = Problem.from_config(cfg)
    e = minimize_scalar(lambda w: problem.energy(np.array([[w]]), np.ones(1)), bracket=(-1.0, 1.0), tol=1e-12)
    htr = problem.translation_hvp(np.array([e.x]), np.ones(1))[0]
    a = D.analyse(open_trajectory(path), DiagnosticsConfig(gap=False, e_star=float(e.fun)))
    assert a.e_star_source == "given"
    assert abs(a.pl_mu[-1] / htr - 1) < 0.01
    assert abs(a.kl_theta - 0.5) < 0.02


def test_lower_bound_never_exceeds_the_energy_of_any_run(tmp_path):
    """gain2 (certified search): the certified bound E - gap_bound at every analysed frame of three runs
    (methods and seeds differ) is below the lowest energy any run reached and below E of random measures on
    Omega, and below E - G (G from the least Phi found); the runs' final E - G agree with each other far more
    closely than with the energies reached (all approach min E from below)."""
    R = 3.0
    common = {"model": {"coordinates": "gain2", "weight_decay": 0.2},
              "run": {"t_end": 10.0, "frame_interval": 1.0},
              "diagnostics": {"gap_frames": 4, "n_starts": 4, "grid_points": 24, "radius": R}}
    lower, lowest, final = [], math.inf, []
    for method, seed, dt in [("rk4", 0, 0.2), ("heun", 1, 0.1), ("adaptive", 2, 0.2)]:
        _, path = run_config(tmp_path, method, on_finish=ANALYSE_WITH_GAP, **common,
                             init={"n_particles": 12, "seed": seed, "scale": 0.8}, solver={"method": method, "dt": dt})
        traj = open_trajectory(path)
        a = D.read_analysis(traj)
        assert np.all(a.outside_mass[a.gap_frames] == 0) and not a.gap_is_estimate
        assert np.all(a.gap_certified[a.gap_frames])
        found = a.energy[a.gap_frames] - a.gap[a.gap_frames]
        assert np.all(a.lower_bound[a.gap_frames] <= found)
        lower.extend(a.lower_bound[a.gap_frames])
        final.append(found[-1])
        lowest = min(lowest, float(np.min(traj.steps["energy"])))
    problem = traj.problem()
    rng = np.random.default_rng(5)
    dom = D.Domain.make("ball", 2, R)
    random_energies = [problem.energy(dom.sample(8, rng), rng.dirichlet(np.ones(8))) for _ in range(50)]
    assert max(lower) <= lowest
    assert max(lower) <= min(random_energies)
    assert max(final) - min(final) < 1e-4 < lowest - max(final)
    assert max(final) <= min(random_energies)


def test_omega_is_enlarged_to_hold_the_support_so_the_gap_is_never_negative(tmp_path):
    """The gap compares Phi off the support with its mean on it: with diagnostics.radius far inside the particles,
    Omega grows to SUPPORT_MARGIN x the farthest particle analysed (noted), every particle lies in it, and G >= 0
    at every analysed frame (the particles are among the search's starts: min Phi <= its mean on rho). With the
    configured ball alone every particle lay outside it (outside mass 1 at every frame); on majority.toml's 16-head
    minimum (heads up to |omega| = 18.3, ball 5) G came out -0.022 there."""
    common = {"model": {"coordinates": "gain2", "weight_decay": 0.2},
              "run": {"t_end": 4.0, "frame_interval": 1.0},
              "diagnostics": {"gap_frames": 3, "n_starts": 4, "grid_points": 16, "radius": 0.05}}
    _, path = run_config(tmp_path, "small", on_finish=ANALYSE_WITH_GAP, **common,
                         init={"n_particles": 8, "seed": 0, "scale": 0.8}, solver={"method": "rk4", "dt": 0.2})
    traj = open_trajectory(path)
    a = D.read_analysis(traj)
    reach = max(float(np.linalg.norm(traj.frames["omega"][f], axis=1).max()) for f in a.gap_frames)
    assert a.gap_radius == pytest.approx(D.SUPPORT_MARGIN * reach) and a.gap_radius > 0.05
    assert np.all(a.outside_mass[a.gap_frames] == 0) and np.all(a.gap[a.gap_frames] >= -1e-12)
    assert any(note.startswith("Omega enlarged from the ball 0.05") for note in a.notes)


# ---- attention maps and head clusters ----------------------------------------------------------
def test_attention_pattern_reproduces_the_problem_logits():
    """z[l] = U WO sum_j a[l, j] WV x_j for one head of mass one: the attention helper and Problem.logits agree."""
    problem = build_config_problem(model={"positions": "sinusoidal", "embedding": "gaussian"})
    rng = np.random.default_rng(1)
    omega = rng.normal(size=(3, problem.k))
    probe = D.probe_sequence(problem)
    att = D.attention_pattern(problem, problem.theta(omega), probe)
    T = probe.size
    assert att.shape == (3, T, T)
    upper = np.triu_indices(T, 1)
    assert np.allclose(att.sum(axis=-1), 1.0) and np.all(att[:, upper[0], upper[1]] == 0)
    arrays = problem.arrays()
    x = arrays["embedding"][probe] + arrays["positions"]
    b = int(np.argmax(arrays["weights"]))
    from pdeflow.core.model import split_theta
    _, _, wv, wo = split_theta(problem.theta(omega), problem.d, problem.head_dim)
    for h in range(3):
        z = (att[h] @ (x @ wv[h].T)) @ wo[h].T @ arrays["unembedding"].T
        expected = problem.logits(omega[h:h + 1], np.ones(1))[b]
        assert np.max(np.abs(z - expected)) < 1e-12 * max(1.0, np.max(np.abs(expected)))


def test_head_clusters_find_separated_groups_and_their_masses():
    problem = build_config_problem(model={"coordinates": "gain3"})
    rng = np.random.default_rng(2)
    centres = np.array([[2.0, 0.0, 0.0], [-2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    sizes = [5, 9, 3]
    omega = np.concatenate([c + 1e-3 * rng.normal(size=(n, 3)) for c, n in zip(centres, sizes)])
    mass = rng.dirichlet(np.ones(omega.shape[0]))
    hc = D.head_clusters(problem, omega, mass, tol=0.1, attention_maps=2)
    assert len(hc.mass) == 3
    group = np.repeat(np.arange(3), sizes)
    for c in range(3):
        members = hc.labels == c
        assert len(set(group[members])) == 1
        assert abs(hc.mass[c] - mass[members].sum()) < 1e-15
        assert hc.labels[hc.representative[c]] == c
    assert np.all(np.diff(hc.mass) <= 0) and hc.size.sum() == omega.shape[0]
    assert hc.attention.shape == (2, problem.seq_len, problem.seq_len)
    # far more heads than the linkage takes: the subsample-and-assign path gives the same grouping
    many = np.concatenate([c + 1e-3 * rng.normal(size=(900, 3)) for c in centres])
    hc = D.head_clusters(problem, many, np.full(2700, 1 / 2700), tol=0.1, attention_maps=0)
    assert len(hc.mass) == 3 and np.allclose(hc.mass, 1 / 3)


# ---- the file: /analysis, analyse_run, grid files ----------------------------------------------
def test_analyse_run_writes_only_analysis_and_respects_settings(tmp_path):
    cfg, path = run_config(tmp_path, "plain", model={"coordinates": "gain2"}, init={"n_particles": 8},
                           run={"t_end": 2.0, "frame_interval": 0.5})
    with h5py.File(path, "r") as f:
        before = {k: f["frames"][k][()] for k in f["frames"]}
        steps = f["steps"]["energy"][()]
    assert "analysis" not in h5py.File(path, "r")
    D.analyse_run(path, cfg.replace(diagnostics={"enabled": False}))
    assert "analysis" not in h5py.File(path, "r")
    D.analyse_run(path, cfg.replace(diagnostics={"gap": False}))
    a = D.read_analysis(open_trajectory(path))
    # gap off: E* could only come from the tail fit, which this early window (t <= 2) does not support
    assert not a.gap_computed and np.all(np.isnan(a.gap)) and a.e_star_source in ("fit", "none")
    # after a run the gap is left to diagnose and report, whatever diagnostics.gap says
    D.analyse_run(path, cfg.replace(diagnostics={"gap_frames": 2, "n_starts": 2, "grid_points": 8}))
    a = D.read_analysis(open_trajectory(path))
    assert not a.gap_computed and np.all(np.isnan(a.gap)) and D.GAP_ON_REQUEST in a.notes
    D.analyse_run(path, cfg.replace(diagnostics={"gap_frames": 2, "n_starts": 2, "grid_points": 8}), gap=True)
    traj = open_trajectory(path)
    a = D.read_analysis(traj)
    assert list(a.gap_frames) == [0, len(traj.time) - 1] and a.gap_computed
    with h5py.File(path, "r") as f:
        assert set(f.keys()) == {"model", "data", "frames", "steps", "checkpoint", "analysis"}
        for k, v in before.items():
            assert np.array_equal(f["frames"][k][()], v)
        assert np.array_equal(f["steps"]["energy"][()], steps)
        for key in ("time", "gap", "lower_bound", "pl_mu", "energy_identity_residual"):
            assert f["analysis"][key].shape == (len(traj.time),)
        for key in ("kl_theta", "e_star", "stationary_time", "gap_is_estimate"):
            assert key in f["analysis"].attrs
        assert f["analysis"].attrs["kl_theta_range"].shape == (2,)
    assert traj.attrs["status"] == "finished"


def test_a_file_still_being_written_is_analysed_but_never_edited(tmp_path, capsys):
    """While a run's writer holds the file (SWMR), diagnose prints the committed frames with --no-write and
    refuses to store /analysis (exit 2, one line), leaving the file byte for byte as it was."""
    cfg = build_config(model={"coordinates": "gain2"}, init={"n_particles": 4})
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    path = tmp_path / "live.h5"
    writer = TrajectoryWriter.create(path, cfg, problem.arrays(), {"omega": omega, "mass": mass})
    try:
        for j in range(3):
            ev = problem.evaluate(omega, mass)
            writer.append_frame({"omega": omega, "mass": mass}, {"time": 0.1 * j, "step": j, "dt": 0.1,
                                                                 "wall_time": 0.0, "energy": ev.energy,
                                                                 "dissipation": ev.dissipation})
            writer.write_checkpoint(Checkpoint(fields={"omega": omega, "mass": mass}, t=0.1 * j, dt=0.1, step=j,
                                               n_frames=j + 1, n_steps=0))
            omega = omega - 0.1 * ev.grad_phi
        before = path.read_bytes()
        with pytest.raises(TrajectoryError, match="a run is writing"):
            D.write_analysis(path, D.analyse(open_trajectory(path), DiagnosticsConfig(gap=False)))
        assert main(["diagnose", str(path), "--no-gap"]) == 2
        assert "a run is writing" in capsys.readouterr().err
        assert main(["diagnose", str(path), "--no-gap", "--no-write"]) == 0
        assert "0.2" in capsys.readouterr().out
        assert path.read_bytes() == before
    finally:
        writer.close()


def test_stationary_time_is_the_first_frame_after_which_dissipation_stays_small(tmp_path):
    cfg, path = run_config(tmp_path, "stat", model={"coordinates": "output_gain", "weight_decay": 0.5},
                           init={"n_particles": 4}, solver={"dt": 0.25}, run={"t_end": 40.0, "frame_interval": 2.0})
    traj = open_trajectory(path)
    tol = 1e-6
    a = D.analyse(traj, DiagnosticsConfig(gap=False, stationary_tol=tol))
    i = traj.frames["dissipation"]
    first = np.flatnonzero(i <= tol)[0]
    assert np.all(i[first:] <= tol) and i[first - 1] > tol
    assert a.stationary_time == traj.time[first]


def write_grid_file(path: Path, k: int = 2, n: int = 12, beta: float = math.inf) -> Path:
    """A grid trajectory as the grid solver writes it: /frames/density with the Grid's /frames attributes.
    The densities are Gaussians contracting in time (masses density * cell volume sum to one)."""
    cfg = build_config(model={"coordinates": {1: "output_gain", 2: "gain2", 3: "gain3"}[k], "beta": beta},
                       init={"measure": "grid"}, solver={"method": "fv"}, diagnostics={"domain": "grid"},
                       grid={"n": n, "radius": 2.0})
    problem = Problem.from_config(cfg)
    grid = Grid.from_config(cfg.grid, k)
    writer = TrajectoryWriter.create(path, cfg, problem.arrays(), {"density": np.zeros(grid.shape)},
                                     frame_attrs=grid.frame_attrs(), measure="grid", beta=beta)
    for j, s in enumerate([1.0, 0.7, 0.5]):
        density = grid.gaussian(0.0, s)
        writer.append_frame({"density": density}, {"time": float(j), "step": j, "dt": 1.0, "wall_time": 0.0,
                                                   "energy": free_energy(problem, grid, density),
                                                   "dissipation": 0.1 / (j + 1)})
    writer.finish("finished", "synthetic")
    return path


def test_grid_files_are_analysed_as_weighted_cell_centres(tmp_path):
    path = write_grid_file(tmp_path / "grid.h5")
    traj = open_trajectory(path)
    omega, mass = D.frame_measure(traj, 1)
    assert omega.shape == (144, 2) and abs(mass.sum() - 1) < 1e-12
    assert np.allclose(omega[:12, 1], -2 + (np.arange(12) + 0.5) / 3) and np.allclose(omega[::12, 0], omega[:12, 1])
    a = D.analyse(traj, DiagnosticsConfig(domain="grid", gap_frames=1, grid_points=12, n_starts=2))
    problem = traj.problem()
    G = problem.residual_features(*D.frame_measure(traj, 2))
    dom = D.Domain.make("grid", 2, 0.0, (np.full(2, -2.0), np.full(2, 2.0)))
    assert a.min_phi[-1] <= brute_force_min(problem, G, dom, 201) + 1e-12
    assert np.all(np.abs(a.minimizer[-1]) <= 2.0) and a.lower_bound[-1] <= a.energy[-1]
    # the heads of a grid: one blob of cells around the Gaussian's centre, light cells in no cluster
    c = a.clusters
    assert len(c.mass) == 1 and 0.9 < c.mass[0] < 1.0 and np.all(np.abs(c.centre[0]) < 1e-12)
    last = D.frame_measure(traj, 2)[1]
    assert np.all(last[c.labels == -1] <= 1e-2 * last.max()) and np.all(last[c.labels == 0] > 1e-2 * last.max())
    with pytest.raises(Exception, match="diagnostics.domain"):
        D.optimality_gap(problem, omega, mass, domain="grid")


def test_entropic_gap_of_a_grid_density_is_the_relative_entropy_to_its_gibbs_density(tmp_path):
    """beta < inf: without a data term (unembedding zero) Phi = (lam/2)|omega|^2 does not depend on rho, so the
    Gibbs density exp(-beta Phi) / Z has gap zero and any other density has gap KL(m || g) / beta; with data,
    the Gibbs fixed point has gap zero and E - G is below the energy of every grid density tried."""
    beta = 4.0
    cfg = build_config(model={"coordinates": "gain2", "beta": beta, "unembedding": "zero", "weight_decay": 0.3},
                       init={"measure": "grid"}, solver={"method": "fv"}, grid={"n": 10, "radius": 2.0})
    problem, grid = Problem.from_config(cfg), Grid.from_config(cfg.grid, 2)
    c = grid.centres
    g = np.exp(-beta * 0.15 * np.einsum("ck,ck->c", c, c))
    g /= g.sum()
    assert abs(D.entropic_gap(problem, grid, grid.density(g)).gap) < 1e-13
    m = grid.masses(grid.gaussian([0.5, -0.3], 0.6))
    expected = float(np.sum(m * np.log(m / g))) / beta
    assert abs(D.entropic_gap(problem, grid, grid.density(m)).gap - expected) < 1e-12
    # with data: the damped Gibbs iteration m <- (m + g(m)) / 2 reaches the minimizer of E_h, where G = 0;
    # the bound of the starting density lies below the minimal energy
    problem = Problem.from_config(cfg.replace(model={"unembedding": "tied"}))
    m = grid.masses(grid.gaussian(0.0, 1.0))
    start = D.entropic_gap(problem, grid, grid.density(m))
    start_bound = free_energy(problem, grid, grid.density(m)) - start.gap
    for _ in range(25):
        omega, mass = grid.particles(grid.density(m))
        phi = problem.phi(omega, omega, mass)
        g = np.exp(-beta * (phi - phi.min()))
        m = 0.5 * m + 0.5 * g / g.sum()
    assert start.gap > 1e-3 and abs(D.entropic_gap(problem, grid, grid.density(m)).gap) < 1e-12
    assert start_bound <= free_energy(problem, grid, grid.density(m))
    path = write_grid_file(tmp_path / "ent.h5", beta=beta)
    traj = open_trajectory(path)
    a = D.analyse(traj, DiagnosticsConfig(domain="grid", gap_frames=3))
    problem, grid = traj.problem(), D.trajectory_grid(traj)
    rng = np.random.default_rng(0)
    others = [free_energy(problem, grid, grid.density(rng.dirichlet(np.full(grid.n_cells, 0.5)))) for _ in range(20)]
    others += [free_energy(problem, grid, grid.gaussian(rng.normal(size=2), 0.3 + rng.random())) for _ in range(20)]
    assert np.all(a.gap > 0) and not a.gap_is_estimate
    assert np.max(a.lower_bound) <= min(others) and np.max(a.lower_bound) <= np.min(a.energy)


# ---- the command -------------------------------------------------------------------------------
def test_diagnose_command_prints_stores_and_refuses_bad_input(tmp_path, capsys):
    _, path = run_config(tmp_path, "cli", model={"coordinates": "gain2"}, init={"n_particles": 6},
                         run={"t_end": 2.0, "frame_interval": 1.0})
    assert main(["diagnose", str(path), "--frames", "2", "--set", "n_starts=2", "--set", "grid_points=8"]) == 0
    out = capsys.readouterr().out
    assert "KL exponent" in out and "certified (grid" in out and "stored as /analysis" in out
    first = D.read_analysis(open_trajectory(path))
    # a rerun is seeded by the stored minimizers: the minimum found can only go down
    assert main(["diagnose", str(path), "--frames", "2", "--e-star", "0.5", "--set", "n_starts=0",
                 "--set", "grid_points=4"]) == 0
    second = D.read_analysis(open_trajectory(path))
    assert second.e_star == 0.5 and second.e_star_source == "given"
    assert np.all(second.min_phi[second.gap_frames] <= first.min_phi[first.gap_frames] + 1e-14)
    assert main(["diagnose", str(path), "--no-gap", "--no-write"]) == 0
    assert D.read_analysis(open_trajectory(path)).e_star == 0.5
    capsys.readouterr()
    for argv, needle in [(["--set", "radius=-1"], "diagnostics.radius"), (["--frames", "-1"], "diagnostics.gap_frames"),
                         (["--set", "run.t_end=3"], "only [diagnostics]"),
                         (["--set", "domain=grid"], "diagnostics.domain"),
                         (["--set", "nope=1"], "diagnostics.nope")]:
        assert main(["diagnose", str(path), *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1
    assert main(["diagnose", str(tmp_path / "missing.h5")]) == 2
    assert main(["diagnose", str(path), "--e-star", "abc"]) == 2


# ---- claims only where their assumptions hold -------------------------------------------------------------------
def test_no_lower_bound_for_a_flow_with_free_total_mass(tmp_path):
    """E - gap_bound bounds E over probability measures: a WFR run with solver.total_mass = 'free' (whose energy
    falls below any such bound: its limit is no probability measure) gets no lower bound and no certified E*, with
    a note saying why; the same run with a fixed total mass keeps its certified bound, below every energy."""
    from test_every_method import tiny_config

    analyses = {}
    for mass in ("free", "fixed"):
        cfg = tiny_config("wfr", "solver.gamma=1.0", f"solver.total_mass='{mass}'", "diagnostics.gap=true",
                          "diagnostics.gap_frames=1", "diagnostics.grid_points=16", "diagnostics.domain='box'",
                          "diagnostics.radius=3.0")
        path = tmp_path / f"{mass}.h5"
        assert run(cfg, Problem.from_config(cfg), path, quiet=True).status == "finished"
        analyses[mass] = D.analyse(open_trajectory(path), cfg.diagnostics)
    free, fixed = analyses["free"], analyses["fixed"]
    assert free.gap_certified.any() and np.all(np.isnan(free.lower_bound)) and free.e_star_source != "lower_bound"
    assert any("total_mass = 'free'" in note and "bounds nothing" in note for note in free.notes)
    bound = fixed.lower_bound[np.isfinite(fixed.lower_bound)]
    assert bound.size == 1 and bound[0] <= np.min(fixed.energy)
    assert not any("total_mass" in note for note in fixed.notes)


def test_diagnose_analyses_only_the_span_before_accuracy_was_lost(tmp_path, capsys):
    """Euler on the tiny problem, its per-step identity defects rising to 0.0497 at t = 0.4 (0.0488 at t = 0.3,
    0.0495 at t = 0.35): with run.identity_tol = 0.049 and run.accuracy = 'warn' the run goes on to t = 1 and its file
    says accuracy was lost at t = 0.35. diagnose says so in one line and analyses only the frames (t = 0, 0.25) and
    /steps rows before it: nothing after is fitted or tabulated beyond the file's own energies."""
    from test_every_method import tiny_config

    cfg = tiny_config("euler", "run.t_end=1.0", "run.identity_tol=0.049", "run.accuracy='warn'")
    path = tmp_path / "warned.h5"
    assert run(cfg, Problem.from_config(cfg), path, quiet=True).status == "finished"
    traj = open_trajectory(path)
    assert traj.attrs["accuracy_lost_at"] == pytest.approx(0.35) and len(traj.time) == 5
    assert main(["diagnose", str(path), "--no-gap"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "lost accuracy" in line]
    assert len(notes) == 1 and "t = 0.35" in notes[0] and "2 of 5 frames and 7 /steps rows" in notes[0], out
    a = D.read_analysis(open_trajectory(path))
    assert a.time.size == 5 and np.array_equal(a.energy, traj.frames["energy"])
    for name in ("energy_identity_residual", "pl_mu", "kl_predicted"):
        assert np.all(np.isnan(getattr(a, name)[2:])), name
    assert np.isfinite(a.energy_identity_residual[1])
    # the accurate span is all of a run that kept its accuracy: no note
    held = tiny_config("euler", "run.t_end=1.0")
    assert run(held, Problem.from_config(held), tmp_path / "held.h5", quiet=True).status == "finished"
    kept = D.analyse(open_trajectory(tmp_path / "held.h5"), held.diagnostics)
    assert not any("lost accuracy" in n for n in kept.notes)
