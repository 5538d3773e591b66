"""The rates the theory predicts at a local minimum of the particle energy, checked by simulation.

At a stationary measure ``(omega*, m)`` that is a strict local minimum (``M = diag(m)``), the flow is, to first
order, ``dv/dt = -S v`` in mass-weighted coordinates ``v = M^(1/2) (omega - omega*)``, with
``S = M^(1/2) (M^-1 Hess E) M^(-1/2)`` off the symmetry directions (:mod:`pdeflow.analysis.hessian.spectrum`). Along
the slowest
eigenvector, ``v = eps e^(-lambda_min t) u``: ``|v|`` decays at ``lambda_min``, ``E - E* = lambda_min |v|^2 / 2`` at
``2 lambda_min``, and the PL ratio ``I / (2 (E - E*))`` equals ``lambda_min``; from any other direction these are the
late-time rates and ``I / (2 (E - E*)) >= lambda_min`` throughout (docs/model.md, "Rates at a local minimum").
:func:`minimum_rates` perturbs the polished point along the slowest direction and random ones, integrates the
flow through the shared time loop (:func:`pdeflow.analysis.dirac.stability.simulate`) and fits the rates
(:func:`pdeflow.analysis.dirac.stability.fit_rate`): ``pdeflow stability --stationary RESULT``
(:mod:`pdeflow.interface.cli_stability`), the Dirac check of :mod:`pdeflow.analysis.dirac.stability` generalised to any
stationary measure.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core.config import Config, ConfigError
from ...core.lanczos import krylov_ritz
from ...core.problem import Problem, gradient_equivalents
from ...io.result_schema import RATES
from ...solvers.base import State, Stepper
from ...solvers.loop import Observer, Step, Stop
from ..certificate.certificate import BY_LANCZOS, DENSE_LIMIT, Certificate, certify
from ..dirac.stability import MIN_STEPS, fit_rate, simulate
from ..hessian.spectrum import (
    HessianOperator,
    SpectrumEnds,
    head_symmetries,
    hessian_operator,
    origin_block,
    spectrum_ends,
    symmetry_basis,
)
from ..stationary.stationary import polish

Progress = Callable[[str], None]


SLOWEST = "slowest"
# the engines (MinimumRates.engine): "frozen" polishes, resolves the spectrum and predicts on the live heads by exact
# products, with the heads at the origin by their dense block, and integrates the runs with ROS2 on S frozen at the
# minimum (pdeflow.analysis.hessian.frozen_jacobian); "products" (the first engine) does all of it on the whole
# measure by
# exact products, proves the point by the dense certificate, and integrates with rkc or RK4
FROZEN = "frozen"
PRODUCTS = "products"
ENGINES = (FROZEN, PRODUCTS)
SLOWEST_HALF = "slowest, eps/2"        # the same direction at half the size: the linear regime's check
# a run lasts LOG_CHANGE_AT_MINIMUM / lambda_min: the slowest mode's distance falls by e^-0.1, its E - E* by e^-0.2.
# Along an eigenvector the linear solution is exactly exponential, and the samples are smooth to ~1e-10 relative
# (distances of ~eps against rounding of |omega| ~ 1e-15), so a fraction of an e-fold measures the rate to far
# below 1 %; four e-folds of a slow mode (lambda_min ~ 1e-4 beside lambda_max ~ 1e2) would be ~1e6 stiff steps
LOG_CHANGE_AT_MINIMUM = 0.1
SAMPLES_AT_MINIMUM = 21                # samples per run (the stepper lands on each: fewer allow longer rkc steps)
FIT_SKIP_AT_MINIMUM = 0.1              # slowest direction: the first tenth is left out of the fits
RANDOM_FIT_SKIP = 0.5                  # random directions: the second half of the run is fitted
# the frozen engine halves its ROS2 step until the measured rates (energy, distance, PL ratio) move by at most
# 3 x INTEGRATION_TOL between two steps: Richardson's estimate of the finer one's error (order 2) is then at most
# INTEGRATION_TOL. Measured on majority.toml's minimum (16 heads): the random directions' rates are off their
# exact linear-flow predictions by 3.1e-2 at the first step, 8.6e-3, 2.3e-3 and 5.8e-4 at its halves
INTEGRATION_TOL = 1e-3
MAX_HALVINGS = 4                       # at most 2^4 x the first step's work; the estimate is reported either way
# RK4 step 1 / lambda_max: inside its stability bound (2.785 / lambda_max), the fast modes damped (R(-1) = 0.375 vs
# e^-1 = 0.368), the slow ones measured with a relative rate error ~ (lambda_min dt)^4 / 120
STEPS_PER_FASTEST_AT_MINIMUM = 1.0
RK4_MAX_STEPS = 20_000                 # method "auto": rkc when RK4 would take more steps than this in one run
# rkc's error control against the perturbation, not against |omega|: atol = RKC_TOLERANCE x the rms entry of the
# initial perturbation (rtol = 0), so the error per step stays ~1e-5 of what is measured
RKC_TOLERANCE = 1e-5
RKC_RADIUS_EVERY = 25
RUN_MAX_GRADIENTS = 30_000             # rkc: a run stops after this many gradients (its later samples NaN); a random
# run on the long run's 564-s minimum (lambda_max 171) takes ~8,000, past the 8,000 of an earlier budget
EXCESS_FLOOR = 1e-12                   # E - E* compared (direct vs gradient form) only above this x max(1, |E*|)
# the gradient form of E - E* is trusted where it exceeds TRUST_FACTOR x |<g*, v>| / 2 (g* the gradient left at the
# polished point: the first-order term it adds to the form)
TRUST_FACTOR = 100.0
POLISH_OFFSET = 1e-3                   # the point is polished until sqrt(I) / lambda_min <= this x the smallest eps
PREDICTION_FACTOR = 2.0                # Lanczos steps of a linear prediction: this x sqrt(lambda_max T), + 50
# the frozen engine's predictions stop growing once the Krylov error bound is this share of the distance (checked
# every PREDICTION_CHECK steps): far below the 5 % the rates are checked to, and below the runs' own error
PREDICTION_TOL = 1e-6
PREDICTION_CHECK = 100
EXCESS_CHECK_SIZES = (1.0, 10.0, 100.0, 1000.0)   # multiples of eps where both forms of E - E* are compared


@dataclass
class LinearPrediction:
    """The linearised flow ``v(t) = exp(-S t) v0`` from one start, by its Krylov approximation (:func:`linear_flow`)
    at ``times`` [F]: ``distance`` ``|v|``, ``excess`` ``v^T S v / 2`` and ``dissipation`` ``|S v|^2`` [F],
    ``error_bound`` [F] (the bound on ``|v - v_m|`` from the Krylov residual), the Lanczos ``products`` spent."""
    times: np.ndarray
    distance: np.ndarray
    excess: np.ndarray
    dissipation: np.ndarray
    error_bound: np.ndarray
    products: int


def eigenvector_prediction(times: np.ndarray, lam: float, size: float) -> LinearPrediction:
    """The linear flow from ``size`` times a unit eigenvector of S with eigenvalue ``lam``, exactly, at ``times`` [T]:
    distance ``size e^(-lam t)``, ``E - E* = lam size^2 e^(-2 lam t) / 2``, dissipation ``(lam size)^2 e^(-2 lam t)``
    (no product)."""
    return LinearPrediction(times=times, distance=size * np.exp(-lam * times),
                            excess=0.5 * lam * size ** 2 * np.exp(-2 * lam * times),
                            dissipation=(lam * size) ** 2 * np.exp(-2 * lam * times),
                            error_bound=np.zeros_like(times), products=0)


def linear_flow(op: HessianOperator, v0: np.ndarray, times: np.ndarray, dims: int, tol: float = 0.0,
                check_every: int = 0) -> LinearPrediction:
    """The linear flow ``dv/dt = -C v`` (``C = Pi S Pi`` = ``op``, positive semi-definite at a minimum) from ``v0``
    [n], by the Lanczos approximation ``v_m(t) = Q exp(-T t) Q^T v0 = sum_j x_j e^(-theta_j t) c_j`` on the Krylov
    space of ``dims`` vectors from ``v0`` (:func:`pdeflow.core.lanczos.krylov_ritz`; Ritz pairs
    ``(theta_j, x_j)``, ``c_j = x_j^T v0``). Then ``|v_m|^2 = sum c_j^2 e^(-2 theta_j t)``, ``v_m^T C v_m / 2``
    and ``|C v_m|^2`` follow from the Ritz values (``C x_j = theta_j x_j + r_j``, the residual terms bounded by the
    error below). The error ``e = v - v_m`` solves ``e' = -C e - r(t)`` with ``r(t) = (C Q - Q T) exp(-T t) Q^T v0
    = beta q_(m+1) sum_j y_(m,j) c_j e^(-theta_j t)``, so ``|e(t)| <= int_0^t |r(s)| ds`` (``C >= 0``): computed
    by quadrature from the residuals and the signs of ``last_row``. With ``tol > 0`` and ``check_every`` the space
    grows ``check_every`` vectors at a time and stops, before ``dims``, once that bound is at most ``tol`` of the
    distance at every time (fewer products, and memory for fewer vectors)."""
    v0 = np.asarray(v0, dtype=float)
    times = np.asarray(times, dtype=float)
    mark = op.problem.mark()

    def enough(pairs) -> bool:
        pred = _krylov_prediction(pairs, v0, times, 0)
        return bool(np.all(pred.error_bound <= tol * pred.distance))

    pairs = krylov_ritz(op.matvec, v0, dims, op.symmetry.project, check_every=check_every if tol > 0 else 0,
                        enough=enough if tol > 0 else None)
    return _krylov_prediction(pairs, v0, times, op.problem.products_since(mark))


def _krylov_prediction(pairs, v0: np.ndarray, times: np.ndarray, products: int) -> LinearPrediction:
    """:func:`linear_flow`'s curves and error bound from its Ritz pairs."""
    theta, c = pairs.values, pairs.vectors.T @ v0
    decay = np.exp(-np.outer(times, np.maximum(theta, 0.0)))           # [F, m]
    weight = (c ** 2)[None, :] * decay ** 2
    distance = np.sqrt(weight.sum(axis=1))
    excess = 0.5 * (weight * theta[None, :]).sum(axis=1)
    dissipation = (weight * theta[None, :] ** 2).sum(axis=1)
    signed = np.sign(pairs.last_row) * pairs.residuals * c           # beta y_(m,j) c_j
    # |r(s)| on a grid fine at the start (the fast Ritz values decay within 1 / theta_max) and to the last time
    t_end = float(times[-1]) if times.size else 0.0
    fine = np.unique(np.concatenate([[0.0], np.geomspace(1e-3 / max(theta[-1], 1e-300), max(t_end, 1e-300), 4000)
                                     if t_end > 0 else [], times]))
    r = np.abs(np.exp(-np.outer(fine, np.maximum(theta, 0.0))) @ signed)
    cumulative = np.concatenate([[0.0], np.cumsum(0.5 * (r[1:] + r[:-1]) * np.diff(fine))])
    bound = np.interp(times, fine, cumulative)
    return LinearPrediction(times=times, distance=distance, excess=excess, dissipation=dissipation,
                            error_bound=bound, products=products)


