"""Result files written all or nothing (``pdeflow chaos``, ``pdeflow stability``, ...) and finished trajectories
edited all or nothing: built or changed on a ``.partial`` copy renamed into place when complete.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .._version import __version__
from ..core.config import Config
from .file_access import TrajectoryError, WriterLock, error_reason, partial_path
from .problem_file import write_problem
from .trajectory import check_file


def text_array(values: list[str]) -> np.ndarray:
    """``values`` [n] as the array of a text dataset (variable-length UTF-8 strings): how every result file stores
    a column of words."""
    return np.array(values, dtype=h5py.string_dtype("utf-8"))


@contextlib.contextmanager
def new_result_file(path: str | Path, schema: str, schema_version: int, cfg: Config, *, problem=None,
                    **attrs: Any) -> Iterator[h5py.File]:
    """Write a result file (``pdeflow chaos``, ``pdeflow stability``) all or nothing.

    ``with new_result_file(p, SCHEMA, 1, cfg) as f: ...`` yields a new file ``<name>.partial`` whose root
    attributes are ``schema``, ``schema_version``, ``pdeflow_version``, ``created`` (UTC), ``config``
    (TOML) and ``attrs``, and, given the ``problem`` (a :class:`pdeflow.Problem`), ``/model`` and ``/data`` as in
    a trajectory (:func:`write_problem`; :func:`stored_problem` rebuilds it from the file alone); it is
    renamed onto ``path`` when the block completes. A kill or an exception
    leaves ``path`` as it was (absent, or the file ``--force`` was going to replace)."""
    path = Path(path)
    partial = partial_path(path)
    partial.unlink(missing_ok=True)
    try:
        with h5py.File(partial, "x") as f:
            f.attrs.update({"schema": schema, "schema_version": schema_version, "pdeflow_version": __version__,
                            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                            "config": cfg.to_toml(), **attrs})
            if problem is not None:
                write_problem(f, problem.arrays(), problem.beta, problem.precision)
            yield f
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise



@contextlib.contextmanager
def edit_trajectory(path: str | Path) -> Iterator[h5py.File]:
    """Modify a finished trajectory all or nothing: ``with edit_trajectory(p) as f: f.create_group(...)``.

    The changes are made on a copy (``<name>.partial``) that replaces ``path`` only when the block
    completes; a kill or an exception leaves the original file untouched."""
    path = Path(path)
    check_file(path)
    lock = WriterLock(path)   # no writer may be appending to it meanwhile
    partial = partial_path(path)
    try:
        shutil.copyfile(path, partial)
        f = h5py.File(partial, "r+")
    except OSError as exc:
        lock.release()
        partial.unlink(missing_ok=True)
        raise TrajectoryError(f"{path}: cannot be edited ({error_reason(exc)})") from None
    try:
        with _terminate_as_exit():
            yield f
            f.close()
            os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(Exception):
            f.close()
        partial.unlink(missing_ok=True)
        raise
    finally:
        lock.release()



@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM with its default action (end the process at once) as ``SystemExit(143)`` inside the block, so
    that an edit cleans up its ``.partial`` copy (SIGINT already raises KeyboardInterrupt). Elsewhere, or
    when the program handles SIGTERM itself, nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
