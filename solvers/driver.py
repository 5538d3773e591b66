"""The time loop: steps, frames, per-step diagnostics, stop reasons, checkpoints, progress, resume.

:func:`run` advances a stepper from its initial state (or a file's checkpoint) to ``run.t_end``:

- every accepted step yields a ``/steps`` row (t, dt, energy, risk, dissipation, wall time, and the
  stepper's columns); rows are buffered and written with the next frame or checkpoint;
- frames fall exactly on the schedule (steps are shortened to land on them): every ``run.frame_interval``
  (``linear``) or ``run.n_frames`` log-spaced times (``log``); t = 0 and t_end are always frames;
- after every frame the state is checkpointed, so a killed run resumes from its last frame and
  continues bit for bit;
- stop reasons: ``finished`` (t_end), ``stationary`` (dissipation < run.stationary_tol), ``wall_time``,
  ``max_steps`` (each writes a frame at the stopping time), ``interrupted`` (SIGINT/SIGTERM: checkpoint,
  exit 130/143), ``non_finite`` (last good frame and checkpoint kept, exit 3), ``error`` (a failed inner
  solve: same, exit 3).
"""
from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from pdeflow.config import Config
from pdeflow.problem import Problem
from pdeflow.trajectory import TrajectoryWriter

from . import make_stepper
from .base import SolverError, State, Stepper

EXIT_OK, EXIT_BAD_INPUT, EXIT_NUMERICAL, EXIT_SIGINT, EXIT_SIGTERM = 0, 2, 3, 130, 143


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class RunResult:
    """How a run ended: ``status`` (see the module docstring), a one-line ``message``, the process exit
    code, the final state and the file written."""
    status: str
    message: str
    exit_code: int
    state: State
    path: Path


def frame_times(cfg: Config) -> np.ndarray:
    """The frame schedule: t = 0, then ``k * frame_interval`` up to t_end, or log-spaced; t_end last."""
    r = cfg.run
    if r.frame_spacing == "log":
        first = min(cfg.solver.dt, r.t_end / 1000.0)
        times = np.concatenate([[0.0], np.geomspace(first, r.t_end, r.n_frames)])
    else:
        n = int(math.floor(r.t_end / r.frame_interval + 1e-9))
        times = np.arange(n + 1) * r.frame_interval
        if r.t_end - times[-1] > 1e-9 * r.t_end:
            times = np.append(times, r.t_end)
        times[-1] = r.t_end if abs(times[-1] - r.t_end) <= 1e-9 * r.t_end else times[-1]
    return times


