"""The one adaptive step: error norm, acceptance, rejection and the next step size, around a method's stages.

An adaptive method (``adaptive``, ``wfr``, ``rkc``, ``rosenbrock``, ...) subclasses :class:`AdaptiveStepper` and
supplies only its attempt (in the manner of scipy's ``OdeSolver.step`` around ``_step_impl``):
:meth:`AdaptiveStepper._step_impl` takes a step of size ``h`` from the state and returns the proposed state, the step
it took (a method may cut it, to a stability bound say) and the error norm of its local error estimate ``e``,
written with :meth:`AdaptiveStepper.error_norm`:

    ``err = rms_i (e_i / (atol + rtol max(|y_i|, |y_new,i|)))``, over all entries of all MPI ranks.

The controller accepts a step with ``err <= 1``; the next step is this one times the factor of the
:class:`~pdeflow.solvers.step_size.StepSizeController` the stepper was given (:attr:`AdaptiveStepper.controller`,
passed in when it is built for a run: the PI controller, with the previous accepted step's ``err`` when it
remembers, its exponent from the estimate's order), within ``[solver.dt_min, solver.dt_max]``. A rejected step is
retried at ``h factor``; below ``solver.dt_min`` the step fails (:class:`~pdeflow.solvers.base.SolverError`). A
stage that cannot be computed (an inner solve that misses its tolerance) raises :class:`StageFailed`: the step is
retried at :data:`FAILED_STAGE_SHRINK` of its size. A step cut short by a frame time does not shrink the controller's
proposal.

What one step hands the next is the state's carry (:attr:`pdeflow.core.state.State.carry`: the controller's memory
``err`` and the method's own), read from the state the step is given and left on the state it returns; what one
step works out for its attempts is its ``plan``, a value the hooks pass along, never kept on the stepper. Hooks:
:meth:`~AdaptiveStepper._begin_step` (what a step computes once, whatever its attempts: the plan),
:meth:`~AdaptiveStepper._accept_step` (what an accepted step leaves: quadrature, carry, its /steps columns),
:meth:`~AdaptiveStepper._reject_step` (what a rejection renews) and :meth:`~AdaptiveStepper._proposal`. A
stepper that declares the /steps column ``jvps`` gets the step's Jacobian-vector products there, counted by the
Problem.
"""
from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from pdeflow.core.config import Config
from pdeflow.core.problem import Problem

from .base import Carried, SolverError, State, Stepper
from .parameters import Param
from .step_size import StepSizeController

# the [solver] keys of the controller, read by every adaptive method
RTOL = Param("rtol", float, 1e-6, "relative tolerance", gt=0)
ATOL = Param("atol", float, 1e-9, "absolute tolerance", gt=0)
DT_MIN = Param("dt_min", float, 1e-10, "smallest allowed step", gt=0)
DT_MAX = Param("dt_max", float, math.inf, "largest allowed step", gt=0)
MAX_GROWTH = Param("max_growth", float, 5.0, "largest step growth factor per step", gt=1)
CONTROLLER_PARAMS = (RTOL, ATOL, DT_MIN, DT_MAX, MAX_GROWTH)
# a failed stage solve retries the step at this fraction of its size
FAILED_STAGE_SHRINK = 0.25


class StageFailed(Exception):
    """A stage of an attempted step could not be computed (an inner solve missed its tolerance): the controller
    retries the step at :data:`FAILED_STAGE_SHRINK` of its size (the message says what failed)."""


