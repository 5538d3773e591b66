"""The one time loop: a stepper advanced through a list of target times, with observers hanging on it.

:class:`Loop` steps a :class:`~pdeflow.solvers.base.Stepper` from a state through increasing target times
(the frames of a run, the sample times of an experiment). Its rules, the same for every caller
(:func:`pdeflow.solvers.driver.run`, :mod:`pdeflow.analysis.finite_heads.chaos`,
:mod:`pdeflow.analysis.dirac.stability`):

- **Landing.** Each step is asked for at most the time left to the next target (``stepper.step(state,
  target - t)``: steps are shortened to land on it); a step that ends within :func:`pdeflow.core.clock.same_time` of
  the target ends exactly on it (:func:`pdeflow.core.clock.landed`). A target is reached when ``t >= target``; targets
  at or before the start are passed over, except a target at the start itself with ``include_start``.
- **Stops.** Every stop ends the loop with a :class:`Stop` (status and one-line message): ``finished`` (the
  last target reached), ``non_finite`` (a step left a non-finite state, or non-finite diagnostics: the state
  before it is kept), ``error`` (the stepper raised :class:`~pdeflow.solvers.base.SolverError`), or whatever an
  observer returns (``max_steps``, ``wall_time``, ``stationary`` by :class:`MaxSteps`, :class:`WallTime`,
  :class:`Stationary`; the driver's accuracy stop).
- **Observers** (:class:`Observer`): ``check(state)`` before each step (may stop), ``assess(step)`` right after
  the step is computed (inside the same numpy error state, so a bad step is still a stop, not a traceback),
  ``accept(step)`` once the step is taken (its ``frame`` index set when it reached a target; may stop),
  ``finish(state)`` after the last target (may turn ``finished`` into another stop). Observers are called in
  the order given; ``accept`` calls run inside ``guard()`` (the driver holds back signals there, so the state and
  its file always agree).
- With ``measure`` the loop computes the stepper's diagnostics (energy, risk, dissipation) of every new state
  (``Step.diagnostics``): the driver records them; the in-memory callers leave them out (no extra evaluation).
- **Cost.** The Problem's calls during the step and the new state's diagnostics, by kind, are added to the step's
  columns (:data:`pdeflow.solvers.base.COST_COLUMNS`, :meth:`~pdeflow.solvers.base.Stepper.cost_since`); the
  observers' own calls (the accuracy checks' products) are not the step's.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pdeflow.core.clock import landed, same_time
from pdeflow.core.config import Config, ConfigError
from pdeflow.core.parallel import SERIAL, SerialComm

from .base import SolverError, State, Stepper

MAX_FRAMES = 10**6  # a longer frame schedule is a typo (and would not fit in memory as an array)


def frame_times(cfg: Config) -> np.ndarray:
    """The frame schedule: t = 0, then ``k * frame_interval`` up to t_end, or log-spaced; t_end last (a
    multiple of frame_interval that is the same time as t_end, :func:`pdeflow.core.clock.same_time`, is t_end).

    ConfigError if it has more than :data:`MAX_FRAMES` frames."""
    r = cfg.run
    count = r.n_frames if r.frame_spacing == "log" else r.t_end / r.frame_interval
    if not count <= MAX_FRAMES:
        what = (f"run.n_frames = {r.n_frames}" if r.frame_spacing == "log" else
                f"run.frame_interval = {r.frame_interval:g} up to run.t_end = {r.t_end:g} gives {count:.3g} frames,")
        raise ConfigError(f"{what} more than {MAX_FRAMES}; store fewer frames")
    if r.frame_spacing == "log":
        first = min(cfg.solver.dt, r.t_end / 1000.0)
        return np.concatenate([[0.0], np.geomspace(first, r.t_end, r.n_frames)])
    n = int(math.floor(r.t_end / r.frame_interval))
    if same_time((n + 1) * r.frame_interval, r.t_end):
        n += 1
    times = np.arange(n + 1) * r.frame_interval
    if same_time(times[-1], r.t_end):
        times[-1] = r.t_end
    else:
        times = np.append(times, r.t_end)
    return times


@dataclass
class Stop:
    """Why a loop ended: ``status`` (module docstring) and a one-line ``message``."""
    status: str
    message: str


@dataclass
class Step:
    """One step as the observers see it: the states before and after, the stepper's /steps columns
    (``stepper_columns``), the diagnostics of ``new`` (with ``measure``; else None), ``columns`` that observers add
    (the accuracy checks) and ``frame``: the index of the target it reached, or None."""
    old: State
    new: State
    stepper_columns: dict[str, float]
    diagnostics: dict[str, float] | None = None
    columns: dict[str, float] = field(default_factory=dict)
    frame: int | None = None
    data: dict = field(default_factory=dict)  # what one observer hands to another (the accuracy assessment)


class Observer:
    """Hooks on the loop (module docstring); each may return a :class:`Stop` where its signature says so."""

    def check(self, state: State) -> Stop | None:
        return None

    def assess(self, step: Step) -> None:
        return None

    def accept(self, step: Step) -> Stop | None:
        return None

    def finish(self, state: State) -> Stop | None:
        return None


class Frames(Observer):
    """Calls ``on_frame(index, state)`` at every target reached (and at the start with ``include_start``)."""

    def __init__(self, on_frame: Callable[[int, State], None]) -> None:
        self.on_frame = on_frame

    def accept(self, step: Step) -> None:
        if step.frame is not None:
            self.on_frame(step.frame, step.new)


class MaxSteps(Observer):
    """Stops (``max_steps``) before a step once the state's step count reaches ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def check(self, state: State) -> Stop | None:
        if state.step >= self.limit:
            return Stop("max_steps", f"stopped at run.max_steps = {self.limit}")
        return None


