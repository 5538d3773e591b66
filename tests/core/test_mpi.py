"""Heads sharded across MPI ranks (pdeflow.core.parallel): ``mpiexec -n 2 python -m pdeflow run`` equals the serial
run within 1e-12, resumes a serial file and is resumed serially, stops together on a signal, and refuses
bad input with exit code 2 on every rank without hanging.

The 2-rank runs are subprocesses of the real command line (the MPICH launcher of the ``mpi``/``test`` extra);
the serial references run in-process through :func:`pdeflow.interface.cli.main`. Skipped only when mpi4py is not
installed.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import config_text
from pdeflow import open_trajectory
from pdeflow.core.parallel import SERIAL, SerialComm, child_environment, find_mpiexec, shard
from pdeflow.interface.cli import main

pytestmark = pytest.mark.usefixtures("one_numba_thread")

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-12
RANKS = 2
TIMEOUT = 120  # seconds: a hang (ranks waiting for each other) fails instead of blocking the suite

# 11 particles: blocks of 6 and 5 on two ranks
BASE = {"init": {"n_particles": 11, "scale": 1.0}, "solver": {"method": "adaptive", "dt": 0.05},
        "run": {"t_end": 1.0, "frame_interval": 0.25}, "diagnostics": {"enabled": False}}
SGD = {"solver": {"method": "sgd", "dt": 0.05}, "model": {"beta": 50.0},
       "sgd": {"batch_size": 5, "noise": True, "sampling": "resample"}}


def write_config(path: Path, **overrides) -> Path:
    sections = {name: dict(values) for name, values in BASE.items()}
    for name, values in overrides.items():
        sections.setdefault(name, {}).update(values)
    path.write_text(config_text(**sections))
    return path


def mpiexec() -> str:
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install -e '.[mpi]' or '.[test]' brings it and MPICH)")
    found = find_mpiexec()
    assert found, "mpi4py is installed but no mpiexec was found next to the interpreter or on PATH"
    return found


def environment() -> dict[str, str]:
    env = child_environment(threads=1)  # two ranks of one thread on a small shared machine
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def launch(*args: str) -> list[str]:
    return [mpiexec(), "-n", str(RANKS), sys.executable, "-m", "pdeflow", *args]


def mpi_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(launch(*args), capture_output=True, text=True, env=environment(), timeout=TIMEOUT)


def mpi_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code args`` on the ranks."""
    return subprocess.run([mpiexec(), "-n", str(RANKS), sys.executable, "-c", code, *args], capture_output=True,
                          text=True, env=environment(), timeout=TIMEOUT)


def serial_run(*args: str) -> int:
    return main(list(args))


def assert_same_run(a_path: Path, b_path: Path) -> None:
    """Same frames and /steps rows, the particles and every recorded number within TOL."""
    a, b = open_trajectory(a_path), open_trajectory(b_path)
    assert a.attrs["status"] == b.attrs["status"] == "finished"
    assert a.frames["omega"].shape == b.frames["omega"].shape
    np.testing.assert_allclose(b.frames["omega"], a.frames["omega"], rtol=0, atol=TOL)
    np.testing.assert_array_equal(a.frames["mass"], b.frames["mass"])
    assert a.steps.keys() == b.steps.keys()
    for key in set(a.steps) - {"wall_time"}:  # row 0 holds NaN in the stepper's columns
        np.testing.assert_allclose(b.steps[key], a.steps[key], rtol=0, atol=TOL, equal_nan=True, err_msg=key)


@pytest.fixture(scope="module")
def serial_files(tmp_path_factory):
    """The serial reference runs: adaptive Dormand-Prince, and minibatch SGD with Langevin noise."""
    tmp = tmp_path_factory.mktemp("serial")
    out = {}
    for name, overrides in (("adaptive", {}), ("sgd", SGD)):
        config = write_config(tmp / f"{name}.toml", **overrides)
        out[name] = (config, tmp / f"{name}.h5")
        assert serial_run("run", str(config), "-o", str(out[name][1]), "--quiet") == 0
    return out


# ---- the communicator, without MPI -------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 11, 64])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_shard_blocks_cover_the_particles_in_rank_order(n, size):
    blocks = [shard(n, r, size) for r in range(size)]
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(blocks[r][1] == blocks[r + 1][0] for r in range(size - 1))  # contiguous, in rank order
    lengths = [hi - lo for lo, hi in blocks]
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)