@dataclass
class MinimumRun:
    """One perturbation of the minimum: its ``direction`` (``slowest``, ``slowest, eps/2`` or ``random j``) and size
    ``eps``; the samples ``times``, ``excess`` (``E - E*`` in its gradient form, :func:`excess_from_gradient`),
    ``excess_direct`` (``E - E*`` as a difference, NaN under rounding), ``distance`` (``|P M^(1/2) (omega -
    omega*)|``, P the projection off the symmetry directions), ``pl_ratio`` ``I / (2 (E - E*))`` and ``trusted``
    (where the gradient form is well above its floor) [F]; the fitted decay rates ``energy_rate`` and
    ``distance_rate`` (positive: decay) over the fitted window (from ``fit_from``), ``pl_ratio_min`` over it and
    ``pl_ratio_least`` over every trusted sample (the PL bound is ``pl_ratio_least >= lambda_min``); the
    predictions ``predicted_energy_rate``, ``predicted_distance_rate``, ``predicted_pl_ratio_min`` (slowest: 2
    lambda_min, lambda_min, lambda_min; random: the linear flow's, :func:`linear_flow`, with its curves
    ``predicted_excess``, ``predicted_distance`` and ``prediction_error`` the relative Krylov error bound on the
    distance); ``excess_agreement``: the largest relative difference of the two forms of E - E* where the direct
    one is above :data:`EXCESS_FLOOR`; the ``stepper`` (``rk4`` or ``rkc``), its first step ``dt``, the
    ``gradients`` it spent (the gradient equivalents of the Problem's calls for it: its steps and its samples'
    evaluations; a ROS2 run its share of the passes integrating all runs together), its
    products (``jvps``, exact and difference) and its ``steps``; ``integration_error``: the estimated relative error
    of the measured rates from the integration (:func:`integration_error`; NaN where not estimated: rk4 and rkc
    control their own error against the perturbation)."""
    direction: str
    eps: float
    times: np.ndarray
    excess: np.ndarray
    excess_direct: np.ndarray
    distance: np.ndarray
    pl_ratio: np.ndarray
    trusted: np.ndarray
    energy_rate: float
    distance_rate: float
    pl_ratio_min: float
    pl_ratio_least: float
    fit_from: float
    predicted_energy_rate: float
    predicted_distance_rate: float
    predicted_pl_ratio_min: float
    predicted_excess: np.ndarray
    predicted_distance: np.ndarray
    prediction_error: float
    excess_agreement: float
    stepper: str
    dt: float
    gradients: int
    jvps: int
    steps: int
    integration_error: float = math.nan

    def errors(self) -> np.ndarray:
        """Relative errors of the measured against the predicted: energy rate, distance rate, the PL ratio's least
        value over the fitted window [3]."""
        return np.array([self.energy_rate / self.predicted_energy_rate - 1.0,
                         self.distance_rate / self.predicted_distance_rate - 1.0,
                         self.pl_ratio_min / self.predicted_pl_ratio_min - 1.0])


