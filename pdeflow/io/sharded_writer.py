"""The trajectory writer of a run whose heads are sharded across MPI ranks.

:class:`GatheringWriter` is the :class:`~pdeflow.io.trajectory_writer.TrajectoryWriter` of a run: rank 0 owns the
file and writes the fields gathered from all ranks; the other ranks never open it. A failed write on
rank 0 is re-raised on every rank at the same call (:func:`pdeflow.core.parallel.on_root`), so all ranks leave
the run together.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.config import Config
from ..core.parallel import SerialComm, on_root
from .checkpoint import Checkpoint
from .trajectory_writer import TrajectoryWriter


class GatheringWriter:
    """A :class:`~pdeflow.io.trajectory_writer.TrajectoryWriter` for a run whose fields are sharded across ranks.

    Every rank calls every method at the same point of the run. Fields (``omega`` [N_r, k], ``mass``
    [N_r]) are this rank's block; the writer gathers them to rank 0, which alone opens and writes the
    file. An exception of rank 0's file operation is raised on every rank (same class, same message).
    With :data:`SERIAL` it is the plain writer. ``last_frame_time`` and ``last_wall_time`` are known on
    every rank.
    """

    def __init__(self, comm: SerialComm, writer: TrajectoryWriter | None, n_frames: int, n_steps: int,
                 last_frame_time: float, last_wall_time: float) -> None:
        self.comm, self.writer = comm, writer
        self._n_frames, self._n_steps = n_frames, n_steps
        self.last_frame_time, self.last_wall_time = last_frame_time, last_wall_time

    @classmethod
    def create(cls, comm: SerialComm, path: Any, cfg: Config, arrays: dict[str, Any],
               fields: dict[str, np.ndarray], *args: Any, **kwargs: Any) -> GatheringWriter:
        """:meth:`TrajectoryWriter.create` on rank 0 with the gathered ``fields`` (same arguments)."""
        whole = {key: comm.gather_rows(value) for key, value in fields.items()}
        writer = on_root(comm, lambda: TrajectoryWriter.create(path, cfg, arrays, whole, *args, **kwargs))
        return cls(comm, writer, 0, 0, float("nan"), 0.0)

    @classmethod
    def reopen(cls, comm: SerialComm, path: Any) -> tuple[GatheringWriter, Checkpoint]:
        """:meth:`TrajectoryWriter.reopen` on rank 0; the checkpoint's fields are split into this rank's
        blocks for the current number of ranks (which may differ from the run that wrote the file)."""
        comm.barrier()  # every rank has finished reading the file before rank 0 opens it for writing

        def reopen() -> tuple[TrajectoryWriter, Checkpoint, float, float]:
            writer, ck = TrajectoryWriter.reopen(path)
            frames, wall = writer.f["frames"]["time"], writer.f["steps"]["wall_time"]
            return (writer, ck, float(frames[ck.n_frames - 1]) if ck.n_frames else float("nan"),
                    float(wall[ck.n_steps - 1]) if ck.n_steps else 0.0)

        opened = on_root(comm, reopen)
        writer, ck, last_frame, last_wall = opened if comm.is_root else (None, None, None, None)
        head = None if ck is None else Checkpoint(fields={}, t=ck.t, dt=ck.dt, step=ck.step, n_frames=ck.n_frames,
                                                  n_steps=ck.n_steps, rng=ck.rng, extra=ck.extra)
        head, last_frame, last_wall, names = comm.bcast((head, last_frame, last_wall,
                                                         None if ck is None else sorted(ck.fields)))
        head.fields = {key: comm.scatter_rows(ck.fields[key] if comm.is_root else None) for key in names}
        return cls(comm, writer, head.n_frames, head.n_steps, last_frame, last_wall), head

    @property
    def n_frames(self) -> int:
        return self._n_frames

    @property
    def n_steps(self) -> int:
        return self._n_steps

    def append_steps(self, rows: dict[str, np.ndarray]) -> None:
        on_root(self.comm, lambda: self.writer.append_steps(rows))
        self._n_steps += len(np.atleast_1d(rows["time"]))

    def append_frame(self, fields: dict[str, np.ndarray], scalars: dict[str, float]) -> None:
        whole = {key: self.comm.gather_rows(value) for key, value in fields.items()}
        on_root(self.comm, lambda: self.writer.append_frame(whole, scalars))
        self._n_frames += 1
        self.last_frame_time = float(scalars["time"])

    def write_checkpoint(self, ck: Checkpoint) -> None:
        whole = {key: self.comm.gather_rows(value) for key, value in ck.fields.items()}
        on_root(self.comm, lambda: self.writer.write_checkpoint(
            Checkpoint(fields=whole, t=ck.t, dt=ck.dt, step=ck.step, n_frames=ck.n_frames, n_steps=ck.n_steps,
                       rng=ck.rng, extra=ck.extra)))

    def finish(self, status: str, message: str, attrs: dict[str, Any] | None = None) -> None:
        on_root(self.comm, lambda: self.writer.finish(status, message, attrs))

    def close(self) -> None:
        on_root(self.comm, lambda: self.writer.close())

    def abandon(self) -> None:
        """Close after a failed write; no communication (it runs on an error path)."""
        if self.writer is not None:
            self.writer.abandon()
