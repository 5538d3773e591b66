"""The trajectory file (pdeflow.io.trajectory): writer/reader round trip, the commit protocol, crash safety of
the writer under SIGKILL at every stage of a commit and at random moments, recovery, atomic edits.

The crash tests run a writer-only script (no solver, so almost all of its time is spent writing and a
random kill lands inside a commit) in a subprocess. Frame ``i`` holds values computed from ``i`` alone,
so every committed frame can be checked exactly.
"""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow.core.config import loads_config
from pdeflow.io.checkpoint import Checkpoint, committed_counts
from pdeflow.io.file_access import TrajectoryError, open_for_reading
from pdeflow.io.result_files import edit_trajectory
from pdeflow.io.trajectory import check_file, open_trajectory
from pdeflow.io.trajectory_writer import END_ATTRS, MESSAGE_BYTES, TrajectoryWriter

REPO = Path(__file__).resolve().parents[2]
N, K, V, T, D, DH, B = 5, 3, 3, 4, 4, 2, 6
CONFIG = f"[task]\nvocab_size = {V}\nseq_len = {T}\nn_samples = {B}\n[model]\nd = {D}\nhead_dim = {DH}\n"


def problem_arrays() -> dict:
    """Arrays in the layout of Problem.arrays() (a k = 3 basis), built without a Problem."""
    rng = np.random.default_rng(7)
    p = 4 * D * DH
    return {"embedding": rng.normal(size=(V, D)), "positions": rng.normal(size=(T, D)),
            "unembedding": rng.normal(size=(V, D)), "tokens": rng.integers(0, V, size=(B, T)),
            "targets": rng.integers(0, V, size=(B, T)), "mask": np.ones((B, T)), "weights": np.full(B, 1 / B),
            "theta0": rng.normal(size=p), "basis": rng.normal(size=(p, K)), "head_dim": DH, "score_scale": 0.7,
            "weight_decay": 0.01}


def frame_fields(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + i)
    mass = rng.random(N)
    return {"omega": rng.normal(size=(N, K)), "mass": mass / mass.sum()}


def frame_scalars(i: int) -> dict[str, float]:
    return {"time": 0.5 * i, "step": 3 * i, "dt": 0.5 / 3, "wall_time": 0.0, "energy": 1.0 / (1 + i),
            "dissipation": 2.0 ** -i}


def step_rows(i: int) -> dict[str, np.ndarray]:
    """The 3 step rows that lead to frame i (1 row, the initial state, for frame 0)."""
    t = 0.5 * i - np.arange(3)[::-1] / 6 if i else np.zeros(1)
    return {"time": t, "dt": np.full(t.shape, 1 / 6), "energy": 1.0 / (1 + t), "risk": 0.5 / (1 + t),
            "dissipation": np.exp(-t), "wall_time": np.zeros(t.shape), "rejected": t * 0 + i}


def checkpoint(i: int, writer: TrajectoryWriter) -> Checkpoint:
    rng = np.random.default_rng(i)
    return Checkpoint(fields=frame_fields(i), t=0.5 * i, dt=0.5 / 3, step=3 * i, n_frames=writer.n_frames,
                      n_steps=writer.n_steps, rng=rng.bit_generator.state, extra=extra_state(i))


def extra_state(i: int) -> dict[str, np.ndarray]:
    """Named controller state of frame i's checkpoint: arrays of several shapes (a scalar, a vector, a matrix)."""
    return {"controller": np.array([float(i), -1.0]), "pairs": np.arange(6.0).reshape(2, 3) * i,
            "count": np.float64(i)}


EXTRA_SHAPES = {name: np.shape(value) for name, value in extra_state(0).items()}


def new_writer(path: Path, **kw) -> TrajectoryWriter:
    return TrajectoryWriter.create(path, loads_config(CONFIG), problem_arrays(), frame_fields(0),
                                   step_columns=("rejected",), **{"extra_shapes": EXTRA_SHAPES, **kw})


def write_frames(writer: TrajectoryWriter, start: int, stop: int) -> None:
    """Frames start..stop-1, each committed by a checkpoint, as the driver does."""
    for i in range(start, stop):
        writer.append_steps(step_rows(i))
        writer.append_frame(frame_fields(i), frame_scalars(i))
        writer.write_checkpoint(checkpoint(i, writer))


def expected_steps(n_frames: int) -> dict[str, np.ndarray]:
    rows = [step_rows(i) for i in range(n_frames)]
    return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


