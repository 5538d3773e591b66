"""When a trajectory file may be continued by a config (``pdeflow run --resume``): the rules beside the file format.

A file is continued only by the config that wrote it, up to :data:`RESUMABLE_KEYS` (keys that extend or limit the
run), only from a committed checkpoint, and only when the problem arrays the config builds now (embedding, tokens,
...) equal the stored ones. Each violation is a :class:`pdeflow.io.file_access.TrajectoryError` naming it (one line).

A checkpoint of the file (:class:`pdeflow.io.checkpoint.Checkpoint`) converts to the steppers' state
(:class:`pdeflow.core.state.State`) and back here (:func:`checkpoint_of`, :func:`state_of`): the steppers never see
the file's type.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.config import Config
from ..core.state import State, rng_from_state, rng_state
from .checkpoint import Checkpoint
from .file_access import TrajectoryError, partial_path
from .trajectory import Trajectory, open_trajectory

# Keys that may differ between a file and the config resuming it (they extend or limit the run).
RESUMABLE_KEYS = {("run", "t_end"), ("run", "max_steps"), ("run", "wall_time_limit"), ("run", "checkpoint_interval"),
                  ("run", "accuracy"), ("run", "identity_tol"), ("output", "path")}


def config_difference(a: Config, b: Config) -> str | None:
    """The first ``section.key`` whose value differs (ignoring RESUMABLE_KEYS), or None."""
    da, db = a.to_dict(), b.to_dict()
    for section, values in da.items():
        for key, value in values.items():
            if (section, key) in RESUMABLE_KEYS:
                continue
            other = db.get(section, {}).get(key, None)
            if value != other and not (value != value and other != other):  # nan == nan here
                return f"{section}.{key}"
    return None


def array_difference(stored: dict[str, Any], built: dict[str, Any]) -> str | None:
    """The first problem array (``embedding``, ``tokens``, ...) that differs between a file and the Problem a
    config builds now (e.g. an edited text or basis file), or None."""
    for key, value in built.items():
        other = stored.get(key)
        if value is None or other is None:
            if (value is None) != (other is None):
                return key
            continue
        if np.shape(value) != np.shape(other) or not np.array_equal(value, other):
            return key
    return None


def check_resumable(stored: Trajectory, cfg: Config, path: Path) -> None:
    """TrajectoryError unless ``cfg`` may continue the file ``stored`` (at ``path``): same config up to
    :data:`RESUMABLE_KEYS`, and a checkpoint to continue from."""
    diff = config_difference(stored.config, cfg)
    if diff is not None:
        raise TrajectoryError(f"--resume: {str(path)!r} was written by another config ({diff} differs)")
    if stored.checkpoint is None and stored.checkpoint_error:
        raise TrajectoryError(f"--resume: {stored.checkpoint_error}")
    if stored.checkpoint is None:
        raise TrajectoryError(f"--resume: {str(path)!r} holds no checkpoint to continue from; start again with --force")


def open_resumable(path: Path, cfg: Config) -> Trajectory:
    """The file at ``path`` read for ``cfg`` to continue it: TrajectoryError unless it exists, is a readable
    trajectory and :func:`check_resumable` passes (the problem arrays are checked later, by
    :func:`check_same_problem`, once the config has built them)."""
    if not path.exists():
        partial = partial_path(path)
        left = (f" ({partial.name} is what a run killed before its first checkpoint left: nothing to continue; run "
                f"without --resume, which removes it)") if partial.exists() else ""
        raise TrajectoryError(f"--resume: {str(path)!r} does not exist{left}")
    stored = open_trajectory(path)
    check_resumable(stored, cfg, path)
    return stored


def check_same_problem(stored: Trajectory, arrays: dict[str, Any], path: Path) -> None:
    """TrajectoryError unless the problem ``arrays`` the config builds now equal the file's."""
    diff = array_difference(stored.arrays, arrays)
    if diff is not None:
        raise TrajectoryError(f"--resume: the {diff!r} array of {str(path)!r} differs from the one the config builds "
                              f"now (a task, text or basis file changed?)")


def checkpoint_of(state: State, extra: dict[str, np.ndarray], n_frames: int, n_steps: int) -> Checkpoint:
    """The checkpoint of ``state`` (fields copied, the generator as plain data), with the named float arrays
    ``extra`` (a run's: ``stepper``, the controller state, and ``accuracy``, the accuracy record's) and the file's
    committed frame and step counts."""
    return Checkpoint(fields={k: np.array(v) for k, v in state.fields.items()}, t=state.t, dt=state.dt,
                      step=state.step, n_frames=n_frames, n_steps=n_steps, rng=rng_state(state.rng),
                      extra={name: np.array(value, dtype=float) for name, value in extra.items()})


def state_of(ck: Checkpoint) -> State:
    """The state a checkpoint holds (its ``extra`` is the caller's to read by name: stepper controller, accuracy
    record)."""
    return State(t=ck.t, step=ck.step, dt=ck.dt, fields=dict(ck.fields), rng=rng_from_state(ck.rng))


__all__ = ["checkpoint_of", "state_of", "RESUMABLE_KEYS", "config_difference", "array_difference",
           "check_resumable", "open_resumable", "check_same_problem"]
