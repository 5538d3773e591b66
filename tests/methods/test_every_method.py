"""Every method of the method table (:data:`pdeflow.solvers.methods.METHODS`) end to end through the commands a user
runs: ``pdeflow run`` on a tiny problem with the accuracy record on, the record's verdict and the energy identity summed
from the file's /steps, then ``diagnose``, ``compare`` (the file against itself, and against a copy with one
perturbed energy) and ``info`` on its file. A method added to the table is run here with no edit (its defaults on the
tiny problem of its measure); one that cannot pass fails. Also: the knob each method's accuracy advice names, and
the order of the energy-identity defect recorded by the error-controlled steppers."""
from __future__ import annotations

import math
import shutil

import h5py
import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.accuracy import remedy
from pdeflow.solvers.driver import run
from pdeflow.solvers.methods import GRID, METHODS, PARTICLES

from pdeflow import Problem, loads_config
from pdeflow.core.problem import JVP_COST
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

# a tiny problem per measure: the majority task enumerated exactly, reduced coordinates (k = 2 particles, k = 1
# grid), so each command runs in a fraction of a second
TINY = """
[task]
name = "majority"
vocab_size = 3
seq_len = 4
exact = true
[model]
d = 8
head_dim = 2
family_scale = 4.0
family_seed = 1
weight_decay = 0.05
[solver]
dt = 0.05
[run]
t_end = 0.5
frame_interval = 0.25
[diagnostics]
gap = false
"""
MEASURE = {PARTICLES: ['model.coordinates="gain2"', "init.n_particles=8", "init.scale=2.0"],
           GRID: ['model.coordinates="output_gain"', 'init.measure="grid"', "init.mean=[0.5]", "init.scale=0.6",
                  "grid.n=32", "grid.radius=4.0"]}
# only what a method needs to run the dynamics it exists for: the Fisher-Rao reaction of the WFR methods, and for
# wfr_jko the settings of its tests (tests/methods/test_wfr.py: a plan kernel about a cell wide)
NEEDS = {"wfr": ["solver.gamma=1.0"], "fv": ["solver.gamma=1.0"],
         "wfr_jko": ["solver.gamma=2.0", "solver.tau=0.2", "solver.epsilon=0.004", "grid.n=128"]}
# the floor of the defect's denominator (pdeflow.solvers.accuracy.FLOOR_ULPS machine epsilons of |E|)
FLOOR = 1000 * np.finfo(float).eps


def tiny_config(method: str, *extra: str):
    measure = METHODS[method].measures[0]
    return loads_config(TINY, [f'solver.method="{method}"', *MEASURE[measure], *NEEDS.get(method, []), *extra])


