"""Self-describing results: the files of ``pdeflow stability`` and ``pdeflow chaos`` carry ``/model`` and ``/data``
exactly as trajectories do, so a recheck needs the file alone: rebuild the Problem from it and recompute a
stored number (an energy, an eigenvalue) to rounding."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import scipy.linalg

from pdeflow import Problem, loads_config
from pdeflow.analysis.dirac.stability import frozen_hessian
from pdeflow.interface.cli import main
from pdeflow.io.file_access import TrajectoryError
from pdeflow.io.problem_file import stored_problem
from pdeflow.io.trajectory import open_trajectory
from test_chaos import tiny_config, write_config
from test_stability import TINY

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def assert_same_problem_layout(result: str, trajectory: str) -> None:
    """The /model and /data groups hold the same datasets and attributes, with the same dtypes."""
    with h5py.File(result, "r") as f, h5py.File(trajectory, "r") as g:
        for group in ("model", "data"):
            assert sorted(f[group].keys()) == sorted(g[group].keys())
            assert sorted(f[group].attrs.keys()) == sorted(g[group].attrs.keys())
            for key in f[group]:
                assert f[group][key].dtype == g[group][key].dtype


def test_stability_file_alone_rebuilds_its_problem(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    out = tmp_path / "stab.h5"
    assert main(["stability", str(path), "-o", str(out), "--quiet", "--no-plots"]) == 0
    problem = stored_problem(out)
    original = Problem.from_config(loads_config(TINY))
    for key, value in original.arrays().items():
        stored = problem.arrays()[key]
        assert (stored is None) == (value is None)
        if value is not None:
            np.testing.assert_array_equal(stored, value)
    with h5py.File(out, "r") as f:
        points, energy, eigenvalues = (f["stability"][k][()] for k in ("points", "energy", "h0_eigenvalues"))
    assert len(points) >= 1
    for s, point in enumerate(points):
        # the energy of the Dirac at the point and the spectrum of its frozen Hessian, from the file alone
        assert problem.energy(point[None, :], np.ones(1)) == pytest.approx(energy[s], rel=1e-13, abs=1e-15)
        recomputed = scipy.linalg.eigvalsh(frozen_hessian(problem, point))
        np.testing.assert_allclose(recomputed, eigenvalues[s], rtol=0, atol=1e-11 * np.max(np.abs(eigenvalues[s])))
    # the layout is the trajectory's: a run of the same config writes the same groups
    traj = tmp_path / "run.h5"
    assert main(["run", str(path), "-o", str(traj), "--quiet", "--set", "run.t_end=0.02",
                 "--set", "run.frame_interval=0.01", "--set", "diagnostics.enabled=false"]) == 0
    assert_same_problem_layout(out, traj)
    assert open_trajectory(traj).problem().arrays().keys() == problem.arrays().keys()


def test_chaos_file_alone_rebuilds_its_problem(tmp_path):
    cfg = tiny_config()
    out = tmp_path / "chaos.h5"
    assert main(["chaos", str(write_config(tmp_path, cfg)), "-o", str(out), "--quiet"]) == 0
    problem = stored_problem(out)
    with h5py.File(out, "r") as f:
        stored_cfg = loads_config(f.attrs["config"])
        reference_energy = f["chaos/reference_energy"][()]
    # the reference measure at t = 0 from the stored config, its energy from the stored problem
    i = stored_cfg.init
    omega, mass = problem.initial_particles(stored_cfg.chaos.n_ref, i.seed, i.distribution, i.scale, i.mean)
    assert problem.energy(omega, mass) == pytest.approx(reference_energy[0], rel=1e-13)
    np.testing.assert_array_equal(problem.arrays()["tokens"], Problem.from_config(cfg).arrays()["tokens"])


def test_a_file_without_a_problem_is_one_line(tmp_path):
    path = tmp_path / "empty.h5"
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "pdeflow-chaos"
    with pytest.raises(TrajectoryError, match="no stored problem"):
        stored_problem(path)

