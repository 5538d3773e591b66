"""Every shipped config is valid: it loads, builds its Problem and its stepper, and one step is finite."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pdeflow.solvers import make_stepper

from pdeflow import Problem, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "data" / "configs").glob("*.toml"))


def test_the_main_job_and_one_config_per_task_ship():
    names = {p.stem for p in CONFIGS}
    assert {"quickstart", "markov", "lookback", "majority", "associative", "text"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds_and_steps(path):
    # small data and few heads: this checks validity and wiring, not the experiment itself
    cfg = load_config(path)
    small = {"n_particles": min(cfg.init.n_particles, 8)}
    cfg = cfg.replace(init=small, task={"n_samples": min(cfg.task.n_samples, 16)})
    problem = Problem.from_config(cfg)
    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    new, _ = stepper.step(state, min(cfg.solver.dt, cfg.run.t_end))
    assert new.t > state.t
    assert stepper.is_finite(new)
    assert np.isfinite(stepper.diagnostics(new)["energy"])
