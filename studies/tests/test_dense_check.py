"""studies.minimum.dense_check, the independent check of a certificate, on the documentation's tiny problem: a
certified minimum found by ``pdeflow stationary`` has its dense lambda_min (LAPACK's eigensolver on the assembled
C, checked against exact products) inside the certificate's bracket and within 1e-6 of the file's estimate."""
from __future__ import annotations

import json
from pathlib import Path

from pdeflow.interface.cli import main as pdeflow
from studies.minimum.dense_check import main

TINY = Path(__file__).resolve().parents[2] / "data" / "configs" / "tiny.toml"


def test_the_dense_check_agrees_with_the_certificate_of_a_certified_minimum(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pdeflow(["run", str(TINY), "-o", "tiny.h5", "--quiet"]) == 0
    assert pdeflow(["stationary", "tiny.h5", "--kind", "minimum", "-o", "point.h5", "--quiet"]) == 0
    assert main(["point.h5", "--out", "."]) == 0
    res = json.loads(Path("dense_check.json").read_text())
    assert res["certified"] and res["dense_verdict"] == "minimum"
    assert res["product_check"] < 1e-12  # the assembly is S, against exact forward-mode products
    assert res["inside_bracket"] and res["relative_to_estimate"] < 1e-6 and res["relative_to_upper"] < 1e-6
    assert res["certificate_lower"] <= res["lambda_min"] <= res["certificate_upper"] + res["delta"]
