"""``pdeflow compare --order``: another code's explicit Euler, written here in numpy on the independent reference model
(tests/reference_model.py, no pdeflow stepper), at three step sizes against an adaptive pdeflow reference: observed
order 1 passes; the same code with an O(1) error in grad Phi fails; a family whose reference is not 10x more
accurate than its finest run is refused (exit 2); the successive orders and the slope are those of known errors."""
from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from pdeflow.solvers.driver import run

from pdeflow import Problem
from pdeflow.analysis.comparison.convergence_order import OrderRefused, order_study, successive_orders, tighter_config
from pdeflow.interface.cli import main
from pdeflow.io.reference import validate
from reference_model import ReferenceModel
from test_every_method import tiny_config

SHORT = ("run.t_end=0.05", "run.frame_interval=0.025", "init.n_particles=4")
STEPS = (0.025, 0.0125, 0.00625)


def euler_code(reference: Path, out: Path, dt: float, gradient_error: float = 0.0) -> None:
    """Another code: read the problem and the initial measure of a pdeflow file, integrate
    d omega_i / dt = -grad Phi(omega_i; rho) by explicit Euler (grad Phi from the softmax residual, docs/model.md),
    and write the frames at the reference's times and one /steps row per step (schema version 1)."""
    with h5py.File(reference, "r") as f:
        model = {k: f["model"][k][()] for k in ("embedding", "positions", "unembedding", "theta0", "basis")}
        data = {k: f["data"][k][()] for k in ("tokens", "targets", "mask", "weights")}
        attrs = {k: f["model"].attrs[k] for k in ("head_dim", "score_scale", "weight_decay")}
        frame_times = f["frames/time"][:]
        omega, mass = f["frames/omega"][0], f["frames/mass"][0]
    oracle = ReferenceModel.from_arrays({**model, **data, **attrs})
    n_steps = [round(t / dt) for t in frame_times]
    frames, steps = [omega.copy()], [0.0]
    for n in range(1, n_steps[-1] + 1):
        r = oracle.residuals(omega, mass)
        grad = np.array([oracle.grad_phi_from_residuals(w, r) for w in omega]) + gradient_error
        omega = omega - dt * grad
        steps.append(n * dt)
        if n in n_steps:
            frames.append(omega.copy())
    with h5py.File(out, "w") as f:
        f.attrs["schema"], f.attrs["schema_version"] = "pdeflow-trajectory", 1
        for key, value in {**model}.items():
            f[f"model/{key}"] = value
        for key, value in attrs.items():
            f["model"].attrs[key] = value
        for key, value in data.items():
            f[f"data/{key}"] = value
        f["frames/time"] = [n * dt for n in n_steps]
        f["frames/omega"] = np.array(frames)
        f["frames/mass"] = np.tile(mass, (len(frames), 1))
        f["steps/time"] = steps


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict[str, Path]:
    """An adaptive pdeflow reference (rtol 1e-10) and the Euler code at dt = 0.025, 0.0125, 0.00625, with and without an
    O(1) error in grad Phi."""
    folder = tmp_path_factory.mktemp("order")
    cfg = tiny_config("adaptive", *SHORT, "solver.rtol=1e-10", "solver.atol=1e-12")
    files = {"ref": folder / "ref.h5"}
    assert run(cfg, Problem.from_config(cfg), files["ref"], quiet=True).exit_code == 0
    for dt in STEPS:
        files[f"euler-{dt}"] = folder / f"euler-{dt}.h5"
        euler_code(files["ref"], files[f"euler-{dt}"], dt)
        files[f"wrong-{dt}"] = folder / f"wrong-{dt}.h5"
        euler_code(files["ref"], files[f"wrong-{dt}"], dt, gradient_error=0.05)
    return files


def _runs(family: dict[str, Path], kind: str) -> list[str]:
    return [str(family[f"{kind}-{dt}"]) for dt in (STEPS[2], STEPS[0], STEPS[1])]   # any order: sorted by step


def test_the_euler_code_writes_valid_files(family, capsys):
    assert validate(family[f"euler-{STEPS[1]}"]) == []
    assert main(["validate", str(family[f"euler-{STEPS[1]}"])]) == 0 and "valid" in capsys.readouterr().out


def test_explicit_euler_has_observed_order_one(family, tmp_path, capsys):
    figure = tmp_path / "order.png"
    code = main(["compare", "--order", *_runs(family, "euler"), str(family["ref"]), "--expect", "1",
                 "--figure", str(figure)])
    out = capsys.readouterr().out
    assert code == 0, out
    for quantity in ("energy", "dissipation", "logits", "W2"):
        line = next(x for x in out.splitlines() if x.startswith(f"{quantity}: observed order"))
        assert line.startswith(f"{quantity}: observed order 1.0") and "expected 1: pass" in line, line
    assert "PASS: 4/4" in out and figure.stat().st_size > 1000
    study = order_study(_runs(family, "euler"), family["ref"], 1.0)
    assert list(study.h) == pytest.approx([0.025, 0.0125, 0.00625])
    for q in study.quantities:
        assert abs(q.slope - 1.0) < 0.1 and q.slope_stderr < 0.1 and np.all(np.diff(q.errors) < 0)


