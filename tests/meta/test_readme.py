"""The README stays a front page: at most 250 lines (the detail lives in docs/), and its command 1 is the main job's
report, whose printed summary it quotes between markers (checked against a real report by
tests/analysis/test_main_job.py)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 250


def test_the_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_command_1_is_the_main_jobs_report_and_its_summary_is_quoted_once():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    command = next(line for line in text.splitlines() if line.startswith("    python3 -m venv"))
    assert command.rstrip().endswith("pdeflow report data/configs/quickstart.toml -o quickstart-report"), command
    assert text.count("<!-- report-summary:start -->") == 1 and text.count("<!-- report-summary:end -->") == 1
    assert (ROOT / "data" / "configs" / "quickstart.toml").is_file()