class AdaptiveStepper(Stepper):
    """A stepper with error control (module docstring). Subclasses set :attr:`order` (of the solution they advance)
    and :attr:`error_order` ``q`` (of the solution their estimate measures: the estimate is ``O(h^(q+1))``, the
    controller's exponent ``1 / k``, :attr:`exponent`); they implement :meth:`_step_impl` and may override the hooks
    and :meth:`default_controller`."""
    # the order p of the solution y_{n+1} the method advances
    order: ClassVar[int]
    # the order q of the solution whose local error the estimate measures: err ~ h^(q+1) (q = p - 1 for a pair that
    # advances its higher-order solution, q = p when the estimate measures the error of y_{n+1} itself, as rkc's)
    error_order: ClassVar[int]
    params = CONTROLLER_PARAMS
    required = ("from_config", "order", "error_order", "_step_impl")
    # what to change when a stage fails, for the message of a failed step (a method raising StageFailed sets it)
    failure_fix: ClassVar[str] = "loosen solver.rtol/atol"
    # the PI controller's memory: the error of the accepted step that produced the state (a controller that
    # remembers it)
    carried = (Carried("err", when=lambda stepper: stepper.controller.remembers),)

    def __init__(self, problem: Problem, dt: float, *, controller: StepSizeController) -> None:
        """``dt`` the first step; ``controller`` the step-size rule, tolerances and bounds of the run
        (:class:`~pdeflow.solvers.step_size.StepSizeController`; :meth:`default_controller` builds the method's from
        the ``solver.*`` keys)."""
        Stepper.__init__(self, problem)
        self.dt = float(dt)
        self.controller = controller

    @classmethod
    def default_controller(cls, *, rtol: float, atol: float, dt_min: float, dt_max: float,
                           max_growth: float) -> StepSizeController:
        """The method's controller for the ``solver.*`` keys of the same names: the PI controller."""
        return StepSizeController(rtol=float(rtol), atol=float(atol), dt_min=float(dt_min), dt_max=float(dt_max),
                                  max_growth=float(max_growth))

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> AdaptiveStepper:
        """The stepper from ``solver.dt``, its controller from the controller's keys (:meth:`default_controller`) and
        the other keys it declares (:attr:`params`), passed to ``__init__`` by name."""
        keys = cls.key_values(cfg)
        controller = cls.default_controller(**{p.name: keys.pop(p.name) for p in CONTROLLER_PARAMS})
        return cls(problem, cfg.solver.dt, controller=controller, **keys)

    # the controller's settings, read where a message names them
    rtol = property(lambda self: self.controller.rtol, doc="``solver.rtol``")
    atol = property(lambda self: self.controller.atol, doc="``solver.atol``")
    dt_min = property(lambda self: self.controller.dt_min, doc="``solver.dt_min``")
    dt_max = property(lambda self: self.controller.dt_max, doc="``solver.dt_max``")
    max_growth = property(lambda self: self.controller.max_growth, doc="``solver.max_growth``")

    @property
    def exponent(self) -> int:
        """``k = q + 1``, the power of h in the error estimate (``err ~ h^k``): the factor goes like
        ``err^(-1/k)``."""
        return self.error_order + 1

    # ---- the error norm and the controller's memory --------------------------------------------------------------
    def error_norm(self, error: np.ndarray, y: np.ndarray, y_new: np.ndarray) -> float:
        """``rms(error / (atol + rtol max(|y|, |y_new|)))`` over all entries of all ranks (every rank takes the
        same step); ``inf`` when not finite."""
        return self.controller.norm(error, y, y_new, self.problem.comm.sum_over_ranks)

    def previous_error(self, state: State) -> float:
        """The error of the accepted step that produced ``state``, from its carry (nan: not known, or a controller
        without memory)."""
        err = state.carry.get("err") if self.controller.remembers else None
        return math.nan if err is None else err

    # ---- the step ------------------------------------------------------------------------------------------------
    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        """Attempts of :meth:`_step_impl` from ``state`` until one is accepted (module docstring)."""
        mark = self.problem.mark()
        columns = {"rejected": 0.0}
        plan = self._begin_step(state, columns)
        previous = self.previous_error(state)
        dt = min(state.dt, self.dt_max)
        while True:
            h = min(dt, dt_limit)
            try:
                new, h_taken, err = self._step_impl(state, h, plan, columns)
            except StageFailed as exc:
                columns["failed_solves"] = columns.get("failed_solves", 0.0) + 1
                dt = FAILED_STAGE_SHRINK * h
                if dt < self.dt_min:
                    raise SolverError(f"a stage solve failed ({exc}) and the step fell below solver.dt_min = "
                                      f"{self.dt_min:g} at t = {state.t:.6g}; {self.failure_fix}") from None
                continue
            factor = self.controller.factor(err, previous if columns["rejected"] == 0 else math.nan, self.exponent)
            if err <= 1.0:
                new.dt = self.controller.bounded(self._proposal(dt, h, h_taken, err, factor))
                if self.controller.remembers:
                    new.carry["err"] = self.controller.remembered(err)
                columns = self._accept_step(state, new, h_taken, plan, columns)
                if "jvps" in self.step_columns:
                    columns["jvps"] = float(self.problem.products_since(mark))
                return new, columns
            columns["rejected"] += 1
            dt = h_taken * factor
            if dt < self.dt_min:
                raise SolverError(f"{self.name} step size fell below solver.dt_min = {self.dt_min:g} at "
                                  f"t = {state.t:.6g} (error estimate {err:.3g}); loosen solver.rtol/atol or lower "
                                  f"solver.dt_min")
            self._reject_step(state, plan, columns)

    def _proposal(self, dt: float, h: float, h_taken: float, err: float, factor: float) -> float:
        """The next step after an accepted step of ``h_taken`` (asked: ``h = min(dt, dt_limit)``, ``dt`` the
        controller's own): ``dt factor``; a step cut short (by a frame time, or by the method) does not shrink the
        controller's proposal: ``max(dt, h_taken factor)`` (:meth:`StepSizeController.proposal
        <pdeflow.solvers.step_size.StepSizeController.proposal>`)."""
        return self.controller.proposal(dt, h_taken, factor)

    def likely_cause(self, state: State) -> str:
        return (f"the {self.name} stepper's tolerances (solver.rtol = {self.rtol:g}, solver.atol = {self.atol:g}) "
                f"are too loose for this problem; tighten them")

    # ---- what a method supplies ------------------------------------------------------------------------------------
    def _begin_step(self, state: State, columns: dict[str, float]) -> Any:
        """Work a step does once before its attempts, from ``state`` and its carry: the step's plan, handed to the
        other hooks (None: nothing); may set the step's /steps ``columns``."""
        return None

    @abc.abstractmethod
    def _step_impl(self, state: State, h: float, plan: Any, columns: dict[str, float]) -> tuple[State, float, float]:
        """One attempt of size at most ``h`` from ``state`` with the step's ``plan``: ``(new state, the step taken,
        its error norm)`` (:meth:`error_norm`); may raise :class:`StageFailed`."""

    def _accept_step(self, state: State, new: State, h: float, plan: Any,
                     columns: dict[str, float]) -> dict[str, float]:
        """Completes the accepted step ``state -> new`` (its quadrature, ``new.carry``); returns its /steps
        columns."""
        return columns

    def _reject_step(self, state: State, plan: Any, columns: dict[str, float]) -> None:
        """Called after a rejected attempt, before the next (a method renews in ``plan`` what the rejection put in
        doubt)."""


__all__ = ["AdaptiveStepper", "StageFailed", "CONTROLLER_PARAMS", "RTOL", "ATOL", "DT_MIN", "DT_MAX", "MAX_GROWTH",
           "FAILED_STAGE_SHRINK"]