@pytest.fixture(scope="module")
def method_file(tmp_path_factory):
    """``pdeflow run`` of a method on its tiny problem (once per method); the file's path and the run's stdout
    and stderr."""
    made = {}

    def make(method: str, capsys):
        if method not in made:
            folder = tmp_path_factory.mktemp(method)
            cfg = tiny_config(method)
            (folder / "tiny.toml").write_text(cfg.to_toml())
            out = folder / f"{method}.h5"
            args = ["run", str(folder / "tiny.toml"), "-o", str(out), "--quiet"]
            code = main(args)
            made[method] = (out, code, capsys.readouterr())
        return made[method]
    return make


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_runs_holds_its_accuracy_and_its_file_answers_every_command(method, method_file, capsys,
                                                                              tmp_path):
    out, code, captured = method_file(method, capsys)
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "finished" and traj.attrs["method"] == method
    assert math.isclose(float(traj.time[-1]), 0.5) and len(traj.time) == 3
    stepper = make_stepper(traj.problem(), traj.config)
    verdict = str(traj.attrs["accuracy"])
    steps = traj.steps
    if stepper.energy_identity:
        # the verdict held, and the identity summed from the file's own /steps rows agrees with it
        assert verdict.startswith("held:") and math.isnan(traj.attrs["accuracy_lost_at"]), verdict
        assert np.all(steps["identity_defect"][1:] <= traj.config.run.identity_tol)
        energy, quadrature = steps["energy"], steps["dissipation_integral"][1:]
        assert np.all(np.isfinite(quadrature)) and np.all(quadrature >= 0)
        # each recorded defect is the one its row's energies and quadrature give
        change = np.diff(energy)
        defect = np.abs(change + quadrature) / np.maximum(np.abs(change), FLOOR * np.abs(energy[1:]))
        np.testing.assert_allclose(steps["identity_defect"][1:], defect, rtol=1e-9)
        # and over the run: E(T) - E(0) = -int I within the run's tolerance of the decrease
        drop = energy[0] - energy[-1]
        assert drop > 0 and abs(energy[-1] - energy[0] + quadrature.sum()) <= traj.config.run.identity_tol * drop
    else:
        # no identity for this run: the file says why, and claims no verdict it did not check
        assert "identity_defect not recorded" in traj.steps_attrs["accuracy_note"]
        assert np.all(np.isnan(steps["identity_defect"]))
        assert not verdict.startswith("LOST")

    # the base's cost columns, fed by the Problem: every particle step evaluated grad Phi, and every step reports
    # its products by kind (a grid stepper's Phi on its cells is not a counted kind: 0); one formula sums them
    from pdeflow.solvers.base import COST_COLUMNS

    from pdeflow.analysis.convergence.spectral import run_gradient_equivalents

    cost = np.array([steps[column][1:] for column in COST_COLUMNS])
    assert np.all(cost >= 0) and np.all(cost == np.round(cost)), method
    assert (cost[0].sum() > 0) == (stepper.measure == PARTICLES), method
    assert run_gradient_equivalents(steps) == cost[0].sum() + JVP_COST * cost[1].sum() + cost[2].sum()

    # diagnose: the analysis of the file, stored as /analysis (the search for min Phi has its own tests)
    assert main(["diagnose", str(out), "--no-gap"]) == 0
    report = capsys.readouterr().out
    assert "energy ident." in report and "stored as /analysis" in report and "Traceback" not in report
    assert "analysis" in {k for k in h5py.File(out, "r").keys()}

    # compare: the file against itself passes, against a copy with one energy moved by 1e-3 fails at that row
    assert main(["compare", str(out), str(out)]) == 0
    table = capsys.readouterr().out
    rows = sum(1 for line in table.splitlines() if line.rstrip().endswith(" ok"))
    assert f"PASS: {rows}/{rows} within tolerance" in table and rows >= 4 * len(traj.time)
    moved = tmp_path / "moved.h5"
    shutil.copyfile(out, moved)
    with h5py.File(moved, "r+") as f:
        f["frames/energy"][1] += 1e-3
    assert main(["compare", str(moved), str(out)]) == 1
    table = capsys.readouterr().out
    failed = [line for line in table.splitlines() if line.rstrip().endswith("FAIL")]
    assert len(failed) == 1 and "energy" in failed[0] and f"FAIL: {rows - 1}/{rows} within tolerance" in table

    # info: the file's summary, with the verdict the run wrote
    assert main(["info", str(out)]) == 0
    summary = capsys.readouterr().out
    assert f"{method} on {METHODS[method].measures[0]}" in summary and verdict[:20] in summary


# ---- the advice a loss of accuracy gives --------------------------------------------------------------------
KNOB = {"rtol": "solver.rtol", "tau": "solver.tau", "cfl": "solver.cfl"}


@pytest.mark.parametrize("method", [name for name, m in METHODS.items() if m.explicit])
def test_an_explicit_method_costs_its_tableaus_stages(method):
    """The Problem's count against the Butcher tableau: in the loop that measures each new state (as the driver
    does), a fixed-step step costs ``len(b)`` grad Phi evaluations (its stages after the first, and its new state's),
    an embedded first-same-as-last pair ``len(A) - 1`` per attempt (the rejected ones included); no products."""
    from pdeflow.solvers.base import STEPPERS
    from pdeflow.solvers.explicit import EmbeddedRK
    from pdeflow.solvers.loop import Loop, Observer

    cfg = tiny_config(method)
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state = stepper.initial_state()
    stepper.diagnostics(state)
    rows = []

    class Rows(Observer):
        def accept(self, step):
            rows.append(step.stepper_columns)
    Loop(stepper, [0.25, 0.5], [Rows()], measure=True).run(state)
    cls = STEPPERS[method]
    per_attempt = len(cls.A) - 1 if issubclass(cls, EmbeddedRK) else len(cls.b)
    assert len(rows) >= 2
    for row in rows:
        assert row["gradient_evals"] == per_attempt * (1 + row.get("rejected", 0.0)), (method, row)
        assert row["jvps_exact"] == row["jvps_difference"] == 0.0


