"""The rates at a local minimum (:mod:`pdeflow.analysis.minimum_rates`, ``pdeflow stability --stationary``): on a
problem whose minimum and spectrum are known independently (two heads of a tiny lookback problem, the minimum by L-BFGS
and dense Newton, lambda_min from a dense eigendecomposition of S built from central differences of grad Phi with the
symmetry directions removed), the flow's measured rates of E - E* (2 lambda_min), of the distance (lambda_min) and
the PL ratio (>= lambda_min) agree with the predictions within 5 %."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import scipy.optimize

from pdeflow import Problem, loads_config
from pdeflow.analysis.minimum_rates import SLOWEST, minimum_rates
from pdeflow.analysis.stability import complement_spectrum, symmetry_tangents
from pdeflow.analysis.stationary import minimum, write_stationary
from pdeflow.interface.cli import main
from test_spectral_record import dense_s, head_symmetries

# two heads of the lookback problem at weight decay 0.1: a strict local minimum with lambda_min ~ 0.008, the next
# eigenvalue ~ 2 lambda_min and lambda_max ~ 1.1 (RK4 with dt = 0.2 / lambda_max: a few thousand steps)
PROBLEM = """
[task]
name = "lookback"
vocab_size = 3
seq_len = 3
lag = 1
exact = true
[model]
d = 4
head_dim = 2
positions = "sinusoidal"
weight_decay = 0.1
"""
N_HEADS = 2
TOLERANCE = 0.05

pytestmark = pytest.mark.usefixtures("one_numba_thread")


@pytest.fixture(scope="module")
def known_minimum(one_numba_thread):
    """The minimum (L-BFGS on E from a seeded start, then Newton with the dense S to |grad| ~ 1e-15) and the dense
    spectrum of S off the 2 N symmetry directions there."""
    problem = Problem.from_config(loads_config(PROBLEM))
    k, mass = problem.k, np.full(N_HEADS, 1.0 / N_HEADS)
    root = np.sqrt(mass)[:, None]

    def energy(x):
        ev = problem.evaluate(x.reshape(N_HEADS, k), mass)
        return ev.energy, (mass[:, None] * ev.grad_phi).ravel()

    x0 = np.random.default_rng(1).standard_normal(N_HEADS * k)
    res = scipy.optimize.minimize(energy, x0, jac=True, method="L-BFGS-B",
                                  options={"maxiter": 20000, "gtol": 1e-11, "ftol": 1e-16})
    omega = res.x.reshape(N_HEADS, k)
    for _ in range(3):
        values, vectors = complement_spectrum(dense_s(problem, omega, mass), head_symmetries(problem, omega))
        g = (root * problem.grad_phi(omega, omega, mass)).ravel()
        omega = omega - (vectors @ ((vectors.T @ g) / values)).reshape(omega.shape) / root
    values = complement_spectrum(dense_s(problem, omega, mass), head_symmetries(problem, omega))[0]
    distinct = values[values > values[0] * (1 + 1e-6)]
    assert values[0] > 1e-3 and distinct[0] > 1.5 * values[0]     # strict, with a gap for the random directions
    return problem, omega, mass, values


def test_measured_rates_match_the_dense_spectrum(known_minimum):
    """Slowest direction and a random one: E - E* decays at 2 lambda_min, the distance at lambda_min and the PL
    ratio stays >= lambda_min, reaching it; each within 5 % of the dense lambda_min."""
    problem, omega, mass, values = known_minimum
    lam = float(values[0])
    result = minimum_rates(problem, omega, mass, eps=1e-2, n_random=1, seed=0)
    assert abs(result.lambda_min - lam) <= result.lambda_min_residual + 1e-6 * values[-1]
    assert abs(result.lambda_max - values[-1]) <= 1e-5 * values[-1]
    assert result.n_symmetry == sum(symmetry_tangents(problem, w).shape[1] for w in omega)
    assert result.morse_index_lower == 0
    assert [r.direction for r in result.runs] == [SLOWEST, "random 1"]
    for r in result.runs:
        assert abs(r.energy_rate / (2 * lam) - 1) < TOLERANCE, r.direction
        assert abs(r.distance_rate / lam - 1) < TOLERANCE, r.direction
        assert abs(r.pl_ratio_min / lam - 1) < TOLERANCE, r.direction
        assert np.nanmin(r.pl_ratio) >= (1 - TOLERANCE) * lam           # the PL bound along the whole run
    assert result.worst_error < TOLERANCE


def test_stability_command_on_a_stationary_result(known_minimum, tmp_path, capsys):
    """``pdeflow stability --stationary RESULT -o RATES``: the rates at a certified minimum written by
    ``pdeflow stationary``'s writer, one table, one file; bad input is one line and exit code 2."""
    problem, omega, mass, values = known_minimum
    cfg = loads_config(PROBLEM)
    point = minimum(problem, omega, mass, 1.0)
    assert point.certified
    result = tmp_path / "minimum.h5"
    write_stationary(result, point, cfg, problem, source="test", frame=0, time_of_frame=0.0, ratio=1e-12)
    out = tmp_path / "rates.h5"
    assert main(["stability", "--stationary", str(result), "-o", str(out), "--random", "0", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "E - E* rate" in table and "slowest" in table
    with h5py.File(out, "r") as f:
        g = f["rates"]
        assert f.attrs["schema"] == "pdeflow-minimum-rates"
        assert abs(g.attrs["lambda_min"] / values[0] - 1) < 1e-6
        assert np.all(np.abs(g["relative_error"][()]) < TOLERANCE)
        assert g["runs/r0/times"].shape == g["runs/r0/excess"].shape
    for argv in (["stability", "cfg.toml", "--stationary", str(result), "-o", str(tmp_path / "x.h5")],
                 ["stability", "--stationary", str(result)],
                 ["stability", "--stationary", str(result), "-o", str(out)],          # exists, no --force
                 ["stability", "--stationary", str(result), "-o", str(tmp_path / "y.h5"), "--eps", "0"]):
        assert main(argv) == 2
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()
