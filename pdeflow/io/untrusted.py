"""Files from other codes are untrusted input: every stored byte is read once in a child process before pdeflow's
readers touch a file, so that damage is one line, never a traceback, a hang, a crash or a memory blow-up.

:func:`screen` reads in a child process: a fork of the caller (a few milliseconds), or where the system cannot fork
this module run as a script (numpy and h5py only). The child opens the file (plainly, else in SWMR mode: a file whose
writer died), checks each attribute's and dataset's *declared* size against :func:`memory_limit` before reading it,
and reads it: datasets chunk by chunk, so that every chunk passes HDF5's filter pipeline and a Fletcher-32 checksum
failure (the writer's ``fletcher32=True``), a corrupt deflate stream or an unreadable chunk index is found. Datasets
listed as ``finite`` must hold finite numbers. The child answers with one line ("ok" or the problem) under a memory
limit (``RLIMIT_AS``); the parent reports as one line a child that dies of a signal (a fault inside the HDF5 library)
and one that does not answer within :func:`time_limit` (it is killed).
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

# The largest part of the machine's memory one declared object may claim: pdeflow's readers load a dataset whole.
MEMORY_FRACTION = 0.5
# The child's time: a start-up allowance plus a read rate far below any disk's (a hang, not a slow disk, exceeds it).
START_SECONDS, READ_BYTES_PER_SECOND = 60.0, 10e6
# Rows per read of a contiguous (unchunked) dataset: bounds the memory of one read.
ROW_BYTES = 64 << 20


def memory_limit() -> int:
    """The bytes one declared dataset or attribute may hold: :data:`MEMORY_FRACTION` of the physical memory."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return int(MEMORY_FRACTION * total)


def time_limit(path: str | Path) -> float:
    """Seconds the child may take on ``path``: :data:`START_SECONDS` + size / :data:`READ_BYTES_PER_SECOND`."""
    return START_SECONDS + Path(path).stat().st_size / READ_BYTES_PER_SECOND