def test_serial_run_never_imports_mpi4py():
    """Outside an MPI launcher the communicator is SERIAL and mpi4py stays unimported."""
    code = ("import sys; from pdeflow.core.parallel import world, SERIAL; "
            "import pdeflow.interface.cli, pdeflow.solvers.driver; "
            "assert world() is SERIAL; assert not any(m.startswith('mpi4py') for m in sys.modules), 'imported'")
    subprocess.run([sys.executable, "-c", code], env=environment(), check=True, timeout=TIMEOUT)
    assert SERIAL.sum_over_ranks(1.5, 2.0) == (1.5, 2.0) and SERIAL.local_rows(np.arange(3)).tolist() == [0, 1, 2]


# ---- the Problem on two ranks -------------------------------------------------------------------
PROBLEM_CHECK = """
import json, sys
import numpy as np
from pdeflow import Problem, load_config
from pdeflow.core.parallel import world
comm = world()
serial = Problem.from_config(load_config(sys.argv[1]))
sharded = serial.with_comm(comm)
rng = np.random.default_rng(0)
omega, mass = rng.normal(size=(11, serial.k)), rng.dirichlet(np.full(11, 2.0))   # unequal masses
query, point, vector = rng.normal(size=(3, serial.k)), rng.normal(size=serial.k), rng.normal(size=serial.k)
direction = rng.normal(size=omega.shape)   # a whole-system direction: each rank takes its block
lo, hi = comm.shard(11)
mine, whole = sharded.evaluate(omega[lo:hi], mass[lo:hi]), serial.evaluate(omega, mass)
om, ms = omega[lo:hi], mass[lo:hi]
dev = {"energy": abs(mine.energy - whole.energy), "risk": abs(mine.risk - whole.risk),
       "dissipation": abs(mine.dissipation - whole.dissipation),
       "phi": np.abs(mine.phi - whole.phi[lo:hi]).max(),
       "grad_phi": np.abs(mine.grad_phi - whole.grad_phi[lo:hi]).max(),
       "energy()": abs(sharded.energy(om, ms) - serial.energy(omega, mass)),
       "confinement()": abs(sharded.confinement(om, ms) - serial.confinement(omega, mass)),
       "phi(query)": np.abs(sharded.phi(query, om, ms) - serial.phi(query, omega, mass)).max(),
       "grad_phi(query)": np.abs(sharded.grad_phi(query, om, ms) - serial.grad_phi(query, omega, mass)).max(),
       "hvp (complex Allreduce)": np.abs(sharded.hvp(point, vector, om, ms)
                                         - serial.hvp(point, vector, omega, mass)).max(),
       "translation_hvp": np.abs(sharded.translation_hvp(point, vector) - serial.translation_hvp(point, vector)).max(),
       "system_jvp (forward mode, O and O' in one Allreduce)": np.abs(
           sharded.system_jvp(om, ms, direction[lo:hi]) - serial.system_jvp(omega, mass, direction)[lo:hi]).max(),
       "rows": hi - lo}
worst = comm.allgather(dev)
if comm.is_root:
    print(json.dumps([{k: float(v) for k, v in d.items()} for d in worst]))
"""


@pytest.mark.slow
def test_problem_on_two_ranks_equals_the_serial_problem(tmp_path):
    """Every Problem method on a rank's block of a measure with unequal masses: energy, risk, dissipation,
    confinement and Phi, grad Phi, Hessian-vector products at the rank's particles and at common query points,
    and the whole-system JVP on the rank's block of a direction equal the serial values within 1e-12 (the
    one-head translation Hessian is not summed over ranks)."""
    config = write_config(tmp_path / "p.toml")
    proc = mpi_python(PROBLEM_CHECK, str(config))
    assert proc.returncode == 0, proc.stderr
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r.pop("rows") for r in ranks] == [6, 5]
    for r in ranks:
        assert max(r.values()) <= TOL, r


