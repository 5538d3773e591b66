"""``pdeflow report``'s stages cannot lie (issue 51, findings 2, 3, 8, 9), and a closed pipe loses no result.

- A stage is reused only when the hash of its inputs is unchanged: ``--set run.t_end=6`` runs the flow again and
  ``--set diagnostics.kl_window=0.25`` takes effect; a change re-runs the stages that read the changed one and
  reuses the others; the summary and the page say which stages were reused.
- A stage that fails is shown as failed with its message (page, report.json, summary) and the report exits 3.
- A relative ``task.path`` is read from the config's folder, and the commands that re-run a stored file's config
  (the report's Dirac and chaos stages, ``compare --order``'s tighter run) take the task's data from the file.
- Bad input leaves no folder and no file of the invocation.
- ``pdeflow stationary`` and ``pdeflow stability --stationary`` write their files whole when stdout closes early.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import pdeflow.analysis.stages.records as records
from pdeflow.analysis.report.pipeline import ANALYSIS_SECTIONS
from pdeflow.analysis.report.sections import CONTRADICTED, FAILED, HOLDS
from pdeflow.analysis.stationary.stationary import read_stationary
from pdeflow.core.config import loads_config
from pdeflow.core.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PIPE
from pdeflow.core.tasks import TaskData, enumerate_task, sample_data_set
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

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
eta_list = [0.1, 0.05]
static_draws = 8
"""
SKIP_SLOW = "minimum,dirac,chaos,gap"


def text_problem(folder: Path) -> Path:
    """``folder/text.toml`` and the text it names by a relative path."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    (folder / "text.txt").write_text("".join(rng.choice(list("abc"), 200)), encoding="utf-8")
    (folder / "text.toml").write_text(TEXT_CONFIG, encoding="utf-8")
    return folder / "text.toml"


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _section(out: Path, key: str) -> dict:
    return next(s for s in _json(out / "report.json")["sections"] if s["key"] == key)


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


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


# ---- finding 3: stages keyed by their inputs -----------------------------------------------------------------------

def test_a_changed_input_reruns_its_stage_and_the_stages_that_read_it(tiny, tmp_path, capsys):
    out = tmp_path / "R"
    base = ["report", str(tiny["config"]), "-o", str(out), "--skip", SKIP_SLOW, "--quiet"]
    assert main(base) == 0
    data = _json(out / "report.json")
    assert [s["title"] for s in data["sections"] if s["key"] in ANALYSIS_SECTIONS] == list(ANALYSIS_SECTIONS.values())
    capsys.readouterr()

    # the same inputs: every stage reused, no stage's file rewritten; the summary and the page say so
    before = {name: (out / name).stat().st_mtime_ns for name in ("run.h5", "stationary.h5")}
    assert main(base) == 0
    assert "reused from DIR (inputs unchanged): run, stationary, diagnose" in capsys.readouterr().out
    assert {name: (out / name).stat().st_mtime_ns for name in before} == before
    assert _json(out / "report.json")["provenance"]["reused"] == ["run", "stationary", "diagnose"]
    assert (out / "index.html").read_text(encoding="utf-8").count("(reused: inputs unchanged)") == 3

    # a wall limit that does not bind: the same search, run again, and diagnose with it (its command is the same:
    # it is re-run because it reads the search's file); the run is reused
    walls = {s: _json(out / "stages.json")[s]["wall_s"] for s in ("run", "stationary", "diagnose")}
    assert main([*base, "--stationary-wall", "100000"]) == 0
    again = _json(out / "stages.json")
    assert _json(out / "report.json")["provenance"]["reused"] == ["run"]
    assert again["run"]["wall_s"] == walls["run"]
    assert again["stationary"]["wall_s"] != walls["stationary"] and again["diagnose"]["wall_s"] != walls["diagnose"]
    assert read_stationary(out / "stationary.h5")["certified"]

    # another t_end and another KL window: the flow runs again to t = 6, the copied config and the analysis's
    # config carry kl_window = 0.25, and nothing is reused
    assert main([*base, "--set", "run.t_end=6", "--set", "diagnostics.kl_window=0.25"]) == 0
    traj = open_trajectory(out / "run.h5")
    assert float(traj.time[-1]) == pytest.approx(6.0)
    assert traj.config.diagnostics.kl_window == 0.25
    assert loads_config((out / "config.toml").read_text(encoding="utf-8")).diagnostics.kl_window == 0.25
    assert _json(out / "report.json")["provenance"]["reused"] == []


# ---- finding 2: failed stages, relative paths ----------------------------------------------------------------------

def test_a_failed_run_is_shown_failed_everywhere_and_the_report_exits_3(tiny, tmp_path, capsys):
    """An identity tolerance no step meets: ``pdeflow run`` stops at its first step with exit 3. Every statement reads
    the run, so each is 'failed' with the run's message on the page, in report.json and in the summary."""
    out = tmp_path / "R"
    code = main(["report", str(tiny["config"]), "-o", str(out), "--skip", SKIP_SLOW, "--quiet",
                 "--set", "run.identity_tol=1e-30"])
    printed = capsys.readouterr()
    assert code == EXIT_FAILED
    data = _json(out / "report.json")
    assert [s["verdict"] for s in data["sections"] if s["key"] in ANALYSIS_SECTIONS or s["key"] == "stationary"] \
        == [FAILED] * 4
    for s in data["sections"]:
        if s["verdict"] == FAILED:
            assert s["reason"].startswith("the run stage (pdeflow run ") and "failed (exit 3)" in s["reason"]
            assert "accuracy lost" in s["reason"]
            assert f"{s['title']}: failed - the run stage" in printed.out
        else:
            assert s["reason"].startswith("skipped (--skip")
    assert "skipped" not in " ".join(s["reason"] for s in data["sections"] if s["key"] in ANALYSIS_SECTIONS)
    assert "failed (exit 3)" in (out / "index.html").read_text(encoding="utf-8")
    assert "the run stage" in printed.err