def assert_frames(traj, n: int) -> None:
    """The reader shows exactly frames 0..n-1, each equal to what was written, and their steps."""
    assert len(traj.time) == n
    for i in range(n):
        for key, value in frame_fields(i).items():
            np.testing.assert_array_equal(traj.frames[key][i], value)
        for key, value in frame_scalars(i).items():
            assert traj.frames[key][i] == value, (key, i)
    if n:
        for key, value in expected_steps(n).items():
            np.testing.assert_array_equal(traj.steps[key], value)
        ck = traj.checkpoint
        assert ck.n_frames == n and ck.t == 0.5 * (n - 1)
        np.testing.assert_array_equal(ck.fields["omega"], frame_fields(n - 1)["omega"])


# ---- round trip ---------------------------------------------------------------------------------

def test_round_trip(tmp_path):
    path = tmp_path / "t.h5"
    w = new_writer(path, frame_attrs={"lower": np.array([-1.0, -2.0, -3.0])})
    write_frames(w, 0, 4)
    message = "ünïcode " + "x" * (2 * MESSAGE_BYTES)
    w.finish("finished", message, {"final_time": 1.5, "steps": 9})
    traj = open_trajectory(path)
    assert_frames(traj, 4)
    arrays = problem_arrays()
    for key, value in arrays.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(traj.arrays[key], value)
        else:
            assert traj.arrays[key] == value
    np.testing.assert_array_equal(traj.frame_attrs["lower"], [-1.0, -2.0, -3.0])
    assert traj.attrs["status"] == "finished"
    assert traj.attrs["message"].startswith("ünïcode xxx") and traj.attrs["message"].endswith("...")
    assert len(traj.attrs["message"].encode()) <= MESSAGE_BYTES
    assert traj.attrs["final_time"] == 1.5 and traj.attrs["steps"] == 9
    assert traj.config.to_toml() == loads_config(CONFIG).to_toml()
    ck = traj.checkpoint
    assert ck.rng == np.random.default_rng(3).bit_generator.state  # 128-bit integers survive JSON
    assert set(ck.extra) == set(EXTRA_SHAPES)
    for name, value in extra_state(3).items():
        assert ck.extra[name].shape == np.shape(value)
        np.testing.assert_array_equal(ck.extra[name], value)
    # a finished file is plain HDF5: h5py opens it without SWMR and len(time) is the frame count
    with h5py.File(path, "r") as f:
        assert f["frames/time"].shape == (4,) and f.attrs["status"].decode() == "finished"


def test_checkpoint_extra_must_have_the_names_the_file_was_created_with(tmp_path):
    w = new_writer(tmp_path / "t.h5")
    write_frames(w, 0, 1)
    ck = checkpoint(1, w)
    for extra in ({"controller": np.zeros(2)}, dict(extra_state(1), other=np.zeros(1))):
        ck.extra = extra
        with pytest.raises(ValueError, match="checkpoint extra"):
            w.write_checkpoint(ck)
    w.close()
    for bad in ("", "a/b"):
        with pytest.raises(ValueError, match="not a valid name"):
            new_writer(tmp_path / "u.h5", extra_shapes={bad: (1,)})
    assert not (tmp_path / "u.h5").exists()


def test_a_flat_extra_vector_of_an_earlier_pdeflow_reads_but_does_not_resume(tmp_path):
    """Files whose slots hold one flat ``extra`` dataset (before named arrays) still open for reading; --resume
    refuses them with one line instead of splitting the vector by guess."""
    from pdeflow.io.resume import open_resumable

    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 2)
    w.close()
    with h5py.File(path, "r+") as f:
        for slot in ("slot0", "slot1"):   # as an earlier pdeflow wrote them: no checksum either
            del f[f"checkpoint/{slot}/extra"], f[f"checkpoint/{slot}/checksum"]
            f[f"checkpoint/{slot}/extra"] = np.array([1.0, -1.0])
    check_file(path)
    traj = open_trajectory(path)
    assert traj.checkpoint is None and "one flat extra vector" in traj.checkpoint_error
    assert_frames_only(traj, 2)
    with pytest.raises(TrajectoryError, match="cannot be resumed") as info:
        open_resumable(path, loads_config(CONFIG))
    assert "\n" not in str(info.value)
    with pytest.raises(TrajectoryError, match="cannot be resumed"):
        TrajectoryWriter.reopen(path)


