"""A stabilized explicit particle stepper: the Runge-Kutta-Chebyshev method RKC, order 2, with error control.

The particle system ``y' = f(y)``, ``y = omega`` [N, k], ``f(y)_i = -grad Phi(omega_i; rho_N)`` (masses fixed,
docs/model.md) has a Jacobian symmetric in the mass-weighted inner product, so its spectrum is real. An s-stage
RKC step (Sommeijer, Shampine & Verwer 1997; damping ``eps = 2/13``) multiplies an eigencomponent by
``R_s(z) = a_s + b_s T_s(w0 + w1 z)`` (``T_s`` Chebyshev), second order, ``|R_s| <= 1`` on ``[-beta(s), 0]`` with
``beta(s) = (1 + w0) / w1 ~ 0.65 s^2``: a step of the size accuracy asks for stays stable at any stiffness for
about ``sqrt(h rho / 0.65)`` gradient evaluations, where an explicit Runge-Kutta method needs ``h rho / 3``.
``rho``, the spectral radius, is a Rayleigh-Ritz estimate on difference products, taken with the margin
:data:`RADIUS_SAFETY` and re-estimated after a rejected step and every ``interval`` steps: the interval halves when
an estimate finds rho grown by more than :data:`RADIUS_GROWTH` and doubles up to ``radius_every`` when not. Error
control by the RKC estimate ``(12 (y_n - y_{n+1}) + 6 h (f_n + f_{n+1})) / 15`` (``O(h^3)``) and the PI controller. Each
step leaves the Hermite quadrature of the dissipation (one difference product for ``dI/dt`` at the new state), so
the energy-identity defect shows the method's error, not the trapezoid's.
Details: docs/solvers.md, "Long runs: rkc".
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pdeflow.core.lanczos import StartPolicy
from pdeflow.core.problem import Problem
from pdeflow.core.system_jacobian import SystemJacobian

from .base import Carried, State
from .controller import CONTROLLER_PARAMS, AdaptiveStepper
from .dissipation import hermite_dissipation, state_jacobian
from .parameters import Param
from .step_size import StepSizeController

# the damping of the stability polynomial: |R_s| <= 1 - eps/3 or so inside the interval (a margin against rounding
# and a slightly wrong rho), at the price of beta(s) ~ 0.65 s^2 instead of 2 s^2
DAMPING = 2.0 / 13.0
# rho is a Rayleigh-Ritz value (a lower bound): the stages are chosen for RADIUS_SAFETY x rho
RADIUS_SAFETY = 1.2
# an estimate finding rho grown by more than this factor halves the steps to the next one (else they double)
RADIUS_GROWTH = 1.1
# Krylov dimensions of the radius estimate: warm (from the previous vector) and cold (the first)
RADIUS_KRYLOV = 8
RADIUS_COLD = 16
# the start of an estimate: warm from the previous vector, cold from the fixed random vector of seed 1
RADIUS_START = StartPolicy(warm=RADIUS_KRYLOV, cold=RADIUS_COLD, seed=1)
# stages of one step at most; a longer step is cut to beta(MAX_STAGES) / (RADIUS_SAFETY rho)
MAX_STAGES = 2000
RADIUS_EVERY = Param("radius_every", int, 25, "the most steps between estimates of the Jacobian's spectral radius "
                     "(fewer while it grows; and after every rejected step)", ge=1)
ORDER = 2  # of y_{n+1}
# the estimate measures the local error of y_{n+1} itself: O(h^3), so the controller's exponent is 1/3
ERROR_ORDER = 2


@dataclass(frozen=True)
class Chebyshev:
    """The coefficients of an s-stage RKC step: ``w0 = 1 + eps / s^2``, ``w1 = T_s'(w0) / T_s''(w0)``,
    ``b`` [s+1] (``b_j = T_j''(w0) / T_j'(w0)^2``, ``b_0 = b_1 = b_2``), ``T`` [s+1] the values ``T_j(w0)``, and
    the stability boundary ``beta = (1 + w0) / w1``."""
    s: int
    w0: float
    w1: float
    b: np.ndarray
    T: np.ndarray
    beta: float


@functools.cache
def chebyshev(s: int) -> Chebyshev:
    """The :class:`Chebyshev` coefficients of ``s >= 2`` stages (three-term recurrences of T_j, T_j', T_j'')."""
    w0 = 1.0 + DAMPING / s ** 2
    T, dT, d2T = np.zeros(s + 1), np.zeros(s + 1), np.zeros(s + 1)
    T[0], T[1], dT[1] = 1.0, w0, 1.0
    for j in range(2, s + 1):
        T[j] = 2.0 * w0 * T[j - 1] - T[j - 2]
        dT[j] = 2.0 * T[j - 1] + 2.0 * w0 * dT[j - 1] - dT[j - 2]
        d2T[j] = 4.0 * dT[j - 1] + 2.0 * w0 * d2T[j - 1] - d2T[j - 2]
    w1 = dT[s] / d2T[s]
    b = np.zeros(s + 1)
    b[2:] = d2T[2:] / dT[2:] ** 2
    b[0] = b[1] = b[2]
    return Chebyshev(s, w0, w1, b, T, (1.0 + w0) / w1)


def stages_for(h_rho: float) -> int:
    """The fewest stages ``s >= 2`` with ``beta(s) >= h_rho`` (``MAX_STAGES + 1`` when even MAX_STAGES is short)."""
    if h_rho > chebyshev(MAX_STAGES).beta:
        return MAX_STAGES + 1
    s = max(2, math.ceil(math.sqrt(h_rho / 0.66)))
    while s > 2 and chebyshev(s - 1).beta >= h_rho:
        s -= 1
    while chebyshev(s).beta < h_rho:
        s += 1
    return s


def rkc_step(f: Callable[[np.ndarray], np.ndarray], y: np.ndarray, fy: np.ndarray, h: float, s: int) -> np.ndarray:
    """``y_{n+1}`` of one s-stage RKC step of size h from ``y`` (``fy = f(y)``); s - 1 evaluations of f:
    ``Y_1 = y + mu~_1 h f(y)``, ``Y_j = (1 - mu_j - nu_j) y + mu_j Y_{j-1} + nu_j Y_{j-2} + mu~_j h f(Y_{j-1})
    + gamma~_j h f(y)`` with ``mu_j = 2 b_j w0 / b_{j-1}``, ``nu_j = -b_j / b_{j-2}``, ``mu~_j = 2 b_j w1 / b_{j-1}``,
    ``gamma~_j = -(1 - b_{j-1} T_{j-1}) mu~_j``, ``y_{n+1} = Y_s``."""
    c = chebyshev(s)
    previous, current = y, y + (c.b[1] * c.w1 * h) * fy
    for j in range(2, s + 1):
        mu = 2.0 * c.b[j] * c.w0 / c.b[j - 1]
        nu = -c.b[j] / c.b[j - 2]
        mu_t = 2.0 * c.b[j] * c.w1 / c.b[j - 1]
        gamma_t = -(1.0 - c.b[j - 1] * c.T[j - 1]) * mu_t
        nxt = (1.0 - mu - nu) * y + mu * current + nu * previous + (mu_t * h) * f(current) + (gamma_t * h) * fy
        previous, current = current, nxt
    return current


def error_estimate(y: np.ndarray, y_new: np.ndarray, fy: np.ndarray, f_new: np.ndarray, h: float) -> np.ndarray:
    """The RKC local error estimate ``(12 (y_n - y_{n+1}) + 6 h (f_n + f_{n+1})) / 15``, ``O(h^3)``."""
    return (12.0 * (y - y_new) + 6.0 * h * (fy + f_new)) / 15.0


@dataclass
class RadiusPlan:
    """The plan of one step: the spectral radius estimate ``rho``, its Ritz vector [n], its ``age`` and the
    ``interval`` to the next estimate in steps; ``slope = dI/dt`` at the step's start; ``pairs``: eserk4's deflated
    pairs for the step (None: none)."""
    rho: float
    vector: np.ndarray | None
    age: int
    interval: int
    slope: float
    pairs: Any = None


class RKC(AdaptiveStepper):
    """``solver.method = "rkc"``: the Runge-Kutta-Chebyshev method (see the module docstring)."""
    name = "rkc"
    summary = "Runge-Kutta-Chebyshev, order 2, stabilized explicit: stages from the spectral radius, error control"
    use_when = ("long particle runs once an explicit step is pinned at its stability bound, at loose tolerances "
                "and without the `sundials` extra (`data/configs/longtime.toml`)")
    sharded = False
    order: ClassVar[int] = ORDER
    error_order: ClassVar[int] = ERROR_ORDER
    step_columns = ("rejected", "stages", "jvps", "spectral_radius", "stability_margin")
    # what an accepted step hands to the next besides the controller's memory: the radius estimate ``rho``, its Ritz
    # ``vector`` [N k], its ``age`` and the ``interval`` to the next estimate in steps (:class:`RadiusPlan`), and
    # ``slope = dI/dt`` at the new state
    carried = (*AdaptiveStepper.carried, Carried("rho"), Carried("vector", "vector"), Carried("age", "int"),
               Carried("interval", "int"), Carried("slope"))
    stability_column = "stability_margin"
    params = (*CONTROLLER_PARAMS, RADIUS_EVERY)

    def __init__(self, problem: Problem, dt: float, *, controller: StepSizeController, radius_every: int) -> None:
        """``dt`` the first step; ``controller`` the run's step-size controller (as for ``adaptive``);
        ``radius_every`` steps between estimates of the spectral radius (``solver.radius_every``)."""
        super().__init__(problem, dt, controller=controller)
        self.radius_every = int(radius_every)

    def _velocity(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        return self.problem.velocity(omega, mass)

    def _jacobian(self, state: State) -> SystemJacobian:
        """The system Jacobian at the state on difference products (one grad Phi each)."""
        return state_jacobian(self, state, "difference")

    def _radius(self, state: State, start: np.ndarray | None, plan: RadiusPlan) -> tuple[float, np.ndarray]:
        """``(rho, x)``: the largest eigenvalue of ``S = M^{1/2} (-J) M^{-1/2}`` at the state by
        :meth:`pdeflow.core.system_jacobian.SystemJacobian.top_pair` on difference products (one grad Phi each),
        warm from ``start`` or cold from a fixed random vector (:data:`RADIUS_START`); a lower bound, at least 0.
        ``plan``: the step's (rkc's estimate uses nothing of it)."""
        value, vector = self._jacobian(state).top_pair(start, RADIUS_START)
        return max(value, 0.0), vector

    def _reestimate(self, state: State, rho: float, vector: np.ndarray, interval: int,
                    plan: RadiusPlan) -> tuple[float, np.ndarray, int]:
        """A new radius estimate from the old one's vector, and the steps to the next: half the interval when rho
        grew by more than :data:`RADIUS_GROWTH`, else twice it, within ``[1, radius_every]``."""
        new_rho, new_vector = self._radius(state, vector, plan)
        grown = new_rho > RADIUS_GROWTH * rho
        interval = max(1, interval // 2) if grown else min(self.radius_every, 2 * interval)
        return new_rho, new_vector, interval

    def _new_plan(self, state: State) -> RadiusPlan:
        """The step's plan before its radius is known (eserk4 adds the pairs the state's carry holds)."""
        return RadiusPlan(math.nan, None, 0, 1, math.nan)

    def _begin_step(self, state: State, columns: dict[str, float]) -> RadiusPlan:
        """The radius estimate for the step (carried, renewed when its interval is up, or cold) and dI/dt."""
        carry = state.carry
        plan = self._new_plan(state)
        if carry.get("rho") is None:
            plan.rho, plan.vector = self._radius(state, None, plan)
            plan.slope = self._jacobian(state).slope()
        else:
            if carry["age"] >= carry["interval"]:
                plan.rho, plan.vector, plan.interval = self._reestimate(state, carry["rho"], carry["vector"],
                                                                        carry["interval"], plan)
            else:
                plan.rho, plan.vector, plan.age, plan.interval = (carry["rho"], carry["vector"], carry["age"],
                                                                  carry["interval"])
            plan.slope = carry["slope"]
        return plan

    def _stage_rule(self) -> tuple[Callable[[float], int], Callable[[int], float], int]:
        """The method's stages: the fewest stable ones for ``x = h rho`` (:func:`stages_for`), the stable length
        ``beta(s)`` of s stages, and the most one step takes (:data:`MAX_STAGES`)."""
        return stages_for, lambda s: chebyshev(s).beta, MAX_STAGES

    def _stages(self, h: float, rho: float) -> tuple[int, float, float]:
        """(stages, step, stability margin) for the step ``h`` at the radius ``rho``: the fewest stable stages for
        ``RADIUS_SAFETY rho h``, cut to the most the method takes with ``h`` shortened to their stable length
        ``beta / (RADIUS_SAFETY rho)``; the margin ``h rho / beta(stages)``."""
        fewest, beta, most = self._stage_rule()
        stages = fewest(RADIUS_SAFETY * rho * h)
        if stages > most:
            stages, h = most, beta(most) / (RADIUS_SAFETY * rho)
        return stages, h, h * rho / beta(stages)

    def _step_impl(self, state: State, h: float, plan: RadiusPlan, columns: dict[str, float]) -> tuple[State, float,
                                                                                                  float]:
        """An RKC step with the fewest stable stages for ``h``, cut to ``beta(MAX_STAGES)`` when longer."""
        omega, mass = state.fields["omega"], state.fields["mass"]
        stages, h, margin = self._stages(h, plan.rho)
        fy = -self.evaluate(state).grad_phi
        y_new = rkc_step(lambda y: self._velocity(y, mass), omega, fy, h, stages)
        new = state.advanced({"omega": y_new, "mass": mass}, h)
        f_new = -self.evaluate(new).grad_phi  # the next step's first stage and the step's diagnostics
        columns.update(stages=float(stages), spectral_radius=plan.rho, stability_margin=margin)
        return new, h, self.error_norm(error_estimate(omega, y_new, fy, f_new, h), omega, y_new)

    def _accept_step(self, state: State, new: State, h: float, plan: RadiusPlan,
                     columns: dict[str, float]) -> dict[str, float]:
        """The Hermite quadrature (one product for dI/dt at the new state) and the carried radius."""
        new_slope = hermite_dissipation(self, state, new, h, plan.slope, "difference")
        new.carry.update(rho=plan.rho, vector=plan.vector, age=plan.age + 1, interval=plan.interval, slope=new_slope)
        return columns

    def _reject_step(self, state: State, plan: RadiusPlan, columns: dict[str, float]) -> None:
        """A rejection may come from a radius that grew since it was estimated: estimate it again."""
        plan.rho, plan.vector, plan.interval = self._reestimate(state, plan.rho, plan.vector, plan.interval, plan)
        plan.age = 0

    def likely_cause(self, state: State) -> str:
        return (f"the rkc stepper's tolerances (solver.rtol = {self.rtol:g}, solver.atol = {self.atol:g}) are too "
                f"loose for this problem, or solver.radius_every = {self.radius_every} lets the spectral radius "
                f"grow too far between estimates; tighten them")
