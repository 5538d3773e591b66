"""The reader of the HDF5 trajectory file, schema version 1: :func:`check_file` and :func:`open_trajectory`.

The layout is the table :data:`pdeflow.io.schema.ITEMS` (:func:`check_file` checks a file against it); the page
docs/schema.md shows it, with the commit protocol and what a kill at any instant leaves behind ("Crash safety").
Only committed rows are read (:func:`pdeflow.io.checkpoint.committed_counts`), so the file of a killed run reads as it
was at its last commit. The writer is :mod:`pdeflow.io.trajectory_writer`, recovery :mod:`pdeflow.io.recovery`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import h5py
import numpy as np

from ..core.config import Config, ConfigError, loads_config
from . import schema
from .checkpoint import Checkpoint, committed_counts, row_counts, trusted_checkpoint
from .file_access import TrajectoryError, error_reason, open_for_reading, plain, short_of
from .problem_file import problem_of, read_problem
from .schema import SCHEMA, SCHEMA_VERSION


def schema_error(path: str | Path, problems: list[str]) -> TrajectoryError:
    """The one-line error of a file departing from the schema (:func:`pdeflow.io.schema.check`): its first problem,
    and how many more there are; the reader and :func:`pdeflow.io.reference.read_run` raise it alike."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return TrajectoryError(f"{path}: {problems[0]}{more}")



def _rows_beyond(f: h5py.File, size: int) -> str | None:
    """The first /frames or /steps dataset whose committed rows (:func:`committed_counts`) are stored beyond
    ``size`` bytes, or None."""
    rows = dict(zip(("frames", "steps"), committed_counts(f)))
    for group, n in rows.items():
        for key, ds in f[group].items():
            if ds.chunks is None:
                continue
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                if info.chunk_offset[0] < n and info.byte_offset + info.size > size:
                    return f"/{group}/{key}"
    return None



def check_file(path: str | Path) -> None:
    """Raise TrajectoryError (one line) unless ``path`` is a readable pdeflow trajectory of schema 1."""
    path = Path(path)
    if not path.exists():
        raise TrajectoryError(f"{path}: no such file")
    if path.is_dir():
        raise TrajectoryError(f"{path}: is a directory, not a trajectory file")
    if not os.access(path, os.R_OK):
        raise TrajectoryError(f"{path}: not readable")
    try:
        with open_for_reading(path) as f:
            if plain(f.attrs.get("schema")) != SCHEMA:
                raise TrajectoryError(f"{path}: not a pdeflow trajectory (no schema = {SCHEMA!r} attribute)")
            version = plain(f.attrs.get("schema_version"))
            if version != SCHEMA_VERSION:
                raise TrajectoryError(f"{path}: schema version {version}, this pdeflow reads version {SCHEMA_VERSION}")
            problems = schema.check(f, lambda: row_counts(f), needs=(schema.REQUIRED, schema.WRITTEN))
            if problems:
                raise schema_error(path, [p.message for p in problems])
            short = short_of(path) if "checkpoint" in f else None
            beyond = _rows_beyond(f, short[0]) if short else None
            if beyond:
                raise TrajectoryError(f"{path}: truncated file ({short[0]} bytes of the {short[1]} its HDF5 header "
                                      f"announces): committed rows of {beyond} lie beyond its end")
    except (TrajectoryError, OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, TrajectoryError) and "truncated file" in str(exc):
            raise
        short = short_of(path) if path.is_file() else None
        if short:   # whatever failed, the cause is the missing end
            raise TrajectoryError(f"{path}: truncated file ({short[0]} bytes of the {short[1]} its HDF5 header "
                                  f"announces): not a readable HDF5 file") from None
        if isinstance(exc, TrajectoryError):
            raise
        raise TrajectoryError(f"{path}: {_open_failure(exc)}") from None



def _open_failure(exc: BaseException) -> str:
    """Why HDF5 could not open a file, in words (its messages carry internal details)."""
    text = str(exc)
    truncated = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text)
    if truncated:
        return (f"truncated file ({truncated.group(1)} bytes of the {truncated.group(2)} its HDF5 header "
                f"announces): not a readable HDF5 file")
    if "file signature not found" in text:
        return "not a readable HDF5 file (no HDF5 signature)"
    if "already open for write" in text:
        return ("not a readable HDF5 file (left open by a writer that was not in SWMR mode; "
                "h5clear -s can clear the flag)")
    return f"not a readable HDF5 file ({error_reason(exc)[:80]})"



class Trajectory:
    """A trajectory read into memory: ``time`` [F], ``frames`` (dict of [F, ...] arrays), ``steps``
    (dict of columns), ``arrays`` (the problem arrays, as :meth:`pdeflow.Problem.arrays`), ``attrs``
    (root attributes), ``config`` (the :class:`~pdeflow.core.config.Config`), ``frame_attrs``, ``steps_attrs``,
    ``analysis``,
    ``checkpoint`` (the trusted :class:`Checkpoint` or None; ``checkpoint_error`` says why when the file has one
    that cannot be used, ``checkpoint_note`` why it is not the active slot). Only committed rows are read
    (:func:`committed_counts`), so the file of a killed run reads as it was at its last commit."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        check_file(self.path)
        try:
            with open_for_reading(self.path) as f:
                self.attrs = {k: plain(v) for k, v in f.attrs.items()}
                n, m = committed_counts(f)
                self.steps_attrs = {k: plain(v) for k, v in f["steps"].attrs.items()}
                self.frames = {k: f["frames"][k][:n] for k in f["frames"].keys()}
                self.frame_attrs = {k: plain(v) for k, v in f["frames"].attrs.items()}
                self.steps = {k: f["steps"][k][:m] for k in f["steps"].keys()}
                self.arrays, self.model_attrs = read_problem(f)
                self.analysis = ({k: f["analysis"][k][()] for k in f["analysis"].keys()}
                                 | {k: plain(v) for k, v in f["analysis"].attrs.items()}) if "analysis" in f else {}
                self.checkpoint: Checkpoint | None = None
                self.checkpoint_error: str | None = None   # why a checkpoint the file has cannot be used
                self.checkpoint_note: str | None = None    # why it is not the active one (a damaged slot)
                try:
                    if "checkpoint" in f:
                        self.checkpoint, self.checkpoint_note = trusted_checkpoint(f)
                except TrajectoryError as exc:
                    self.checkpoint_error = str(exc)
        except (OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
            missing = re.search(r"object '([^']+)' doesn't exist", str(exc))
            what = f"no dataset or group {missing.group(1)!r}" if missing else error_reason(exc)[:80]
            raise TrajectoryError(f"{self.path}: truncated or damaged trajectory ({what})") from None
        try:
            self.config: Config = loads_config(str(self.attrs.get("config", "")))
        except ConfigError as exc:
            raise TrajectoryError(f"{self.path}: stored config is invalid ({exc})") from None

    @property
    def time(self) -> np.ndarray:
        return self.frames["time"]

    @property
    def measure(self) -> str:
        return str(self.attrs.get("measure", "particles"))

    def problem(self):
        """The :class:`pdeflow.Problem` stored in the file (no task or config files needed)."""
        return problem_of(self.arrays, self.model_attrs)



def open_trajectory(path: str | Path) -> Trajectory:
    """Read a trajectory file; TrajectoryError (one line) if it is not a readable schema-1 file."""
    return Trajectory(path)
