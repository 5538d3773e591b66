"""Heads sharded across MPI ranks: the communicator.

Heads interact only through the head-averaged output ``O`` [B, T, d], so the N particles are split into P contiguous
blocks (:func:`shard`) and one ``Allreduce`` of ``O`` per evaluation lets every rank see the whole measure; scalar
sums are gathered and added in rank order, so every rank takes the same decisions. :data:`SERIAL` (one process) and
:class:`MPIComm` (``mpiexec -n P``, detected from the launcher's environment) share one interface; :func:`on_root`
runs an operation on rank 0 and re-raises its failure on every rank. The design: docs/design.md, "Heads sharded
across MPI ranks".
"""
from __future__ import annotations

import os
import pickle
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import Config, ConfigError
from .jit import THREAD_VARIABLES, thread_environment

# Environment variables in which MPI launchers announce the number of processes.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK")
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "MPI_LOCAL")  # what launchers set in a process
FORCE_VARIABLE = "PDEFLOW_MPI"
FAILURE_AGREEMENT_SECONDS = 20.0  # how long a rank with bad input waits for the others to fail alike
ABORT_GRACE_SECONDS = 1.0  # between a failing rank's last message and MPI_Abort


def shard(n: int, rank: int, size: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of rank ``rank`` when n rows are split into ``size`` contiguous blocks, in rank
    order; the first ``n % size`` blocks hold one row more than the others."""
    base, extra = divmod(int(n), int(size))
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


class SerialComm:
    """One process: every collective is the identity. The default communicator of a :class:`Problem`."""
    rank = 0
    size = 1

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> tuple[int, int]:
        """This rank's rows ``[lo, hi)`` of n (see :func:`shard`)."""
        return shard(n, self.rank, self.size)

    def local_rows(self, array: np.ndarray) -> np.ndarray:
        """This rank's block of rows of an array every rank holds whole (no communication)."""
        lo, hi = self.shard(np.shape(array)[0])
        return array[lo:hi]

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        """The elementwise sum over ranks of a numeric array (float or complex), on every rank."""
        return array

    def allgather(self, value: Any) -> list[Any]:
        """``[value of rank 0, value of rank 1, ...]`` on every rank (small picklable values)."""
        return [value]

    def sum_over_ranks(self, *values: float) -> tuple[float, ...]:
        """Sums over ranks of a few scalars, added in rank order: bitwise the same on every rank."""
        columns = zip(*self.allgather(tuple(values)))
        return tuple(_ordered_sum(c) for c in columns)

    def bcast(self, value: Any) -> Any:
        """Rank 0's value, on every rank."""
        return value

    def gather_rows(self, array: np.ndarray) -> np.ndarray | None:
        """The blocks of all ranks stacked along axis 0, in rank order, on rank 0 (None on the others)."""
        return array

    def scatter_rows(self, array: np.ndarray | None) -> np.ndarray:
        """This rank's block (:meth:`shard`) of rank 0's array (the others pass None)."""
        return array

    def barrier(self) -> None:
        """Wait until every rank has arrived."""

    def abort(self, code: int) -> None:
        """End every rank's process with exit code ``code`` (MPI_Abort); serial: nothing to do."""


def _ordered_sum(values: Sequence[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total


SERIAL = SerialComm()


class MPIComm(SerialComm):
    """:class:`SerialComm`'s interface over an mpi4py communicator (``MPI.COMM_WORLD`` by default)."""

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # a separate channel for agreeing on failures: its messages cannot be mistaken for the run's
        self.control = self.comm.Dup()

    def all_failed(self, timeout: float) -> bool:
        """Called by a rank that failed: whether every rank calls this within ``timeout`` seconds (they all
        failed alike) or not (some are still running and would wait for this rank forever)."""
        request = self.control.Ibarrier()
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        array = np.ascontiguousarray(array)
        out = np.empty_like(array)
        self.comm.Allreduce(array, out, op=self.MPI.SUM)
        return out

    def allgather(self, value: Any) -> list[Any]:
        return self.comm.allgather(value)

    def bcast(self, value: Any) -> Any:
        return self.comm.bcast(value, root=0)

    def gather_rows(self, array: np.ndarray) -> np.ndarray | None:
        array = np.ascontiguousarray(array)
        rows = self.comm.allgather(array.shape[0])
        row_size = int(np.prod(array.shape[1:], dtype=np.int64))
        out = np.empty((sum(rows),) + array.shape[1:], dtype=array.dtype) if self.is_root else None
        counts = [r * row_size for r in rows]
        recv = [out, counts] if self.is_root else None
        self.comm.Gatherv(array, recv, root=0)
        return out

    def scatter_rows(self, array: np.ndarray | None) -> np.ndarray:
        meta = (array.shape, array.dtype.str) if self.is_root else None
        shape, dtype = self.comm.bcast(meta, root=0)
        dtype = np.dtype(dtype)
        row_size = int(np.prod(shape[1:], dtype=np.int64))
        blocks = [shard(shape[0], r, self.size) for r in range(self.size)]
        counts = [(hi - lo) * row_size for lo, hi in blocks]
        lo, hi = blocks[self.rank]
        out = np.empty((hi - lo,) + tuple(shape[1:]), dtype=dtype)
        send = [np.ascontiguousarray(array, dtype=dtype), counts] if self.is_root else None
        self.comm.Scatterv(send, out, root=0)
        return out

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)


def _announced(variables: tuple[str, ...], default: int) -> int:
    for var in variables:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return default


def launcher_size() -> int:
    """The number of processes an MPI launcher announced in the environment (1 when none did)."""
    return _announced(SIZE_VARIABLES, 1)


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (0 when none did); needs no MPI import."""
    return _announced(RANK_VARIABLES, 0)


def find_mpiexec() -> str | None:
    """The ``mpiexec`` beside this interpreter (the MPICH wheel's, matching mpi4py), else the first on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def child_environment(threads: int | None = None) -> dict[str, str]:
    """This process's environment for launching pdeflow processes: without the variables of an MPI launcher
    that may have started this one, and with ``threads`` pdeflow threads per process if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    if threads is not None:
        env.update(thread_environment(threads))
    return env


_WORLD: SerialComm | None = None


def world() -> SerialComm:
    """The communicator of this process: :data:`SERIAL` unless started by an MPI launcher with more than
    one process (or with ``PDEFLOW_MPI=1``); then an :class:`MPIComm` over ``COMM_WORLD``, with the cores
    of each node shared between its ranks (:func:`share_cores`). ConfigError if mpi4py is missing or
    belongs to another MPI than the launcher's. Cached: MPI is initialized once per process."""
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    announced = launcher_size()
    if announced <= 1 and os.environ.get(FORCE_VARIABLE, "") != "1":
        _WORLD = SERIAL
        return _WORLD
    try:
        comm = MPIComm()
    except ImportError as exc:
        raise ConfigError(f"started by an MPI launcher with {announced} processes, but mpi4py cannot be imported "
                          f"({exc}); install it with pip install -e '.[mpi]'") from None
    if announced > 1 and comm.size != announced:
        raise ConfigError(f"the MPI launcher started {announced} processes but mpi4py sees {comm.size}: "
                          f"mpiexec and mpi4py belong to different MPI libraries (use the mpiexec of the "
                          f"environment where mpi4py is installed)")
    _WORLD = comm if comm.size > 1 else SERIAL
    if comm.size > 1:
        share_cores(comm)
    return _WORLD


def failed_alike(message: str) -> bool:
    """After bad input (exit code 2) under MPI: True when every rank failed too, which is the rule since
    input is checked before any communication (then rank 0 alone should report it); otherwise - the
    ranks saw different files, say - print the message with this rank and MPI_Abort every rank with
    code 2, so that no rank waits forever. True in a serial run."""
    if _WORLD is None or _WORLD.size == 1 or _WORLD.all_failed(FAILURE_AGREEMENT_SECONDS):
        return True
    print(f"pdeflow: error on rank {_WORLD.rank} only: {message}", file=sys.stderr)
    _abort_after_output(2)
    return False


def abort_ranks(exc: BaseException) -> None:
    """After an exception that may have happened on this rank only: under MPI with P > 1, print it with
    the rank and MPI_Abort every rank (the others may be waiting in a collective operation and would hang
    forever); nothing in a serial run or before MPI was started."""
    if _WORLD is None or _WORLD.size == 1:
        return
    print(f"pdeflow: rank {_WORLD.rank} failed, aborting all {_WORLD.size} ranks:", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    _abort_after_output(1)


def _abort_after_output(code: int) -> None:
    # the launcher forwards a rank's output through pipes that MPI_Abort's clean-up may cut before they are
    # read: give it a moment, or the one message that says what went wrong can be lost
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_SECONDS)
    _WORLD.abort(code)


def share_cores(comm: MPIComm) -> int:
    """Give each rank ``cores of its node / ranks on its node`` pdeflow threads, unless one of
    THREAD_VARIABLES is set (the user's choice wins). BLAS stays on one thread (see pdeflow.core.jit).
    Returns the thread count chosen (0: left alone)."""
    if any(os.environ.get(v) for v in THREAD_VARIABLES):
        return 0
    import numba

    node = comm.comm.Split_type(comm.MPI.COMM_TYPE_SHARED)
    threads = max(1, (os.cpu_count() or 1) // node.Get_size())
    node.Free()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    return threads


def check_shardable(comm: SerialComm, cfg: Config, sharded: bool, n_particles: int) -> None:
    """ConfigError unless a run of ``cfg`` can be split across ``comm.size`` ranks: the stepper moves
    particles block by block (``sharded``) and every rank gets at least one particle. Call on every rank
    before any collective operation, so that all ranks fail the same way."""
    if comm.size == 1:
        return
    if not sharded:
        raise ConfigError(f"solver.method = {cfg.solver.method!r} with init.measure = {cfg.init.measure!r} does not "
                          f"run on several MPI ranks ({comm.size} started): its steps couple all particles or grid "
                          f"cells beyond the head-averaged output; run it with one process")
    if n_particles < comm.size:
        raise ConfigError(f"init.n_particles = {n_particles} is smaller than the number of MPI ranks ({comm.size})")


def on_root(comm: SerialComm, operation: Any) -> Any:
    """``operation()`` on rank 0; its exception, if any, raised on every rank (None elsewhere)."""
    result, failure = None, None
    if comm.is_root:
        try:
            result = operation()
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
            failure = exc
    if comm.size > 1:
        shared = comm.bcast(_portable(failure))
        if failure is None and shared is not None:
            raise pickle.loads(shared)
    if failure is not None:
        raise failure
    return result


def _portable(exc: Exception | None) -> bytes | None:
    """The pickled exception, or a RuntimeError with its message when it does not pickle."""
    if exc is None:
        return None
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - any pickling failure
        return pickle.dumps(RuntimeError(str(exc)))
