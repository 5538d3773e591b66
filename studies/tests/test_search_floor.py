"""studies.minimum.search_floor on the documentation's tiny problem: the per-operation walls are positive and the
certificate's parts, timed apart, bracket the same lambda_min as ``pdeflow stationary``'s certificate; a variant of
the route with the package's own threshold and hand-over reaches the command's minimum, and one with another
dead-head threshold leaves the package's threshold as it was."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import pdeflow.analysis.stationary.stationary as stationary
from pdeflow.analysis.stationary.stationary import read_stationary
from pdeflow.interface.cli import main as pdeflow
from studies.minimum.search_floor import main

TINY = Path(__file__).resolve().parents[2] / "data" / "configs" / "tiny.toml"


def test_search_floor_costs_and_variants(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pdeflow(["run", str(TINY), "-o", "tiny.h5", "--quiet"]) == 0
    assert pdeflow(["stationary", "tiny.h5", "--kind", "minimum", "-o", "point.h5", "--quiet"]) == 0
    point = read_stationary("point.h5")
    assert point["certified"]

    assert main(["costs", "point.h5", "--out", "."]) == 0
    costs = json.loads(Path("search_floor_costs.json").read_text())
    for key in ("gradient", "two_loop", "lbfgs_iteration", "gauss_newton_factor", "assembly", "cholesky_bound"):
        assert costs[key] > 0
    lower, upper = costs["lambda_min_bracket"]
    assert lower > 0 and upper == pytest.approx(point["lambda_min_upper"], rel=1e-6)
    assert costs["machine"]["cpu"]

    freeze = stationary.FREEZE
    assert main(["variant", "tiny.h5", "--out", "."]) == 0
    same = json.loads(Path(f"search_floor_variant_freeze{freeze:g}_handover0.json").read_text())
    assert same["verdict"] == point["verdict"] and same["energy"] == pytest.approx(point["energy"], abs=1e-12)
    assert main(["variant", "tiny.h5", "--freeze", "1e-3", "--out", "."]) == 0
    other = json.loads(Path("search_floor_variant_freeze0.001_handover0.json").read_text())
    assert other["freeze"] == 1e-3 and other["transcript"]
    assert stationary.FREEZE == freeze