def screen(path: str | Path, finite: Iterable[str] = (), timeout: float | None = None) -> str | None:
    """None if every object of the HDF5 file ``path`` reads back intact, else one line naming the problem.

    ``finite``: paths of datasets that must hold finite numbers (when present). The read happens in a child process
    (forked where the system can, else a new interpreter running this module) given :func:`time_limit` seconds
    unless ``timeout``, so that a fault in the HDF5 library cannot end the caller."""
    path = Path(path)
    limit = timeout if timeout is not None else time_limit(path)
    finite = frozenset(finite)
    if not hasattr(os, "fork"):
        return _screen_in_interpreter(path, finite, limit)
    receive, send = os.pipe()
    pid = os.fork()
    if pid == 0:                       # the child: read, write one line, end without running the parent's exit code
        try:
            os.close(receive)
            os.write(send, (_check_file(os.fspath(path), finite) or "ok").encode("utf-8", "replace")[:4096])
        finally:
            os._exit(0)
    os.close(send)
    line, deadline = b"", time.monotonic() + limit
    try:
        while True:
            ready, _, _ = select.select([receive], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"reading it did not finish within {limit:.0f} s (stopped): a damaged or hostile file"
            chunk = os.read(receive, 4096)
            if not chunk:
                break
            line += chunk
    finally:
        os.close(receive)
    _, status = os.waitpid(pid, 0)
    return _verdict(line.decode("utf-8", "replace"), -os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0, "")


def _screen_in_interpreter(path: Path, finite: frozenset[str], limit: float) -> str | None:
    command = [sys.executable, "-I", str(Path(__file__).resolve()), os.fspath(path), ",".join(finite)]
    try:
        done = subprocess.run(command, capture_output=True, timeout=limit, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"reading it did not finish within {limit:.0f} s (stopped): a damaged or hostile file"
    return _verdict(done.stdout.decode("utf-8", "replace"), done.returncode,
                    done.stderr.decode("utf-8", "replace"))


def _verdict(printed: str, returncode: int, stderr: str) -> str | None:
    """The child's answer: None for "ok", its line, or what ended it (a signal, a memory limit)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the HDF5 library crashed reading it ({name}, contained in a child process): a damaged file"
    lines = printed.strip().splitlines()
    if lines and lines[-1] == "ok":
        return None
    if lines:
        return lines[-1]
    err = stderr.strip().splitlines()
    return f"reading it failed ({(err or ['no answer'])[-1][:100]})"


# ---- the child ----------------------------------------------------------------------------------------------------
def _declared_bytes(shape: tuple[int, ...] | None, itemsize: int) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n * max(int(itemsize), 1)


def _reason(exc: BaseException) -> str:
    """The HDF5 message of a failed read in a few words (the checksum failure named as such)."""
    text = " ".join(str(exc).split())
    if "checksum" in text.lower() or "filter returned failure" in text:
        return f"a stored chunk fails its checksum or filter ({text[:90]})"
    return text[:120] or exc.__class__.__name__


def _read_dataset(ds, finite: bool, rows: int | None = None) -> None:
    """Read every stored element of ``ds`` (chunk by chunk, or in blocks of rows; only the first ``rows`` rows if
    given); ValueError if ``finite`` and one is not finite."""
    import numpy as np

    def look(values) -> None:
        if finite and values.dtype.kind in "fc" and not np.all(np.isfinite(values)):
            raise ValueError("holds NaN or inf")

    if ds.shape is None:                 # an empty (null) dataspace
        return
    if ds.ndim == 0:
        look(np.asarray(ds[()]))
        return
    end = ds.shape[0] if rows is None else min(rows, ds.shape[0])
    if ds.chunks is not None:
        if end:
            for block in ds.iter_chunks((slice(0, end),) + (slice(None),) * (ds.ndim - 1)):
                look(ds[block])
        return
    step = max(1, ROW_BYTES // max(1, _declared_bytes(ds.shape[1:], ds.dtype.itemsize)))
    for start in range(0, end, step):
        look(ds[start:min(end, start + step)])


def _check_attributes(where: str, attrs, limit: int) -> str | None:
    for key in list(attrs.keys()):
        try:
            aid = attrs.get_id(key)
            size = _declared_bytes(aid.shape, aid.dtype.itemsize)
            if size > limit:
                return f"attribute {key!r} of {where} declares {size:.3g} bytes, more than this machine allows"
            attrs[key]
        except Exception as exc:  # noqa: BLE001 - any failure of a hostile file is the answer, in one line
            return f"attribute {key!r} of {where} cannot be read ({_reason(exc)})"
    return None


def _committed(f) -> dict[str, int]:
    """The committed rows of /frames and /steps of a trajectory (rows beyond them belong to no commit: a killed
    writer may have left them half written); empty for another file or when they cannot be told."""
    from pdeflow.io.checkpoint import committed_counts

    try:
        if "frames" in f and "steps" in f:
            return dict(zip(("frames", "steps"), committed_counts(f)))
    except Exception:  # noqa: BLE001 - then every row is read
        pass
    return {}


def check_open(f, finite: frozenset[str], limit: int) -> str | None:
    """The first problem of the open file ``f``: an object that cannot be read, declares more than ``limit`` bytes,
    or (a path in ``finite``) holds a number that is not finite; None if there is none."""
    import h5py

    found = _check_attributes("/", f.attrs, limit)
    if found:
        return found
    committed = _committed(f)
    names: list[str] = []
    try:
        f.visit(names.append)
    except Exception as exc:  # noqa: BLE001
        return f"its groups cannot be listed ({_reason(exc)})"
    for name in names:
        where = "/" + name
        try:
            obj = f[name]
        except Exception as exc:  # noqa: BLE001
            return f"{where} cannot be opened ({_reason(exc)})"
        found = _check_attributes(where, obj.attrs, limit)
        if found:
            return found
        if not isinstance(obj, h5py.Dataset):
            continue
        try:
            size = _declared_bytes(obj.shape, obj.dtype.itemsize)
            chunk = _declared_bytes(obj.chunks, obj.dtype.itemsize) if obj.chunks else 0
            if size > limit or chunk > limit:
                return f"{where} declares {size:.3g} bytes, more than this machine allows"
            group = where.split("/")[1]
            _read_dataset(obj, where in finite, committed.get(group) if where.count("/") == 2 else None)
        except ValueError as exc:
            if str(exc) == "holds NaN or inf":
                return f"{where} holds NaN or inf"
            return f"{where} cannot be read ({_reason(exc)})"
        except Exception as exc:  # noqa: BLE001
            return f"{where} cannot be read ({_reason(exc)})"
    return None


def _check_file(path: str, finite: frozenset[str]) -> str | None:
    """In the child: limit its memory, open the file (plainly, else in SWMR mode) and :func:`check_open` it."""
    limit = memory_limit()
    try:
        import resource
        cap = 2 * limit + (4 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass
    import h5py

    from pdeflow.io.file_access import _open_swmr_read, open_by_swmr_writer

    try:
        try:
            f = h5py.File(path, "r")
        except Exception as exc:  # noqa: BLE001
            if not open_by_swmr_writer(Path(path)):
                return f"not a readable HDF5 file ({_reason(exc)})"
            try:   # a file whose SWMR writer died (or runs): one attempt per metadata read, not minutes of retries
                f = _open_swmr_read(Path(path), 1)
            except Exception as exc:  # noqa: BLE001
                return f"not a readable HDF5 file ({_reason(exc)})"
        with f:
            return check_open(f, finite, limit)
    except MemoryError:
        return "reading it needs more memory than this machine allows: a damaged or hostile file"
    except Exception as exc:  # noqa: BLE001
        return f"cannot be read ({_reason(exc)})"


if __name__ == "__main__":   # the child where the system cannot fork (:func:`_screen_in_interpreter`)
    print(_check_file(sys.argv[1], frozenset(p for p in sys.argv[2].split(",") if p)) or "ok")
