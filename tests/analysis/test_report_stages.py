"""A closed stdout loses no result (issue 51, finding 9): ``pdeflow stationary`` and ``pdeflow stability --stationary``
write their files whole when the reader of their output is gone before they print (``| head``), and exit 141.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow.analysis.stationary.stationary import read_stationary
from pdeflow.core.exit_codes import EXIT_PIPE
from pdeflow.interface.cli import main

# each test runs a few pdeflow commands in subprocesses (about 2 s each on an idle machine): scheduled first
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "data" / "configs" / "tiny.toml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The tiny problem's run (no post-run analysis) and its certified minimum (pdeflow stationary)."""
    folder = tmp_path_factory.mktemp("tiny")
    config = folder / "tiny.toml"
    config.write_text(TINY, encoding="utf-8")
    files = {"config": config, "run": folder / "run.h5", "minimum": folder / "minimum.h5"}
    assert main(["run", str(config), "-o", str(files["run"]), "--quiet", "--set", "diagnostics.enabled=false"]) == 0
    assert main(["stationary", str(files["run"]), "--kind", "minimum", "-o", str(files["minimum"]), "--quiet"]) == 0
    assert read_stationary(files["minimum"])["certified"]
    return files


# ---- finding 9: a closed pipe loses no result ----------------------------------------------------------------------

def _with_stdout_closed(argv: list[str]) -> tuple[int, str]:
    """Run ``pdeflow argv`` with its stdout a pipe whose reader is gone before the command prints anything (as
    ``| head -0``): its exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "pdeflow", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=600), err


def test_a_closed_stdout_loses_no_stationary_point(tiny, tmp_path):
    out = tmp_path / "s3.h5"
    code, err = _with_stdout_closed(["stationary", str(tiny["run"]), "--kind", "minimum", "-o", str(out)])
    assert code == EXIT_PIPE and "Traceback" not in err, err
    point, reference = read_stationary(out), read_stationary(tiny["minimum"])
    assert point["certified"] and point["energy"] == reference["energy"]
    assert np.array_equal(point["omega"], reference["omega"])


def test_a_closed_stdout_loses_no_rates_at_the_minimum(tiny, tmp_path):
    out = tmp_path / "r.h5"
    code, err = _with_stdout_closed(["stability", "--stationary", str(tiny["minimum"]), "-o", str(out), "--no-plots"])
    assert code == EXIT_PIPE and "Traceback" not in err, err
    with h5py.File(out, "r") as f:
        assert f["rates"]["energy_rate"].shape[0] >= 1 and np.all(np.isfinite(f["rates"]["energy_rate"][()]))
