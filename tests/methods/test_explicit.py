"""Particle flow with the explicit steppers: exact solutions, convergence orders, the energy identity,
and the symmetries of the particle system (docs/model.md, "The flow and its particle form")."""
from __future__ import annotations

import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.base import State

from pdeflow import Problem, loads_config

SMALL = """
[task]
name = "markov"
vocab_size = 4
seq_len = 4
n_samples = 16
concentration = 0.5
[model]
d = 8
head_dim = 2
positions = "sinusoidal"
weight_decay = 0.01
[init]
n_particles = 8
scale = 1.0
[solver]
method = "rk4"
dt = 0.05
[run]
t_end = 1.0
frame_interval = 0.5
"""


def build(text: str = SMALL, *overrides: str):
    cfg = loads_config(text, list(overrides))
    return cfg, Problem.from_config(cfg)


def integrate(cfg, problem, t_end: float, omega=None, mass=None, **solver):
    """Advance with the configured stepper to t_end (no files); returns the final state and all states."""
    cfg = cfg.replace(solver=solver) if solver else cfg
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    if omega is not None:
        state = State(t=0.0, step=0, dt=cfg.solver.dt, fields={"omega": omega, "mass": mass})
    states = [state]
    while t_end - state.t > 1e-12:
        state, _ = stepper.step(state, t_end - state.t)
        states.append(state)
    return state, states, stepper


# Stability polynomials R(z) of the fixed-step methods: on y' = -lam y one step multiplies y by R(-lam dt).
STABILITY = {"euler": lambda z: 1 + z, "heun": lambda z: 1 + z + z**2 / 2,
             "rk4": lambda z: 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24}


@pytest.mark.parametrize("method,dt,order", [("euler", 0.02, 1), ("heun", 0.05, 2), ("rk4", 0.1, 4)])
def test_weight_decay_alone_gives_exponential_decay(method, dt, order):
    """Data term off (zero unembedding): d omega/dt = -lam omega, so omega(t) = omega(0) exp(-lam t).

    Each fixed-step method reproduces its own stability polynomial to rounding, and its distance to the
    exact solution is within the method's local error bound (|R(z) - e^z| <= |z|^(p+1) / (p+1)!)."""
    lam, t_end = 0.7, 2.0
    cfg, problem = build(SMALL, "model.unembedding=\"zero\"", f"model.weight_decay={lam}",
                         f"solver.method=\"{method}\"", f"solver.dt={dt}")
    omega0, _ = problem.initial_measure(cfg)
    final, states, _ = integrate(cfg, problem, t_end)
    n = len(states) - 1
    assert abs(n * dt - t_end) < 1e-9
    z = -lam * dt
    np.testing.assert_allclose(final.fields["omega"], omega0 * STABILITY[method](z) ** n, rtol=1e-12)
    exact = omega0 * np.exp(-lam * t_end)
    err = np.max(np.abs(final.fields["omega"] - exact)) / np.max(np.abs(exact))
    from math import factorial
    bound = n * abs(z) ** (order + 1) / factorial(order + 1) / np.exp(z * n)
    assert 0 < err <= bound, (err, bound)


def test_adaptive_follows_exponential_decay_within_rtol():
    lam, t_end = 0.7, 2.0
    cfg, problem = build(SMALL, "model.unembedding=\"zero\"", f"model.weight_decay={lam}",
                         "solver.method=\"adaptive\"", "solver.dt=0.1", "solver.rtol=1e-7", "solver.atol=1e-10")
    omega0, _ = problem.initial_measure(cfg)
    final, _, _ = integrate(cfg, problem, t_end)
    exact = omega0 * np.exp(-lam * t_end)
    assert np.max(np.abs(final.fields["omega"] - exact)) / np.max(np.abs(exact)) < 1e-7


def observed_orders(method: str, dts: list[float]) -> np.ndarray:
    cfg, problem = build()
    ref, _, _ = integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)
    errors = []
    for dt in dts:
        final, _, _ = integrate(cfg, problem, 1.0, method=method, dt=dt)
        errors.append(np.sqrt(np.mean((final.fields["omega"] - ref.fields["omega"]) ** 2)))
    errors = np.array(errors)
    return np.log2(errors[:-1] / errors[1:])


@pytest.mark.parametrize("method,order,dts", [("euler", 1, [0.1, 0.05, 0.025]), ("heun", 2, [0.05, 0.025, 0.0125]),
                                              ("rk4", 4, [0.1, 0.05, 0.025])])
def test_step_halving_gives_the_method_order(method, order, dts):
    orders = observed_orders(method, dts)
    assert np.all(np.abs(orders - order) < 0.25), orders