def assert_frames_only(traj, n: int) -> None:
    assert len(traj.time) == n
    for i in range(n):
        np.testing.assert_array_equal(traj.frames["omega"][i], frame_fields(i)["omega"])


def test_finish_accepts_only_the_precreated_attributes(tmp_path):
    w = new_writer(tmp_path / "t.h5")
    write_frames(w, 0, 1)
    with pytest.raises(KeyError):
        w.finish("finished", "", {"something_else": 1})
    assert set(END_ATTRS) == {"final_time", "steps", "accuracy_lost_at", "max_identity_defect", "max_stability_ratio",
                              "stability_products"}


def test_uncommitted_rows_are_invisible_and_cut_on_resume(tmp_path):
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 3)
    w.append_steps(step_rows(3))
    w.append_frame(frame_fields(3), frame_scalars(3))  # written and flushed, but never committed
    w.f.flush()
    w.close()
    with h5py.File(path, "r") as f:
        assert f["frames/time"].shape == (4,) and committed_counts(f) == (3, 7)
    assert_frames(open_trajectory(path), 3)
    w, ck = TrajectoryWriter.reopen(path)
    assert (ck.n_frames, ck.n_steps, ck.step) == (3, 7, 6)
    assert w.n_frames == 3 and w.n_steps == 7
    write_frames(w, 3, 5)
    w.finish("finished", "")
    assert_frames(open_trajectory(path), 5)


def test_a_torn_checkpoint_leaves_the_previous_one_in_force(tmp_path):
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 2)
    active = int(w.f["checkpoint/active"][()])
    other = w.f[f"checkpoint/slot{1 - active}"]
    other["t"][()] = 123.0          # half of a slot write: the slot is not active, so it does not count
    other["n_frames"][()] = 99
    w.close()
    traj = open_trajectory(path)
    assert traj.checkpoint.t == 0.5 and traj.checkpoint.n_frames == 2
    assert_frames(traj, 2)


def test_before_the_first_checkpoint_there_is_no_file(tmp_path):
    """A new file is built under ``.partial`` and takes its name at its first commit; a writer closed before that
    leaves nothing (issue 52, finding 7: the README's reader found no active slot in such a file)."""
    path = tmp_path / "t.h5"
    w = new_writer(path)
    w.append_frame(frame_fields(0), frame_scalars(0))
    w.f.flush()
    assert not path.exists() and (tmp_path / "t.h5.partial").exists()
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    w = new_writer(path)
    write_frames(w, 0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]
    with h5py.File(path, "r", swmr=True) as f:     # the README's recipe, while the writer runs
        assert f[f"checkpoint/slot{f['checkpoint/active'][()]}/n_frames"][()] == 1
    w.close()


def test_create_never_clobbers_and_replaces_only_when_complete(tmp_path):
    path = tmp_path / "t.h5"
    path.write_bytes(b"precious")
    with pytest.raises(TrajectoryError, match="exists"):
        new_writer(path)
    bad = problem_arrays()
    del bad["tokens"]
    with pytest.raises(KeyError):  # fails while populating the new file: the old one is untouched
        TrajectoryWriter.create(path, loads_config(CONFIG), bad, frame_fields(0), overwrite=True)
    assert path.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]
    w = new_writer(path, overwrite=True)
    assert path.read_bytes() == b"precious"      # until the new file's first commit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5", "t.h5.partial"]
    write_frames(w, 0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]  # the .partial name is gone once renamed
    w.finish("finished", "")
    assert_frames(open_trajectory(path), 1)


def test_frames_are_never_rewritten_so_the_file_does_not_leak(tmp_path):
    """Frame fields are chunked one frame per chunk; a compressed multi-frame chunk would be rewritten (and
    relocated) at every frame, leaking its old copies: the file grew with the square of the frame count."""
    sizes = {}
    for n in (40, 120):
        path = tmp_path / f"t{n}.h5"
        w = new_writer(path)
        write_frames(w, 0, n)
        w.finish("finished", "")
        sizes[n] = path.stat().st_size
    per_frame = (sizes[120] - sizes[40]) / 80
    raw = sum(v.nbytes for v in frame_fields(0).values()) + 8 * 6 + 3 * 8 * 7   # fields, frame scalars, steps
    assert per_frame < 2 * raw + 400, (per_frame, raw)