# ---- two ranks against the serial run --------------------------------------------------------
@pytest.mark.parametrize("name", ["adaptive", "sgd"])
def test_two_ranks_equal_the_serial_run(serial_files, tmp_path, name):
    """The adaptive stepper (error norm over all ranks) and minibatch SGD with noise (drawn whole, rows taken
    per rank): every frame, every step and the step count equal the serial run's within 1e-12."""
    config, reference = serial_files[name]
    out = tmp_path / "mpi.h5"
    proc = mpi_run("run", str(config), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("pdeflow: finished") == 1  # rank 0 alone prints
    assert_same_run(reference, out)


def test_resume_with_another_number_of_ranks(serial_files, tmp_path):
    """A serial file resumed on 2 ranks, and a 2-rank file resumed serially, end where the serial run ends."""
    config, reference = serial_files["adaptive"]
    to_mpi, to_serial = tmp_path / "serial_then_mpi.h5", tmp_path / "mpi_then_serial.h5"
    assert serial_run("run", str(config), "-o", str(to_mpi), "--quiet", "--set", "run.max_steps=3") == 0
    first = mpi_run("run", str(config), "-o", str(to_serial), "--set", "run.max_steps=3")
    assert first.returncode == 0, first.stderr
    for path in (to_mpi, to_serial):
        assert open_trajectory(path).attrs["status"] == "max_steps"
    resumed = mpi_run("run", str(config), "-o", str(to_mpi), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert serial_run("run", str(config), "-o", str(to_serial), "--resume", "--quiet") == 0
    assert_same_run(reference, to_mpi)
    assert_same_run(reference, to_serial)


# ---- stopping together -------------------------------------------------------------------------
def _committed_frames(path: Path) -> int:
    try:
        return len(open_trajectory(path).time)
    except Exception:  # not created yet, or between its creation and its first commit
        return 0


def test_sigterm_stops_every_rank_after_the_same_step(tmp_path):
    """SIGTERM to mpiexec reaches both ranks at different instants; they agree, checkpoint once and exit 143."""
    config = write_config(tmp_path / "long.toml", solver={"method": "rk4", "dt": 0.01},
                          run={"t_end": 1e4, "frame_interval": 0.1})
    out = tmp_path / "long.h5"
    proc = subprocess.Popen(launch("run", str(config), "-o", str(out)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment())
    try:
        deadline = time.monotonic() + TIMEOUT
        # signal only once the ranks are in the time loop (a frame after t = 0 is committed): a signal
        # during start-up (imports, numba compilation) is the launcher's business, not the time loop's
        while proc.poll() is None and time.monotonic() < deadline and _committed_frames(out) < 2:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    assert stderr.count("interrupted by SIGTERM") == 1, stderr
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "interrupted"
    assert traj.checkpoint.t > 0 and traj.checkpoint.fields["omega"].shape == (11, traj.frames["omega"].shape[2])
    assert traj.steps["time"][-1] == traj.checkpoint.t  # the rows and the checkpoint agree


class _Agreement(SerialComm):
    """Rank 0 of two, in-process: the other rank sends ``other`` to every agreement, and SIGTERM reaches this
    process during agreement number ``signal_during`` (while its allgather is in flight, as when mpiexec
    signals the ranks while they exchange)."""
    size = 2

    def __init__(self, signal_during: int = 0, other: int = 0) -> None:
        self.signal_during, self.other, self.sent = signal_during, other, []

    def allgather(self, value):
        self.sent.append(value)
        if len(self.sent) == self.signal_during:
            signal.raise_signal(signal.SIGTERM)  # the handler runs before the allgather returns
        return [value, self.other]


def test_a_signal_arriving_during_the_agreement_is_kept_for_the_next_one():
    """The SIGTERM race: a signal whose handler ran while the ranks exchanged their signals used to be replaced
    by the agreed "none" (lost on this rank; on both when mpiexec's signal reached both then: the run went on to
    t_end). It is kept and sent at the next agreement, so that every rank stops after the same step; no rank
    ever stops on a signal the others were not told of."""
    from pdeflow.solvers.driver import Interrupted, _Signals

    comm = _Agreement(signal_during=1)
    guard = _Signals(comm)
    with guard:
        with guard.held():
            pass                                        # agreement 1: the signal arrives while it is in flight
        assert guard.pending == signal.SIGTERM          # recorded, not acted on alone
        with pytest.raises(Interrupted) as stopped:
            with guard.held():
                pass                                    # agreement 2: sent, and every rank stops here
    assert stopped.value.signum == signal.SIGTERM and comm.sent == [0, signal.SIGTERM]


def test_a_signal_of_another_rank_stops_this_one_at_the_same_agreement():
    from pdeflow.solvers.driver import Interrupted, _Signals

    comm = _Agreement(other=signal.SIGINT)
    guard = _Signals(comm)
    with guard, pytest.raises(Interrupted) as stopped:
        with guard.held():
            pass
    assert stopped.value.signum == signal.SIGINT and comm.sent == [0]


# ---- bad input: exit 2 on every rank, no hang -------------------------------------------------
def test_unshardable_method_is_refused_on_every_rank(tmp_path):
    """A grid (or JKO) run couples all cells (particles) beyond the aggregate output: refused before any
    communication, so every rank exits 2 and rank 0 prints one line naming solver.method."""
    config = write_config(tmp_path / "fv.toml", model={"coordinates": "gain2"}, init={"measure": "grid"},
                          solver={"method": "fv", "dt": 1.0}, grid={"n": 8})
    out = tmp_path / "fv.h5"
    proc = mpi_run("run", str(config), "-o", str(out))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "solver.method = 'fv'" in lines[0] and "MPI ranks" in lines[0], proc.stderr
    assert not out.exists()


def test_a_file_rank_0_cannot_create_fails_every_rank(tmp_path):
    """Rank 0's failure to create the file (here its ``.partial`` sibling is a directory) comes after the
    ranks started communicating: it is raised on every rank, which all exit 2 with one line."""
    config = write_config(tmp_path / "c.toml")
    out = tmp_path / "c.h5"
    (tmp_path / "c.h5.partial").mkdir()
    proc = mpi_run("run", str(config), "-o", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot create" in lines[0], proc.stderr
    assert not out.exists()


def test_a_failure_on_one_rank_aborts_every_rank(tmp_path):
    """An unexpected exception on rank 1 alone (rank 0 then waits in a collective): the run ends at once,
    with the traceback of the failing rank and a non-zero exit code, instead of hanging."""
    config = write_config(tmp_path / "f.toml")
    code = ("import sys; from pdeflow.interface.cli import main; from pdeflow.core.parallel import world\n"
            "import pdeflow.solvers.explicit as e\n"
            "step = e.DormandPrince.step\n"
            "def failing(self, state, dt_limit):\n"
            "    if world().rank == 1 and state.step == 2: raise RuntimeError('injected failure')\n"
            "    return step(self, state, dt_limit)\n"
            "e.DormandPrince.step = failing\n"
            f"sys.exit(main(['run', {str(config)!r}, '-o', {str(tmp_path / 'f.h5')!r}]))\n")
    proc = mpi_python(code)
    assert proc.returncode != 0
    assert "rank 1 failed, aborting all 2 ranks" in proc.stderr and "injected failure" in proc.stderr, proc.stderr


def test_bad_input_seen_by_one_rank_only_aborts_every_rank(tmp_path):
    """Bad input found on rank 1 alone (say, a file its node does not see) while rank 0 went on: rank 1 waits
    for the others to fail alike, then reports and aborts all ranks with exit code 2 instead of hanging."""
    config = write_config(tmp_path / "b.toml")
    code = ("import sys; import pdeflow.core.parallel as par; from pdeflow.interface.cli import main\n"
            "from pdeflow import Problem\n"
            "from pdeflow.core.config import ConfigError\n"
            "par.FAILURE_AGREEMENT_SECONDS = 2.0\n"
            "build = Problem.from_config\n"
            "def failing(cfg):\n"
            "    if par.world().rank == 1: raise ConfigError('task.path: injected, rank 1 only')\n"
            "    return build(cfg)\n"
            "Problem.from_config = staticmethod(failing)\n"
            f"sys.exit(main(['run', {str(config)!r}, '-o', {str(tmp_path / 'b.h5')!r}]))\n")
    proc = mpi_python(code)
    assert proc.returncode == 2, proc.stderr
    assert "pdeflow: error on rank 1 only: task.path: injected, rank 1 only" in proc.stderr, proc.stderr


def test_ranks_share_the_cores_of_their_node():
    """Without a thread count from the user, each of P ranks on a node gets cores / P threads, and BLAS
    stays on one thread (pdeflow's own threads use the cores)."""
    code = ("import os, numba, threadpoolctl\n"
            "from pdeflow.core.parallel import world\n"
            "comm = world()\n"
            "blas = max(p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'blas')\n"
            "rows = comm.comm.gather((comm.rank, numba.get_num_threads(), blas), root=0)\n"
            "if comm.rank == 0:\n"
            "    print(rows)\n")
    env = {k: v for k, v in environment().items()
           if k not in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    proc = subprocess.run([mpiexec(), "-n", str(RANKS), sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    expected = max(1, (os.cpu_count() or 1) // RANKS)
    assert proc.stdout.strip() == str([(r, expected, 1) for r in range(RANKS)]), proc.stdout
