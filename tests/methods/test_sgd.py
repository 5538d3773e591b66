"""Finite-head SGD (solvers/sgd.py): full batch is explicit Euler, minibatch gradients are unbiased,
runs are reproducible and resume bit for bit, and Langevin noise has the right stationary law."""
from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.driver import run

from conftest import build_config
from pdeflow import ConfigError, Problem, open_trajectory
from pdeflow.interface.cli import main


@pytest.fixture(autouse=True)
def one_thread():
    """These problems are tiny: a single numba thread avoids thread hand-offs that dominate their cost
    (results do not depend on the thread count, see tests/core/test_core.py)."""
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)


TINY = {"init": {"n_particles": 8, "scale": 1.0}, "run": {"t_end": 0.5, "frame_interval": 0.25},
        "diagnostics": {"enabled": False}}


def sgd_config(**overrides):
    sections = {name: dict(values) for name, values in TINY.items()}
    sections.setdefault("solver", {}).update(method="sgd", dt=0.05)
    for name, values in overrides.items():
        sections.setdefault(name, {}).update(values)
    return build_config(**sections)


def run_to_file(cfg, path, **kwargs):
    result = run(cfg, Problem.from_config(cfg), path, quiet=True, **kwargs)
    assert result.status == "finished", result.message
    return open_trajectory(path)


def test_full_batch_without_noise_is_explicit_euler(tmp_path):
    """batch_size >= B with resampling is gradient descent: the frames equal explicit Euler's bit for bit."""
    cfg = sgd_config(sgd={"batch_size": 10_000})
    sgd = run_to_file(cfg, tmp_path / "sgd.h5")
    euler = run_to_file(cfg.replace(solver={"method": "euler"}), tmp_path / "euler.h5")
    assert sgd.frames["omega"].shape == euler.frames["omega"].shape == (3, 8, Problem.from_config(cfg).k)
    np.testing.assert_array_equal(sgd.frames["omega"], euler.frames["omega"])
    np.testing.assert_array_equal(sgd.steps["energy"], euler.steps["energy"])
    # the minibatch risk of a full batch is the risk
    np.testing.assert_array_equal(sgd.steps["batch_risk"][1:], euler.steps["risk"][:-1])
    assert np.ptp(sgd.frames["omega"][:, 0]) > 0  # the particles moved


@pytest.mark.parametrize("sampling", ["resample", "fresh"])
def test_minibatch_gradient_is_unbiased(sampling):
    """The mean of many minibatch gradients is the full gradient (resample: the data set; fresh: the exact
    population, since the tiny task is enumerated), within its own standard error."""
    cfg = sgd_config(sgd={"batch_size": 5, "sampling": sampling}, init={"n_particles": 3})
    problem = Problem.from_config(cfg)
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    omega, mass = state.fields["omega"], state.fields["mass"]
    full = problem.grad_phi(omega, omega, mass)
    rng = np.random.default_rng(7)
    draws = np.array([stepper.minibatch(rng).grad_phi(omega, omega, mass) for _ in range(300)])
    se = draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    scale = np.max(np.abs(full))
    # coordinates the data never reach (zero columns of the onehot tables) carry lam omega alone
    varies = se > 1e-10 * scale
    assert varies.mean() > 0.3  # the minibatches do vary
    np.testing.assert_allclose(draws.mean(axis=0)[~varies], full[~varies], rtol=0, atol=1e-12 * scale)
    z = (draws.mean(axis=0) - full)[varies] / se[varies]
    assert np.max(np.abs(z)) < 5.0, np.max(np.abs(z))
    # the noise is low-rank (a few sequences drive every coordinate): also test whole directions
    for u in rng.standard_normal((3,) + full.shape):
        proj = np.einsum("mik,ik->m", draws, u)
        z_u = (proj.mean() - np.sum(full * u)) / (proj.std(ddof=1) / math.sqrt(len(proj)))
        assert abs(z_u) < 4.0, z_u


def test_resample_batches_are_subsets_with_importance_weights():
    cfg = sgd_config(sgd={"batch_size": 5})
    problem = Problem.from_config(cfg)
    a = problem.arrays()
    B = a["tokens"].shape[0]
    batch = make_stepper(problem, cfg).minibatch(np.random.default_rng(0)).arrays()
    assert batch["tokens"].shape == (5, a["tokens"].shape[1])
    rows = {tuple(r) for r in np.concatenate([a["tokens"], a["targets"]], axis=1)}
    assert all(tuple(r) in rows for r in np.concatenate([batch["tokens"], batch["targets"]], axis=1))
    # importance weights w_b B / n: the minibatch weights are the data set's scaled by B/5
    index = [next(i for i in range(B) if np.array_equal(a["tokens"][i], t) and np.array_equal(a["targets"][i], y))
             for t, y in zip(batch["tokens"], batch["targets"])]
    np.testing.assert_allclose(batch["weights"], a["weights"][index] * B / 5, rtol=1e-15)