def test_edit_is_all_or_nothing(tmp_path):
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 2)
    w.finish("finished", "")
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with edit_trajectory(path) as f:
            f.create_group("analysis").attrs["x"] = 1.0
            raise RuntimeError("stop half-way")
    assert path.read_bytes() == before and not (tmp_path / "t.h5.partial").exists()
    with edit_trajectory(path) as f:
        f.create_group("analysis").attrs["x"] = 2.0
    traj = open_trajectory(path)
    assert traj.analysis["x"] == 2.0
    assert_frames(traj, 2)


@pytest.mark.parametrize("damage", ["not-hdf5", "empty", "foreign", "version", "half", "no-groups", "shapes",
                                    "bad-config"])
def test_bad_files_give_one_line(tmp_path, damage):
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 3)
    w.finish("finished", "")
    if damage == "not-hdf5":
        path.write_text("hello\n")
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "foreign":
        path.unlink()
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    elif damage == "half":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    else:
        with h5py.File(path, "r+") as f:
            if damage == "version":
                f.attrs["schema_version"] = 2
            elif damage == "no-groups":
                del f["data"]
            elif damage == "shapes":
                del f["model/embedding"]
                f["model/embedding"] = np.zeros(4)
            else:
                f.attrs["config"] = "[task]\nbogus = 1\n"
    with pytest.raises(TrajectoryError) as info:
        open_trajectory(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


# ---- damaged checkpoints ----------------------------------------------------------------------------

def flip_byte(path: Path, dataset: str, at: int = 3) -> None:
    """Change one byte of a dataset's stored values in the file itself (at the offset HDF5 reports for it)."""
    with open_for_reading(path) as f:
        ds = f[dataset]
        offset = ds.id.get_offset()
        assert offset is not None and at < ds.id.get_storage_size(), dataset
    with open(path, "r+b") as fh:
        fh.seek(offset + at)
        byte = fh.read(1)
        fh.seek(offset + at)
        fh.write(bytes([byte[0] ^ 0x5A]))


def active_slot(path: Path) -> int:
    with open_for_reading(path) as f:
        return int(f["checkpoint/active"][()])


@pytest.mark.parametrize("dataset", ["omega", "t", "rng", "extra/pairs", "n_frames"])
def test_a_damaged_active_slot_falls_back_to_the_previous_checkpoint(tmp_path, dataset):
    """One byte changed in a dataset of the active slot: its checksum fails, the reader and resume use the other
    slot (the commit before) and say so in one line; the resumed file continues as if nothing happened."""
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 4)
    w.close()
    active = active_slot(path)
    flip_byte(path, f"checkpoint/slot{active}/{dataset}", at=0 if dataset in ("t", "n_frames") else 3)
    traj = open_trajectory(path)
    assert traj.checkpoint.t == 1.0 and traj.checkpoint.n_frames == 3
    note = traj.checkpoint_note
    assert "\n" not in note and f"checkpoint slot{active} is damaged (checksum mismatch)" in note
    assert f"slot{1 - active}" in note and "t = 1" in note
    assert_frames(traj, 3)
    w, ck = TrajectoryWriter.reopen(path)
    assert (ck.t, ck.n_frames) == (1.0, 3) and int(w.f["checkpoint/active"][()]) == 1 - active
    write_frames(w, 3, 6)
    w.finish("finished", "")
    assert_frames(open_trajectory(path), 6)
    assert open_trajectory(path).checkpoint_note is None


def test_damage_to_both_slots_is_refused_naming_it(tmp_path):
    """Never a resume from wrong data: with both slots damaged a running file does not open (its committed rows
    are unknown), a finished one opens without a checkpoint, and --resume refuses either, naming both slots."""
    from pdeflow.io.resume import open_resumable

    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 3)
    w.close()
    flip_byte(path, "checkpoint/slot0/omega")
    flip_byte(path, "checkpoint/slot1/mass", at=0)
    for attempt in (lambda: open_trajectory(path), lambda: TrajectoryWriter.reopen(path),
                    lambda: open_resumable(path, loads_config(CONFIG))):
        with pytest.raises(TrajectoryError, match="both checkpoint slots are damaged") as info:
            attempt()
        assert "\n" not in str(info.value) and "slot0: checksum mismatch" in str(info.value)
        assert "slot1: checksum mismatch" in str(info.value)
    with h5py.File(path, "r+") as f:
        f.attrs.modify("status", np.array(b"finished", dtype=h5py.string_dtype("utf-8", 32)))
    traj = open_trajectory(path)
    assert traj.checkpoint is None and "both checkpoint slots are damaged" in traj.checkpoint_error
    assert len(traj.time) == 3
    with pytest.raises(TrajectoryError, match="--resume: .*both checkpoint slots are damaged"):
        open_resumable(path, loads_config(CONFIG))


