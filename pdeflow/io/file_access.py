"""How pdeflow opens its HDF5 files safely: the one-line error, the writer's lock, reading while a SWMR writer
runs or after it died, truncation found from the superblock, the ``.partial`` sibling a new file is built under.

One writer at a time holds an advisory lock (:class:`WriterLock`); a file whose SWMR writer is running or died is
read in SWMR mode, with one metadata attempt when it is shorter than its superblock says (docs/schema.md, "Crash
safety").
"""
from __future__ import annotations

import contextlib
import os
import re
import struct
from pathlib import Path
from typing import Any

import h5py
import numpy as np

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



def fixed_text(text: str, size: int) -> np.ndarray:
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



def partial_path(path: Path) -> Path:
    """The sibling a new or rebuilt file is written to before it is renamed onto ``path``."""
    return path.with_name(path.name + ".partial")



def open_swmr_write(path: Path) -> h5py.File:
    """Open an existing file for writing directly in SWMR mode (so that it is never open non-SWMR)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_LATEST)  # LIBVER
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_WRITE, fapl)
    return h5py.File(fid)



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



def short_of(path: Path) -> tuple[int, int] | None:
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



def open_for_reading(path: str | Path) -> h5py.File:
    """Open a trajectory read-only with h5py, also while its SWMR writer runs or after it died (in SWMR mode, only
    such a file); read the rows :func:`pdeflow.io.checkpoint.committed_counts` gives.

    SWMR reading skips HDF5's check that the file is not truncated and retries metadata reads that fail their
    checksum for minutes: a file whose writer died and that is shorter than its superblock says
    (:func:`short_of`) is read with one attempt, and :func:`check_file` checks that its committed rows lie
    within it."""
    path = Path(path)
    try:
        return h5py.File(path, "r")
    except OSError as first:
        if not open_by_swmr_writer(path):
            raise
        short = short_of(path)
        try:
            return _open_swmr_read(path, 1 if short else None)
        except OSError:
            if short:
                raise OSError(f"truncated file: eof = {short[0]}, sblock->base_addr = 0, "
                              f"stored_eof = {short[1]}") from None
            raise first from None



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



def plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
        if isinstance(v, bytes):
            return v.decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        return v.item()
    return v
