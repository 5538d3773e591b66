"""The rates the theory predicts at a local minimum of the particle energy, checked by simulation.

At a stationary measure ``(omega*, m)`` that is a strict local minimum (``M = diag(m)``), the flow is, to first
order, ``dv/dt = -S v`` in mass-weighted coordinates ``v = M^(1/2) (omega - omega*)``, with
``S = M^(1/2) (M^-1 Hess E) M^(-1/2)`` off the symmetry directions (:mod:`pdeflow.analysis.spectrum`). Along the slowest
eigenvector, ``v = eps e^(-lambda_min t) u``: ``|v|`` decays at ``lambda_min``, ``E - E* = lambda_min |v|^2 / 2`` at
``2 lambda_min``, and the PL ratio ``I / (2 (E - E*))`` equals ``lambda_min``; from any other direction these are the
late-time rates and ``I / (2 (E - E*)) >= lambda_min`` throughout (docs/model.md, "Rates at a local minimum").
:func:`minimum_rates` perturbs the polished point along the slowest direction and random ones, integrates the
flow through the shared time loop (:func:`pdeflow.analysis.stability.simulate`) and fits the rates
(:func:`pdeflow.analysis.stability.fit_rate`): ``pdeflow stability --stationary RESULT``
(:mod:`pdeflow.interface.cli_stability`), the Dirac check of :mod:`pdeflow.analysis.stability` generalised to any
stationary measure.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse.linalg

from ..core.config import Config, ConfigError
from ..core.problem import Problem
from ..solvers.base import Stepper
from .spectrum import SpectrumEnds, hessian_operator, spectrum_ends, symmetry_basis
from .stability import FIT_SKIP, LOG_CHANGE, MIN_STEPS, SAMPLES, _strings, fit_rate, simulate

Progress = Callable[[str], None]


SLOWEST = "slowest"
RANDOM_LOG_CHANGE = 1.5 * LOG_CHANGE   # random directions run longer: the faster modes decay first
RANDOM_FIT_SKIP = 0.5                  # ... and only the second half is fitted
# RK4 step 1 / lambda_max: inside its stability bound (2.785 / lambda_max), the fast modes damped (R(-1) = 0.375 vs
# e^-1 = 0.368), the slow ones measured with a relative rate error ~ (lambda_min dt)^4 / 120
STEPS_PER_FASTEST_AT_MINIMUM = 1.0
EXCESS_FLOOR = 1e-12                   # E - E* fitted only above this times max(1, |E*|): ~5,000 roundings of E
POLISH_STEPS = 8                       # Newton steps that polish the stationary point before it is perturbed


@dataclass
class MinimumRun:
    """One perturbation of the minimum: its ``direction`` (``slowest`` or ``random j``), the samples ``times``,
    ``excess`` (``E - E*``), ``distance`` (``|P (M^(1/2) (omega - omega*))|``, P the projection off the symmetry
    directions) and ``pl_ratio`` ``I / (2 (E - E*))`` [F]; the fitted decay rates ``energy_rate`` and
    ``distance_rate`` (positive: decay), ``pl_ratio_min`` over the fitted window and ``pl_ratio_end`` (its last
    trusted sample); the fit
    window's start ``fit_from`` and the stepper's ``dt``."""
    direction: str
    times: np.ndarray
    excess: np.ndarray
    distance: np.ndarray
    pl_ratio: np.ndarray
    energy_rate: float
    distance_rate: float
    pl_ratio_min: float
    pl_ratio_end: float
    fit_from: float
    dt: float

    def errors(self, lambda_min: float) -> np.ndarray:
        """Relative errors against the predictions: energy rate vs 2 lambda_min, distance rate vs lambda_min,
        the PL ratio's least value vs lambda_min (its lower bound, reached in the linear regime) [3]."""
        return np.array([self.energy_rate / (2.0 * lambda_min) - 1.0, self.distance_rate / lambda_min - 1.0,
                         self.pl_ratio_min / lambda_min - 1.0])


