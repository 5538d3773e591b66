"""Reliability of ``pdeflow run``: kill -9 at random moments then ``--resume`` (bit for bit), SIGINT and
SIGTERM, non-finite states, write failures (a real EFBIG from RLIMIT_FSIZE, and an injected ENOSPC),
determinism (same seed; 1 vs 2 numba threads), and no pickle/eval/exec on anything read.

Every run kind is exercised on a tiny problem (V = 3, T = 3, B = 8, d = 4, N = 4): particles with fixed
(euler) and adaptive steps (with a checkpoint after every step, so resumes start between frames),
SGD with Langevin noise (generator state), the finite-volume grid and JKO. The in-process runs use one
numba thread, like the subprocesses (NUMBA_NUM_THREADS=1), so "bit for bit" compares like with like.
"""
from __future__ import annotations

import ast
import contextlib
import errno
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numba
import numpy as np
import pytest
from pdeflow.solvers import make_stepper

from pdeflow.core.config import dumps_toml, load_config
from pdeflow.core.problem import Problem
from pdeflow.interface.cli import main
from pdeflow.io.checkpoint import _slot_arrays, read_checkpoint
from pdeflow.io.file_access import TrajectoryError, open_for_reading
from pdeflow.io.result_files import edit_trajectory
from pdeflow.io.trajectory import open_trajectory
from pdeflow.io.trajectory_writer import TrajectoryWriter

REPO = Path(__file__).resolve().parents[2]
BASE = """
[task]
name = "markov"
vocab_size = 3
seq_len = 3
n_samples = 8
[model]
d = 4
head_dim = 2
[init]
n_particles = 4
[solver]
method = "euler"
dt = 0.01
[run]
t_end = 1.0
frame_interval = 0.01
[diagnostics]
enabled = false
"""
# The run kinds: keys changed from BASE.
VARIANTS = {
    "euler": {},
    "adaptive": {"solver": {"method": "adaptive"}, "run": {"frame_interval": 0.05, "checkpoint_interval": 1e-6}},
    "sgd": {"solver": {"method": "sgd"}, "sgd": {"batch_size": 4, "noise": True}, "model": {"beta": 50.0},
            "run": {"frame_interval": 0.02}},
    "fv": {"solver": {"method": "fv"}, "init": {"measure": "grid"}, "model": {"coordinates": "gain2"},
           "grid": {"n": 12}, "run": {"frame_interval": 0.05}},
    "jko": {"solver": {"method": "jko", "dt": 0.05}, "run": {"frame_interval": 0.05, "t_end": 0.2}},
}
IGNORED = {"wall_time"}  # the only columns allowed to differ between runs


def config_text(name: str) -> str:
    data = tomllib.loads(BASE)
    for section, values in VARIANTS[name].items():
        data.setdefault(section, {}).update(values)
    return dumps_toml(data)


@dataclass
class Reference:
    config: Path
    path: Path
    duration: float   # wall time from the first to the last frame


@pytest.fixture(scope="module")
def one_thread():
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)


@pytest.fixture(scope="module")
def refs(tmp_path_factory, one_thread) -> dict[str, Reference]:
    """An uninterrupted run of every variant, in-process with one thread."""
    d = tmp_path_factory.mktemp("refs")
    out = {}
    for name in VARIANTS:
        cfg = d / f"{name}.toml"
        cfg.write_text(config_text(name))
        path = d / f"{name}.h5"
        assert main(["run", str(cfg), "-o", str(path), "--quiet"]) == 0
        w = open_trajectory(path).frames["wall_time"]
        out[name] = Reference(cfg, path, float(w[-1] - w[0]))
    return out


def env(threads: int = 1) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                NUMBA_NUM_THREADS=str(threads))


