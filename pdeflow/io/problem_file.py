"""The problem stored in a file (``/model`` and ``/data``, the layout of :data:`pdeflow.io.schema.ITEMS`): written by
:func:`write_problem` into trajectories and result files, rebuilt from the file alone by :func:`stored_problem`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from . import schema
from .file_access import TrajectoryError, error_reason, plain


def write_problem(f: h5py.File, arrays: dict[str, Any], beta: float = np.inf, precision: str = "float64") -> None:
    """Store a problem in ``/model`` and ``/data`` (the layout of :data:`pdeflow.io.schema.ITEMS`) so that the file
    alone rebuilds it (:func:`read_problem`): ``arrays`` is :meth:`pdeflow.Problem.arrays`. Trajectories and the
    result files of ``pdeflow chaos`` and ``pdeflow stability`` (:func:`new_result_file`) share it."""
    for group in ("/model", "/data"):
        g = f.create_group(group)
        for it in schema.items_in(group):
            if it.need == schema.REQUIRED or arrays.get(it.name) is not None:
                values = np.asarray(arrays[it.name], dtype=schema.numpy_dtype(it))
                # chunked with HDF5's Fletcher-32 checksum, as the frames: a changed byte of the problem is a read
                # error (a filter needs chunks, which an empty or scalar dataset cannot have)
                g.create_dataset(it.name, data=values, fletcher32=bool(values.size and values.ndim))
    m = f["model"]
    m.attrs["head_dim"] = int(arrays["head_dim"])
    m.attrs["score_scale"] = float(arrays["score_scale"])
    m.attrs["weight_decay"] = float(arrays["weight_decay"])
    m.attrs["beta"] = float(beta)
    m.attrs["precision"] = precision
    m.attrs["k"] = int(np.asarray(arrays["theta0"]).shape[0] if arrays.get("basis") is None
                       else np.asarray(arrays["basis"]).shape[1])



def read_problem(f: h5py.File) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arrays (as :meth:`pdeflow.Problem.arrays`) and the ``/model`` attributes that :func:`write_problem`
    stored in an open file; KeyError if ``/model`` or ``/data`` is missing."""
    model, data = f["model"], f["data"]
    arrays: dict[str, Any] = {k: model[k][()] for k in model.keys()}
    arrays.setdefault("basis", None)
    arrays.update({k: data[k][()] for k in data.keys()})
    arrays.update({k: plain(model.attrs[k]) for k in ("head_dim", "score_scale", "weight_decay")})
    return arrays, {k: plain(v) for k, v in model.attrs.items()}



def problem_of(arrays: dict[str, Any], model_attrs: dict[str, Any]):
    """The :class:`pdeflow.Problem` of :func:`read_problem`'s output (its precision and beta included)."""
    from ..core.problem import Problem
    return Problem.from_arrays(arrays, precision=str(model_attrs.get("precision", "float64")),
                               beta=float(model_attrs.get("beta", np.inf)))



def stored_problem(path: str | Path):
    """The :class:`pdeflow.Problem` stored in any pdeflow file with ``/model`` and ``/data`` (a trajectory,
    or a ``pdeflow chaos`` / ``pdeflow stability`` result): the file alone rebuilds it. TrajectoryError
    (one line) if the file has none."""
    try:
        with h5py.File(path, "r") as f:
            return problem_of(*read_problem(f))
    except (OSError, KeyError) as exc:
        raise TrajectoryError(f"{path}: no stored problem (/model and /data): {error_reason(exc)[:80]}") from None
