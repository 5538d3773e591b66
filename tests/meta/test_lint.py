"""ruff passes on the whole tree with the settings of pyproject.toml (line length 120, pycodestyle errors and
warnings, pyflakes, import order, pyupgrade). ruff is part of the ``test`` extra: a missing ruff fails here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"ruff check . failed:\n{result.stdout}\n{result.stderr}"
