"""The step-size controller of the error-controlled steppers: an object of its own (as diffrax's ``PIDController``),
passed to a stepper when it is built for a run (:meth:`pdeflow.solvers.controller.AdaptiveStepper.from_config` builds
it from the ``[solver]`` tolerances and step bounds), every parameter of the rule on it.

With the error norm ``err = rms_i (e_i / (atol + rtol max(|y_i|, |y_new,i|)))`` (:meth:`StepSizeController.norm`) of
an attempt whose estimate is ``O(h^k)`` (``k = q + 1``, q the order of the solution the estimate measures, the
stepper's ``error_order``: the method supplies k), the next step is ``h factor``, the PI controller
(Hairer & Wanner II, IV.2)

    ``factor = safety err^(-alpha/k) err_prev^(beta/k)``   (``err <= 1`` and the previous accepted error known),
    ``factor = safety err^(-1/k)``                          (else: a rejection, the first step),

clipped to ``[shrink_floor, max_growth]`` (:meth:`StepSizeController.factor`; defaults 0.9, 0.7, 0.4, 0.2 and
``solver.max_growth``), and the step stays within ``[dt_min, dt_max]``. ``beta = 0`` is the elementary controller
``safety err^(-1/k)`` (:meth:`StepSizeController.elementary`, ``adaptive``'s and ``wfr``'s): it remembers nothing, so
nothing of it is carried from step to step or checkpointed (:attr:`StepSizeController.remembers`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepSizeController:
    """The error control of one run (module docstring): the tolerances ``rtol`` and ``atol``, the step bounds
    ``[dt_min, dt_max]``, the clip ``[shrink_floor, max_growth]`` of the factor per step, its ``safety`` factor,
    the PI exponents ``alpha`` and ``beta`` (times k) and ``memory_floor``, the least error an accepted step leaves
    for the next (an err of 0 would freeze the step size). ValueError (one line) for parameters outside their
    ranges."""
    rtol: float
    atol: float
    dt_min: float = 1e-10
    dt_max: float = math.inf
    max_growth: float = 5.0
    safety: float = 0.9
    shrink_floor: float = 0.2
    alpha: float = 0.7
    beta: float = 0.4
    memory_floor: float = 1e-4

    def __post_init__(self) -> None:
        checks = (("rtol", self.rtol >= 0), ("atol", self.atol >= 0 and self.atol + self.rtol > 0),
                  ("dt_min", self.dt_min > 0),
                  ("dt_max", self.dt_max > 0), ("max_growth", self.max_growth > 1), ("safety", 0 < self.safety <= 1),
                  ("shrink_floor", 0 < self.shrink_floor < 1), ("alpha", self.alpha > 0), ("beta", self.beta >= 0),
                  ("memory_floor", self.memory_floor > 0))
        for name, ok in checks:
            if not ok:
                raise ValueError(f"StepSizeController: {name} = {getattr(self, name)!r} is out of range")

    @classmethod
    def elementary(cls, **settings: float) -> StepSizeController:
        """The controller ``safety err^(-1/k)`` without memory (``beta = 0``), with ``settings`` (tolerances,
        bounds, clip)."""
        return cls(**{**settings, "alpha": 1.0, "beta": 0.0})

    @property
    def remembers(self) -> bool:
        """Whether the previous accepted step's error enters the factor (``beta > 0``): a stepper then carries it."""
        return self.beta > 0.0

    def norm(self, error: np.ndarray, y: np.ndarray, y_new: np.ndarray,
             sum_over_ranks: Callable[..., tuple[float, ...]]) -> float:
        """``rms(error / (atol + rtol max(|y|, |y_new|)))`` over all entries of all ranks (``sum_over_ranks``, the
        communicator's; every rank takes the same step); ``inf`` when not finite."""
        scale = self.atol + self.rtol * np.maximum(np.abs(y), np.abs(y_new))
        squares, count = sum_over_ranks(float(np.sum((error / scale) ** 2)), error.size)
        err = math.sqrt(squares / count) if count else 0.0
        return err if np.isfinite(err) else np.inf

    def factor(self, err: float, previous: float, k: int, max_growth: float | None = None) -> float:
        """The next step's size over this one's from the error norm ``err`` (<= 1 accepted) of an estimate
        ``~ h^k``: ``safety err^(-alpha/k) previous^(beta/k)`` when the controller :attr:`remembers` and the previous
        accepted step's error ``previous`` is known (finite, > 0) and ``err <= 1``, else ``safety err^(-1/k)``;
        clipped to ``[shrink_floor, max_growth]`` (``max_growth``: the controller's unless given; it when
        ``err = 0``)."""
        top = self.max_growth if max_growth is None else max_growth
        if err == 0.0:
            return top
        if self.remembers and math.isfinite(previous) and previous > 0.0 and err <= 1.0:
            factor = self.safety * err ** (-self.alpha / k) * previous ** (self.beta / k)
        else:
            factor = self.safety * err ** (-1.0 / k)
        return min(top, max(self.shrink_floor, factor))

    def remembered(self, err: float) -> float:
        """The error an accepted step leaves for the next step's PI term: at least :attr:`memory_floor`."""
        return max(err, self.memory_floor)

    def proposal(self, dt: float, h_taken: float, factor: float) -> float:
        """The next step after an accepted step of ``h_taken`` (``dt`` the controller's own proposal for it, the step
        asked ``min(dt, dt_limit)``): ``dt factor``; a step cut short (by a frame time, or by the method) does not
        shrink the proposal: ``max(dt, h_taken factor)``."""
        return dt * factor if h_taken >= dt else max(dt, h_taken * factor)

    def bounded(self, dt: float) -> float:
        """``dt`` within ``[dt_min, dt_max]``."""
        return float(np.clip(dt, self.dt_min, self.dt_max))


__all__ = ["StepSizeController"]