def integration_error(fine: MinimumRun, coarse: MinimumRun) -> float:
    """Richardson's estimate of the relative error of ``fine``'s measured rates (energy, distance, the PL ratio's
    least value), integrated with half of ``coarse``'s step by a method of order 2: ``max |q_fine - q_coarse| / (3
    |q_fine|)`` over the three (NaN where one is not measured)."""
    pairs = [(fine.energy_rate, coarse.energy_rate), (fine.distance_rate, coarse.distance_rate),
             (fine.pl_ratio_min, coarse.pl_ratio_min)]
    errors = [abs(f - c) / (3.0 * abs(f)) for f, c in pairs if math.isfinite(f) and math.isfinite(c) and f != 0]
    return max(errors) if errors else math.nan


@dataclass
class MinimumRates:
    """The rate check at a stationary measure: its energy ``e_star`` after polishing, the dissipation ``i_star`` there,
    the spectrum ends of S (``lambda_min`` and its ``lambda_min_residual``, ``lambda_max``, ``morse_index_lower``,
    ``n_symmetry``), the perturbation size ``eps``, the runs (the slowest direction first), the cost (``products``: JVPs
    of the polish and the spectrum, ``prediction_products``: of the linear predictions, ``gradients``: of the runs and
    their samples), ``offset`` (``<u, g> / lambda_min``: how far the polished point is from the minimum along the
    slowest direction u, to first order), ``offset_bound`` (``sqrt(I) / lambda_min``: at most that far in all,
    mass-weighted), the polished point ``omega_star`` [N, k] with its ``mass`` [N], and ``excess_check`` [S, 3]: at
    perturbations of sizes ``EXCESS_CHECK_SIZES x eps`` along the slowest direction, (size, direct E - E*, gradient
    form); ``certificate``: what proves the point a minimum
    (:meth:`pdeflow.analysis.certificate.certificate.Certificate.describe`),
    ``lambda_min_lower`` its lower bound on lambda_min at the polished point and ``bracket_at_minimum`` (lower,
    upper) its bracket widened to the minimum (:attr:`pdeflow.analysis.certificate.certificate.Certificate.
    minimum_bracket`; NaN when the certificate is the source's); ``engine``: :data:`FROZEN` or :data:`PRODUCTS`."""
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
    prediction_products: int = 0
    offset: float = math.nan
    offset_bound: float = math.nan
    omega_star: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    mass: np.ndarray = field(default_factory=lambda: np.zeros(0))
    excess_check: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    certificate: str = ""
    lambda_min_lower: float = math.nan
    engine: str = PRODUCTS
    bracket_at_minimum: tuple[float, float] = (math.nan, math.nan)

    @property
    def gradients(self) -> int:
        """grad Phi evaluations of all runs (stepper and samples)."""
        return int(sum(r.gradients for r in self.runs))

    @property
    def worst_error(self) -> float:
        """The largest relative error of any rate of any run (nan when no run)."""
        errs = [np.max(np.abs(r.errors())) for r in self.runs]
        return float(max(errs)) if errs else math.nan


def lowest_certified(problem: Problem, omega: np.ndarray, mass: np.ndarray, basis: np.ndarray, *,
                     dense_limit: int = DENSE_LIMIT,
                     **ends) -> tuple[SpectrumEnds, Certificate, np.ndarray, np.ndarray, np.ndarray]:
    """The spectrum ends at the point (:func:`pdeflow.analysis.hessian.spectrum.spectrum_ends` with ``ends``,
    ``basis`` [N k,
    r] the symmetry directions), their certificate (:func:`pdeflow.analysis.certificate.certificate.certify`,
    ``dense_limit``),
    and the certificate's lowest dense eigenpairs: values [a], their error bound [a] (``delta``) and unit vectors
    [N k, a]. ConfigError, naming what was established instead, unless the certificate proves every eigenvalue of
    S off the symmetry directions positive (the rates of a minimum are predicted at a minimum only)."""
    found = spectrum_ends(problem, omega, mass, symmetry=basis, **ends)
    cert = certify(problem, omega, mass, found, dense_limit=dense_limit)
    if not cert.proven_minimum:
        hint = " (raise --dense-limit to assemble S densely)" if cert.kind == BY_LANCZOS else ""
        raise ConfigError(f"not a certified local minimum: {cert.describe()}{hint}; its rates are those of a "
                          "minimum only with a proof")
    return found, cert, cert.values, np.full(cert.values.size, cert.delta), cert.vectors


def excess_from_gradient(omega: np.ndarray, omega_star: np.ndarray, mass: np.ndarray, grad_phi: np.ndarray) -> float:
    """``E - E*`` in its gradient form ``(1/2) sum_i m_i <grad Phi(omega_i), omega_i - omega*_i>`` (omega, omega_star,
    grad_phi [N, k], mass [N]): for ``E`` smooth at a stationary ``omega*``, ``E(omega) - E* - (1/2) <grad E,
    omega - omega*> = -D^3 E[d, d, d] / 12 + O(|d|^4)``, a relative error ``O(|d|)`` like the linearisation's own,
    where the difference ``E - E*`` of two numbers ~1 loses everything below ~1e-16 |E|."""
    return 0.5 * float(np.sum(mass[:, None] * grad_phi * (omega - omega_star)))


