"""A run into a trajectory file: frames, per-step diagnostics, stop reasons, checkpoints, progress, resume.

:func:`run` advances a stepper from its initial state (or a file's checkpoint) to ``run.t_end`` through the
shared time loop (:class:`pdeflow.solvers.loop.Loop`), the run itself its first observer: a ``/steps`` row per
accepted step (with the accuracy columns of :mod:`pdeflow.solvers.accuracy`), frames exactly on the schedule, a
checkpoint after every frame and every ``run.checkpoint_interval`` seconds (what commits rows: ``--resume`` continues
bit for bit), and the stop reasons ``finished``, ``stationary``, ``wall_time``, ``max_steps``, ``interrupted``,
``accuracy_lost``, ``non_finite``, ``error``, ``write_error``. SIGINT/SIGTERM raise :class:`Interrupted` during a
step, and are held back while a step is recorded or the file written.
Details, with the exit codes: docs/design.md, "A run into a trajectory file".
"""
from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pdeflow.core.config import Config
from pdeflow.core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM
from pdeflow.core.parallel import SERIAL, SerialComm, check_shardable
from pdeflow.core.problem import Problem
from pdeflow.io.checkpoint import committed_steps
from pdeflow.io.file_access import TrajectoryError, error_reason
from pdeflow.io.resume import checkpoint_of, state_of
from pdeflow.io.sharded_writer import GatheringWriter
from pdeflow.io.trajectory_writer import STEP_COLUMNS, TrajectoryWriter

from . import initial_fields, make_stepper
from .accuracy import COLUMNS as ACCURACY_COLUMNS
from .accuracy import AccuracyMonitor, AccuracyRecord
from .base import COST_COLUMNS, State, Stepper
from .loop import Loop, MaxSteps, Observer, Stationary, Step, WallTime, frame_times

# the checkpoint arrays of the stepper's controller state are /checkpoint/slot#/extra/stepper.<name>
STEPPER_PREFIX = "stepper."


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
    state: State | None
    path: Path


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


class _Signals:
    """SIGINT/SIGTERM as :class:`Interrupted`: raised at once, except inside :meth:`held` blocks (raised
    when the outermost one ends) and after :meth:`stop` (only recorded). With several MPI ranks a signal
    is only recorded, and at the end of each outermost held block (once per step) the ranks agree whether
    any of them got one, so that all of them stop after the same step.

    The agreement decides on the values the ranks sent, never on ``pending`` read after it: a signal
    arriving while the agreement is in flight (the handler runs when the allgather returns) stays pending
    for the next agreement. Overwriting it with the agreed value lost it (mpiexec signals every rank at
    about the same instant, so both could lose theirs and run on to t_end), and acting on it at once made
    one rank stop alone while the other went on into the next step's collectives: both hung."""

    def __init__(self, comm: SerialComm = SERIAL, ignore_after_interrupt: bool = False) -> None:
        self.comm = comm
        self.pending: int | None = None
        self.depth = 0
        self.stopping = False
        self.previous: dict[int, object] = {}
        self.ignore_after_interrupt = ignore_after_interrupt

    def __enter__(self) -> _Signals:
        for s in (signal.SIGINT, signal.SIGTERM):
            self.previous[s] = signal.getsignal(s)
            signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        interrupted = self.pending is not None and self.ignore_after_interrupt
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_IGN if interrupted else handler)

    def _handler(self, signum: int, frame: object) -> None:  # noqa: ARG002 - signal handler signature
        if self.pending is None:
            self.pending = signum
        if self.depth == 0 and not self.stopping and self.comm.size == 1:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.depth > 0 or self.stopping:
            return
        if self.comm.size == 1:
            if self.pending is not None:
                raise Interrupted(self.pending)
            return
        agreed = max(self.comm.allgather(self.pending or 0))
        if agreed:
            raise Interrupted(agreed)

    def stop(self) -> None:
        """From now on signals are only recorded: the run is ending and writing its last checkpoint."""
        self.stopping = True


