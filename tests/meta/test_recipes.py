"""docs/extending.md's recipes, each followed once end to end: a diagnostic (the measure's second moment and its rate
along the flow, checked by finite differences), a result file kind for it (written all or nothing, then checked by
``pdeflow validate`` and summarised by ``pdeflow info`` with no other code), and a report section showing it
(rendered as HTML, JSON, CSV and LaTeX by ``write_report``). A step of a recipe that stops working fails here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest

import pdeflow
from pdeflow.analysis.report.page import write_report
from pdeflow.analysis.report.sections import CONTRADICTED, HOLDS, Section
from pdeflow.interface.cli import main
from pdeflow.io import result_schema
from pdeflow.io.result_files import new_result_file
from pdeflow.io.result_schema import WRITTEN, ResultKind, _attrs, _data, _group

TINY = Path(__file__).resolve().parents[2] / "data" / "configs" / "tiny.toml"
RECIPES = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


@dataclass(frozen=True)
class SecondMoment:
    """``M2 = sum_i m_i |omega_i|^2`` and its rate along the flow ``dM2/dt = -2 sum_i m_i <omega_i, grad Phi_i>``
    (``d omega_i / dt = -grad Phi(omega_i; rho)``); both exact finite sums over the particles (``what``)."""
    value: float
    rate: float
    what: str = "exact: a finite sum over the particles"


def second_moment(problem: pdeflow.Problem, omega: np.ndarray, mass: np.ndarray) -> SecondMoment:
    """The recipe's step 1: arrays in (``omega`` [N, k], ``mass`` [N]), the Problem for grad Phi (counted there)."""
    g = problem.grad_phi(omega, omega, mass)
    return SecondMoment(float(mass @ np.sum(omega ** 2, axis=1)), float(-2.0 * mass @ np.sum(omega * g, axis=1)))


MOMENT = ResultKind("pdeflow-second-moment", 1, "tests/meta/test_recipes.py", "the second moment of rho", "/moment", (
    _group("/moment", WRITTEN, "the second moment and its rate"),
    *_attrs("/moment", "float", "value rate", "M2 and dM2/dt along the flow"),
    _data("/moment/omega", ("N", "k"), "float", WRITTEN, "the particles"),
    _data("/moment/mass", ("N",), "float", WRITTEN, "their masses"),
))


@pytest.fixture
def measure():
    cfg = pdeflow.load_config(TINY)
    problem = pdeflow.Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    return cfg, problem, omega, mass


def test_the_recipes_page_names_what_this_test_follows():
    text = RECIPES.read_text(encoding="utf-8")
    for heading in ("## Adding a diagnostic", "## Adding a result file kind", "## Adding a report section"):
        assert heading in text
    for name in ("ResultKind", "KINDS", "new_result_file", "Section", "VERDICTS", "write_report", "pipeline.py"):
        assert name in text, name


def central_difference(problem: pdeflow.Problem, omega: np.ndarray, mass: np.ndarray, h: float = 1e-5) -> float:
    """``(M2(omega - h grad Phi) - M2(omega + h grad Phi)) / (2 h)``: dM2/dt along the flow to O(h^2)."""
    g = problem.grad_phi(omega, omega, mass)
    return (second_moment(problem, omega - h * g, mass).value
            - second_moment(problem, omega + h * g, mass).value) / (2 * h)


def test_a_new_diagnostic_is_checked_against_finite_differences(measure):
    """The recipe's step 3: the rate against a central difference of M2 along -grad Phi (second order in h)."""
    _, problem, omega, mass = measure
    m = second_moment(problem, omega, mass)
    difference = central_difference(problem, omega, mass)
    assert m.rate == pytest.approx(difference, rel=1e-7)
    assert m.value == pytest.approx(float(np.sum(mass[:, None] * omega ** 2)), rel=1e-14)


def test_a_new_file_kind_is_validated_and_summarised_with_no_other_code(measure, tmp_path, monkeypatch, capsys):
    cfg, problem, omega, mass = measure
    monkeypatch.setattr(result_schema, "KINDS", (*result_schema.KINDS, MOMENT))
    m = second_moment(problem, omega, mass)
    path = tmp_path / "moment.h5"
    with new_result_file(path, MOMENT.schema, MOMENT.version, cfg, problem=problem) as f:
        g = f.create_group("moment")
        g.attrs["value"], g.attrs["rate"] = m.value, m.rate
        g["omega"], g["mass"] = omega, mass
    assert main(["validate", str(path)]) == 0
    assert "valid pdeflow-second-moment file" in capsys.readouterr().out
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "the second moment of rho" in out and f"{m.value:.6g}" in out
    with h5py.File(path, "r+") as f:
        del f["moment"].attrs["rate"]
    assert main(["validate", str(path)]) == 1
    assert "rate" in capsys.readouterr().out


def test_a_new_report_section_is_rendered_everywhere(measure, tmp_path):
    _, problem, omega, mass = measure
    m = second_moment(problem, omega, mass)
    measured = central_difference(problem, omega, mass)
    agrees = abs(measured - m.rate) <= 1e-6 * abs(m.rate)
    section = Section("moment", "The second moment's rate", "dM2/dt = -2 ∫ <ω, ∇Φ> dρ along the flow",
                      rows=[("M2", f"{m.value:.6g}", m.what), ("dM2/dt", f"{m.rate:.6g}", m.what),
                            ("central difference", f"{measured:.6g}", "measured, h = 1e-5")],
                      verdict=HOLDS if agrees else CONTRADICTED, reason="the rate agrees with the difference",
                      source="tests/meta/test_recipes.py")
    (tmp_path / "figures").mkdir()
    written = write_report(tmp_path, "recipe", [section], {"target": "tiny.toml"})
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "The second moment&#x27;s rate" in page or "The second moment's rate" in page
    assert json.loads((tmp_path / "report.json").read_text())["sections"][0]["verdict"] == HOLDS
    assert (tmp_path / "tables" / "moment.csv").read_text(encoding="utf-8").count("\n") == 4
    assert (tmp_path / "tables" / "moment.tex") in written
