"""The HDF5 trajectory file, schema version 1: a writer that survives kills, and a reader.

Layout (every array readable with plain h5py; shapes as in MODEL.md):

- root attributes: ``schema = "pdeflow-trajectory"``, ``schema_version = 1``, ``pdeflow_version``,
  ``created`` (ISO 8601, UTC), ``seed`` (init.seed), ``config`` (the full config as TOML text),
  ``method`` (solver.method), ``measure`` ("particles" or "grid"), and, once a run has ended,
  ``status`` ("finished", "stationary", "wall_time", "max_steps", "interrupted", "non_finite",
  "error") and ``message``.
- ``/model``: ``embedding`` [V,d], ``positions`` [T,d], ``unembedding`` [V,d], ``theta0`` [p], ``basis``
  [p,k] (absent for full coordinates); attributes ``head_dim``, ``score_scale``, ``weight_decay``,
  ``beta``, ``precision``, ``k``.
- ``/data``: ``tokens`` [B,T], ``targets`` [B,T], ``mask`` [B,T], ``weights`` [B].
- ``/frames``: ``time`` [F], ``step`` [F], ``dt`` [F], ``wall_time`` [F], ``energy`` [F],
  ``dissipation`` [F], and the measure: ``omega`` [F,N,k] and ``mass`` [F,N] for particles, or
  ``density`` [F,n1(,n2,n3)] for a grid (attributes ``lower``, ``upper``, ``shape`` on ``/frames``).
- ``/steps``: ``time``, ``dt``, ``energy``, ``risk``, ``dissipation``, ``wall_time`` and the stepper's own
  columns (``rejected``, ``inner_iterations``, ...), one row per accepted step; row 0 is the initial state.
- ``/checkpoint``: two slots ``slot0``, ``slot1`` and ``active`` (which slot is complete). A slot holds
  the state fields, ``t``, ``dt``, ``step``, ``n_frames``, ``n_steps`` (rows of /frames and /steps that
  belong to the run up to that state), ``rng`` (the generator state as JSON bytes) and ``extra``
  (the stepper's controller state).

Crash safety: the file is written in HDF5's single-writer/multiple-reader mode (SWMR), whose ordered
metadata flushes keep it readable whatever moment the writer dies at. A frame is appended field by
field with ``/frames/time`` last, then flushed: readers take ``len(time)`` frames, so a torn frame is
invisible. The checkpoint writes the inactive slot, flushes, then flips ``active``: a kill leaves the
previous complete slot in force. Resume truncates /frames and /steps to the slot's counts.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from . import __version__
from .config import Config, ConfigError, loads_config

SCHEMA = "pdeflow-trajectory"
SCHEMA_VERSION = 1
STEP_COLUMNS = ("time", "dt", "energy", "risk", "dissipation", "wall_time")
FRAME_SCALARS = ("time", "step", "dt", "wall_time", "energy", "dissipation")
RNG_BYTES = 2048


class TrajectoryError(Exception):
    """A file that is missing, not a pdeflow trajectory, truncated, or of another schema version."""


def _chunks(shape: tuple[int, ...], itemsize: int = 8) -> tuple[int, ...]:
    per_row = int(np.prod(shape)) * itemsize if shape else itemsize
    rows = int(max(1, min(1024, (256 * 1024) // max(per_row, 1))))
    return (rows,) + tuple(shape)


@dataclass
class Checkpoint:
    """A complete, resumable state: fields, time, step size, step count, generator and controller state."""
    fields: dict[str, np.ndarray]
    t: float
    dt: float
    step: int
    n_frames: int
    n_steps: int
    rng: dict | None = None
    extra: np.ndarray = field(default_factory=lambda: np.zeros(0))


class TrajectoryWriter:
    """Appends frames, step rows and checkpoints to a trajectory file in SWMR mode.

    Create with :meth:`create` (a new file) or :meth:`reopen` (resume). Each ``commit`` (frame or
    checkpoint) ends with a flush, so a killed run leaves a readable file with every completed frame.
    """

    def __init__(self, f: h5py.File, path: Path) -> None:
        self.f = f
        self.path = path

    # ---- creation ---------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, cfg: Config, arrays: dict[str, Any], fields: dict[str, np.ndarray],
               step_columns: tuple[str, ...] = (), frame_attrs: dict[str, Any] | None = None,
               extra_size: int = 0, measure: str = "particles", beta: float = np.inf,
               precision: str = "float64", compression: str | None = "gzip") -> "TrajectoryWriter":
        """Create a new file (never overwriting: the caller decides about an existing one).

        ``arrays`` is :meth:`pdeflow.Problem.arrays`; ``fields`` are the measure's arrays with their shapes
        (e.g. ``omega`` [N,k] and ``mass`` [N]); ``step_columns`` are the stepper's extra /steps columns.
        """
        path = Path(path)
        f = h5py.File(path, "x", libver="latest")
        try:
            f.attrs["schema"] = SCHEMA
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["pdeflow_version"] = __version__
            f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            f.attrs["seed"] = cfg.init.seed
            f.attrs["config"] = cfg.to_toml()
            f.attrs["method"] = cfg.solver.method
            f.attrs["measure"] = measure
            f.attrs["status"] = "running"
            f.attrs["message"] = ""
            m = f.create_group("model")
            for key in ("embedding", "positions", "unembedding", "theta0"):
                m.create_dataset(key, data=np.asarray(arrays[key], dtype=np.float64))
            if arrays.get("basis") is not None:
                m.create_dataset("basis", data=np.asarray(arrays["basis"], dtype=np.float64))
            m.attrs["head_dim"] = int(arrays["head_dim"])
            m.attrs["score_scale"] = float(arrays["score_scale"])
            m.attrs["weight_decay"] = float(arrays["weight_decay"])
            m.attrs["beta"] = float(beta)
            m.attrs["precision"] = precision
            m.attrs["k"] = int(np.asarray(arrays["theta0"]).shape[0] if arrays.get("basis") is None
                               else np.asarray(arrays["basis"]).shape[1])
            dgrp = f.create_group("data")
            dgrp.create_dataset("tokens", data=np.asarray(arrays["tokens"], dtype=np.int64))
            dgrp.create_dataset("targets", data=np.asarray(arrays["targets"], dtype=np.int64))
            dgrp.create_dataset("mask", data=np.asarray(arrays["mask"], dtype=np.float64))
            dgrp.create_dataset("weights", data=np.asarray(arrays["weights"], dtype=np.float64))
            fr = f.create_group("frames")
            for key, value in (frame_attrs or {}).items():
                fr.attrs[key] = value
            comp = None if compression in (None, "none") else compression
            for key in FRAME_SCALARS:
                dtype = np.int64 if key == "step" else np.float64
                fr.create_dataset(key, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(1024,))
            for key, value in fields.items():
                shape = np.shape(value)
                fr.create_dataset(key, shape=(0,) + shape, maxshape=(None,) + shape, dtype=np.float64,
                                  chunks=_chunks(shape), compression=comp)
            st = f.create_group("steps")
            for key in STEP_COLUMNS + tuple(step_columns):
                st.create_dataset(key, shape=(0,), maxshape=(None,), dtype=np.float64, chunks=(4096,))
            ck = f.create_group("checkpoint")
            ck.create_dataset("active", data=np.int64(-1))
            for s in ("slot0", "slot1"):
                g = ck.create_group(s)
                for key, value in fields.items():
                    g.create_dataset(key, data=np.zeros(np.shape(value)))
                for key in ("t", "dt"):
                    g.create_dataset(key, data=np.float64(0.0))
                for key in ("step", "n_frames", "n_steps"):
                    g.create_dataset(key, data=np.int64(0))
                g.create_dataset("rng", data=np.zeros(RNG_BYTES, dtype=np.uint8))
                g.create_dataset("extra", data=np.zeros(extra_size))
            f.flush()
            f.swmr_mode = True
        except BaseException:
            f.close()
            path.unlink(missing_ok=True)
            raise
        return cls(f, path)

    @classmethod
    def reopen(cls, path: str | Path) -> tuple["TrajectoryWriter", Checkpoint]:
        """Open an existing file to continue it: truncate to the active checkpoint and return it."""
        path = Path(path)
        check_file(path)
        f = h5py.File(path, "r+", libver="latest")
        try:
            ck = read_checkpoint(f)
            if ck is None:
                raise TrajectoryError(f"{path}: no complete checkpoint to resume from")
            for key in list(f["frames"].keys()):
                f["frames"][key].resize(ck.n_frames, axis=0)
            for key in list(f["steps"].keys()):
                f["steps"][key].resize(ck.n_steps, axis=0)
            f.attrs["status"] = "running"
            f.attrs["message"] = ""
            f.flush()
            f.swmr_mode = True
        except BaseException:
            f.close()
            raise
        return cls(f, path), ck

    # ---- appending --------------------------------------------------------------------------
    def append_steps(self, rows: dict[str, np.ndarray]) -> None:
        """Append step rows (columns of equal length); ``time`` is written last."""
        st = self.f["steps"]
        keys = [k for k in st.keys() if k != "time"] + ["time"]
        n = len(np.atleast_1d(rows["time"]))
        if n == 0:
            return
        for key in keys:
            ds = st[key]
            old = ds.shape[0]
            ds.resize(old + n, axis=0)
            ds[old:] = np.asarray(rows.get(key, np.full(n, np.nan)), dtype=np.float64)

    def append_frame(self, fields: dict[str, np.ndarray], scalars: dict[str, float]) -> None:
        """Append one frame: the measure's fields, then the scalars, ``time`` last; then flush."""
        fr = self.f["frames"]
        n = fr["time"].shape[0]
        for key, value in fields.items():
            ds = fr[key]
            ds.resize(n + 1, axis=0)
            ds[n] = value
        for key in FRAME_SCALARS[1:] + ("time",):
            ds = fr[key]
            ds.resize(n + 1, axis=0)
            ds[n] = scalars[key]
        self.f.flush()

    @property
    def n_frames(self) -> int:
        return int(self.f["frames"]["time"].shape[0])

    @property
    def n_steps(self) -> int:
        return int(self.f["steps"]["time"].shape[0])

    def write_checkpoint(self, ck: Checkpoint) -> None:
        """Write the inactive slot, flush, flip ``active``, flush."""
        grp = self.f["checkpoint"]
        active = int(grp["active"][()])
        slot_index = 0 if active != 0 else 1
        slot = grp[f"slot{slot_index}"]
        for key, value in ck.fields.items():
            slot[key][...] = value
        slot["t"][()] = ck.t
        slot["dt"][()] = ck.dt
        slot["step"][()] = ck.step
        slot["n_frames"][()] = ck.n_frames
        slot["n_steps"][()] = ck.n_steps
        raw = json.dumps(ck.rng).encode() if ck.rng is not None else b""
        if len(raw) > RNG_BYTES:
            raise ValueError("generator state too large for the checkpoint slot")
        buf = np.zeros(RNG_BYTES, dtype=np.uint8)
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        slot["rng"][...] = buf
        slot["extra"][...] = ck.extra
        self.f.flush()
        grp["active"][()] = slot_index
        self.f.flush()

    def finish(self, status: str, message: str, attrs: dict[str, Any] | None = None) -> None:
        """Close the SWMR session and record how the run ended (and any extra root attributes)."""
        self.f.flush()
        self.f.close()
        with h5py.File(self.path, "r+", libver="latest") as f:
            f.attrs["status"] = status
            f.attrs["message"] = message
            for key, value in (attrs or {}).items():
                f.attrs[key] = value

    def close(self) -> None:
        """Flush and close without recording a status (the file stays resumable)."""
        try:
            self.f.flush()
        finally:
            self.f.close()


