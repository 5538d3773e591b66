"""The state a time stepper advances (:mod:`pdeflow.solvers`): the measure's arrays, the time, the step size to try
next, the step count and the generator of a random stepper.

It sits below the file formats so that a file's checkpoint converts to a state and back next to the format
(:mod:`pdeflow.io.resume`), and the steppers never see the file's types.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass
class State:
    """A point of a trajectory: ``fields`` (``omega`` [N, k] and ``mass`` [N] for particles, ``density`` for a
    grid), time ``t``, ``step`` count, next step size ``dt`` and generator ``rng`` (random steppers).
    ``carry`` is the solver state: what the step that produced this state hands to the step from it, by name (the
    PI controller's memory, rkc's spectral radius, rosenbrock's eigenpairs: the stepper's
    :attr:`~pdeflow.solvers.base.Stepper.carried`, checkpointed by name; empty: the step starts afresh). The step
    takes it in with the state and returns the new state with its own, so nothing of it lives on the stepper.
    ``evaluation`` caches the Problem evaluation at this state (not saved); ``dissipation_integral`` is the
    stepper's own quadrature of the dissipation over the step that led here (None: the accuracy record takes the
    stepper's rule, :meth:`pdeflow.solvers.base.Stepper.dissipation_integral`)."""
    t: float
    step: int
    dt: float
    fields: dict[str, np.ndarray]
    rng: np.random.Generator | None = None
    carry: dict[str, Any] = field(default_factory=dict, repr=False)
    evaluation: Any = field(default=None, repr=False)
    dissipation_integral: float | None = field(default=None, repr=False)

    def advanced(self, fields: dict[str, np.ndarray], h: float, **changes: Any) -> State:
        """The state after a step of length h with new fields (caches cleared, an empty carry for the step to
        fill)."""
        changes.setdefault("dissipation_integral", None)
        changes.setdefault("carry", {})
        return replace(self, t=self.t + h, step=self.step + 1, fields=fields, evaluation=None, **changes)


def rng_state(rng: np.random.Generator | None) -> dict | None:
    """The generator's bit-generator state as plain JSON-able data (no pickle)."""
    return None if rng is None else rng.bit_generator.state


def rng_from_state(state: dict | None) -> np.random.Generator | None:
    """Inverse of :func:`rng_state`."""
    if state is None:
        return None
    bit_gen = getattr(np.random, state["bit_generator"])()
    bit_gen.state = state
    return np.random.Generator(bit_gen)


__all__ = ["State", "rng_state", "rng_from_state"]
