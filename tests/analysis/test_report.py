"""``pdeflow report`` on a tiny problem (k = 2 reduced coordinates, 6 heads): every section's verdict agrees with the
command it wraps, read back from that command's own file; the page, the JSON, the tables and the figures are written;
a rerun reuses what was computed; bad input is one line and exit 2."""
from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow.analysis.diagnostics import read_analysis
from pdeflow.analysis.report.sections import (
    CONTRADICTED,
    HOLDS,
    NOT_ESTABLISHED,
    RATE_TOLERANCE,
    energy_section,
    optimality_section,
)
from pdeflow.analysis.stationary.stationary import read_stationary
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

# about a minute on an idle machine (six pdeflow commands in subprocesses): scheduled first (conftest.py)
pytestmark = pytest.mark.slow

# the documentation examples' tiny problem (6 heads, an exactly enumerated 3-token chain, rk4 to t = 5)
TINY = (Path(__file__).resolve().parents[2] / "data" / "configs" / "tiny.toml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("report")
    config = tmp / "tiny.toml"
    config.write_text(TINY, encoding="utf-8")
    out = tmp / "R"
    assert main(["report", str(config), "-o", str(out), "--skip", "dirac,chaos", "--quiet"]) == 0
    return out, json.loads((out / "report.json").read_text(encoding="utf-8"))


def _section(data: dict, key: str) -> dict:
    return next(s for s in data["sections"] if s["key"] == key)


def test_every_file_of_the_report_is_written_and_the_page_needs_no_network(report):
    out, data = report
    assert [s["key"] for s in data["sections"]] == ["energy", "stationary", "optimality", "rates", "minimum",
                                                    "dirac", "chaos"]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"(src|href)=['\"]https?:", page), "the page loads nothing from the network"
    for s in data["sections"]:
        assert s["verdict"] in (HOLDS, CONTRADICTED, NOT_ESTABLISHED) and s["reason"]
        with open(out / "tables" / f"{s['key']}.csv", encoding="utf-8") as f:
            assert len(list(csv.reader(f))) == 1 + len(s["table"])
        assert r"\begin{tabular}" in (out / "tables" / f"{s['key']}.tex").read_text(encoding="utf-8")
        for stem in s["figures"]:
            assert (out / "figures" / f"{stem}.png").stat().st_size > 1000
            assert f"figures/{stem}.png" in page
    for stem in ("energy", "identity", "gap"):
        assert (out / "figures" / f"{stem}.pdf").read_bytes()[:4] == b"%PDF"
    stages = [st["command"] for st in data["provenance"]["stages"]]
    assert stages[0].startswith("pdeflow run ") and any(c.startswith("pdeflow stationary ") for c in stages)
    assert data["provenance"]["cpu"] and data["provenance"]["pdeflow_version"]


def test_each_verdict_is_the_wrapped_commands(report, tmp_path):
    out, data = report
    traj = open_trajectory(out / "run.h5")
    # energy: the run's accuracy record; and the table's largest rise of E is the steps' own (read with h5py)
    energy = _section(data, "energy")
    assert (energy["verdict"] == HOLDS) == str(traj.attrs["accuracy"]).startswith("held")
    with h5py.File(out / "run.h5", "r") as f:
        e = np.asarray(f["steps"]["energy"][()], dtype=float)
    rise = next(r["value"] for r in energy["table"] if r["quantity"].startswith("largest increase"))
    assert float(rise) == pytest.approx(max(0.0, float(np.max(np.diff(e)))), rel=1e-3, abs=1e-300)
    # stationary: pdeflow stationary's certificate
    point = read_stationary(out / "stationary.h5")
    assert (_section(data, "stationary")["verdict"] == HOLDS) == bool(point["certified"])
    assert point["verdict"] in _section(data, "stationary")["reason"]
    # optimality: the gap of diagnose at its last gap frame, certified or not
    analysis = read_analysis(traj)
    last = int(analysis.gap_frames[-1])
    opt = _section(data, "optimality")
    # holds only on the certified upper bound (the one rule: tests/analysis/test_report_verdicts.py)
    assert (opt["verdict"] == HOLDS) == bool(analysis.gap_certified[last] and analysis.gap_bound[last] <= 1e-6)
    assert float(opt["table"][0]["value"]) == pytest.approx(float(analysis.gap[last]), rel=1e-3)
    # an uncertified gap above 0 is still a witness: the search found Phi that far below its mean on rho
    found = copy.deepcopy(analysis)
    found.gap[last], found.gap_certified[last] = 0.5, False
    witness = optimality_section(traj, found, tmp_path)
    assert witness.verdict == NOT_ESTABLISHED and "G ≥ 0.5" in witness.reason and "witness" in witness.reason
    # E* of the rates section is the certified point's energy (diagnose --stationary), and only a certified one's
    rates = _section(data, "rates")
    if bool(point["certified"]):
        assert float(rates["table"][0]["value"]) == pytest.approx(float(point["energy"]), rel=1e-10)
    diagnose = next(st["command"] for st in data["provenance"]["stages"] if st["stage"] == "diagnose")
    assert ("--stationary" in diagnose) == bool(point["certified"])
    # minimum: the rates file's relative errors against the tolerance
    minimum = _section(data, "minimum")
    if bool(point["certified"]):
        with h5py.File(out / "minimum-rates.h5", "r") as f:
            errors = np.abs(f["rates"]["relative_error"][()])
        assert (minimum["verdict"] == HOLDS) == bool(np.nanmax(errors) <= RATE_TOLERANCE)
    else:
        assert minimum["verdict"] == NOT_ESTABLISHED
    assert _section(data, "chaos")["reason"] == "skipped (--skip chaos)"