class _StepCount(Observer):
    """A run's steps and its calls by kind of :data:`pdeflow.core.problem.COST_KINDS`, read from the Problem's
    counter since the run began (``base``: calls made for it before, the shared passes of runs integrated
    together), up to :meth:`close` (after its frames' evaluations); stops the run once their gradient equivalents
    (:func:`pdeflow.core.problem.gradient_equivalents`, the one formula) exceed ``budget`` (its later samples are then
    NaN, its rates not measured)."""

    def __init__(self, problem: Problem, budget: float = math.inf, base: Mapping[str, int] | None = None,
                 steps: int = 0) -> None:
        self.steps, self.budget = steps, budget
        self._problem, self._mark = problem, problem.mark()
        self._base = dict(base or {})
        self._closed: dict[str, int] | None = None

    @property
    def counts(self) -> dict[str, int]:
        """The run's calls by kind so far (fixed at :meth:`close`)."""
        if self._closed is not None:
            return self._closed
        spent = self._problem.since(self._mark)
        return {kind: spent[kind] + self._base.get(kind, 0) for kind in spent}

    def close(self) -> None:
        """The run's cost is complete: later calls of the Problem's are not the run's."""
        self._closed = self.counts

    @property
    def gradients(self) -> float:
        """The run's gradient equivalents so far."""
        return gradient_equivalents(self.counts)

    @property
    def products(self) -> float:
        """The run's Jacobian-vector products so far, exact and difference."""
        return sum(value for kind, value in self.counts.items() if kind != "gradient")

    def check(self, state: State) -> Stop | None:
        if self.gradients > self.budget:
            return Stop("max_steps", f"the run's budget of {self.budget:.0f} gradients is spent")
        return None

    def accept(self, step: Step) -> None:
        if step.old is not step.new:
            self.steps += 1


def run_stepper(problem: Problem, method: str, duration: float, lam_max: float, samples: int,
                scale: float) -> tuple[Stepper | None, float, str]:
    """The stepper of one run of ``duration`` (``samples`` frames): RK4 with ``dt = STEPS_PER_FASTEST_AT_MINIMUM /
    lambda_max`` (None: :func:`simulate`'s own), or rkc (:mod:`pdeflow.solvers.chebyshev`: ~sqrt(h lambda_max /
    0.65) gradients per step h, error-controlled against ``RKC_TOLERANCE x scale``, the rms entry of the
    perturbation; the step at most the sample spacing). ``method`` ``auto``: rkc when RK4 would take more than
    :data:`RK4_MAX_STEPS` steps. Returns (stepper, first step, name)."""
    from ...solvers.chebyshev import RKC

    dt = min(STEPS_PER_FASTEST_AT_MINIMUM / lam_max, duration / MIN_STEPS)
    if method == "auto":
        method = "rkc" if duration / dt > RK4_MAX_STEPS else "rk4"
    if method == "rk4":
        return None, dt, "rk4"
    if method != "rkc":
        raise ConfigError(f"unknown stepper {method!r} for the rate check: auto, rk4 or rkc")
    spacing = duration / max(samples - 1, 1)
    stepper = RKC(problem, dt, controller=RKC.default_controller(rtol=0.0, atol=RKC_TOLERANCE * scale,
                                                                 dt_min=1e-12 * duration, dt_max=spacing,
                                                                 max_growth=5.0), radius_every=RKC_RADIUS_EVERY)
    return stepper, dt, "rkc"


def minimum_rates(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, eps: float, n_random: int, seed: int,
                  eps_random: float = 0.0,
                  log_change: float = LOG_CHANGE_AT_MINIMUM, samples: int = SAMPLES_AT_MINIMUM,
                  method: str = "auto", linearity: bool = True, prediction_dims: int = 0,
                  progress: Progress | None = None, dense_limit: int = DENSE_LIMIT, engine: str = FROZEN,
                  lambda_hint: float = 0.0, source_certificate: str = "", factor_dtype: str = "float32",
                  **ends) -> MinimumRates:
    """Perturb the stationary measure ``(omega [N, k], mass [N])`` by ``eps`` (mass-weighted norm) along the slowest
    eigenvector of S (and, with ``linearity``, by ``eps / 2`` too: the rates agree in the linear regime) and by
    ``eps_random`` (0: eps) along ``n_random`` random directions (seeded, off the symmetry directions), integrate
    the flow (:func:`simulate` through :func:`run_stepper`'s stepper, ``method`` auto/rk4/rkc) for ``log_change /
    lambda_min`` with
    ``samples`` samples, and fit the decay rates of ``E - E*`` (its gradient form) and of the distance
    (:func:`fit_rate`; random: over the second half), beside the PL ratio. The slowest direction's predictions are
    ``2 lambda_min``, ``lambda_min`` and ``lambda_min``; a random direction's are those of the linear flow from the
    same start (:func:`linear_flow`, ``prediction_dims`` Lanczos steps, 0: ``PREDICTION_FACTOR sqrt(lambda_max T)
    + 50``), fitted over the same window. The point is first polished by Newton-Krylov
    (:func:`pdeflow.analysis.stationary.stationary.polish`) until ``sqrt(I) / lambda_min``, the most it can be off the
    minimum, is :data:`POLISH_OFFSET` of the smallest perturbation (a point certified at ``I <= 1e-12 I(0)`` on a
    stiff minimum is off by more than eps along its slow directions); ``ends`` go to
    :func:`pdeflow.analysis.hessian.spectrum.spectrum_ends`, once at the given point (for lambda_min) and again at the
    polished one, with their certificate (:func:`lowest_certified`, ``dense_limit``): ConfigError unless it proves
    every eigenvalue off the symmetry directions positive. lambda_min and the slowest direction are the dense
    eigenpair of the certificate. That is the :data:`PRODUCTS` engine; ``engine`` :data:`FROZEN` (the default) is
    :func:`frozen_minimum_rates` (with ``lambda_hint``, ``source_certificate`` and ``factor_dtype``; ``method`` and
    ``prediction_dims`` as here)."""
    if engine == FROZEN:
        return frozen_minimum_rates(problem, omega, mass, eps=eps, n_random=n_random, seed=seed,
                                    eps_random=eps_random, log_change=log_change, samples=samples,
                                    linearity=linearity, prediction_dims=prediction_dims, progress=progress,
                                    dense_limit=dense_limit, lambda_hint=lambda_hint,
                                    source_certificate=source_certificate, factor_dtype=factor_dtype, **ends)
    if engine != PRODUCTS:
        raise ConfigError(f"unknown engine {engine!r} for the rate check: {' or '.join(ENGINES)}")
    say = progress or (lambda msg: None)
    mass = np.asarray(mass, dtype=float)
    omega = np.array(omega, dtype=float)
    mark = problem.mark()
    basis = symmetry_basis(problem, omega, mass)
    ends_found, cert, lowest, residual, vectors = lowest_certified(problem, omega, mass, basis,
                                                                   dense_limit=dense_limit, **ends)
    smallest = min(0.5 * eps if linearity else eps, (eps_random or eps) if n_random else math.inf)
    target = (POLISH_OFFSET * float(lowest[0]) * smallest) ** 2
    omega, e_star, i_star, taken, _, why = polish(problem, omega, mass, target)
    say(f"lambda_min = {lowest[0]:.6g} at the given point; polished by {taken} Newton step(s) ({why}): E* = "
        f"{e_star:.12g}, I = {i_star:.3e} (target {target:.1e}: sqrt(I) / lambda_min <= {POLISH_OFFSET:g} x the "
        f"smallest eps, {smallest:g}); {problem.products_since(mark)} JVPs")
    if taken:
        basis = symmetry_basis(problem, omega, mass)
        ends_found, cert, lowest, residual, vectors = lowest_certified(problem, omega, mass, basis,
                                                                       dense_limit=dense_limit, **ends)
    products = problem.products_since(mark)
    lam, lam_max = float(lowest[0]), float(ends_found.highest[-1])
    root = np.sqrt(mass)[:, None]
    g = (root * problem.grad_phi(omega, omega, mass)).ravel()
    offset = float(vectors[:, 0] @ g) / lam
    offset_bound = math.sqrt(i_star) / lam
    say(f"at the polished point: lambda_min = {lam:.6g} (residual {residual[0]:.1e}), lambda_max = {lam_max:.6g}, "
        f"{basis.shape[1]} symmetry directions; {cert.describe()}; the point "
        f"is off by {offset:.1e} along the slowest direction (<u, g> / lambda_min), by at most "
        f"{offset_bound:.1e} in all (sqrt(I) / lambda_min); {products} JVPs")
    root = np.sqrt(mass)[:, None]
    grad_star = problem.grad_phi(omega, omega, mass)
    slowest = vectors[:, 0] / np.linalg.norm(vectors[:, 0])
    check = _excess_check(problem, omega, mass, slowest, eps, e_star)
    op = hessian_operator(problem, omega, mass, symmetry=basis)
    project = op.symmetry.project
    directions = _directions(omega, slowest, project, eps, eps_random, n_random, seed, linearity)
    duration = log_change / lam
    times = np.linspace(0.0, duration, samples)
    dims = prediction_dims or int(PREDICTION_FACTOR * math.sqrt(lam_max * duration)) + 50
    runs, predicting = [], problem.share()
    for name, d, size in directions:
        v0 = size * d
        if name.startswith("random"):
            with predicting:
                pred = linear_flow(op, v0, times, dims)
            say(f"{name}: linear flow predicted by {pred.products} Lanczos steps (Krylov error bound "
                f"{np.max(pred.error_bound / pred.distance):.1e} of the distance)")
        else:
            pred = eigenvector_prediction(times, lam, size)
        start = omega + v0.reshape(omega.shape) / root
        scale = float(np.sqrt(np.mean((v0.reshape(omega.shape) / root) ** 2)))
        stepper, dt, stepper_name = run_stepper(problem, method, duration, lam_max, samples, scale)
        counter = _StepCount(problem, RUN_MAX_GRADIENTS)
        path = simulate(problem, start, mass, times, dt, stepper, [counter])
        skip = FIT_SKIP_AT_MINIMUM if not name.startswith("random") else RANDOM_FIT_SKIP
        runs.append(_minimum_run(problem, name, size, path, mass, omega, project, e_star, grad_star, times, skip,
                                 pred,
                                 lam, stepper_name, dt, counter))
        r = runs[-1]
        say(f"{name}: E - E* decays at {r.energy_rate:.6g} (predicted {r.predicted_energy_rate:.6g}), distance at "
            f"{r.distance_rate:.6g} (predicted {r.predicted_distance_rate:.6g}), PL ratio >= {r.pl_ratio_min:.6g} "
            f"(predicted {r.predicted_pl_ratio_min:.6g}; lambda_min = {lam:.6g}); {r.stepper}, {r.steps} steps, "
            f"{r.gradients} gradients")
    return MinimumRates(e_star=e_star, i_star=i_star, lambda_min=lam,
                        lambda_min_residual=float(residual[0]), lambda_max=lam_max,
                        morse_index_lower=int(np.sum(lowest + residual < 0)), n_symmetry=int(basis.shape[1]),
                        eps=float(eps), runs=runs, products=int(products), polish_steps=taken, offset=offset,
                        offset_bound=offset_bound, omega_star=omega, mass=mass, certificate=cert.describe(),
                        lambda_min_lower=cert.lower, bracket_at_minimum=cert.minimum_bracket,
                        prediction_products=predicting.products, excess_check=check, engine=PRODUCTS)


