"""The trajectory writer: appends frames, step rows and checkpoints to an HDF5 file in SWMR mode, surviving kills.

A new file is built under ``<name>.partial`` from the schema table (:data:`pdeflow.io.schema.ITEMS`), switched to SWMR
mode, and renamed into place once its first checkpoint is committed (a kill before leaves no file, or the one
``--force`` was replacing, and a ``.partial`` the next run removes); rows become part of the trajectory only when a
checkpoint slot that counts them is flipped active
(:mod:`pdeflow.io.checkpoint`); committed rows are never rewritten; a file whose writer died is rebuilt from its
committed content (:mod:`pdeflow.io.recovery`) before it is resumed (docs/schema.md, "Crash safety").
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .._version import __version__
from ..core.config import Config
from . import schema
from .checkpoint import (
    CHECKSUM,
    EXTRA,
    FRAME_SCALARS,
    RUNNING,
    Checkpoint,
    check_extra_names,
    checkpoint_from,
    slot_digest,
    trusted_slot,
)
from .file_access import (
    LIBVER,
    TrajectoryError,
    WriterLock,
    check_no_writer,
    discard_close,
    error_reason,
    fixed_text,
    open_swmr_write,
    partial_path,
    writer_alive,
)
from .problem_file import write_problem
from .recovery import rebuild
from .schema import CHECKSUM_BYTES, RNG_BYTES, SCHEMA, SCHEMA_VERSION
from .trajectory import check_file

# The columns every file of pdeflow's writer has, from the schema table (pdeflow.io.schema.ITEMS).
STEP_COLUMNS = schema.names("/steps", needs=(schema.WRITTEN,))



STATUS_BYTES, MESSAGE_BYTES = 32, 1024

# Every chunk of the frames' fields (omega, mass, density: one frame per chunk, written once) carries HDF5's Fletcher-32
# checksum, which every HDF5 reader checks: a changed byte in a stored frame is a read error, not a different number
# (docs/schema.md, "Checksums"). The scalar columns of /frames and /steps do not: their chunks are rewritten in place
# as rows are appended, and a kill during that write left the chunk failing its checksum, its committed rows
# unreadable (tests/io/test_trajectory.py's random kills, 1 run in 3). False only to measure the cost
# (benchmarks/checksum_cost.py).
CHECKSUMS = True



# Root attributes a run sets when it ends, pre-created so that they can be overwritten in SWMR mode.
END_ATTRS: dict[str, Any] = {"final_time": np.float64(np.nan), "steps": np.int64(-1),
                             "accuracy_lost_at": np.float64(np.nan), "max_identity_defect": np.float64(np.nan),
                             "max_stability_ratio": np.float64(np.nan), "stability_products": np.int64(-1)}



# Fixed-length text attributes a run sets when it ends, with their sizes in bytes.
END_TEXT: dict[str, int] = {"accuracy": 512}



class TrajectoryWriter:
    """Appends frames, step rows and checkpoints to a trajectory file in SWMR mode.

    Create with :meth:`create` (a new file) or :meth:`reopen` (resume). :meth:`append_frame` and
    :meth:`append_steps` write rows that become part of the trajectory only when the next
    :meth:`write_checkpoint` commits them (docs/schema.md, "Crash safety").
    """

    def __init__(self, f: h5py.File, path: Path, lock: WriterLock, partial: Path | None = None) -> None:
        self.f = f
        self.path = path
        self.lock = lock
        # the name a new file is built under until its first commit renames it onto path (None: it is there)
        self.partial = partial
        # Every dataset the writer touches stays open until the file closes: closing a dataset flushes its
        # buffers, and a write failing there (a full disk) would surface as an ignored error in a
        # destructor instead of an exception the caller can handle.
        self.ds: dict[str, h5py.Dataset] = {}
        for group in ("frames", "steps", "checkpoint"):
            f[group].visititems(lambda name, obj, g=group: self.ds.__setitem__(f"{g}/{name}", obj)
                                if isinstance(obj, h5py.Dataset) else None)

    # ---- creation ---------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, cfg: Config, arrays: dict[str, Any], fields: dict[str, np.ndarray],
               step_columns: tuple[str, ...] = (), frame_attrs: dict[str, Any] | None = None,
               extra_shapes: dict[str, tuple[int, ...]] | None = None, measure: str = "particles", beta: float = np.inf,
               precision: str = "float64", compression: str | None = "gzip",
               overwrite: bool = False, steps_attrs: dict[str, Any] | None = None) -> TrajectoryWriter:
        """Create a new file, under ``<path>.partial`` until its first checkpoint is committed
        (:meth:`write_checkpoint`), which renames it onto ``path``: a file at ``path`` is always whole, with a
        committed checkpoint. An existing file is replaced only with ``overwrite``, and only by that rename.
        TrajectoryError (one line) if it cannot be created, or another process is creating it.

        ``arrays`` is :meth:`pdeflow.Problem.arrays`; ``fields`` are the measure's arrays with their shapes
        (e.g. ``omega`` [N,k] and ``mass`` [N]); ``step_columns`` are the extra /steps columns,
        ``steps_attrs`` attributes of /steps, and ``extra_shapes`` the names and shapes of the checkpoints'
        :attr:`Checkpoint.extra` arrays (fixed for the file's life: SWMR mode cannot add datasets).
        """
        path = Path(path)
        extra_shapes = {name: tuple(int(n) for n in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
                        for name, shape in (extra_shapes or {}).items()}
        check_extra_names(extra_shapes)
        if path.exists() and not overwrite:
            raise TrajectoryError(f"{path}: exists (pass overwrite=True to replace it)")
        check_no_writer(path)
        partial = partial_path(path)
        if partial.exists() and writer_alive(partial):
            raise TrajectoryError(f"{path}: another pdeflow process is creating it ({partial.name}); wait for it, or "
                                  f"stop it")
        try:
            partial.unlink(missing_ok=True)    # left by a run killed while creating the file: never whole
            f = h5py.File(partial, "x", libver=LIBVER)
        except OSError as exc:
            raise TrajectoryError(f"cannot create {partial}: {error_reason(exc)}") from None
        lock = None
        try:
            lock = WriterLock(partial)
            cls._populate(f, cfg, arrays, fields, step_columns, frame_attrs or {}, extra_shapes, measure,
                          beta, precision, None if compression in (None, "none") else compression)
            f["steps"].attrs.update(steps_attrs or {})
            f.flush()
            f.swmr_mode = True
        except BaseException as exc:
            discard_close(f)
            if lock is not None:
                lock.release()
            partial.unlink(missing_ok=True)
            if isinstance(exc, (OSError, RuntimeError)):
                raise TrajectoryError(f"cannot create {path}: {error_reason(exc)}") from None
            raise
        return cls(f, path, lock, partial)

    @staticmethod
    def _populate(f: h5py.File, cfg: Config, arrays: dict[str, Any], fields: dict[str, np.ndarray],
                  step_columns: tuple[str, ...], frame_attrs: dict[str, Any],
                  extra_shapes: dict[str, tuple[int, ...]], measure: str,
                  beta: float, precision: str, compression: str | None) -> None:
        f.attrs["schema"] = SCHEMA
        f.attrs["schema_version"] = SCHEMA_VERSION
        f.attrs["pdeflow_version"] = __version__
        f.attrs["created"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        f.attrs["seed"] = cfg.init.seed
        f.attrs["config"] = cfg.to_toml()
        f.attrs["method"] = cfg.solver.method
        f.attrs["measure"] = measure
        for key, size in END_TEXT.items():
            f.attrs[key] = fixed_text("", size)
        f.attrs["status"] = fixed_text(RUNNING, STATUS_BYTES)
        f.attrs["message"] = fixed_text("", MESSAGE_BYTES)
        for key, value in END_ATTRS.items():
            f.attrs[key] = value
        write_problem(f, arrays, beta, precision)
        fr = f.create_group("frames")
        for key, value in frame_attrs.items():
            fr.attrs[key] = value
        for key in FRAME_SCALARS:
            dtype = schema.numpy_dtype(schema.item(f"/frames/{key}"))
            fr.create_dataset(key, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(1024,))
        for key, value in fields.items():
            shape = np.shape(value)
            # one frame per chunk: a frame write adds a chunk and never rewrites a committed one
            fr.create_dataset(key, shape=(0,) + shape, maxshape=(None,) + shape,
                              dtype=schema.numpy_dtype(schema.item(f"/frames/{key}")), chunks=(1,) + shape,
                              compression=compression, fletcher32=CHECKSUMS)
        st = f.create_group("steps")
        for key in STEP_COLUMNS + tuple(step_columns):
            # 8 KiB chunks: a short run's file is not mostly the first chunk of each column
            st.create_dataset(key, shape=(0,), maxshape=(None,), dtype=np.float64, chunks=(1024,))
        ck = f.create_group("checkpoint")
        ck.create_dataset("active", data=np.int64(-1))
        sizes = {"R": RNG_BYTES}
        for s in schema.SLOTS:
            g = ck.create_group(s)
            for it in schema.items_in("/checkpoint/slot#", needs=(schema.REQUIRED,)):
                shape = tuple(sizes[symbol] for symbol in it.shape)
                g.create_dataset(it.name, data=np.zeros(shape, dtype=schema.numpy_dtype(it)))
            g.create_dataset(CHECKSUM, data=np.zeros(CHECKSUM_BYTES, dtype=np.uint8))  # zeros: never written
            x = g.create_group(EXTRA)
            for name, shape in extra_shapes.items():
                x.create_dataset(name, data=np.zeros(shape, dtype=schema.numpy_dtype(schema.item(
                    f"/checkpoint/slot#/{EXTRA}/*"))))
            for key, value in fields.items():
                g.create_dataset(key, data=np.zeros(np.shape(value),
                                                    dtype=schema.numpy_dtype(schema.item(f"/checkpoint/slot#/{key}"))))

    @classmethod
    def reopen(cls, path: str | Path) -> tuple[TrajectoryWriter, Checkpoint]:
        """Open an existing file to continue it: truncate to the active checkpoint, drop its /analysis (of the frames
        before) and return it.

        A file whose writer died is first rebuilt from its committed content (docs/schema.md, "Crash safety", 4)."""
        path = Path(path)
        check_file(path)
        lock = WriterLock(path)
        try:
            f = open_swmr_write(path)
        except OSError:
            lock.release()
            rebuild(path)
            lock = WriterLock(path)
            try:
                f = open_swmr_write(path)
            except OSError as exc:
                lock.release()
                raise TrajectoryError(f"{path}: cannot be opened for writing ({error_reason(exc)})") from None
        try:
            chosen = trusted_slot(f)
            if chosen is None:
                raise TrajectoryError(f"{path}: no complete checkpoint to resume from")
            ck = checkpoint_from(f, chosen[1])
            if int(f["checkpoint"]["active"][()]) != chosen[0]:
                # the trusted slot becomes the active one, so that the next commit overwrites the damaged one
                f["checkpoint"]["active"][()] = chosen[0]
            for key in list(f["frames"].keys()):
                f["frames"][key].resize(ck.n_frames, axis=0)
            for key in list(f["steps"].keys()):
                f["steps"][key].resize(ck.n_steps, axis=0)
            if "analysis" in f:
                # it describes the frames up to the old end: the run's end writes it anew (pdeflow diagnose the gap)
                del f["analysis"]
            f.attrs.modify("status", fixed_text(RUNNING, STATUS_BYTES))
            f.attrs.modify("message", fixed_text("", MESSAGE_BYTES))
            f.flush()
        except BaseException as exc:
            discard_close(f)
            lock.release()
            if isinstance(exc, (OSError, RuntimeError, KeyError, ValueError)):
                raise TrajectoryError(f"{path}: cannot be resumed ({error_reason(exc)})") from None
            raise
        return cls(f, path, lock), ck

    # ---- appending --------------------------------------------------------------------------
    def append_steps(self, rows: dict[str, np.ndarray]) -> None:
        """Append step rows (columns of equal length); committed by the next checkpoint."""
        n = len(np.atleast_1d(rows["time"]))
        if n == 0:
            return
        for key in self.f["steps"].keys():
            ds = self.ds[f"steps/{key}"]
            old = ds.shape[0]
            ds.resize(old + n, axis=0)
            ds[old:] = np.asarray(rows.get(key, np.full(n, np.nan)), dtype=np.float64)

    def append_frame(self, fields: dict[str, np.ndarray], scalars: dict[str, float]) -> None:
        """Append one frame (the measure's fields and the scalars); committed by the next checkpoint."""
        n = self.n_frames
        for key, value in list(fields.items()) + [(key, scalars[key]) for key in FRAME_SCALARS]:
            ds = self.ds[f"frames/{key}"]
            ds.resize(n + 1, axis=0)
            ds[n] = value

    @property
    def n_frames(self) -> int:
        """Frames written (committed or about to be committed by the next checkpoint)."""
        return int(self.ds["frames/time"].shape[0])

    @property
    def n_steps(self) -> int:
        return int(self.ds["steps/time"].shape[0])

    def write_checkpoint(self, ck: Checkpoint) -> None:
        """Commit: write the inactive slot (and, in the same flush, the rows appended since the last
        commit), flush, flip ``active`` to it, flush."""
        active = int(self.ds["checkpoint/active"][()])
        slot_index = 0 if active != 0 else 1
        raw = json.dumps(ck.rng).encode() if ck.rng is not None else b""
        if len(raw) > RNG_BYTES:
            raise ValueError("generator state too large for the checkpoint slot")
        rng = np.zeros(RNG_BYTES, dtype=np.uint8)
        rng[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        names = {key.rpartition("/")[2] for key in self.ds if key.startswith(f"checkpoint/slot0/{EXTRA}/")}
        if set(ck.extra) != names:
            raise ValueError(f"checkpoint extra {sorted(ck.extra)}: the file holds {sorted(names)}")
        values = dict(ck.fields, t=ck.t, dt=ck.dt, step=ck.step, n_frames=ck.n_frames, n_steps=ck.n_steps, rng=rng)
        values.update({f"{EXTRA}/{name}": value for name, value in ck.extra.items()})
        prefix = f"checkpoint/slot{slot_index}/"
        written = {}
        for key, value in values.items():
            ds = self.ds[prefix + key]
            written[key] = np.asarray(value, dtype=ds.dtype).reshape(ds.shape)
            ds[...] = written[key]
        if prefix + CHECKSUM in self.ds:
            # over every dataset of the slot, as read back (a field the checkpoint lacks keeps its old value)
            whole = {key[len(prefix):]: written.get(key[len(prefix):]) for key in self.ds
                     if key.startswith(prefix) and key != prefix + CHECKSUM}
            self.ds[prefix + CHECKSUM][...] = slot_digest({k: v if v is not None else self.ds[prefix + k][()]
                                                           for k, v in whole.items()})
        self.f.flush()
        self.ds["checkpoint/active"][()] = slot_index
        self.f.flush()
        if self.partial is not None:
            # the first commit: the file is whole (the README's recipe reads it), so it takes its name now; a kill
            # before this rename leaves the old file (--force) or none, and the .partial the next run removes
            os.replace(self.partial, self.path)
            self.partial = None

    def _publish_finished(self) -> None:
        """An explicit finish names a file its writer calls whole (one that records frames without checkpoints)."""
        if self.partial is not None:
            os.replace(self.partial, self.path)
            self.partial = None

    def _discard_unpublished(self) -> None:
        """Remove the file of a writer closed before its first commit: it never was whole."""
        if self.partial is not None:
            self.partial.unlink(missing_ok=True)
            self.partial = None

    def finish(self, status: str, message: str, attrs: dict[str, Any] | None = None) -> None:
        """Record how the run ended and close. Call after the final :meth:`write_checkpoint`.

        ``attrs`` may set the root attributes of :data:`END_ATTRS` (``final_time``, ``steps``, ...) and
        :data:`END_TEXT`; those a file written by an older pdeflow lacks are skipped (SWMR cannot add them)."""
        try:
            self.f.attrs.modify("status", fixed_text(status, STATUS_BYTES))
            self.f.attrs.modify("message", fixed_text(message, MESSAGE_BYTES))
            for key, value in (attrs or {}).items():
                if key not in END_ATTRS and key not in END_TEXT:
                    raise KeyError(f"finish: {key!r} is not one of {', '.join(list(END_ATTRS) + list(END_TEXT))}")
                if key not in self.f.attrs:
                    continue
                self.f.attrs.modify(key, fixed_text(str(value), END_TEXT[key]) if key in END_TEXT
                                    else np.asarray(value, dtype=END_ATTRS[key].dtype))
            self.f.flush()
        finally:
            self.f.close()
            self._publish_finished()
            self.lock.release()

    def close(self) -> None:
        """Flush and close without recording a status (the file stays resumable; a file with no commit yet is
        removed)."""
        try:
            self.f.flush()
        finally:
            self.f.close()
            self._discard_unpublished()
            self.lock.release()

    def abandon(self) -> None:
        """Close after a failed write (:func:`discard_close`): the committed rows stay as they are (a file with no
        commit yet is removed)."""
        discard_close(self.f)
        self._discard_unpublished()
        self.lock.release()