def test_a_lost_accuracy_record_contradicts_the_energy_statement(report, tmp_path):
    out, _ = report
    traj = open_trajectory(out / "run.h5")
    analysis = read_analysis(traj)
    traj.attrs["accuracy"] = "lost at t = 3: identity defect 2.1 > run.identity_tol 0.5"
    assert energy_section(traj, analysis, tmp_path).verdict == CONTRADICTED
    traj.attrs.pop("accuracy")
    assert energy_section(traj, analysis, tmp_path).verdict == NOT_ESTABLISHED


def test_a_rerun_reuses_what_was_computed(report, capsys):
    out, _ = report
    before = {p.name: p.stat().st_mtime_ns for p in (out / "run.h5", out / "stationary.h5")}
    stages = json.loads((out / "stages.json").read_text(encoding="utf-8"))
    assert main(["report", str(out / "run.h5"), "-o", str(out), "--skip", "dirac,chaos", "--quiet"]) == 0
    # the trajectory given is the report's own copy: neither it nor the stationary result was recomputed
    assert {p.name: p.stat().st_mtime_ns for p in (out / "run.h5", out / "stationary.h5")} == before
    again = json.loads((out / "stages.json").read_text(encoding="utf-8"))
    assert again["stationary"]["wall_s"] == stages["stationary"]["wall_s"]
    # --max-k sizes the report: a k above it leaves the Dirac stage out, with the reason and the option
    assert main(["report", str(out / "run.h5"), "-o", str(out), "--skip", "chaos", "--max-k", "1", "--quiet"]) == 0
    dirac = _section(json.loads((out / "report.json").read_text(encoding="utf-8")), "dirac")
    assert dirac["verdict"] == NOT_ESTABLISHED and dirac["reason"].startswith("left out: k = 2 > --max-k 1")
    assert "dirac" not in json.loads((out / "stages.json").read_text(encoding="utf-8"))


def test_the_stationary_budget_gives_the_same_search_twice(report, tmp_path):
    """``--stationary-budget`` stops the search by a count of gradient equivalents, not by the clock: two reports
    of the same trajectory stop at the same iterate, with the same verdict, after the same work, just past the
    budget (a wall limit, or a budget left unused, fails this: the search would stop elsewhere or converge)."""
    out, _ = report
    budget = 3.0
    found = []
    for name in ("A", "B"):
        folder = tmp_path / name
        assert main(["report", str(out / "run.h5"), "-o", str(folder), "--skip", "minimum,dirac,chaos,gap",
                     "--stationary-budget", f"{budget:g}", "--quiet"]) == 0
        point = read_stationary(folder / "stationary.h5")
        stationary = _section(json.loads((folder / "report.json").read_text(encoding="utf-8")), "stationary")
        found.append((point, stationary))
    (a, section_a), (b, section_b) = found
    assert "stopped by the budget of 3 gradient equivalents" in a["message"]
    assert not a["converged"] and section_a["verdict"] == NOT_ESTABLISHED
    for key in ("verdict", "message", "iterations", "gradients", "products"):
        assert a[key] == b[key], key
    assert np.array_equal(a["omega"], b["omega"]) and a["energy"] == b["energy"]
    assert section_a["verdict"] == section_b["verdict"] and section_a["reason"] == section_b["reason"]
    # stopped at the first iterate past the budget (one L-BFGS iteration costs a few gradients here), and the
    # budget bounds the whole stage: no spectrum after it
    assert budget < a["gradients"] + a["jvp_gradients"] * a["products"] <= budget + 10
    assert a["certify_products"] == 0 and "spectrum not computed" in a["message"]


@pytest.mark.parametrize("argv, message", [
    (["report", "missing.toml", "-o", "R"], "no such file"),
    (["report", "{config}", "-o", "R", "--skip", "everything"], "--skip takes"),
    (["report", "{config}", "-o", "R", "--stationary-budget", "-1"], "--stationary-budget must be"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY, encoding="utf-8")
    argv = [a.replace("{config}", str(config)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
