"""Every run watches its own accuracy (solvers/accuracy.py): the energy-identity defect falls at the method's
order, lambda_max agrees with a dense Jacobian, a step above the stability bound warns (one line per kind) or
stops (exit 3, frames kept, resumable bit for bit), and `pdeflow info` prints the verdict."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.accuracy import identity_defect
from pdeflow.solvers.driver import run

from conftest import build_config, symmetric_particle_jacobian
from pdeflow import Problem, load_config
from pdeflow.core.config import dumps_toml
from pdeflow.core.system_jacobian import lambda_max
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

EPS = float(np.finfo(float).eps)


def one_step_defect(cfg, h: float) -> float:
    """The identity defect of one step of length h from the initial state, as the driver computes it."""
    cfg = cfg.replace(solver={"dt": h, **({"tau": h} if cfg.solver.method == "jko" else {})})
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state = stepper.initial_state()
    d0 = stepper.diagnostics(state)
    new, _ = stepper.step(state, np.inf)
    d1 = stepper.diagnostics(new)
    return identity_defect(d0["energy"], d1["energy"], stepper.dissipation_integral(state, new, d0, d1), EPS)


@pytest.mark.parametrize("method,order", [("euler", 1), ("heun", 2), ("rk4", 4), ("jko", 1)])
def test_the_identity_defect_falls_at_the_order_of_the_method(method, order):
    """Relative defect |dE + Q| / |dE| = O(h^p): the RK methods' stage quadrature, JKO's right rectangle."""
    cfg = build_config(init={"n_particles": 4, "scale": 1.0, "seed": 1}, solver={"method": method},
                       model={"weight_decay": 0.5})
    hs = [0.08, 0.04, 0.02, 0.01]
    defects = [one_step_defect(cfg, h) for h in hs]
    slopes = np.diff(np.log(defects)) / np.diff(np.log(hs))
    print(f"{method}: defects {defects}, slopes {slopes}")
    # the slopes approach p from above as h falls (Heun: 2.38, 2.23, 2.12)
    assert abs(slopes[-1] - order) <= 0.15 and np.all(slopes >= order - 0.15), (defects, slopes)


def test_lambda_max_agrees_with_the_dense_finite_difference_jacobian():
    cfg = build_config(init={"n_particles": 3, "scale": 1.0, "seed": 2})
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    mass = np.array([0.5, 0.3, 0.2])  # unequal masses: the similarity transform matters
    symmetric = symmetric_particle_jacobian(problem, omega, mass, 1e-6)
    expected = np.max(np.linalg.eigvalsh(0.5 * (symmetric + symmetric.T)))
    cold = lambda_max(problem, omega, mass)
    assert cold.value == pytest.approx(expected, rel=1e-5)
    assert cold.value <= expected * (1 + 1e-7)              # a Rayleigh-Ritz value: never above
    # warm start from the eigenvector of a nearby cloud: a few products suffice
    moved = omega + 0.01 * np.random.default_rng(0).standard_normal(omega.shape)
    warm = lambda_max(problem, moved, mass, lambda_max(problem, omega, mass).vector)
    reference = lambda_max(problem, moved, mass)
    assert warm.value == pytest.approx(reference.value, rel=1e-4) and warm.products <= 6


def stiff_config_text(tmp_path, method="euler", dt=0.25, policy="warn", **run_keys) -> str:
    """No data term (zero unembedding) and weight decay 10: Phi = 5 |omega|^2, so J = 10 I and lambda_max = 10
    exactly; Euler with dt = 0.25 has lambda_max dt = 2.5 > 2."""
    data = {"task": {"name": "markov", "vocab_size": 3, "seq_len": 3, "n_samples": 4},
            "model": {"d": 4, "head_dim": 2, "unembedding": "zero", "weight_decay": 10.0},
            "init": {"n_particles": 3, "scale": 0.5},
            "solver": {"method": method, "dt": dt},
            "run": {"t_end": 2.0, "frame_interval": 0.5, "accuracy": policy, **run_keys},
            "diagnostics": {"enabled": False}}
    path = tmp_path / "stiff.toml"
    path.write_text(dumps_toml(data))
    return str(path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdeflow", *args], capture_output=True, text=True, timeout=300)


def test_a_step_above_the_stability_bound_warns_once_per_kind_and_is_recorded(tmp_path):
    config = stiff_config_text(tmp_path)
    out = tmp_path / "w.h5"
    proc = run_cli("run", config, "-o", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "accuracy lost" in line]
    stability = [line for line in warnings if "stability bound" in line]
    identity = [line for line in warnings if "energy-identity defect" in line]
    # 8 steps, every one over the bound (Euler's energy grows): one line per kind, naming t, figure, bound, key
    assert len(stability) == 1 and len(identity) == 1 and len(warnings) == 2, proc.stderr
    assert "at t = 0 " in stability[0] and "lambda_max * dt = 2.5 " in stability[0] and "bound 2 " in stability[0]
    assert "solver.dt" in stability[0] and "run.accuracy" in stability[0]
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "finished" and "accuracy was LOST at t = 0" in traj.attrs["message"]
    assert traj.attrs["accuracy"].startswith("LOST at t = 0")
    assert traj.attrs["accuracy_lost_at"] == 0.0 and traj.attrs["max_stability_ratio"] == pytest.approx(1.25)
    lam = traj.steps["lambda_max_dt"]
    assert lam[0] == pytest.approx(2.5, rel=1e-12)            # lambda_max = lam exactly
    assert np.all(np.isnan(traj.steps["identity_defect"][:1])) and np.all(traj.steps["identity_defect"][1:] > 1)
    info = run_cli("info", str(out))
    line = [x for x in info.stdout.splitlines() if x.startswith("accuracy")]
    assert len(line) == 1 and "LOST at t = 0" in line[0] and "largest identity defect" in line[0]
    assert "largest lambda_max*dt/bound 1.25" in line[0]


def test_stop_policy_exits_3_keeping_every_frame_and_resumes_bit_for_bit(tmp_path):
    """A loss in mid-run: a run is continued (--resume) with run.accuracy = "stop" and a run.identity_tol just
    below the defect of its next step (the defects of this run fall monotonically, so a fresh run would stop at
    step 1). It stops after that step with exit 3, every frame kept; --resume with run.accuracy = "warn" then
    finishes it with the same /steps rows, accuracy columns included, as a run that never stopped."""
    base = build_config(init={"n_particles": 4, "scale": 1.0, "seed": 1}, model={"weight_decay": 0.5},
                        solver={"method": "rk4", "dt": 0.1}, run={"t_end": 3.0, "frame_interval": 0.5},
                        diagnostics={"enabled": False})
    full = tmp_path / "full.h5"
    assert run(base, Problem.from_config(base), full, quiet=True).exit_code == 0
    reference = open_trajectory(full)
    defects = reference.steps["identity_defect"]
    assert np.all(np.diff(defects[1:]) < 0)
    tol = float(np.sqrt(defects[11] * defects[12]))   # step 11 exceeds it, steps 12, 13, ... do not
    config = tmp_path / "stop.toml"
    config.write_text(base.to_toml())
    out = tmp_path / "stop.h5"
    assert run_cli("run", str(config), "-o", str(out), "--quiet", "--set", "run.max_steps=10").returncode == 0
    proc = run_cli("run", str(config), "-o", str(out), "--quiet", "--resume", "--set", "run.accuracy=stop",
                   "--set", f"run.identity_tol={tol!r}")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "accuracy_lost" in proc.stderr and "energy-identity defect" in proc.stderr
    assert "run.identity_tol" in proc.stderr and "at t = 1.1 " in proc.stderr
    stopped = open_trajectory(out)
    t_stop = reference.steps["time"][11]
    # the resumed run re-judged the committed rows with its thresholds: under this tol step 1 was a loss too
    assert stopped.attrs["status"] == "accuracy_lost"
    assert stopped.attrs["accuracy_lost_at"] == reference.steps["time"][1]
    assert len(stopped.steps["time"]) == 12 and stopped.checkpoint.t == t_stop
    kept = reference.time <= t_stop
    assert len(stopped.time) == kept.sum() == 3
    assert np.array_equal(stopped.frames["omega"], reference.frames["omega"][kept])
    info = run_cli("info", str(out)).stdout
    assert "accuracy    LOST at t = 0.1" in info and "status      accuracy_lost: accuracy lost at t = 1.1" in info
    # continue past the loss: the same rows as the run that went on
    resumed = run_cli("run", str(config), "-o", str(out), "--quiet", "--resume", "--set", "run.accuracy=warn")
    assert resumed.returncode == 0, resumed.stderr
    again = open_trajectory(out)
    for key in ("time", "energy", "dissipation", "dissipation_integral", "identity_defect", "lambda_max_dt"):
        np.testing.assert_array_equal(again.steps[key], reference.steps[key], err_msg=key)
    np.testing.assert_array_equal(again.frames["omega"], reference.frames["omega"])
    assert again.attrs["stability_products"] == reference.attrs["stability_products"]
    assert again.attrs["max_identity_defect"] == reference.attrs["max_identity_defect"]
    assert again.attrs["accuracy"] == reference.attrs["accuracy"] and again.attrs["accuracy"].startswith("held")


def test_resume_after_a_checkpoint_continues_the_warm_started_stability_record_bit_for_bit(tmp_path):
    """The eigenvector that warm-starts the next lambda_max check is in the checkpoint: a run stopped by
    run.max_steps and resumed records the same lambda_max_dt values as one that never stopped."""
    cfg = build_config(init={"n_particles": 4, "scale": 1.0, "seed": 3}, model={"weight_decay": 0.5},
                       solver={"method": "heun", "dt": 0.05},
                       run={"t_end": 2.0, "frame_interval": 0.5, "stability_interval": 8},
                       diagnostics={"enabled": False})
    whole = tmp_path / "whole.h5"
    assert run(cfg, Problem.from_config(cfg), whole, quiet=True).exit_code == 0
    part = tmp_path / "part.h5"
    first = cfg.replace(run={"max_steps": 13})
    assert run(first, Problem.from_config(first), part, quiet=True).status == "max_steps"
    assert run(cfg, Problem.from_config(cfg), part, quiet=True, resume=True).exit_code == 0
    a, b = open_trajectory(part).steps, open_trajectory(whole).steps
    lam = b["lambda_max_dt"]
    assert np.sum(np.isfinite(lam)) >= 5 and np.isfinite(lam[14:]).any()   # warm checks after the resume
    for key in ("energy", "identity_defect", "lambda_max_dt"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_no_check_applies_to_sgd_with_noise_nor_to_particles_with_finite_beta(tmp_path):
    for extra in ({"solver": {"method": "sgd", "dt": 0.05}, "sgd": {"batch_size": 2}},
                  {"model": {"weight_decay": 0.5, "beta": 100.0}, "solver": {"method": "adaptive"}}):
        cfg = build_config(init={"n_particles": 3}, run={"t_end": 0.2, "frame_interval": 0.1},
                           diagnostics={"enabled": False}, **extra)
        out = tmp_path / "n.h5"
        assert run(cfg, Problem.from_config(cfg), out, quiet=True, overwrite=True).exit_code == 0
        traj = open_trajectory(out)
        assert np.all(np.isnan(traj.steps["identity_defect"])) and np.all(np.isnan(traj.steps["lambda_max_dt"]))
        assert "identity_defect not recorded" in traj.steps_attrs["accuracy_note"]
        assert traj.attrs["accuracy"].startswith("not checked")
        assert main(["info", str(out)]) == 0


def test_the_run_accuracy_key_is_validated(tmp_path):
    config = stiff_config_text(tmp_path, policy="maybe")
    proc = run_cli("run", config, "-o", str(tmp_path / "x.h5"))
    assert proc.returncode == 2 and "run.accuracy" in proc.stderr and proc.stderr.count("\n") == 1
    assert load_config(stiff_config_text(tmp_path)).run.accuracy == "warn"


# ---- following the advice of an accuracy stop (issue 40, finding 7; issue 52, finding 5) ---------------------------
def stopped_run(cfg, path):
    """Run ``cfg`` with run.accuracy = "stop": (the stop's message, the time of the loss, its defect)."""
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    assert result.status == "accuracy_lost", result.message
    traj = open_trajectory(path)
    lost = int(np.argmax(traj.steps["identity_defect"] > cfg.run.identity_tol))
    return result.message, float(traj.steps["time"][lost]), float(traj.steps["identity_defect"][lost])


def advised(message: str) -> dict[str, dict[str, float]]:
    """The settings an accuracy stop's advice names, as config overrides: "raise solver.tau = 0.05 to 0.2", "reduce
    solver.dt = 0.2 to 0.11", "raise grid.n = 24 to 45 with solver.tau = 0.1", "and solver.atol = 1e-09 to 1e-10"."""
    import re

    changes: dict[str, dict[str, float]] = {}
    for section, key, value in re.findall(r"(solver|grid)\.(\w+) = [-+.\de]+ to ([-+.\de]*\d)", message):
        changes.setdefault(section, {})[key] = float(value)
    for section, key, value in re.findall(r"with (solver|grid)\.(\w+) = ([-+.\de]*\d)", message):
        changes.setdefault(section, {})[key] = float(value)
    if "grid" in changes and "n" in changes["grid"]:
        changes["grid"]["n"] = int(changes["grid"]["n"])
    return changes


def followed_once(cfg, path) -> tuple[str, object]:
    """Stop ``cfg`` on its accuracy loss, then run it again with the settings the stop's advice names: (the advice,
    the second run's result)."""
    message, _, _ = stopped_run(cfg, path.with_name("stopped.h5"))
    changes = advised(message)
    assert changes, message
    again = cfg.replace(**changes)
    return message, run(again, Problem.from_config(again), path, quiet=True)


@pytest.mark.parametrize("method,knob,tol", [("rk4", "dt", 1e-6), ("jko", "tau", 0.03)])
def test_a_particle_methods_advice_followed_once_finishes_the_run(tmp_path, method, knob, tol):
    """rk4 and particle jko losing the identity (a tight run.identity_tol): no source but the time step, so the
    stop advises reducing the method's step to a value (the defect ~ step^order, grown to t_end at its recent rate,
    at half the tolerance); the run redone with it reaches t_end, exit 0."""
    cfg = build_config(init={"n_particles": 4, "scale": 1.0, "seed": 1}, model={"weight_decay": 0.5},
                       solver={"method": method, knob: 0.2}, run={"t_end": 2.0, "frame_interval": 1.0,
                                                                  "accuracy": "stop", "identity_tol": tol},
                       diagnostics={"enabled": False})
    message, result = followed_once(cfg, tmp_path / "b.h5")
    other = {"dt": "solver.tau", "tau": "solver.dt "}[knob]
    assert f"reduce solver.{knob} = 0.2 to " in message and other not in message, message
    assert "an estimate that the run then reaches t_end = 2" in message
    assert result.exit_code == 0 and result.status == "finished", (message, result.message)


@pytest.mark.parametrize("method,gamma", [("wfr_jko", 1.0), ("jko", 0.0)])
def test_a_grid_jkos_advice_followed_once_finishes_the_run(tmp_path, method, gamma):
    """Finding 7 of issue 40 on a 10 x 10 grid: wfr_jko (gamma = 1) and jko on grid2d with tau = 0.05 lose the
    identity to the entropic blur (fixed per step by eps ~ the cell width^2), whose share of the relative defect
    grows as the energy change per step shrinks. The advice names what its trial steps (from the lost step's start,
    grown to t_end; from the initial state) say ends the run, or grid.n when no tau does; followed once, the run
    reaches t_end = 0.4."""
    cfg = load_config("data/configs/grid2d.toml", [f'solver.method="{method}"', "grid.n=10", "solver.tau=0.05",
                                                  "run.t_end=0.4", "run.frame_interval=0.4", 'run.accuracy="stop"',
                                                  "diagnostics.enabled=false"]
                      + ([f"solver.gamma={gamma}"] if gamma else []))
    message, result = followed_once(cfg, tmp_path / "b.h5")
    assert "the entropic blur dominates" in message and "reduce solver.tau" not in message, message
    assert result.exit_code == 0 and result.status == "finished", (message, result.message)


@pytest.mark.slow
def test_wfr_jkos_advice_on_grid2d_followed_once_reaches_t_end(tmp_path):
    """Issue 52, finding 5: wfr_jko on grid2d (gamma 1, grid.n 24, t_end 1) at tau 0.05 stopped advising tau 0.1,
    which stopped at t = 1 advising 0.2, and so on. Followed once, the advice now reaches t_end = 1, exit 0."""
    cfg = load_config("data/configs/grid2d.toml", ['solver.method="wfr_jko"', "solver.gamma=1", "grid.n=24",
                                                  "run.t_end=1", "solver.tau=0.05", "diagnostics.enabled=false"])
    message, result = followed_once(cfg, tmp_path / "b.h5")
    assert result.exit_code == 0 and result.status == "finished", (message, result.message)


def _fake(sources, order: float = 1.0, tau: float = 0.1):
    """A stepper with a step setting ``tau`` of ``order`` and the given defect sources, for :func:`advice`."""
    from types import SimpleNamespace

    return SimpleNamespace(tau=tau, dt=tau, order=order, defect_sources=lambda old, new, residual: sources)


def test_the_step_error_advice_scales_the_step_by_the_order_and_the_growth_to_t_end():
    from pdeflow.solvers.accuracy import ADVICE_MARGIN, Outlook, advice

    outlook = Outlook(t=1.0, t_end=3.0, tol=0.5, growth=math.log(2.0), points=8)   # x4 by t_end
    assert outlook.factor == pytest.approx(4.0)
    # defect 0.8, order 1: tau x (0.25 / (0.8 * 4)) = 0.078
    text = advice(_fake([]), None, None, residual=-0.08, change=-0.1, outlook=outlook)
    assert text.startswith(f"reduce solver.tau = 0.1 to {0.1 * 0.5 / ADVICE_MARGIN / 3.2:.2g}:"), text
    # an explicit method of order 4 (its knob solver.dt): the fourth root of the same ratio
    from types import SimpleNamespace

    rk4 = SimpleNamespace(dt=0.1, order=4.0, defect_sources=lambda old, new, residual: [])
    text = advice(rk4, None, None, residual=-0.08, change=-0.1, outlook=outlook)
    assert text.startswith("reduce solver.dt = 0.1 to 0.053:"), text   # 0.1 (0.25 / 3.2) ** 0.25 = 0.0529
    # no history: no growth assumed, and said
    text = advice(_fake([]), None, None, residual=-0.08, change=-0.1, outlook=Outlook(1.0, 3.0, 0.5, 0.0, 1))
    assert "to 0.031:" in text and "too few steps" in text


def test_the_blur_advice_takes_the_nearest_tau_whose_trials_stay_below_half_the_tolerance():
    from pdeflow.solvers.accuracy import Outlook, advice
    from pdeflow.solvers.base import DefectSource, Setting

    grid = Setting("grid.n", 24.0, -2.0, smallest=24.0, largest=64.0, integer=True)
    outlook = Outlook(t=0.65, t_end=1.0, tol=0.5, growth=math.log(5.0) / 0.35, points=8)   # x5 by t_end
    # defects of one step from here with tau x 0.5, 2, 4, 8 (and their first steps from the initial state)
    trials = ((0.5, 0.9, 0.05), (2.0, 0.2, 0.08), (4.0, 0.04, 0.1), (8.0, 0.02, 0.6))
    blur = DefectSource("entropic blur", 0.0018, "raise grid.n", grid, trials)
    text = advice(_fake([blur], tau=0.05), None, None, residual=0.0017, change=-0.003, outlook=outlook)
    assert text.startswith("raise solver.tau = 0.05 to 0.2: an estimate"), text     # x2: 1.0 > 0.25; x8: 0.6 first
    # no tau when the defect doubles by t_end and every trial exceeds 0.125: the blur's share (0.6, ~ 1/tau and
    # ~ grid.n^-2) and the step's (0.033, ~ tau) give the grid and tau that leave the most room, by that model
    outlook = Outlook(t=0.65, t_end=1.0, tol=0.5, growth=math.log(2.0) / 0.35, points=8)
    trials = ((0.5, 0.9, 0.05), (2.0, 0.3, 0.08), (4.0, 0.2, 0.1), (8.0, 0.15, 0.6))
    blur = DefectSource("entropic blur", 0.0018, "raise grid.n", grid, trials)
    text = advice(_fake([blur], tau=0.05), None, None, residual=0.0017, change=-0.003, outlook=outlook)
    assert text.startswith("no solver.tau reaches t_end = 1") and "raise grid.n = 24 to 55 with solver.tau = 0.1" \
        in text, text
    n, tau = 55, 0.1
    assert (0.0001 / 0.003 * tau / 0.05 + 0.0018 / 0.003 * 0.05 / tau * (n / 24) ** -2) * 2 <= 0.25
    assert (0.0001 / 0.003 * tau / 0.05 + 0.0018 / 0.003 * 0.05 / tau * ((n - 1) / 24) ** -2) * 2 > 0.25
    # a grid the method cannot take: said so
    small = Setting("grid.n", 24.0, -2.0, smallest=24.0, largest=30.0, integer=True)
    blur = DefectSource("entropic blur", 0.0018, "raise grid.n", small, trials)
    text = advice(_fake([blur], tau=0.05), None, None, residual=0.0017, change=-0.003, outlook=outlook)
    assert "nor does grid.n up to 30, what this method takes" in text, text


def test_the_defects_growth_rate_is_the_slope_of_its_logarithm():
    from pdeflow.solvers.accuracy import growth_rate

    t = np.linspace(0.0, 1.0, 6)
    assert growth_rate(t, 0.01 * np.exp(3.0 * t)) == pytest.approx(3.0)
    assert growth_rate(t, 0.01 * np.exp(-3.0 * t)) == 0.0
    assert growth_rate(t[:2], [0.1, 0.2]) == 0.0


def test_blur_source_splits_a_residual_of_a_step_term_and_a_per_step_term():
    """Synthetic steps whose residuals are exactly R(h) = A h^2 + B with dE(h) = -h (right-point quadrature): the
    blur's share is B; the trials measure |R / dE| of steps of factor x h."""
    from pdeflow.solvers.base import Setting
    from pdeflow.solvers.entropic_ot import TRIAL_FACTORS, blur_source

    A, B, h = 0.5, 0.05, 0.1

    def trial(state, length, eps):      # E' = E - length, I' chosen so that E' - E + length I' = A length^2 + B
        return 1.0, 1.0 - length, (A * length ** 2 + B) / length + 1.0

    source = blur_source(trial, "old", "initial", (1.0, 1.0 - h), A * h * h + B, h, h, 0.01,
                         Setting("grid.n", 10.0, -2.0))
    assert source.energy == pytest.approx(B, rel=1e-12)
    for (factor, here, first), expected in zip(source.trials, TRIAL_FACTORS):
        assert factor == expected
        assert here == pytest.approx((A * (factor * h) ** 2 + B) / (factor * h), rel=1e-12) == first
    assert "raise grid.n = 10" in source.remedy and "lowering solver.tau adds blur" in source.remedy