def _directions(omega: np.ndarray, slowest: np.ndarray, project: Callable[[np.ndarray], np.ndarray], eps: float,
                eps_random: float, n_random: int, seed: int, linearity: bool) -> list[tuple[str, np.ndarray, float]]:
    """The perturbations (name, unit direction [N k], size): the slowest direction at eps (and eps / 2 with
    ``linearity``), then ``n_random`` seeded random directions off the symmetry directions (``project``) at
    ``eps_random`` (0: eps)."""
    rng = np.random.default_rng(seed)
    directions = [(SLOWEST, slowest, eps)] + ([(SLOWEST_HALF, slowest, 0.5 * eps)] if linearity else [])
    for j in range(n_random):
        d = project(rng.standard_normal(omega.size))
        directions.append((f"random {j + 1}", d / np.linalg.norm(d), eps_random or eps))
    return directions


def _excess_check(problem: Problem, omega: np.ndarray, mass: np.ndarray, slowest: np.ndarray, eps: float,
                  e_star: float) -> np.ndarray:
    """[S, 3]: (size, direct E - E*, gradient form) at ``EXCESS_CHECK_SIZES x eps`` along ``slowest`` [N k]."""
    root = np.sqrt(mass)[:, None]
    check = []
    for size in EXCESS_CHECK_SIZES:
        w = omega + size * eps * slowest.reshape(omega.shape) / root
        e = problem.evaluate(w, mass)
        check.append((size * eps, float(e.energy) - e_star, excess_from_gradient(w, omega, mass, e.grad_phi)))
    return np.array(check)


def split_linear_flow(problem: Problem, omega: np.ndarray, mass: np.ndarray, live: np.ndarray, v0: np.ndarray,
                      times: np.ndarray, dims: int, origin: tuple[np.ndarray, np.ndarray] | None = None,
                      tol: float = PREDICTION_TOL) -> LinearPrediction:
    """:func:`linear_flow` where S decouples (``live`` [N] from
    :func:`pdeflow.analysis.hessian.frozen_jacobian.live_heads`):
    on the live heads by Lanczos on their exact products (their symmetry directions projected), on each head at the
    origin exactly, ``exp(-H0 t)`` from the eigendecomposition of the origin block ``H0 = Hess Phi(0; rho)``
    (:func:`pdeflow.analysis.hessian.spectrum.origin_block`; ``origin``: its (values, vectors) when computed). The
    squared
    distances, excesses and dissipations add; so do the error bounds (the origin part has none). The Lanczos run
    stops before ``dims`` once its error bound is ``tol`` of the live part's distance (:func:`linear_flow`)."""
    V0 = np.asarray(v0, dtype=float).reshape(omega.shape)
    op = hessian_operator(problem, omega[live], mass[live], head_symmetries(problem, omega[live]))
    part = linear_flow(op, V0[live].ravel(), times, dims, tol, PREDICTION_CHECK)
    if live.all():
        return part
    values, vectors = origin if origin is not None else origin_block(problem, omega, mass)[:2]
    coeffs = V0[~live] @ vectors                                           # [d, k]
    weight = np.sum(coeffs ** 2, axis=0)[None, :] * np.exp(-2.0 * np.outer(times, values))   # [F, k]
    return LinearPrediction(times=part.times, distance=np.sqrt(part.distance ** 2 + weight.sum(axis=1)),
                            excess=part.excess + 0.5 * (weight * values[None, :]).sum(axis=1),
                            dissipation=part.dissipation + (weight * values[None, :] ** 2).sum(axis=1),
                            error_bound=part.error_bound, products=part.products)