class _WriteFailed(Exception):
    """The trajectory file could not be written (full disk, quota, I/O error); the message is the cause."""


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    """Around file writes: HDF5's failures (OSError, or RuntimeError from a failed flush) as _WriteFailed."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        raise _WriteFailed(error_reason(exc)) from None


class _Progress(Observer):
    """The progress bar over t (on a terminal, unless quiet): energy, dissipation and step in its postfix."""

    def __init__(self, t_end: float, t: float, quiet: bool) -> None:
        self.bar = tqdm(total=t_end, initial=t, unit="t", disable=quiet or not sys.stderr.isatty(),
                        bar_format="{l_bar}{bar}| t={n:.4g}/{total:.4g} [{elapsed}<{remaining}]{postfix}")

    def accept(self, step: Step) -> None:
        new, diag = step.new, step.diagnostics
        self.bar.update(new.t - self.bar.n)
        if not self.bar.disable:
            self.bar.set_postfix_str(f"E={diag['energy']:.6g} I={diag['dissipation']:.3g} dt={new.dt:.3g}",
                                     refresh=False)


class _Run(Observer):
    """One execution of :func:`run`: the state, the file, the buffered rows and the signal guard."""

    def __init__(self, cfg: Config, problem: Problem, path: Path, stepper: Stepper, quiet: bool,
                 exiting: bool = False) -> None:
        self.cfg, self.problem, self.path, self.stepper, self.quiet = cfg, problem, path, stepper, quiet
        self.comm = problem.comm  # the MPI ranks the particles are split across (pdeflow.core.parallel)
        self.times = frame_times(cfg)
        self.monitor = AccuracyMonitor(stepper, self.comm, cfg.run, cfg.init.n_particles)
        self.rows = _Rows(STEP_COLUMNS + ACCURACY_COLUMNS + COST_COLUMNS + stepper.step_columns)
        self.accuracy = AccuracyRecord(self.monitor)  # its stop_reason: the loss that stops the run
        self.signals = _Signals(self.comm, ignore_after_interrupt=exiting)
        self.state: State | None = None
        self.writer: GatheringWriter | None = None
        self.wall0 = time.perf_counter()
        self.wall_offset = 0.0

    def wall(self) -> float:
        # rank 0's clock on every rank, so that decisions on wall time (limit, checkpoints) agree
        return self.comm.bcast(self.wall_offset + time.perf_counter() - self.wall0)

    # ---- the file -----------------------------------------------------------------------------
    def stepper_extra(self, state: State) -> dict[str, np.ndarray]:
        """The stepper's named controller arrays at ``state`` (:meth:`Stepper.extra_state`) as checkpoint arrays
        ``stepper.<name>``; the names and shapes at the start are the file's for its life."""
        return {STEPPER_PREFIX + name: value for name, value in self.stepper.extra_state(state).items()}

    def commit(self) -> None:
        """Write the buffered rows and a checkpoint of the state: everything so far becomes permanent."""
        with _writing():
            self.rows.flush(self.writer)
            # the stepper's controller state and the accuracy record's (pdeflow.solvers.accuracy), by name
            extra = {**self.stepper_extra(self.state), "accuracy": self.monitor.checkpoint_vector()}
            self.writer.write_checkpoint(checkpoint_of(self.state, extra, self.writer.n_frames, self.writer.n_steps))

    def write_frame(self, diag: dict[str, float]) -> None:
        s = self.state
        with _writing():
            self.rows.flush(self.writer)
            self.writer.append_frame(s.fields, {"time": s.t, "step": s.step, "dt": s.dt, "wall_time": self.wall(),
                                                "energy": diag["energy"], "dissipation": diag["dissipation"]})
        self.commit()

    def start(self, resume: bool, overwrite: bool) -> None:
        """Open the file: continue it from its checkpoint, or create it with the initial frame."""
        st = self.stepper
        if resume:
            rows = self.comm.bcast(committed_steps(self.path, ("time",) + ACCURACY_COLUMNS)
                                   if self.comm.is_root else None)
            self.writer, ck = GatheringWriter.reopen(self.comm, self.path)
            state = state_of(ck)
            expected = set(self.stepper_extra(state))
            if not expected <= set(ck.extra):
                raise TrajectoryError(f"--resume: {self.path}: its checkpoint lacks the stepper state "
                                      f"{', '.join(sorted(expected - set(ck.extra)))} (/checkpoint/slot#/extra)")
            self.state = st.restore(state, {name.removeprefix(STEPPER_PREFIX): np.asarray(value, dtype=float)
                                            for name, value in ck.extra.items() if name.startswith(STEPPER_PREFIX)})
            # evaluated before the loop, as a fresh start's and as every new state in the loop: the first resumed
            # step's cost columns are then those of the same step in an uninterrupted run
            st.diagnostics(self.state)
            self.monitor.restore(ck.extra.get("accuracy"), rows)
            self.wall_offset = self.writer.last_wall_time
            return
        # a stepper given without an initial measure (run(stepper=...)) starts from the config's
        self.state = st.initial_state() if st.initial_fields else st.initial_state(initial_fields(st, self.cfg))
        self.state.fields = {key: self.comm.local_rows(v) for key, v in self.state.fields.items()}  # rank's block
        diag = st.diagnostics(self.state)  # before the file exists: a bad config leaves no file behind
        self.writer = GatheringWriter.create(
            self.comm, self.path, self.cfg, self.problem.arrays(), self.state.fields,
            ACCURACY_COLUMNS + COST_COLUMNS + st.step_columns, st.frame_attrs(),
            extra_shapes={**{name: np.shape(value) for name, value in self.stepper_extra(self.state).items()},
                          "accuracy": (self.monitor.checkpoint_size,)},
            measure=st.measure, beta=self.problem.beta, precision=self.problem.precision,
            compression=self.cfg.output.compression, overwrite=overwrite, steps_attrs=self.monitor.notes())
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            checks = self.monitor.assess(None, self.state, None, diag)
        self.accuracy.record(self.state.t, self.state.step, checks)
        self.rows.add({"time": self.state.t, "dt": 0.0, "wall_time": 0.0, **diag, **checks.columns})
        self.write_frame(diag)

    # ---- the loop's observer --------------------------------------------------------------------
    def accept(self, step: Step) -> None:
        """The step taken: its /steps row, and a frame or a checkpoint when due."""
        new, diag = step.new, step.diagnostics
        self.state = new
        self.rows.add({"time": new.t, "dt": new.t - step.old.t, "wall_time": self.wall(), **diag,
                       **step.columns, **step.stepper_columns})
        if step.frame is not None:
            self.write_frame(diag)
            self.last_commit = self.wall()
        elif (self.wall() - self.last_commit >= self.cfg.run.checkpoint_interval
              or self.accuracy.stop_reason is not None):
            self.commit()
            self.last_commit = self.wall()

    def loop(self) -> tuple[str, str, int]:
        """Step until the schedule ends or a stop reason: the shared :class:`pdeflow.solvers.loop.Loop` with the
        accuracy record, this run (the file), the stop reasons and the progress bar as observers; returns
        (status, message, exit code)."""
        cfg = self.cfg
        self.last_commit = self.wall()
        progress = _Progress(cfg.run.t_end, self.state.t, self.quiet)
        observers = [self.accuracy, self, MaxSteps(cfg.run.max_steps), WallTime(cfg.run.wall_time_limit, self.wall),
                     progress, Stationary(cfg.run.stationary_tol)]
        loop = Loop(self.stepper, self.times, observers, measure=True, comm=self.comm, guard=self.signals.held)
        try:
            self.state, stop = loop.run(self.state)
        finally:
            progress.bar.close()
        if stop.status == "finished":
            return "finished", f"reached t_end = {cfg.run.t_end:g}", EXIT_OK
        if stop.status in ("non_finite", "error"):
            return stop.status, f"{stop.message}; the last good frame is kept", EXIT_FAILED
        return stop.status, stop.message, EXIT_FAILED if stop.status == "accuracy_lost" else EXIT_OK

    def end(self, status: str) -> None:
        """The final frame (for stops between frames) and the final checkpoint; later signals are ignored."""
        with self.signals.held():
            self.signals.stop()
            w, s = self.writer, self.state
            if status in ("stationary", "max_steps", "wall_time") and w.last_frame_time != s.t:
                self.write_frame(self.stepper.diagnostics(s))
            self.commit()