@pytest.mark.parametrize("sampling", ["resample", "fresh"])
def test_same_seed_same_run_and_resume_is_exact(tmp_path, sampling):
    """A minibatch + Langevin run is a function of its config; stopping and resuming changes nothing."""
    cfg = sgd_config(sgd={"batch_size": 4, "sampling": sampling, "noise": True, "seed": 3},
                     model={"beta": 50.0}, run={"t_end": 1.0, "frame_interval": 0.25})
    a = run_to_file(cfg, tmp_path / "a.h5")
    b = run_to_file(cfg, tmp_path / "b.h5")
    np.testing.assert_array_equal(a.frames["omega"], b.frames["omega"])
    np.testing.assert_array_equal(a.steps["batch_risk"], b.steps["batch_risk"])
    half = cfg.replace(run={"t_end": 0.5})
    run_to_file(half, tmp_path / "c.h5")
    c = run_to_file(cfg, tmp_path / "c.h5", resume=True)
    np.testing.assert_array_equal(a.frames["omega"], c.frames["omega"])
    np.testing.assert_array_equal(a.steps["batch_risk"], c.steps["batch_risk"])
    other = run_to_file(cfg.replace(sgd={"seed": 4}), tmp_path / "d.h5")
    assert not np.array_equal(other.frames["omega"][-1], a.frames["omega"][-1])


def test_interrupted_step_does_not_advance_the_generator():
    """The state handed to step keeps its generator (an interrupt between draws checkpoints cleanly)."""
    cfg = sgd_config(sgd={"batch_size": 4, "noise": True}, model={"beta": 50.0})
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state = stepper.initial_state()
    before = state.rng.bit_generator.state
    new, _ = stepper.step(state, 1.0)
    assert state.rng.bit_generator.state == before
    assert new.rng.bit_generator.state != before


def test_langevin_noise_has_the_stationary_variance_of_weight_decay():
    """Data term off (zero unembedding): omega <- (1 - eta lam) omega + sqrt(2 eta / beta) xi is an AR(1)
    chain with stationary variance 2 / (beta lam (2 - eta lam)) -> 1/(lam beta) per coordinate. Started at 0,
    its variance after n steps is that times 1 - (1 - eta lam)^(2n); checked on every frame within the
    sampling error of N k values per frame."""
    lam, beta, eta = 2.0, 2.0, 0.01
    cfg = sgd_config(model={"unembedding": "zero", "weight_decay": lam, "beta": beta},
                     sgd={"noise": True, "batch_size": 10_000}, solver={"dt": eta},
                     init={"n_particles": 64, "distribution": "point"},
                     run={"t_end": 4.0, "frame_interval": 0.5})
    problem = Problem.from_config(cfg)
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    stationary = 2.0 / (beta * lam * (2.0 - eta * lam))
    assert abs(stationary * lam * beta - 1.0) < 0.011  # the discrete law is the continuous one to O(eta lam)
    ratios = []
    for n_steps in range(50, 401, 50):
        while state.step < n_steps:
            state, _ = stepper.step(state, 1.0)
        omega = state.fields["omega"]
        expected = stationary * (1.0 - (1.0 - eta * lam) ** (2 * n_steps))
        values = omega.size
        assert abs(omega.mean()) < 5 * math.sqrt(expected / values)
        ratio = np.mean(omega**2) / expected
        assert abs(ratio - 1.0) < 5 * math.sqrt(2.0 / values), (n_steps, ratio)
        ratios.append(ratio)
    # frames half a unit apart are nearly independent (correlation exp(-2 lam 0.5)): their mean is tighter
    late = np.array(ratios[3:])
    assert abs(late.mean() - 1.0) < 4 * math.sqrt(2.0 / (values * len(late))), late
    # without noise the same chain stays at 0
    quiet = make_stepper(problem, cfg.replace(sgd={"noise": False}))
    s = quiet.initial_state()
    s, _ = quiet.step(s, 1.0)
    assert np.all(s.fields["omega"] == 0.0)


def test_noise_needs_a_finite_temperature(tmp_path, capsys):
    cfg = sgd_config(sgd={"noise": True})
    with pytest.raises(ConfigError, match="sgd.noise"):
        make_stepper(Problem.from_config(cfg), cfg)
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    out = tmp_path / "out.h5"
    assert main(["run", str(path), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sgd.noise" in err[0] and not out.exists()


def test_step_is_shortened_to_land_on_a_frame():
    cfg = sgd_config(sgd={"batch_size": 10_000})
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state = stepper.initial_state()
    new, _ = stepper.step(state, 0.02)
    assert new.t == 0.02
    g = stepper.evaluate(state).grad_phi
    np.testing.assert_array_equal(new.fields["omega"], state.fields["omega"] - 0.02 * g)