@pytest.mark.parametrize("method", list(METHODS))
def test_accuracy_advice_names_the_methods_own_knob(method):
    """An identity loss advises the setting the method itself reads: an error-controlled method's tolerances (and
    dt_max), a minimizing movement's tau, finite volumes' cfl, else the fixed step dt."""
    cfg = tiny_config(method)
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    advice = remedy(stepper)
    own = next((knob for key, knob in KNOB.items() if hasattr(stepper, key)), "solver.dt")
    assert own in advice
    if own in ("solver.rtol", "solver.tau"):
        assert "solver.dt " not in advice and "solver.dt =" not in advice.replace("solver.dt_max", "")
    if own == "solver.rtol":
        assert "solver.atol" in advice and "solver.dt_max" in advice


def test_identity_loss_of_an_adaptive_run_advises_its_tolerances(tmp_path, capsys):
    """The message of an actual loss (the adaptive stepper at a tolerance far too loose for the identity tolerance
    asked for) names rtol/atol with the values estimated to reach t_end, not dt."""
    cfg = tmp_path / "loose.toml"
    cfg.write_text(TINY)
    code = main(["run", str(cfg), "-o", str(tmp_path / "loose.h5"), "--quiet", "--set", 'solver.method="adaptive"',
                 *(a for item in MEASURE[PARTICLES] for a in ("--set", item)), "--set", "solver.rtol=0.5",
                 "--set", "solver.atol=0.5", "--set", "run.identity_tol=1e-9"])
    err = capsys.readouterr().err
    assert code == 3 and "tighten solver.rtol" in err and "reaches t_end" in err and "reduce solver.dt" not in err


@pytest.mark.parametrize("rtol", ["1e-14", "0", "2.0"])
def test_tolerances_float64_cannot_deliver_are_refused(tmp_path, capsys, rtol):
    cfg = tmp_path / "tight.toml"
    cfg.write_text(TINY)
    code = main(["run", str(cfg), "-o", str(tmp_path / "t.h5"), "--quiet", "--set", 'solver.method="rkc"',
                 *(a for item in MEASURE[PARTICLES] for a in ("--set", item)), "--set", f"solver.rtol={rtol}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "solver.rtol" in err and "Traceback" not in err
    assert rtol == "0" or "2.2e-14" in err


# ---- the order of the recorded identity defect ------------------------------------------------------------------
# the error-controlled steppers at fixed steps (dt_max = dt, a tolerance no step fails) and the order of their
# recorded defect |dE + Q| / |dE|, Q the /steps/dissipation_integral the run recorded: the method's order where the
# quadrature is finer (rkc 2, rosenbrock 3, eserk4 4 (measured 3.7 at these steps): Hermite; adaptive: its own
# stages, measured 6.5 on this problem), the trapezoid's 2 for wfr (its joint (omega, m) stages carry no quadrature
# of the WFR dissipation)
RECORDED_ORDER = {"adaptive": (4.5, math.inf), "wfr": (1.8, 2.2), "rkc": (1.8, 2.4), "rosenbrock": (2.7, 3.3),
                  "eserk4": (3.4, 4.4)}
FIXED_STEPS = ["solver.rtol=1.0", "solver.atol=1.0", "run.t_end=1.0"]


@pytest.mark.parametrize("method", list(RECORDED_ORDER))
def test_recorded_identity_defect_has_the_order_of_the_method(method, tmp_path):
    from test_explicit import SMALL

    medians = []
    for h in (0.1, 0.05):
        extra = ["solver.gamma=2.0"] if method == "wfr" else ["solver.krylov_tol=1e-12"] if method == "rosenbrock" \
            else []
        cfg = loads_config(SMALL, [f"solver.method='{method}'", f"solver.dt={h}", f"solver.dt_max={h}", *FIXED_STEPS,
                                   "diagnostics.enabled=false", *extra])
        path = tmp_path / f"{h}.h5"
        assert run(cfg, Problem.from_config(cfg), path, quiet=True).status == "finished"
        steps = open_trajectory(path).steps
        assert len(steps["time"]) == round(1.0 / h) + 1  # fixed steps: no rejection changed them
        medians.append(float(np.median(steps["identity_defect"][1:])))
    low, high = RECORDED_ORDER[method]
    assert low < math.log2(medians[0] / medians[1]) < high, medians
