"""The analysis at the cost of its work: ``pdeflow run`` leaves the optimality gap (a certified search of min Phi that
cost ~94 % of a short run's wall time) to ``diagnose`` and ``report``, which compute it once: a stored gap whose inputs
(:func:`pdeflow.analysis.diagnostics.gap_inputs`) are unchanged is reused, any change of them recomputes it. The share
of the post-run analysis in ``pdeflow run`` is measured by studies/report/analysis_cost.py (ANALYSIS_COST.md)."""
from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from conftest import build_config
from pdeflow.analysis import diagnostics as D
from pdeflow.analysis.diagnostics import analysis as analysis_module
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

GAIN2 = {"model": {"coordinates": "gain2"}, "init": {"n_particles": 6}, "solver": {"method": "rk4", "dt": 0.1},
         "run": {"t_end": 1.0, "frame_interval": 0.25},
         "diagnostics": {"gap": True, "gap_frames": 2, "n_starts": 2, "grid_points": 8}}


@pytest.fixture
def searches(monkeypatch) -> list[int]:
    """The number of searches of min Phi (one per gap frame) since the fixture started."""
    calls: list[int] = []
    search = analysis_module.optimality_gap

    def counted(*args, **kwargs):
        calls.append(1)
        return search(*args, **kwargs)

    monkeypatch.setattr(analysis_module, "optimality_gap", counted)
    return calls


@pytest.fixture
def run_file(tmp_path, searches) -> str:
    config = tmp_path / "gain2.toml"
    config.write_text(build_config(**GAIN2).to_toml(), encoding="utf-8")
    out = tmp_path / "run.h5"
    assert main(["run", str(config), "-o", str(out), "--quiet"]) == 0
    return str(out)


def test_a_run_stores_its_analysis_without_searching_min_phi(run_file, searches):
    a = D.read_analysis(open_trajectory(run_file))
    assert a is not None and not searches, "the run searched min Phi"
    assert not a.gap_computed and np.all(np.isnan(a.gap)) and D.GAP_ON_REQUEST in a.notes
    assert np.isfinite(a.energy_identity_residual).all()       # the rest of the analysis is there


def test_diagnose_computes_the_gap_once_and_again_when_its_inputs_change(run_file, searches, capsys):
    assert main(["diagnose", run_file]) == 0
    assert len(searches) == 2                                  # diagnostics.gap = true: both gap frames
    first = D.read_analysis(open_trajectory(run_file))
    assert first.gap_computed and first.gap_certified[first.gap_frames].all() and len(first.gap_inputs) == 64
    capsys.readouterr()
    # the same inputs (with E* from elsewhere: the gap does not depend on it): reused, not searched again
    assert main(["diagnose", run_file, "--e-star", repr(float(first.energy[-1]) - 1e-3)]) == 0
    assert len(searches) == 2 and "the gap stored by the earlier analysis is reused" in capsys.readouterr().out
    again = D.read_analysis(open_trajectory(run_file))
    for name in D.analysis.GAP_ARRAYS:
        np.testing.assert_array_equal(getattr(again, name), getattr(first, name), err_msg=name)
    assert again.gap_inputs == first.gap_inputs and again.gap_radius == first.gap_radius
    # another search setting, or other frames: searched again
    assert main(["diagnose", run_file, "--set", "seed=1"]) == 0
    assert len(searches) == 4
    assert main(["diagnose", run_file, "--set", "seed=1", "--frames", "3"]) == 0
    assert len(searches) == 7


def test_the_gap_inputs_are_the_frames_searched_the_settings_and_the_problem(run_file, tmp_path):
    traj = open_trajectory(run_file)
    settings = traj.config.diagnostics
    frames = D.gap_frame_indices(len(traj.time), settings.gap_frames)
    digest = D.gap_inputs(traj, frames, settings)
    assert digest == D.gap_inputs(open_trajectory(run_file), frames, settings)
    assert digest != D.gap_inputs(traj, frames, traj.config.replace(diagnostics={"radius": 4.0}).diagnostics)

    def edited(path_name: str, edit) -> str:
        copy = tmp_path / path_name
        shutil.copy(run_file, copy)
        with h5py.File(copy, "r+") as f:
            edit(f)
        return D.gap_inputs(open_trajectory(copy), frames, settings)

    def nudge(f, name: str, index) -> None:
        value = f[name][index]
        f[name][index] = value + 1e-12 * (1 + np.abs(value))

    assert edited("searched.h5", lambda f: nudge(f, "frames/omega", int(frames[-1]))) != digest
    assert edited("mass.h5", lambda f: nudge(f, "frames/mass", int(frames[0]))) != digest
    assert edited("data.h5", lambda f: nudge(f, "model/unembedding", 0)) != digest
    # a frame where the gap is not searched is no input of it
    between = int(frames[0]) + 1
    assert between not in frames
    assert edited("between.h5", lambda f: nudge(f, "frames/omega", between)) == digest
