"""Outputs that exist (issue 51, findings 6, 7 and 11), on one report of the tiny problem (data/configs/tiny.toml's,
run in-process to t = 10; the report's stages: stationary, diagnose with the gap at one frame and the spectral record,
the rates at the minimum):

- every link of index.html (href and src) names a file that exists, and every figure is there as PDF and PNG (the
  page linked figures/minimum-rates-rates.pdf and stability-*.pdf, which were never written);
- the LaTeX tables are ASCII with math as LaTeX macros, and compile with pdflatex where it is installed (skipped
  otherwise: .ci/run installs texlive-latex-base);
- total_wall_s counts each stage once (it counted this invocation's stages twice: 607 s shown, 312 s measured);
- the rates at the minimum are labelled with what each predicts, E* with where it comes from, no cell shows NaN;
- every figure the report draws passes the layout check and has a title.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from pdeflow.analysis.plots.figures import layout_problems
from pdeflow.analysis.report.page import LATEX_MATH, latex_text, write_tables
from pdeflow.analysis.report.sections import Section
from pdeflow.interface.cli import main
from test_diagnostics import one_numba_thread  # noqa: F401 (autouse fixture)
from test_report_verdicts import NAN, tiny_run

# a report's worth of pdeflow commands in subprocesses: scheduled first (conftest.py)
pytestmark = pytest.mark.slow
REPORT = Path(__file__).resolve().parents[2] / "pdeflow" / "analysis" / "report"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """(folder, report.json, wall time of the command measured here, {figure file name: Figure drawn in-process})."""
    tmp = tmp_path_factory.mktemp("outputs")
    path, _ = tiny_run(tmp, t_end=10.0, minimum=False,
                       diagnostics={"enabled": False, "spectrum_every": 2, "spectrum_near": 10.0})
    drawn: dict[str, Figure] = {}
    original = Figure.savefig

    def capture(self, target, *args, **kwargs):
        drawn[Path(target).name] = self
        return original(self, target, *args, **kwargs)

    out = tmp / "R"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Figure, "savefig", capture)
        start = time.perf_counter()
        assert main(["report", str(path), "-o", str(out), "--skip", "dirac,chaos", "--gap-frames", "1",
                     "--quiet"]) == 0
        wall = time.perf_counter() - start
    return out, json.loads((out / "report.json").read_text(encoding="utf-8")), wall, drawn


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.links += [v for k, v in attrs if k in ("href", "src") and v]


def test_every_link_of_the_page_names_a_file_that_exists(report):
    out, data, _, _ = report
    parser = _Links()
    parser.feed((out / "index.html").read_text(encoding="utf-8"))
    files = [link for link in parser.links if not link.startswith("#")]
    assert {"figures/minimum-rates-rates.pdf", "figures/minimum-rates-rates.png", "figures/spectrum.pdf",
            "figures/gap.pdf", "tables/rates.tex"} <= set(files)
    assert [link for link in files if not (out / link).is_file()] == []
    for s in data["sections"]:
        for stem in s["figures"]:
            assert (out / "figures" / f"{stem}.pdf").read_bytes()[:4] == b"%PDF"
            assert (out / "figures" / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_total_wall_counts_each_stage_once(report):
    """total_wall_s of a fresh report is its own elapsed time (within the command's set-up outside the pipeline):
    each stage's wall once, plus the page."""
    out, data, wall, _ = report
    stages = sum(st["wall_s"] for st in data["provenance"]["stages"])
    total = data["provenance"]["total_wall_s"]
    assert stages <= total + 0.05 and total <= wall + 0.05, (stages, total, wall)


def test_the_report_states_what_each_number_is(report):
    """Finding 5 and 6 on the report's own files: each rate labelled 2 lambda_min or lambda_min is that number, E*
    from the certified point says so, and no cell of any table (page, CSV, LaTeX) shows NaN."""
    out, data, _, _ = report
    sections = {s["key"]: s for s in data["sections"]}
    minimum = {r["quantity"]: r["value"] for r in sections["minimum"]["table"]}
    lam = float(minimum["λ_min(S) at the point"].split()[0])
    runs = {q: v for q, v in minimum.items() if q.startswith("run ")}
    assert any("random" in q for q in runs) and any("slowest" in q for q in runs)
    for quantity, value in runs.items():
        labelled = re.findall(r"\(predicted (2λ_min|λ_min): ([0-9.e+-]+)\)", value)
        assert ("slowest" in quantity) == bool(labelled), (quantity, value)
        for label, number in labelled:
            assert float(number) == pytest.approx(2 * lam if label == "2λ_min" else lam, rel=2e-3), value
    rates = {r["quantity"]: r for r in sections["rates"]["table"]}
    assert rates["E*"]["what"] == "source: the energy of the certified local minimum"
    for s in data["sections"]:
        for row in s["table"]:
            assert not NAN.search(row["value"]), (s["key"], row)
    for table in (out / "tables").iterdir():
        assert not NAN.search(table.read_text(encoding="utf-8")), table.name


def test_every_figure_of_the_report_is_laid_out_with_a_title(report):
    out, data, _, drawn = report
    stems = {stem for s in data["sections"] for stem in s["figures"]}
    assert {"energy", "identity", "gap", "spectrum"} <= stems
    in_process = {name: fig for name, fig in drawn.items() if Path(name).stem in stems}
    assert {Path(name).stem for name in in_process} == stems - {"minimum-rates-rates"}   # drawn by the stage
    problems = {name: layout_problems(fig) for name, fig in in_process.items()}
    assert {name: p for name, p in problems.items() if p} == {}
    assert all(fig.get_suptitle() for fig in in_process.values())


def _compile(folder: Path, tables: list[Path]) -> subprocess.CompletedProcess:
    body = "\n".join(rf"\input{{{t.name}}}\par\bigskip" for t in tables)
    (folder / "doc.tex").write_text("\\documentclass{article}\n\\begin{document}\n" + body + "\n\\end{document}\n",
                                    encoding="ascii")
    return subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=folder,
                          capture_output=True, text=True, timeout=120)