@dataclass
class MinimumRates:
    """The rate check at a stationary measure: its energy ``e_star`` after polishing, the dissipation ``i_star`` there,
    the spectrum ends of S (``lambda_min`` and its ``lambda_min_residual``, ``lambda_max``, ``morse_index_lower``,
    ``n_symmetry``), the perturbation size ``eps``, the runs (the slowest direction first) and the cost in JVPs."""
    e_star: float
    i_star: float
    lambda_min: float
    lambda_min_residual: float
    lambda_max: float
    morse_index_lower: int
    n_symmetry: int
    eps: float
    runs: list[MinimumRun]
    products: int
    polish_steps: int

    @property
    def worst_error(self) -> float:
        """The largest relative error of any rate of any run (nan when no run)."""
        errs = [np.max(np.abs(r.errors(self.lambda_min))) for r in self.runs]
        return float(max(errs)) if errs else math.nan


def polish_stationary(problem: Problem, omega: np.ndarray, mass: np.ndarray, basis: np.ndarray,
                      steps: int = POLISH_STEPS, rtol: float = 1e-12) -> tuple[np.ndarray, int, int]:
    """Newton steps ``v <- v - S^+ g`` in mass-weighted coordinates (``g = M^(1/2) grad Phi``, MINRES on S with the
    symmetry directions ``basis`` [N k, r] projected out) until ``|g|`` stops decreasing: a stationary point found
    to ``I <= 1e-12 I(0)`` moves by ``|g| / lambda_min``, which perturbations of size eps would otherwise see.
    Returns the point [N, k], the Newton steps taken and the JVPs spent."""
    root = np.sqrt(mass)[:, None]
    omega = np.array(omega, dtype=float)
    products, taken = 0, 0
    g = (root * problem.grad_phi(omega, omega, mass)).ravel()
    g -= basis @ (basis.T @ g)
    for _ in range(steps):
        op = hessian_operator(problem, omega, mass, symmetry=basis)
        y = scipy.sparse.linalg.minres(op, -g, rtol=rtol, maxiter=20 * g.size)[0]
        products += op.products
        trial = omega + y.reshape(omega.shape) / root
        g_new = (root * problem.grad_phi(trial, trial, mass)).ravel()
        g_new -= basis @ (basis.T @ g_new)
        if not np.linalg.norm(g_new) < np.linalg.norm(g):
            break
        omega, g, taken = trial, g_new, taken + 1
    return omega, taken, products


