"""studies/race/time_to_solution.py end to end at a toy size: every method at every mark, the long-run row, and a
table re-rendered from the saved JSON equal to the one written."""
from __future__ import annotations

import json
import math

import pytest

from pdeflow import Problem, loads_config
from pdeflow.core.problem import JVP_COST
from studies.race.time_to_solution import MARKS, benchmark, gradient_equivalents, main, markdown, run_stepper
from test_explicit import SMALL

SMALL_ROSENBROCK = SMALL.replace('method = "rk4"', 'method = "rosenbrock"')

# rkc at N = 4 passes t = 200 (the last mark) at step 272 (its controller on its estimate's order, 1/3): a step
# budget beyond it ends the long run at the same state on every machine and load (a wall-time limit would not)
RKC_STEPS = 300


def test_benchmark_rows_and_render(tmp_path):
    """Every method at every mark, the long run stopped by its step budget (its last row "reached", where the
    budget left it), and the table re-rendered from the saved JSON."""
    res = benchmark(4, wall=math.inf, max_steps=RKC_STEPS, log=lambda line: None)
    assert res["rkc"]["status"] == "max_steps" and res["rkc"]["final"]["steps"] == RKC_STEPS
    rows = {str(row["t"]): row for row in res["table"]}
    for mark in MARKS:
        row = rows[str(mark)]
        for method in ("rkc", "rosenbrock", "adaptive"):
            assert row[method]["measured"] and math.isfinite(row[method]["energy_error"])
            at = res[method]["at"][f"{mark:.6g}"]
            jac = "difference" if method != "adaptive" else ""
            assert row[method]["grad_equivalents"] == gradient_equivalents(at, method, jac)
    assert "jko" in rows["40.0"] and rows["40.0"]["jko"]["at_matched_accuracy"]["measured"] is False
    last = res["table"][-1]
    assert last["t"] == "reached" and last["adaptive"]["measured"] is False
    assert last["rkc"]["t"] == res["rkc"]["final"]["t"]
    final = res["rkc"]["final"]  # per-step columns are kept as their largest value, not summed
    assert "stability_margin" not in final and 0 < final["max_stability_margin"] <= 1 / 1.2 + 1e-12
    assert final["max_spectral_radius"] > 0 and final["steps"] > 1
    text = markdown(res)
    ratio = rows["200.0"]["adaptive"]["grad_equivalents"] / rows["200.0"]["rkc"]["grad_equivalents"]
    assert f"t = 200.0: Dormand-Prince / rkc gradient equivalents = {ratio:.2f}" in text
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(res, default=float))
    assert main(["--render", str(saved), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "time_to_solution.md").read_text() == text


def test_race_runs_table_and_plot(tmp_path):
    """The matched-accuracy race at a toy size (N = 4, to t = 10): runs saved one file each, gathered against a
    tight Dormand-Prince reference and checked against a second reference (cvode); each row's error is its energy's
    distance from the reference's and its cost the stepper's counts in gradient equivalents; the plot is
    written."""
    import pytest

    pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')
    from studies.race.time_to_solution import race_markdown

    out = tmp_path / "out"
    for name in ("adaptive:1e-10", "cvode:1e-10", "rkc:1e-4", "cvode:1e-5"):
        assert main(["--race", name, "--n", "4", "--t-end", "10", "--out", str(out)]) == 0
    assert main(["--race-render", str(out / "race"), "--reference", "adaptive:1e-10", "--check", "cvode:1e-10",
                 "--out", str(out)]) == 0
    res = json.loads((out / "matched_accuracy.json").read_text())
    runs = {(r["method"], r["rtol"]): r for r in res["runs"]}
    ref = runs[("adaptive", 1e-10)]
    rows = res["table"]["rows"]
    assert len(rows) == 3  # every run but the reference, at t = 10
    for row in rows:
        run = runs[(row["method"], row["rtol"])]
        at, ref_at = run["at"][f"{row['t']:.6g}"], ref["at"][f"{row['t']:.6g}"]
        assert row["energy_error"] == abs(at["energy"] - ref_at["energy"])
        jacobian = "difference" if row["method"] == "rkc" else run["solver"].get("jacobian", "exact")
        assert row["grad_equivalents"] == gradient_equivalents(at, row["method"], jacobian)
    loose = {r["method"]: r["energy_error"] for r in rows if r["rtol"] > 1e-9}
    check = [r for r in res["table"]["references"] if r["t"] == 10.0][0]["difference"]
    assert check < 1e-3 * min(loose.values())  # the two references agree far below the errors they resolve
    assert (out / "matched_accuracy.png").stat().st_size > 1000
    assert (out / "matched_accuracy.md").read_text() == race_markdown(res)


def test_race_references_by_time(tmp_path):
    """Race references named in order: at each time the first that recorded it. A tight Dormand-Prince run that
    stopped at t = 5 cannot be the reference at t = 10: a tight cvode run is; no run is measured against itself and
    the check (a second reference) is compared with the reference of its time."""
    import pytest

    pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')
    from studies.race import time_to_solution

    out = tmp_path / "out"
    for name, t_end in (("adaptive:1e-10", "5"), ("cvode:1e-10", "10"), ("cvode:1e-9", "10"), ("rkc:1e-4", "10")):
        assert main(["--race", name, "--n", "4", "--t-end", t_end, "--out", str(out)]) == 0
    notes = tmp_path / "notes.md"
    notes.write_text("## What the race says\n\nA closing note.\n")
    assert main(["--race-render", str(out / "race"), "--reference", "adaptive:1e-10", "--reference", "cvode:1e-10",
                 "--check", "cvode:1e-9", "--notes", str(notes), "--out", str(out)]) == 0
    res = json.loads((out / "matched_accuracy.json").read_text())
    runs = {(r["method"], r["rtol"]): r for r in res["runs"]}
    rows = {(r["method"], r["rtol"], r["t"]): r for r in res["table"]["rows"]}
    assert set(rows) == {("cvode", 1e-9, 10.0), ("rkc", 1e-4, 10.0)}
    cvode_ref = runs[("cvode", 1e-10)]["at"]["10"]["energy"]
    for key, row in rows.items():
        assert row["energy_error"] == abs(runs[key[:2]]["at"]["10"]["energy"] - cvode_ref)
    [compared] = res["table"]["references"]
    assert compared["t"] == 10.0 and compared["reference"] == "cvode rtol 1e-10"
    assert compared["difference"] == rows[("cvode", 1e-9, 10.0)]["energy_error"]
    text = (out / "matched_accuracy.md").read_text()
    assert text == time_to_solution.race_markdown(res) and text.endswith("## What the race says\n\nA closing note.\n")



def test_race_keeps_the_furthest_run_of_each_setting(tmp_path, monkeypatch):
    """A race run repeated to a later time (rkc at rtol 1e-4 to t = 5, then to t = 10, which records t = 5 on the
    way) counts once: both its rows are the longer run's, with no second row of the same settings at t = 5."""
    import pytest

    pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')
    from studies.race import time_to_solution

    monkeypatch.setattr(time_to_solution, "RACE_MARKS", (5.0,))
    out = tmp_path / "out"
    for name, t_end in (("adaptive:1e-10", "5"), ("cvode:1e-10", "10"), ("rkc:1e-4", "5"), ("rkc:1e-4", "10")):
        assert main(["--race", name, "--n", "4", "--t-end", t_end, "--out", str(out)]) == 0
    longer = json.loads((out / "race" / "rkc-0.0001-t10.json").read_text())
    assert set(longer["at"]) == {"5", "10"}
    assert main(["--race-render", str(out / "race"), "--reference", "adaptive:1e-10", "--reference", "cvode:1e-10",
                 "--out", str(out)]) == 0
    res = json.loads((out / "matched_accuracy.json").read_text())
    rkc_rows = sorted((r for r in res["table"]["rows"] if r["method"] == "rkc"), key=lambda r: r["t"])
    assert [r["t"] for r in rkc_rows] == [5.0, 10.0]
    assert [r["wall"] for r in rkc_rows] == [longer["at"]["5"]["wall"], longer["at"]["10"]["wall"]]
    assert sum(r["method"] == "rkc" for r in res["runs"]) == 1


def test_race_run_replaces_the_saved_tables_run_of_the_same_settings(tmp_path, monkeypatch):
    """A race run in the folder stands for its settings even where the saved table's run of the same settings got
    further (the table's rkc run went to t = 12,744 but records no race mark): the table's run is left out, and the
    table's runs of settings not raced stay."""
    import pytest

    pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')
    from studies.race import time_to_solution

    out = tmp_path / "out"
    for name in ("cvode:1e-10", "rkc:1e-4"):
        assert main(["--race", name, "--n", "4", "--t-end", "10", "--out", str(out)]) == 0
    raced = json.loads((out / "race" / "rkc-0.0001-t10.json").read_text())
    table_rkc = {**raced, "at": {"12744": raced["final"]}, "final": {**raced["final"], "t": 12744.0}, "source": "table"}
    table_other = {**raced, "method": "rosenbrock", "source": "table"}
    monkeypatch.setattr(time_to_solution, "race_runs_from_table", lambda res: [table_rkc, table_other])
    saved = tmp_path / "table.json"
    saved.write_text("{}")
    res = time_to_solution.race_render(out / "race", saved, ["cvode:1e-10"], [], out)
    sources = {(r["method"], r.get("source", "")) for r in res["runs"]}
    assert sources == {("cvode", ""), ("rkc", ""), ("rosenbrock", "table")}
    assert [r["method"] for r in res["table"]["rows"] if r["t"] == 10.0] == ["rkc", "rosenbrock"]


def test_unreached_cells_say_what_came_closest():
    """A target no run of a method reached names, in this order of preference: the run with the smallest error at
    that time, a run stopped before that time with what it had cost by then (its counts in gradient equivalents),
    or the method's cheapest run at the latest earlier time."""
    from studies.race.time_to_solution import race_cost, unreached_cell

    def row(method, rtol, t, err, cost):
        return {"method": method, "rtol": rtol, "t": t, "energy_error": err, "grad_equivalents": cost}

    stopped = {"method": "rosenbrock", "rtol": 3e-4, "status": "wall_time", "costs": {},
               "solver": {"jacobian": "difference"},
               "final": {"t": 1624.4, "steps": 900.0, "gradient_evals": 3000.0, "jvps": 4000.0}}
    finished = {**stopped, "rtol": 3e-5, "status": "finished", "final": {**stopped["final"], "t": 200.0}}
    res = {"table": {"rows": [row("rkc", 1e-6, 2000.0, 3e-6, 900.0), row("rkc", 1e-7, 2000.0, 2e-6, 1500.0),
                              row("adaptive", 1e-5, 200.0, 7e-7, 85561.0), row("adaptive", 1e-8, 200.0, 1e-9, 90000.0),
                              row("adaptive", 1e-5, 40.0, 1e-7, 2400.0)]},
           "runs": [stopped, finished]}
    assert unreached_cell(res, "rkc", 2000.0) == "- (closest 2e-06 for 1500, rtol 1e-07)"
    assert race_cost(stopped, stopped["final"]) == 7000.0  # difference products count 1
    assert unreached_cell(res, "rosenbrock", 2000.0) == "- (rtol 0.0003 stopped at t = 1624 after 7000)"
    assert unreached_cell(res, "adaptive", 2000.0) == ("- (no run to t = 2000; to t = 200 its cheapest cost 85561, "
                                                       "rtol 1e-05)")
    assert unreached_cell(res, "eserk4", 2000.0) == "-"


def test_race_verdict_compares_the_cheapest_runs_reaching_each_target():
    """The verdict at a time: per target, the rival entry's (cvode-plain's) cheapest run at or below it against the
    cheapest run of every other entry, pdeflow's own cvode configurations among them, and their cost ratio; a target
    no run of a side reached says so; no verdict where the rival has no run at that time."""
    from studies.race.time_to_solution import RACE_RIVAL, race_verdict

    def row(method, rtol, t, err, cost):
        return {"method": method, "rtol": rtol, "t": t, "energy_error": err, "grad_equivalents": cost}

    assert RACE_RIVAL == "cvode-plain"
    rows = [row("cvode-plain", 1e-4, 200.0, 5e-5, 1000.0), row("cvode-plain", 1e-6, 200.0, 5e-7, 3000.0),
            row("rkc", 1e-4, 200.0, 8e-5, 800.0), row("rkc", 1e-5, 200.0, 9e-5, 700.0),
            row("eserk4", 1e-6, 200.0, 9e-7, 6000.0), row("cvode", 1e-6, 200.0, 2e-7, 6600.0),
            row("rkc", 1e-4, 40.0, 1e-5, 100.0), row("cvode", 1e-4, 40.0, 1e-5, 50.0)]
    lines = race_verdict(rows, 200.0)
    assert "| 0.0001 | 1000 (cvode-plain rtol 0.0001) | 700 (rkc rtol 1e-05) | 0.70 |" in lines
    assert "| 1e-06 | 3000 (cvode-plain rtol 1e-06) | 6000 (eserk4 rtol 1e-06) | 2.00 |" in lines
    assert "| 1e-08 | no run reached it | no run reached it | - |" in lines
    assert race_verdict(rows, 40.0) == []


def test_cvode_with_difference_products_is_a_race_entry_on_pdeflows_side():
    """``cvode-difference`` runs cvode with ``solver.jacobian = "difference"``, its products counted at one gradient
    each (the exact ones at pdeflow.core.problem.JVP_COST, not their measured cost), its cost
    broken down as cvode's, and in the verdict it stands on pdeflow's side against cvode-plain."""
    from studies.race.time_to_solution import cost_breakdown, race_cost, race_solver, race_verdict

    solver = race_solver("cvode-difference", 1e-5)
    assert solver == {**race_solver("cvode", 1e-5), "jacobian": "difference"} and solver["method"] == "cvode"
    counts = {"steps": 10.0, "gradient_evals": 25.0, "jvps": 60.0, "linear_iters": 30.0}
    exact = {"method": "cvode", "costs": {"exact_over_grad": 2.0}, "solver": race_solver("cvode", 1e-5)}
    difference = {**exact, "method": "cvode-difference", "solver": solver}
    assert race_cost(exact, counts) == 25.0 + JVP_COST * 60.0 and race_cost(difference, counts) == 25.0 + 60.0
    parts = cost_breakdown(difference, counts)
    assert parts["GMRES JVPs"] == 30.0 and sum(parts.values()) == race_cost(difference, counts)

    def row(method, rtol, err, cost):
        return {"method": method, "rtol": rtol, "t": 200.0, "energy_error": err, "grad_equivalents": cost}

    lines = race_verdict([row("cvode-plain", 1e-5, 9e-5, 1000.0), row("cvode-difference", 1e-5, 8e-5, 600.0),
                          row("rkc", 1e-4, 7e-5, 900.0)], 200.0)
    assert "| 0.0001 | 1000 (cvode-plain rtol 1e-05) | 600 (cvode-difference rtol 1e-05) | 0.60 |" in lines


def test_cvode_difference_race_run_through_the_command_line(tmp_path):
    """``--race cvode-difference:RTOL`` and ``--race cvode-plain:RTOL`` end to end: the saved run ran cvode with
    difference products, and the render counts each of its products as one gradient (its cost is its f calls plus
    its products); cvode-plain's cost is the right-hand-side calls SUNDIALS made."""
    import pytest

    pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')
    out = tmp_path / "out"
    for name in ("adaptive:1e-10", "cvode-difference:1e-5", "cvode-plain:1e-5"):
        assert main(["--race", name, "--n", "4", "--t-end", "5", "--out", str(out)]) == 0
    run = json.loads((out / "race" / "cvode-difference-1e-05-t5.json").read_text())
    assert run["method"] == "cvode-difference" and run["solver"]["method"] == "cvode"
    assert run["solver"]["jacobian"] == "difference" and run["final"]["t"] == 5.0
    assert main(["--race-render", str(out / "race"), "--reference", "adaptive:1e-10", "--out", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads((out / "matched_accuracy.json").read_text())["table"]["rows"]}
    row, plain = rows["cvode-difference"], rows["cvode-plain"]
    # cvode-plain: GMRES on CVODE's own quotients (none of pdeflow's products but dI/dt's), its cost the
    # right-hand-side calls SUNDIALS made, pdeflow's energy identity (f at each new state, dI/dt) shown apart
    at = json.loads((out / "race" / "cvode-plain-1e-05-t5.json").read_text())["at"]["5"]
    assert at["linear_rhs_evals"] == at["linear_iters"] > 0 and at["jvps_difference"] == at["steps"] + 1
    assert plain["grad_equivalents"] == at["rhs_evals"] + at["linear_rhs_evals"]
    assert at["gradient_evals"] == at["rhs_evals"] + at["linear_rhs_evals"] + at["steps"]
    assert plain["breakdown"]["GMRES products"] == at["linear_iters"]
    at = run["at"]["5"]
    # the Problem counted every product of cvode's (its own tally) as a difference, none exact
    assert at["jvps_difference"] == at["jvps"] > 0 and at["jvps_exact"] == 0
    assert row["grad_equivalents"] == at["gradient_evals"] + at["jvps_difference"] + 1.0  # + the initial evaluation


def test_time_to_solution_counts_what_the_stepper_reports():
    """studies/race/time_to_solution.py: rows at each mark, a difference product counted as one grad Phi."""
    cfg = loads_config(SMALL_ROSENBROCK, ['solver.jacobian="difference"'])
    problem = Problem.from_config(cfg)
    res = run_stepper(cfg, problem, 1.0, marks=(0.5,))
    assert set(res["at"]) == {"0.5", "1"} and res["status"] == "finished"
    row = res["at"]["1"]
    assert row["steps"] > res["at"]["0.5"]["steps"] > 0
    # the Problem's count of difference products (the base's column) is the stepper's own tally of its products
    assert row["jvps_difference"] == row["jvps"] > 0 and row["jvps_exact"] == 0
    assert gradient_equivalents(row, "rosenbrock") == row["gradient_evals"] + row["jvps"] + 1.0
    # a row recorded before the cost columns: its products of the kind given, an exact one at JVP_COST
    legacy = {"gradient_evals": row["gradient_evals"], "jvps": row["jvps"]}
    assert gradient_equivalents(legacy, "rosenbrock", "difference") == row["gradient_evals"] + row["jvps"]
    assert gradient_equivalents(legacy, "rosenbrock", "exact") == row["gradient_evals"] + JVP_COST * row["jvps"]


def _entryless_adaptive_methods() -> list[str]:
    """The registered error-controlled methods with no row of RACE_SOLVERS (bs23, heun_euler, any added later)."""
    from pdeflow.solvers import STEPPERS
    from pdeflow.solvers.controller import AdaptiveStepper

    from studies.race.time_to_solution import RACE_SOLVERS

    return [name for name, cls in STEPPERS.items() if issubclass(cls, AdaptiveStepper) and name not in RACE_SOLVERS]


@pytest.mark.parametrize("method", _entryless_adaptive_methods())
def test_any_registered_adaptive_method_races_without_an_entry(tmp_path, capsys, method):
    """A registered error-controlled method without a row of RACE_SOLVERS races with the generic settings, its cost
    read from the base's cost columns (an embedded pair's new evaluations per attempt, the tableau's ``len(A) - 1``);
    a method with no tolerance to race is refused in one line (exit 2). Adding a method edits nothing here."""
    from pdeflow.solvers import STEPPERS
    from pdeflow.solvers.explicit import EmbeddedRK

    from pdeflow.core.problem import gradient_equivalents
    from studies.race.time_to_solution import RACE_DEFAULT, race_solver

    assert race_solver(method, 1e-4) == {"method": method, "dt": RACE_DEFAULT["dt"], "rtol": 1e-4,
                                         "atol": 1e-4 * RACE_DEFAULT["atol_over_rtol"]}
    out = tmp_path / "out"
    for name in ("adaptive:1e-10", f"{method}:1e-4"):
        assert main(["--race", name, "--n", "4", "--t-end", "5", "--out", str(out)]) == 0
    run = json.loads((out / "race" / f"{method}-0.0001-t5.json").read_text())
    assert run["solver"]["method"] == method and run["final"]["t"] == 5.0
    at = run["at"]["5"]
    cls = STEPPERS[method]
    if issubclass(cls, EmbeddedRK):
        attempts = at["steps"] + at["rejected"]
        assert at["gradient_evals"] == (len(cls.A) - 1) * attempts and at["jvps_exact"] == 0
    cost = gradient_equivalents({"gradient": at["gradient_evals"], "jvp_exact": at["jvps_exact"],
                                 "jvp_difference": at["jvps_difference"]})
    assert main(["--race-render", str(out / "race"), "--reference", "adaptive:1e-10", "--out", str(out)]) == 0
    [row] = json.loads((out / "matched_accuracy.json").read_text())["table"]["rows"]
    assert row["method"] == method and row["grad_equivalents"] == cost + 1.0  # + the initial one
    assert 0 < row["energy_error"] < 1e-2
    capsys.readouterr()
    assert main(["--race", "rk4:1e-4", "--n", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a registered error-controlled method" in err[0]
