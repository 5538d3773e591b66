"""The independent oracle (tests/reference_model.py) where tests/core/test_core.py does not reach it: many heads
(several kernel tiles and chunks, the factored-table weight gradient of pdeflow.core.mean_field), second
derivatives (Problem.hvp and the whole-system JVP Problem.system_jvp, forward
mode, and its complex-step reference), and the grid measure's free
energy with its entropy term. Every expectation is recomputed by the oracle; nothing is a stored number."""
from __future__ import annotations

import math

import numpy as np
import pytest
from pdeflow.solvers import make_stepper

from conftest import build_config, random_arrays, random_measure, rel_err
from pdeflow.core import kernels, mean_field
from pdeflow.core.measure import Grid, free_energy
from pdeflow.core.problem import Problem
from reference_model import ReferenceModel

pytestmark = pytest.mark.usefixtures("one_numba_thread")


# ---- many heads: tiles, chunks, the factored-table gradient ---------------------------------------
def test_many_heads_take_the_factored_table_gradient_and_match_the_oracle(monkeypatch):
    """150 heads and 150 query points: three chunks of one 64-head tile (the last partial). V + T = 7 rows
    of tables against B T = 48 input rows, so the projections are factored and, with several chunks, grad
    Phi is the tables' weight gradient E^T S + P^T R (asserted by watching the kernel's table argument)."""
    rng = np.random.default_rng(2026)
    arrays = random_arrays(rng, V=3, T=4, d=4, dh=2, B=12)
    problem = Problem(arrays)
    data = problem._data64
    heads = 150
    omega, mass = random_measure(problem.k, heads, rng, 0.7)
    n_per_chunk = mean_field._blocks(data, 8, heads)[0]
    assert data.factored and mean_field.factored_projections(12, 4, 3)
    assert n_per_chunk == mean_field._tile(np.float64) == 64 and math.ceil(heads / n_per_chunk) == 3

    calls = []
    real = kernels.causal_attention_vjp

    def watched(*args):
        calls.append(args[-3] is not None)   # gtable: the per-position sums R of the factored gradient
        return real(*args)

    monkeypatch.setattr(kernels, "causal_attention_vjp", watched)
    grad = problem.grad_phi(omega, omega, mass)
    assert calls and all(calls)
    phi = problem.phi(omega, omega, mass)

    ref = ReferenceModel.from_arrays(arrays)
    assert rel_err(problem.logits(omega, mass), ref.logits(omega, mass)) <= 1e-12
    assert problem.energy(omega, mass) == pytest.approx(ref.energy(omega, mass), rel=1e-13)
    r = ref.residuals(omega, mass)
    assert rel_err(phi, [ref.phi_from_residuals(q, r) for q in omega]) <= 1e-12
    worst = max(rel_err(g, ref.grad_phi_from_residuals(q, r)) for g, q in zip(grad, omega))
    print(f"150 heads, 3 chunks, factored tables: worst relative grad Phi error {worst:.2e}")
    assert worst <= 1e-11
    # the whole-system JVP in forward mode (pdeflow.core.kernels_jvp) on the same three chunks, summed tables included
    u = rng.standard_normal(omega.shape)
    assert rel_err(problem.system_jvp(omega, mass, u), ref.velocity_jvp(omega, mass, u)) <= 1e-11


# ---- second derivatives ---------------------------------------------------------------------------
def test_oracle_hvp_is_its_gradient_differentiated():
    """The oracle's complex-step HVP against Richardson-extrapolated central differences of its own
    hand-written gradient (real arithmetic only)."""
    rng = np.random.default_rng(5)
    arrays = random_arrays(rng, V=3, T=4, d=4, dh=2, B=5)
    ref = ReferenceModel.from_arrays(arrays)
    omega, mass = random_measure(ref.k, 3, rng, 0.8)
    q, v = 0.8 * rng.standard_normal(ref.k), rng.standard_normal(ref.k)
    assert rel_err(ref.hvp(q, v, omega, mass), ref.hvp_central(q, v, omega, mass)) <= 1e-9


@pytest.mark.parametrize("k", [None, 3], ids=["full", "random-basis"])
def test_hvp_and_whole_system_jvp_match_the_oracle(k):
    """Problem.hvp (rho frozen) at a point off the support and at a particle, and Problem.system_jvp (particles
    and measure moved together), against the oracle's complex step through its own reverse pass."""
    rng = np.random.default_rng(17 if k is None else 18)
    arrays = random_arrays(rng, V=3, T=4, d=4, dh=2, B=6, k=k)
    problem = Problem(arrays)
    ref = ReferenceModel.from_arrays(arrays)
    scale = 0.8 if k is None else 1.5
    omega, mass = random_measure(problem.k, 4, rng, scale)
    for point in (scale * rng.standard_normal(problem.k), omega[1]):
        v = rng.standard_normal(problem.k)
        assert rel_err(problem.hvp(point, v, omega, mass), ref.hvp(point, v, omega, mass)) <= 1e-11
    u = rng.standard_normal(omega.shape)
    jvp, oracle = problem.system_jvp(omega, mass, u), ref.velocity_jvp(omega, mass, u)
    assert rel_err(jvp, oracle) <= 1e-11
    # the forward mode's complex-step reference agrees with the oracle too
    assert rel_err(problem.system_jvp_complex_step(omega, mass, u), oracle) <= 1e-11
    # the whole-system JVP is not the frozen HVP: the measure's motion adds to it
    frozen = np.array([ref.hvp(w, du, omega, mass) for w, du in zip(omega, u)])
    assert rel_err(frozen, oracle) > 1e-3


# ---- the grid measure's free energy with entropy ---------------------------------------------------
@pytest.mark.parametrize("beta", [5.0, math.inf])
def test_grid_free_energy_with_entropy_matches_the_oracle(beta):
    """E = R + (lam/2) int |w|^2 rho + (1/beta) int rho log rho of a density on an 8 x 8 grid (cells empty
    and occupied, non-uniform), as free_energy, the finite-volume evaluation and the grid JKO's
    linearization compute it, against the oracle's sum over cells."""
    cfg = build_config(model={"coordinates": "gain2", "beta": beta, "weight_decay": 0.1, "unembedding": "gaussian"},
                       init={"measure": "grid", "scale": 0.8}, grid={"n": 8, "radius": 2.0},
                       solver={"method": "fv"})
    problem = Problem.from_config(cfg)
    fv = make_stepper(problem, cfg)
    grid: Grid = fv.grid
    rng = np.random.default_rng(int(beta) if math.isfinite(beta) else 0)
    masses = rng.random(grid.n_cells) ** 2
    masses[rng.random(grid.n_cells) < 0.25] = 0.0
    masses /= masses.sum()
    rho = grid.density(masses)
    ref = ReferenceModel.from_arrays(problem.arrays())
    expected = ref.grid_free_energy(grid.centres, masses, grid.cell_volume, beta)
    if math.isfinite(beta):   # the entropy term is really there: it moves E by more than rounding
        assert abs(expected - ref.grid_free_energy(grid.centres, masses, grid.cell_volume, math.inf)) > 1e-3
    assert free_energy(problem, grid, rho) == pytest.approx(expected, rel=1e-12)
    assert fv.evaluate_density(rho).energy == pytest.approx(expected, rel=1e-12)
    jko = make_stepper(problem, cfg.replace(solver={"method": "jko"}))
    assert jko.linearization(masses)[0] == pytest.approx(expected, rel=1e-12)
