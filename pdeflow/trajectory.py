"""The HDF5 trajectory file, schema version 1: a writer that survives kills, and a reader.

The layout is the table :data:`pdeflow.schema.ITEMS` (the writer creates the file from it, :func:`check_file` checks
a file against it); the page docs/schema.md shows it, with the commit protocol and what a kill at any instant leaves
behind ("Crash safety"). In short: a new file is built under ``<name>.partial`` and renamed into place in SWMR mode;
rows become part of the trajectory only when a checkpoint slot that counts them is flipped active; committed rows are
never rewritten; a file whose writer died is rebuilt from its committed content before it is resumed; one writer at a
time holds an advisory lock (:class:`WriterLock`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from . import schema
from ._version import __version__
from .config import Config, ConfigError, loads_config
from .schema import CHECKSUM_BYTES, RNG_BYTES, SCHEMA, SCHEMA_VERSION

# The columns every file of pdeflow's writer has, from the schema table (pdeflow.schema.ITEMS).
STEP_COLUMNS = schema.names("/steps", needs=(schema.WRITTEN,))
FRAME_SCALARS = schema.names("/frames", shape=("F",))
RUNNING = "running"
STATUS_BYTES, MESSAGE_BYTES = 32, 1024
# Root attributes a run sets when it ends, pre-created so that they can be overwritten in SWMR mode.
END_ATTRS: dict[str, Any] = {"final_time": np.float64(np.nan), "steps": np.int64(-1),
                             "accuracy_lost_at": np.float64(np.nan), "max_identity_defect": np.float64(np.nan),
                             "max_stability_ratio": np.float64(np.nan), "stability_products": np.int64(-1)}
# Fixed-length text attributes a run sets when it ends, with their sizes in bytes.
END_TEXT: dict[str, int] = {"accuracy": 512}
COPY_ROWS = 4096  # rows per block when copying a dataset during recovery
# The HDF5 file-format bounds of every file the writer creates or reopens: objects in the oldest format that
# SWMR writing needs (1.10), so that HDF5 1.10's tools (Debian's h5dump) read them; a "latest" lower bound
# made a newer HDF5 write its filter pipelines in a format those tools do not know.
LIBVER = ("v110", "latest")


class TrajectoryError(Exception):
    """A file that is missing, not a pdeflow trajectory, truncated, or of another schema version,
    or an output file that cannot be created."""


def error_reason(exc: BaseException) -> str:
    """The cause of an exception in a few words for a one-line error: the OS's message when there is one
    (HDF5 reports a failed write as "... errno = 28, error message = 'No space left on device' ...")."""
    text = getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__
    found = re.search(r"error message = '([^']*)'", str(text))
    if found:
        return found.group(1)
    return (str(text).splitlines() or [exc.__class__.__name__])[0][:120]


def discard_close(f: h5py.File) -> None:
    """Close a file after a failed write without writing anything more to it.

    HDF5 retries its dirty cache when a file is closed; after a failed write (a full disk) that fails
    again, noisily, and can crash the interpreter at exit. The file descriptor is first pointed at
    /dev/null (which accepts any write, whatever the disk or RLIMIT_FSIZE), so the close completes there
    and the file on disk stays exactly as the failure left it: like a killed run, its committed rows
    intact and the file resumable."""
    with contextlib.suppress(Exception):
        fd = f.id.get_vfd_handle()
        sink = os.open(os.devnull, os.O_RDWR)
        os.dup2(sink, fd)
        os.close(sink)
    with contextlib.suppress(Exception):
        f.close()


def _fixed_text(text: str, size: int) -> np.ndarray:
    """``text`` as a fixed-length UTF-8 string of at most ``size`` bytes (cut on a character boundary)."""
    raw = text.encode("utf-8")
    if len(raw) > size:
        raw = raw[:size - 3].decode("utf-8", errors="ignore").encode("utf-8") + b"..."
    return np.array(raw, dtype=h5py.string_dtype("utf-8", size))


class WriterLock:
    """The advisory lock a writer holds on its file: "a pdeflow process is writing this".

    An open-file-description record lock (Linux ``F_OFD_SETLK``; POSIX ``lockf`` elsewhere) on one byte at
    offset 2**62, far beyond the data. Record locks are independent of the ``flock`` locks HDF5 takes for
    itself (which SWMR readers need), the kernel drops them when the process dies, and they bind the
    inode, so they follow the file through a rename. TrajectoryError if another process holds it."""
    OFFSET = 2**62

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR)
        try:
            import fcntl
            if hasattr(fcntl, "F_OFD_SETLK"):
                fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK,
                            struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, self.OFFSET, 1, 0))
            else:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self.OFFSET)
        except OSError:
            os.close(self.fd)
            raise TrajectoryError(f"{path}: another pdeflow process is writing it (wait for it to end, or "
                                  f"stop it: it checkpoints on SIGINT/SIGTERM)") from None

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def check_no_writer(path: Path) -> None:
    """TrajectoryError if a live writer holds ``path`` (nothing to check for a missing file)."""
    if path.is_file():
        WriterLock(path).release()


def _partial_path(path: Path) -> Path:
    """The sibling a new or rebuilt file is written to before it is renamed onto ``path``."""
    return path.with_name(path.name + ".partial")


EXTRA = "extra"  # the group of a checkpoint slot holding the named arrays of Checkpoint.extra
CHECKSUM = "checksum"  # the dataset of a checkpoint slot holding the SHA-256 of its other datasets


@dataclass
class Checkpoint:
    """A complete, resumable state: fields, time, step size, step count, generator state, and ``extra``: named
    float arrays of any shapes beyond the state (a run keeps ``stepper``, its controller state, and ``accuracy``,
    its accuracy record's), stored as ``/checkpoint/slot#/extra/<name>`` and read back as the same dict."""
    fields: dict[str, np.ndarray]
    t: float
    dt: float
    step: int
    n_frames: int
    n_steps: int
    rng: dict | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def check_extra_names(names: Iterator[str] | list[str] | dict) -> None:
    """ValueError unless every name of a checkpoint's ``extra`` can be a dataset of the slot's ``extra`` group
    (a non-empty HDF5 link name without ``/``)."""
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(f"checkpoint extra: {name!r} is not a valid name (non-empty, no '/')")


def _open_swmr_write(path: Path) -> h5py.File:
    """Open an existing file for writing directly in SWMR mode (so that it is never open non-SWMR)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_LATEST)  # LIBVER
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_WRITE, fapl)
    return h5py.File(fid)


def write_problem(f: h5py.File, arrays: dict[str, Any], beta: float = np.inf, precision: str = "float64") -> None:
    """Store a problem in ``/model`` and ``/data`` (the layout of :data:`pdeflow.schema.ITEMS`) so that the file alone
    rebuilds it (:func:`read_problem`): ``arrays`` is :meth:`pdeflow.Problem.arrays`. Trajectories and the
    result files of ``pdeflow chaos`` and ``pdeflow stability`` (:func:`new_result_file`) share it."""
    for group in ("/model", "/data"):
        g = f.create_group(group)
        for it in schema.items_in(group):
            if it.need == schema.REQUIRED or arrays.get(it.name) is not None:
                g.create_dataset(it.name, data=np.asarray(arrays[it.name], dtype=schema.numpy_dtype(it)))
    m = f["model"]
    m.attrs["head_dim"] = int(arrays["head_dim"])
    m.attrs["score_scale"] = float(arrays["score_scale"])
    m.attrs["weight_decay"] = float(arrays["weight_decay"])
    m.attrs["beta"] = float(beta)
    m.attrs["precision"] = precision
    m.attrs["k"] = int(np.asarray(arrays["theta0"]).shape[0] if arrays.get("basis") is None
                       else np.asarray(arrays["basis"]).shape[1])


class TrajectoryWriter:
    """Appends frames, step rows and checkpoints to a trajectory file in SWMR mode.

    Create with :meth:`create` (a new file) or :meth:`reopen` (resume). :meth:`append_frame` and
    :meth:`append_steps` write rows that become part of the trajectory only when the next
    :meth:`write_checkpoint` commits them (docs/schema.md, "Crash safety").
    """

    def __init__(self, f: h5py.File, path: Path, lock: WriterLock) -> None:
        self.f = f
        self.path = path
        self.lock = lock
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
        """Create a new file; an existing one is replaced only with ``overwrite`` (atomically, once the new
        file is complete and in SWMR mode). TrajectoryError (one line) if it cannot be created.

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
        partial = _partial_path(path)
        try:
            partial.unlink(missing_ok=True)
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
            os.replace(partial, path)
        except BaseException as exc:
            discard_close(f)
            if lock is not None:
                lock.release()
            partial.unlink(missing_ok=True)
            if isinstance(exc, (OSError, RuntimeError)):
                raise TrajectoryError(f"cannot create {path}: {error_reason(exc)}") from None
            raise
        return cls(f, path, lock)

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
            f.attrs[key] = _fixed_text("", size)
        f.attrs["status"] = _fixed_text(RUNNING, STATUS_BYTES)
        f.attrs["message"] = _fixed_text("", MESSAGE_BYTES)
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
                              compression=compression)
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
        """Open an existing file to continue it: truncate to the active checkpoint and return it.

        A file whose writer died is first rebuilt from its committed content (docs/schema.md, "Crash safety", 4)."""
        path = Path(path)
        check_file(path)
        lock = WriterLock(path)
        try:
            f = _open_swmr_write(path)
        except OSError:
            lock.release()
            _rebuild(path)
            lock = WriterLock(path)
            try:
                f = _open_swmr_write(path)
            except OSError as exc:
                lock.release()
                raise TrajectoryError(f"{path}: cannot be opened for writing ({error_reason(exc)})") from None
        try:
            chosen = _trusted_slot(f)
            if chosen is None:
                raise TrajectoryError(f"{path}: no complete checkpoint to resume from")
            ck = _checkpoint_from(f, chosen[1])
            if int(f["checkpoint"]["active"][()]) != chosen[0]:
                # the trusted slot becomes the active one, so that the next commit overwrites the damaged one
                f["checkpoint"]["active"][()] = chosen[0]
            for key in list(f["frames"].keys()):
                f["frames"][key].resize(ck.n_frames, axis=0)
            for key in list(f["steps"].keys()):
                f["steps"][key].resize(ck.n_steps, axis=0)
            f.attrs.modify("status", _fixed_text(RUNNING, STATUS_BYTES))
            f.attrs.modify("message", _fixed_text("", MESSAGE_BYTES))
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

    def finish(self, status: str, message: str, attrs: dict[str, Any] | None = None) -> None:
        """Record how the run ended and close. Call after the final :meth:`write_checkpoint`.

        ``attrs`` may set the root attributes of :data:`END_ATTRS` (``final_time``, ``steps``, ...) and
        :data:`END_TEXT`; those a file written by an older pdeflow lacks are skipped (SWMR cannot add them)."""
        try:
            self.f.attrs.modify("status", _fixed_text(status, STATUS_BYTES))
            self.f.attrs.modify("message", _fixed_text(message, MESSAGE_BYTES))
            for key, value in (attrs or {}).items():
                if key not in END_ATTRS and key not in END_TEXT:
                    raise KeyError(f"finish: {key!r} is not one of {', '.join(list(END_ATTRS) + list(END_TEXT))}")
                if key not in self.f.attrs:
                    continue
                self.f.attrs.modify(key, _fixed_text(str(value), END_TEXT[key]) if key in END_TEXT
                                    else np.asarray(value, dtype=END_ATTRS[key].dtype))
            self.f.flush()
        finally:
            self.f.close()
            self.lock.release()

    def close(self) -> None:
        """Flush and close without recording a status (the file stays resumable)."""
        try:
            self.f.flush()
        finally:
            self.f.close()
            self.lock.release()

    def abandon(self) -> None:
        """Close after a failed write (:func:`discard_close`): the committed rows stay as they are."""
        discard_close(self.f)
        self.lock.release()


