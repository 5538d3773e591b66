"""Explicit Runge-Kutta steppers for particle and weighted-particle measures.

The particle system of docs/model.md, ``d omega_i/dt = -grad Phi(omega_i; rho_N)`` with the masses fixed, is an
ODE ``y' = f(y)`` in ``y = omega`` [N, k]; every stage evaluates the velocity at all particles at once.
``euler``, ``heun``, ``rk4`` (orders 1, 2, 4) take the fixed step ``solver.dt``; ``adaptive`` is the Dormand-Prince
5(4) pair with first-same-as-last reuse (:class:`EmbeddedRK`, any such pair as tableau data), its error control that of
:mod:`pdeflow.solvers.controller`. A method is its tableau (``A``, ``b``, ``c``, ``order``; a pair adds ``e = b -
b_hat``, ``error_order`` and ``fsal``), checked when its class is defined (:mod:`pdeflow.solvers.tableau`: row sums,
the order conditions of b and b_hat, first-same-as-last): a tableau that fails what it declares is a
:class:`~pdeflow.solvers.tableau.TableauError` there, and ``stages`` (new gradient evaluations per step) is derived
from it. Each step leaves on the new state its quadrature of the dissipation, ``Q = h sum_i b_i I(Y_i)``
(:mod:`pdeflow.solvers.accuracy`); fixed-step methods declare their real-axis stability bound (2, 2, 2.7853).
Details: docs/solvers.md, "Particles: euler, heun, rk4, adaptive".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pdeflow.core.config import Config
from pdeflow.core.problem import Problem

from .base import State, Stepper
from .controller import AdaptiveStepper
from .step_size import StepSizeController
from .tableau import TableauError, check


class ExplicitRK(Stepper):
    """A fixed-step explicit Runge-Kutta method given by its Butcher tableau: ``A`` (its rows, row i the i entries
    left of the diagonal), ``b``, ``c`` and the ``order`` b has; ``fsal`` True when the last row of ``A`` is ``b``
    (first-same-as-last: the last stage is ``f(y_{n+1})``, the next step's first). A class that declares a tableau
    has it checked when defined (:func:`pdeflow.solvers.tableau.check`; :class:`~pdeflow.solvers.tableau.TableauError`
    naming the method and the failed condition) and gets ``stages``, its new gradient evaluations per step, from it:
    ``s``, less one with ``fsal``."""
    sharded = True
    explicit_flow = True
    A: ClassVar[tuple[tuple[float, ...], ...]] = ()
    b: ClassVar[tuple[float, ...]] = ()
    c: ClassVar[tuple[float, ...]] = ()
    order: ClassVar[int] = 1
    fsal: ClassVar[bool] = False
    # a pair's embedded weights' difference e = b - b_hat (EmbeddedRK, with its error_order)
    embedded: ClassVar[bool] = False
    e: ClassVar[tuple[float, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check the tableau a class declares, and derive ``stages`` from it, before the class registers
        (:meth:`Stepper.__init_subclass__ <pdeflow.solvers.base.Stepper.__init_subclass__>`)."""
        if cls.b:
            what = f"{cls.__name__}" + (f" (solver.method = {cls.name!r})" if cls.__dict__.get("name") else "")
            if "stages" in cls.__dict__:
                raise TableauError(f"tableau of {what}: stages is derived from the tableau, not declared")
            failed = check(cls.A, cls.b, cls.c, cls.order, fsal=cls.fsal, e=cls.e,
                           error_order=getattr(cls, "error_order", 0))
            if cls.embedded and not cls.e:
                failed = "an embedded pair declares e = b - b_hat"
            if failed:
                raise TableauError(f"tableau of {what}: {failed}")
            cls.stages = len(cls.b) - (1 if cls.fsal else 0)
        super().__init_subclass__(**kwargs)

    def __init__(self, problem: Problem, dt: float) -> None:
        """``dt``: the step (``solver.dt``)."""
        super().__init__(problem)
        self.dt = float(dt)

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> ExplicitRK:
        return cls(problem, dt=cfg.solver.dt)

    def _velocity(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """The stage derivative ``dy/dt`` at ``y``: the velocity ``-grad Phi`` of the particles at ``omega``."""
        return self.problem.velocity(omega, mass)

    def _solution(self, state: State) -> np.ndarray:
        """The vector ``y`` the method integrates at a state: the positions ``omega`` [N, k]."""
        return state.fields["omega"]

    def _rate_at(self, state: State) -> np.ndarray:
        """``dy/dt`` at a state, from its (cached) evaluation: the first stage (and an FSAL pair's last)."""
        return -self.evaluate(state).grad_phi

    def _fields(self, y: np.ndarray, state: State) -> dict[str, np.ndarray]:
        """The measure's fields at ``y`` (the masses of ``state``)."""
        return {"omega": y, "mass": state.fields["mass"]}

    def _stages(self, state: State, h: float, n_stages: int) -> list[np.ndarray]:
        omega, mass = self._solution(state), state.fields["mass"]
        stages = [self._rate_at(state)]
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


class Euler(ExplicitRK):
    """Explicit Euler: ``y_{n+1} = y_n + h f(y_n)``."""
    name = "euler"
    summary = "explicit Euler, fixed step `solver.dt`, order 1, stability-checked"
    use_when = "a fixed, reproducible step sequence (order studies, comparisons with other codes)"
    A = ((),)
    b = (1.0,)
    c = (0.0,)
    order = 1
    stability_bound = 2.0


class Heun(ExplicitRK):
    """Heun's method (explicit trapezoid, RK2)."""
    name = "heun"
    summary = "Heun's method, fixed step `solver.dt`, order 2, stability-checked"
    use_when = "a fixed, reproducible step sequence (order studies, comparisons with other codes)"
    A = ((), (1.0,))
    b = (0.5, 0.5)
    c = (0.0, 1.0)
    order = 2
    stability_bound = 2.0


class RK4(ExplicitRK):
    """The classical fourth-order Runge-Kutta method."""
    name = "rk4"
    summary = "classical Runge-Kutta, fixed step `solver.dt`, order 4, stability-checked"
    use_when = "a fixed, reproducible step sequence (convergence studies, comparisons with other codes)"
    A = ((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))
    b = (1 / 6, 1 / 3, 1 / 3, 1 / 6)
    c = (0.0, 0.5, 0.5, 1.0)
    order = 4
    # the real root of 1 - x + x^2/2 - x^3/6 + x^4/24 = 1 besides 0 (|R(-x)| = 1 there)
    stability_bound = 2.785293563405282


@dataclass
class _Stages:
    """The plan of one step of an embedded pair: the stages of its latest attempt (the accepted one's give the
    step's quadrature)."""
    stages: list[np.ndarray] = field(default_factory=list)


class EmbeddedRK(AdaptiveStepper, ExplicitRK):
    """An embedded explicit Runge-Kutta pair, given by its tableau: ``A``, ``b``, ``c``, ``e = b - b_hat`` (the
    embedded solution's difference), ``order`` (of b) and ``error_order`` (of b_hat), all checked when the class is
    defined (:class:`ExplicitRK`); error control by :class:`~pdeflow.solvers.controller.AdaptiveStepper` with the
    estimate's order :attr:`error_order`. With first-same-as-last reuse (``fsal``: the last row of ``A`` is ``b``)
    the last stage is the rate at the new state, which is also the next step's first.

    The integrated vector ``y`` is the particles' positions with velocity ``-grad Phi``; a flow of more variables
    (wfr: ``(omega, m)``) overrides :meth:`_solution`, :meth:`_rate_at`, :meth:`_velocity` and :meth:`_fields`."""
    step_columns = ("rejected",)
    embedded = True

    def _begin_step(self, state: State, columns: dict[str, float]) -> _Stages:
        return _Stages()

    def _step_impl(self, state: State, h: float, plan: _Stages, columns: dict[str, float]) -> tuple[State, float,
                                                                                                  float]:
        y = self._solution(state)
        n = len(self.b) - 1 if self.fsal else len(self.b)  # the stages before the new state's rate
        stages = self._stages(state, h, n)
        y_new = self._combine(y, h, self.b[:n], stages)
        new = state.advanced(self._fields(y_new, state), h)
        if self.fsal:
            stages.append(self._rate_at(new))
        plan.stages = stages
        return new, h, self.error_norm(self._combine(np.zeros_like(y), h, self.e, stages), y, y_new)

    def _accept_step(self, state: State, new: State, h: float, plan: _Stages,
                     columns: dict[str, float]) -> dict[str, float]:
        n = len(self.b) - 1 if self.fsal else len(self.b)
        new.dissipation_integral = self._quadrature(state, h, self.b[:n], plan.stages[:n])
        return columns


class DormandPrince(EmbeddedRK):
    """Adaptive Dormand-Prince 5(4) with error control (see the module docstring). Its step size follows the
    elementary controller ``0.9 err^(-1/5)`` (no PI memory), as it always has, so that its results stay those of the
    reference runs."""
    name = "adaptive"
    summary = "Dormand-Prince 5(4) with error control (`solver.rtol`, `solver.atol`)"
    use_when = "the particle flow accurately without tuning a step, while the step is set by accuracy, not stability"
    order = 5
    error_order = 4  # the embedded fourth-order solution's error: err ~ h^5
    fsal = True
    A = ((),
         (1 / 5,),
         (3 / 40, 9 / 40),
         (44 / 45, -56 / 15, 32 / 9),
         (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
         (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
         (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84))
    b = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
    c = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
    # b - b_hat: the embedded fourth-order solution's difference, as in the published pair
    e = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)

    @classmethod
    def default_controller(cls, **settings: float) -> StepSizeController:
        """The elementary controller ``0.9 err^(-1/5)`` (class docstring)."""
        return StepSizeController.elementary(**{key: float(value) for key, value in settings.items()})

    def likely_cause(self, state: State) -> str:
        return (f"the adaptive stepper's tolerances (solver.rtol = {self.rtol:g}, "
                f"solver.atol = {self.atol:g}) are too loose for this problem; tighten them")
