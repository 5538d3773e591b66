"""The commit protocol of a trajectory file: its two checksummed checkpoint slots and which rows they commit.

Rows of /frames and /steps become part of the trajectory only when a checkpoint slot that counts them is flipped
active (docs/schema.md, "Crash safety"); a reader trusts the active slot when its checksum holds, else the previous
one (:func:`trusted_checkpoint`), and reads only the rows it commits (:func:`committed_counts`).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from . import schema
from .file_access import TrajectoryError, error_reason, open_for_reading, plain

FRAME_SCALARS = schema.names("/frames", shape=("F",))



RUNNING = "running"



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



# reads of a checkpoint whose active slot fails its checksum before it is taken as damaged, and the pause (s) between
# two reads that saw the same active index: a live writer's commit takes milliseconds
READ_ATTEMPTS = 5
READ_PAUSE = 0.02


def trusted_slot(f: h5py.File) -> tuple[int, dict[str, np.ndarray], str | None] | None:
    """(index, datasets, note) of the checkpoint slot a reader may trust, or None before the first commit.

    The active slot when its checksum holds; else the other one when its checksum holds and it is the previous
    commit (its step below the one the damaged slot still holds), with ``note`` the one line saying so;
    TrajectoryError naming both when neither holds, or when the other slot was written but never made active (a
    kill between a commit's two flushes: the rows it counts may not all have reached the file). With the active
    index itself damaged, the earlier of two intact slots (it was active once)."""
    grp = f["checkpoint"]

    def active_index() -> int:
        try:
            if hasattr(grp["active"], "refresh") and f.swmr_mode:
                grp["active"].refresh()
            return int(grp["active"][()])
        except (OSError, RuntimeError, KeyError, ValueError, TypeError):
            return -2

    for attempt in range(READ_ATTEMPTS):
        active = active_index()
        if active == -1:
            return None
        order = (active, 1 - active) if active in (0, 1) else (0, 1)
        found: dict[int, tuple[dict, str | None]] = {}
        for index in order:
            name = f"slot{index}"
            found[index] = _slot_arrays(grp[name]) if name in grp else (None, "missing")
        if found[order[0]][0] is not None:
            break
        # A live writer may have committed meanwhile, even twice and back to the same index (the slot read as
        # active was then being rewritten): read again, after a pause when the index looks unchanged. A slot
        # still damaged after READ_ATTEMPTS reads is damaged.
        if active_index() == active and attempt + 1 < READ_ATTEMPTS:
            time.sleep(READ_PAUSE)
    good = [i for i in order if found[i][0] is not None]
    if not good:
        where = "; ".join(f"slot{i}: {found[i][1]}" for i in order)
        raise TrajectoryError(f"{f.filename}: both checkpoint slots are damaged ({where}): nothing to resume from "
                              f"safely; start again with --force")
    if active in (0, 1) and good[0] == active:
        return active, found[active][0], None
    if active in (0, 1):
        # The other slot is the previous commit only if its step lies below the active one's. A slot written but
        # never flipped active (a kill between the two flushes of a commit) holds a later step, and the rows it
        # counts were in the flush the kill interrupted: they may not all be in the file.
        index = 1 - active
        before = _stored_step(grp[f"slot{active}"])
        if before is None or int(found[index][0]["step"]) >= before:
            order_known = "" if before is None else f", not below the active slot's step {before}"
            raise TrajectoryError(
                f"{f.filename}: checkpoint slot{active} is damaged ({found[active][1]}), and slot{index} holds a "
                f"commit that was never made active (step {int(found[index][0]['step'])}{order_known}), whose "
                f"rows may not all be in the file: nothing to resume from safely; start again with --force")
        what = f"checkpoint slot{active} is damaged ({found[active][1]})"
        label = "the checkpoint before it"
    else:
        # the active index itself is damaged: the earlier slot was active once, so its rows are all in the file;
        # the later one may be a commit that was never made active
        index = min(good, key=lambda i: int(found[i][0]["step"]))
        what = "the active checkpoint index is damaged"
        label = "the earlier of the two" if len(good) == 2 else "the one whose checksum holds"
    arrays = found[index][0]
    return index, arrays, (f"{f.filename}: {what}; resuming from slot{index}, {label} "
                           f"(t = {float(arrays['t']):.6g}, step {int(arrays['step'])}): the steps since are "
                           f"recomputed")



def _stored_step(slot: h5py.Group) -> int | None:
    """The ``step`` a slot whose checksum fails still holds, or None when it cannot be read as one integer."""
    try:
        value = np.asarray(slot["step"][()])
        return int(value) if value.shape == () and np.issubdtype(value.dtype, np.integer) else None
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        return None



def trusted_checkpoint(f: h5py.File) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint of an open file a resume may trust (:func:`trusted_slot`: the active one, or the previous
    one when the active slot is damaged) and the one-line note when it is not the active one; (None, None)
    before the first commit. TrajectoryError (one line) when both slots are damaged, or when the checkpoint is
    of an earlier pdeflow (one flat ``extra`` vector) that cannot be resumed."""
    chosen = trusted_slot(f)
    if chosen is None:
        return None, None
    return checkpoint_from(f, chosen[1]), chosen[2]



def checkpoint_from(f: h5py.File, arrays: dict[str, np.ndarray]) -> Checkpoint:
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
    if plain(f.attrs.get("status", "")) != RUNNING:
        return n_frames, n_steps
    chosen = trusted_slot(f) if "checkpoint" in f else None
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



def committed_steps(path: str | Path, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The committed rows of those /steps ``columns`` a file has (:func:`committed_counts`)."""
    with open_for_reading(Path(path)) as f:
        n = committed_counts(f)[1]
        return {c: f["steps"][c][:n] for c in columns if c in f["steps"]}