def frozen_minimum_rates(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, eps: float, n_random: int,
                         seed: int, eps_random: float = 0.0, log_change: float = LOG_CHANGE_AT_MINIMUM,
                         samples: int = SAMPLES_AT_MINIMUM, linearity: bool = True, prediction_dims: int = 0,
                         progress: Progress | None = None, dense_limit: int = DENSE_LIMIT,
                         lambda_hint: float = 0.0, source_certificate: str = "", factor_dtype: str = "float32",
                         **ends) -> MinimumRates:
    """:func:`minimum_rates` by the :data:`FROZEN` engine, the same runs, fits and predictions:

    - the heads exactly at the origin (where it is stationary) are split off
      (:func:`pdeflow.analysis.hessian.frozen_jacobian.live_heads`): the polish
      (:func:`pdeflow.analysis.stationary.stationary.polish`)
      runs on the live heads, the spectrum's ends are those of the live heads' Lanczos run plus the origin block
      (:func:`pdeflow.analysis.hessian.spectrum.spectrum_ends` with ``split_origin``), computed once, at the polished
      point
      (the polish's target from ``lambda_hint``, the source's lambda_min; without it a first spectrum at the given
      point), and a random direction's prediction is :func:`split_linear_flow`;
    - the point is certified by the dense bound (:func:`lowest_certified`) when its live unknowns are at most
      ``dense_limit``; above it the certificate is the source's (``source_certificate``, at the unpolished point;
      ConfigError when empty), named as such;
    - the runs are integrated together by ROS2 on S frozen at the polished point
      (:func:`pdeflow.analysis.hessian.frozen_jacobian.ros2_paths`,
      :func:`~pdeflow.analysis.hessian.frozen_jacobian.frozen_solver`
      with its live block factorised in ``factor_dtype``), the step ``STEP_FRACTION x`` the earliest fitted time of
      a random run (``RANDOM_FIT_SKIP x`` the duration), cut to divide the sample spacing, then halved (all runs
      again, at most :data:`MAX_HALVINGS` times) until Richardson's estimate of the measured rates' relative error,
      :func:`integration_error`, is at most :data:`INTEGRATION_TOL`; each run reports its estimate and its share
      of the gradients of every pass."""
    from ..hessian.frozen_jacobian import live_heads

    say = progress or (lambda msg: None)
    mass = np.asarray(mass, dtype=float)
    omega = np.array(omega, dtype=float)
    live = live_heads(problem, omega, mass)
    smallest = min(0.5 * eps if linearity else eps, (eps_random or eps) if n_random else math.inf)
    mark = problem.mark()
    e_star, i_star, taken, found = _polish_live_heads(problem, omega, mass, live, lambda_hint, smallest, say, ends)
    n_live = int(live.sum()) * omega.shape[1]
    certificate, (lower, bracket), lam, lam_residual, slowest = _frozen_certificate(
        problem, omega, mass, found, n_live, dense_limit, source_certificate)
    products = problem.products_since(mark)
    lam_max = float(found.highest[-1])
    slowest = slowest / np.linalg.norm(slowest)
    root = np.sqrt(mass)[:, None]
    grad_star = problem.grad_phi(omega, omega, mass)
    offset = float(slowest @ (root * grad_star).ravel()) / lam
    offset_bound = math.sqrt(i_star) / lam
    symmetry = head_symmetries(problem, omega)
    say(f"at the polished point: lambda_min = {lam:.6g} (residual {lam_residual:.1e}), lambda_max = {lam_max:.6g}, "
        f"{symmetry.size} symmetry directions; certificate: {certificate}; off by {offset:.1e} along the slowest "
        f"direction, at most {offset_bound:.1e} in all; {products} JVPs")
    check = _excess_check(problem, omega, mass, slowest, eps, e_star)
    origin = None if live.all() else origin_block(problem, omega, mass)[:2]   # once: k Hessian-vector products
    directions = _directions(omega, slowest, symmetry.project, eps, eps_random, n_random, seed, linearity)
    duration = log_change / lam
    times = np.linspace(0.0, duration, samples)
    dims = prediction_dims or int(PREDICTION_FACTOR * math.sqrt(lam_max * duration)) + 50
    predictions, predicting = [], problem.share()
    for name, d, size in directions:
        if name.startswith("random"):
            with predicting:
                pred = split_linear_flow(problem, omega, mass, live, size * d, times, dims, origin)
            say(f"{name}: linear flow predicted by {pred.products} Lanczos steps on the live heads (Krylov error "
                f"bound {np.max(pred.error_bound / pred.distance):.1e} of the distance)")
        else:
            pred = eigenvector_prediction(times, lam, size)
        predictions.append(pred)
    runs, spent_steps = _frozen_runs(problem, omega, mass, directions, predictions, times, origin, n_live,
                                     factor_dtype, e_star, grad_star, symmetry.project, lam, say)
    for r, (name, _, _) in zip(runs, directions):
        say(f"{name}: E - E* decays at {r.energy_rate:.6g} (predicted {r.predicted_energy_rate:.6g}), distance at "
            f"{r.distance_rate:.6g} (predicted {r.predicted_distance_rate:.6g}), PL ratio >= {r.pl_ratio_min:.6g} "
            f"(predicted {r.predicted_pl_ratio_min:.6g}); ros2-w, step {r.dt:.6g}, integration error "
            f"{r.integration_error:.1e}; {spent_steps} steps and {r.gradients} gradients in all")
    return MinimumRates(e_star=e_star, i_star=i_star, lambda_min=lam, lambda_min_residual=lam_residual,
                        lambda_max=lam_max, morse_index_lower=0, n_symmetry=symmetry.size, eps=float(eps), runs=runs,
                        products=int(products), polish_steps=taken, prediction_products=predicting.products,
                        offset=offset, offset_bound=offset_bound, omega_star=omega, mass=mass, excess_check=check,
                        certificate=certificate, lambda_min_lower=lower, engine=FROZEN, bracket_at_minimum=bracket)


