"""The slowest rate at a minimum recomputed by simulation, independent of pdeflow's steppers and of its spectrum
(issue 52, finding 8: the shipped rates file's verdict was only re-read): at a small problem's minimum (2 heads,
lambda_min by central differences of grad Phi), the particle flow ``d omega / dt = -grad Phi(omega; rho)``
integrated by scipy's DOP853 from the minimum moved 1e-4 along its slowest eigenvector decays at lambda_min
(distance) and 2 lambda_min (E - E*); ``pdeflow stability --stationary``'s default engine measures the same rates
on the same problem."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate

from pdeflow import loads_config
from pdeflow.analysis.dirac.stability import fit_rate
from pdeflow.analysis.linearised.minimum_rates import SLOWEST, minimum_rates
from test_minimum_rates import PROBLEM, dense_reference, known_minimum  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("one_numba_thread")

EPS = 1e-4          # the perturbation's size, mass-weighted
LOG_CHANGE = 4.0    # the run lasts LOG_CHANGE / lambda_min
ACCURACY = 2e-3     # the relative error allowed: the nonlinearity's ~ D^3 E eps / lambda_min and the fit


def flow(problem, mass, omega0, times):
    """The particle flow from ``omega0`` [N, k] sampled at ``times`` [F] by DOP853 (rtol 1e-11): [F, N, k]."""
    shape = omega0.shape

    def velocity(_, y):
        omega = y.reshape(shape)
        return -problem.grad_phi(omega, omega, mass).ravel()

    sol = scipy.integrate.solve_ivp(velocity, (0.0, float(times[-1])), omega0.ravel(), method="DOP853",
                                    t_eval=times, rtol=1e-11, atol=1e-16)
    assert sol.success, sol.message
    return sol.y.T.reshape((len(times),) + shape)


def test_the_slowest_rate_at_a_minimum_by_an_independent_simulation(known_minimum):  # noqa: F811
    """From the minimum moved by 1e-4 along the slowest eigenvector of S (dense, central differences) the distance
    to the minimum decays at lambda_min and E - E* at 2 lambda_min, each to 2e-3, fitted over the last 3/4 of a run
    of 4 / lambda_min; pdeflow's own rate check (frozen engine) measures both within its 10 % tolerance of the
    same simulated rates."""
    problem, omega, mass, values = known_minimum
    lam = float(values[0])
    C, Q = dense_reference(problem, omega, mass)
    u = np.linalg.eigh(C + 10.0 * values[-1] * Q @ Q.T)[1][:, 0]   # the symmetry directions lifted out of the way
    root = np.sqrt(mass)[:, None]
    start = omega + EPS * u.reshape(omega.shape) / root
    times = np.linspace(0.0, LOG_CHANGE / lam, 81)
    path = flow(problem, mass, start, times)
    distance = np.linalg.norm((root * (path - omega)).reshape(len(times), -1), axis=1)
    e_star = problem.evaluate(omega, mass).energy
    excess = np.array([problem.evaluate(p, mass).energy for p in path]) - e_star
    window = times >= 0.25 * times[-1]
    distance_rate = -fit_rate(times[window], distance[window], 0.0)[0]
    energy_rate = -fit_rate(times[window], excess[window], 0.0)[0]
    assert distance[-1] == pytest.approx(EPS * np.exp(-LOG_CHANGE), rel=0.05)   # the premise: it decayed e^-4
    assert distance_rate == pytest.approx(lam, rel=ACCURACY)
    assert energy_rate == pytest.approx(2 * lam, rel=ACCURACY)
    result = minimum_rates(problem, omega, mass, eps=EPS, n_random=0, seed=0, linearity=False)
    slowest = result.runs[0]
    assert slowest.direction == SLOWEST and loads_config(PROBLEM)
    assert slowest.distance_rate == pytest.approx(distance_rate, rel=0.1)
    assert slowest.energy_rate == pytest.approx(energy_rate, rel=0.1)
