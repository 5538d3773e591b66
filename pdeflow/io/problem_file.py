"""The problem stored in a file (``/model`` and ``/data``, the layout of :data:`pdeflow.io.schema.ITEMS`): written by
:func:`write_problem` into trajectories and result files, rebuilt from the file alone by :func:`stored_problem`;
:func:`config_and_problem`: a command's CONFIG, or a pdeflow FILE whose stored config it re-runs on the stored problem.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from ..core.config import Config, ConfigError, load_config, loads_config, parse_override
from . import schema
from .file_access import TrajectoryError, error_reason, open_for_reading, plain

if TYPE_CHECKING:
    from ..core.problem import Problem


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



# the sections of a config that describe the problem: a file's stored problem is not rebuilt from them
PROBLEM_SECTIONS = ("task", "model")


def config_and_problem(path: str | Path, overrides: Iterable[str] = ()) -> tuple[Config, Problem, bool]:
    """The config and problem a command runs: a TOML ``path`` (with ``overrides``, ``section.key=value``) and the
    problem it describes (relative paths resolved against the config's folder), or, for a pdeflow file (a trajectory
    or a result holding ``/model`` and ``/data``), the config it was run with and the problem it stores: the task's
    data come from the file, so a relative ``task.path`` need not exist where the command runs. The last item is
    True for a file. ConfigError (one line) for a bad config, an override of ``[task]`` or ``[model]`` on a file (its
    problem is fixed), or a file without a stored config; TrajectoryError for a file without a stored problem."""
    from ..core.problem import Problem

    p = Path(path)
    if p.suffix.lower() == ".toml" or not p.is_file() or not h5py.is_hdf5(p):
        cfg = load_config(p, overrides)
        return cfg, Problem.from_config(cfg), False
    for item in overrides:
        if parse_override(item)[0] in PROBLEM_SECTIONS:
            raise ConfigError(f"--set {item}: the problem of {p} is the one it stores (/model, /data); "
                              f"[{'], ['.join(PROBLEM_SECTIONS)}] cannot change")
    try:
        with open_for_reading(p) as f:
            text = plain(f.attrs.get("config", ""))
    except OSError as exc:
        raise TrajectoryError(f"{p}: cannot be read: {error_reason(exc)[:80]}") from None
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{p}: holds no pdeflow config (root attribute 'config')")
    return loads_config(text, overrides, source=None), stored_problem(p), True