def off_symmetry_lowest(ends: SpectrumEnds, basis: np.ndarray,
                        leak: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The lowest converged Ritz values [a], residuals [a] and vectors [N k, a] of ``ends`` whose vectors lie off the
    symmetry directions (``|Q^T x| < leak``, ``Q = basis`` [N k, r]), and how many were dropped. When a Krylov space
    becomes invariant before its last step (small problems), the rounding-level vector that continues it is not
    projected, and ``Pi S Pi`` is zero on its symmetry part: a spurious Ritz value 0 whose vector lies in span Q."""
    x = np.asarray(ends.lowest_vectors, dtype=float)
    on_symmetry = np.linalg.norm(basis.T @ x, axis=0) >= leak if basis.shape[1] else np.zeros(x.shape[1], bool)
    keep = ~on_symmetry
    return ends.lowest[keep], ends.lowest_residual[keep], x[:, keep], int(np.sum(on_symmetry))


def minimum_rates(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, eps: float, n_random: int, seed: int,
                  dt: float = 0.0, stepper: Stepper | None = None, progress: Progress | None = None,
                  **ends) -> MinimumRates:
    """Perturb the stationary measure ``(omega [N, k], mass [N])`` by ``eps`` (mass-weighted norm) along the slowest
    eigenvector of S and ``n_random`` random directions (seeded, off the symmetry directions), integrate the flow
    (:func:`simulate`: RK4 with ``dt``, 0: ``STEPS_PER_FASTEST_AT_MINIMUM / lambda_max``, or ``stepper``) for
    ``LOG_CHANGE / lambda_min`` (random: ``RANDOM_LOG_CHANGE / lambda_min``) and fit the decay rates of
    ``E - E*`` and of the distance (:func:`fit_rate`; random: over the second half), beside the PL ratio.
    The point is first polished (:func:`polish_stationary`); ``ends`` go to
    :func:`pdeflow.analysis.spectrum.spectrum_ends`. ConfigError when the lowest eigenvalue is not certified positive
    (not a strict local minimum)."""
    say = progress or (lambda msg: None)
    mass = np.asarray(mass, dtype=float)
    basis = symmetry_basis(problem, omega, mass)
    omega, taken, products = polish_stationary(problem, omega, mass, basis)
    basis = symmetry_basis(problem, omega, mass)
    ev = problem.evaluate(omega, mass)
    e_star, i_star = float(ev.energy), float(ev.dissipation)
    ends_found = spectrum_ends(problem, omega, mass, **ends)
    products += ends_found.products
    lowest, residual, vectors, leaked = off_symmetry_lowest(ends_found, basis)
    if not len(lowest) or not lowest[0] - residual[0] > 0:
        low = f"{lowest[0]:+.4g}" if len(lowest) else "not converged"
        raise ConfigError(f"not a strict local minimum: the lowest eigenvalue of S off the symmetry directions is "
                          f"{low}; its rates are not those of a minimum")
    lam, lam_max = float(lowest[0]), float(ends_found.highest[-1])
    say(f"polished in {taken} Newton step(s): E* = {e_star:.12g}, I = {i_star:.3e}; lambda_min = {lam:.6g} "
        f"(residual {residual[0]:.1e}), lambda_max = {lam_max:.6g}, {basis.shape[1]} symmetry directions"
        + (f" ({leaked} Ritz value(s) on them dropped)" if leaked else ""))
    root = np.sqrt(mass)[:, None]
    rng = np.random.default_rng(seed)
    directions = [(SLOWEST, vectors[:, 0])]
    for j in range(n_random):
        d = rng.standard_normal(omega.size)
        directions.append((f"random {j + 1}", d - basis @ (basis.T @ d)))
    if dt <= 0:
        dt = STEPS_PER_FASTEST_AT_MINIMUM / lam_max
    runs = []
    for name, d in directions:
        d = d / np.linalg.norm(d)
        duration = (LOG_CHANGE if name == SLOWEST else RANDOM_LOG_CHANGE) / lam
        skip = FIT_SKIP if name == SLOWEST else RANDOM_FIT_SKIP
        times = np.linspace(0.0, duration, SAMPLES)
        path = simulate(problem, omega + eps * d.reshape(omega.shape) / root, mass, times,
                        min(dt, duration / MIN_STEPS), stepper)
        runs.append(_minimum_run(problem, name, path, mass, omega, basis, e_star, times, skip, dt))
        r = runs[-1]
        say(f"{name}: E - E* decays at {r.energy_rate:.6g} (2 lambda_min = {2 * lam:.6g}), distance at "
            f"{r.distance_rate:.6g} (lambda_min = {lam:.6g}), PL ratio >= {r.pl_ratio_min:.6g}")
    return MinimumRates(e_star=e_star, i_star=i_star, lambda_min=lam,
                        lambda_min_residual=float(residual[0]), lambda_max=lam_max,
                        morse_index_lower=int(np.sum(lowest + residual < 0)), n_symmetry=int(basis.shape[1]),
                        eps=float(eps), runs=runs, products=int(products), polish_steps=taken)


def _minimum_run(problem: Problem, name: str, path: np.ndarray, mass: np.ndarray, omega: np.ndarray,
                 basis: np.ndarray, e_star: float, times: np.ndarray, skip: float, dt: float) -> MinimumRun:
    """The excess energy, distance and PL ratio along one simulated path [F, N, k], and their fits: the distance
    over the last ``1 - skip`` of the run, E - E* and the PL ratio there too but only while ``E - E*`` is above
    :data:`EXCESS_FLOOR` ``max(1, |E*|)`` (below it the energy's rounding would be fitted)."""
    root = np.sqrt(mass)[:, None]
    excess, distance, pl = (np.full(len(times), np.nan) for _ in range(3))
    for f, w in enumerate(path):
        if not np.all(np.isfinite(w)):
            break
        ev = problem.evaluate(w, mass)
        v = (root * (w - omega)).ravel()
        excess[f] = ev.energy - e_star
        distance[f] = np.linalg.norm(v - basis @ (basis.T @ v))
        pl[f] = ev.dissipation / (2.0 * excess[f]) if excess[f] > 0 else np.nan
    window = times >= times[0] + skip * (times[-1] - times[0])
    distance_rate = fit_rate(times[window], distance[window], 0.0)[0] if window.sum() >= 2 else math.nan
    trusted = window & (excess > EXCESS_FLOOR * max(1.0, abs(e_star)))
    energy_rate = fit_rate(times[trusted], excess[trusted], 0.0)[0] if trusted.sum() >= 2 else math.nan
    return MinimumRun(direction=name, times=times, excess=excess, distance=distance, pl_ratio=pl,
                      energy_rate=-energy_rate, distance_rate=-distance_rate,
                      pl_ratio_min=float(np.min(pl[trusted])) if trusted.any() else math.nan,
                      pl_ratio_end=float(pl[trusted][-1]) if trusted.any() else math.nan,
                      fit_from=float(times[window][0]), dt=float(dt))


SCHEMA_MINIMUM = "pdeflow-minimum-rates"


def write_minimum_rates(path: str | Path, result: MinimumRates, cfg: Config, problem: Problem,
                        source: str = "") -> None:
    """Write ``/rates`` (one result file, all or nothing, with ``/model`` and ``/data``): attributes ``e_star``,
    ``i_star``, ``lambda_min``, ``lambda_min_residual``, ``lambda_max``, ``morse_index_lower``, ``n_symmetry``,
    ``eps``, ``products``, ``polish_steps``, ``source`` (the stationary result); datasets over runs [R]:
    ``direction`` (str), ``energy_rate``, ``distance_rate``, ``pl_ratio_min``, ``pl_ratio_end``,
    ``predicted_energy_rate`` (2 lambda_min), ``predicted_distance_rate`` (lambda_min), ``relative_error`` [R, 3]
    (energy, distance, PL ratio); ``runs/r<j>``: ``times``, ``excess``, ``distance``, ``pl_ratio`` [F]."""
    from ..io.result_files import new_result_file

    with new_result_file(path, SCHEMA_MINIMUM, 1, cfg, problem=problem) as f:
        g = f.create_group("rates")
        for key in ("e_star", "i_star", "lambda_min", "lambda_min_residual", "lambda_max", "morse_index_lower",
                    "n_symmetry", "eps", "products", "polish_steps"):
            g.attrs[key] = getattr(result, key)
        g.attrs["source"] = source
        runs = result.runs
        g["direction"] = _strings([r.direction for r in runs])
        for key in ("energy_rate", "distance_rate", "pl_ratio_min", "pl_ratio_end"):
            g[key] = np.array([getattr(r, key) for r in runs], dtype=float)
        g["predicted_energy_rate"] = np.full(len(runs), 2.0 * result.lambda_min)
        g["predicted_distance_rate"] = np.full(len(runs), result.lambda_min)
        g["relative_error"] = np.array([r.errors(result.lambda_min) for r in runs]).reshape(len(runs), 3)
        rg = g.create_group("runs")
        for j, r in enumerate(runs):
            sg = rg.create_group(f"r{j}")
            sg["times"], sg["excess"], sg["distance"], sg["pl_ratio"] = r.times, r.excess, r.distance, r.pl_ratio
            sg.attrs["direction"], sg.attrs["dt"], sg.attrs["fit_from"] = r.direction, r.dt, r.fit_from
