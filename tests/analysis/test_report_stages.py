"""A closed stdout loses no result, and a stored file's config is re-run on the file's problem (issue 51, findings 2
and 9).

- ``compare --order``'s tighter rerun of the reference takes the task's data from the reference file, not from a
  relative ``task.path`` that names nothing where it runs; fresh sequences drawn from a stored data set follow its
  weights.
- ``pdeflow stationary`` and ``pdeflow stability --stationary`` write their files whole when stdout closes early.
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
from pdeflow.core.tasks import TaskData, enumerate_task, sample_data_set
from pdeflow.interface.cli import main

# each test runs a few pdeflow commands in subprocesses (about 2 s each on an idle machine): scheduled first
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "data" / "configs" / "tiny.toml").read_text(encoding="utf-8")
# the tiny problem's model on the next character of a 200-character text over 'abc', its path relative to the
# config (docs/your_own_problem.md), every window of the text taken (exact); a small chaos ladder
TEXT_CONFIG = """
[task]
name = "text"
path = "text.txt"
seq_len = 3
exact = true

[model]
d = 7
head_dim = 2
weight_decay = 0.05
family_scale = 3.0
family_seed = 1
coordinates = "gain2"

[init]
n_particles = 6

[solver]
method = "rk4"
dt = 0.1

[run]
t_end = 5.0
frame_interval = 1.0

[chaos]
n_ref = 256
n_list = [4, 8, 16]
seeds = 2
"""


def text_problem(folder: Path) -> Path:
    """``folder/text.toml`` and the text it names by a relative path."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    (folder / "text.txt").write_text("".join(rng.choice(list("abc"), 200)), encoding="utf-8")
    (folder / "text.toml").write_text(TEXT_CONFIG, encoding="utf-8")
    return folder / "text.toml"


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


# ---- finding 2: a stored file's config re-run on the file's problem ------------------------------------------

def test_compare_order_reruns_the_reference_on_its_stored_problem(tmp_path, monkeypatch, capsys):
    """Three explicit-Euler runs and an RK4 reference of a text problem with a relative path, compared from a
    folder where that path names nothing: the reference's tighter rerun takes its problem from REF.h5 and the
    order is measured (old: 'task: path 'text.txt' cannot be read', exit 2)."""
    config = text_problem(tmp_path / "problem")
    short = ["--set", "run.t_end=0.2", "--set", "run.frame_interval=0.1", "--quiet"]
    runs = []
    for dt in (0.05, 0.025, 0.0125):
        runs.append(tmp_path / f"euler-{dt}.h5")
        assert main(["run", str(config), "-o", str(runs[-1]), "--set", "solver.method=euler",
                     "--set", f"solver.dt={dt}", "--set", "diagnostics.enabled=false", *short]) == 0
    ref = tmp_path / "ref.h5"
    assert main(["run", str(config), "-o", str(ref), "--set", "solver.dt=0.05",
                 "--set", "diagnostics.enabled=false", *short]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    code = main(["compare", "--order", *map(str, runs), str(ref), "--expect", "1"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "a pdeflow rerun of its config (dt 0.05 -> " in printed.out and "PASS" in printed.out


def test_sampling_a_stored_data_set_draws_its_weights(tmp_path):
    """Fresh sequences from a stored exact enumeration (what chaos draws for a text task re-run from a file) have the
    task's law: 200,000 draws from the markov task's 243 weighted sequences give frequencies within 4.5 standard
    errors of the weights (an unweighted draw, or one row off, fails), each draw weighing 1 / n."""
    data = enumerate_task("markov", vocab_size=3, seq_len=4, seed=0, concentration=0.7)
    n = 200_000
    drawn = sample_data_set(data, n_samples=n, seed=3)
    assert isinstance(drawn, TaskData) and np.allclose(drawn.weights, 1.0 / n)
    rows = np.concatenate([data.tokens, data.targets], axis=1)   # a sequence and its targets
    index = {row.tobytes(): b for b, row in enumerate(rows)}
    assert len(index) == len(rows)
    which = [index[row.tobytes()] for row in np.concatenate([drawn.tokens, drawn.targets], axis=1)]
    counts = np.bincount(which, minlength=len(rows))
    p = data.weights
    z = (counts / n - p) / np.sqrt(p * (1 - p) / n)
    assert np.max(np.abs(z)) < 4.5, np.max(np.abs(z))
    assert np.array_equal(drawn.mask, data.mask[which])


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