def test_adaptive_meets_its_tolerance():
    cfg, problem = build()
    ref, _, _ = integrate(cfg, problem, 1.0, method="rk4", dt=2.5e-3)
    for rtol in (1e-4, 1e-6):
        final, states, _ = integrate(cfg, problem, 1.0, method="adaptive", dt=0.1, rtol=rtol, atol=rtol * 1e-3)
        scale = np.max(np.abs(ref.fields["omega"]))
        err = np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale
        assert err < rtol, (rtol, err)
    # tighter tolerance takes more steps
    _, loose, _ = integrate(cfg, problem, 1.0, method="adaptive", dt=0.1, rtol=1e-4, atol=1e-7)
    assert len(states) > len(loose)


def test_adaptive_rejects_and_recovers_from_too_large_a_step():
    cfg, problem = build()
    stepper = make_stepper(problem, cfg.replace(solver={"method": "adaptive", "dt": 50.0, "rtol": 1e-8, "atol": 1e-10}))
    state = stepper.initial_state()
    new, extra = stepper.step(state, 1.0)
    assert extra["rejected"] >= 1
    assert new.t - state.t < 1.0


def energy_identity_residual(states, stepper, simpson: bool = False) -> float:
    t = np.array([s.t for s in states])
    diag = [stepper.diagnostics(s) for s in states]
    e = np.array([d["energy"] for d in diag])
    i = np.array([d["dissipation"] for d in diag])
    if simpson:
        h = np.diff(t)
        assert np.allclose(h, h[0]) and len(h) % 2 == 0
        integral = h[0] / 3 * (i[0] + i[-1] + 4 * i[1:-1:2].sum() + 2 * i[2:-1:2].sum())
    else:
        integral = np.sum(0.5 * (i[1:] + i[:-1]) * np.diff(t))
    return abs(e[-1] - e[0] + integral) / abs(e[0])


QUICK = "data/configs/full.toml"   # the full-coordinate problem (k = 256)


@pytest.fixture(scope="module")
def quickstart():
    from pathlib import Path

    from pdeflow import load_config
    path = Path(__file__).resolve().parents[2] / QUICK
    cfg = load_config(path, ["init.n_particles=32", "task.n_samples=32"])
    return cfg, Problem.from_config(cfg)


def test_quickstart_energy_decreases_and_satisfies_the_energy_identity(quickstart):
    cfg, problem = quickstart
    _, states, stepper = integrate(cfg, problem, 2.0, method="rk4", dt=0.05)
    energies = np.array([stepper.diagnostics(s)["energy"] for s in states])
    assert np.all(np.diff(energies) < 0)
    assert energy_identity_residual(states, stepper) < 1e-3


@pytest.fixture(scope="module")
def identity_residuals(quickstart):
    """Energy-identity residuals (trapezoid and Simpson) of each method at three halving step sizes."""
    cfg, problem = quickstart
    cfg = cfg.replace(init={"n_particles": 16}, task={"n_samples": 16})
    problem = Problem.from_config(cfg)
    table = {}
    for method in ("euler", "heun", "rk4"):
        rows = []
        for dt in (0.1, 0.05, 0.025):
            _, states, stepper = integrate(cfg, problem, 0.8, method=method, dt=dt)
            rows.append((energy_identity_residual(states, stepper), energy_identity_residual(states, stepper, True)))
        table[method] = np.array(rows)
    return table


@pytest.mark.parametrize("method,order,simpson", [("euler", 1, False), ("heun", 2, False), ("rk4", 2, False),
                                                  ("rk4", 4, True)])
def test_energy_identity_residual_shrinks_at_the_order(identity_residuals, method, order, simpson):
    """With the trapezoid rule the identity is limited to order 2; Simpson's rule shows RK4's order 4."""
    residuals = identity_residuals[method][:, int(simpson)]
    orders = np.log2(residuals[:-1] / residuals[1:])
    assert np.all(np.abs(orders - order) < 0.3), (residuals, orders)


def test_heads_at_one_point_move_together_for_any_n():
    cfg, problem = build()
    point = problem.initial_particles(1, seed=3, scale=1.0)[0]
    one, _, _ = integrate(cfg, problem, 0.5, omega=point, mass=np.ones(1))
    many, _, _ = integrate(cfg, problem, 0.5, omega=np.repeat(point, 64, axis=0), mass=np.full(64, 1 / 64))
    np.testing.assert_allclose(many.fields["omega"], np.repeat(one.fields["omega"], 64, axis=0), rtol=1e-12, atol=1e-14)


def test_duplicated_head_set_follows_the_original_trajectory():
    cfg, problem = build()
    omega, mass = problem.initial_measure(cfg)
    original, _, _ = integrate(cfg, problem, 0.5, omega=omega, mass=mass)
    doubled, _, _ = integrate(cfg, problem, 0.5, omega=np.vstack([omega, omega]), mass=np.concatenate([mass, mass]) / 2)
    n = len(mass)
    for half in (doubled.fields["omega"][:n], doubled.fields["omega"][n:]):
        np.testing.assert_allclose(half, original.fields["omega"], rtol=1e-10, atol=1e-12)
