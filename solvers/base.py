"""What every time stepper shares: the state it advances and the interface the driver calls.

A stepper advances a measure ``rho_t`` of the flow ``d/dt rho = div(rho grad Phi) (+ (1/beta) Laplace rho)``
(docs/model.md). Its :class:`State` carries the measure's arrays (``fields``: ``omega`` [N,k] and ``mass`` [N]
for particles, ``density`` for a grid), the time, the step size to try next, the step count and, for
random steppers, the generator. The driver (:mod:`pdeflow.solvers.driver`) owns the loop, frames and files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from pdeflow.config import Config
from pdeflow.problem import Evaluation, Problem
from pdeflow.trajectory import Checkpoint


class SolverError(RuntimeError):
    """A step could not be completed (a failed inner solve, a step size below its floor, ...)."""


@dataclass
class State:
    """A point of a trajectory. ``evaluation`` caches the Problem evaluation at this state (not saved);
    ``dissipation_integral`` is the stepper's own quadrature of the dissipation over the step that led here
    (None: the driver takes the trapezoid, :meth:`Stepper.dissipation_integral`)."""
    t: float
    step: int
    dt: float
    fields: dict[str, np.ndarray]
    rng: np.random.Generator | None = None
    evaluation: Any = field(default=None, repr=False)
    dissipation_integral: float | None = field(default=None, repr=False)

    def advanced(self, fields: dict[str, np.ndarray], h: float, **changes: Any) -> State:
        """The state after a step of length h with new fields (caches cleared)."""
        changes.setdefault("dissipation_integral", None)
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


class Stepper:
    """Base class: a particle measure evolving under the velocity ``-grad Phi(omega_i; rho_N)``.

    Subclasses set ``name`` and implement :meth:`step`; grid steppers override :meth:`initial_state`,
    :meth:`evaluate` and :meth:`frame_attrs`.

    Accuracy checks (:mod:`pdeflow.solvers.accuracy`): any stepper whose :meth:`diagnostics` give the ``energy`` and
    ``dissipation`` of its flow gets the energy-identity check with no code of its own (set
    :attr:`energy_identity` False where the identity does not hold); a fixed-step explicit method declares
    its real-axis :attr:`stability_bound` to get the ``lambda_max * dt`` check.
    """
    name: ClassVar[str] = ""
    measure: ClassVar[str] = "particles"
    step_columns: ClassVar[tuple[str, ...]] = ()
    extra_size: ClassVar[int] = 0
    # True when a step needs of the other ranks' particles only what Problem sums over ranks (the aggregate
    # output, confinement, dissipation) and sum_over_ranks: the stepper runs split across MPI ranks
    sharded: ClassVar[bool] = False
    # the real-axis stability bound of lambda_max * dt of a fixed-step explicit method (nan: none applies)
    stability_bound: ClassVar[float] = math.nan
    # gradient evaluations per step (sets the spacing of the stability checks)
    stages: ClassVar[int] = 1
    # the quadrature of int I dt over a step when the step leaves none of its own: "trapezoid", or "right"
    # (h I_new, the quadrature implicit Euler and minimizing movements carry: their defect stays below 1)
    quadrature: ClassVar[str] = "trapezoid"

    def __init__(self, problem: Problem, cfg: Config) -> None:
        self.problem = problem
        self.cfg = cfg

    # ---- state --------------------------------------------------------------------------------
    def initial_state(self) -> State:
        omega, mass = self.problem.initial_measure(self.cfg)
        return State(t=0.0, step=0, dt=self.cfg.solver.dt, fields={"omega": omega, "mass": mass})

    def frame_attrs(self) -> dict[str, Any]:
        """Attributes of ``/frames`` describing the measure (a grid's box and shape)."""
        return {}

    def extra_state(self, state: State) -> np.ndarray:
        """Controller state beyond ``State`` that a checkpoint must keep (length ``extra_size``)."""
        return np.zeros(self.extra_size)

    def checkpoint(self, state: State, n_frames: int, n_steps: int) -> Checkpoint:
        return Checkpoint(fields={k: np.array(v) for k, v in state.fields.items()}, t=state.t, dt=state.dt,
                          step=state.step, n_frames=n_frames, n_steps=n_steps, rng=rng_state(state.rng),
                          extra=self.extra_state(state))

    def restore(self, ck: Checkpoint) -> State:
        """The state a checkpoint holds (subclasses read ``ck.extra`` for their controller)."""
        return State(t=ck.t, step=ck.step, dt=ck.dt, fields=dict(ck.fields), rng=rng_from_state(ck.rng))

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, state: State) -> Evaluation:
        """The Problem evaluation at the state's particles, cached on the state."""
        if state.evaluation is None:
            state.evaluation = self.problem.evaluate(state.fields["omega"], state.fields["mass"])
        return state.evaluation

    def diagnostics(self, state: State) -> dict[str, float]:
        """``energy``, ``risk`` and ``dissipation`` (the integral of |grad Phi|^2 d rho) at a state."""
        ev = self.evaluate(state)
        return {"energy": ev.energy, "risk": ev.risk, "dissipation": ev.dissipation}

    @property
    def energy_identity(self) -> bool:
        """Whether ``dE/dt = -dissipation`` holds for the recorded energy: not for particles with finite
        ``model.beta`` (their energy lacks the entropy term; :meth:`identity_note` says so)."""
        return self.measure != "particles" or not math.isfinite(self.problem.beta)

    def identity_note(self) -> str:
        """Why :attr:`energy_identity` is False, in one phrase."""
        return ("particles with finite model.beta: the recorded energy lacks the entropy term, so dE/dt = -I "
                "does not hold for it")

    def dissipation_integral(self, old: State, new: State, old_diag: dict[str, float],
                             new_diag: dict[str, float]) -> float:
        """``int I dt`` over the step ``old -> new``: the stepper's own quadrature when its step left one on
        the new state (``State.dissipation_integral``), else :attr:`quadrature`: the trapezoid
        ``h (I_old + I_new) / 2`` or the right rectangle ``h I_new``."""
        if new.dissipation_integral is not None:
            return new.dissipation_integral
        h = new.t - old.t
        if self.quadrature == "right":
            return h * new_diag["dissipation"]
        return 0.5 * h * (old_diag["dissipation"] + new_diag["dissipation"])

    def is_finite(self, state: State) -> bool:
        return all(bool(np.all(np.isfinite(v))) for v in state.fields.values())

    # ---- stepping -----------------------------------------------------------------------------
    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        """Advance by at most ``dt_limit``; return the new state and the stepper's /steps columns."""
        raise NotImplementedError

    def likely_cause(self, state: State) -> str:
        """What most likely made the state non-finite, named with the config key to change."""
        return (f"solver.dt = {self.cfg.solver.dt:g} is likely above the stability limit of this problem; "
                f"reduce solver.dt or use solver.method = 'adaptive'")