def slot_digest(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """SHA-256 [32 bytes] of a checkpoint slot's datasets (``arrays``: path in the slot -> values): in name order,
    each name, type, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        digest.update(a.tobytes())
    return np.frombuffer(digest.digest(), dtype=np.uint8)


def _slot_arrays(slot: h5py.Group) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """(every dataset of a checkpoint slot but its checksum, by path in the slot; None) when the slot's
    checksum matches them or the slot has none (a file from before checksums), else (None, why not)."""
    arrays: dict[str, np.ndarray] = {}
    try:
        slot.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                        if isinstance(obj, h5py.Dataset) and name != CHECKSUM else None)
        stored = slot[CHECKSUM][()] if CHECKSUM in slot else None
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        return None, f"unreadable: {error_reason(exc)[:80]}"
    if stored is None:
        return arrays, None
    if not np.any(stored):
        return None, "never written"
    if not np.array_equal(slot_digest(arrays), stored):
        return None, "checksum mismatch"
    return arrays, None


def _trusted_slot(f: h5py.File) -> tuple[int, dict[str, np.ndarray], str | None] | None:
    """(index, datasets, note) of the checkpoint slot a reader may trust, or None before the first commit.

    The active slot when its checksum holds; else the other one (the previous commit) when its checksum
    holds, with ``note`` the one line saying so; TrajectoryError naming both when neither holds (resuming
    would continue from wrong data)."""
    grp = f["checkpoint"]

    def active_index() -> int:
        try:
            if hasattr(grp["active"], "refresh") and f.swmr_mode:
                grp["active"].refresh()
            return int(grp["active"][()])
        except (OSError, RuntimeError, KeyError, ValueError, TypeError):
            return -2

    for _ in range(3):
        active = active_index()
        if active == -1:
            return None
        order = (active, 1 - active) if active in (0, 1) else (0, 1)
        found: dict[int, tuple[dict, str | None]] = {}
        for index in order:
            name = f"slot{index}"
            found[index] = _slot_arrays(grp[name]) if name in grp else (None, "missing")
        if found[order[0]][0] is not None or active_index() == active:
            break   # else a live writer committed meanwhile: read the slots again
    good = [i for i in order if found[i][0] is not None]
    if not good:
        where = "; ".join(f"slot{i}: {found[i][1]}" for i in order)
        raise TrajectoryError(f"{f.filename}: both checkpoint slots are damaged ({where}): nothing to resume from "
                              f"safely; start again with --force")
    if active in (0, 1) and good[0] == active:
        return active, found[active][0], None
    # the active slot failed (or the active index itself is damaged): the newest slot whose checksum holds
    index = max(good, key=lambda i: int(found[i][0]["step"]))
    arrays = found[index][0]
    what = f"checkpoint slot{active} is damaged ({found[active][1]})" if active in (0, 1) else \
        "the active checkpoint index is damaged"
    return index, arrays, (f"{f.filename}: {what}; resuming from slot{index}, the checkpoint before it "
                           f"(t = {float(arrays['t']):.6g}, step {int(arrays['step'])}): the steps since are "
                           f"recomputed")


def trusted_checkpoint(f: h5py.File) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint of an open file a resume may trust (:func:`_trusted_slot`: the active one, or the previous
    one when the active slot is damaged) and the one-line note when it is not the active one; (None, None)
    before the first commit. TrajectoryError (one line) when both slots are damaged, or when the checkpoint is
    of an earlier pdeflow (one flat ``extra`` vector) that cannot be resumed."""
    chosen = _trusted_slot(f)
    if chosen is None:
        return None, None
    return _checkpoint_from(f, chosen[1]), chosen[2]


def _checkpoint_from(f: h5py.File, arrays: dict[str, np.ndarray]) -> Checkpoint:
    """The :class:`Checkpoint` of a slot's datasets (:func:`_slot_arrays`)."""
    if isinstance(arrays.get(EXTRA), np.ndarray):
        raise TrajectoryError(f"{f.filename}: its checkpoint holds one flat extra vector (a pdeflow before named "
                              f"checkpoint arrays wrote it): it cannot be resumed; start again with --force")
    fields = {key: arrays[key] for key in f["frames"].keys() if key not in FRAME_SCALARS and key in arrays}
    raw = bytes(arrays["rng"]).rstrip(b"\0")
    extra = {name[len(EXTRA) + 1:]: value for name, value in arrays.items() if name.startswith(EXTRA + "/")}
    return Checkpoint(fields=fields, t=float(arrays["t"]), dt=float(arrays["dt"]), step=int(arrays["step"]),
                      n_frames=int(arrays["n_frames"]), n_steps=int(arrays["n_steps"]),
                      rng=json.loads(raw) if raw else None, extra=extra)


def read_checkpoint(f: h5py.File) -> Checkpoint | None:
    """The checkpoint of an open file a resume may trust (:func:`trusted_checkpoint`), or None before the first
    one."""
    return trusted_checkpoint(f)[0]


def committed_counts(f: h5py.File) -> tuple[int, int]:
    """The rows of /frames and /steps that belong to the trajectory: all of them once the run has ended;
    while its status is "running" (in progress, or its process died), those of the trusted checkpoint
    (:func:`trusted_checkpoint`)."""
    n_frames, n_steps = int(f["frames"]["time"].shape[0]), int(f["steps"]["time"].shape[0])
    if _plain(f.attrs.get("status", "")) != RUNNING:
        return n_frames, n_steps
    chosen = _trusted_slot(f) if "checkpoint" in f else None
    if chosen is None:
        return 0, 0
    arrays = chosen[1]
    return min(n_frames, int(arrays["n_frames"])), min(n_steps, int(arrays["n_steps"]))


def row_counts(f: h5py.File) -> tuple[int, int]:
    """The rows of /frames and /steps that belong to the trajectory: :func:`committed_counts` for a file of
    pdeflow's writer, every row for a file from another code (no /checkpoint; S = 0 without /steps)."""
    if "checkpoint" in f and "steps" in f and "time" in f["steps"]:
        return committed_counts(f)
    return int(f["frames"]["time"].shape[0]), (int(f["steps"]["time"].shape[0]) if "steps" in f and "time" in f["steps"]
                                                else 0)


def schema_error(path: str | Path, problems: list[str]) -> TrajectoryError:
    """The one-line error of a file departing from the schema (:func:`pdeflow.schema.check`): its first problem,
    and how many more there are; the reader and :func:`pdeflow.reference.read_run` raise it alike."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return TrajectoryError(f"{path}: {problems[0]}{more}")


def committed_steps(path: str | Path, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The committed rows of those /steps ``columns`` a file has (:func:`committed_counts`)."""
    with _open_read(Path(path)) as f:
        n = committed_counts(f)[1]
        return {c: f["steps"][c][:n] for c in columns if c in f["steps"]}


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _superblock(path: Path) -> tuple[int, int, int, int] | None:
    """(superblock version, file consistency flags, end-of-file address (absolute), the file's size) of an HDF5
    file with a version 2 or 3 superblock, else None.

    HDF5 file format, superblock versions 2 and 3: after the 8-byte signature come the version, the sizes of
    offsets and lengths, the file consistency flags (bit 0: open for writing, bit 2: for SWMR writing), then
    the base address, the superblock extension address and the end-of-file address (offsets of the stored
    size). The signature is at byte 0 or, after a user block, at 512 * 2**i."""
    try:
        with open(path, "rb") as fh:
            offset, size = 0, os.fstat(fh.fileno()).st_size
            while offset + 12 <= size:
                fh.seek(offset)
                head = fh.read(12)
                if head[:8] == HDF5_SIGNATURE:
                    if head[8] < 2 or head[9] not in (2, 4, 8):
                        return None
                    width = head[9]
                    fields = fh.read(3 * width)
                    if len(fields) < 3 * width:
                        return head[8], head[11], size + 1, size
                    base, _, end = (int.from_bytes(fields[i * width:(i + 1) * width], "little") for i in range(3))
                    return head[8], head[11], base + end, size
                offset = 512 if offset == 0 else 2 * offset
    except OSError:
        pass
    return None


def open_by_swmr_writer(path: Path) -> bool:
    """Whether the file's superblock says a SWMR writer has it open (it is running, or it died)."""
    found = _superblock(path)
    return found is not None and found[0] >= 3 and found[1] & 0b101 == 0b101


def _short_of(path: Path) -> tuple[int, int] | None:
    """(size, stored end) of a file whose writer died and that is shorter than its superblock's end-of-file
    address, else None. A kill leaves a file at least that long (a flush extends it to that end before the next
    write); a shorter one was cut, or its last writes failed (a full disk, a file size limit)."""
    found = _superblock(path)
    if found is None or found[3] >= found[2] or writer_alive(path):
        return None
    return found[3], found[2]


def _open_swmr_read(path: Path, attempts: int | None) -> h5py.File:
    """Open in SWMR read mode; ``attempts``: how often HDF5 reads a piece of metadata that fails its checksum
    (SWMR readers retry for minutes by default; h5py does not expose H5Pset_metadata_read_attempts, so it is
    called in h5py's own HDF5 library when found, else the default stays)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    if attempts is not None:
        _set_read_attempts(fapl, attempts)
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl)
    return h5py.File(fid)


def _set_read_attempts(fapl: Any, attempts: int) -> None:
    import ctypes
    import glob

    libs = glob.glob(os.path.join(os.path.dirname(h5py.__file__) + ".libs", "libhdf5-*.so*"))
    try:
        lib = ctypes.CDLL(libs[0]) if libs else ctypes.CDLL(None)
        setter = lib.H5Pset_metadata_read_attempts
    except (OSError, AttributeError):
        return
    setter.argtypes, setter.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
    setter(fapl.id, attempts)


def _open_read(path: Path) -> h5py.File:
    """Open for reading; a file whose SWMR writer is running or died is read in SWMR mode (only such a file).

    SWMR reading skips HDF5's check that the file is not truncated and retries metadata reads that fail their
    checksum for minutes: a file whose writer died and that is shorter than its superblock says
    (:func:`_short_of`) is read with one attempt, and :func:`check_file` checks that its committed rows lie
    within it."""
    try:
        return h5py.File(path, "r")
    except OSError as first:
        if not open_by_swmr_writer(path):
            raise
        short = _short_of(path)
        try:
            return _open_swmr_read(path, 1 if short else None)
        except OSError:
            if short:
                raise OSError(f"truncated file: eof = {short[0]}, sblock->base_addr = 0, "
                              f"stored_eof = {short[1]}") from None
            raise first from None


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


def open_for_reading(path: str | Path) -> h5py.File:
    """Open a trajectory read-only with h5py, also while its SWMR writer runs or after it died; read the
    rows :func:`committed_counts` gives."""
    return _open_read(Path(path))


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
        with _open_read(path) as f:
            if _plain(f.attrs.get("schema")) != SCHEMA:
                raise TrajectoryError(f"{path}: not a pdeflow trajectory (no schema = {SCHEMA!r} attribute)")
            version = _plain(f.attrs.get("schema_version"))
            if version != SCHEMA_VERSION:
                raise TrajectoryError(f"{path}: schema version {version}, this pdeflow reads version {SCHEMA_VERSION}")
            problems = schema.check(f, lambda: row_counts(f), needs=(schema.REQUIRED, schema.WRITTEN))
            if problems:
                raise schema_error(path, [p.message for p in problems])
            short = _short_of(path) if "checkpoint" in f else None
            beyond = _rows_beyond(f, short[0]) if short else None
            if beyond:
                raise TrajectoryError(f"{path}: truncated file ({short[0]} bytes of the {short[1]} its HDF5 header "
                                      f"announces): committed rows of {beyond} lie beyond its end")
    except (TrajectoryError, OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, TrajectoryError) and "truncated file" in str(exc):
            raise
        short = _short_of(path) if path.is_file() else None
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


def _copy_attrs(src: h5py.AttributeManager, dst: h5py.AttributeManager) -> None:
    """Copy attributes keeping their stored types (fixed-length strings stay fixed-length)."""
    for key in src.keys():
        dst.create(key, src[key], dtype=src.get_id(key).dtype)


def _rebuild(path: Path) -> None:
    """Rewrite a file whose writer died (HDF5 refuses to reopen it for writing) from its committed
    content: read through SWMR mode into ``<name>.partial``, renamed over ``path`` once complete."""
    try:
        copy_committed(path, path)
    except TrajectoryError as exc:
        raise TrajectoryError(f"{path}: its writer died and the file cannot be recovered "
                              f"({str(exc).removeprefix(f'{path}: ')})") from None


def copy_committed(path: Path, out: Path) -> tuple[int, int]:
    """Write the committed content of the trajectory ``path`` (:func:`committed_counts`: every row of an ended
    run, the active checkpoint's rows of a running or killed one) as a new, cleanly closed file ``out``: built
    under ``<out>.partial`` and renamed onto ``out`` only when complete (``out`` may be ``path``: then a kill
    during the copy leaves the original as it was). Returns the (frames, steps) copied; TrajectoryError (one
    line) if the file cannot be read or the copy written."""
    partial = _partial_path(out)
    dst = None
    try:
        with _open_read(path) as src:
            n_frames, n_steps = committed_counts(src)
            partial.unlink(missing_ok=True)
            dst = h5py.File(partial, "x", libver=LIBVER)
            _copy_attrs(src.attrs, dst.attrs)
            for name in src.keys():
                if name not in ("frames", "steps"):
                    src.copy(src[name], dst, name=name)
                    continue
                rows = n_frames if name == "frames" else n_steps
                g = dst.create_group(name)
                _copy_attrs(src[name].attrs, g.attrs)
                for key, ds in src[name].items():
                    out_ds = g.create_dataset(key, shape=(rows,) + ds.shape[1:], maxshape=ds.maxshape,
                                              dtype=ds.dtype, chunks=ds.chunks, compression=ds.compression,
                                              compression_opts=ds.compression_opts)
                    for start in range(0, rows, COPY_ROWS):
                        out_ds[start:start + COPY_ROWS] = ds[start:min(rows, start + COPY_ROWS)]
            dst.close()
        os.replace(partial, out)
    except BaseException as exc:
        if dst is not None:
            discard_close(dst)
        partial.unlink(missing_ok=True)
        if isinstance(exc, (OSError, RuntimeError, KeyError, ValueError)):
            raise TrajectoryError(f"{path}: {error_reason(exc)}") from None
        raise
    return n_frames, n_steps


def writer_alive(path: str | Path) -> bool:
    """Whether a live process holds ``path``'s :class:`WriterLock` (asked without taking it, so a read-only
    file can be asked too; False when it cannot be asked)."""
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY)
    except (OSError, ImportError):
        return False
    try:
        if not hasattr(fcntl, "F_OFD_GETLK"):
            return False
        query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, WriterLock.OFFSET, 1, 0)
        return struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))[0] != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        os.close(fd)


def needs_recovery(path: str | Path) -> bool:
    """Whether ``path`` is a file whose writer died: HDF5's SWMR-write flag is still set but no writer holds it.
    HDF5 tools other than a SWMR reader (plain h5py, h5dump, HDFView) refuse it until :func:`recover`."""
    return open_by_swmr_writer(Path(path)) and not writer_alive(path)


def recovery_hint(path: str | Path) -> str | None:
    """The one line ``info`` and ``validate`` print for a file whose writer died (None for any other file)."""
    if not needs_recovery(path):
        return None
    return (f"{path}: its writer died, so plain h5py, h5dump and other HDF5 tools refuse it: "
            f"pdeflow recover {path} rewrites it consistently (every committed frame, still resumable)")


def recover(path: str | Path, out: str | Path | None = None) -> tuple[int, int]:
    """Make a trajectory whose writer died readable by any HDF5 tool: its committed content
    (:func:`copy_committed`) written to ``out``, or, without ``out``, to a complete copy that then replaces
    ``path`` (a kill at any moment leaves ``path`` as it was, or recovered). The result opens with plain
    ``h5py.File(path)`` and ``h5dump`` and ``pdeflow run --resume`` continues it bit for bit. A file that no writer
    left open is only copied (to ``out``) or left as it is. Returns the (frames, steps) it holds; TrajectoryError
    (one line) if it is not a readable trajectory or a live writer holds it."""
    path = Path(path)
    check_file(path)
    if writer_alive(path):
        raise TrajectoryError(f"{path}: a pdeflow process is writing it (wait for it to end, or stop it: it "
                              f"checkpoints on SIGINT/SIGTERM); only a file whose writer died needs recovery")
    if out is not None and Path(out).resolve() != path.resolve():
        return copy_committed(path, Path(out))
    if not open_by_swmr_writer(path):
        with _open_read(path) as f:
            return committed_counts(f)
    lock = WriterLock(path)  # no writer may start on it while it is copied
    try:
        return copy_committed(path, path)
    finally:
        lock.release()


@contextlib.contextmanager
def new_result_file(path: str | Path, schema: str, schema_version: int, cfg: Config, *, problem=None,
                    **attrs: Any) -> Iterator[h5py.File]:
    """Write a result file (``pdeflow chaos``, ``pdeflow stability``) all or nothing.

    ``with new_result_file(p, SCHEMA, 1, cfg) as f: ...`` yields a new file ``<name>.partial`` whose root
    attributes are ``schema``, ``schema_version``, ``pdeflow_version``, ``created`` (UTC), ``config``
    (TOML) and ``attrs``, and, given the ``problem`` (a :class:`pdeflow.Problem`), ``/model`` and ``/data`` as in
    a trajectory (:func:`write_problem`; :func:`stored_problem` rebuilds it from the file alone); it is
    renamed onto ``path`` when the block completes. A kill or an exception
    leaves ``path`` as it was (absent, or the file ``--force`` was going to replace)."""
    path = Path(path)
    partial = _partial_path(path)
    partial.unlink(missing_ok=True)
    try:
        with h5py.File(partial, "x") as f:
            f.attrs.update({"schema": schema, "schema_version": schema_version, "pdeflow_version": __version__,
                            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                            "config": cfg.to_toml(), **attrs})
            if problem is not None:
                write_problem(f, problem.arrays(), problem.beta, problem.precision)
            yield f
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def edit_trajectory(path: str | Path) -> Iterator[h5py.File]:
    """Modify a finished trajectory all or nothing: ``with edit_trajectory(p) as f: f.create_group(...)``.

    The changes are made on a copy (``<name>.partial``) that replaces ``path`` only when the block
    completes; a kill or an exception leaves the original file untouched."""
    path = Path(path)
    check_file(path)
    lock = WriterLock(path)   # no writer may be appending to it meanwhile
    partial = _partial_path(path)
    try:
        shutil.copyfile(path, partial)
        f = h5py.File(partial, "r+")
    except OSError as exc:
        lock.release()
        partial.unlink(missing_ok=True)
        raise TrajectoryError(f"{path}: cannot be edited ({error_reason(exc)})") from None
    try:
        with _terminate_as_exit():
            yield f
            f.close()
            os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(Exception):
            f.close()
        partial.unlink(missing_ok=True)
        raise
    finally:
        lock.release()


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM with its default action (end the process at once) as ``SystemExit(143)`` inside the block, so
    that an edit cleans up its ``.partial`` copy (SIGINT already raises KeyboardInterrupt). Elsewhere, or
    when the program handles SIGTERM itself, nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Trajectory:
    """A trajectory read into memory: ``time`` [F], ``frames`` (dict of [F, ...] arrays), ``steps``
    (dict of columns), ``arrays`` (the problem arrays, as :meth:`pdeflow.Problem.arrays`), ``attrs``
    (root attributes), ``config`` (the :class:`~pdeflow.config.Config`), ``frame_attrs``, ``steps_attrs``, ``analysis``,
    ``checkpoint`` (the trusted :class:`Checkpoint` or None; ``checkpoint_error`` says why when the file has one
    that cannot be used, ``checkpoint_note`` why it is not the active slot). Only committed rows are read
    (:func:`committed_counts`), so the file of a killed run reads as it was at its last commit."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        check_file(self.path)
        try:
            with _open_read(self.path) as f:
                self.attrs = {k: _plain(v) for k, v in f.attrs.items()}
                n, m = committed_counts(f)
                self.steps_attrs = {k: _plain(v) for k, v in f["steps"].attrs.items()}
                self.frames = {k: f["frames"][k][:n] for k in f["frames"].keys()}
                self.frame_attrs = {k: _plain(v) for k, v in f["frames"].attrs.items()}
                self.steps = {k: f["steps"][k][:m] for k in f["steps"].keys()}
                self.arrays, self.model_attrs = read_problem(f)
                self.analysis = ({k: f["analysis"][k][()] for k in f["analysis"].keys()}
                                 | {k: _plain(v) for k, v in f["analysis"].attrs.items()}) if "analysis" in f else {}
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


def read_problem(f: h5py.File) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arrays (as :meth:`pdeflow.Problem.arrays`) and the ``/model`` attributes that :func:`write_problem`
    stored in an open file; KeyError if ``/model`` or ``/data`` is missing."""
    model, data = f["model"], f["data"]
    arrays: dict[str, Any] = {k: model[k][()] for k in model.keys()}
    arrays.setdefault("basis", None)
    arrays.update({k: data[k][()] for k in data.keys()})
    arrays.update({k: _plain(model.attrs[k]) for k in ("head_dim", "score_scale", "weight_decay")})
    return arrays, {k: _plain(v) for k, v in model.attrs.items()}


def problem_of(arrays: dict[str, Any], model_attrs: dict[str, Any]):
    """The :class:`pdeflow.Problem` of :func:`read_problem`'s output (its precision and beta included)."""
    from .problem import Problem
    return Problem.from_arrays(arrays, precision=str(model_attrs.get("precision", "float64")),
                               beta=float(model_attrs.get("beta", np.inf)))


def stored_problem(path: str | Path):
    """The :class:`pdeflow.Problem` stored in any pdeflow file with ``/model`` and ``/data`` (a trajectory,
    or a ``pdeflow chaos`` / ``pdeflow stability`` result): the file alone rebuilds it. TrajectoryError
    (one line) if the file has none."""
    try:
        with h5py.File(path, "r") as f:
            return problem_of(*read_problem(f))
    except (OSError, KeyError) as exc:
        raise TrajectoryError(f"{path}: no stored problem (/model and /data): {error_reason(exc)[:80]}") from None


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
        if isinstance(v, bytes):
            return v.decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        return v.item()
    return v


def open_trajectory(path: str | Path) -> Trajectory:
    """Read a trajectory file; TrajectoryError (one line) if it is not a readable schema-1 file."""
    return Trajectory(path)
