"""Every shipped run-config holds its own accuracy check at its shipped settings (no false alarms), and the
full-coordinate problem (data/configs/full.toml) at the old settings (RK4, dt = 0.25, to t = 40) reports its loss
of accuracy near t = 21.

Run here: every config of data/configs that `pdeflow run` runs, at its shipped settings; the only change is
``diagnostics.enabled = false`` (the analysis a finished run appends, e.g. the gap search, is not part of the
time integration the check is about). The configs of data/reference (diagnostics already off) are run once, by
tests/io/test_reference.py, which asserts their accuracy verdict on the same run that reproduces the golden file.
Not run here: the experiment configs driven by other commands, exercised by those commands' tests -
``data/configs/chaos.toml`` (`pdeflow chaos`, tests/analysis/test_chaos.py), ``data/configs/stability.toml``
(`pdeflow stability`, tests/analysis/test_stability.py) (the benchmark's
``benchmarks/bench-reference.toml`` lives with the benchmarks, tests/meta/test_packaging.py).
Shortened here: ``data/configs/longtime.toml``, a 10-minute run by design (its wall-time limit); the test runs
its first time units (``run.t_end = 2``: the stiff start, where its steps grow 1.25x per step from dt = 0.005)
and docs/guide.md records the full run's verdict as a measurement.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = {"chaos", "stability"}
SHORTENED = {"longtime"}
SHIPPED = sorted(p for p in (ROOT / "data" / "configs").glob("*.toml") if p.stem not in EXPERIMENTS)


def pdeflow(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """``pdeflow ARGS`` run in this process (the suite's numba thread count; no interpreter start and no second
    load of the compiled kernels per config): exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_list_of_shipped_configs_is_complete():
    names = {p.stem for p in SHIPPED}
    assert {"quickstart", "full", "markov", "jko", "jko-grid", "grid2d"} <= names
    assert len(SHIPPED) + len(EXPERIMENTS) == len(list((ROOT / "data" / "configs").glob("*.toml")))


@pytest.mark.slow
@pytest.mark.parametrize("config", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_a_shipped_config_keeps_its_accuracy(config, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)   # where the command ran before: in the checkout
    out = tmp_path / "run.h5"
    shortened = ["--set", "run.t_end=2"] if config.stem in SHORTENED else []
    code, _, err = pdeflow(capsys, "run", str(config), "-o", str(out), "--quiet", "--set", "diagnostics.enabled=false",
                           *shortened)
    assert code == 0, err
    assert "accuracy" not in err, err           # no warning line
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "finished" and np.isnan(traj.attrs["accuracy_lost_at"])
    verdict = traj.attrs["accuracy"]
    print(f"{config.stem}: {verdict}")
    assert verdict.startswith(("held", "not checked")), verdict
    if config.stem in ("quickstart", "full"):
        # the energy identity over the whole run, with the steps' own quadrature: <= 1e-3 of the decrease
        e, q = traj.steps["energy"], traj.steps["dissipation_integral"]
        residual = abs(e[-1] - e[0] + np.sum(q[1:]))
        assert residual <= 1e-3 * (e[0] - e[-1]), (residual, e[0] - e[-1])
        assert traj.attrs["max_stability_ratio"] < 1.0


@pytest.mark.slow
def test_the_full_problem_at_the_old_step_stops_where_rk4_loses_stability(tmp_path, capsys, monkeypatch):
    """RK4 with dt = 0.25 to t = 40: lambda_max dt crosses 2.785 at t ~ 20 (lambda_max = 11.1); with
    run.accuracy = "stop" the run ends there, exit 3, the loss in the file, on the terminal and in info."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "q.h5"
    code, _, err = pdeflow(capsys, "run", "data/configs/full.toml", "-o", str(out), "--quiet",
                           "--set", "solver.dt=0.25", "--set", "solver.method=rk4", "--set", "run.t_end=40",
                           "--set", "run.accuracy=stop", "--set", "diagnostics.enabled=false")
    assert code == 3, err
    line = err.strip()
    assert "\n" not in line and "accuracy_lost" in line and "stability bound 2.785" in line, line
    traj = open_trajectory(out)
    t_lost = traj.attrs["accuracy_lost_at"]
    assert 20.0 <= t_lost <= 22.0 and traj.attrs["status"] == "accuracy_lost"
    # the step the bound allows at the loss is necessary only: the line says how far lambda_max rose since the first
    # check (the /steps record: its first measured lambda_max dt against the one at the loss)
    steps = traj.steps
    checked = np.isfinite(steps["lambda_max_dt"])
    first, at_loss = steps["lambda_max_dt"][checked][0], steps["lambda_max_dt"][steps["time"] == t_lost][0]
    t_first = steps["time"][checked][0]
    assert at_loss > 1.5 * first
    assert f"lambda_max rose {at_loss / first:.3g}-fold since t = {t_first:.6g}" in line, line
    assert traj.checkpoint.t == t_lost
    assert np.array_equal(traj.time, np.arange(0.0, np.floor(t_lost) + 0.5, 1.0))   # every frame before it
    info = pdeflow(capsys, "info", str(out))[1]
    assert f"accuracy    LOST at t = {t_lost:g}" in info, info