class WallTime(Observer):
    """Stops (``wall_time``) before a step once ``clock()`` exceeds ``limit`` seconds."""

    def __init__(self, limit: float, clock: Callable[[], float]) -> None:
        self.limit, self.clock = limit, clock

    def check(self, state: State) -> Stop | None:
        if self.clock() > self.limit:
            return Stop("wall_time", f"stopped after run.wall_time_limit = {self.limit:g} s")
        return None


class Stationary(Observer):
    """Stops (``stationary``) after a step whose dissipation is below ``tol`` (needs ``measure``; tol 0: never)."""

    def __init__(self, tol: float) -> None:
        self.tol = tol

    def accept(self, step: Step) -> Stop | None:
        dissipation = step.diagnostics["dissipation"]
        if self.tol > 0 and dissipation < self.tol:
            return Stop("stationary", f"stationary at t = {step.new.t:.6g}: dissipation {dissipation:.3g} "
                                      f"< run.stationary_tol = {self.tol:g}")
        return None


class Loop:
    """The time loop of the module docstring for one stepper and one list of increasing target ``times``."""

    def __init__(self, stepper: Stepper, times: Sequence[float] | np.ndarray, observers: Sequence[Observer] = (),
                 *, measure: bool = False, comm: SerialComm = SERIAL,
                 guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
        self.stepper, self.times = stepper, np.asarray(times, dtype=float)
        self.observers, self.measure, self.comm, self.guard = list(observers), measure, comm, guard

    def _first(self, state: State, include_start: bool) -> int:
        """The index of the first target still ahead of ``state`` (or at it, with ``include_start``)."""
        return int(np.searchsorted(self.times, state.t, side="left" if include_start else "right"))

    def run(self, state: State, include_start: bool = False) -> tuple[State, Stop]:
        """Advance ``state`` through the targets; returns the last state taken and why the loop stopped."""
        st, times = self.stepper, self.times
        target_index = self._first(state, include_start)
        if include_start and target_index < len(times) and times[target_index] == state.t:
            self._accept(Step(old=state, new=state, stepper_columns={}, frame=target_index))
            target_index += 1
        while target_index < len(times):
            for observer in self.observers:
                stop = observer.check(state)
                if stop is not None:
                    return state, stop
            target = float(times[target_index])
            try:
                # non-finite values are detected here, state by state; numpy's warnings would only add lines to
                # the one-line report
                with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
                    mark = st.cost_mark()
                    new, stepper_columns = st.step(state, target - state.t)
                    finite = all(self.comm.allgather(st.is_finite(new)))
                    diag = st.diagnostics(new) if finite and self.measure else {}
                    stepper_columns = {**stepper_columns, **st.cost_since(mark)}
                    if not finite or not all(np.isfinite(v) for v in diag.values()):
                        return state, Stop("non_finite", f"non-finite state at step {state.step + 1} "
                                                         f"(t = {state.t:.6g}): {st.likely_cause(state)}")
                    step = Step(old=state, new=new, stepper_columns=stepper_columns,
                                diagnostics=diag if self.measure else None)
                    for observer in self.observers:
                        observer.assess(step)
            except SolverError as exc:
                return state, Stop("error", f"step {state.step + 1} (t = {state.t:.6g}) failed: {exc}")
            stop = None
            with self.guard():
                new.t = landed(new.t, target)
                if new.t >= target:
                    step.frame = target_index
                    target_index += 1
                state = new
                stop = self._accept(step)
            if stop is not None:
                return state, stop
        for observer in self.observers:
            stop = observer.finish(state)
            if stop is not None:
                return state, stop
        return state, Stop("finished", f"reached t = {times[-1]:g}" if len(times) else "no target time")

    def _accept(self, step: Step) -> Stop | None:
        stop = None
        for observer in self.observers:
            found = observer.accept(step)
            stop = stop or found
        return stop


def advance(stepper: Stepper, state: State, times: Sequence[float] | np.ndarray,
            on_frame: Callable[[int, State], None] | None = None, observers: Sequence[Observer] = ()
            ) -> tuple[State, Stop]:
    """The loop in memory: ``state`` through ``times`` (a target at the start included), ``on_frame(index,
    state)`` at each; returns the last state and the :class:`Stop` (``finished``, ``non_finite`` or ``error``)."""
    frames = [Frames(on_frame)] if on_frame is not None else []
    return Loop(stepper, times, [*frames, *observers]).run(state, include_start=True)


__all__ = ["Loop", "Observer", "Step", "Stop", "Frames", "MaxSteps", "WallTime", "Stationary", "advance",
           "frame_times", "MAX_FRAMES"]
