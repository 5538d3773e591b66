"""Labels no stronger than the evidence (pdeflow.analysis.diagnostics, ``pdeflow diagnose``).

- the optimality gap is *certified* only where min Phi is proven (k <= 3: a grid plus derivative bounds);
  the bounds are checked against the exact gradient and Hessian-vector products at random points, and the
  certificate against a much finer grid; in k = 64 the gap is an estimate and E - G never becomes E*;
- the KL exponent is reported only where E - E* is trustworthy, the local exponent is constant over the window and
  theta lies in (0, 1]; the range it is reported with contains the exponent of an exact power law (the coverage of
  the local exponent on a known two-mode flow: tests/analysis/test_kl_pl.py);
- particle runs with beta < inf (no entropy in their energy) get no energy identity, E*, PL or KL.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pdeflow.solvers.driver import run

from conftest import build_config, random_arrays
from pdeflow.analysis import diagnostics as D
from pdeflow.core.config import DiagnosticsConfig
from pdeflow.core.problem import Problem
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from pdeflow.io.trajectory_writer import TrajectoryWriter

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def random_problem(seed: int, k: int | None) -> Problem:
    return Problem(random_arrays(np.random.default_rng(seed), k=k))


# ---- the derivative bounds behind the certificate -----------------------------------------------
@pytest.mark.parametrize("seed,k", [(0, 2), (1, 3), (2, None), (3, 1)])
def test_derivative_bounds_hold_at_random_points(seed, k):
    """|grad Phi(x)| <= grad_phi_bound and |e^T H(x) e| <= hess_phi_bound for x in a ball about a centre, on
    random problems (random tables, masks with zeros, non-uniform weights, random bases; k = None: full)."""
    problem = random_problem(seed, k)
    rng = np.random.default_rng(10 + seed)
    omega, mass = rng.normal(size=(5, problem.k)), rng.dirichlet(np.ones(5))
    G = problem.residual_features(omega, mass)
    centres = 1.5 * rng.normal(size=(40, problem.k))
    radius = np.full(40, 0.3)
    u = rng.normal(size=(40, problem.k))
    x = centres + radius[:, None] * rng.random((40, 1)) * u / np.linalg.norm(u, axis=1, keepdims=True)
    _, grad = problem.grad_phi_field(x, G)
    L = D.grad_phi_bound(problem, centres, radius, G)
    M = D.hess_phi_bound(problem, centres, radius, G)
    assert np.all(np.linalg.norm(grad, axis=1) <= L)
    for j in range(0, 40, 4):
        e = rng.normal(size=problem.k)
        e /= np.linalg.norm(e)
        curvature = float(e @ problem.hvp(x[j], e, omega, mass))
        assert abs(curvature) <= M[j]


def test_data_terms_equal_a_direct_computation():
    """The maxima and sums behind certify._data_bounds, recomputed one input pair and one (b, l) at a time from
    theta(omega) (scores by exact central differences: s is quadratic in omega), equal _DataTerms to 1e-10."""
    from pdeflow.analysis.optimality.certify import _DataTerms
    from pdeflow.core.model import split_theta

    problem = random_problem(9, 2)
    rng = np.random.default_rng(9)
    a, d, dh, k = problem.arrays(), problem.d, problem.head_dim, 2
    inputs = a["embedding"][a["tokens"]] + a["positions"][None]
    G = problem.residual_features(rng.normal(size=(3, k)), np.ones(3) / 3)
    t = _DataTerms.of(problem, G, inputs)

    def heads(w):
        return [m[0] for m in split_theta(problem.coords.theta(np.atleast_2d(w)), d, dh)]

    def score(w, xl, xj):
        wq, wk, _, _ = heads(w)
        return a["score_scale"] * (wq @ xl) @ (wk @ xj)

    xs = np.unique(inputs.reshape(-1, d), axis=0)
    E, h = np.eye(k), 0.5
    u0 = w2 = 0.0
    u = np.zeros(k)
    for xl in xs:
        for xj in xs:
            g = np.array([(score(h * e, xl, xj) - score(-h * e, xl, xj)) / (2 * h) for e in E])
            S = np.array([[(score(h * (e + f), xl, xj) - score(h * (e - f), xl, xj) - score(h * (f - e), xl, xj)
                            + score(-h * (e + f), xl, xj)) / (4 * h * h) for f in E] for e in E])
            u0, w2, u = max(u0, np.linalg.norm(g)), max(w2, np.linalg.norm(S)), np.maximum(u, np.linalg.norm(S, axis=0))
    zero = heads(np.zeros(k))
    cols = [[m - z for m, z in zip(heads(e), zero)] for e in E]     # the blocks of each basis column
    values = [[np.linalg.norm(c[2] @ x) for c in cols] for x in xs]
    outs = [[np.linalg.norm(c[3].T @ g) for c in cols] for g in G.reshape(-1, d)]
    expected = {"u0": u0, "u": u, "w2": w2, "v0": max(np.linalg.norm(zero[2] @ x) for x in xs),
                "v": np.max(values, axis=0), "dv": max(np.linalg.norm(v) for v in values),
                "p0": sum(np.linalg.norm(zero[3].T @ g) for g in G.reshape(-1, d)),
                "p": np.sum(outs, axis=0), "q": sum(np.linalg.norm(o) for o in outs)}
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(t, name), value, rtol=1e-10, err_msg=name)


@pytest.mark.parametrize("seed,k", [(5, 1), (6, 2), (7, 3), (8, 2)])
def test_data_bounds_hold_against_exact_derivatives(seed, k):
    """The data bounds of the certificate (certify._data_bounds, reduced coordinates) alone: |grad Phi| and
    |e^T H e| (exact complex-step Hessian-vector products) at 200 points of balls of radius 0.5 about random
    centres, on random problems (random tables, positions, masks, nonzero theta0, random bases), stay below
    them; the largest ratio found is reported by the assertion message."""
    from pdeflow.analysis.optimality.certify import _BoundTerms, _data_bounds

    problem = random_problem(seed, k)
    rng = np.random.default_rng(20 + seed)
    omega, mass = rng.normal(size=(5, k)), rng.dirichlet(np.ones(5))
    G = problem.residual_features(omega, mass)
    terms = _BoundTerms.of(problem, G)
    centres = 1.5 * rng.normal(size=(200, k))
    radius = np.full(200, 0.5)
    u = rng.normal(size=(200, k))
    x = centres + radius[:, None] * rng.random((200, 1)) ** (1 / k) * u / np.linalg.norm(u, axis=1, keepdims=True)
    L, M = _data_bounds(terms.data, centres, radius, problem.weight_decay)
    _, grad = problem.grad_phi_field(x, G)
    assert np.all(np.linalg.norm(grad, axis=1) <= L), np.max(np.linalg.norm(grad, axis=1) / L)
    worst = 0.0
    for j in range(200):
        H = np.array([problem.hvp(x[j], e, omega, mass) for e in np.eye(k)])
        worst = max(worst, float(np.max(np.abs(np.linalg.eigvalsh((H + H.T) / 2)))) / M[j])
    assert worst <= 1.0, worst


@pytest.mark.parametrize("coords,domain,radius", [("gain2", "ball", 2.0), ("gain2", "box", 1.5),
                                                  ("output_gain", "ball", 4.0)])
def test_certified_minimum_is_below_a_much_finer_grid(coords, domain, radius):
    """k <= 2: the certified lower bound on min Phi lies below Phi everywhere on a 601-point-per-axis grid of
    Omega (and at the minimizer found), so G <= gap_bound; E - gap_bound <= E - G; and it lies within 1e-8 of
    the least Phi found."""
    problem = Problem.from_config(build_config(model={"coordinates": coords, "weight_decay": 0.05}))
    rng = np.random.default_rng(4)
    omega, mass = rng.normal(size=(6, problem.k)), rng.dirichlet(np.ones(6))
    res = D.optimality_gap(problem, omega, mass, domain=domain, radius=radius, n_starts=4, grid_points=16)
    assert res.certified and res.min_phi_lower <= res.min_phi and res.gap <= res.gap_bound
    dom = D.Domain.make(domain, problem.k, radius)
    mesh, inside = dom.grid(601 if problem.k == 2 else 20001)
    fine = problem.phi_field(mesh[inside], problem.residual_features(omega, mass))
    assert res.min_phi_lower <= fine.min() and res.min_phi <= fine.min() + 1e-12
    # tight: the data bounds (gain2: measured 1.0e-9 below the least Phi found; output_gain, a quadratic: 4.9e-10)
    assert res.min_phi - res.min_phi_lower < 1e-8


@pytest.mark.parametrize("domain,radius", [("ball", 1.5), ("box", 1.0)])
def test_certified_minimum_in_three_coordinates_is_below_a_fine_grid(domain, radius):
    """k = 3 (gain3), the largest k the certificate covers: the certified lower bound on min Phi lies below Phi on
    a 41-point-per-axis grid of Omega and below the least Phi found, G <= gap_bound, and the bound is within 1e-4
    of the least Phi found (measured 1.4e-5 on the ball, 1.1e-9 on the box)."""
    problem = Problem.from_config(build_config(model={"coordinates": "gain3", "weight_decay": 0.05}))
    assert problem.k == 3
    rng = np.random.default_rng(4)
    omega, mass = rng.normal(size=(6, 3)), rng.dirichlet(np.ones(6))
    res = D.optimality_gap(problem, omega, mass, domain=domain, radius=radius, n_starts=4, grid_points=16)
    assert res.certified and res.exhaustive and res.min_phi_lower <= res.min_phi and res.gap <= res.gap_bound
    mesh, inside = D.Domain.make(domain, 3, radius).grid(41)
    fine = problem.phi_field(mesh[inside], problem.residual_features(omega, mass))
    assert res.min_phi_lower <= fine.min() and res.min_phi <= fine.min() + 1e-12
    assert res.min_phi - res.min_phi_lower < 1e-4


def test_gap_in_64_coordinates_is_an_estimate_and_never_e_star(tmp_path):
    """Full coordinates, k = 64: the gap is not certified, lower_bound stays nan, the report says "estimate",
    and E* does not come from E - G."""
    cfg = build_config(model={"d": 8}, init={"n_particles": 6}, run={"t_end": 2.0, "frame_interval": 0.5},
                       diagnostics={"gap_frames": 2, "n_starts": 2})
    problem = Problem.from_config(cfg)
    assert problem.k == 64
    res = D.optimality_gap(problem, *problem.initial_measure(cfg), n_starts=2)
    assert not res.certified and not res.exhaustive and math.isnan(res.gap_bound) and math.isnan(res.min_phi_lower)
    path = tmp_path / "k64.h5"
    assert run(cfg, problem, path, quiet=True).status == "finished"
    a = D.analyse(open_trajectory(path), cfg.diagnostics)
    assert a.gap_is_estimate and a.gap_computed and not a.gap_certified.any()
    assert np.all(np.isnan(a.lower_bound)) and a.e_star_source != "lower_bound"
    assert any("the gap is an estimate" in n for n in a.notes)


# ---- KL: trust, range ------------------------------------------------------------------------
@pytest.mark.parametrize("a", [1.5, 2.0, 4.0])
def test_exact_power_law_interval_contains_its_exponent(a):
    """E - E* = (1 + t)^(-a) with the exact I = a (1 + t)^(-a-1): theta = (a - 1) / (2 a) lies in the range of the
    local exponent (its secants and their rounding), which stays narrow (< 1e-4: E - E* falls to 1e-13 |E|)."""
    t = np.linspace(0.0, 200.0, 2001)
    energy, dissipation = 1.5 + (1.0 + t) ** (-a), a * (1.0 + t) ** (-a - 1)
    fit = D.kl_fit(energy, dissipation, 1.5, window=0.5)
    truth = (a - 1) / (2 * a)
    assert fit.low <= truth <= fit.high and fit.high - fit.low < 1e-4 and abs(fit.theta - truth) < 1e-6


def test_kl_refused_outside_its_range_and_where_e_star_is_uncertain():
    """theta > 1 (I grows while E falls: the issue's case, a step that lost accuracy), E* far below the limit (the
    local exponent falls from 1/2 towards -inf: it drifts), and a window where E - E* is not 10x the width of E*'s
    interval: no KL regime, and the reason says which."""
    t = np.linspace(0.0, 20.0, 401)
    energy = 1.0 + np.exp(-0.05 * t)
    fit = D.kl_fit(energy, 0.01 * np.exp(0.1 * t), 1.0)
    assert math.isnan(fit.theta) and fit.fitted > 1 and "outside (0, 1]" in fit.reason
    energy, dissipation = 1.0 + np.exp(-t), np.exp(-t)
    fit = D.kl_fit(energy, dissipation, 1.0 - 1e-3)
    assert math.isnan(fit.theta) and fit.reason.startswith("pre-asymptotic: the local exponent drifts from 0.4")
    assert fit.local.theta[-1] < 0   # I ~ (E - E* - 1e-3): the local exponent falls without bound
    fit = D.kl_fit(energy, dissipation, 1.0, e_star_range=(1.0 - 0.2, 1.0))
    assert math.isnan(fit.theta) and "10 x the width" in fit.reason
    ok = D.kl_fit(energy, dissipation, 1.0, e_star_range=(1.0 - 1e-6, 1.0))
    assert abs(ok.theta - 0.5) < 1e-3 and ok.low <= 0.5 <= ok.high
    assert ok.n_points < t.size                        # the samples within 10 widths of E* are left out
    assert np.all(D.trusted_excess(energy, (1.0 - 1e-6, 1.0)) == (energy - 1.0 >= 1e-5))


def test_fitted_e_star_interval_holds_the_limit():
    """Exponential and power-law tails: the profile interval of the fitted E* contains the true limit and is
    narrow; a tail far from its limit gives nan."""
    t = np.linspace(0.0, 20.0, 401)
    for energy, limit in [(-0.4 + 3.0 * np.exp(-0.5 * t), -0.4), (2.0 + (1.0 + t) ** -2.0, 2.0)]:
        dissipation = -np.gradient(energy, t, edge_order=2)
        e_star, lo, hi = D.fit_e_star_interval(energy, dissipation)
        assert lo <= e_star <= hi and hi - lo < 1e-2 * (energy[0] - limit)
        assert abs(e_star - limit) < 1e-3
    t = np.linspace(0.0, 5.0, 101)
    assert math.isnan(D.fit_e_star_interval(3.0 * np.exp(-0.01 * t), 0.03 * np.exp(-0.01 * t))[0])


def test_pl_ratio_only_where_e_minus_e_star_is_trusted(tmp_path):
    """Given E* a little off the limit of a run, frames within 10 widths of the interval are nan, others
    carry I / (2 (E - E*)). The run goes to t = 60, where its tail is asymptotic (to t = 20 or 40 the fits on the
    window's halves disagree, and the window's own interval misses the limit 1.0890830420264 of a run to
    t = 120: no E*)."""
    cfg = build_config(model={"coordinates": "output_gain", "weight_decay": 0.2}, init={"n_particles": 4},
                       solver={"method": "rk4", "dt": 0.25}, run={"t_end": 60.0, "frame_interval": 1.0})
    path = tmp_path / "pl.h5"
    assert run(cfg, Problem.from_config(cfg), path, quiet=True).status == "finished"
    a = D.analyse(open_trajectory(path), DiagnosticsConfig(gap=False))
    assert a.e_star_source == "fit" and a.e_star_low <= a.e_star <= a.e_star_high
    assert a.e_star_low <= 1.0890830420264 <= a.e_star_high
    trusted = D.trusted_excess(a.energy, (a.e_star_low, a.e_star_high))
    assert np.all(np.isnan(a.pl_mu[~trusted])) and np.all(np.isfinite(a.pl_mu[trusted]))
    assert trusted.sum() >= 3


# ---- beta < inf with particles -----------------------------------------------------------------
def test_finite_beta_particles_are_refused_with_a_note(tmp_path, capsys):
    """Particles with beta = 4: the stored energy lacks the entropy; no identity residual, E*, PL or KL, one
    note in /analysis and in the printed report."""
    cfg = build_config(model={"coordinates": "gain2", "beta": 4.0}, init={"n_particles": 4})
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    path = tmp_path / "noisy.h5"
    writer = TrajectoryWriter.create(path, cfg, problem.arrays(), {"omega": omega, "mass": mass}, beta=4.0)
    for j in range(4):
        ev = problem.evaluate(omega, mass)
        writer.append_frame({"omega": omega, "mass": mass}, {"time": 0.5 * j, "step": j, "dt": 0.5, "wall_time": 0.0,
                                                             "energy": ev.energy, "dissipation": ev.dissipation})
        omega = omega - 0.5 * ev.grad_phi
    writer.finish("finished", "synthetic")
    a = D.analyse(open_trajectory(path), DiagnosticsConfig(gap=False))
    assert np.all(np.isnan(a.energy_identity_residual)) and np.all(np.isnan(a.pl_mu))
    assert a.e_star_source == "none" and math.isnan(a.kl_theta) and a.kl_status == D.ENTROPY_MISSING
    assert main(["diagnose", str(path), "--no-gap"]) == 0
    out = capsys.readouterr().out
    assert "energy ident. refused" in out and D.ENTROPY_MISSING in out
    stored = D.read_analysis(open_trajectory(path))
    assert D.ENTROPY_MISSING in stored.notes and stored.kl_status == D.ENTROPY_MISSING


# ---- the command on a run of the full-coordinate problem ------------------------------------------
def test_diagnose_labels_a_full_coordinate_run(tmp_path, capsys):
    """The full-coordinate problem's model (data/configs/full.toml: d = 16, dh = 4, k = 256) with 8 heads and t <= 4:
    `diagnose --set gap=true` labels the gap an estimate, stores no lower bound, and never takes E* from E - G."""
    qs = Path(__file__).resolve().parents[2] / "data" / "configs" / "full.toml"
    from pdeflow.core.config import load_config

    cfg = load_config(qs, ["init.n_particles=8", "run.t_end=4.0", "run.frame_interval=1.0", "task.n_samples=16",
                           "solver.dt=0.1"])
    path = tmp_path / "qs.h5"
    assert run(cfg, Problem.from_config(cfg), path, quiet=True).status == "finished"
    assert main(["diagnose", str(path), "--set", "gap=true", "--set", "n_starts=2", "--frames", "2"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE" in out and "E - G (none)" in out
    a = D.read_analysis(open_trajectory(path))
    assert a.gap_is_estimate and np.all(np.isnan(a.lower_bound)) and a.e_star_source in ("fit", "none")
    kl_line = next(line for line in out.splitlines() if line.startswith("KL exponent"))
    assert (("theta =" in kl_line and 0 < a.kl_theta <= 1)
            or any(why in kl_line for why in ("no KL regime in this window: ", "pre-asymptotic: ", "refused: ")))