class _Rows:
    """Buffered /steps rows."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.rows: list[dict[str, float]] = []

    def add(self, row: dict[str, float]) -> None:
        self.rows.append(row)

    def flush(self, writer: TrajectoryWriter) -> None:
        if self.rows:
            writer.append_steps({c: np.array([r.get(c, np.nan) for r in self.rows]) for c in self.columns})
            self.rows = []


def run(cfg: Config, problem: Problem, path: str | Path, *, resume: bool = False, quiet: bool = False,
        stepper: Stepper | None = None, on_finish: Callable[[Path, Config], None] | None = None) -> RunResult:
    """Integrate ``cfg`` on ``problem`` into the trajectory file ``path`` (new, or continued with ``resume``).

    The caller has validated the config and decided about existing files (the CLI refuses to overwrite).
    ``on_finish(path, cfg)`` runs after the file is closed on a finished or stationary run.
    """
    path = Path(path)
    stepper = stepper or make_stepper(problem, cfg)
    columns = ("time", "dt", "energy", "risk", "dissipation", "wall_time") + stepper.step_columns
    times = frame_times(cfg)
    rows = _Rows(columns)
    wall0 = time.perf_counter()
    if resume:
        writer, ck = TrajectoryWriter.reopen(path)
        state = stepper.restore(ck)
        wall_offset = _last_wall_time(writer)
        next_frame = int(np.searchsorted(times, state.t, side="right"))
    else:
        state = stepper.initial_state()
        writer = TrajectoryWriter.create(path, cfg, problem.arrays(), state.fields, stepper.step_columns,
                                         stepper.frame_attrs(), stepper.extra_size, stepper.measure,
                                         beta=problem.beta, precision=problem.precision,
                                         compression=cfg.output.compression)
        wall_offset = 0.0
        diag = stepper.diagnostics(state)
        rows.add({"time": state.t, "dt": 0.0, "wall_time": 0.0, **diag})
        rows.flush(writer)
        _write_frame(writer, stepper, state, diag, 0.0)
        next_frame = 1

    def wall() -> float:
        return wall_offset + time.perf_counter() - wall0

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
        raise Interrupted(signum)

    for s in previous:
        signal.signal(s, on_signal)
    bar = tqdm(total=cfg.run.t_end, initial=state.t, unit="t", disable=quiet or not sys.stderr.isatty(),
               bar_format="{l_bar}{bar}| t={n:.4g}/{total:.4g} [{elapsed}<{remaining}]{postfix}")
    status, message, code = "finished", f"reached t_end = {cfg.run.t_end:g}", EXIT_OK
    try:
        good = state
        while next_frame < len(times):
            target = times[next_frame]
            if state.step >= cfg.run.max_steps:
                status, message = "max_steps", f"stopped at run.max_steps = {cfg.run.max_steps}"
                break
            if wall() > cfg.run.wall_time_limit:
                status, message = "wall_time", f"stopped after run.wall_time_limit = {cfg.run.wall_time_limit:g} s"
                break
            t_prev = state.t
            try:
                new, extra = stepper.step(state, target - state.t)
                if not stepper.is_finite(new):
                    raise FloatingPointError
                diag = stepper.diagnostics(new)
                if not all(np.isfinite(v) for v in diag.values()):
                    raise FloatingPointError
            except FloatingPointError:
                status, code = "non_finite", EXIT_NUMERICAL
                message = (f"non-finite state at step {state.step + 1} (t = {state.t:.6g}): "
                           f"{stepper.likely_cause(state)}; the last good frame is kept")
                break
            except SolverError as exc:
                status, code = "error", EXIT_NUMERICAL
                message = f"step {state.step + 1} (t = {state.t:.6g}) failed: {exc}; the last good frame is kept"
                break
            if abs(new.t - target) <= 1e-12 * max(1.0, abs(target)):
                new.t = float(target)
            state = good = new
            rows.add({"time": state.t, "dt": state.t - t_prev, "wall_time": wall(), **diag, **extra})
            bar.update(state.t - bar.n)
            if not bar.disable:
                bar.set_postfix_str(f"E={diag['energy']:.6g} I={diag['dissipation']:.3g} dt={state.dt:.3g}",
                                    refresh=False)
            if state.t >= target:
                rows.flush(writer)
                _write_frame(writer, stepper, state, diag, wall())
                next_frame += 1
            if cfg.run.stationary_tol > 0 and diag["dissipation"] < cfg.run.stationary_tol:
                status = "stationary"
                message = (f"stationary at t = {state.t:.6g}: dissipation {diag['dissipation']:.3g} "
                           f"< run.stationary_tol = {cfg.run.stationary_tol:g}")
                break
        if status in ("stationary", "max_steps", "wall_time") and writer.f["frames"]["time"][-1] != state.t:
            rows.flush(writer)
            _write_frame(writer, stepper, state, stepper.diagnostics(state), wall())
        rows.flush(writer)
        state = good
        writer.write_checkpoint(stepper.checkpoint(state, writer.n_frames, writer.n_steps))
    except Interrupted as exc:
        rows.flush(writer)
        writer.write_checkpoint(stepper.checkpoint(state, writer.n_frames, writer.n_steps))
        status = "interrupted"
        code = EXIT_SIGINT if exc.signum == signal.SIGINT else EXIT_SIGTERM
        message = f"interrupted by {exc} at t = {state.t:.6g}; continue with --resume"
    finally:
        bar.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    writer.finish(status, message, {"final_time": state.t, "steps": state.step})
    if on_finish is not None and status in ("finished", "stationary"):
        on_finish(path, cfg)
    return RunResult(status=status, message=message, exit_code=code, state=state, path=path)


def _write_frame(writer: TrajectoryWriter, stepper: Stepper, state: State, diag: dict[str, float],
                 wall_time: float) -> None:
    writer.append_frame(state.fields, {"time": state.t, "step": state.step, "dt": state.dt,
                                       "wall_time": wall_time, "energy": diag["energy"],
                                       "dissipation": diag["dissipation"]})
    writer.write_checkpoint(stepper.checkpoint(state, writer.n_frames, writer.n_steps))


def _last_wall_time(writer: TrajectoryWriter) -> float:
    wt = writer.f["steps"]["wall_time"]
    return float(wt[-1]) if wt.shape[0] else 0.0