def test_a_failed_later_stage_is_shown_failed_and_the_others_decide(tiny, tmp_path, capsys, monkeypatch):
    """The chaos stage ends with exit 3 (its process replaced by one that fails as ``pdeflow chaos`` does on a
    non-finite state): the chaos statement is 'failed' with that message, the stages before it are done, the
    report exits 3."""
    real = subprocess.run

    def failing_chaos(argv, **kwargs):
        if argv[3] == "chaos":
            return subprocess.CompletedProcess(argv, 3, "", "pdeflow: error: chaos: flow N=4: non-finite state\n")
        return real(argv, **kwargs)

    monkeypatch.setattr(records.subprocess, "run", failing_chaos)
    out = tmp_path / "R"
    code = main(["report", str(tiny["config"]), "-o", str(out), "--skip", "minimum,dirac,gap", "--quiet"])
    printed = capsys.readouterr().out
    assert code == EXIT_FAILED
    chaos = _section(out, "chaos")
    assert chaos["verdict"] == FAILED
    assert chaos["reason"].startswith("the chaos stage (pdeflow chaos ") and chaos["reason"].endswith(
        "failed (exit 3): pdeflow: error: chaos: flow N=4: non-finite state")
    assert f"Propagation of chaos: failed - {chaos['reason']}" in printed
    assert _section(out, "stationary")["verdict"] == HOLDS
    assert _json(out / "stages.json")["chaos"]["status"].startswith("failed (exit 3)")