def test_a_damaged_first_checkpoint_has_no_previous_one(tmp_path):
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 1)
    w.close()
    flip_byte(path, f"checkpoint/slot{active_slot(path)}/omega")
    with pytest.raises(TrajectoryError, match="slot1: never written"):
        TrajectoryWriter.reopen(path)


def test_a_truncated_file_is_refused_in_one_line_wherever_it_is_cut(tmp_path):
    """A killed file (HDF5 would read it in SWMR mode, which skips the size check and retries failed reads for
    minutes) cut inside either checkpoint slot, inside the frames or by its last bytes: one line, no resume."""
    path, killed = tmp_path / "t.h5", tmp_path / "killed.h5"
    w = new_writer(path)
    write_frames(w, 0, 4)
    w.f.flush()
    killed.write_bytes(path.read_bytes())    # as a kill leaves it: SWMR-write flag set
    w.close()
    with open_for_reading(killed) as f:
        cuts = [f[f"checkpoint/slot{i}/{name}"].id.get_offset() + 4 for i in (0, 1) for name in ("omega", "t")]
        cuts.append(f["frames/omega"].id.get_chunk_info(2).byte_offset + 4)
    cuts.append(killed.stat().st_size - 1)
    for cut in cuts:
        cut_path = tmp_path / f"cut{cut}.h5"
        cut_path.write_bytes(killed.read_bytes()[:cut])
        t0 = time.monotonic()
        for attempt in (lambda: open_trajectory(cut_path), lambda: TrajectoryWriter.reopen(cut_path)):
            with pytest.raises(TrajectoryError, match="truncated file") as info:
                attempt()
            assert "\n" not in str(info.value)
        assert time.monotonic() - t0 < 30, cut


# ---- crash safety under SIGKILL -------------------------------------------------------------------

SCRIPT = """
import os, signal, sys
sys.path[:0] = [{repo!r}, {tests!r}]
import test_trajectory as tt
from pdeflow.io.trajectory_writer import TrajectoryWriter
mode, path, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "rebuild":                       # killed while rebuilding a dead writer's file, before the rename
    os.replace = lambda *a: kill()
    TrajectoryWriter.reopen(path)
    sys.exit(0)
w = tt.new_writer(path)
print("ready", flush=True)
if mode.startswith("flush"):                # killed before/after the arg-th flush (2 per commit: slot, active)
    calls, flush = [0], w.f.flush
    def patched():
        calls[0] += 1
        if calls[0] == arg and mode == "flush-before":
            kill()
        flush()
        if calls[0] == arg and mode == "flush-after":
            kill()
    w.f.flush = patched
tt.write_frames(w, 0, 4 if mode != "random" else 10**6)
if mode == "finish":                        # killed after the status is set, before the flush and close
    w.f.flush = kill
    w.finish("finished", "done")
"""