def _polish_live_heads(problem: Problem, omega: np.ndarray, mass: np.ndarray, live: np.ndarray, lambda_hint: float,
                       smallest: float, say: Progress, ends: dict) -> tuple[float, float, int, SpectrumEnds]:
    """Newton's polish of the live heads (``omega`` [N, k] edited in place) to ``I <= (POLISH_OFFSET lambda
    smallest)^2``, lambda the hint or a first spectrum's lowest value; then the spectrum's ends at the polished
    point, the origin block split off. Returns E*, I*, the Newton steps taken and the ends."""
    mark = problem.mark()
    found = None
    if not (lambda_hint > 0):
        found = spectrum_ends(problem, omega, mass, split_origin=True, **ends)
        if not (found.lowest.size and found.lowest[0] > 0):
            raise ConfigError("no converged positive lowest eigenvalue at the given point (raise --krylov-dim)")
        lambda_hint = float(found.lowest[0])
    target = (POLISH_OFFSET * lambda_hint * smallest) ** 2
    polished, e_star, i_star, taken, _, why = polish(problem, omega[live], mass[live], target)
    omega[live] = polished
    say(f"{int((~live).sum())} of {len(live)} heads at the origin split off; polished on the live heads by {taken} "
        f"Newton step(s) ({why}): E* = {e_star:.12g}, I = {i_star:.3e} (target {target:.1e}); "
        f"{problem.products_since(mark)} JVPs")
    if found is None or taken:
        found = spectrum_ends(problem, omega, mass, split_origin=True, **ends)
    if not (found.lowest.size and found.morse_index_lower == 0 and found.lowest[0] > 0):
        raise ConfigError(f"the spectrum at the polished point shows no converged positive lambda_min (index >= "
                          f"{found.morse_index_lower}; raise --krylov-dim)")
    return e_star, i_star, taken, found


def _frozen_certificate(problem: Problem, omega: np.ndarray, mass: np.ndarray, found: SpectrumEnds, n_live: int,
                        dense_limit: int, source_certificate: str
                        ) -> tuple[str, tuple[float, tuple[float, float]], float, float, np.ndarray]:
    """The certificate at the polished point: the dense bound up to ``dense_limit`` live unknowns, else the source's
    (named as such). Returns its text, (lambda_min's lower bound, its bracket about the minimum) (NaN: not
    re-proven), lambda_min, its residual and the slowest direction."""
    if n_live <= dense_limit:
        cert = certify(problem, omega, mass, found, dense_limit=dense_limit)
        if not cert.proven_minimum:
            raise ConfigError(f"not a certified local minimum: {cert.describe()}; its rates are those of a minimum "
                              "only with a proof")
        return (cert.describe(), (cert.lower, cert.minimum_bracket), float(cert.values[0]), float(cert.delta),
                cert.vectors[:, 0])
    if not source_certificate:
        raise ConfigError(f"the live heads' {n_live} unknowns exceed the dense limit {dense_limit} and no "
                          "certificate was given (raise --dense-limit, or start from a certified result)")
    certificate = (f"the source's, at the point before the polish (not re-proven here: {n_live} live unknowns "
                   f"> --dense-limit {dense_limit}): {source_certificate}")
    return (certificate, (math.nan, (math.nan, math.nan)), float(found.lowest[0]), float(found.lowest_residual[0]),
            found.lowest_vectors[:, 0])


def _frozen_runs(problem: Problem, omega: np.ndarray, mass: np.ndarray, directions: list, predictions: list,
                 times: np.ndarray, origin, n_live: int, factor_dtype: str, e_star: float, grad_star: np.ndarray,
                 project: Callable[[np.ndarray], np.ndarray], lam: float,
                 say: Progress) -> tuple[list[MinimumRun], int]:
    """Every run of ``directions`` integrated together by ROS2 on S frozen at ``omega``, the step halved until
    Richardson's estimate of the measured rates' error is at most :data:`INTEGRATION_TOL` (at most
    :data:`MAX_HALVINGS` times). Returns the runs of the last pass and the steps of all passes."""
    from ..hessian.frozen_jacobian import GAMMA, STEP_FRACTION, frozen_solver, mass_weighted_field, ros2_paths

    duration = float(times[-1])
    spacing = duration / max(len(times) - 1, 1)
    h = spacing / math.ceil(spacing / (STEP_FRACTION * RANDOM_FIT_SKIP * duration) - 1e-9)
    field = mass_weighted_field(problem, omega, mass)
    root = np.sqrt(mass)[:, None]
    starts = np.stack([size * d for _, d, size in directions])
    coarse: list[MinimumRun] | None = None
    spent_steps, integrating = 0, problem.share()
    for halving in range(MAX_HALVINGS + 1):
        solver = frozen_solver(problem, omega, mass, GAMMA * h, dtype=np.dtype(factor_dtype), origin=origin)
        say(f"I + {GAMMA * h:.4g} S factorised ({factor_dtype}, {n_live} live unknowns); ROS2 steps of {h:.6g} for "
            f"{len(directions)} runs together")
        with integrating:
            paths = ros2_paths(field, solver.solve, starts, times, h)
        del solver
        spent_steps += paths.steps
        runs = []
        for j, ((name, d, size), pred) in enumerate(zip(directions, predictions)):
            # the runs are integrated together: each is charged its share of the passes' field evaluations
            counter = _StepCount(problem, base={"gradient": round(integrating.gradients / len(directions))},
                                 steps=paths.steps)
            path = omega[None] + paths.samples[j].reshape(len(times), *omega.shape) / root[None]
            skip = FIT_SKIP_AT_MINIMUM if not name.startswith("random") else RANDOM_FIT_SKIP
            runs.append(_minimum_run(problem, name, size, path, mass, omega, project, e_star, grad_star,
                                     times, skip, pred, lam, "ros2-w", h, counter))
        if coarse is not None:
            for r, c in zip(runs, coarse):
                r.integration_error = integration_error(r, c)
            worst = max(r.integration_error for r in runs)
            say(f"step {h:.6g}: the measured rates moved by at most {3 * worst:.1e} (relative) from step {2 * h:.6g}: "
                f"their error here {worst:.1e} (Richardson, order 2)")
            if not worst > INTEGRATION_TOL:
                break
        if halving < MAX_HALVINGS:
            coarse, h = runs, h / 2
    return runs, spent_steps


def _fit_or_nan(times: np.ndarray, values: np.ndarray, select: np.ndarray) -> float:
    """The decay rate (positive) of ``values`` over the selected samples (:func:`fit_rate`), NaN with fewer than 3."""
    return -fit_rate(times[select], values[select], 0.0)[0] if select.sum() >= 3 else math.nan


