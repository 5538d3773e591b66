"""A file exists only once it is whole (issue 52, finding 7): ``pdeflow run`` killed by SIGKILL at any instant of the
creation of its file leaves no file, or one the README's recipe for a file whose writer died reads
(``h5py.File(path, "r", swmr=True)``, ``checkpoint/active``, ``checkpoint/slot{active}/n_frames``) and ``--resume``
continues to the end. Before, a kill between the rename of the laid-out file and its first commit left a file whose
active slot was -1: the recipe failed with KeyError.

The runs are children of a fork server that imported pdeflow (no kernel ran in it: forking a process whose numba
threads run is not safe), so that a run costs its own work, not an interpreter's start."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow.interface.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "data" / "configs" / "tiny.toml"
SETTINGS = ["--quiet", "--set", "run.t_end=1", "--set", "run.frame_interval=0.1", "--set",
            "diagnostics.enabled=false"]
KILLS = 20


def _run(argv: list[str]) -> None:
    """In the child: ``pdeflow ARGV``; its exit code is the process's."""
    os._exit(main(argv))


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pdeflow.interface.cli", "pdeflow.solvers.driver"])
    return ctx


def recipe(path: Path) -> int:
    """The README's reading of a file whose writer died: the frames the active checkpoint commits."""
    with h5py.File(path, "r", swmr=True) as f:
        active = f["checkpoint/active"][()]
        return int(f[f"checkpoint/slot{active}/n_frames"][()])


def readable(path: Path) -> bool:
    try:
        return path.exists() and recipe(path) >= 1
    except (OSError, KeyError, ValueError):
        return False


def start(ctx, path: Path, *extra: str):
    child = ctx.Process(target=_run, args=(["run", str(TINY), "-o", str(path), *SETTINGS, *extra],))
    child.start()
    return child


def wait_for(condition, timeout: float = 120.0, pause: float = 1e-3) -> float:
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout
        time.sleep(pause)
    return time.monotonic()


def creation_window(ctx, folder: Path) -> float:
    """Seconds from the moment the ``.partial`` file appears to the moment the README's recipe reads the file, in an
    undisturbed run (the time the file is being laid out and its first checkpoint committed)."""
    path = folder / "measure.h5"
    partial = path.with_name(path.name + ".partial")
    child = start(ctx, path)
    t0 = wait_for(lambda: partial.exists() or path.exists())
    t1 = wait_for(lambda: readable(path))
    child.join()
    assert child.exitcode == 0
    return t1 - t0


def kill_at(ctx, path: Path, delay: float) -> str:
    """Start a run, SIGKILL it ``delay`` seconds after its ``.partial`` (or its file) appears; what it left: "no
    file", a "whole" file (read by the README's recipe and continued by --resume to the end), or a "finished" run
    (it ended first)."""
    partial = path.with_name(path.name + ".partial")
    child = start(ctx, path)
    wait_for(lambda: partial.exists() or path.exists())
    time.sleep(delay)
    try:
        os.kill(child.pid, signal.SIGKILL)
    except ProcessLookupError:      # it had finished
        pass
    child.join()
    if not path.exists():
        return "no file"
    assert recipe(path) >= 1, delay
    if child.exitcode != -signal.SIGKILL:
        return "finished"
    resumed = start(ctx, path, "--resume")
    resumed.join()
    assert resumed.exitcode == 0, delay
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == b"finished" and f["frames/time"][-1] == 1.0
    assert not partial.exists()
    return "whole"


@pytest.mark.slow
def test_a_kill_at_any_instant_of_the_file_creation_leaves_no_file_or_a_whole_resumable_one(tmp_path):
    ctx = _context()
    window = creation_window(ctx, tmp_path)
    # from the .partial's appearance to past the first commit; on a loaded machine a run may take longer than the
    # measured one, so later kills follow until one lands after the first commit
    delays = list(np.linspace(0.0, 1.25 * window, KILLS))
    outcomes = [kill_at(ctx, tmp_path / f"k{i}.h5", delay) for i, delay in enumerate(delays)]
    while "whole" not in outcomes and len(outcomes) < KILLS + 6:
        delays.append(1.5 * delays[-1])
        outcomes.append(kill_at(ctx, tmp_path / f"k{len(outcomes)}.h5", delays[-1]))
    assert "no file" in outcomes and "whole" in outcomes, (window, outcomes)
    print(f"creation window {window:.3f} s; outcomes {list(zip(np.round(delays, 3), outcomes))}")



def test_what_a_kill_before_the_first_commit_leaves_is_named_and_removed_by_the_next_run(tmp_path, capsys):
    ctx = _context()
    path = tmp_path / "k.h5"
    partial = path.with_name(path.name + ".partial")
    assert kill_at(ctx, path, 0.0) == "no file" and partial.exists()
    assert main(["run", str(TINY), "-o", str(path), *SETTINGS, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "does not exist (k.h5.partial is what a run killed before its first checkpoint left" in err
    again = start(ctx, path)
    again.join()
    assert again.exitcode == 0 and recipe(path) == 11 and not partial.exists()