def test_the_latex_tables_use_macros_and_compile(report, tmp_path):
    """Every table is ASCII (math as LaTeX macros), and with every character the sections write (each one found in
    the report's modules, and each of LATEX_MATH) a table compiles under pdflatex with no package beyond LaTeX's own
    and no missing character."""
    out, _, _, _ = report
    tables = sorted((out / "tables").glob("*.tex"))
    assert tables
    for table in tables:
        text = table.read_bytes().decode("ascii")
        assert r"\begin{tabular}" in text and not NAN.search(text)
    assert r"$\mu$" in (out / "tables" / "rates.tex").read_text() and r"$\le$" in (out / "tables" /
                                                                                      "optimality.tex").read_text()
    # every non-ASCII character of the report's modules, a combining accent with the letter it sits on (ρ̂)
    written = {m.group() for module in REPORT.glob("*.py")
               for m in re.finditer(r"[^\x00-\x7f][\u0300-\u036f]*", module.read_text(encoding="utf-8"))}
    every = "".join(sorted(written | set("".join(LATEX_MATH)))) + " λ_min ρ̂_N −0.5 a < b | c {x} 100% $5 #1 _ ^ ~ \\"
    assert not any(ord(ch) > 127 for ch in latex_text(every))
    # each character the report writes has its macro: none falls back to its Unicode name
    assert [ch for ch in written if latex_text(ch).startswith("[")] == []
    synthetic = write_tables(tmp_path, Section("every", "every character", "", rows=[("all", every, every)]))[1]
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (apt-get install texlive-latex-base)")
    for table in tables:
        shutil.copy(table, tmp_path / table.name)
    done = _compile(tmp_path, [tmp_path / t.name for t in tables] + [synthetic])
    log = (tmp_path / "doc.log").read_text(encoding="latin-1") if (tmp_path / "doc.log").exists() else done.stdout
    assert done.returncode == 0, log[-3000:]
    assert "Missing character" not in log and (tmp_path / "doc.pdf").stat().st_size > 1000


def test_a_rerun_states_the_reused_stages_walls_once(report):
    """Last (it rewrites the report's files): a rerun of the same report reuses every stage, and its total_wall_s is
    their recorded walls plus its own time outside them, not their sum twice."""
    out, data, wall, _ = report
    stages = {st["stage"]: st["wall_s"] for st in data["provenance"]["stages"]}
    start = time.perf_counter()
    assert main(["report", str(out / "run.h5"), "-o", str(out), "--skip", "dirac,chaos", "--gap-frames", "1",
                 "--quiet"]) == 0
    elapsed = time.perf_counter() - start
    again = json.loads((out / "report.json").read_text(encoding="utf-8"))["provenance"]
    assert {st["stage"]: st["wall_s"] for st in again["stages"]} == stages   # every stage reused
    assert sum(stages.values()) <= again["total_wall_s"] <= sum(stages.values()) + elapsed + 0.05
