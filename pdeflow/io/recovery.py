"""Recovering a trajectory whose writer died: its committed content copied into a new, cleanly closed file
that any HDF5 tool reads (``pdeflow recover``, and the rebuild before a resume).
"""
from __future__ import annotations

import os
from pathlib import Path

import h5py

from .checkpoint import committed_counts
from .file_access import (
    LIBVER,
    TrajectoryError,
    WriterLock,
    discard_close,
    error_reason,
    open_by_swmr_writer,
    open_for_reading,
    partial_path,
    writer_alive,
)
from .trajectory import check_file

COPY_ROWS = 4096  # rows per block when copying a dataset during recovery



def _copy_attrs(src: h5py.AttributeManager, dst: h5py.AttributeManager) -> None:
    """Copy attributes keeping their stored types (fixed-length strings stay fixed-length)."""
    for key in src.keys():
        dst.create(key, src[key], dtype=src.get_id(key).dtype)



def rebuild(path: Path) -> None:
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
    partial = partial_path(out)
    dst = None
    try:
        with open_for_reading(path) as src:
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
                                              compression_opts=ds.compression_opts, fletcher32=ds.fletcher32)
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
    # a live writer first: mid-write, its checkpoint slots can fail their checksums, and the file is not damaged
    if path.exists() and writer_alive(path):
        raise TrajectoryError(f"{path}: a pdeflow process is writing it (wait for it to end, or stop it: it "
                              f"checkpoints on SIGINT/SIGTERM); only a file whose writer died needs recovery")
    check_file(path)
    if out is not None and Path(out).resolve() != path.resolve():
        return copy_committed(path, Path(out))
    if not open_by_swmr_writer(path):
        with open_for_reading(path) as f:
            return committed_counts(f)
    lock = WriterLock(path)  # no writer may start on it while it is copied
    try:
        return copy_committed(path, path)
    finally:
        lock.release()
