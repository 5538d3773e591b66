"""The step-size controller of the error-controlled steppers: an object of its own (as diffrax's ``PIDController``),
built by :class:`pdeflow.solvers.controller.AdaptiveStepper` from the method's declared orders and the ``[solver]``
tolerances and step bounds.

It holds the order p of the solution the method advances (:attr:`StepSizeController.order`) apart from the order q of
the solution its local error estimate measures (:attr:`StepSizeController.error_order`, scipy's
``error_estimator_order``): the estimate is ``O(h^(q+1))``, so the step-size exponent is ``1 / k``, ``k = q + 1``
(:attr:`StepSizeController.exponent`, the one place it is formed). For an embedded pair that advances its
higher-order solution ``q = p - 1``; rkc's estimate measures the error of ``y_{n+1}`` itself, ``O(h^3)`` for a
method of order 2, so ``q = p = 2`` and its exponent is 1/3, not the 1/2 of its order.

With the error norm ``err = rms_i (e_i / (atol + rtol max(|y_i|, |y_new,i|)))`` (:meth:`StepSizeController.norm`) of
an attempt, the next step is ``h factor``, the PI controller (Hairer & Wanner II, IV.2)

    ``factor = 0.9 err^(-0.7/k) err_prev^(0.4/k)``   (``err <= 1`` and the previous accepted error known),
    ``factor = 0.9 err^(-1/k)``                         (else: a rejection, the first step, or no PI memory),

clipped to ``[0.2, max_growth]`` (:func:`pi_factor`), and the step stays within ``[dt_min, dt_max]``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# the PI controller's exponents times k (Hairer & Wanner II, IV.2: 0.7 / k and 0.4 / k), the factor's safety and its
# lower clip
PI_ALPHA, PI_BETA, SAFETY_FACTOR, SHRINK_FLOOR = 0.7, 0.4, 0.9, 0.2
# the PI controller's memory of an accepted step's error is at least this (an err of 0 would freeze the step size)
ERROR_MEMORY_FLOOR = 1e-4


def pi_factor(err: float, previous: float, k: int, max_growth: float) -> float:
    """The next step's size over this one's from the error norm ``err`` (<= 1 accepted) of an estimate ``~ h^k``: the
    PI controller ``0.9 err^(-0.7/k) previous^(0.4/k)`` when the previous accepted step's error ``previous`` is known
    (finite, > 0) and ``err <= 1``, else ``0.9 err^(-1/k)``; clipped to ``[0.2, max_growth]`` (``max_growth`` when
    ``err = 0``)."""
    if err == 0.0:
        return max_growth
    if math.isfinite(previous) and previous > 0.0 and err <= 1.0:
        factor = SAFETY_FACTOR * err ** (-PI_ALPHA / k) * previous ** (PI_BETA / k)
    else:
        factor = SAFETY_FACTOR * err ** (-1.0 / k)
    return min(max_growth, max(SHRINK_FLOOR, factor))


@dataclass(frozen=True)
class StepSizeController:
    """The error control of one stepper (module docstring): the method's ``order`` p and its estimate's
    ``error_order`` q, the tolerances ``rtol`` and ``atol``, the step bounds ``[dt_min, dt_max]``, the growth limit
    ``max_growth`` per step, and ``pi``: whether the previous accepted step's error enters the factor."""
    order: int
    error_order: int
    rtol: float
    atol: float
    dt_min: float
    dt_max: float
    max_growth: float
    pi: bool = True

    @property
    def exponent(self) -> int:
        """``k = q + 1``, the power of h in the error estimate (``err ~ h^k``): the factor goes like ``err^(-1/k)``."""
        return self.error_order + 1

    def norm(self, error: np.ndarray, y: np.ndarray, y_new: np.ndarray,
             sum_over_ranks: Callable[..., tuple[float, ...]]) -> float:
        """``rms(error / (atol + rtol max(|y|, |y_new|)))`` over all entries of all ranks (``sum_over_ranks``, the
        communicator's; every rank takes the same step); ``inf`` when not finite."""
        scale = self.atol + self.rtol * np.maximum(np.abs(y), np.abs(y_new))
        squares, count = sum_over_ranks(float(np.sum((error / scale) ** 2)), error.size)
        err = math.sqrt(squares / count) if count else 0.0
        return err if np.isfinite(err) else np.inf

    def factor(self, err: float, previous: float = math.nan, max_growth: float | None = None) -> float:
        """:func:`pi_factor` with this controller's exponent; ``previous`` ignored without :attr:`pi`;
        ``max_growth`` (default: the controller's) the upper clip."""
        return pi_factor(err, previous if self.pi else math.nan, self.exponent,
                         self.max_growth if max_growth is None else max_growth)

    def remembered(self, err: float) -> float:
        """The error an accepted step leaves for the next step's PI term: at least :data:`ERROR_MEMORY_FLOOR`."""
        return max(err, ERROR_MEMORY_FLOOR)

    def proposal(self, dt: float, h_taken: float, factor: float) -> float:
        """The next step after an accepted step of ``h_taken`` (``dt`` the controller's own proposal for it, the step
        asked ``min(dt, dt_limit)``): ``dt factor``; a step cut short (by a frame time, or by the method) does not
        shrink the proposal: ``max(dt, h_taken factor)``."""
        return dt * factor if h_taken >= dt else max(dt, h_taken * factor)

    def bounded(self, dt: float) -> float:
        """``dt`` within ``[dt_min, dt_max]``."""
        return float(np.clip(dt, self.dt_min, self.dt_max))


__all__ = ["StepSizeController", "pi_factor", "PI_ALPHA", "PI_BETA", "SAFETY_FACTOR", "SHRINK_FLOOR",
           "ERROR_MEMORY_FLOOR"]