def run(cfg: Config, problem: Problem, path: str | Path, *, resume: bool = False, overwrite: bool = False,
        quiet: bool = False, stepper: Stepper | None = None,
        on_finish: Callable[[Path, Config], None] | None = None, exiting: bool = False) -> RunResult:
    """Integrate ``cfg`` on ``problem`` into the trajectory file ``path`` (new, or continued with ``resume``).

    The caller has validated the config and, for ``resume``, that the file belongs to it. A new file
    replaces an existing one only with ``overwrite``, and only once the initial state has been computed
    and the new file created (so a config that fails early leaves an old file untouched).
    ``on_finish(path, cfg)`` runs after the file is closed on a finished or stationary run.
    ``exiting``: the process ends after this call (the CLI): after an interruption SIGINT and SIGTERM stay
    ignored instead of getting their previous handlers back, so that an impatient second Ctrl-C cannot
    break the exit with a traceback.
    Raises :class:`pdeflow.io.file_access.TrajectoryError` if the file cannot be created or resumed.
    """
    r = _Run(cfg, problem, Path(path), stepper or make_stepper(problem, cfg), quiet, exiting)
    check_shardable(r.comm, cfg, r.stepper.sharded, cfg.init.n_particles)
    try:
        with r.signals:
            try:
                with r.signals.held():
                    r.start(resume, overwrite)
                status, message, code = r.loop()
                r.end(status)
            except Interrupted as exc:
                r.signals.stop()
                code = EXIT_SIGINT if exc.signum == signal.SIGINT else EXIT_SIGTERM
                if r.writer is None:
                    return RunResult("interrupted", f"interrupted by {exc} before the file was created", code,
                                     r.state, r.path)
                status, message = "interrupted", f"interrupted by {exc} at t = {r.state.t:.6g}; continue with --resume"
                r.commit()
        if status != "accuracy_lost" and math.isfinite(r.monitor.lost_at):
            message += f"; but accuracy was LOST at t = {r.monitor.lost_at:.6g} (root attribute accuracy)"
        with _writing():
            r.writer.finish(status, message, {"final_time": r.state.t, "steps": r.state.step,
                                              **r.monitor.end_attrs(r.state.step)})
    except _WriteFailed as exc:
        if r.writer is not None:
            r.writer.abandon()
        at = f" at t = {r.state.t:.6g}" if r.state is not None else ""
        message = (f"cannot write {r.path}{at}: {exc}; the frames committed before are intact, "
                   f"continue with --resume once the cause is fixed")
        return RunResult("write_error", message, EXIT_FAILED, r.state, r.path)
    except BaseException:
        if r.writer is not None:
            r.writer.abandon()
        raise
    if on_finish is not None and status in ("finished", "stationary"):
        on_finish(r.path, cfg)
    return RunResult(status=status, message=message, exit_code=code, state=r.state, path=r.path)
