"""The rates at a local minimum (:mod:`pdeflow.analysis.linearised.minimum_rates`, ``pdeflow stability
--stationary``): on a
problem whose minimum and spectrum are known independently (two heads of a tiny lookback problem, the minimum by L-BFGS
and dense Newton, lambda_min from a dense eigendecomposition of S built from central differences of grad Phi with the
symmetry directions removed), the flow's measured rates of E - E* (2 lambda_min), of the distance (lambda_min) and
the PL ratio (>= lambda_min) agree with the predictions within 5 %."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

from conftest import lookback_text
from pdeflow import Problem, loads_config
from pdeflow.analysis.dirac.stability import complement_spectrum, fit_rate
from pdeflow.analysis.hessian.spectrum import hessian_operator, symmetry_basis
from pdeflow.analysis.linearised.minimum_rates import PRODUCTS, SLOWEST, SLOWEST_HALF, linear_flow, minimum_rates
from pdeflow.analysis.stationary.stationary import minimum, write_stationary
from pdeflow.interface.cli import main
from test_spectral_record import dense_s, head_symmetries

# two heads of the lookback problem at weight decay 0.1: a strict local minimum with lambda_min ~ 0.008, the next
# eigenvalue ~ 2 lambda_min and lambda_max ~ 1.1 (RK4 with dt = 0.2 / lambda_max: a few thousand steps)
PROBLEM = lookback_text(model={"weight_decay": 0.1})
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


def dense_reference(problem, omega, mass):
    """``C = Pi S Pi`` [n, n] from central differences of grad Phi (:func:`dense_s`, independent of the exact JVP the
    code uses) with the symmetry directions projected, and its eigenvalues off them."""
    Q = head_symmetries(problem, omega)
    P = np.eye(Q.shape[0]) - Q @ Q.T
    return P @ dense_s(problem, omega, mass) @ P, Q


def expm_flow(C, v0, times):
    """``v(t) = expm(-C t) v0`` [F, n] by scipy's dense matrix exponential: the linearised flow's reference."""
    return np.stack([scipy.linalg.expm(-t * C) @ v0 for t in times])


def test_linear_flow_matches_the_dense_exponential(known_minimum):
    """The Krylov prediction of the linearised flow (:func:`linear_flow`) equals ``expm(-C t) v0`` from the dense C:
    distance, ``v^T C v / 2`` and ``|C v|^2``; its error bound holds, and is small once the space is large enough."""
    problem, omega, mass, values = known_minimum
    C, Q = dense_reference(problem, omega, mass)
    rng = np.random.default_rng(3)
    v0 = rng.standard_normal(C.shape[0])
    v0 -= Q @ (Q.T @ v0)
    v0 *= 1e-4 / np.linalg.norm(v0)
    times = np.linspace(0.0, 0.2 / values[0], 21)
    ref = expm_flow(C, v0, times)
    op = hessian_operator(problem, omega, mass, symmetry=Q)
    for dims, tol in ((6, None), (C.shape[0], 1e-6)):
        pred = linear_flow(op, v0, times, dims)
        assert pred.products <= dims
        distance = np.linalg.norm(ref, axis=1)
        # |v - v_m| <= bound, so the distances differ by at most the bound (plus the difference quotients' error)
        assert np.all(np.abs(pred.distance - distance) <= pred.error_bound + 1e-6 * distance)
        if tol is not None:
            assert np.max(pred.error_bound / distance) < tol
            np.testing.assert_allclose(pred.distance, distance, rtol=tol)
            np.testing.assert_allclose(pred.excess, 0.5 * np.einsum("fi,ij,fj->f", ref, C, ref), rtol=1e-5)
            np.testing.assert_allclose(pred.dissipation, np.sum((ref @ C) ** 2, axis=1), rtol=1e-5)


def test_rates_by_the_stiff_stepper_match_the_dense_references(known_minimum):
    """The short-window check with rkc: along the slowest direction (at eps and eps/2) E - E* decays at 2 lambda_min,
    the distance at lambda_min and the PL ratio equals lambda_min, each within 5 % of the dense lambda_min and the two
    sizes within 1 % of each other; along a random direction the measured rates equal those of ``expm(-C t) v0``
    fitted over the same window within 5 %, the prediction itself equals them to 1e-4, and ``I / (2 (E - E*)) >=
    lambda_min`` at every trusted sample. The gradient form of E - E* equals the difference where that is above
    rounding."""
    problem, omega, mass, values = known_minimum
    lam = float(values[0])
    eps = 1e-4
    # started 10 eps off the minimum along its slowest direction (u from the dense C, not from the code): the
    # point is polished back until sqrt(I) / lambda_min <= 1e-3 eps / 2, at the minimum's energy
    C, Q = dense_reference(problem, omega, mass)
    u = np.linalg.eigh(C + 10.0 * values[-1] * Q @ Q.T)[1][:, 0]
    start = omega + (10 * eps * u).reshape(omega.shape) / np.sqrt(mass)[:, None]
    result = minimum_rates(problem, start, mass, eps=eps, n_random=1, seed=0, method="rkc", engine=PRODUCTS)
    assert result.polish_steps >= 1 and result.offset_bound <= 1e-3 * eps / 2
    assert abs(result.e_star - problem.evaluate(omega, mass).energy) < 1e-15
    assert abs(result.lambda_min - lam) <= result.lambda_min_residual + 1e-6 * values[-1]
    assert [r.direction for r in result.runs] == [SLOWEST, SLOWEST_HALF, "random 1"]
    assert all(r.stepper == "rkc" and r.steps >= 20 and r.gradients > 0 for r in result.runs)
    assert result.gradients == sum(r.gradients for r in result.runs)
    assert abs(result.offset) < 1e-3 * eps        # the polished point is the minimum, on the scale of eps
    for r in result.runs[:2]:
        assert abs(r.energy_rate / (2 * lam) - 1) < TOLERANCE
        assert abs(r.distance_rate / lam - 1) < TOLERANCE
        assert abs(r.pl_ratio_min / lam - 1) < TOLERANCE
    full, half = result.runs[:2]
    assert abs(full.distance_rate / half.distance_rate - 1) < 0.01
    assert abs(full.energy_rate / half.energy_rate - 1) < 0.01
    # the random direction against the dense exponential, fitted over the same window
    rng = np.random.default_rng(0)
    d = rng.standard_normal(C.shape[0])
    d -= result_basis(problem, omega) @ (result_basis(problem, omega).T @ d)
    r = result.runs[2]
    ref = expm_flow(C, eps * d / np.linalg.norm(d), r.times)
    window = r.times >= r.fit_from
    distance = np.linalg.norm(ref, axis=1)
    excess = 0.5 * np.einsum("fi,ij,fj->f", ref, C, ref)
    pl = np.sum((ref @ C) ** 2, axis=1) / (2 * excess)
    for predicted, reference in ((r.predicted_distance_rate, -fit_rate(r.times[window], distance[window], 0.0)[0]),
                                 (r.predicted_energy_rate, -fit_rate(r.times[window], excess[window], 0.0)[0]),
                                 (r.predicted_pl_ratio_min, np.min(pl[window]))):
        assert abs(predicted / reference - 1) < 1e-4
    assert np.all(np.abs(r.errors()) < TOLERANCE)
    for r in result.runs:
        assert r.trusted.sum() >= 10 and r.pl_ratio_least >= (1 - 1e-3) * lam
    # the two forms of E - E*, third order apart: their relative difference falls at least like the size, to
    # the difference's rounding
    sizes, direct, gradient_form = result.excess_check.T
    assert np.all(direct > 1e-12) and np.all(np.diff(sizes) > 0)
    gap = np.abs(gradient_form / direct - 1)
    assert np.all(gap <= gap[-1] * sizes / sizes[-1] + 1e-5) and gap[0] < 1e-5


def result_basis(problem, omega):
    """The symmetry basis the rate check uses (the random directions are drawn off it)."""
    return symmetry_basis(problem, omega, None)


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
    assert "E - E* rate" in table and "slowest" in table and "engine: frozen; runs by ros2-w" in table
    with h5py.File(out, "r") as f:
        g = f["rates"]
        assert f.attrs["schema"] == "pdeflow-minimum-rates"
        assert abs(g.attrs["lambda_min"] / values[0] - 1) < 1e-6
        assert np.all(np.abs(g["relative_error"][()]) < TOLERANCE)
        assert g["runs/r0/times"].shape == g["runs/r0/excess"].shape
        assert g.attrs["engine"] == "frozen"
    for argv in (["stability", "cfg.toml", "--stationary", str(result), "-o", str(tmp_path / "x.h5")],
                 ["stability", "--stationary", str(result)],
                 ["stability", "--stationary", str(result), "-o", str(out)],          # exists, no --force
                 ["stability", "--stationary", str(result), "-o", str(tmp_path / "y.h5"), "--eps", "0"]):
        assert main(argv) == 2
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()


def test_the_shipped_rates_at_the_long_runs_minimum():
    """data/stationary/longtime-rates.h5 (studies/minimum/RATES_AT_MINIMUM.md), the rate check at the stationary
    point of data/configs/longtime.toml reached from t ~ 1 in under 10 minutes
    (data/stationary/longtime-minimum-from-t0.h5), re-derived from what the file's problem determines, not re-read
    (issue 52, finding 8; the point's certificate is re-derived by test_stationary.py, the slowest rate recomputed by
    simulation at a small minimum by test_slowest_rate_by_simulation.py): one gradient at the stored polished point
    gives E* and puts it within 1e-3 of the smallest perturbation of the minimum (``sqrt(I) / lambda``); one product
    gives lambda there, the Rayleigh quotient of the minimum file's lowest direction (an upper bound on lambda_min,
    within 1e-3 of the stored value); E* lies below the minimum file's energy by at most the PL bound ``I / (2
    lambda)``; each run's rates are refitted from its stored samples (the distance's reproduces the stored rate to
    1e-9), and every refitted rate of every direction (slowest at eps and eps/2, two random) is within 5 % of its
    prediction: 2 lambda and lambda along the slowest direction, the rates of the stored predicted curves, refitted
    the same way, along the random ones; the PL ratio's samples stay above lambda within the same 5 %."""
    from pathlib import Path

    from pdeflow.analysis.stationary.stationary import read_stationary
    from pdeflow.io.problem_file import stored_problem

    data = Path(__file__).resolve().parents[2] / "data" / "stationary"
    point = read_stationary(data / "longtime-minimum-from-t0.h5")
    problem = stored_problem(data / "longtime-rates.h5")
    with h5py.File(data / "longtime-rates.h5", "r") as f:
        g = f["rates"]
        assert g.attrs["source"].endswith("longtime-minimum-from-t0.h5")
        assert g.attrs["certificate"].startswith("none at the time")
        eps = float(g.attrs["eps"])
        omega, mass = g["omega_star"][()], g["mass"][()]
        ev = problem.evaluate(omega, mass)
        x = point["lowest_directions"][0].ravel()
        lam = float(x @ hessian_operator(problem, omega, mass).matvec(x)) / float(x @ x)
        assert lam == pytest.approx(float(g.attrs["lambda_min"]), rel=1e-3) and lam > 0
        assert abs(ev.energy - float(g.attrs["e_star"])) <= 1e-15
        assert np.sqrt(ev.dissipation) / lam <= 1e-3 * eps / 2
        assert 0.0 <= point["energy"] - ev.energy <= point["dissipation"] / (2 * lam) + 1e-15
        directions = [d.decode() if isinstance(d, bytes) else str(d) for d in g["direction"][()]]
        assert directions == [SLOWEST, SLOWEST_HALF, "random 1", "random 2"]
        for j, direction in enumerate(directions):
            r = g[f"runs/r{j}"]
            times, window = r["times"][()], r["times"][()] >= r.attrs["fit_from"]

            def refit(samples: str) -> float:
                return -fit_rate(times[window], r[samples][()][window], 0.0)[0]

            distance_rate, energy_rate = refit("distance"), refit("excess")
            assert distance_rate == pytest.approx(g["distance_rate"][j], rel=1e-9)
            if direction.startswith("slowest"):
                predicted = (lam, 2 * lam)
            else:
                predicted = (refit("predicted_distance"), refit("predicted_excess"))
            assert distance_rate == pytest.approx(predicted[0], rel=TOLERANCE), direction
            assert energy_rate == pytest.approx(predicted[1], rel=TOLERANCE), direction
            trusted = r["trusted"][()].astype(bool)
            assert trusted.sum() >= 10 and np.min(r["pl_ratio"][()][trusted]) >= (1 - TOLERANCE) * lam


