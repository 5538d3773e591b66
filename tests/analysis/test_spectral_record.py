"""The spectral record of a run (:mod:`pdeflow.analysis.convergence.spectral`, ``diagnose`` and ``plot``): the ends of
the spectrum of S at analysed frames against a dense eigendecomposition of S built from central differences of grad Phi
(not from the JVP the record uses), with the symmetry directions of every head removed; the phase rule on
constructed values; the stored record read back; the command's report and figure."""
from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
from pdeflow.solvers.driver import run

from conftest import build_config
from pdeflow.analysis import diagnostics as D
from pdeflow.analysis.convergence.spectral import (
    DEGENERATE,
    DESCENT,
    MINIMUM,
    phase_of,
    phase_spans,
    run_gradient_equivalents,
    spectrum_frame_indices,
)
from pdeflow.analysis.dirac.stability import complement_spectrum
from pdeflow.analysis.hessian.local_geometry import symmetry_tangents
from pdeflow.analysis.plots.plotting import plot_spectrum
from pdeflow.core.problem import Problem
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def test_phase_rule_on_constructed_values():
    """descent above spectrum_near I(0) or with nothing converged; below it the index, then the sign of lambda_min
    beyond its residual decides."""
    assert phase_of(-0.1, 1e-9, 3, 1e-2, 1.0, 1e-4) == DESCENT
    assert phase_of(math.nan, math.nan, 0, 1e-9, 1.0, 1e-4) == DESCENT
    assert phase_of(-0.1, 1e-9, 3, 1e-5, 1.0, 1e-4) == "near a saddle of index >= 3"
    assert phase_of(0.02, 1e-3, 0, 1e-5, 1.0, 1e-4) == MINIMUM
    assert phase_of(1e-4, 1e-3, 0, 1e-5, 1.0, 1e-4) == DEGENERATE
    spans = phase_spans(np.array([0.0, 1.0, 2.0, 3.0]), [DESCENT, DESCENT, MINIMUM, DESCENT])
    assert spans == [(0.0, 1.0, DESCENT, 2), (2.0, 2.0, MINIMUM, 1), (3.0, 3.0, DESCENT, 1)]
    assert list(spectrum_frame_indices(10, 4)) == [0, 4, 8, 9]
    assert list(spectrum_frame_indices(9, 4)) == [0, 4, 8]
    assert spectrum_frame_indices(10, 0).size == 0
    # a file from before the cost columns: its products exact, at the one product cost (2.5 gradients)
    assert run_gradient_equivalents({"gradient_evals": np.array([np.nan, 2.0, 3.0]),
                                     "jvps": np.array([0, 1, 1.0])}) == 10.0
    assert math.isnan(run_gradient_equivalents({"rejected": np.zeros(3)}))
    # explicit Runge-Kutta: stages per attempted step (the first row is the initial state)
    assert run_gradient_equivalents({"time": np.arange(5.0), "rejected": np.array([0, 1, 0, 2, 0.0])}, stages=6) == 42