def start(config: Path, out: Path, *extra: str, threads: int = 1, preexec=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pdeflow", "run", str(config), "-o", str(out), "--quiet", *extra],
                            env=env(threads), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout
        time.sleep(0.002)


def wait_for_frames(path: Path, proc: subprocess.Popen, n: int, timeout: float = 300.0) -> None:
    """Until the run writing ``path`` has committed ``n`` frames (the run must still be going)."""
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, proc.communicate()
        with contextlib.suppress(TrajectoryError):
            if path.exists() and len(open_trajectory(path).time) >= n:
                return
        assert time.monotonic() - t0 < timeout
        time.sleep(0.005)


def datasets(path: Path) -> dict[str, np.ndarray]:
    """Every dataset of a file, read through pdeflow (committed rows only)."""
    traj = open_trajectory(path)
    out = {f"frames/{k}": v for k, v in traj.frames.items()}
    out.update({f"steps/{k}": v for k, v in traj.steps.items()})
    out.update({f"model_data/{k}": v for k, v in traj.arrays.items() if isinstance(v, np.ndarray)})
    ck = traj.checkpoint
    out.update({f"checkpoint/{k}": v for k, v in ck.fields.items()})
    out.update({"checkpoint/t": ck.t, "checkpoint/dt": ck.dt, "checkpoint/step": ck.step,
                "attrs/final_time": traj.attrs["final_time"],
                "attrs/steps": traj.attrs["steps"]})
    out.update({f"checkpoint/extra/{name}": v for name, v in ck.extra.items()})
    return out


def assert_prefix(path: Path, ref: Path, *, longer: bool = False) -> tuple[int, int]:
    """Every frame and step row of ``path`` equals the reference's, bit for bit (wall time aside); with ``longer``
    (a run of the same config to a later t_end) its rows past the reference's end are not compared."""
    traj, full = open_trajectory(path), open_trajectory(ref)
    n, m = len(traj.time), len(traj.steps["time"])
    if longer:
        n, m = min(n, len(full.time)), min(m, len(full.steps["time"]))
    assert n <= len(full.time) and m <= len(full.steps["time"])
    for group, rows, mine, theirs in (("frames", n, traj.frames, full.frames), ("steps", m, traj.steps, full.steps)):
        assert set(mine) == set(theirs)
        for key in set(mine) - IGNORED:
            np.testing.assert_array_equal(mine[key][:rows], theirs[key][:rows], err_msg=f"{group}/{key}")
    return n, m


def assert_same_run(path: Path, ref: Path) -> None:
    a, b = datasets(path), datasets(ref)
    assert set(a) == set(b)
    for key in a:
        if key.rsplit("/", 1)[1] not in IGNORED:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- kill -9 ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bit_exact(refs, tmp_path, one_thread):
    """Kills at seeded random delays within each variant's run until every variant was killed and resumed (at
    least one kill per variant; each kill starts an interpreter that loads the compiled kernels, the test's
    cost), each followed by checks of the file (it opens; every committed frame equals the reference frame) and
    an in-process --resume whose whole file then equals the uninterrupted run's."""
    rnd = random.Random(1234)
    kills, attempts, resumed = 0, 0, {name: 0 for name in VARIANTS}
    early = set()  # variants killed before their first commit: their next kill waits for one
    while (kills < len(VARIANTS) or min(resumed.values()) == 0) and attempts < 40:
        pending = [name for name, n in resumed.items() if n == 0] or list(VARIANTS)
        name = pending[attempts % len(pending)]
        attempts += 1
        ref, out = refs[name], tmp_path / f"kill{attempts}.h5"
        proc = start(ref.config, out)
        wait_for(out, proc)
        if name in early:
            # on a loaded machine the start of a run (its imports, the first frame) can outlast every delay drawn
            # from the in-process run's duration: the kill then lands after the first commit
            t0 = time.monotonic()
            while proc.poll() is None and time.monotonic() - t0 < 300:
                with contextlib.suppress(TrajectoryError):
                    if len(open_trajectory(out).time) >= 1:
                        break
                time.sleep(0.005)
        time.sleep(rnd.uniform(0.0, 0.8 * ref.duration))
        if proc.poll() is not None:  # finished before the kill: not a kill
            assert proc.returncode == 0, proc.communicate()
            continue
        proc.kill()
        proc.communicate()
        kills += 1
        n, _ = assert_prefix(out, ref.path)
        argv = ["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]
        if n == 0:   # killed before the first commit: nothing to resume, and the CLI says so
            assert main(argv) == 2
            early.add(name)
            continue
        assert main(argv) == 0
        assert_same_run(out, ref.path)
        resumed[name] += 1
    assert kills >= len(VARIANTS) and min(resumed.values()) > 0, (kills, attempts, resumed)


# ---- pdeflow recover: a killed file for every HDF5 tool --------------------------------------------

def killed_run(ref: Reference, out: Path, rnd: random.Random) -> int:
    """Run ``ref``'s config into ``out`` and SIGKILL it at a random moment after a frame beyond t = 0 is
    committed; returns the committed frames. Retried when the run ends before the kill."""
    for _ in range(20):
        out.unlink(missing_ok=True)
        proc = start(ref.config, out)
        wait_for(out, proc)
        time.sleep(rnd.uniform(0.2, 0.6) * ref.duration)
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.communicate()
            continue
        proc.kill()
        proc.communicate()
        n = len(open_trajectory(out).time)   # the SWMR reader sees the committed frames
        if n >= 2:
            return n
    raise AssertionError("no kill landed after the second frame in 20 tries")


def h5dump_header(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["h5dump", "-H", str(path)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def killed(refs, tmp_path_factory, one_thread) -> tuple[Reference, Path, int]:
    """A file of the adaptive run killed by SIGKILL (its HDF5 SWMR-write flag left set), and its committed frames."""
    ref = refs["adaptive"]
    out = tmp_path_factory.mktemp("killed") / "k.h5"
    return ref, out, killed_run(ref, out, random.Random(29))


def test_recover_makes_a_killed_file_plain_hdf5_with_every_committed_frame_and_resumable(killed, tmp_path, capsys,
                                                                                         one_thread):
    """Before: plain h5py refuses the killed file, and info and validate say to run pdeflow recover. recover -o
    writes a copy and leaves the original alone; recover in place replaces it. After: plain h5py opens it, it
    holds exactly the committed frames (equal to the uninterrupted run's), and --resume ends bit for bit equal to
    the uninterrupted run."""
    ref, killed_path, n = killed
    out = tmp_path / "k.h5"
    out.write_bytes(killed_path.read_bytes())
    with pytest.raises(OSError):
        h5py.File(out, "r")
    for command in ("info", "validate"):
        assert main([command, str(out)]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if "pdeflow recover" in line]
        assert len(lines) == 1 and str(out) in lines[0], command
    before = out.read_bytes()
    copy = tmp_path / "copy.h5"
    assert main(["recover", str(out), "-o", str(copy)]) == 0
    assert out.read_bytes() == before
    assert main(["recover", str(out), "-o", str(copy)]) == 2   # exists: never overwritten without --force
    assert "exists" in one_line(capsys.readouterr().err)
    assert main(["recover", str(out)]) == 0
    assert f"recovered {n} committed frames" in capsys.readouterr().out
    for path in (out, copy):
        with h5py.File(path, "r") as f:       # plain h5py: no SWMR, no flag
            assert f["frames/time"].shape[0] == n and f.attrs["status"].decode() == "running"
        assert assert_prefix(path, ref.path)[0] == n
    assert main(["recover", str(out)]) == 0    # nothing left to do
    assert "no writer left it open" in capsys.readouterr().out
    for command in ("info", "validate"):
        main([command, str(out)])
        assert "pdeflow recover" not in capsys.readouterr().out
    assert main(["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]) == 0
    assert_same_run(out, ref.path)


def test_h5dump_reads_recovered_and_finished_files(killed, refs, tmp_path):
    """Debian's h5dump (HDF5 1.10) reads the header of a recovered file and of a finished run's file (both written
    with the 1.10 object formats), and refuses the killed file, which is why recover exists."""
    if shutil.which("h5dump") is None:
        pytest.skip("h5dump is not installed (Debian/Ubuntu: apt-get install hdf5-tools)")
    ref, killed_path, n = killed
    assert h5dump_header(killed_path).returncode != 0
    out = tmp_path / "r.h5"
    assert main(["recover", str(killed_path), "-o", str(out)]) == 0
    for path in (out, ref.path, refs["fv"].path):
        dumped = h5dump_header(path)
        assert dumped.returncode == 0 and "DATASET \"time\"" in dumped.stdout, dumped.stderr
    assert f"DATASPACE  SIMPLE {{ ( {n} ) / ( H5S_UNLIMITED ) }}" in h5dump_header(out).stdout


def test_resume_falls_back_from_a_damaged_active_slot_and_refuses_two(killed, tmp_path, capsys, one_thread):
    """Bytes changed inside the active slot's datasets of a killed run: --resume says in one line that it uses the
    previous checkpoint and still ends bit for bit equal to the uninterrupted run. With both slots damaged: exit 2,
    one line naming both, the file untouched."""
    ref, killed_path, _ = killed
    out = tmp_path / "d.h5"
    rnd = random.Random(31)
    for _ in range(20):
        with open_for_reading(killed_path) as f:
            active = int(f["checkpoint/active"][()])
            offsets = [f[f"checkpoint/slot{i}/omega"].id.get_offset() for i in (active, 1 - active)]
            slots = [_slot_arrays(f[f"checkpoint/slot{i}"])[0] for i in (active, 1 - active)]
        if slots[1] is not None and int(slots[1]["step"]) < int(slots[0]["step"]):
            break
        # the kill landed while the previous checkpoint was being overwritten, or before the flip to the one written
        # (test_a_kill_between_a_commits_two_flushes_keeps_the_commit_before): no commit before to fall back to
        killed_path = tmp_path / "k.h5"
        killed_run(ref, killed_path, rnd)
    else:
        raise AssertionError("no kill left the previous checkpoint intact in 20 tries")
    out.write_bytes(killed_path.read_bytes())
    damage(out, offsets[0])
    assert main(["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warning) == 1 and f"checkpoint slot{active} is damaged (checksum mismatch)" in warning[0]
    assert_same_run(out, ref.path)
    out.write_bytes(killed_path.read_bytes())
    for offset in offsets:
        damage(out, offset)
    before = out.read_bytes()
    assert main(["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "both checkpoint slots are damaged" in line and "slot0" in line and "slot1" in line
    assert out.read_bytes() == before


# A run whose n-th commit is cut between its two flushes: the slot written and flushed, the process gone before
# /checkpoint/active names it (what a kill in that instant leaves).
KILL_BEFORE_FLIP = """
import os, sys
from pdeflow.interface.cli import main
from pdeflow.io.trajectory_writer import TrajectoryWriter
n = int(sys.argv[1])
write = TrajectoryWriter.write_checkpoint
count = [0]
class NeverFlipped:
    def __init__(self, ds):
        self.ds = ds
    def __getitem__(self, key):
        return self.ds[key]
    def __setitem__(self, key, value):
        os._exit(9)
def write_checkpoint(self, ck):
    count[0] += 1
    if count[0] == n:
        self.ds["checkpoint/active"] = NeverFlipped(self.ds["checkpoint/active"])
    return write(self, ck)
TrajectoryWriter.write_checkpoint = write_checkpoint
sys.exit(main(sys.argv[2:], exiting=True))
"""


def test_a_kill_between_a_commits_two_flushes_keeps_the_commit_before(refs, tmp_path, capsys, one_thread):
    """The inactive slot holds a later step than the active one, its flip never made. validate calls the file
    valid and names that slot unchecked; the trajectory is the active slot's rows. With the active slot damaged,
    --resume refuses in one line (the later slot's rows were in the flush a kill may cut short) and leaves the
    file alone; with the active index damaged it resumes from the earlier slot; recovered, it resumes; both end
    bit for bit equal to the uninterrupted run."""
    ref = refs["adaptive"]
    killed = tmp_path / "k.h5"
    proc = subprocess.run([sys.executable, "-c", KILL_BEFORE_FLIP, "6", "run", str(ref.config), "-o", str(killed),
                           "--quiet"], env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 9, proc.stderr
    with open_for_reading(killed) as f:
        active = int(f["checkpoint/active"][()])
        steps = [int(_slot_arrays(f[f"checkpoint/slot{i}"])[0]["step"]) for i in (active, 1 - active)]
        offset = f[f"checkpoint/slot{active}/omega"].id.get_offset()
    assert steps[1] > steps[0]
    assert main(["validate", str(killed)]) == 0
    out = capsys.readouterr().out
    assert f"unchecked: /checkpoint/slot{1 - active}, /checkpoint/active: slot{1 - active} holds a later step" in out
    assert assert_prefix(killed, ref.path)[1] == steps[0] + 1
    damaged = tmp_path / "d.h5"
    damaged.write_bytes(killed.read_bytes())
    damage(damaged, offset)
    before = damaged.read_bytes()
    assert main(["run", str(ref.config), "-o", str(damaged), "--resume", "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"slot{active} is damaged" in line and f"slot{1 - active} holds a commit that was never made active" in line
    assert damaged.read_bytes() == before
    no_index = tmp_path / "i.h5"
    assert main(["recover", str(killed), "-o", str(no_index)]) == 0
    with h5py.File(no_index, "r+") as f:
        f["checkpoint/active"][()] = 7
    capsys.readouterr()
    assert main(["run", str(ref.config), "-o", str(no_index), "--resume", "--quiet"]) == 0
    warning = one_line(capsys.readouterr().err)
    assert f"resuming from slot{active}, the earlier of the two" in warning and f"step {steps[0]}" in warning
    assert_same_run(no_index, ref.path)
    assert main(["recover", str(killed)]) == 0
    assert main(["validate", str(killed)]) == 0
    assert main(["run", str(ref.config), "-o", str(killed), "--resume", "--quiet"]) == 0
    assert_same_run(killed, ref.path)


def damage(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset + 5)
        byte = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([byte[0] ^ 0x01]))


def test_recover_refuses_a_live_run_and_bad_files(refs, tmp_path, capsys, one_thread):
    ref = refs["euler"]
    out = tmp_path / "live.h5"
    proc = start(ref.config, out, "--set", "run.t_end=1000")
    try:
        wait_for_frames(out, proc, 2)  # in the time loop, writing (a wait by the clock missed it under load)
        assert main(["recover", str(out)]) == 2
        assert "is writing it" in one_line(capsys.readouterr().err)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
    for bad in (tmp_path / "missing.h5", tmp_path / "text.h5"):
        if bad.name == "text.h5":
            bad.write_text("hello")
        assert main(["recover", str(bad)]) == 2
        assert str(bad) in one_line(capsys.readouterr().err)


# ---- SIGINT and SIGTERM -----------------------------------------------------------------------------

@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_signals_stop_cleanly_and_resume_bit_exact(refs, tmp_path, one_thread, sig, code):
    ref = refs["sgd"]
    out = tmp_path / "s.h5"
    proc = start(ref.config, out)
    wait_for_frames(out, proc, 2)  # in the time loop (not by a fraction of the reference's duration: load varies)
    time.sleep(random.Random(int(sig)).uniform(0.0, 0.1) * ref.duration)
    proc.send_signal(sig)
    if sig == signal.SIGINT:
        time.sleep(0.005)
        proc.send_signal(sig)      # an impatient second Ctrl-C while the checkpoint is written
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err
    assert "continue with --resume" in one_line(err)
    with h5py.File(out, "r") as f:  # closed cleanly: plain h5py opens it, every row is committed
        assert f.attrs["status"].decode() == "interrupted"
        n = f["frames/time"].shape[0]
        ck = read_checkpoint(f)
        assert (ck.n_frames, ck.n_steps) == (n, f["steps/time"].shape[0])
    assert 0 < n < len(open_trajectory(ref.path).time)
    assert_prefix(out, ref.path)
    assert main(["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]) == 0
    assert_same_run(out, ref.path)


def test_a_live_run_is_read_but_not_resumed_overwritten_or_edited(refs, tmp_path, capsys, one_thread):
    """While a run writes its file, info reads it (committed frames), and --resume, --force and
    edit_trajectory are refused: a second writer would fork the run into two diverging files."""
    ref = refs["euler"]
    out = tmp_path / "live.h5"
    proc = start(ref.config, out, "--set", "run.t_end=1000")
    try:
        wait_for(out, proc)
        time.sleep(0.3 * ref.duration)
        assert main(["info", str(out)]) == 0
        assert "running, or its process died" in capsys.readouterr().out
        assert_prefix(out, ref.path, longer=True)  # on a quieter machine it may be past the reference's t = 1
        before = out.stat().st_ino
        for argv in (["--resume"], ["--force"]):
            assert main(["run", str(ref.config), "-o", str(out), "--quiet", *argv]) == 2
            assert "another pdeflow process is writing it" in one_line(capsys.readouterr().err)
        with pytest.raises(TrajectoryError, match="another pdeflow process"):
            with edit_trajectory(out):
                pass
        assert out.stat().st_ino == before and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert main(["run", str(ref.config), "-o", str(out), "--quiet", "--resume"]) == 0  # now it may


# ---- signals while /analysis is written; resume with another thread count ------------------------------

# ``pdeflow ARGS`` whose N-th dataset creation in /analysis sends SIG to the process itself: the signal lands
# in the middle of writing the analysis.
SIGNAL_IN_ANALYSIS = """
import os, signal, sys, h5py
from pdeflow.interface.cli import main
# a pytest-xdist worker ignores SIGINT, and a child inherits an ignored signal: Ctrl-C's default again
signal.signal(signal.SIGINT, signal.default_int_handler)
sig, n = int(sys.argv[1]), int(sys.argv[2])
create = h5py.Group.create_dataset
count = [0]
def create_dataset(self, name, *args, **kwargs):
    if self.name.startswith("/analysis"):
        count[0] += 1
        if count[0] == n:
            os.kill(os.getpid(), sig)
    return create(self, name, *args, **kwargs)
h5py.Group.create_dataset = create_dataset
sys.exit(main(sys.argv[3:], exiting=True))
"""


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_analysis_is_written_leaves_the_old_or_the_new_one(refs, tmp_path, sig, code):
    """SIGINT or SIGTERM halfway through writing /analysis (``pdeflow diagnose``, as after a run): the file is
    byte for byte the one before - no /analysis, or the previous one - and no ``.partial`` copy is left; the
    write that is not interrupted stores the whole new analysis."""
    out = tmp_path / "a.h5"
    out.write_bytes(refs["euler"].path.read_bytes())
    argv = ["diagnose", str(out), "--no-gap"]
    for previous in (None, "old"):
        before = out.read_bytes()
        proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_ANALYSIS, str(int(sig)), "3", *argv], env=env(),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["a.h5"]
        assert (open_trajectory(out).analysis == {}) == (previous is None)
        assert main(argv) == 0
        new = open_trajectory(out).analysis
        assert {"time", "energy", "cluster_labels"} <= set(new), sorted(new)


def test_resume_with_another_thread_count_is_bit_exact(refs, tmp_path, one_thread):
    """A run killed with one numba thread and resumed with two (then the other way round) ends bit for bit
    equal to the uninterrupted one-thread run: the kernels split work by heads and sequences, not by threads."""
    for name, first, second in (("adaptive", 1, 2), ("sgd", 2, 1)):
        ref, out = refs[name], tmp_path / f"{name}.h5"
        frames = len(open_trajectory(ref.path).time)
        proc = start(ref.config, out, threads=first)
        # the two-thread part kept short (two threads on a loaded 2-core machine crawl): killed late in the
        # one-thread run, early in the two-thread one
        wait_for_frames(out, proc, (2 * frames) // 3 if first == 1 else 2)
        proc.kill()
        proc.communicate()
        assert assert_prefix(out, ref.path)[0] >= 2
        resumed = start(ref.config, out, "--resume", threads=second)
        _, err = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, err
        assert_same_run(out, ref.path)


# ---- non-finite states ------------------------------------------------------------------------------

@pytest.mark.parametrize("method,cause", [("euler", "reduce solver.dt"), ("sgd", "learning rate")])
def test_non_finite_state_stops_with_exit_3_and_keeps_the_last_good_frame(tmp_path, capsys, one_thread, method,
                                                                          cause):
    cfg_path = tmp_path / "nf.toml"
    cfg_path.write_text(BASE.replace('method = "euler"', f'method = "{method}"').replace("dt = 0.01", "dt = 5.0")
                        .replace("t_end = 1.0", "t_end = 10000.0")
                        .replace("frame_interval = 0.01", "frame_interval = 50.0")
                        .replace("head_dim = 2", "head_dim = 2\nweight_decay = 1.0")
                        # the accuracy check would stop the run at t = 0 (lambda_max dt >= 5 > 2): off, to reach inf
                        .replace("[run]", '[run]\naccuracy = "off"'))
    out = tmp_path / "nf.h5"
    assert main(["run", str(cfg_path), "-o", str(out), "--quiet"]) == 3
    line = one_line(capsys.readouterr().err)
    # the step that went non-finite, found independently by stepping the same stepper by hand
    cfg = load_config(cfg_path)
    stepper = make_stepper(Problem.from_config(cfg), cfg)
    state = stepper.initial_state()
    with np.errstate(all="ignore"):
        while True:
            new, _ = stepper.step(state, np.inf)
            # non-finite: a field, or the energy, risk or dissipation (|grad Phi|^2 overflows first)
            if not (stepper.is_finite(new) and np.all(np.isfinite(list(stepper.diagnostics(new).values())))):
                break
            state = new
    assert f"non-finite state at step {state.step + 1} " in line and cause in line, line
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "non_finite"
    assert traj.checkpoint.step == state.step and len(traj.steps["time"]) == state.step + 1
    np.testing.assert_array_equal(traj.checkpoint.fields["omega"], state.fields["omega"])
    expected_frames = int(state.t // 50.0) + 1
    assert len(traj.time) == expected_frames and all(np.all(np.isfinite(v)) for v in traj.frames.values())


# ---- write failures ---------------------------------------------------------------------------------

def test_file_size_limit_gives_exit_3_one_line_and_keeps_frames(refs, tmp_path, one_thread):
    """A real write failure: RLIMIT_FSIZE makes the kernel refuse the write (EFBIG) as a full disk would."""
    ref = refs["euler"]
    limit = int(0.75 * ref.path.stat().st_size)
    out = tmp_path / "w.h5"
    proc = start(ref.config, out, preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err
    line = one_line(err)
    assert "cannot write" in line and "File too large" in line and "--resume" in line
    n, _ = assert_prefix(out, ref.path)
    assert 0 < n < len(open_trajectory(ref.path).time)
    assert main(["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]) == 0
    assert_same_run(out, ref.path)


def test_injected_disk_full_gives_exit_3_and_keeps_frames(refs, tmp_path, capsys, monkeypatch, one_thread):
    ref = refs["euler"]
    out = tmp_path / "w.h5"
    calls = [0]
    append = TrajectoryWriter.append_frame

    def failing(self, *args):
        calls[0] += 1
        if calls[0] == 7:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return append(self, *args)

    monkeypatch.setattr(TrajectoryWriter, "append_frame", failing)
    assert main(["run", str(ref.config), "-o", str(out), "--quiet"]) == 3
    assert "No space left on device" in one_line(capsys.readouterr().err)
    assert assert_prefix(out, ref.path)[0] == 6
    monkeypatch.setattr(TrajectoryWriter, "append_frame", append)
    assert main(["run", str(ref.config), "-o", str(out), "--resume", "--quiet"]) == 0
    assert_same_run(out, ref.path)


def test_failure_to_create_the_file_is_exit_2_and_leaves_nothing(refs, tmp_path, capsys, monkeypatch, one_thread):
    ref = refs["euler"]
    old = tmp_path / "old.h5"
    old.write_bytes(b"an older result")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(TrajectoryWriter, "_populate", staticmethod(full))
    assert main(["run", str(ref.config), "-o", str(old), "--force", "--quiet"]) == 2
    assert "No space left on device" in one_line(capsys.readouterr().err)
    assert old.read_bytes() == b"an older result" and sorted(p.name for p in tmp_path.iterdir()) == ["old.h5"]


# ---- determinism ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sgd", "fv"])
def test_same_config_and_seed_give_identical_files(refs, tmp_path, one_thread, name):
    out = tmp_path / "again.h5"
    assert main(["run", str(refs[name].config), "-o", str(out), "--quiet"]) == 0
    assert_same_run(out, refs[name].path)
    with h5py.File(out, "r") as a, h5py.File(refs[name].path, "r") as b:
        names = []
        a.visit(names.append)
        other = []
        b.visit(other.append)
        assert names == other
        for key in names:
            if isinstance(a[key], h5py.Dataset) and key.rsplit("/", 1)[-1] not in IGNORED:
                np.testing.assert_array_equal(a[key][()], b[key][()], err_msg=key)
        assert set(a.attrs) == set(b.attrs)
        for k in set(a.attrs) - {"created"}:
            x, y = np.asarray(a.attrs[k]), np.asarray(b.attrs[k])   # NaN (no figure, e.g. accuracy_lost_at) equals NaN
            assert np.array_equal(x, y) or (x.dtype.kind == "f" and np.isnan(x).all() and np.isnan(y).all()), k


def test_one_and_two_threads_agree(refs, tmp_path):
    """The first 11 frames of the SGD run (same schedule: t_end cut to 0.2) with NUMBA_NUM_THREADS=2
    against the one-thread reference."""
    ref = refs["sgd"]
    out = tmp_path / "two.h5"
    proc = start(ref.config, out, "--set", "run.t_end=0.2", threads=2)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    a, b = open_trajectory(out), open_trajectory(ref.path)
    n = len(a.time)
    assert n == 11 and a.time[-1] == b.time[n - 1]
    for key in set(a.frames) - IGNORED:
        scale = max(1.0, float(np.max(np.abs(b.frames[key][:n]))))
        assert float(np.max(np.abs(a.frames[key] - b.frames[key][:n]))) <= 1e-12 * scale, key


# ---- nothing read is executed -----------------------------------------------------------------------

UNSAFE_MODULES = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
# Uses that read nothing from a config or a file: exceptions passed between the MPI ranks of one job.
ALLOWED = {"pdeflow/core/parallel.py": ["import pickle"]}


def unsafe_uses(source: str) -> list[str]:
    """Imports of pickling modules, calls of eval/exec/compile/__import__, np.load without
    allow_pickle=False, torch.load without weights_only=True, yaml.load, pandas read_pickle."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(f, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
                found.append(f"{name}()")
            elif name == "load" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                owner = f.value.id
                if owner in ("np", "numpy") and not (isinstance(kw.get("allow_pickle"), ast.Constant)
                                                     and kw["allow_pickle"].value is False):
                    found.append("np.load without allow_pickle=False")
                if owner == "torch" and not (isinstance(kw.get("weights_only"), ast.Constant)
                                             and kw["weights_only"].value is True):
                    found.append("torch.load without weights_only=True")
                if owner == "yaml":
                    found.append("yaml.load")
            elif name == "read_pickle":
                found.append("read_pickle()")
    return found


def test_the_checker_finds_what_it_looks_for():
    bad = ("import pickle\nfrom dill import loads\nx = eval('1')\nexec('y = 1')\nnp.load(p)\n"
           "np.load(p, allow_pickle=True)\ntorch.load(p)\nyaml.load(s)\n")
    assert len(unsafe_uses(bad)) == 8
    assert unsafe_uses("np.load(p, allow_pickle=False)\ntorch.load(p, weights_only=True)\njson.loads(s)\n") == []


def test_no_pickle_eval_or_exec_on_anything_read():
    files = [p for d in ("pdeflow", "solvers", "benchmarks") for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 10
    problems = {str(p.relative_to(REPO)): unsafe_uses(p.read_text()) for p in files}
    assert {k: v for k, v in problems.items() if v and v != ALLOWED.get(k)} == {}