def test_a_runs_gradients_are_its_counted_calls_through_the_one_formula():
    """A rate run's cost is the Problem's count of its calls by kind through the one gradient-equivalent formula,
    whatever the stepper: for RK4 the tableau's four evaluations per step (the count the check used to hard-code),
    for rkc the evaluations and difference products its steps' cost columns record (a rejected step's too)."""
    from pdeflow.solvers import make_stepper
    from pdeflow.solvers.loop import Observer

    from pdeflow.analysis.dirac.stability import simulate
    from pdeflow.analysis.linearised.minimum_rates import _StepCount, run_stepper
    from test_explicit import build

    cfg, problem = build()
    state = make_stepper(problem, cfg).initial_state()
    times = np.linspace(0.0, 1.0, 11)
    for method in ("rk4", "rkc"):
        stepper, dt, name = run_stepper(problem, method, 1.0, 10.0, len(times), 0.1)
        own = []

        class Own(Observer):
            def accept(self, step):
                own.append((step.old is not step.new, step.stepper_columns))
        counter = _StepCount(problem)
        simulate(problem, state.fields["omega"], state.fields["mass"], times, dt, stepper, [counter, Own()])
        counter.close()
        assert name == method and counter.steps == sum(taken for taken, _ in own) > 10
        own = [c for _, c in own]
        if method == "rk4":
            assert counter.gradients == 4 * counter.steps and counter.products == 0
        else:
            assert counter.products == sum(c.get("jvps", 0) for c in own) > 0
            assert counter.gradients == sum(c.get("gradient_evals", 0) + c.get("jvps", 0) for c in own)