def dense_s(problem: Problem, omega: np.ndarray, mass: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """``S = M^(1/2) (M^-1 Hess E) M^(-1/2)`` [N k, N k] by central differences of grad Phi (the particles and the
    measure moved together), symmetrised."""
    N, k = omega.shape
    root = np.sqrt(mass)[:, None]
    S = np.empty((N * k, N * k))
    for j in range(N * k):
        u = np.zeros(N * k)
        u[j] = 1.0
        step = (u.reshape(N, k) / root) * h
        plus, minus = omega + step, omega - step
        S[:, j] = (root * (problem.grad_phi(plus, plus, mass) - problem.grad_phi(minus, minus, mass))).ravel() / (2 * h)
    return 0.5 * (S + S.T)


def head_symmetries(problem: Problem, omega: np.ndarray) -> np.ndarray:
    """Orthonormal [N k, r]: every head's own symmetry tangents
    (:func:`pdeflow.analysis.hessian.local_geometry.symmetry_tangents`)."""
    N, k = omega.shape
    blocks = []
    for i in range(N):
        t = symmetry_tangents(problem, omega[i])
        b = np.zeros((N * k, t.shape[1]))
        b[i * k:(i + 1) * k] = t
        blocks.append(b)
    return np.linalg.qr(np.concatenate(blocks, axis=1))[0] if blocks else np.zeros((N * k, 0))


@pytest.fixture(scope="module")
def record_run(tmp_path_factory, one_numba_thread):
    """A short run of 2 heads in full coordinates (k = 56, 2 symmetry directions per head), analysed with the
    spectrum at every 2nd frame and the last, all of them computed (spectrum_near above 1)."""
    cfg = build_config(init={"n_particles": 2, "scale": 1.0}, run={"t_end": 3.0, "frame_interval": 1.0},
                       diagnostics={"gap": False, "spectrum_every": 2, "spectrum_near": 10.0})
    path = tmp_path_factory.mktemp("spectral") / "run.h5"
    result = run(cfg, Problem.from_config(cfg), path, quiet=True)
    assert result.status == "finished", result.message
    D.analyse_run(path, cfg)
    traj = open_trajectory(path)
    return cfg, path, traj, D.read_analysis(traj)


def test_record_matches_a_dense_eigendecomposition(record_run):
    """At every analysed frame (0, 2 and the last, 3) lambda_min and lambda_max equal the ends of the dense spectrum
    of S off the heads' symmetry directions within their residual (+ the differences' error), the Morse index bound
    does not exceed the dense count of negative eigenvalues, and the symmetry count is 2 per head (O(2) on (WQ, WK)
    and on (WV, WO))."""
    cfg, path, traj, a = record_run
    rec = a.spectrum
    assert rec is not None and list(rec.spectrum_frame) == [0, 2, 3]
    assert np.allclose(rec.spectrum_time, traj.time[[0, 2, 3]])
    problem = traj.problem()
    for j, f in enumerate(rec.spectrum_frame):
        omega, mass = np.asarray(traj.frames["omega"][f]), np.asarray(traj.frames["mass"][f])
        sym = head_symmetries(problem, omega)
        assert rec.n_symmetry == sym.shape[1] == 2 * omega.shape[0]
        values = complement_spectrum(dense_s(problem, omega, mass), sym)[0]
        scale = float(np.max(np.abs(values)))
        assert abs(rec.lambda_min[j] - values[0]) <= rec.lambda_min_residual[j] + 1e-6 * scale
        assert abs(rec.lambda_max[j] - values[-1]) <= rec.lambda_max_residual[j] + 1e-6 * scale
        assert rec.lambda_min_residual[j] <= 1e-6 * scale
        assert 0 <= rec.morse_index_lower[j] <= int(np.sum(values < 0))
        assert rec.spectrum_products[j] > 0
    assert rec.run_grad_equivalents > 0 and rec.cost_fraction > 0


def test_record_is_stored_and_diagnose_prints_the_phases(record_run, capsys):
    """/analysis holds the per-analysed-frame datasets; diagnose prints the cost, the phases and the table."""
    cfg, path, traj, a = record_run
    with h5py.File(path, "r") as f:
        g = f["analysis"]
        for key in ("lambda_min", "lambda_min_residual", "lambda_max", "lambda_max_residual", "morse_index_lower",
                    "spectrum_time", "spectrum_frame", "spectrum_products", "spectrum_phase"):
            assert g[key].shape == (3,), key
        assert g.attrs["spectrum_every"] == 2 and g.attrs["jvp_cost"] > 2
        assert np.array_equal(g["lambda_min"][()], a.spectrum.lambda_min)
    assert main(["diagnose", str(path), "--no-gap", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "spectrum of S every 2 frame(s)" in out and "gradient equivalents" in out
    assert out.count("phase ") >= 1 and "lambda_min" in out
    # far from stationary points (I > spectrum_near I(0)) nothing is computed: descent, no products
    assert main(["diagnose", str(path), "--no-gap", "--no-write", "--set", "spectrum_near=1e-12"]) == 0
    out = capsys.readouterr().out
    assert "0 JVPs" in out and "descent (3 analysed frames)" in out
    # off: no record, nothing printed
    assert main(["diagnose", str(path), "--no-gap", "--no-write", "--set", "spectrum_every=0"]) == 0
    assert "spectrum of S" not in capsys.readouterr().out


def test_plot_draws_the_spectrum(record_run, tmp_path):
    cfg, path, traj, a = record_run
    out = plot_spectrum(traj, a, tmp_path / "spectrum.png")
    assert out.stat().st_size > 1000


def test_the_plot_draws_no_unresolved_value_as_lambda_min(record_run, tmp_path, monkeypatch):
    """Where a Ritz value below the lowest converged one did not converge (the converged one is then a higher
    eigenvalue, not lambda_min), the spectrum panel draws that frame's lowest Ritz value as an upper bound, apart,
    and leaves it out of the lambda_min line."""
    import dataclasses

    import matplotlib.figure

    cfg, path, traj, a = record_run
    rec = a.spectrum
    lo = rec.lambda_min.copy()
    j = int(np.flatnonzero(np.isfinite(lo))[-1])
    ritz = np.array(lo if rec.lowest_ritz is None else rec.lowest_ritz, dtype=float)
    ritz[j] = lo[j] - 0.5 * abs(lo[j]) - 1.0
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kw: figures.append(fig))
    plot_spectrum(traj, dataclasses.replace(a, spectrum=dataclasses.replace(rec, lowest_ritz=ritz)),
                  tmp_path / "spectrum.png")
    panel = figures[0].axes[2]
    drawn = {line.get_label(): (line.get_xdata(), line.get_ydata()) for line in panel.get_lines()}
    bound = drawn["lowest Ritz value (not converged: an upper bound)"]
    assert list(bound[0]) == [rec.spectrum_time[j]] and list(bound[1]) == [ritz[j]]
    assert ritz[j] not in set(np.concatenate([np.asarray(y, dtype=float) for _, y in drawn.values()
                                              if not np.array_equal(y, bound[1])] or [np.zeros(0)]))
    assert lo[j] not in set(np.concatenate([np.asarray(y, dtype=float) for _, y in drawn.values()]))
