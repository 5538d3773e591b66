"""benchmarks/time_to_solution.py end to end at a toy size: every method at every mark, the long-run row, and a
table re-rendered from the saved JSON equal to the one written."""
from __future__ import annotations

import json
import math

from pdeflow.benchmarks.time_to_solution import MARKS, benchmark, gradient_equivalents, main, markdown


def test_benchmark_rows_and_render(tmp_path):
    res = benchmark(4, wall=2.0, log=lambda line: None)
    rows = {str(row["t"]): row for row in res["table"]}
    for mark in MARKS:
        row = rows[str(mark)]
        for method in ("rkc", "rosenbrock", "adaptive"):
            assert row[method]["measured"] and math.isfinite(row[method]["energy_error"])
            at = res[method]["at"][f"{mark:.6g}"]
            jac = "difference" if method != "adaptive" else ""
            assert row[method]["grad_equivalents"] == gradient_equivalents(at, method, res["costs"], jac)
    assert "jko" in rows["40.0"] and rows["40.0"]["jko"]["at_matched_accuracy"]["measured"] is False
    last = res["table"][-1]
    assert last["t"] in ("stationary", "reached") and last["adaptive"]["measured"] is False
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
