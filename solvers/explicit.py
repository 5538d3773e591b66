"""Explicit Runge-Kutta steppers for particle and weighted-particle measures.

The particle system of docs/model.md, ``d omega_i/dt = -grad Phi(omega_i; rho_N)`` with the masses fixed, is an
ODE ``y' = f(y)`` in ``y = omega`` [N, k]; every stage evaluates the velocity at all particles at once.
``euler``, ``heun``, ``rk4`` (orders 1, 2, 4) take the fixed step ``solver.dt``; ``adaptive`` is the Dormand-Prince
5(4) pair with first-same-as-last reuse and error control. Each step leaves on the new state its quadrature of the
dissipation, ``Q = h sum_i b_i I(Y_i)`` (:mod:`pdeflow.solvers.accuracy`); fixed-step methods declare their
real-axis stability bound (2, 2, 2.7853). Details: docs/solvers.md, "Particles: euler, heun, rk4, adaptive".
"""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from pdeflow.config import Config
from pdeflow.problem import Problem

from . import register
from .base import SolverError, State, Stepper


class ExplicitRK(Stepper):
    """A fixed-step explicit Runge-Kutta method given by its Butcher tableau (``A``, ``b``)."""
    sharded = True
    A: ClassVar[tuple[tuple[float, ...], ...]] = ()
    b: ClassVar[tuple[float, ...]] = ()
    order: ClassVar[int] = 1

    def __init__(self, problem: Problem, dt: float) -> None:
        """``dt``: the step (``solver.dt``)."""
        super().__init__(problem)
        self.dt = float(dt)

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> ExplicitRK:
        return cls(problem, dt=cfg.solver.dt)

    def _velocity(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        return -self.problem.grad_phi(omega, omega, mass)

    def _stages(self, state: State, h: float, n_stages: int) -> list[np.ndarray]:
        omega, mass = state.fields["omega"], state.fields["mass"]
        stages = [-self.evaluate(state).grad_phi]
        for i in range(1, n_stages):
            y = omega.copy()
            for j, a in enumerate(self.A[i][:i]):
                if a != 0.0:
                    y += (h * a) * stages[j]
            stages.append(self._velocity(y, mass))
        return stages

    @staticmethod
    def _combine(omega: np.ndarray, h: float, weights: tuple[float, ...], stages: list[np.ndarray]) -> np.ndarray:
        y = omega.copy()
        for w, k in zip(weights, stages):
            if w != 0.0:
                y += (h * w) * k
        return y

    def _quadrature(self, state: State, h: float, weights: tuple[float, ...], stages: list[np.ndarray]) -> float:
        """``h sum_i b_i I(Y_i)`` from the stages (the first stage's dissipation is the state's)."""
        mass = state.fields["mass"]
        local = [float(np.dot(mass, np.einsum("ik,ik->i", k, k))) for w, k in zip(weights[1:], stages[1:])]
        dissipation = (self.evaluate(state).dissipation,) + self.problem.comm.sum_over_ranks(*local)
        return h * sum(w * d for w, d in zip(weights, dissipation) if w != 0.0)

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        h = min(self.dt, dt_limit)
        stages = self._stages(state, h, len(self.b))
        omega = self._combine(state.fields["omega"], h, self.b, stages)
        return state.advanced({"omega": omega, "mass": state.fields["mass"]}, h,
                              dissipation_integral=self._quadrature(state, h, self.b, stages)), {}


@register
class Euler(ExplicitRK):
    """Explicit Euler: ``y_{n+1} = y_n + h f(y_n)``."""
    name = "euler"
    A = ((),)
    b = (1.0,)
    order = 1
    stability_bound = 2.0


@register
class Heun(ExplicitRK):
    """Heun's method (explicit trapezoid, RK2)."""
    name = "heun"
    A = ((), (1.0,))
    b = (0.5, 0.5)
    order = 2
    stages = 2
    stability_bound = 2.0


@register
class RK4(ExplicitRK):
    """The classical fourth-order Runge-Kutta method."""
    name = "rk4"
    A = ((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))
    b = (1 / 6, 1 / 3, 1 / 3, 1 / 6)
    order = 4
    stages = 4
    # the real root of 1 - x + x^2/2 - x^3/6 + x^4/24 = 1 besides 0 (|R(-x)| = 1 there)
    stability_bound = 2.785293563405282


@register
class DormandPrince(ExplicitRK):
    """Adaptive Dormand-Prince 5(4) with error control (see the module docstring)."""
    name = "adaptive"
    order = 5
    stages = 6  # new evaluations per accepted attempt (first-same-as-last)
    step_columns = ("rejected",)
    A = ((),
         (1 / 5,),
         (3 / 40, 9 / 40),
         (44 / 45, -56 / 15, 32 / 9),
         (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
         (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
         (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84))
    b = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
    # b - b_hat: the embedded fourth-order solution's difference, as in the published pair
    e = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)

    def __init__(self, problem: Problem, dt: float, *, rtol: float, atol: float, dt_min: float, dt_max: float,
                 max_growth: float) -> None:
        """``dt`` the first step; the error tolerances ``rtol``, ``atol``; the step within ``[dt_min, dt_max]``
        and growing by at most ``max_growth`` per step (``solver.*`` of the same names)."""
        super().__init__(problem, dt)
        self.rtol, self.atol, self.dt_min, self.dt_max = float(rtol), float(atol), float(dt_min), float(dt_max)
        self.max_growth = float(max_growth)

    @classmethod
    def controller(cls, cfg: Config) -> dict[str, float]:
        """The error controller's parameters in ``cfg.solver``."""
        s = cfg.solver
        return {"rtol": s.rtol, "atol": s.atol, "dt_min": s.dt_min, "dt_max": s.dt_max, "max_growth": s.max_growth}

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> DormandPrince:
        return cls(problem, cfg.solver.dt, **cls.controller(cfg))

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        omega, mass = state.fields["omega"], state.fields["mass"]
        dt = min(state.dt, self.dt_max)
        rejected = 0
        while True:
            h = min(dt, dt_limit)
            stages = self._stages(state, h, 6)
            y5 = self._combine(omega, h, self.b[:6], stages)
            new = state.advanced({"omega": y5, "mass": mass}, h)
            ev = self.evaluate(new)
            stages.append(-ev.grad_phi)
            err_vec = self._combine(np.zeros_like(omega), h, self.e, stages)
            scale = self.atol + self.rtol * np.maximum(np.abs(omega), np.abs(y5))
            # the rms over all particles of all ranks: every rank gets the same err and takes the same step
            squares, count = self.problem.comm.sum_over_ranks(float(np.sum((err_vec / scale) ** 2)), err_vec.size)
            err = math.sqrt(squares / count) if count else 0.0
            if not np.isfinite(err):
                err = np.inf
            factor = self.max_growth if err == 0.0 else min(self.max_growth, max(0.2, 0.9 * err ** -0.2))
            if err <= 1.0:
                # a step cut short by a frame time does not shrink the controller's proposal
                proposal = dt * factor if h >= dt else max(dt, h * factor)
                new.dt = float(np.clip(proposal, self.dt_min, self.dt_max))
                new.dissipation_integral = self._quadrature(state, h, self.b[:6], stages[:6])
                return new, {"rejected": float(rejected)}
            rejected += 1
            dt = h * max(0.2, factor)
            if dt < self.dt_min:
                raise SolverError(f"adaptive step size fell below solver.dt_min = {self.dt_min:g} at t = {state.t:.6g} "
                                  f"(error estimate {err:.3g}); loosen solver.rtol/atol or lower solver.dt_min")

    def likely_cause(self, state: State) -> str:
        return (f"the adaptive stepper's tolerances (solver.rtol = {self.rtol:g}, "
                f"solver.atol = {self.atol:g}) are too loose for this problem; tighten them")