def test_an_error_in_grad_phi_fails_the_order_check(family, capsys):
    code = main(["compare", "--order", *_runs(family, "wrong"), str(family["ref"]), "--expect", "1"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "FAIL" in out.splitlines()[-1]
    study = order_study(_runs(family, "wrong"), family["ref"], 1.0)
    assert all(not q.ok and q.observed < 0.5 for q in study.quantities)


def test_a_reference_not_10x_more_accurate_is_refused(family, tmp_path, capsys):
    """The Euler run at the finest step as the reference of the two coarser ones: its own error (about half of the
    finest run's, measured against the adaptive run given as the tighter file) is not 10x smaller."""
    runs = [str(family[f"euler-{STEPS[0]}"]), str(family[f"euler-{STEPS[1]}"])]
    with pytest.raises(OrderRefused, match="not 10x more accurate"):
        order_study(runs, family[f"euler-{STEPS[2]}"], 1.0, tighter=family["ref"])
    code = main(["compare", "--order", *runs, str(family[f"euler-{STEPS[2]}"]), "--expect", "1",
                 "--tighter", str(family["ref"])])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not 10x more accurate" in err


def test_a_family_without_step_sizes_or_with_equal_steps_is_refused(family, tmp_path, capsys):
    bare = tmp_path / "bare.h5"
    with h5py.File(family[f"euler-{STEPS[1]}"], "r") as src, h5py.File(bare, "w") as f:
        for group in ("model", "data", "frames"):
            src.copy(group, f)
        f.attrs.update(src.attrs)
    assert validate(bare) == []
    for files, reason in (([bare, family[f"euler-{STEPS[0]}"]], "no step sizes"),
                          ([family[f"euler-{STEPS[1]}"], family[f"euler-{STEPS[1]}"]], "must differ"),
                          ([family[f"euler-{STEPS[1]}"]], "at least two runs")):
        assert main(["compare", "--order", *map(str, files), str(family["ref"]), "--expect", "1"]) == 2
        err = capsys.readouterr().err
        assert reason in err and len(err.strip().splitlines()) == 1


def test_successive_orders_and_slope_of_known_errors():
    h = np.array([0.4, 0.2, 0.1, 0.05])
    e = 3.0 * h**2 * (1 + 0.1 * h)
    p = successive_orders(h, e)
    expected = [2 + math.log((1 + 0.1 * a) / (1 + 0.1 * b)) / math.log(2) for a, b in zip(h[:-1], h[1:])]
    assert p == pytest.approx(expected, rel=1e-12)


def test_the_tighter_run_of_each_kind_of_reference():
    """rtol and atol / 10 for an error-controlled method, dt / 2 for a fixed explicit step; a method tuned by other
    knobs (grid, tau, noise) or an rtol at its floor cannot be tightened by pdeflow: the user gives the file."""
    cfg, how = tighter_config(tiny_config("adaptive", "solver.rtol=1e-8", "solver.atol=1e-10"), largest_step=0.05)
    assert (cfg.solver.rtol, cfg.solver.atol) == pytest.approx((1e-9, 1e-11)) and "rtol 1e-08 -> 1e-09" in how
    assert cfg.solver.dt_max == pytest.approx(0.025) and cfg.solver.dt <= 0.025
    cfg, how = tighter_config(tiny_config("rk4", "solver.dt=0.05"))
    assert cfg.solver.dt == pytest.approx(0.025) and cfg.solver.method == "rk4"
    for method in ("jko", "sgd", "fv"):
        with pytest.raises(OrderRefused, match="--tighter FILE"):
            tighter_config(tiny_config(method))
    with pytest.raises(OrderRefused, match="cannot be tightened"):
        tighter_config(tiny_config("adaptive", "solver.rtol=1e-13"))


def test_a_tighter_file_equal_to_the_reference_establishes_nothing(family):
    with pytest.raises(OrderRefused, match="not established"):
        order_study(_runs(family, "euler"), family["ref"], 1.0, tighter=family["ref"])


def test_a_coarse_reference_is_refused_by_the_run_pdeflow_makes_itself(family, tmp_path, capsys):
    """pdeflow's own explicit Euler at half the finest step as the reference: pdeflow reruns its config at dt / 2,
    finds its error (about that of the finest Euler run / 2) not 10x smaller and refuses, naming the rerun; the
    family's adaptive reference passes the same check (test_explicit_euler_has_observed_order_one)."""
    cfg = tiny_config("euler", *SHORT, f"solver.dt={STEPS[-1] / 2!r}")
    coarse = tmp_path / "coarse.h5"
    assert run(cfg, Problem.from_config(cfg), coarse, quiet=True).exit_code == 0
    code = main(["compare", "--order", *_runs(family, "euler"), str(coarse), "--expect", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "not 10x more accurate" in err and "dt 0.003125 -> 0.0015625" in err, err