def read_checkpoint(f: h5py.File) -> Checkpoint | None:
    """The active checkpoint of an open file, or None before the first one."""
    grp = f["checkpoint"]
    active = int(grp["active"][()])
    if active not in (0, 1):
        return None
    slot = grp[f"slot{active}"]
    fields = {key: slot[key][()] for key in f["frames"].keys() if key not in FRAME_SCALARS and key in slot}
    raw = bytes(slot["rng"][()]).rstrip(b"\0")
    return Checkpoint(fields=fields, t=float(slot["t"][()]), dt=float(slot["dt"][()]), step=int(slot["step"][()]),
                      n_frames=int(slot["n_frames"][()]), n_steps=int(slot["n_steps"][()]),
                      rng=json.loads(raw) if raw else None, extra=slot["extra"][()])


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
        with h5py.File(path, "r") as f:
            if f.attrs.get("schema") != SCHEMA:
                raise TrajectoryError(f"{path}: not a pdeflow trajectory (no schema = {SCHEMA!r} attribute)")
            version = f.attrs.get("schema_version")
            if version != SCHEMA_VERSION:
                raise TrajectoryError(f"{path}: schema version {version}, this pdeflow reads version {SCHEMA_VERSION}")
            for group in ("model", "data", "frames", "steps"):
                if group not in f:
                    raise TrajectoryError(f"{path}: truncated or damaged trajectory (no /{group})")
    except TrajectoryError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise TrajectoryError(f"{path}: not a readable HDF5 file ({str(exc).splitlines()[0][:80]})") from None