def _minimum_run(problem: Problem, name: str, eps: float, path: np.ndarray, mass: np.ndarray, omega: np.ndarray,
                 project: Callable[[np.ndarray], np.ndarray], e_star: float, grad_star: np.ndarray, times: np.ndarray,
                 skip: float, pred: LinearPrediction, lam: float, stepper: str, dt: float,
                 counter: _StepCount) -> MinimumRun:
    """The excess energy (both forms), distance (off the symmetry directions: ``project`` on flat [N k] vectors) and
    PL ratio along one simulated path [F, N, k], their fits over
    the last ``1 - skip`` of the run (E - E* and the PL ratio only where the gradient form is trusted: above
    :data:`TRUST_FACTOR` times the first-order term ``|<g*, v>| / 2`` of the gradient ``grad_star`` [N, k] left at
    the point), and the same fits of the prediction ``pred``."""
    root = np.sqrt(mass)[:, None]
    excess, direct, distance, pl, first_order = (np.full(len(times), np.nan) for _ in range(5))
    for f, w in enumerate(path):
        if not np.all(np.isfinite(w)):
            break
        ev = problem.evaluate(w, mass)
        v = (root * (w - omega)).ravel()
        excess[f] = excess_from_gradient(w, omega, mass, ev.grad_phi)
        first_order[f] = abs(excess_from_gradient(w, omega, mass, grad_star))
        difference = ev.energy - e_star
        direct[f] = difference if difference > EXCESS_FLOOR * max(1.0, abs(e_star)) else np.nan
        distance[f] = np.linalg.norm(project(v))
        pl[f] = ev.dissipation / (2.0 * excess[f]) if excess[f] > 0 else np.nan
    counter.close()  # the run's cost: its steps and its frames' evaluations
    window = times >= times[0] + skip * (times[-1] - times[0])
    trusted = np.isfinite(excess) & (excess > TRUST_FACTOR * first_order)
    fitted = window & trusted
    pred_pl = pred.dissipation / (2.0 * pred.excess)
    agreement = np.abs(excess / direct - 1.0)
    return MinimumRun(
        direction=name, eps=float(eps), times=times, excess=excess, excess_direct=direct, distance=distance,
        pl_ratio=pl, trusted=trusted, energy_rate=_fit_or_nan(times, excess, fitted),
        distance_rate=_fit_or_nan(times, distance, window),
        pl_ratio_min=float(np.min(pl[fitted])) if fitted.any() else math.nan,
        pl_ratio_least=float(np.min(pl[trusted])) if trusted.any() else math.nan,
        fit_from=float(times[window][0]), predicted_energy_rate=_fit_or_nan(times, pred.excess, window),
        predicted_distance_rate=_fit_or_nan(times, pred.distance, window),
        predicted_pl_ratio_min=float(np.min(pred_pl[window])), predicted_excess=pred.excess,
        predicted_distance=pred.distance, prediction_error=float(np.max(pred.error_bound / pred.distance)),
        excess_agreement=float(np.nanmax(agreement)) if np.isfinite(agreement).any() else math.nan,
        stepper=stepper, dt=float(dt),
        gradients=int(counter.gradients), jvps=int(counter.products), steps=counter.steps)


SCHEMA_MINIMUM = RATES.schema  # the table: pdeflow.io.result_schema


def write_minimum_rates(path: str | Path, result: MinimumRates, cfg: Config, problem: Problem,
                        source: str = "") -> None:
    """Write ``/rates`` (one result file, all or nothing, with ``/model`` and ``/data``): attributes ``e_star``,
    ``i_star``, ``lambda_min``, ``lambda_min_residual``, ``lambda_max``, ``morse_index_lower``, ``n_symmetry``, ``eps``,
    ``products``, ``prediction_products``, ``gradients``, ``polish_steps``, ``offset``, ``offset_bound``,
    ``certificate`` and ``lambda_min_lower`` (what proves the point a minimum), ``lambda_min_lower_at_minimum`` and
    ``lambda_min_upper_at_minimum`` (its bracket about the minimum), ``engine``, ``source``
    (the stationary result); ``omega_star`` [N, k] and ``mass`` [N], the polished point; ``excess_check`` [S, 3] (size,
    direct E - E*, gradient form); datasets over runs [R]: ``direction`` (str), ``stepper`` (str), ``eps``,
    ``energy_rate``, ``distance_rate``, ``pl_ratio_min``, ``pl_ratio_least``, ``predicted_energy_rate``,
    ``predicted_distance_rate``, ``predicted_pl_ratio_min``, ``prediction_error``, ``excess_agreement``, ``gradients``,
    ``steps``, ``integration_error``, ``relative_error`` [R, 3] (energy, distance, PL ratio); ``runs/r<j>``:
    ``times``, ``excess``, ``excess_direct``, ``distance``, ``pl_ratio``, ``trusted``, ``predicted_excess``,
    ``predicted_distance`` [F]."""
    from ...io.result_files import new_result_file, text_array

    with new_result_file(path, SCHEMA_MINIMUM, RATES.version, cfg, problem=problem) as f:
        g = f.create_group("rates")
        for key in ("e_star", "i_star", "lambda_min", "lambda_min_residual", "lambda_max", "morse_index_lower",
                    "n_symmetry", "eps", "products", "prediction_products", "gradients", "polish_steps", "offset",
                    "offset_bound", "certificate", "lambda_min_lower", "engine"):
            g.attrs[key] = getattr(result, key)
        g.attrs["lambda_min_lower_at_minimum"], g.attrs["lambda_min_upper_at_minimum"] = result.bracket_at_minimum
        g.attrs["source"] = source
        g["excess_check"] = np.asarray(result.excess_check, dtype=float).reshape(-1, 3)
        g["omega_star"] = np.asarray(result.omega_star, dtype=float)
        g["mass"] = np.asarray(result.mass, dtype=float)
        runs = result.runs
        g["direction"] = text_array([r.direction for r in runs])
        g["stepper"] = text_array([r.stepper for r in runs])
        for key in ("eps", "energy_rate", "distance_rate", "pl_ratio_min", "pl_ratio_least", "predicted_energy_rate",
                    "predicted_distance_rate", "predicted_pl_ratio_min", "prediction_error", "excess_agreement",
                    "gradients", "steps", "integration_error"):
            g[key] = np.array([getattr(r, key) for r in runs], dtype=float)
        g["relative_error"] = np.array([r.errors() for r in runs]).reshape(len(runs), 3)
        rg = g.create_group("runs")
        for j, r in enumerate(runs):
            sg = rg.create_group(f"r{j}")
            for key in ("times", "excess", "excess_direct", "distance", "pl_ratio", "trusted", "predicted_excess",
                        "predicted_distance"):
                sg[key] = getattr(r, key)
            sg.attrs["direction"], sg.attrs["dt"], sg.attrs["fit_from"] = r.direction, r.dt, r.fit_from