def run_script(tmp_path: Path, mode: str, path: Path, arg: int = 0, delay: float | None = None) -> int:
    script = tmp_path / "writer.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(Path(__file__).resolve().parent)))
    proc = subprocess.Popen([sys.executable, str(script), mode, str(path), str(arg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if delay is not None:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.kill()
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    return proc.returncode


def check_and_resume(path: Path, committed: set[int] | None = None) -> int:
    """The killed file reads as frames 0..n-1 (n in ``committed`` if given); reopening it (which rebuilds
    it), writing two more frames and finishing gives the complete file, readable by plain h5py. Killed before its
    first commit, a new file does not exist (n = 0)."""
    if not path.exists():
        assert committed is None or 0 in committed
        return 0
    with pytest.raises(OSError):
        h5py.File(path, "r")                 # the SWMR-write flag of a dead writer is still set
    traj = open_trajectory(path)
    n = len(traj.time)
    assert committed is None or n in committed, (n, committed)
    assert_frames(traj, n)
    if n == 0:
        return n
    w, ck = TrajectoryWriter.reopen(path)
    assert ck.n_frames == n
    write_frames(w, n, n + 2)
    w.finish("finished", "")
    with h5py.File(path, "r") as f:
        assert f["frames/time"].shape == (n + 2,)
    assert_frames(open_trajectory(path), n + 2)
    return n


# (mode, flush number, frames that may be committed): commit j (frame j) makes flushes 2j+1 (rows and
# inactive slot) and 2j+2 (the flip of ``active``).
KILL_POINTS = [
    ("flush-before", 5, {2}),        # frame 2's rows and slot written but not flushed
    ("flush-after", 5, {2}),         # frame 2's rows and slot on disk, ``active`` not flipped
    ("flush-before", 6, {2, 3}),     # ``active`` flipped in HDF5's cache only
    ("flush-after", 6, {3}),         # frame 2 committed
    ("finish", 0, {4}),              # status set, never flushed
]


@pytest.mark.parametrize("mode,arg,committed", KILL_POINTS, ids=[f"{m}-{a}" for m, a, _ in KILL_POINTS])
def test_sigkill_at_each_stage_of_a_commit(tmp_path, mode, arg, committed):
    path = tmp_path / "t.h5"
    assert run_script(tmp_path, mode, path, arg) == -signal.SIGKILL
    check_and_resume(path, committed)


def test_sigkill_during_recovery_leaves_the_original(tmp_path):
    path = tmp_path / "t.h5"
    assert run_script(tmp_path, "flush-after", path, 6) == -signal.SIGKILL
    before = path.read_bytes()
    assert run_script(tmp_path, "rebuild", path) == -signal.SIGKILL
    assert path.read_bytes() == before
    assert check_and_resume(path, {3}) == 3
    assert not (tmp_path / "t.h5.partial").exists()


@pytest.mark.slow
def test_sigkill_at_random_moments_of_a_writing_loop(tmp_path):
    """8 kills at seeded random delays of a loop that does nothing but commit frames (so the kills land
    inside writes and flushes): every file reads as an exact prefix of the frames and continues."""
    rnd = random.Random(20240611)
    for i in range(8):
        path = tmp_path / f"r{i}.h5"
        assert run_script(tmp_path, "random", path, delay=rnd.uniform(0.0, 0.3)) == -signal.SIGKILL
        check_and_resume(path)
        path.unlink(missing_ok=True)   # a kill before the first commit leaves no file


def test_a_running_file_is_readable_while_written(tmp_path):
    path = tmp_path / "t.h5"
    w = new_writer(path)
    write_frames(w, 0, 2)
    check_file(path)
    assert_frames(open_trajectory(path), 2)   # a reader while the writer holds the file
    write_frames(w, 2, 3)
    w.finish("finished", "")
    assert_frames(open_trajectory(path), 3)


def test_result_files_are_written_all_or_nothing(tmp_path):
    """new_result_file (pdeflow chaos, pdeflow stability): the root attributes on success; on an error
    inside the block, the file it was going to replace is untouched and no partial file is left."""
    from pdeflow import __version__
    from pdeflow.io.result_files import new_result_file

    cfg = loads_config("[model]\nd = 4\nhead_dim = 2\n")
    path = tmp_path / "result.h5"
    with new_result_file(path, "pdeflow-test", 3, cfg, quick=True) as f:
        f["x"] = np.arange(3.0)
    with h5py.File(path, "r") as f:
        assert f.attrs["schema"] == "pdeflow-test" and f.attrs["schema_version"] == 3
        assert f.attrs["pdeflow_version"] == __version__ and bool(f.attrs["quick"])
        assert loads_config(f.attrs["config"]).model.d == 4
        np.testing.assert_array_equal(f["x"][()], np.arange(3.0))
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="midway"):
        with new_result_file(path, "pdeflow-test", 3, cfg) as f:
            f["y"] = np.ones(10)
            raise RuntimeError("midway")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.h5"]


def test_a_finished_run_continued_to_a_later_end_has_its_analysis_made_anew(tmp_path):
    """A finished run with its analysis (the gap by diagnose) resumed to a later t_end: the old /analysis described
    frames 0-2 and made the file invalid once frames 3-4 were appended (the resume exited 2); now it is dropped at
    the resume and the run's end writes the analysis of all five frames."""
    from pdeflow.interface.cli import main

    out = tmp_path / "run.h5"
    tiny = str(REPO / "data" / "configs" / "tiny.toml")
    assert main(["run", tiny, "-o", str(out), "--quiet", "--set", "run.t_end=2"]) == 0
    assert main(["diagnose", str(out)]) == 0
    assert main(["run", tiny, "-o", str(out), "--quiet", "--set", "run.t_end=4", "--resume"]) == 0
    assert main(["validate", str(out), "--no-recompute"]) == 0
    traj = open_trajectory(out)
    np.testing.assert_array_equal(traj.analysis["time"], [0.0, 1.0, 2.0, 3.0, 4.0])
