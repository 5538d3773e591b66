"""Every run watches its own accuracy (solvers/accuracy.py): the energy-identity defect falls at the method's
order, lambda_max agrees with a dense Jacobian, a step above the stability bound warns (one line per kind) or
stops (exit 3, frames kept, resumable bit for bit), and `pdeflow info` prints the verdict."""
from __future__ import annotations

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


# ---- following the advice of an accuracy stop (issue 40, finding 7) -----------------------------------------
def stopped_run(cfg, path):
    """Run ``cfg`` with run.accuracy = "stop": (the stop's message, the time of the loss, its defect)."""
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    assert result.status == "accuracy_lost", result.message
    traj = open_trajectory(path)
    lost = int(np.argmax(traj.steps["identity_defect"] > cfg.run.identity_tol))
    return result.message, float(traj.steps["time"][lost]), float(traj.steps["identity_defect"][lost])


def largest_defect(cfg, path, t_end: float) -> float:
    """The largest identity defect of a run of ``cfg`` to ``t_end``, whatever its accuracy (run.accuracy = "off")."""
    cfg = cfg.replace(run={"t_end": t_end, "frame_interval": t_end, "accuracy": "off"})
    assert run(cfg, Problem.from_config(cfg), path, quiet=True).exit_code == 0
    return float(np.nanmax(open_trajectory(path).steps["identity_defect"]))


@pytest.mark.parametrize("method,knob,tol,factor", [("rk4", "dt", 1e-6, 8), ("jko", "tau", 0.03, 1.5)])
def test_following_a_particle_methods_advice_lowers_the_defect(tmp_path, method, knob, tol, factor):
    """rk4 and particle jko losing the identity (a tight run.identity_tol): no source but the time step, so the
    stop advises reducing the method's step (solver.dt, solver.tau); half the step over the same span gives a
    smaller largest defect (order 4: ~1/16; order 1: ~1/2)."""
    cfg = build_config(init={"n_particles": 4, "scale": 1.0, "seed": 1}, model={"weight_decay": 0.5},
                       solver={"method": method, knob: 0.2}, run={"t_end": 2.0, "frame_interval": 1.0,
                                                                  "accuracy": "stop", "identity_tol": tol},
                       diagnostics={"enabled": False})
    message, t_lost, defect = stopped_run(cfg, tmp_path / "a.h5")
    other = {"dt": "solver.tau", "tau": "solver.dt "}[knob]
    assert f"reduce solver.{knob} = 0.2" in message and other not in message, message
    followed = largest_defect(cfg.replace(solver={knob: 0.1}), tmp_path / "b.h5", t_lost)
    assert followed < defect / factor, (followed, defect)


@pytest.mark.parametrize("method,gamma,lost_at", [("wfr_jko", 1.0, 0.05), ("jko", 0.0, 0.4)])
def test_following_a_grid_jkos_advice_lowers_the_defect_and_the_opposite_raises_it(tmp_path, method, gamma, lost_at):
    """Finding 7 on a 10 x 10 grid: wfr_jko (gamma = 1) and jko on grid2d with tau = 0.05 lose the identity. The
    entropic blur (fixed per step by eps ~ the cell width^2) dominates the residual, estimated from one step of
    twice the length, and the longer step's defect is the smaller, so the advice is to raise tau (to the value it
    prints), not to lower it. Raised as printed, the largest defect up to the loss falls; halved (the old
    advice), it grows."""
    cfg = load_config("data/configs/grid2d.toml", [f'solver.method="{method}"', "grid.n=10", "solver.tau=0.05",
                                                  "run.t_end=0.4", "run.frame_interval=0.4", 'run.accuracy="stop"',
                                                  "diagnostics.enabled=false"]
                      + ([f"solver.gamma={gamma}"] if gamma else []))
    message, t_lost, defect = stopped_run(cfg, tmp_path / "a.h5")
    assert abs(t_lost - lost_at) < 1e-9
    assert "the entropic blur dominates" in message and "reduce solver.tau" not in message, message
    tau = float(message.split("raise solver.tau = 0.05 to ")[1].split()[0])
    assert tau > 0.05
    followed = largest_defect(cfg.replace(solver={"tau": tau}), tmp_path / "b.h5", max(t_lost, tau))
    assert followed < 0.9 * defect, (tau, followed, defect)
    opposite = largest_defect(cfg.replace(solver={"tau": 0.025}), tmp_path / "c.h5", t_lost)
    assert opposite > defect, (opposite, defect)


@pytest.mark.parametrize("A,B,raise_tau", [(2.0, 0.01, False), (0.5, 0.05, True)])
def test_blur_source_splits_a_residual_of_a_step_term_and_a_per_step_term(A, B, raise_tau):
    """Synthetic steps whose residuals are exactly R(h) = A h^2 + B: the blur's share is B, and tau is advised
    upwards exactly when the step of 2 h has the smaller relative defect |R / dE| (dE(h) = -0.1, dE(2h) = -0.19)."""
    from pdeflow.solvers.entropic_ot import blur_source
    h, (c1, c2) = 0.1, (-0.1, -0.19)
    r1, r2 = A * h * h + B, 4 * A * h * h + B
    source = blur_source((1.0, 1.0 + c1), r1, (1.0 + c2, (r2 - c2) / (2 * h)), h, h, "raise grid.n = 10")
    assert source.energy == pytest.approx(B, rel=1e-12)
    assert (abs(r2 / c2) < abs(r1 / c1)) == raise_tau
    assert ("raise solver.tau = 0.1 to 0.2" in source.remedy) == raise_tau
    assert "raise grid.n = 10" in source.remedy and "lowering solver.tau adds blur" in source.remedy