def test_a_relative_text_path_reaches_the_dirac_and_chaos_stages(tmp_path, monkeypatch):
    """docs/your_own_problem.md's config shape (``task.path = "text.txt"`` beside it), reported from another folder:
    the run reads the text from the config's folder; the Dirac and chaos stages run on DIR/run.h5's stored problem
    (DIR holds no text.txt, and neither does the working directory): the Dirac statement is decided, and the chaos
    stage fits its slopes (on a ladder of 2 seeds, 3 rungs, whether they decide is not this test's question)."""
    config = text_problem(tmp_path / "problem")
    monkeypatch.chdir(tmp_path)
    out = Path("R")
    assert main(["report", "problem/text.toml", "-o", str(out), "--skip", "stationary,gap", "--quiet"]) == 0
    assert not (out / "text.txt").exists() and not Path("text.txt").exists()
    assert _section(out, "dirac")["verdict"] in (HOLDS, CONTRADICTED), _section(out, "dirac")["reason"]
    chaos = _section(out, "chaos")
    assert chaos["verdict"] != FAILED and "no slope" not in chaos["reason"], chaos["reason"]
    commands = {s: r["command"] for s, r in _json(out / "stages.json").items()}
    assert commands["dirac"].startswith(f"pdeflow stability {out / 'run.h5'} ")
    assert commands["chaos"].startswith(f"pdeflow chaos {out / 'run.h5'}") and "--quick" not in commands["chaos"]
    # the Dirac stage's problem is the run's, bit for bit
    with h5py.File(out / "run.h5", "r") as a, h5py.File(out / "stability.h5", "r") as b:
        for name in ("tokens", "targets", "mask", "weights"):
            assert np.array_equal(a["data"][name][()], b["data"][name][()])
    assert config.exists()


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


# ---- finding 8: bad input leaves nothing ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["stationary result", "missing config", "missing text", "set on a file"])
def test_bad_input_leaves_no_folder_and_no_file(tiny, tmp_path, monkeypatch, capsys, case):
    monkeypatch.chdir(tmp_path)
    text = text_problem(tmp_path / "problem")
    broken = tmp_path / "problem" / "broken.toml"
    broken.write_text(TEXT_CONFIG.replace('path = "text.txt"', 'path = "missing.txt"'), encoding="utf-8")
    argv, message = {
        "stationary result": (["report", str(tiny["minimum"]), "-o", "r-st"], str(tiny["minimum"])),
        "missing config": (["report", "missing.toml", "-o", "m-rep"], "missing.toml: no such file"),
        "missing text": (["report", str(broken), "-o", "deep/er/R"], "missing.txt' cannot be read"),
        "set on a file": (["stability", str(tiny["run"]), "--set", "task.seq_len=4", "-o", "x.h5"],
                          "[task], [model] cannot change"),
    }[case]
    before = _files(tmp_path)
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["problem"]
    assert _files(tmp_path) == before and text.exists()


def test_a_stage_that_refuses_its_input_removes_what_the_invocation_created(tiny, tmp_path, capsys, monkeypatch):
    """A stage found bad input (exit 2) after DIR was made: in a new folder, the folder goes (with the parent this
    invocation created); in an existing report's folder, only the files this invocation added go."""
    real = subprocess.run

    def refusing_diagnose(argv, **kwargs):
        if argv[3] == "diagnose":
            return subprocess.CompletedProcess(argv, 2, "", "pdeflow: error: the diagnose stage's refusal\n")
        return real(argv, **kwargs)

    out = tmp_path / "R"
    assert main(["report", str(tiny["config"]), "-o", str(out), "--skip", "stationary," + SKIP_SLOW, "--quiet"]) == 0
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    kept = _files(out)
    monkeypatch.setattr(records.subprocess, "run", refusing_diagnose)
    # the search now runs (stationary.h5 is new) and then diagnose refuses
    assert main(["report", str(tiny["config"]), "-o", str(out), "--skip", SKIP_SLOW, "--quiet"]) == EXIT_BAD_INPUT
    assert "the diagnose stage refused its input" in capsys.readouterr().err
    assert set(_files(out)) == set(kept) and not (out / "stationary.h5").exists()
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert "diagnose" in _json(out / "stages.json") and _json(out / "stages.json")["diagnose"]["status"] == "ok"
    fresh = tmp_path / "new" / "R"
    assert main(["report", str(tiny["config"]), "-o", str(fresh), "--skip", SKIP_SLOW, "--quiet"]) == EXIT_BAD_INPUT
    assert not (tmp_path / "new").exists()


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
