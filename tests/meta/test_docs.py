"""The documentation builds with Sphinx, warnings as errors (docs/conf.py; no notebook is executed).

autodoc imports the public API, so a docstring that does not render, a page that links to a missing
object, or an API entry whose object was renamed fails here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sphinx_build_has_no_warnings(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", "-d", str(tmp_path / "doctrees"),
         str(ROOT / "docs"), str(tmp_path / "html")],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, f"sphinx-build -W failed:\n{result.stdout}\n{result.stderr}"
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    # autodoc really documented the public API (an import failure would leave the entries empty)
    for name in ("pdeflow.Problem.grad_phi", "pdeflow.open_trajectory", "pdeflow.load_config",
                 "pdeflow.solvers.make_stepper", "pdeflow.io.reference.compare", "pdeflow.io.reference.validate",
                 "pdeflow.analysis.diagnostics.optimality_gap"):
        assert f'id="{name}"' in api, f"{name} is missing from the API reference"
    model = (tmp_path / "html" / "model.html").read_text(encoding="utf-8")
    assert "First variation" in model
    # math renders offline: MathJax is loaded from the site's own _static folder, never from a CDN
    scripts = re.findall(r"<script[^>]*src=\"([^\"]*mathjax[^\"]*)\"", model, flags=re.I)
    assert scripts and all(not s.startswith(("http:", "https:", "//")) for s in scripts), scripts
    assert all((tmp_path / "html" / s).is_file() for s in scripts)
    # the gallery: every examples/plot_*.py ran and its figures are on its page
    examples = sorted((ROOT / "examples").glob("plot_*.py"))
    assert {e.stem for e in examples} >= {"plot_quickstart_theory", "plot_your_own_text", "plot_check_another_code",
                                          "plot_dirac_stability", "plot_propagation_of_chaos",
                                          "plot_wfr_against_wasserstein"}
    for script in examples:
        page = (tmp_path / "html" / "auto_examples" / f"{script.stem}.html").read_text(encoding="utf-8")
        images = re.findall(rf"_images/(sphx_glr_{script.stem}_\d+\.png)", page)
        assert images, f"{script.name} shows no figure"
        for name in images:
            assert (tmp_path / "html" / "_images" / name).stat().st_size > 5000, name
    assert (tmp_path / "html" / "your_own_problem.html").is_file()


def test_tutorial_code_runs_on_a_short_quickstart(tmp_path: Path) -> None:
    """Every Python block of docs/tutorial.md runs, in order, on a quickstart file (t_end shortened to 2)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "pdeflow", "run", str(ROOT / "data" / "configs" / "quickstart.toml"),
                          "-o", "quickstart.h5", "--set", "run.t_end=2", "--set", "run.frame_interval=1"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    text = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    (tmp_path / "data").symlink_to(ROOT / "data")  # the tutorial's paths are relative to a checkout
    script = tmp_path / "tutorial.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the recomputed energy and dissipation of the last frame equal the stored ones
    recomputed = [line.split() for line in lines if len(line.split()) == 2]
    assert len(recomputed) >= 2
    for a, b in recomputed[:2]:
        assert abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(b)))


def test_every_test_the_documents_cite_exists() -> None:
    """README.md and docs/*.md name the tests that assert their figures: each named test function and test file
    must exist, so a renamed or deleted test cannot leave a figure pointing at nothing."""
    defined = set()
    for path in [*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "studies" / "tests").rglob("test_*.py")]:
        defined.update(re.findall(r"^def (test_\w+)\(", path.read_text(encoding="utf-8"), flags=re.M))
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited, missing = 0, []
    for doc in documents:
        text = doc.read_text(encoding="utf-8")
        for name in re.findall(r"\b(test_\w+)\b(?!\.py)", text):
            cited += 1
            if name not in defined:
                missing.append(f"{doc.name}: {name}")
        for path in re.findall(r"(?<![\w/])((?:studies/)?tests/(?:\w+/)?\w+\.py)\b", text):
            if not (ROOT / path).is_file():
                missing.append(f"{doc.name}: {path}")
    assert cited >= 20
    assert not missing, missing