class Trajectory:
    """A trajectory read into memory: ``time`` [F], ``frames`` (dict of [F, ...] arrays), ``steps``
    (dict of columns), ``arrays`` (the problem arrays, as :meth:`pdeflow.Problem.arrays`), ``attrs``
    (root attributes), ``config`` (the :class:`~pdeflow.config.Config`), ``frame_attrs``, ``analysis``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        check_file(self.path)
        try:
            with h5py.File(self.path, "r") as f:
                self.attrs = {k: _plain(v) for k, v in f.attrs.items()}
                n = f["frames"]["time"].shape[0]
                self.frames = {k: f["frames"][k][:n] for k in f["frames"].keys()}
                self.frame_attrs = {k: _plain(v) for k, v in f["frames"].attrs.items()}
                m = f["steps"]["time"].shape[0]
                self.steps = {k: f["steps"][k][:m] for k in f["steps"].keys()}
                model, data = f["model"], f["data"]
                self.arrays: dict[str, Any] = {k: model[k][()] for k in model.keys()}
                self.arrays.setdefault("basis", None)
                self.arrays.update({k: data[k][()] for k in data.keys()})
                self.arrays.update({k: _plain(model.attrs[k]) for k in ("head_dim", "score_scale", "weight_decay")})
                self.model_attrs = {k: _plain(v) for k, v in model.attrs.items()}
                self.analysis = ({k: f["analysis"][k][()] for k in f["analysis"].keys()}
                                 | {k: _plain(v) for k, v in f["analysis"].attrs.items()}) if "analysis" in f else {}
                self.checkpoint = read_checkpoint(f) if "checkpoint" in f else None
        except (OSError, KeyError, ValueError) as exc:
            raise TrajectoryError(f"{self.path}: truncated or damaged trajectory ({str(exc).splitlines()[0][:80]})") from None
        for key in self.frames:
            self.frames[key] = self.frames[key][:n]
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
        from .problem import Problem
        return Problem.from_arrays(self.arrays, precision=str(self.model_attrs.get("precision", "float64")),
                                   beta=float(self.model_attrs.get("beta", np.inf)))


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


def open_trajectory(path: str | Path) -> Trajectory:
    """Read a trajectory file; TrajectoryError (one line) if it is not a readable schema-1 file."""
    return Trajectory(path)
