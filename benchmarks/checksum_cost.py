"""``python -m pdeflow.benchmarks.checksum_cost [--frames F] [--particles N] [--k K] [--repeats R]``: what the
Fletcher-32 checksums of /frames and /steps cost the trajectory writer, in write time and file size.

Writes the same trajectory - F frames of N particles in k coordinates, 20 step rows per frame, a checkpoint per frame,
as the driver does - through :class:`pdeflow.io.trajectory_writer.TrajectoryWriter` with and without the checksums
(:data:`pdeflow.io.trajectory_writer.CHECKSUMS`), with gzip (the default) and without compression, ``R`` times each in
alternation, and prints the median write time, the file size and the time to read every frame back.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from pdeflow.core.config import loads_config
from pdeflow.io import trajectory_writer
from pdeflow.io.checkpoint import Checkpoint
from pdeflow.io.trajectory_writer import TrajectoryWriter

STEPS_PER_FRAME = 20


def problem_arrays(k: int) -> dict:
    rng = np.random.default_rng(0)
    V, T, d, dh, B = 4, 5, 8, 2, 32
    p = 4 * d * dh
    return {"embedding": rng.normal(size=(V, d)), "positions": rng.normal(size=(T, d)),
            "unembedding": rng.normal(size=(V, d)), "tokens": rng.integers(0, V, size=(B, T)),
            "targets": rng.integers(0, V, size=(B, T)), "mask": np.ones((B, T)), "weights": np.full(B, 1 / B),
            "theta0": rng.normal(size=p), "basis": rng.normal(size=(p, k)), "head_dim": dh, "score_scale": 0.7,
            "weight_decay": 0.01}


def write(path: Path, frames: int, n: int, k: int, compression: str | None) -> float:
    """Seconds to write the trajectory (create, frames with their steps and checkpoints, finish)."""
    rng = np.random.default_rng(1)
    fields = {"omega": rng.normal(size=(n, k)), "mass": np.full(n, 1.0 / n)}
    start = time.perf_counter()
    writer = TrajectoryWriter.create(path, loads_config("[model]\nd = 8\nhead_dim = 2\n"), problem_arrays(k), fields,
                                     compression=compression, overwrite=True)
    for i in range(frames):
        t = np.arange(STEPS_PER_FRAME) + i * STEPS_PER_FRAME
        writer.append_steps({key: t * 1.0 + j for j, key in enumerate(("time", "dt", "energy", "risk", "dissipation",
                                                                         "wall_time"))})
        fields = {"omega": fields["omega"] + 1e-3 * rng.normal(size=(n, k)), "mass": fields["mass"]}
        writer.append_frame(fields, {"time": float(i), "step": i, "dt": 0.1, "wall_time": 0.0, "energy": 1.0,
                                     "dissipation": 1.0})
        writer.write_checkpoint(Checkpoint(fields=fields, t=float(i), dt=0.1, step=i, n_frames=writer.n_frames,
                                           n_steps=writer.n_steps, rng=None))
    writer.finish("finished", "benchmark")
    return time.perf_counter() - start


def read_seconds(path: Path) -> float:
    start = time.perf_counter()
    with h5py.File(path, "r") as f:
        f["frames/omega"][()]
        f["steps/energy"][()]
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.checksum_cost",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--particles", type=int, default=256)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{args.frames} frames of N = {args.particles}, k = {args.k}, {STEPS_PER_FRAME} steps per frame; "
          f"median of {args.repeats}")
    print(f"{'compression':<12} {'checksums':<10} {'write s':>9} {'size MB':>9} {'read s':>8}")
    with tempfile.TemporaryDirectory(prefix="pdeflow-checksum-cost-") as tmp:
        for compression in ("gzip", None):
            times: dict[bool, list[float]] = {True: [], False: []}
            reads: dict[bool, list[float]] = {True: [], False: []}
            sizes: dict[bool, int] = {}
            for _ in range(args.repeats):
                for checksums in (False, True):
                    trajectory_writer.CHECKSUMS = checksums
                    path = Path(tmp) / f"t-{checksums}.h5"
                    times[checksums].append(write(path, args.frames, args.particles, args.k, compression))
                    reads[checksums].append(read_seconds(path))
                    sizes[checksums] = path.stat().st_size
            trajectory_writer.CHECKSUMS = True
            for checksums in (False, True):
                print(f"{compression or 'none':<12} {'yes' if checksums else 'no':<10} "
                      f"{statistics.median(times[checksums]):9.3f} {sizes[checksums] / 1e6:9.3f} "
                      f"{statistics.median(reads[checksums]):8.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
