"""studies/minimum/time_to_minimum.py end to end at a toy size (N = 4 heads and sequences, weight decay 0.1 so that the
minimum is near, the flow to t = 5): every step reported, the costs adding up, the report written."""
from __future__ import annotations

import json
import math

from studies.minimum.time_to_minimum import main


def test_time_to_minimum_smoke(tmp_path, one_numba_thread):
    assert main(["--n", "4", "--t-end", "5", "--max-iter", "200", "--set", "model.weight_decay=0.1",
                 "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "time_to_minimum.json").read_text())
    f, m = res["flow"], res["minimum"]
    assert f["status"] == "finished" and abs(f["t"] - 5.0) < 1e-9 and f["grad_equivalents"] > 0
    assert m["converged"] and m["dissipation_ratio"] <= 1e-12 and m["energy"] <= f["energy"]
    if m["certified"]:
        assert m["lambda_min"] - m["lambda_min_residual"] > 0 and m["verdict"] == "local minimum"
    assert res["certification"]["products"] > 0
    total = f["grad_equivalents"] + res["solve"]["grad_equivalents"] + res["certification"]["grad_equivalents"]
    assert math.isclose(res["total"]["grad_equivalents"], total, rel_tol=1e-12)
    same = res["flow_same_wall"]
    assert same["t"] >= f["t"] and same["grad_equivalents"] >= f["grad_equivalents"]
    text = (tmp_path / "time_to_minimum.md").read_text()
    assert "| certification (spectrum ends) |" in text and res["machine"]["cpu"]["model"] in text
    assert "load average" in text
